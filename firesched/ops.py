"""Element-wise operations: the scalar ops of the kernel IR, and the epilogue/prologue ops users
attach to a spec (``fs.ops.bias("bias", axis="n")``, ``fs.ops.relu()``, ...).

A scalar op is data: its arity, how CUDA spells it on ``float`` values and how numpy computes it.
Both back ends read this one table.  Epilogue ops are values (frozen, printable) that say which
extra tensors they read and lower to a short list of scalar ops.
"""

from __future__ import annotations

from typing import Callable

import attrs
import numpy as np

from .dtypes import DType, dtype

# --------------------------------------------------------------------------- scalar ops


def _gelu_erf(x):
    from math import erf, sqrt

    v = np.vectorize(lambda t: 0.5 * t * (1.0 + erf(t / sqrt(2.0))), otypes=[np.float64])
    return v(np.asarray(x, dtype=np.float64))


def _gelu_tanh(x):
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def _exp_quiet(x):
    """exp(x) overflowing to inf without a warning, as ``expf`` does (the interpreter evaluates
    the lanes past a row's end too, whose values are discarded)."""
    with np.errstate(over="ignore"):
        return np.exp(x)


def _ftz(y):
    """Positive results below the smallest normal f32 flushed to 0, as ``ex2.approx.ftz`` does."""
    return np.where(np.abs(y) < 2.0 ** -126, 0.0, y)


#: log2(e): exp(x) = 2^(x·LOG2E)
LOG2E = 1.4426950408889634


@attrs.frozen
class ScalarOp:
    name: str
    arity: int
    c: Callable = attrs.field(eq=False, hash=False)       # (*c_args) -> C expression on float
    np: Callable = attrs.field(eq=False, hash=False)      # (*arrays) -> array (float64 math)


SCALAR_OPS: dict[str, ScalarOp] = {
    op.name: op
    for op in (
        ScalarOp("copy", 1, lambda x: x, lambda x: x),
        ScalarOp("add", 2, lambda x, y: f"{x} + {y}", lambda x, y: x + y),
        ScalarOp("mul", 2, lambda x, y: f"{x} * {y}", lambda x, y: x * y),
        ScalarOp("sub", 2, lambda x, y: f"{x} - {y}", lambda x, y: x - y),
        ScalarOp("div", 2, lambda x, y: f"{x} / {y}", lambda x, y: x / y),
        # x / y within 2 ulp (div.approx: a reciprocal and a multiply), for 2^-126 <= |y| <= 2^126:
        # the weight of a merge of statistics (firesched.monoids.welford), where the IEEE
        # division's routine (a dozen instructions and a slow path) took LayerNorm's issue slots
        ScalarOp("div_approx", 2, lambda x, y: f"__fdividef({x}, {y})", lambda x, y: x / y),
        ScalarOp("max", 2, lambda x, y: f"fmaxf({x}, {y})", np.maximum),
        ScalarOp("min", 2, lambda x, y: f"fminf({x}, {y})", np.minimum),
        ScalarOp("exp", 1, lambda x: f"expf({x})", np.exp),
        # 2^x as ex2.approx.ftz (the prelude's fs_ex2): results below 2^-126 are 0
        ScalarOp("exp2", 1, lambda x: f"fs_ex2({x})", lambda x: _ftz(np.exp2(x))),
        ScalarOp("log2", 1, lambda x: f"log2f({x})", np.log2),
        # exp2(x - m) of an online softmax, where a running max m of -inf (a row that has seen
        # only masked keys so far) counts as 0, so that -inf - -inf never makes a NaN
        ScalarOp("exp2_sub", 2, lambda x, m: f"fs_ex2({x} - ({m} == __int_as_float(0xff800000) ? 0.0f : {m}))",
                 lambda x, m: _ftz(np.exp2(x - np.where(np.isneginf(m), 0.0, m)))),
        # exp2(x·c - m·c) as one fma and one ex2: the online softmax on unscaled scores x, their
        # running max m (-inf counts as 0, as above) and the scale c = scale·log2(e) (c > 0)
        ScalarOp("exp2_sub_scaled", 3,
                 lambda x, m, c: f"fs_ex2(fmaf({x}, {c}, -(({m} == __int_as_float(0xff800000) ? 0.0f : {m}) * {c})))",
                 lambda x, m, c: _ftz(np.exp2(x * c - np.where(np.isneginf(m), 0.0, m) * c))),
        # exp(c·(x - m)) of a softmax's statistics with c > 0, where a maximum m of -inf (a part
        # of a row whose elements are all masked) counts as 0, so that -inf - -inf never makes a
        # NaN (firesched.monoids.softmax_stats)
        ScalarOp("exp_sub_scaled", 3,
                 lambda x, m, c: f"expf({c} * ({x} - ({m} == __int_as_float(0xff800000) ? 0.0f : {m})))",
                 lambda x, m, c: _exp_quiet(c * (x - np.where(np.isneginf(m), 0.0, m)))),
        # exp(c·(x - m)) · z: a softmax's output from its statistics (m the row's maximum, z the
        # reciprocal of its sum, c the scale) in one pass, so no thread holds the row's
        # exponentials at once
        ScalarOp("exp_sub_scaled_mul", 4, lambda x, m, c, z: f"expf({c} * ({x} - {m})) * {z}",
                 lambda x, m, c, z: _exp_quiet(c * (x - m)) * z),
        # exp2(c·(x - m)): exp_sub_scaled with c = scale·log2(e), in one ex2 (-inf counts as 0,
        # as there).  The difference first: x - m is exact near the maximum, where x·c - m·c in
        # one fma would carry the rounding of m·c (2^-24 of it: 1e-3 at scores of 10^4)
        ScalarOp("exp2_scaled_diff", 3,
                 lambda x, m, c: f"fs_ex2(({x} - ({m} == __int_as_float(0xff800000) ? 0.0f : {m})) * {c})",
                 lambda x, m, c: _ftz(np.exp2(c * (x - np.where(np.isneginf(m), 0.0, m))))),
        # exp2(c·(x - m)) · z: exp_sub_scaled_mul with c = scale·log2(e), in one ex2 (m finite: a
        # row's maximum); a masked element x = -inf gives 0
        ScalarOp("exp2_scaled_diff_mul", 4, lambda x, m, c, z: f"fs_ex2(({x} - {m}) * {c}) * {z}",
                 lambda x, m, c, z: _ftz(np.exp2(c * (x - m))) * z),
        # x * y + z rounded once (a group's scale times its partial product, added: rules.partials)
        ScalarOp("fma", 3, lambda x, y, z: f"fmaf({x}, {y}, {z})", lambda x, y, z: x * y + z),
        # (x - m) · r, times w, plus b: a normalization's output from its statistics (m the mean
        # or 0, r the reciprocal deviation) and its weight and bias, in one pass over the row
        ScalarOp("mul_mul", 3, lambda x, r, w: f"{x} * {r} * {w}", lambda x, r, w: x * r * w),
        ScalarOp("normalize", 3, lambda x, m, r: f"({x} - {m}) * {r}", lambda x, m, r: (x - m) * r),
        ScalarOp("normalize_scale", 4, lambda x, m, r, w: f"({x} - {m}) * {r} * {w}",
                 lambda x, m, r, w: (x - m) * r * w),
        ScalarOp("normalize_affine", 5, lambda x, m, r, w, b: f"fmaf(({x} - {m}) * {r}, {w}, {b})",
                 lambda x, m, r, w, b: (x - m) * r * w + b),
        ScalarOp("relu", 1, lambda x: f"fmaxf({x}, 0.0f)", lambda x: np.maximum(x, 0.0)),
        ScalarOp("gelu", 1, lambda x: f"0.5f * {x} * (1.0f + erff({x} * 0.70710678118654752f))", _gelu_erf),
        ScalarOp("gelu_tanh", 1,
                 lambda x: f"0.5f * {x} * (1.0f + tanhf(0.7978845608028654f * ({x} + 0.044715f * {x} * {x} * {x})))",
                 _gelu_tanh),
        ScalarOp("sigmoid", 1, lambda x: f"1.0f / (1.0f + expf(-{x}))", lambda x: 1.0 / (1.0 + np.exp(-x))),
        ScalarOp("tanh", 1, lambda x: f"tanhf({x})", np.tanh),
        ScalarOp("rsqrt", 1, lambda x: f"rsqrtf({x})", lambda x: 1.0 / np.sqrt(x)),
        # 1/x rounded once (IEEE): a row's reciprocal, so that its elements multiply instead of
        # divide (a division of 0 takes the slow path of CUDA's IEEE division routine)
        ScalarOp("rcp", 1, lambda x: f"__frcp_rn({x})", lambda x: 1.0 / x),
        # cvt: conversion between register dtypes; the printer spells it per dtype pair
        ScalarOp("cvt", 1, lambda x: x, lambda x: x),
    )
}


# --------------------------------------------------------------------------- epilogue / prologue ops

@attrs.frozen
class Extra:
    """An extra tensor an op reads: a vector along one axis of C, or a full matrix like C."""

    name: str
    kind: str        # "vector_m" | "vector_n" | "matrix" | "groups"
    group: int = 0   # "groups": rows of the operand (its k) per row of the tensor ((k // group, n))


class EpilogueOp:
    """Base of element-wise ops fused on C (epilogue) or on A/B (prologue)."""

    #: whether the op reads the element's coordinates (``CausalMask``), not only its value
    positional = False

    def extras(self) -> tuple[Extra, ...]:
        return ()

    def scalar(self) -> tuple[tuple[str, tuple], ...]:
        """(scalar op name, extra args) applied in order to the value; an extra arg that is an
        ``Extra`` reads that tensor at the element's coordinate."""
        raise NotImplementedError

    def reference(self, x: np.ndarray, extras: dict[str, np.ndarray]) -> np.ndarray:
        """numpy meaning on a full M x N tile (float64)."""
        for name, args in self.scalar():
            vals = [extras_at(a, extras, x.shape) for a in args]
            x = SCALAR_OPS[name].np(x, *vals)
        return x


def extras_at(a, extras: dict[str, np.ndarray], shape) -> np.ndarray | float:
    if not isinstance(a, Extra):
        return a
    v = np.asarray(extras[a.name], dtype=np.float64)
    if a.kind == "vector_n":
        return v.reshape(1, -1)
    if a.kind == "vector_m":
        return v.reshape(-1, 1)
    if a.kind == "groups":
        # one row of scales per group of ``group`` rows of the operand (a partial last group too)
        return np.repeat(v, a.group, axis=0)[:shape[0]]
    return v


@attrs.frozen(repr=False)
class Bias(EpilogueOp):
    """``x + bias[n]`` (axis="n") or ``x + bias[m]`` (axis="m"); bias has C's dtype."""

    name: str = "bias"
    axis: str = attrs.field(default="n", validator=attrs.validators.in_(("m", "n")))

    def extras(self):
        return (Extra(self.name, f"vector_{self.axis}"),)

    def scalar(self):
        return (("add", (self.extras()[0],)),)

    def __str__(self):
        return f"bias({self.name}[{self.axis}])"

    def __repr__(self):
        return f"ops.bias({self.name!r}, axis={self.axis!r})"


@attrs.frozen(repr=False)
class Residual(EpilogueOp):
    """``x + r[m, n]``: a residual tensor of C's shape and dtype."""

    name: str = "residual"

    def extras(self):
        return (Extra(self.name, "matrix"),)

    def scalar(self):
        return (("add", (self.extras()[0],)),)

    def __str__(self):
        return f"residual({self.name})"

    def __repr__(self):
        return f"ops.residual({self.name!r})"


@attrs.frozen(repr=False)
class GroupScale(EpilogueOp):
    """``(x - zero) * scale[k // group_size, n]``: int4 codes to weights, one scale per group of
    ``group_size`` rows of a column (``None``: the whole column).  A prologue op of an int4
    operand (``prologue("B", ops.group_scale("S", 128))``); the scales are an extra input of
    shape ``(ceil(K / group_size), N)`` in the dequantised type, and ``zero`` is the codes'
    zero point (0 for i4, 0 or 8 for u4: ``firesched.quant``).  With ``zeros`` (a name) the zero
    point is per group instead: a second extra input of the scales' shape holding each group's
    zero point as a number in the dequantised type (``quantize_int4(zero_point=True)``'s codes,
    converted), and ``zero`` is 0.

    ``partials=True`` (set by the ``scale_partials()`` strategy): the dequantising move leaves
    ``x - zero`` (exact: an integer of at most 15 in magnitude), and the scale multiplies each
    group's f32 partial product of the MatMul instead (``spec.ScaleAdd``)."""

    name: str = "scales"
    group_size: int | None = 128
    zero: int = 0
    zeros: str | None = None
    partials: bool = False

    def extras(self):
        g = self.group_size or 0
        return (Extra(self.name, "groups", g),) + ((Extra(self.zeros, "groups", g),) if self.zeros else ())

    def scalar(self):
        if self.zeros:
            sub = (("sub", (self.extras()[1],)),)
        else:
            sub = (("sub", (float(self.zero),)),) if self.zero else ()
        return sub + (() if self.partials else (("mul", (self.extras()[0],)),))

    def reference(self, x, extras):
        if not self.group_size:       # one group: every row of a column shares its scale
            e = Extra(self.name, "groups", x.shape[0])
            z = extras_at(Extra(self.zeros, "groups", x.shape[0]), extras, x.shape) if self.zeros else float(self.zero)
            return (x - z) if self.partials else (x - z) * extras_at(e, extras, x.shape)
        return super().reference(x, extras)

    def __str__(self):
        z = f", zero={self.zero}" if self.zero else ""
        z += f", zeros={self.zeros}" if self.zeros else ""
        on = " on partials" if self.partials else ""
        return f"group_scale({self.name}[k/{self.group_size or 'K'}, n]{z}){on}"

    def __repr__(self):
        z = f", zeros={self.zeros!r}" if self.zeros else ""
        z += ", partials=True" if self.partials else ""
        return f"ops.group_scale({self.name!r}, {self.group_size!r}, zero={self.zero!r}{z})"


@attrs.frozen(repr=False)
class Unary(EpilogueOp):
    """relu, gelu, gelu_tanh, sigmoid, tanh, exp, exp2 (2^x, one ex2.approx), rsqrt, rcp (1/x)."""

    op: str = attrs.field(validator=attrs.validators.in_(("relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "exp",
                                                          "exp2", "rsqrt", "rcp")))

    def scalar(self):
        return ((self.op, ()),)

    def __str__(self):
        return f"{self.op}()"

    def __repr__(self):
        if self.op.startswith("gelu"):
            return "ops.gelu()" if self.op == "gelu" else "ops.gelu(approximate='tanh')"
        if self.op == "rcp":
            return "ops.reciprocal()"
        return f"ops.{self.op}()"


@attrs.frozen(repr=False)
class Scale(EpilogueOp):
    """``alpha * x``."""

    alpha: float = 1.0

    def scalar(self):
        return (("mul", (float(self.alpha),)),)

    def __str__(self):
        return f"scale({self.alpha:g})"

    def __repr__(self):
        return f"ops.scale({self.alpha!r})"


@attrs.frozen(repr=False)
class Shift(EpilogueOp):
    """``x + beta`` (a norm's epsilon)."""

    beta: float = 0.0

    def scalar(self):
        return (("add", (float(self.beta),)),)

    def __str__(self):
        return f"shift({self.beta:g})"

    def __repr__(self):
        return f"ops.shift({self.beta!r})"


@attrs.frozen(repr=False)
class Cast(EpilogueOp):
    """Store C as ``dtype`` instead of the spec's C dtype."""

    dtype: DType = attrs.field(converter=dtype)

    def scalar(self):
        return ()

    def __str__(self):
        return f"cast({self.dtype})"

    def __repr__(self):
        return f"ops.cast({self.dtype.name!r})"


@attrs.frozen(repr=False)
class CausalMask(EpilogueOp):
    """``-inf`` where the element's ``col`` coordinate lies past its ``row`` coordinate plus
    ``diagonal``; the value elsewhere (what ``torch.tril(x, diagonal)`` keeps, the others
    masked).  A *positional* op: it reads the element's coordinates in the kernel's tensors, not
    its value alone, so only element-wise leaves (``done()`` of a thread's tile) apply it::

        col:   0    1    2    3
        row 0  x  -inf -inf -inf          diagonal = 0: attention's causal mask,
        row 1  x    x  -inf -inf          a query sees the keys up to its own position
        row 2  x    x    x  -inf
    """

    diagonal: int = 0
    row: str = "r"
    col: str = "c"

    positional = True

    def scalar(self):
        from .errors import ScheduleError

        raise ScheduleError(f"{self} is positional (it reads the element's row and column); only element-wise "
                            "leaves apply it", field="ops", value=str(self),
                            fix="apply it in a Move or Pointwise spec scheduled down to done() on threads")

    def reference(self, x, extras):
        """numpy meaning on a 2-D tile whose first axis is ``row`` and second ``col``."""
        x = np.asarray(x, dtype=np.float64)
        r, c = np.indices(x.shape[-2:])
        return np.where(c > r + self.diagonal, -np.inf, x)

    def __str__(self):
        return f"causal({self.row}, {self.col}{', diagonal=' + str(self.diagonal) if self.diagonal else ''})"

    def __repr__(self):
        return f"ops.causal({self.diagonal!r}, row={self.row!r}, col={self.col!r})"


@attrs.frozen(repr=False)
class EdgeMask(EpilogueOp):
    """``value`` where the element lies at or past the edge of the kernel's tensors along ``dim``
    (a key position past ``seq_kv`` in the last, partial key tile of attention); the value
    elsewhere.  Registers hold whole tiles, so what lies past the edge is what the producer left
    there (zeros from a zero-filling copy); the mask makes it the identity of what follows
    (``-inf`` before a max and an exp)::

        kv:   ... 998  999 | 1000 1001 ... 1023      seq_kv = 1000, tiles of 64
              ...  x    x  | -inf -inf ... -inf

    A *positional* op, like ``CausalMask``."""

    dim: str = "c"
    value: float = float("-inf")

    positional = True

    def scalar(self):
        from .errors import ScheduleError

        raise ScheduleError(f"{self} is positional (it reads the element's coordinate); only element-wise "
                            "leaves apply it", field="ops", value=str(self))

    def __str__(self):
        return f"edge({self.dim}, {self.value})"

    def __repr__(self):
        return f"ops.edge({self.dim!r}, {self.value!r})"


def edge(dim: str = "c", value: float = float("-inf")) -> EdgeMask:
    """``value`` past the tensors' edge along ``dim`` (see ``EdgeMask``)."""
    if not isinstance(dim, str) or not dim.isidentifier():
        raise ValueError(f"edge(dim={dim!r}): a dim name")
    return EdgeMask(dim, float(value))


def causal(diagonal: int = 0, *, row: str = "r", col: str = "c") -> CausalMask:
    """The causal mask: ``-inf`` where ``col > row + diagonal`` (see ``CausalMask``)."""
    if isinstance(diagonal, bool) or not isinstance(diagonal, int):
        raise ValueError(f"causal(diagonal={diagonal!r}): the diagonal is an int (0: the main diagonal)")
    if not (isinstance(row, str) and isinstance(col, str)) or row == col:
        raise ValueError(f"causal(row={row!r}, col={col!r}): two different dim names")
    return CausalMask(diagonal, row, col)


def bias(name: str = "bias", axis: str = "n") -> Bias:
    if axis not in ("m", "n"):
        raise ValueError(f"bias(axis={axis!r}): allowed axes are 'm' and 'n'")
    return Bias(name, axis)


def group_scale(name: str = "scales", group_size: int | None = 128, zero: int = 0,
                zeros: str | None = None, partials: bool = False) -> GroupScale:
    """Dequantise int4 codes with group scales: ``(code - zero) * name[k // group_size, n]``
    (``GroupScale``); ``group_size`` 32, 64, 128 or None (one group per column); ``zeros``
    names a tensor of per-group zero points instead of the one ``zero``.  ``partials`` is what
    the ``scale_partials()`` strategy sets (the scale moves onto each group's partial product);
    a prologue takes only ``partials=False``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"group_scale(name={name!r}): the scales' tensor name, an identifier")
    if group_size is not None and (isinstance(group_size, bool) or group_size not in (32, 64, 128)):
        raise ValueError(f"group_scale(group_size={group_size!r}): allowed 32, 64, 128 or None (whole columns)")
    if isinstance(zero, bool) or not isinstance(zero, int) or not 0 <= zero <= 15:
        raise ValueError(f"group_scale(zero={zero!r}): the codes' zero point, an int in 0..15 (8 for offset-binary "
                         f"uint4, 0 for int4)")
    if zeros is not None and (not isinstance(zeros, str) or not zeros.isidentifier() or zeros == name or zero):
        raise ValueError(f"group_scale(zeros={zeros!r}, zero={zero!r}): zeros names the per-group zero points' "
                         f"tensor (an identifier other than {name!r}), and then zero is 0")
    if not isinstance(partials, bool):
        raise ValueError(f"group_scale(partials={partials!r}): True or False")
    return GroupScale(name, group_size, zero, zeros, partials)


def residual(name: str = "residual") -> Residual:
    return Residual(name)


def relu() -> Unary:
    return Unary("relu")


def gelu(approximate: str = "none") -> Unary:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu(approximate={approximate!r}): allowed 'none' (erf) or 'tanh'")
    return Unary("gelu" if approximate == "none" else "gelu_tanh")


def sigmoid() -> Unary:
    return Unary("sigmoid")


def tanh() -> Unary:
    return Unary("tanh")


def scale(alpha: float) -> Scale:
    return Scale(float(alpha))


def exp() -> Unary:
    return Unary("exp")


def exp2() -> Unary:
    """``2^x`` in one ``ex2.approx.ftz`` (2 ulp; results below 2^-126 flush to 0): with the scale
    ``log2(e)`` folded into the op before it, an exponential without ``expf``'s range reduction."""
    return Unary("exp2")


def rsqrt() -> Unary:
    """``1 / sqrt(x)`` (``rsqrtf``: within 2 ulp, as torch's norms)."""
    return Unary("rsqrt")


def reciprocal() -> Unary:
    """``1 / x``, rounded once."""
    return Unary("rcp")


def shift(beta: float) -> Shift:
    return Shift(float(beta))


def cast(to) -> Cast:
    return Cast(dtype(to))
