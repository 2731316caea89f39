"""``tile(..., unroll=False)``: a warp-level sequential loop that runs at run time instead of being
unrolled — its printed ``#pragma unroll 1``, the interpreter against numpy, and the schedules it
refuses (a loop whose variable indexes registers, a loop mapped onto units)."""

from __future__ import annotations

import numpy as np
import pytest

import firesched as fs
from firesched import ir
from firesched.hardware import sm80
from firesched.ir import rewrite
from firesched.recipes.fmha import FmhaParams
from firesched.schedule import Loop
from firesched.strategies import done, move_to_regs, move_to_smem, pipeline, tile, to_blocks, to_warps
from firesched.tensor import WARP

MMA = sm80.mma_m16n8k16_f16_f32


def _gemm(M, N, K, *, unroll=True, regs_inside=True):
    warp = [tile(k=32, unroll=unroll), move_to_regs("A"), move_to_regs("B")] if regs_inside else \
        [move_to_regs("A"), move_to_regs("B"), tile(k=32, unroll=unroll)]
    return fs.MatMul.kernel(M, N, K).schedule(
        tile(m=64, n=64) >> to_blocks(), tile(k=64), move_to_smem("A"), move_to_smem("B"), pipeline(2),
        tile(m=32, n=32) >> to_warps(), *warp, tile(m=16, n=8, k=16) >> done(MMA))


def _loops(prog):
    return [s for k in prog.kernels for s in rewrite.walk([k.body]) if isinstance(s, ir.For)]


def test_repr_round_trips_and_the_loop_says_rolled():
    t = tile(k=32, unroll=False)
    assert repr(t) == "tile(k=32, unroll=False)" and eval(repr(t)) == t
    assert repr(tile(k=32)) == "tile(k=32)" and tile(k=32) != t
    lp = Loop("k0", 4, (("k", 32),), rolled=True)
    assert eval(repr(lp)) == lp and str(lp).endswith("rolled")
    # the warps' K loop (64 k in steps of 32) is the tree's one rolled loop
    assert [ln.split(" in ")[1] for ln in str(_gemm(64, 64, 128, unroll=False)).splitlines()
            if "rolled" in ln] == ["seq(2) rolled:"]
    assert "rolled" not in str(_gemm(64, 64, 128))


def test_the_warps_k_loop_runs_at_run_time_and_matches_numpy():
    M, N, K = 70, 50, 200
    rolled, unrolled = _gemm(M, N, K, unroll=False), _gemm(M, N, K)
    # loops at run time below the block's K loop (4 tiles of 64): the warps' (64 k in steps of 32)
    run_time = lambda s: [f.extent for f in _loops(s.lower("sm_80")) if not f.unroll and f.extent < 4]  # noqa: E731
    assert run_time(rolled) == [2] and run_time(unrolled) == []
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    r = lambda x: x.astype(np.float16).astype(np.float64)  # noqa: E731
    ref = r(A) @ r(B)
    for sched in (rolled, unrolled):
        C = np.asarray(fs.interpret(sched, A, B), np.float64)
        assert np.abs(C - ref).max() <= 1e-2 * np.abs(ref).max()
    # it prints as a loop NVRTC keeps (and compiles)
    k = fs.compile(rolled, arch="sm_80")
    assert k.source.count("#pragma unroll 1") > fs.compile(unrolled, arch="sm_80").source.count("#pragma unroll 1")
    assert k.spills == 0


def test_a_rolled_loop_that_walks_registers_is_refused():
    # the fragments are loaded above the loop: each step reads another slice of them by k0
    with pytest.raises(fs.ScheduleError, match="unroll=False") as e:
        _gemm(64, 64, 128, unroll=False, regs_inside=False).check("sm_80")
    assert "register" in str(e.value)


def test_a_rolled_loop_mapped_onto_warps_is_refused():
    sched = fs.MatMul.kernel(64, 64, 64).schedule(
        tile(m=64, n=64) >> to_blocks(), tile(k=64), move_to_smem("A"), move_to_smem("B"),
        tile(m=32, n=32, unroll=False) >> to_warps(), move_to_regs("A"), move_to_regs("B"),
        tile(m=16, n=8, k=16) >> done(MMA))
    with pytest.raises(fs.ScheduleError, match="mapped onto") as e:
        sched.check("sm_80")
    assert "unroll=False" in str(e.value) and WARP.name.lower() in str(e.value).lower()


def test_unroll_must_be_a_bool():
    with pytest.raises(fs.ScheduleError, match="unroll"):
        fs.MatMul.kernel(64, 64, 64).schedule(tile(m=64, n=64, unroll=1))


def test_attention_roll_slices():
    """``FmhaParams(roll_slices=True)``: the query slices of S = Q Kᵀ in a loop at run time, against
    numpy through the interpreter (odd length, causal), and refused with wgmma."""
    p = FmhaParams(block_q=64, block_kv=32, warps=2, q_slice=32, roll_slices=True)
    s, d = 45, 64
    sched = fs.recipes.fmha(1, 2, s, s, d, arch="sm_80", params=p, causal=True)
    prog = sched.lower("sm_80")
    assert any(not f.unroll and f.extent == d // 32 for f in _loops(prog))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(x) for x in ((1, 2, 1, s, d), (1, 2, s, d), (1, 2, s, d)))
    r = lambda x: x.astype(np.float16).astype(np.float64)  # noqa: E731
    sc = np.einsum("bhgqd,bhkd->bhgqk", r(q), r(k)) / np.sqrt(d)
    sc = np.where(np.arange(s)[None, :] > np.arange(s)[:, None], -np.inf, sc)
    w = np.exp(sc - sc.max(-1, keepdims=True))
    ref = np.einsum("bhgqk,bhkd->bhgqd", w / w.sum(-1, keepdims=True), r(v))
    got = np.asarray(fs.interpret(sched, q, k, v), np.float64)
    assert np.abs(got - ref).max() < 5e-3
    with pytest.raises(ValueError, match="roll_slices"):
        FmhaParams(block_q=128, warps=8, mma="wgmma", roll_slices=True)
