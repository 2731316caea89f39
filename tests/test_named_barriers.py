"""Named barriers in the interpreter: ``bar.sync`` and ``bar.arrive`` whose threads arrive from
different roles (or from the groups of one role that do not keep in step), as warp-specialized
consumers taking turns use them — the arrivals complete a phase, the threads that synced on it
acquire what the arriving threads wrote before, and a phase that can never complete is a
deadlock."""

from __future__ import annotations

import numpy as np
import pytest

from firesched import dtypes as dt
from firesched import ir
from firesched.errors import HazardError
from firesched.simulate.interp import run_program
from firesched.testing.microkernel import _call, _copy_atom, _gbuf

F32 = dt.dtype("f32")


def _program(writer_tail: list, reader_head: list, groups: int = 1, threads: int = 96):
    """Warp 0 (the writer) stores its lane ids to shared memory, then ``writer_tail``; warps 1..
    (the readers, ``groups`` groups of them) run ``reader_head``, then read warp 0's values into
    ``out``."""
    out = _gbuf("out", F32, (threads - 32,), "out")
    x = _gbuf("x", F32, (1,))
    sm = ir.SharedBuffer("sm", F32, 32, 16)
    r = ir.RegBuffer("r", F32, 1)
    rt = ir.role_tid(32)
    rr = ir.role_tid(threads - 32)
    writer = [ir.Pointwise("copy", ir.RegRef(r, 0), (float("nan"),)),
              ir.Pointwise("add", ir.RegRef(r, 0), (1.0, 2.0)),
              _call(_copy_atom("st_shared", 4), dst=ir.MemRef(sm, rt), src=ir.RegRef(r, 0)), *writer_tail]
    reader = [*reader_head, _call(_copy_atom("ld_shared", 4), dst=ir.RegRef(r, 0), src=ir.MemRef(sm, rr % 32)),
              _call(_copy_atom("st_global", 4), dst=ir.MemRef(out, rr), src=ir.RegRef(r, 0))]
    roles = ir.Roles((ir.Role("writer", 0, 32, ir.Seq(tuple(writer))),
                      ir.Role("readers", 32, threads - 32, ir.Seq(tuple(reader)), groups)))
    kernel = ir.Kernel(name="named", params=(x, out), grid=(1, 1, 1), threads=threads, shared=(sm,), regs=(r,),
                       body=ir.Seq((roles,)))
    return ir.Program(kernels=(kernel,), inputs=(x,), output=out)


def _run(prog):
    return run_program(prog, {"x": np.zeros(1, np.float32)})["out"]


def test_arrive_then_sync_orders_the_writes():
    """The writer's bar.arrive and the readers' bar.sync on one id make one phase of 96 threads."""
    got = _run(_program([ir.Barrier("written", 1, 96, arrive=True)], [ir.Barrier("wait", 1, 96)]))
    assert (got == 3.0).all()


def test_groups_that_do_not_keep_in_step_sync_one_by_one():
    """Readers in two groups of one warp: each brings its 32 threads; the phase completes with
    the writer's 32 and both groups' (a 96-thread barrier), whatever order the groups run in."""
    got = _run(_program([ir.Barrier("written", 1, 96, arrive=True)], [ir.Barrier("wait", 1, 96)], groups=2))
    assert (got == 3.0).all()


@pytest.mark.parametrize("tail, head, match", [
    ([], [], "race|before"),                                                      # no barrier at all
    ([ir.Barrier("written", 1, 96, arrive=True)], [ir.Barrier("wait", 1, 96, arrive=True)], "race|before"),
    ([], [ir.Barrier("wait", 1, 96)], "deadlock"),                                # nobody arrives
    ([ir.Barrier("written", 1, 64, arrive=True)], [ir.Barrier("wait", 1, 96)], "expects"),
    ([ir.Barrier("written", 2, 96, arrive=True)], [ir.Barrier("wait", 1, 96)], "deadlock"),
])
def test_missing_or_wrong_arrivals_are_hazards(tail, head, match):
    """Without the barrier (or with readers that only arrive) the read races the write; a sync
    that nothing completes, or counts that disagree, are reported."""
    with pytest.raises(HazardError, match=match):
        _run(_program(tail, head))


def test_an_arrival_left_pending_at_the_end_is_no_hazard():
    """The last turn ping-pong consumers pass on is never taken: a phase with arrivals only."""
    got = _run(_program([ir.Barrier("written", 1, 96), ir.Barrier("one more", 2, 64, arrive=True)],
                        [ir.Barrier("wait", 1, 96)]))
    assert (got == 3.0).all()
