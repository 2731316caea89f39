"""``gemm_sm90(..., swap_ab=True)``: ``Cᵀ = Bᵀ Aᵀ`` for a small M, M on the wgmma's N side and
N on its 64 rows, from B in either majorness.  The interpreter against numpy over odd shapes and the
recipe's options (warp specialization, persistence, stream-K, epilogues), the tree, the
errors, the default the tile model picks, and NVRTC."""

from __future__ import annotations

import attrs
import numpy as np
import oracles
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ops
from firesched.errors import ScheduleError
from firesched.hardware.target import SM90A


def _run(M, N, K, *, epi=(), sms=132, seed=0, layout="RC", **kw):
    sched = fs.recipes.gemm(M, N, K, "f16", "sm_90a", layout=layout, epilogue_ops=epi, **kw)
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    names = [op.name for op in epi if type(op).__name__ in ("Bias", "Residual")]
    extras = [rng.standard_normal((M, N) if e.kind == "matrix" else (N,) if e.kind == "vector_n" else (M,))
              for op in epi for e in op.extras()]
    C = fs.interpret(sched, A, B, *extras, target=attrs.evolve(SM90A, sm_count=sms)).astype(np.float64)
    ref = oracles.gemm(A, B, dtype="f16", ops=epi, extras=dict(zip(names, extras)))
    assert np.abs(C - ref).max() <= 2e-2 * max(np.abs(ref).max(), 1.0)
    return sched


def test_tree():
    sched = fs.recipes.gemm(16, 256, 128, "f16", "sm_90a", layout="RC", swap_ab=True, block_m=16, block_n=64,
                            stages=4)
    text = str(sched)
    assert "MatMul<kernel>(B:GL f16[128x256], A:GL f16[16x128], C:GL f16[16x256])" in text
    assert "wgmma_m64n16k16_f16_f32_ss)" in text
    rr = str(fs.recipes.gemm(16, 256, 128, "f16", "sm_90a", swap_ab=True, block_m=16, block_n=64, stages=4))
    assert "wgmma_m64n16k16_f16_f32_ss_tnspa" in rr
    # the caller's order: A, then B
    assert [b.name for b in sched.lower("sm_90a").inputs] == ["A", "B"]


@pytest.mark.parametrize("M, N, K, kw", [
    pytest.param(1, 136, 200, dict(block_m=8, block_n=64), id="M=1"),
    pytest.param(13, 200, 300, dict(block_m=16, block_n=64), id="odd"),
    pytest.param(40, 520, 264, dict(block_m=40, block_n=128, persistent=True), id="persistent-two-warpgroups"),
    pytest.param(64, 256, 1000, dict(block_m=64, block_n=64, warp_specialized=False), id="one-role"),
    pytest.param(64, 384, 1000, dict(block_m=64, block_n=128, stream_k_parts=3), id="stream-k"),
])
@pytest.mark.parametrize("layout", ["RC", "RR"])
def test_against_numpy(M, N, K, kw, layout):
    """A column-major B is the swapped product's K-major A; a row-major B its MN-major A."""
    _run(M, N, K, swap_ab=True, stages=4, sms=3, layout=layout, **kw)


@pytest.mark.parametrize("epi", [
    (ops.bias("bias"), ops.relu()),
    (ops.bias("rows", axis="m"), ops.gelu()),
    (ops.residual("residual"), ops.scale(0.5)),
], ids=["bias-relu", "row-bias-gelu", "residual"])
def test_epilogues(epi):
    """A bias over C's columns runs down the swapped accumulator's rows: the recipe turns its axis."""
    _run(24, 200, 160, epi=epi, swap_ab=True, block_m=24, block_n=64, stages=3)


def test_extra_inputs_of_a_swapped_schedule():
    """A residual has C's shape; a bias over C's columns has N elements (the recipe turned its axis
    down the swapped accumulator's rows)."""
    from firesched.testing.reference import extra_inputs

    sched = fs.recipes.gemm(24, 200, 160, "f16", "sm_90a", swap_ab=True, block_m=24, block_n=64, stages=3,
                            epilogue_ops=(ops.bias("bias"), ops.residual("residual")))
    assert dict(extra_inputs(sched)) == {"bias": (200,), "residual": (24, 200)}


def test_default_for_a_small_m():
    for M in (1, 16, 64, 65, 100, 120, 128):
        sched = fs.recipes.gemm(M, 4096, 4096, "f16", "sm_90a", layout="RC")
        assert "roles=('n', 'm', 'k')" in repr(sched.root.spec), M
    for M in (121, 127, 129):
        assert "roles" not in repr(fs.recipes.gemm(M, 4096, 4096, "f16", "sm_90a", layout="RC").root.spec), M
    # M on the wgmma's N side in a multiple of 8; the ring as deep as shared memory holds, at most 12
    p = fs.recipes.tiles.params_swapped(100, 4096, 4096)
    assert (p["block_m"], p["stages"]) == (104, 10)
    assert fs.recipes.tiles.params_swapped(16, 4096, 4096)["stages"] == 12
    assert "tnspa" in str(fs.recipes.gemm(16, 4096, 4096, "f16", "sm_90a"))        # a row-major B
    assert "roles" not in repr(fs.recipes.gemm(16, 4096, 4096, "f16", "sm_90a", layout="CR").root.spec)
    assert "roles" not in repr(fs.recipes.gemm(16, 4096, 4096, "f16", "sm_90a", batch=2).root.spec)
    _run(5, 300, 200)           # the default, interpreted
    _run(100, 130, 96)


def test_errors():
    with pytest.raises(ScheduleError, match="row-major A") as e:
        fs.recipes.gemm(16, 256, 256, "f16", "sm_90a", layout="CR", swap_ab=True, block_m=16, block_n=64)
    assert e.value.field == "layout"
    with pytest.raises(ScheduleError, match="block_m"):
        fs.recipes.gemm(16, 256, 256, "f16", "sm_90a", layout="RC", swap_ab=True, block_m=12, block_n=64)
    with pytest.raises(ScheduleError, match="block_n"):
        fs.recipes.gemm(16, 256, 256, "f16", "sm_90a", layout="RC", swap_ab=True, block_m=16, block_n=96)
    with pytest.raises(ScheduleError, match="sm_90a family"):
        fs.recipes.gemm(16, 256, 256, "f16", "sm_90a", layout="RC", atoms="sm80", swap_ab=True)
    with pytest.raises(ScheduleError, match="clusters"):
        fs.recipes.gemm(16, 256, 256, "f16", "sm_90a", layout="RC", swap_ab=True, block_m=16, block_n=64, cluster=2)
    with pytest.raises(ScheduleError, match="stream_k_parts"):
        fs.recipes.gemm(16, 256, 256, "f16", "sm_90a", layout="RC", swap_ab=True, block_m=16, block_n=64,
                        split_k_blocks=2)
    with pytest.raises(ScheduleError, match="swap_ab is a bool"):
        fs.recipes.gemm(16, 256, 256, "f16", "sm_90a", swap_ab="yes")
    with pytest.raises(ScheduleError, match="one GEMM"):
        fs.recipes.gemm(16, 256, 256, "f16", "sm_90a", layout="RC", swap_ab=True, block_m=16, block_n=64, batch=2)


cases = st.fixed_dictionaries(dict(
    M=st.integers(1, 64), N=st.integers(1, 40).map(lambda n: 8 * n), K=st.integers(1, 40).map(lambda k: 8 * k),
    bn=st.sampled_from([64, 128]), ws=st.booleans(), per=st.booleans(), stages=st.integers(2, 6),
    layout=st.sampled_from(["RC", "RR"]),
    sms=st.integers(1, 5), seed=st.integers(0, 2 ** 16)))


@settings(max_examples=30 if settings().max_examples >= 500 else 6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_random_swapped_schedules(case):
    """Random swapped GEMMs (M 1..64 in whole MMA columns, any N and K of whole 16-byte rows, one
    or two consumer warpgroups, with and without a producer and persistence) over 1-5 SMs: refused
    by name, or equal to numpy."""
    M, N, K, bn = case["M"], case["N"], case["K"], case["bn"]
    bm = -(-M // 8) * 8
    try:
        _run(M, N, K, swap_ab=True, block_m=bm, block_n=bn, warp_specialized=case["ws"],
             persistent=case["ws"] and case["per"], stages=case["stages"], sms=case["sms"], seed=case["seed"],
             layout=case["layout"])
    except ScheduleError as e:
        assert "registers" in str(e) or "shared memory" in str(e), str(e)


def test_compiles_without_spills():
    k = fs.compile(fs.recipes.gemm(16, 8192, 8192, "f16", "sm_90a", layout="RC"), arch="sm_90a")
    assert k.spills == 0
