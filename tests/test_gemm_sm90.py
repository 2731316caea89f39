"""The Hopper GEMM path (TMA + mbarrier ring + wgmma) on the CPU: the interpreter against numpy,
NVRTC compiles without spills, planted hazards, and the shapes it refuses."""

from __future__ import annotations

import attrs
import numpy as np
import oracles
import pytest

import firesched as fs
from firesched import ir, ops
from firesched import simulate as interp
from firesched.errors import HazardError, ScheduleError
from firesched.hardware.atoms import sm90a


def _ref(A, B, dt, epi=(), extras=()):
    """round(A) @ round(B), then the epilogue, from the formulas written in ``tests/oracles.py``
    (never the ops' own numpy meaning, which the interpreter runs too); ``extras`` in the order
    the bias / residual ops name them."""
    names = [op.name for op in epi if type(op).__name__ in ("Bias", "Residual")]
    return oracles.gemm(A, B, dtype=dt.name, ops=epi, extras=dict(zip(names, extras)))


CASES = [
    pytest.param(200, 136, 304, dict(block_m=128, block_n=64), id="partial-tiles"),
    pytest.param(200, 136, 304, dict(block_m=128, block_n=64, layout="RC"), id="B-column-major"),
    pytest.param(256, 512, 192, dict(block_m=128, block_n=256, stages=3), id="128x256"),
    pytest.param(300, 304, 200, dict(block_m=256, block_n=128, dtype="bf16"), id="256x128-bf16"),
    pytest.param(64, 64, 64, dict(block_m=64, block_n=64, stages=2), id="one-tile"),
    pytest.param(136, 64, 1000, dict(block_m=128, block_n=64, out_dtype="f32"), id="long-K-f32-out"),
    pytest.param(640, 256, 128, dict(block_m=64, block_n=128, group_m=4), id="grouped"),
]


@pytest.mark.parametrize("M, N, K, kw", CASES)
def test_interpreter_matches_numpy(M, N, K, kw):
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", atoms="sm90a", warp_specialized=False, **kw)
    rng = np.random.default_rng(M + N + K)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    C = fs.interpret(sched, A, B, target="sm_90a")
    ref = _ref(A, B, fs.dtypes.dtype(kw.get("dtype", "f16")))
    assert np.abs(C.astype(np.float64) - ref).max() / np.abs(ref).max() < 2e-2


@pytest.mark.parametrize("name", sorted(fs.recipes.EPILOGUES))
def test_epilogues(name):
    epi = fs.recipes.EPILOGUES[name]
    M, N, K = 192, 128, 128
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", atoms="sm90a", warp_specialized=False, block_m=128, block_n=128, epilogue_ops=epi)
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    extras = []
    for op in epi:
        for e in op.extras():
            extras.append(rng.standard_normal((M, N) if e.kind == "matrix" else (N,)))
    C = fs.interpret(sched, A, B, *extras, target="sm_90a")
    ref = _ref(A, B, fs.dtypes.f16, epi, extras)
    assert np.abs(C.astype(np.float64) - ref).max() / (np.abs(ref).max() + 1e-6) < 2e-2


@pytest.mark.parametrize("bm, bn, stages", [(128, 256, 4), (128, 128, 4), (256, 128, 3), (64, 256, 4)])
def test_compiles_without_spills(bm, bn, stages):
    sched = fs.recipes.gemm(4096, 4096, 4096, arch="sm_90a", atoms="sm90a", warp_specialized=False, block_m=bm, block_n=bn, stages=stages,
                            group_m=8, epilogue_ops=(ops.bias("bias"), ops.relu()))
    k = fs.compile(sched, arch="sm_90a")
    assert k.spills == 0
    assert "wgmma.mma_async" in k.source and "cp.async.bulk.tensor" in k.source


def test_needs_sm90a():
    sched = fs.recipes.gemm(256, 256, 256, arch="sm_90a", atoms="sm90a", warp_specialized=False, block_m=128, block_n=128)
    with pytest.raises(ScheduleError, match="sm_90a"):
        sched.check("sm_80")


@pytest.mark.parametrize("kw, words", [
    pytest.param(dict(split_k_warps=2), "split_k_warps", id="split-k-warps"),
    pytest.param(dict(prologue_ops=(ops.relu(),)), "prologue_ops", id="prologue"),
    pytest.param(dict(layout="CR"), "layout", id="column-major-A"),
    pytest.param(dict(block_n=96), "multiple of 64", id="block_n-not-64"),
    pytest.param(dict(block_m=96), "do not divide", id="block_m-not-64"),
])
def test_refused(kw, words):
    args = dict(block_m=128, block_n=128)
    args.update(kw)
    with pytest.raises(ScheduleError) as e:
        fs.recipes.gemm(512, 512, 512, arch="sm_90a", atoms="sm90a", warp_specialized=False, **args)
    assert words in str(e.value)


@pytest.mark.parametrize("M, N, K, kw, pads", [
    pytest.param(200, 136, 300, dict(block_m=128, block_n=64), ["A"], id="A-rows-600-bytes"),
    pytest.param(260, 67, 301, dict(block_m=128, block_n=64, warp_specialized=True, persistent=True), ["A", "B"],
                 id="both-odd-ws"),
    pytest.param(130, 200, 99, dict(block_m=64, block_n=64, layout="RC"), ["A", "B"], id="B-column-major-odd-K"),
])
def test_unaligned_rows_are_padded(M, N, K, kw, pads):
    """Rows that are not a multiple of 16 bytes are copied into padded workspaces that TMA reads."""
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", **dict(dict(atoms="sm90a", warp_specialized=False), **kw))
    prog = sched.lower("sm_90a")
    assert [k.name for k in prog.kernels[:-1]] == [f"firesched_pad_{n}" for n in pads]
    assert all(w.strides[0] * 2 % 16 == 0 for w in prog.workspaces)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    C = fs.interpret(sched, A, B, target="sm_90a")
    ref = _ref(A, B, fs.dtypes.f16)
    assert np.abs(C.astype(np.float64) - ref).max() / np.abs(ref).max() < 2e-2
    assert fs.compile(sched, arch="sm_90a").spills == 0


def _drop(stmt, pred):
    """``stmt`` without the statements for which ``pred`` is true."""
    if isinstance(stmt, ir.Seq):
        return ir.Seq(tuple(_drop(s, pred) for s in stmt.body if not pred(s)))
    if isinstance(stmt, ir.For):
        return attrs.evolve(stmt, body=_drop(stmt.body, pred))
    if isinstance(stmt, ir.If):
        return attrs.evolve(stmt, then=_drop(stmt.then, pred))
    return stmt


def _planted(pred):
    sched = fs.recipes.gemm(128, 128, 192, arch="sm_90a", atoms="sm90a", warp_specialized=False, block_m=128, block_n=64, stages=2)
    prog = sched.lower("sm_90a")
    k = prog.kernels[0]
    bad = attrs.evolve(prog, kernels=(attrs.evolve(k, body=_drop(k.body, pred)),))
    rng = np.random.default_rng(0)
    return prog, bad, {"A": rng.standard_normal((128, 192)), "B": rng.standard_normal((192, 128))}


def _is(atom):
    return lambda s: isinstance(s, ir.AtomCall) and s.atom.name == atom.name


def test_planted_missing_wgmma_wait():
    good, bad, feed = _planted(_is(sm90a.wgmma_wait))
    interp.run_program(good, feed)
    with pytest.raises(HazardError, match="wait_group|in flight|wgmma"):
        interp.run_program(bad, feed)


def test_planted_missing_mbarrier_wait():
    good, bad, feed = _planted(_is(sm90a.mbarrier_try_wait))
    interp.run_program(good, feed)
    with pytest.raises(HazardError, match="mbarrier|phase"):
        interp.run_program(bad, feed)


def test_planted_missing_barrier_before_refill():
    good, bad, feed = _planted(lambda s: isinstance(s, ir.Barrier) and "stage (kt-1) % S is free" in s.comment)
    interp.run_program(good, feed)
    with pytest.raises(HazardError):
        interp.run_program(bad, feed)


def test_planted_wrong_parity():
    sched = fs.recipes.gemm(128, 128, 256, arch="sm_90a", atoms="sm90a", warp_specialized=False, block_m=128, block_n=64, stages=2)
    prog = sched.lower("sm_90a")
    k = prog.kernels[0]

    def flip(stmt):
        if isinstance(stmt, ir.Seq):
            return ir.Seq(tuple(flip(s) for s in stmt.body))
        if isinstance(stmt, ir.For):
            return attrs.evolve(stmt, body=flip(stmt.body))
        if isinstance(stmt, ir.If):
            return attrs.evolve(stmt, then=flip(stmt.then))
        if isinstance(stmt, ir.AtomCall) and stmt.atom.name == sm90a.mbarrier_try_wait.name:
            args = tuple((n, ir.Scalar(1 - v.value) if n == "parity" else v) for n, v in stmt.args)
            return attrs.evolve(stmt, args=args)
        return stmt

    bad = attrs.evolve(prog, kernels=(attrs.evolve(k, body=flip(k.body)),))
    rng = np.random.default_rng(0)
    feed = {"A": rng.standard_normal((128, 256)), "B": rng.standard_normal((256, 128))}
    with pytest.raises(HazardError, match="parity|phase|mbarrier"):
        interp.run_program(bad, feed)
