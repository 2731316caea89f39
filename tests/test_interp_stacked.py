"""The interpreter's shortcuts must not change what it computes or reports: loop nests of MMAs run
as stacked issues (``simulate.stacked``) and shared-memory accesses of whole aligned rows
checked and recorded a row at a time (``memory.Rows``) give, bit for bit, what the loop as
written and the element-by-element path give, and the same hazards with the same messages."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from test_interp import call, gbuf, gemm_inputs, gemm_program, program

import firesched as fs
from firesched import dtypes as dt
from firesched import ir
from firesched.errors import HazardError
from firesched.hardware.atoms import sm70, sm80
from firesched.ir.expr import Var, lt
from firesched.simulate import asyncs, memory, stacked
from firesched.simulate import kernel as K
from firesched.simulate.interp import run_program
from firesched.strategies import (
    done,
    epilogue,
    move_to_regs,
    move_to_smem,
    pipeline,
    tile,
    to_blocks,
    to_warps,
)


def run(prog, feed, *, stack=True, rows=True, tiles=None):
    """``run_program`` with or without the stacked MMA nests and the row-at-a-time accesses;
    returns the result and the outer loop variable of each nest that ran stacked."""
    ran = []

    def spy(k, s):
        did = stacked.run_nest(k, s) if stack else False
        if did:
            ran.append(s.var.name)
        return did

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(K, "run_nest", spy)
        if tiles is not None:
            mp.setattr(stacked, "STACK_TILES", tiles)
        if not rows:
            mp.setattr(memory, "aligned_rows", lambda first, per: None)
            mp.setattr(asyncs, "aligned_rows", lambda first, per: None)
        out = run_program(prog, feed)
    return out, ran


def same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype
        np.testing.assert_array_equal(a[name].view(np.uint8), b[name].view(np.uint8))


def hazard(prog, feed, **kw) -> str:
    with pytest.raises(HazardError) as info:
        run(prog, feed, **kw)
    return str(info.value)


# --------------------------------------------------------------------------- stacked MMA nests

def readme_gemm(M, N, K_):
    spec = fs.MatMul.kernel(M=M, N=N, K=K_, a="f16", b="f16", c="f16", acc="f32")
    return spec.schedule(
        tile(m=128, n=128) >> to_blocks(group=8), tile(k=64), move_to_smem("A"), move_to_smem("B"),
        pipeline(stages=3), tile(m=64, n=64) >> to_warps(2, 2), tile(k=16), move_to_regs("A"), move_to_regs("B"),
        tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32), epilogue(fs.ops.bias("bias"), fs.ops.relu()))


@pytest.mark.parametrize("tiles", [None, 1, 100])
def test_the_readme_gemm_stacked_equals_the_loops_as_written(tiles):
    prog = readme_gemm(256, 128, 192).lower("sm_80")
    rng = np.random.default_rng(3)
    feed = {b.name: rng.standard_normal(b.shape).astype(np.float16) for b in prog.inputs}
    got, nests = run(prog, feed, tiles=tiles)
    want, none = run(prog, feed, stack=False, rows=False)
    assert nests and not none
    same(got, want)


def test_a_hand_written_gemm_stacked_equals_the_loops_as_written():
    prog = gemm_program(64, 64, 64, BM=32, BN=64, BK=32, warps_m=2, warps_n=2)
    x = gemm_inputs(64, 64, 64, seed=4)
    got, nests = run(prog, x)
    want, _ = run(prog, x, stack=False)
    assert nests
    same(got, want)
    np.testing.assert_allclose(got["C"], x["A"].astype(np.float64) @ x["B"].astype(np.float64), rtol=1e-6)


T = 64
TID = ir.tid(T)
X_IN = gbuf("x", dt.f16, (T, 64))
FA = ir.RegBuffer("fa", dt.f16, 24)
FB = ir.RegBuffer("fb", dt.f16, 16)
M_, N_ = Var("m", 3), Var("n", 4)
X = {"x": (np.random.default_rng(5).integers(-8, 9, (T, 64)) / 8).astype(np.float16)}


def nest_program(d, a, b, c, *, acc=dt.f32, acc_size=48, b_in_acc=False, pred=1, wrap=None):
    """``fa`` and ``fb`` loaded from ``x`` (each thread its row), ``acc`` filled, then ``for m in 3:
    for n in 4: mma(d, a, b, c)`` at the given register offsets (``d`` and ``c`` in ``acc``, ``a`` in
    ``fa``, ``b`` in ``fb`` or, with ``b_in_acc``, in ``acc``), and ``acc`` stored to ``y``."""
    accb = ir.RegBuffer("acc", acc, acc_size)
    out = gbuf("y", acc, (T, acc_size), "out")
    mma = sm80.mma_m16n8k16_f16_f32 if acc == dt.f32 else sm80.mma_m16n8k16_f16_f16
    loads = [call(sm70.ld_global_16, src=ir.MemRef(X_IN, TID * 64 + 8 * i), dst=ir.RegRef(FA, 8 * i))
             for i in range(3)]
    loads += [call(sm70.ld_global_16, src=ir.MemRef(X_IN, TID * 64 + 24 + 8 * i), dst=ir.RegRef(FB, 8 * i))
              for i in range(2)]
    loads += [ir.RegFill(ir.RegRef(accb, 0), acc_size, 0.5)]
    body = call(mma, pred=pred, d=ir.RegRef(accb, d), a=ir.RegRef(FA, a), b=ir.RegRef(accb if b_in_acc else FB, b),
                c=ir.RegRef(accb, c))
    nest = ir.For(M_, 3, ir.For(N_, 4, body, unroll=True), unroll=True)
    if wrap is not None:
        nest = wrap(nest)
    per = 8 // acc.np.itemsize                     # registers a st_global_8 stores
    stores = [call(sm70.st_global_8, dst=ir.MemRef(out, TID * acc_size + per * i), src=ir.RegRef(accb, per * i))
              for i in range(acc_size // per)]
    return program([*loads, nest, *stores], (X_IN, out), threads=T, regs=(FA, FB, accb))


GOOD = dict(d=(M_ * 4 + N_) * 4, a=M_ * 8, b=N_ * 4, c=(M_ * 4 + N_) * 4)


@pytest.mark.parametrize("case", [
    GOOD,
    dict(GOOD, acc=dt.f16),
    # b read from the accumulators' buffer, registers no iteration writes
    dict(GOOD, acc=dt.f16, acc_size=52, b=48, b_in_acc=True),
], ids=["f32", "f16", "b-in-acc"])
def test_a_nest_of_independent_mmas_runs_stacked_and_equals_the_loop(case):
    prog = nest_program(**case)
    got, nests = run(prog, X)
    want, _ = run(prog, X, stack=False)
    assert nests == ["m"]
    same(got, want)


@pytest.mark.parametrize("case", [
    # accumulators of neighbouring iterations overlap
    dict(d=(M_ * 4 + N_) * 2, a=M_ * 8, b=N_ * 4, c=(M_ * 4 + N_) * 2, acc_size=28),
    # a chain: each iteration accumulates onto what the one before it wrote
    dict(d=(M_ * 4 + N_) * 4 + 4, a=M_ * 8, b=N_ * 4, c=(M_ * 4 + N_) * 4, acc_size=52),
    # iterations with the same n write the same registers (the loop over n, for each m, can stack)
    dict(d=N_ * 4, a=M_ * 8, b=N_ * 4, c=N_ * 4, inner=["n"] * 3),
    # iteration (0, 0) writes the registers every iteration reads as b (the loops over n for m = 1
    # and 2, which do not write them, can stack)
    dict(GOOD, acc=dt.f16, b=0, b_in_acc=True, inner=["n"] * 2),
    # each warp its own accumulators: offsets that differ between threads
    dict(d=(M_ * 4 + N_) * 4 + (TID // 32) * 48, a=M_ * 8, b=N_ * 4, c=(M_ * 4 + N_) * 4 + (TID // 32) * 48,
         acc_size=96),
    # a predicate that is not a constant (warp 0 issues, warp 1 does not)
    dict(GOOD, pred=lt(TID, 32)),
    # not every thread active: one warp of two
    dict(GOOD, wrap=lambda nest: ir.If(lt(TID, 32), nest)),
], ids=["overlapping", "chained", "same-registers", "output-read-as-b", "per-thread-offset", "pred", "masked"])
def test_nests_that_cannot_run_stacked_run_as_written(case):
    case = dict(case)
    inner = case.pop("inner", [])
    prog = nest_program(**case)
    got, nests = run(prog, X)
    want, _ = run(prog, X, stack=False)
    assert nests == inner
    same(got, want)


@pytest.mark.parametrize("case", [
    dict(GOOD, acc_size=44),                                                   # m = 2, n = 3 writes acc[44..47]
    dict(d=(M_ * 4 + N_) * 4, a=M_ * 8 + 2, b=N_ * 4, c=(M_ * 4 + N_) * 4),    # m = 2 reads fa[18..25]
    dict(d=(M_ * 4 + N_) * 4 - 4, a=M_ * 8, b=N_ * 4, c=(M_ * 4 + N_) * 4 - 4),  # m = n = 0 at acc[-4..-1]
], ids=["acc-end", "a-end", "acc-start"])
def test_a_nest_with_an_iteration_out_of_range_reports_what_the_loop_reports(case):
    prog = nest_program(**case)
    got = hazard(prog, X)
    want = hazard(prog, X, stack=False)
    assert got == want
    assert "out of range" in want and "m=" in want


# --------------------------------------------------------------------------- rows of shared memory

def edit(s, drop):
    """Statement ``s`` without the statements for which ``drop`` is true."""
    if isinstance(s, ir.Seq):
        return ir.Seq([edit(c, drop) for c in s.body if not drop(c)])
    if isinstance(s, ir.For):
        return attrs.evolve(s, body=edit(s.body, drop))
    if isinstance(s, ir.If):
        return attrs.evolve(s, then=edit(s.then, drop))
    return s


def without(prog, drop):
    k = prog.kernels[0]
    return attrs.evolve(prog, kernels=(attrs.evolve(k, body=edit(k.body, drop)),))


def comment_is(text):
    return lambda s: isinstance(s, ir.Barrier) and s.comment == text


GEMM = gemm_program(64, 64, 64, BM=32, BN=64, BK=32, warps_m=2, warps_n=2)
GEMM_X = gemm_inputs(64, 64, 64, seed=6)


def test_row_accesses_equal_element_accesses():
    for prog, shape in ((GEMM, (64, 64, 64)),
                        (gemm_program(32, 16, 32, BM=16, BN=16, BK=16, warps_m=1, warps_n=2, stage="ld_st"),
                         (32, 16, 32))):
        x = gemm_inputs(*shape, seed=7)
        got, _ = run(prog, x)
        want, _ = run(prog, x, rows=False)
        same(got, want)


@pytest.mark.parametrize("drop", [
    comment_is("tiles staged"),                      # ldmatrix reads what other threads' cp.async wrote
    comment_is("tiles consumed"),                    # the next tile's cp.async overwrites what was read
    lambda s: isinstance(s, ir.AsyncWait),           # ldmatrix reads in-flight data
], ids=["raw", "war", "in-flight"])
def test_row_accesses_report_what_element_accesses_report(drop):
    prog = without(GEMM, drop)
    got = hazard(prog, GEMM_X)
    want = hazard(prog, GEMM_X, rows=False, stack=False)
    assert got == want


def test_copies_never_waited_for_are_reported_alike():
    # two groups of copies, a wait that lands the first: the second is in flight when the block ends
    x = gbuf("x", dt.f16, (2 * T * 8,))
    y = gbuf("y", dt.f16, (8,), "out")
    sh = ir.SharedBuffer("s", dt.f16, 2 * T * 8 + 8)
    body = [call(sm80.cp_async_16, src=ir.MemRef(x, TID * 8), dst=ir.MemRef(sh, 8 + (TID + 3) % T * 8)),
            ir.AsyncCommit(),
            call(sm80.cp_async_16, src=ir.MemRef(x, T * 8 + TID * 8), dst=ir.MemRef(sh, 8 + T * 8 + TID * 8)),
            ir.AsyncCommit(), ir.AsyncWait(1)]
    prog = program(body, (x, y), threads=T, shared=(sh,), output=y)
    feed = {"x": np.arange(2 * T * 8).astype(np.float16)}
    got = hazard(prog, feed)
    want = hazard(prog, feed, rows=False)
    assert got == want and "never waited for" in got and f"offset {8 + T * 8}" in got
