"""Programmatic launches (GRIDDEP): ``griddep_launch_dependents`` lets the next kernel start early,
``griddep_wait`` waits for the kernels before to complete.

The interpreter runs a program's kernels one after another, so the data is always there; what it
checks is the wait: in a kernel launched programmatically (``ir.Kernel.programmatic``) a block
touches a global buffer that an earlier kernel of the program also had as a parameter (an output
or a workspace: the program's inputs are never written) only after all of its threads have
executed ``griddep_wait`` (``Memory.pending`` / ``Memory.waited``, checked at every global access).
"""

from __future__ import annotations

from ...errors import InternalError
from ..messages import describe


def griddep(k, s):
    """GRIDDEP: the trigger changes nothing the interpreter models; the wait marks its threads."""
    on, _ = k.ctx.enabled(s)
    if s.atom.name == "griddep_wait":
        k.mem.waited[on] = True
    elif s.atom.name != "griddep_launch_dependents":
        raise InternalError(f"{describe(s)}: unknown griddepcontrol atom {s.atom.name}")
