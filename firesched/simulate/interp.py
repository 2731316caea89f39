"""The interpreter's entry points under their historical module name (``simulate.interp``).

The interpreter itself lives in the modules of this package, one concern each; see the package
docstring.
"""

from .kernel import run_kernel, run_program
from .messages import describe

__all__ = ["run_program", "run_kernel", "describe"]
