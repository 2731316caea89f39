"""Hardware description: targets and the atom tables (``sm70``, ``sm80``, ``catalog``)."""

from .atoms import catalog, sm70, sm80
from .target import SM70, SM80, SM90A, TARGETS, Target, target

__all__ = ["catalog", "sm70", "sm80", "Target", "SM70", "SM80", "SM90A", "TARGETS", "target"]
