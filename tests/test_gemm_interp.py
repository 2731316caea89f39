"""GEMM recipe schedules, interpreted on the CPU, against numpy.

Random parameter sets (tiles, warps, K tile, stages, dtypes, layouts, split-K, fused epilogues and
prologues) on small problems whose sizes are often not multiples of the tiles, plus a fixed list of
named cases.  The reference rounds the inputs to the schedule's dtype, multiplies in float64 and
applies the epilogue in float64.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched.recipes.gemm import gemm_space

_NP = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16), "f32": np.dtype(np.float32)}

EPILOGUES = {
    "none": lambda: (),
    "bias": lambda: (fs.ops.bias("bias"),),
    "bias_m": lambda: (fs.ops.bias("bias", axis="m"),),
    "bias_relu": lambda: (fs.ops.bias("bias"), fs.ops.relu()),
    "bias_gelu": lambda: (fs.ops.bias("bias"), fs.ops.gelu()),
    "residual": lambda: (fs.ops.residual("residual"),),
    "scale": lambda: (fs.ops.scale(-1.5),),
    "sigmoid": lambda: (fs.ops.sigmoid(),),
    "tanh": lambda: (fs.ops.tanh(),),
}
# the kinds hypothesis draws from (bias along m is a fixed case only)
DRAWN_EPILOGUES = ["none", "bias", "bias_relu", "bias_gelu", "residual", "scale", "sigmoid", "tanh"]


def _round(x, name):
    return np.asarray(x, dtype=np.float64).astype(_NP[name]).astype(np.float64)


def _gelu(x):
    from math import erf, sqrt

    return np.vectorize(lambda t: 0.5 * t * (1.0 + erf(t / sqrt(2.0))), otypes=[np.float64])(x)


def make_inputs(M, N, K, ops, out, rng):
    """A, B and the extra tensors the epilogue reads, in the order ``interpret`` takes them."""
    A = rng.standard_normal((M, K))
    B = rng.standard_normal((K, N))
    extras = {}
    for op in ops:
        for e in op.extras():
            if e.kind == "vector_n":
                extras[e.name] = rng.standard_normal(N) * 4
            elif e.kind == "vector_m":
                extras[e.name] = rng.standard_normal(M) * 4
            else:
                extras[e.name] = rng.standard_normal((M, N)) * 4
    return A, B, extras


def reference(A, B, extras, *, dtype, out, ops, prologue):
    a = _round(A, dtype)
    b = _round(B, dtype)
    if prologue:
        a = np.maximum(a, 0.0)
    c = a @ b
    for op in ops:
        if isinstance(op, fs.ops.Bias):
            v = _round(extras[op.name], out)
            c = c + (v.reshape(1, -1) if op.axis == "n" else v.reshape(-1, 1))
        elif isinstance(op, fs.ops.Residual):
            c = c + _round(extras[op.name], out)
        elif isinstance(op, fs.ops.Scale):
            c = c * op.alpha
        elif isinstance(op, fs.ops.Unary):
            c = {"relu": lambda x: np.maximum(x, 0.0), "gelu": _gelu, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
                 "tanh": np.tanh}[op.op](c)
        else:  # pragma: no cover - the tests only draw the ops above
            raise AssertionError(op)
    return c


def build_gemm(M, N, K, *, dtype="f16", out_dtype=None, layout="RR", epilogue="none", prologue=False,
               seed=0, **params):
    return fs.recipes.gemm(M, N, K, dtype, "sm_80", out_dtype=out_dtype, layout=layout, epilogue_ops=EPILOGUES[epilogue](),
                           prologue_ops=(fs.ops.relu(),) if prologue else (), **params)


def check_gemm(M, N, K, *, dtype="f16", out_dtype=None, layout="RR", epilogue="none", prologue=False,
               seed=0, **params):
    out = out_dtype or dtype
    ops = EPILOGUES[epilogue]()
    sched = build_gemm(M, N, K, dtype=dtype, out_dtype=out_dtype, layout=layout, epilogue=epilogue,
                       prologue=prologue, **params)
    rng = np.random.default_rng(seed)
    A, B, extras = make_inputs(M, N, K, ops, out, rng)
    args = [extras[e.name] for op in ops for e in op.extras()]
    C = fs.interpret(sched, A, B, *args)
    assert C.shape == (M, N)
    assert C.dtype == _NP[out], (C.dtype, out)
    ref = reference(A, B, extras, dtype=dtype, out=out, ops=ops, prologue=prologue)
    got = np.asarray(C, dtype=np.float64)
    assert np.isfinite(got).all()
    rtol = 1e-3 if out == "f32" else 2e-2
    scale = max(float(np.abs(ref).max()), 1e-3)
    err = np.abs(got - ref)
    worst = np.unravel_index(int(np.argmax(err)), err.shape)
    assert err.max() <= rtol * scale + 1e-4, (
        f"max error {err.max():.4g} at {worst} (got {got[worst]:.6g}, want {ref[worst]:.6g}), "
        f"allowed {rtol * scale + 1e-4:.4g}\n{sched}")


# --------------------------------------------------------------------------- fixed cases

SMALL = dict(block_m=32, block_n=32, block_k=32, warps_m=2, warps_n=1, stages=2)

FIXED = [
    *[pytest.param(64, 48, 96, dict(layout=lay, **SMALL), id=f"layout-{lay}") for lay in ("RR", "RC", "CR", "CC")],
    *[pytest.param(40, 48, 64, dict(epilogue=ep, **SMALL), id=f"epilogue-{ep}") for ep in EPILOGUES],
    *[pytest.param(40, 48, 64, dict(epilogue=ep, out_dtype="f32", **SMALL), id=f"epilogue-{ep}-f32")
      for ep in ("bias_relu", "residual")],
    pytest.param(40, 48, 64, dict(prologue=True, epilogue="bias_relu", **SMALL), id="prologue-relu"),
    pytest.param(64, 40, 64, dict(dtype="bf16", **SMALL), id="bf16"),
    pytest.param(64, 40, 64, dict(dtype="bf16", out_dtype="f32", layout="CC", **SMALL), id="bf16-f32-CC"),
    pytest.param(96, 80, 200, dict(block_m=64, block_n=32, block_k=32, warps_m=2, warps_n=1, split_k_warps=2,
                                   stages=2, epilogue="bias_relu"), id="split-k-warps"),
    pytest.param(64, 64, 128, dict(block_m=32, block_n=32, block_k=64, warps_m=1, warps_n=2, split_k_warps=4,
                                   stages=3), id="split-k-warps-4"),
    pytest.param(50, 40, 150, dict(block_m=32, block_n=32, block_k=32, warps_m=1, warps_n=1, split_k_blocks=2,
                                   stages=3, epilogue="bias_gelu"), id="split-k-blocks"),
    pytest.param(50, 40, 256, dict(block_m=32, block_n=32, block_k=32, warps_m=2, warps_n=2, split_k_blocks=4,
                                   stages=2, epilogue="residual", out_dtype="f32"), id="split-k-blocks-4"),
    pytest.param(70, 40, 150, dict(block_m=32, block_n=32, block_k=32, warps_m=2, warps_n=1, split_k_blocks=2,
                                   split_k_warps=2, stages=2, epilogue="bias"), id="split-k-blocks-and-warps"),
    pytest.param(33, 47, 40, dict(block_m=32, block_n=32, block_k=16, warps_m=2, warps_n=2, stages=2),
                 id="odd-33x47x40"),
    pytest.param(33, 47, 41, dict(block_m=32, block_n=32, block_k=16, warps_m=2, warps_n=1, stages=3,
                                  epilogue="bias"), id="odd-33x47x41-sync-copy"),
    pytest.param(33, 47, 41, dict(block_m=32, block_n=32, block_k=16, warps_m=1, warps_n=2, stages=2,
                                  layout="CC", epilogue="residual"), id="odd-33x47x41-CC"),
    pytest.param(17, 19, 23, dict(block_m=16, block_n=16, block_k=16, warps_m=1, warps_n=1, stages=1,
                                  layout="RC"), id="odd-17x19x23-one-warp"),
    pytest.param(64, 64, 64, dict(block_m=64, block_n=64, block_k=64, warps_m=2, warps_n=2, stages=1),
                 id="one-stage"),
    pytest.param(32, 32, 256, dict(block_m=32, block_n=32, block_k=16, warps_m=1, warps_n=1, stages=4,
                                   swizzle=fs.Swizzle(0, 0, 0)), id="no-swizzle-4-stages"),
    pytest.param(64, 64, 128, dict(block_m=32, block_n=32, block_k=64, warps_m=2, warps_n=1, stages=2, warp_k=64),
                 id="warp_k-64"),
    pytest.param(64, 64, 128, dict(block_m=32, block_n=32, block_k=64, warps_m=2, warps_n=1, stages=2, warp_k=32,
                                   split_k_warps=2), id="warp_k-32-split-k-warps"),
    pytest.param(64, 64, 128, dict(block_m=32, block_n=32, block_k=64, warps_m=2, warps_n=1, stages=3, warp_k=16,
                                   prefetch=False), id="no-prefetch"),
    pytest.param(160, 96, 64, dict(block_m=32, block_n=32, block_k=32, warps_m=2, warps_n=1, stages=2, group_m=2,
                                   epilogue="bias_m"), id="grouped-blocks-2"),
    pytest.param(150, 100, 64, dict(block_m=32, block_n=32, block_k=32, warps_m=1, warps_n=2, stages=3, group_m=3,
                                    epilogue="residual"), id="grouped-blocks-3-partial"),
]


@pytest.mark.parametrize("M, N, K, kw", FIXED)
def test_gemm_fixed(M, N, K, kw):
    check_gemm(M, N, K, **kw)


SPACE_PROBLEMS = [(128, 128, 128), (100, 72, 200)]


@pytest.mark.parametrize("M, N, K", SPACE_PROBLEMS, ids=lambda v: str(v))
def test_gemm_space_entries_interpret_correctly(M, N, K):
    entries = list(gemm_space(M, N, K, limit=5, arch="sm_80"))
    assert len(entries) == 5
    for p in entries:
        check_gemm(M, N, K, block_m=p.block_m, block_n=p.block_n, block_k=p.block_k, warps_m=p.warps_m,
                   warps_n=p.warps_n, stages=p.stages, split_k_blocks=p.split_k_blocks,
                   split_k_warps=p.split_k_warps, swizzle=p.swizzle)


def test_gemm_space_on_sm90a_enumerates_both_families():
    """On sm_90a the space lists wgmma and mma.sync configurations, each of which builds with
    params= (its family named in the point)."""
    entries = []
    for p in gemm_space(256, 256, 256, arch="sm_90a"):   # checked lazily: stop at three of each family
        entries.append(p)
        if min(sum(q.family == f for q in entries) for f in ("sm80", "sm90a")) >= 3:
            break
    assert {p.family for p in entries} == {"sm80", "sm90a"}
    for p in [p for p in entries if p.family == "sm90a"][:3] + [p for p in entries if p.family == "sm80"][:3]:
        s = fs.recipes.gemm(256, 256, 256, arch="sm_90a", params=p)
        assert ("wgmma" in str(s)) == (p.family == "sm90a")


# --------------------------------------------------------------------------- random schedules

def _ci() -> bool:
    return settings().max_examples >= 500


@st.composite
def gemm_cases(draw):
    bm = draw(st.sampled_from([32, 64]))
    bn = draw(st.sampled_from([16, 32, 64]))
    wm = draw(st.sampled_from([w for w in (1, 2, 4) if bm % w == 0 and (bm // w) % 16 == 0]))
    wn = draw(st.sampled_from([w for w in (1, 2, 4) if bn % w == 0 and (bn // w) % 16 == 0]))
    bk = draw(st.sampled_from([16, 32, 64]))
    skw = draw(st.sampled_from([s for s in (1, 2) if bk % (16 * s) == 0]))
    skb = draw(st.sampled_from([1, 1, 2]))
    per_warp_k = bk // skw
    wk = draw(st.sampled_from([w for w in (16, 32, 64) if per_warp_k % w == 0]))
    M = draw(st.integers(bm, 3 * bm))
    N = draw(st.integers(bn, 3 * bn))
    k_lo, k_hi = bk, 4 * bk
    if skb > 1:                       # parts of 64: two parts need 64 < K <= 256
        k_lo, k_hi = max(k_lo, 65), max(k_hi, 160)
    K = draw(st.integers(k_lo, k_hi))
    if draw(st.integers(0, 4)):       # mostly 16-byte aligned rows (cp.async), sometimes not
        M, N, K = (-(-x // 8) * 8 for x in (M, N, K))
        if skb > 1 and K > 256:
            K = 256
    dtype = draw(st.sampled_from(["f16", "bf16"]))
    return dict(
        M=M, N=N, K=K, dtype=dtype,
        out_dtype=draw(st.sampled_from([None, "f32"])),
        layout=draw(st.sampled_from(["RR", "RC", "CR", "CC"])),
        block_m=bm, block_n=bn, block_k=bk, warps_m=wm, warps_n=wn,
        stages=draw(st.integers(1, 4)),
        split_k_warps=skw, split_k_blocks=skb, warp_k=wk,
        group_m=draw(st.sampled_from([1, 1, 2, 3])),
        prefetch=draw(st.booleans()),
        epilogue=draw(st.sampled_from(DRAWN_EPILOGUES)),
        prologue=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=100 if _ci() else 25, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(gemm_cases())
def test_gemm_random_schedules_match_numpy(case):
    case = dict(case)
    M, N, K = case.pop("M"), case.pop("N"), case.pop("K")
    try:
        build_gemm(M, N, K, **case)      # e.g. registers over budget: not a schedule to run
    except fs.ScheduleError:
        assume(False)
    check_gemm(M, N, K, **case)
