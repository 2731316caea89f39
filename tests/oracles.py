"""Reference results written in the tests, sharing nothing with the implementation.

Every formula here is spelled out from its definition (ReLU is ``max(x, 0)``, GELU is
``x * Phi(x)`` with the error function from ``math``, ...) and rounds with numpy's and
ml_dtypes' own casts.  Nothing is imported from ``firesched`` except the op *values* a test
passes in, whose fields (``name``, ``axis``, ``alpha``, ``op``, ``dtype``) are read to pick a
formula: never ``op.reference``, ``ops.SCALAR_OPS``, an atom's ``semantics`` or layouts, or the
interpreter's helpers.  A mutation of the implementation therefore cannot move the expected
values with it.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

#: storage type of each element type name, as numpy / ml_dtypes spell it
NP_TYPES = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16), "f32": np.dtype(np.float32)}


def rounded(x, name: str) -> np.ndarray:
    """``x`` rounded to the element type ``name`` (round to nearest even), back in float64."""
    return np.asarray(x, dtype=np.float64).astype(NP_TYPES[name]).astype(np.float64)


def relu(x):
    return np.where(x > 0, x, 0.0)


def gelu_erf(x):
    return np.vectorize(lambda t: t * 0.5 * (1.0 + math.erf(t / math.sqrt(2.0))), otypes=[np.float64])(x)


def gelu_tanh(x):
    return np.vectorize(lambda t: 0.5 * t * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (t + 0.044715 * t ** 3))),
                        otypes=[np.float64])(x)


def sigmoid(x):
    return np.vectorize(lambda t: 1.0 / (1.0 + math.exp(-t)) if t > -700 else 0.0, otypes=[np.float64])(x)


def tanh(x):
    return np.vectorize(math.tanh, otypes=[np.float64])(x)


UNARY = {"relu": relu, "gelu": gelu_erf, "gelu_tanh": gelu_tanh, "sigmoid": sigmoid, "tanh": tanh}


def epilogue(c: np.ndarray, ops, extras: dict, out: str) -> np.ndarray:
    """``c`` (float64, M x N) after the epilogue ``ops`` in order; ``extras`` maps an extra
    tensor's name to its values (rounded here to the output type ``out``, as the kernel stores
    them in C's type)."""
    for op in ops:
        kind = type(op).__name__
        if kind == "Bias":
            v = rounded(extras[op.name], out)
            c = c + (v.reshape(1, -1) if op.axis == "n" else v.reshape(-1, 1))
        elif kind == "Residual":
            c = c + rounded(extras[op.name], out)
        elif kind == "Scale":
            c = c * float(op.alpha)
        elif kind == "Unary":
            c = UNARY[op.op](c)
        elif kind == "Cast":
            pass                     # changes the stored type only
        else:  # pragma: no cover - a new op needs its formula here
            raise AssertionError(f"no oracle for {op!r}")
    return c


def out_type(out_dtype: str | None, dtype: str, ops=()) -> str:
    """The stored type of C: the last ``cast``, else ``out_dtype``, else the input type."""
    name = out_dtype or dtype
    for op in ops:
        if type(op).__name__ == "Cast":
            name = op.dtype.name
    return name


def gemm(A, B, *, dtype: str = "f16", out_dtype: str | None = None, ops=(), extras=None,
         prologue_relu: bool = False, prologue=None) -> np.ndarray:
    """``epilogue(round(A) @ round(B))`` in float64: the inputs rounded to ``dtype``, products
    summed exactly enough (float64), then the epilogue; not rounded to the output type (the
    comparison's tolerance covers that).  ``prologue`` is ``(operand name "A" or "B", ops)`` or a
    list of them, element-wise ops applied to that operand first, in order (``prologue_relu``:
    ReLU on A)."""
    a, b = rounded(A, dtype), rounded(B, dtype)
    if prologue_relu:
        a = relu(a)
    if prologue is not None:
        # a prologue op runs on the operand's registers, which hold the input type: each op's
        # result is rounded to it before the next op (and before the products)
        for name, pops in ([prologue] if isinstance(prologue[0], str) else prologue):
            for op in pops:
                if name == "A":
                    a = rounded(epilogue(a, (op,), {}, dtype), dtype)
                else:
                    b = rounded(epilogue(b, (op,), {}, dtype), dtype)
    return epilogue(a @ b, ops, extras or {}, out_type(out_dtype, dtype, ops))


def extras_for(ops, M: int, N: int, rng, scale: float = 4.0) -> tuple[dict, list]:
    """Random extra tensors for ``ops``: ``(by name, in the order interpret() takes them)``."""
    by_name, order = {}, []
    for op in ops:
        kind = type(op).__name__
        if kind == "Bias":
            v = rng.standard_normal(N if op.axis == "n" else M) * scale
        elif kind == "Residual":
            v = rng.standard_normal((M, N)) * scale
        else:
            continue
        by_name[op.name] = v
        order.append(v)
    return by_name, order


def assert_close(got, want, *, out: str, what: str = "") -> None:
    """``got`` (the kernel's C) within the output type's rounding of ``want``, relative to the
    largest magnitude: 2e-2 for 16-bit outputs, 1e-3 for f32 (f32 accumulation of 16-bit
    products); reports the worst element."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.isfinite(got).all(), f"{what}: non-finite values"
    tol = (1e-3 if out == "f32" else 2e-2) * max(float(np.abs(want).max()), 1e-3) + 1e-4
    err = np.abs(got - want)
    worst = np.unravel_index(int(np.argmax(err)), err.shape)
    assert err.max() <= tol, (f"{what}: max error {err.max():.4g} at {worst} (got {got[worst]:.6g}, "
                              f"want {want[worst]:.6g}), allowed {tol:.4g}")
