"""``lower.transforms.batch_loads``: a rolled loop whose iteration loads a few bytes from global
memory and then uses them takes the loads of several iterations first (registers for each), so a
thread keeps them in flight; loops where that would change what a load reads, or what a later
statement reads, stay as they are.  The kernels it rewrites are checked by the interpreter."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import firesched as fs
from firesched import ir
from firesched.dtypes import dtype
from firesched.hardware.atoms import catalog
from firesched.hardware.target import target
from firesched.ir.expr import Var
from firesched.lower.program import KernelBuilder
from firesched.lower.transforms.batch_loads import batched_loads
from firesched.recipes.rows import RowPlan
from firesched.testing.planting import map_leaves

BF16 = dtype("bf16")


def _kb(threads=256, occupancy=1):
    kb = KernelBuilder(SimpleNamespace(target=target("sm_90a")), "k")
    kb.threads, kb.min_blocks_per_sm = threads, occupancy
    return kb


def _loop(n=10, src="X", dst_mem="SH", dst="S", extra=()):
    """for v in 0..n: r = X[v * 256 + tid]; S[v * 256 + tid] = r"""
    v, tid = Var("v", n), ir.tid(256)
    r = ir.RegBuffer("r", BF16, 1)
    x = ir.GlobalBuffer(src, BF16, (n * 256,), (1,))
    out = ir.SharedBuffer(dst, BF16, n * 256) if dst_mem == "SH" else ir.GlobalBuffer(dst, BF16, (n * 256,), (1,))
    load = ir.AtomCall(catalog.copy_atom("GL", "RF", 2), (("dst", ir.RegRef(r, 0)), ("src", ir.MemRef(x, v * 256 + tid))))
    store = ir.AtomCall(catalog.copy_atom("RF", dst_mem, 2), (("dst", ir.MemRef(out, v * 256 + tid)),
                                                             ("src", ir.RegRef(r, 0))))
    return ir.For(v, n, ir.Seq((load, store, *extra))), r


def _leaves(st):
    seen = []
    map_leaves(st, lambda s: seen.append(s))
    return seen


def test_a_rolled_copy_loop_loads_eight_iterations_at_a_time():
    loop, _ = _loop(10)
    (out,) = batched_loads([loop], _kb())
    assert isinstance(out, ir.For) and out.extent == 2 and not out.unroll           # ceil(10 / 8) batches
    loads, rest = [s for s in out.body.body if isinstance(s, ir.For)]
    assert loads.unroll and rest.unroll and loads.extent == rest.extent == 8
    # the last batch reaches past the loop: its loads are predicated off, its stores skipped
    assert all("< 10" in str(s.pred) for s in _leaves(loads.body))
    assert isinstance(rest.body, ir.If)
    regs = {a.buffer.name: a.buffer.size for s in _leaves(out) if isinstance(s, ir.AtomCall)
            for _, a in s.args if isinstance(a, ir.RegRef)}
    assert regs == {"r_batch": 8}


def test_the_batch_fits_the_registers_the_occupancy_leaves():
    # 6 blocks of 256 threads leave a thread 42 registers: a seventh of them for the copies
    (out,) = batched_loads([_loop(64)[0]], _kb(256, 6))
    assert [s for s in out.body.body if isinstance(s, ir.For)][0].extent == 7


@pytest.mark.parametrize("why", ["in place", "read after", "barrier", "loads shared"])
def test_loops_it_would_change_stay(why):
    if why == "in place":          # a store into the buffer the loads read: a later load must see it
        loop, _ = _loop(10, src="X", dst_mem="GL", dst="X")
        body = [loop]
    elif why == "read after":      # a statement after the loop reads the last iteration's load
        loop, r = _loop(10)
        body = [loop, ir.Pointwise("add", ir.RegRef(r, 0), (ir.RegRef(r, 0), 1.0))]
    elif why == "barrier":
        loop, _ = _loop(10, extra=(ir.Barrier("between iterations"),))
        body = [loop]
    else:                          # no global load: nothing to keep in flight
        loop, _ = _loop(10)
        body = [ir.For(loop.var, 10, ir.Seq(tuple(reversed(loop.body.body))))]
    assert batched_loads(body, _kb()) == body


def test_a_later_write_frees_the_registers():
    loop, r = _loop(10)
    fill = ir.RegFill(ir.RegRef(r, 0), 1, 0.0)
    out = batched_loads([loop, fill, ir.Pointwise("add", ir.RegRef(r, 0), (ir.RegRef(r, 0), 1.0))], _kb())
    assert out[0] != loop and out[1:] == [fill, out[2]]


def _branch_loop(n, guard_regs=False):
    """for v in 0..n: x = X[..]; if (tid < 200): w = W[..]; x += w   (the branch's load further
    down); ``guard_regs``: a statement before the branch writes w, so its load must stay"""
    loop, r = _loop(n)
    v, tid = loop.var, ir.tid(256)
    w = ir.RegBuffer("w", BF16, 1)
    wb = ir.GlobalBuffer("W", BF16, (n * 256,), (1,))
    load = ir.AtomCall(catalog.copy_atom("GL", "RF", 2), (("dst", ir.RegRef(w, 0)), ("src", ir.MemRef(wb, v * 256 + tid))))
    use = ir.Pointwise("add", ir.RegRef(r, 0), (ir.RegRef(r, 0), ir.RegRef(w, 0)))
    first, store = loop.body.body
    pre = (ir.RegFill(ir.RegRef(w, 0), 1, 0.0),) if guard_regs else ()
    body = ir.Seq((first, *pre, ir.If(ir.expr.lt(tid, 200), ir.Seq((load, use))), store))
    return ir.For(loop.var, n, body)


def test_a_branchs_loads_lead_the_batch_predicated():
    (out,) = batched_loads([_branch_loop(16)], _kb())
    loads, rest = [s for s in out.body.body if isinstance(s, ir.For)]
    lead = _leaves(loads.body)
    assert len(lead) == 2 and "tid < 200" in str(lead[1].pred)            # X's load, then W's, predicated
    assert any(isinstance(s, ir.If) and "tid < 200" in str(s.cond) for s in ir.rewrite.flat([rest.body]))
    # a loop of fewer than HOISTED_FROM iterations batches its leading loads only, its branch
    # kept whole; so does a loop whose branch's load has registers an earlier statement writes
    from firesched.lower.transforms.batch_loads import HOISTED_FROM

    for kept in (batched_loads([_branch_loop(HOISTED_FROM - 1)], _kb())[0],
                 batched_loads([_branch_loop(16, guard_regs=True)], _kb())[0]):
        lead = _leaves([s for s in kept.body.body if isinstance(s, ir.For)][0].body)
        assert len(lead) == 1 and "X" in str(lead[0])


@pytest.mark.parametrize("kind", ["causal", "add_rmsnorm"])
def test_batched_kernels_match_numpy(kind):
    # the masked row's loads (causal) and the two rows of the sum (add + RMSNorm) go into shared
    # memory 8 iterations at a time, 11 iterations a thread (the last batch partial)
    plan = RowPlan(32, 1, 11, 1, cluster=3, part=352, exchange="push", row_memory="SH")
    sched = (fs.recipes.softmax(2, 1001, dtype="bf16", arch="sm_90a", plan=plan, causal=True) if kind == "causal"
             else fs.recipes.add_rmsnorm(2, 1001, dtype="bf16", arch="sm_90a", plan=plan))
    assert "the loads of 8 iterations in flight at a time" in fs.compile(sched, arch="sm_90a").source
    fs.testing.assert_schedule_correct(sched, examples=2, arch="sm_90a")


def test_vector_loads_take_up_to_half_the_registers():
    # 16-byte loads of a staged row, six blocks of 256 threads an SM (42 registers a thread): the
    # masked row (4 registers an iteration) 5 at a time, the two rows of a sum (8) 2 at a time;
    # neither spills (add + RMSNorm at 131,072 columns: its rows of 65,536 wait on one block,
    # rows.STAGED_BLOCK_VALUES)
    causal = fs.compile(fs.recipes.softmax(64, 65536, dtype="bf16", arch="sm_90a", causal=True), arch="sm_90a")
    added = fs.compile(fs.recipes.add_rmsnorm(64, 131072, dtype="f16", arch="sm_90a"), arch="sm_90a")
    assert "the loads of 5 iterations in flight" in causal.source and causal.spills == 0
    assert "the loads of 2 iterations in flight" in added.source and added.spills == 0


def test_batched_kernels_print_the_same_source_in_every_process():
    # the batch registers are declared in the loads' order, not a set's (which follows the
    # process's string hashing): the same schedule prints the same source, so the cubin cache hits
    import os
    import subprocess
    import sys

    code = ("import hashlib, firesched as fs; "
            "p = fs.recipes.add_rmsnorm(2, 24577, dtype='bf16', arch='sm_80').lower('sm_80'); "
            "print(hashlib.sha256(fs.cuda.emit_kernel(p.kernels[0]).encode()).hexdigest())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(4)}
    assert len(outs) == 1
