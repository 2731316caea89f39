"""Hardware description: targets and the atom tables (``sm70``, ``sm80``, ``sm90a``, ``convert``,
``catalog``)."""

from .atoms import catalog, convert, sm70, sm80, sm90a
from .target import SM70, SM80, SM86, SM89, SM90A, TARGETS, Target, default_target, target

__all__ = ["catalog", "convert", "sm70", "sm80", "sm90a", "Target", "SM70", "SM80", "SM86", "SM89", "SM90A", "default_target", "TARGETS", "target"]
