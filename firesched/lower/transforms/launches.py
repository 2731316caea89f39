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
                  griddepcontrol.launch_dependents         completed and its writes are visible,
                  ...                                      then lets kernel i+2 (if any) start

so kernel i+1's launch and block scheduling overlap kernel i's tail instead of following it
(measured on an H100: 0.3-0.7 us of a split W4A16 call, bench/README.md).  The trigger is issued
only when every block of kernel i has started, so the waiting blocks never take the place of a
block of kernel i.  The interpreter checks the wait (``simulate.families.griddep``).

**Chained** (``chained=True``, the default where the target has ``griddepcontrol`` and the grid is
not sized to the SMs — ``driver._sm_sized_grid``): the program's first kernel is launched
programmatically too, and (``release=True``) its last one lets the next launch start, so a
stream of programs — a decode step's norms and products one after another — overlaps each
launch with the tail of the one before, whatever program that was::

    kernel 0      [griddepcontrol.launch_dependents]     (kernel 1's trigger, as above, if any)
                  griddepcontrol.wait                    before its first global access: the
                  ...                                      launch before it on the stream (any
                                                           kernel) has completed, writes visible
    kernel n-1    griddepcontrol.wait                    (kernel n-2's, or the one above)
                  griddepcontrol.launch_dependents       the next launch on the stream, if it is
                  ...                                      programmatic, may be scheduled

A kernel before it that never issues the trigger lets it start as its blocks exit; one that is
not a kernel (a copy, an event wait) serializes as without the attribute.  Measured on an H100
(bench/README.md, "Launches that overlap the one before"): 0.3-0.7 us a call, e.g. LayerNorm
4096 x 4096 f16 2.68 -> 2.73 TB/s, W4A16 M = 16, N = K = 4096 6.7 -> 6.3 us, each after another
call of itself; a GEMM of 2048³ (a plain grid) 2.5 % faster.  ``chained=False``
(``compile(..., programmatic=False)``) launches the first kernel the ordinary way.

The last kernel's trigger is what lets the next call start early, and it is not always a gain: a
split W4A16 call of M = 256, N = K = 4096 (a product of one 384-thread block an SM, then a
reduction of 4,096 blocks) read 21.3 us a call with it, 19.0 without it and 18.9 launched plainly,
while at M = 16 it read 6.4 / 6.7 / 7.0 (bench/README.md, "Chained launches by default").  So by
default (``compile(..., programmatic=None)``) only a program of one kernel releases the next launch;
``programmatic=True`` asks for it on every program.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...hardware.atoms import sm90a


def programmatic_launches(prog: ir.Program, target, chained: bool = False,
                          release: bool | None = None) -> ir.Program:
    """``prog`` with its later kernels launched programmatically where ``target`` can; with
    ``chained`` its first kernel too (it waits for whatever the stream ran before it), and with
    ``release`` (None: ``chained``) its last kernel lets the next launch on the stream start early."""
    if release is None:
        release = chained
    n = len(prog.kernels)
    if not target.has_pdl or (n < 2 and not chained):
        return prog
    kernels = []
    for i, k in enumerate(prog.kernels):
        trigger = wait = None
        if i + 1 < n:
            trigger = ir.AtomCall(sm90a.griddep_launch_dependents, (), 1,
                                  f"{prog.kernels[i + 1].name} may be scheduled once every block is here")
        elif chained and release:
            trigger = ir.AtomCall(sm90a.griddep_launch_dependents, (), 1,
                                  "the next launch on the stream may be scheduled once every block is here")
        if i > 0:
            wait = ir.AtomCall(sm90a.griddep_wait, (), 1,
                               f"launched programmatically: wait until {prog.kernels[i - 1].name} has completed")
        elif chained:
            wait = ir.AtomCall(sm90a.griddep_wait, (), 1,
                               "launched programmatically: wait until the launch before this program has "
                               "completed (before any global memory access)")
        # the first kernel lets the program's second start before it waits (its blocks are then
        # resident as soon as the first's are all running); every later kernel, and a kernel that
        # lets the next program start, waits first, so that a stream of calls runs at most one
        # kernel ahead of what has completed (measured on an H100: a split W4A16 product whose
        # reduction let the next call start at once took 8.4 us a call against 6.2)
        head = (trigger, wait) if i == 0 and i + 1 < n else (wait, trigger)
        head = tuple(h for h in head if h is not None)
        kernels.append(attrs.evolve(k, body=ir.Seq((*head, k.body)), programmatic=i > 0 or chained))
    return attrs.evolve(prog, kernels=tuple(kernels))
