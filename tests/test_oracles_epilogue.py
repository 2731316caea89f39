"""Fused epilogues and prologues against formulas written in the tests, on every GEMM path.

``firesched.ops`` gives each scalar op a CUDA spelling (what the printer emits) and a numpy
meaning (what the interpreter runs).  A test that takes its expected values from either shares
the mistake it should catch: with ReLU's numpy meaning turned into ``abs`` the interpreter and an
``op.reference`` oracle agree.  Here the expected values come from ``tests/oracles.py`` (each op
written from its definition), the CUDA spellings are *evaluated* by ``tests/cmini.py`` and
compared with the same formulas, and the data make every op's mistakes visible: half the values
negative, magnitudes beyond where tanh and the GELUs saturate.
"""

from __future__ import annotations

import cmini
import numpy as np
import oracles
import pytest

import firesched as fs
from firesched import ops
from firesched.ops import SCALAR_OPS

# =========================================================================== CUDA spellings, evaluated

UNARY = ["relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "copy", "cvt"]
POINTS = [-30.0, -6.0, -2.5, -1.0, -0.3, -1e-3, 0.0, 1e-3, 0.3, 0.7, 1.0, 2.5, 6.0, 30.0]
WANT_UNARY = dict(oracles.UNARY, copy=lambda x: x, cvt=lambda x: x)


def _c_function(expr: str, arity: int) -> cmini.Program:
    params = ", ".join(f"float {n}" for n in "xy"[:arity])
    return cmini.Program(f"static __device__ float f({params}) {{ return {expr}; }}")


@pytest.mark.parametrize("name", UNARY)
def test_cuda_spelling_of_unary_ops(name):
    op = SCALAR_OPS[name]
    assert op.arity == 1
    prog = _c_function(op.c("x"), 1)
    for x in POINTS:
        got = float(prog.call("f", cmini.f32_val(x)).v)
        want = float(WANT_UNARY[name](np.array([x]))[0])
        assert abs(got - want) <= 2e-6 * max(1.0, abs(want)), (name, op.c("x"), x, got, want)


@pytest.mark.parametrize("name, want", [("add", lambda x, y: x + y), ("mul", lambda x, y: x * y),
                                        ("max", lambda x, y: x if x > y else y)])
def test_cuda_spelling_of_binary_ops(name, want):
    op = SCALAR_OPS[name]
    assert op.arity == 2
    prog = _c_function(op.c("x", "y"), 2)
    for x in POINTS[::3]:
        for y in POINTS[1::4]:
            got = float(prog.call("f", cmini.f32_val(x), cmini.f32_val(y)).v)
            assert got == float(np.float32(want(np.float32(x), np.float32(y)))), (name, x, y, got)


def test_cuda_spelling_of_the_approximate_division():
    # div_approx (a merge of Welford statistics: a count by a count) is x / y, in that order
    op = SCALAR_OPS["div_approx"]
    assert op.arity == 2
    prog = _c_function(op.c("x", "y"), 2)
    for x in POINTS:
        for y in (1.0, 3.0, 8.0, 1000.0, 7.0e5, 2.0 ** 31):
            got = float(prog.call("f", cmini.f32_val(x), cmini.f32_val(y)).v)
            assert abs(got - x / y) <= 2.5e-7 * abs(x / y), (x, y, got)
            assert float(op.np(np.float64(x), np.float64(y))) == x / y


@pytest.mark.parametrize("name", [n for n in UNARY if n not in ("copy", "cvt")] + ["add", "mul", "max"])
def test_numpy_meaning_of_scalar_ops(name):
    """The interpreter's meaning of each op, against the same formulas."""
    op = SCALAR_OPS[name]
    x = np.array(POINTS)
    if op.arity == 1:
        np.testing.assert_allclose(np.asarray(op.np(x), np.float64), WANT_UNARY[name](x), rtol=1e-12, atol=1e-12)
    else:
        y = x[::-1].copy()
        want = {"add": x + y, "mul": x * y, "max": np.where(x > y, x, y)}[name]
        np.testing.assert_allclose(np.asarray(op.np(x, y), np.float64), want)


# =========================================================================== through the interpreter

SM80 = dict(arch="sm_80", atoms="sm80", block_m=32, block_n=32, block_k=32, warps_m=2, warps_n=1, stages=2)
SM90_PLAIN = dict(arch="sm_90a", warp_specialized=False, block_m=64, block_n=64)
SM90_WS = dict(arch="sm_90a", warp_specialized=True, persistent=True, block_m=64, block_n=64)
PATHS = [pytest.param(SM80, id="sm80"), pytest.param(SM90_PLAIN, id="sm90-plain"), pytest.param(SM90_WS, id="sm90-ws")]

CHAINS = {
    "relu": (ops.relu(),),
    "gelu": (ops.gelu(),),
    "gelu_tanh": (ops.gelu(approximate="tanh"),),
    "sigmoid": (ops.sigmoid(),),
    "tanh": (ops.tanh(),),
    "scale": (ops.scale(-1.75),),
    "bias_n": (ops.bias("bias"),),
    "bias_m": (ops.bias("bias", axis="m"),),
    "residual": (ops.residual("residual"),),
    "bias_relu": (ops.bias("bias"), ops.relu()),
    "cast_f32": (ops.scale(3.0), ops.cast("f32")),
    "relu_cast_bf16": (ops.relu(), ops.cast("bf16")),
    "long": (ops.scale(-0.5), ops.bias("bias"), ops.gelu(approximate="tanh"), ops.residual("residual"), ops.tanh()),
    "both_biases": (ops.bias("bn"), ops.relu(), ops.bias("bm", axis="m"), ops.scale(0.25), ops.sigmoid()),
}


def _run(M, N, K, chain, kw, *, dtype="f16", out_dtype=None, seed=0, prologue=False):
    sched = fs.recipes.gemm(M, N, K, dtype, epilogue_ops=chain, out_dtype=out_dtype,
                            prologue_ops=(ops.relu(),) if prologue else (), **kw)
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    by_name, order = oracles.extras_for(chain, M, N, rng)
    C = fs.interpret(sched, A, B, *order, target="sm_90a")
    out = oracles.out_type(out_dtype, dtype, chain)
    want = oracles.gemm(A, B, dtype=dtype, out_dtype=out_dtype, ops=chain, extras=by_name, prologue_relu=prologue)
    assert C.dtype == oracles.NP_TYPES[out], (C.dtype, out)
    return C, want, out


@pytest.mark.parametrize("kw", PATHS)
@pytest.mark.parametrize("name", sorted(CHAINS))
def test_epilogue_matches_its_formula(name, kw):
    C, want, out = _run(96, 80, 64, CHAINS[name], kw)
    oracles.assert_close(C, want, out=out, what=name)


@pytest.mark.parametrize("kw", PATHS)
def test_relu_zeroes_negatives_and_keeps_positives(kw):
    """Exactly: ReLU of a sum of exact products is the sum or 0, never its magnitude."""
    M = N = 64
    K = 16
    sched = fs.recipes.gemm(M, N, K, epilogue_ops=(ops.relu(),), **kw)
    rng = np.random.default_rng(5)
    A = rng.integers(-4, 5, size=(M, K)).astype(np.float64)
    B = rng.integers(-4, 5, size=(K, N)).astype(np.float64)
    C = fs.interpret(sched, A, B, target="sm_90a").astype(np.float64)
    np.testing.assert_array_equal(C, np.where(A @ B > 0, A @ B, 0.0))


@pytest.mark.parametrize("dtype, out_dtype", [("bf16", None), ("bf16", "f32"), ("f16", "f32"), ("f16", "bf16")])
@pytest.mark.parametrize("kw", PATHS)
def test_output_types(kw, dtype, out_dtype):
    chain = (ops.bias("bias"), ops.gelu())
    C, want, out = _run(72, 64, 48, chain, kw, dtype=dtype, out_dtype=out_dtype, seed=3)
    oracles.assert_close(C, want, out=out, what=f"{dtype}->{out}")


def test_prologue_relu_on_a():
    C, want, out = _run(48, 40, 64, (ops.bias("bias"),), SM80, prologue=True, seed=4)
    oracles.assert_close(C, want, out=out, what="prologue relu")


def test_split_k_epilogues_apply_once_after_the_sum():
    """With split-K across blocks the epilogue runs in the reduction, on the whole sum: a ReLU
    applied per part, or a bias added per part, would differ."""
    kw = dict(SM80, split_k_blocks=3)
    C, want, out = _run(48, 40, 192, (ops.bias("bias"), ops.relu()), kw, seed=6)
    oracles.assert_close(C, want, out=out, what="split-K blocks")
    kw = dict(SM80, block_k=64, split_k_warps=2)
    C, want, out = _run(48, 40, 128, (ops.bias("bias"), ops.sigmoid()), kw, seed=7)
    oracles.assert_close(C, want, out=out, what="split-K warps")


def test_oracle_formulas_are_the_definitions():
    """The oracle itself, on values where the definitions are known exactly."""
    x = np.array([-2.0, 0.0, 3.0])
    np.testing.assert_array_equal(oracles.relu(x), [0.0, 0.0, 3.0])
    assert oracles.sigmoid(np.array([0.0]))[0] == 0.5
    assert oracles.gelu_erf(np.array([0.0]))[0] == 0.0
    assert abs(oracles.gelu_erf(np.array([1.0]))[0] - 0.8413447460685429) < 1e-15
    assert abs(oracles.gelu_tanh(np.array([1.0]))[0] - 0.8411919906082768) < 1e-15
    assert oracles.tanh(np.array([0.5]))[0] == np.tanh(0.5)
