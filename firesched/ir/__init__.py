"""The kernel IR: what a checked schedule lowers to, and what the CUDA printer and the CPU
interpreter both read (``nodes``), over integer index expressions (``expr``)."""

from . import expr
from .nodes import *  # noqa: F401,F403
from .nodes import __all__ as _nodes_all

__all__ = ["expr", *_nodes_all]
