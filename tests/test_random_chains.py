"""Hand-written strategy chains, drawn at random for every spec kind: tile sizes that may not divide,
any stage count, any warp or thread arrangement, odd and tiny shapes.  Each chain either raises
``ScheduleError`` at ``check()`` — and nothing else — or interprets hazard-free and equals numpy
(formulas written here).  Tile sizes include the ones that once passed ``check()`` and went wrong
(a K tile of 24 over a k=16 atom, warp tiles of 48 rows), so the CI profile finds such failures."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ops
from firesched.hardware import sm80
from firesched.ir import GUARDS
from firesched.strategies import (
    done,
    epilogue,
    move_to_regs,
    move_to_smem,
    pipeline,
    tile,
    to_blocks,
    to_threads,
    to_warps,
)


def _examples(dev: int, ci: int):
    n = ci if settings().max_examples >= 500 else dev
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _r(x, dt="f16"):
    return np.asarray(x).astype(fs.dtypes.dtype(dt).np).astype(np.float64)


def _accept_or_refuse(spec, chain, target="sm_80"):
    """The checked schedule, or None when a strategy or check() refused it (only ScheduleError)."""
    try:
        sched = spec.schedule(*chain)
        sched.check(target)
    except fs.ScheduleError:
        event("refused")
        return None
    event("accepted and run")
    return sched


# --------------------------------------------------------------------------- MatMul

@_examples(dev=20, ci=250)
@given(M=st.integers(1, 80), N=st.integers(1, 80), K=st.integers(1, 80), bm=st.sampled_from([16, 32, 48, 64, 96]),
       bn=st.sampled_from([8, 16, 24, 32, 48, 64]), bk=st.sampled_from([8, 16, 24, 32, 48, 64]),
       wm=st.sampled_from([16, 32, 48]), wn=st.sampled_from([8, 16, 24, 32]), wk=st.sampled_from([16, 24, 32]),
       stages=st.integers(1, 4), relu=st.booleans(), roll=st.booleans(), seed=st.integers(0, 99))
def test_matmul_chains(M, N, K, bm, bn, bk, wm, wn, wk, stages, relu, roll, seed):
    # roll: the warps' K loop runs at run time (tile(..., unroll=False)) instead of unrolled
    chain = [tile(m=bm, n=bn) >> to_blocks(), tile(k=bk), move_to_smem("A"), move_to_smem("B"), pipeline(stages),
             tile(m=wm, n=wn) >> to_warps(), tile(k=wk, unroll=not roll), move_to_regs("A"), move_to_regs("B"),
             tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32)]
    if relu:
        chain.append(epilogue(ops.relu()))
    sched = _accept_or_refuse(fs.MatMul.kernel(M, N, K), chain)
    if sched is None:
        return
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    ref = _r(A) @ _r(B)
    if relu:
        ref = np.maximum(ref, 0.0)
    C = fs.interpret(sched, A, B).astype(np.float64)
    assert np.abs(C - ref).max() <= 2e-2 * max(np.abs(ref).max(), 1.0)


# --------------------------------------------------------------------------- Pointwise

OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


@_examples(dev=25, ci=300)
@given(R=st.integers(1, 40), C=st.integers(1, 70), op=st.sampled_from(sorted(OPS)),
       bcast=st.sampled_from(["none", "row", "col"]), br=st.sampled_from([1, 2, 3, 4, 8]),
       bc=st.sampled_from([8, 16, 24, 32, 64]), tr=st.sampled_from([1, 2]), tc=st.sampled_from([1, 2, 3, 4, 8]),
       guard=st.sampled_from(GUARDS), seed=st.integers(0, 99))
def test_pointwise_chains(R, C, op, bcast, br, bc, tr, tc, guard, seed):
    second = {"none": ("r", "c"), "row": ("c",), "col": ("r",)}[bcast]
    spec = fs.Pointwise.kernel(op, {"r": R, "c": C}, inputs=[("r", "c"), second])
    sched = _accept_or_refuse(spec, [tile(r=br, c=bc) >> to_blocks(), tile(r=tr, c=tc) >> to_threads(),
                                     done(guard=guard)])
    if sched is None:
        return
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((R, C))
    Y = rng.standard_normal(tuple({"r": R, "c": C}[d] for d in second))
    y = _r(Y)[None, :] if bcast == "row" else _r(Y)[:, None] if bcast == "col" else _r(Y)
    want = _r(OPS[op](_r(X), y))
    got = fs.interpret(sched, X, Y)
    assert np.allclose(got, want, rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------- Move

@_examples(dev=12, ci=80)
@given(R=st.integers(1, 50), C=st.integers(1, 70), src=st.sampled_from(["f16", "bf16", "f32"]),
       dst=st.sampled_from(["f16", "bf16", "f32"]), transpose=st.booleans(), br=st.sampled_from([4, 8, 16, 32]),
       bc=st.sampled_from([8, 16, 32]), tr=st.sampled_from([1, 2, 4, 8]), tc=st.sampled_from([1, 2, 4, 8]),
       staged=st.booleans(), seed=st.integers(0, 99))
def test_move_chains(R, C, src, dst, transpose, br, bc, tr, tc, staged, seed):
    spec = fs.Move.kernel({"r": R, "c": C}, src=src, dst=dst, dst_major="r" if transpose else "c")
    chain = [tile(r=br, c=bc) >> to_blocks()]
    if staged:
        chain.append(move_to_smem("X"))
    chain += [tile(r=tr, c=tc) >> to_threads(), done()]
    sched = _accept_or_refuse(spec, chain)
    if sched is None:
        return
    X = np.random.default_rng(seed).standard_normal((R, C))
    got = fs.interpret(sched, X)
    assert np.array_equal(np.asarray(got, np.float64), _r(_r(X, src), dst))


# --------------------------------------------------------------------------- Reduce

REDUCE = {"sum": lambda x: x.sum(1), "max": lambda x: x.max(1), "min": lambda x: x.min(1),
          "mean": lambda x: x.mean(1)}


@_examples(dev=25, ci=300)
@given(R=st.integers(1, 20), C=st.integers(1, 300), op=st.sampled_from(sorted(REDUCE)),
       rows=st.sampled_from(["warps", "threads", "block"]), br=st.sampled_from([1, 2, 4]),
       chunk=st.sampled_from([16, 64, 100, 256]), tc=st.sampled_from([1, 2, 4, 8, 3]),
       lanes=st.sampled_from([None, 4, 8, 32]), split=st.sampled_from([None, 32, 100, 512]),
       guard=st.sampled_from(GUARDS), seed=st.integers(0, 99))
# 64 threads inside a warp's row: accepted once, and summed two rows' lanes together
@example(R=1, C=33, op="mean", rows="warps", br=2, chunk=64, tc=1, lanes=None, split=None, guard="branch", seed=0)
def test_reduce_chains(R, C, op, rows, br, chunk, tc, lanes, split, guard, seed):
    spec = fs.Reduce.kernel(op, {"r": R, "c": C}, "c")
    # split: the reduced dim tiled onto blocks too (partial results, then a second launch)
    chain = [tile(r=br) >> to_blocks() if split is None else tile(r=br, c=split) >> to_blocks()]
    if rows == "warps":
        chain.append(tile(r=1) >> to_warps())
    elif rows == "threads" and br > 1:
        chain.append(tile(r=1) >> to_threads())
    chain.append(tile(c=chunk))
    if lanes is not None:
        chain.append(tile(c=max(1, chunk // lanes)) >> to_threads())
    chain.append(tile(c=tc) >> to_threads() if lanes is None else tile(c=tc))
    chain.append(done(guard=guard))
    sched = _accept_or_refuse(spec, chain)
    if sched is None:
        return
    X = np.random.default_rng(seed).standard_normal((R, C))
    got = np.asarray(fs.interpret(sched, X), np.float64)
    assert np.allclose(got, REDUCE[op](_r(X)), rtol=1e-4, atol=1e-4)
