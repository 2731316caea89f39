"""Programmatic dependent launches: a program's later kernels start while the one before finishes.

A program of several kernels (a split-K product and the launch that adds its parts, a padding
copy and the product that reads it) launches them in order on one stream.  Launched the ordinary
way, a kernel's blocks are scheduled only after the previous kernel has completed and its memory
has been flushed; on targets with ``griddepcontrol`` (sm_90a) the later kernels are launched
programmatically instead (``ir.Kernel.programmatic``: the runtime sets the launch's
programmatic-stream-serialization attribute)::

    kernel i      griddepcontrol.launch_dependents       at its start: once every block has issued
                  ...                                      it, kernel i+1's blocks may be scheduled
    kernel i+1    griddepcontrol.wait                    at its start: blocks until kernel i has
                  ...                                      completed and its writes are visible

so kernel i+1's launch and block scheduling overlap kernel i's tail instead of following it
(measured on an H100: 0.3-0.7 us of a split W4A16 call, bench/README.md).  The trigger is issued
only when every block of kernel i has started, so the waiting blocks never take the place of a
block of kernel i.  The interpreter checks the wait (``simulate.families.griddep``).
"""

from __future__ import annotations

import attrs

from ... import ir
from ...hardware.atoms import sm90a


def programmatic_launches(prog: ir.Program, target) -> ir.Program:
    """``prog`` with its later kernels launched programmatically where ``target`` can."""
    n = len(prog.kernels)
    if n < 2 or not target.has_pdl:
        return prog
    kernels = []
    for i, k in enumerate(prog.kernels):
        head = []
        if i > 0:
            head.append(ir.AtomCall(sm90a.griddep_wait, (), 1,
                                    f"launched programmatically: wait until {prog.kernels[i - 1].name} has completed"))
        if i + 1 < n:
            head.append(ir.AtomCall(sm90a.griddep_launch_dependents, (), 1,
                                    f"{prog.kernels[i + 1].name} may be scheduled once every block is here"))
        kernels.append(attrs.evolve(k, body=ir.Seq((*head, k.body)), programmatic=i > 0))
    return attrs.evolve(prog, kernels=tuple(kernels))
