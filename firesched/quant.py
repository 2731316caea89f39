"""Host-side int4 weight quantisation with group scales, for weight-only GEMMs (W4A16).

The weight is the B operand of a ``MatMul``: ``w`` is ``(K, N)`` (``C (M, N) = A (M, K) @ B``,
the convention of ``MatMul.kernel``), and groups run along K: rows ``g * group_size ..
(g + 1) * group_size - 1`` of column ``n`` share ``scales[g, n]`` (and ``zeros[g, n]``).
``group_size=None`` makes each whole column one group.  When ``group_size`` does not divide K the
last group is partial: it holds the last ``K % group_size`` rows and its scale is computed from
them alone, so row ``k`` always belongs to group ``k // group_size`` and there are
``ceil(K / group_size)`` groups.

``quantize_int4(w, group_size, signed, zero_point)`` returns ``(q, scales, zeros)``:

* ``q`` ``(K, N)``: the 4-bit codes, one per element (``dtypes.i4.np`` / ``dtypes.u4.np``,
  ml_dtypes int4 / uint4; ``dtypes.pack`` makes the two-per-byte device form);
* ``scales`` ``(G, N)`` in ``scale_dtype`` (f32 by default; f16 / bf16 for a kernel that reads
  them as such: the codes are chosen for the rounded scales);
* ``zeros`` ``(G, N)`` codes of the same 4-bit type as ``q``, or ``None`` without a zero point.

Meaning: ``w[k, n] ~ (q[k, n] - zero) * scales[k // group_size, n]`` where ``zero`` is
``zeros[g, n]`` with ``zero_point=True``, else the type's default zero point: 0 for signed codes
(symmetric, -8..7) and 8 for unsigned ones (offset binary, 0..15: the ``dequant_u4z8`` atoms
subtract it for free).  Symmetric scales are ``max |w| / 7`` over the group, asymmetric ones
``(max - min) / 15`` with ``zero = round(qmin - min / scale)``; codes round half to even and
saturate.  A group of zeros gets scale 0 and the zero-point code, and dequantises to zeros.

``dequantize_int4(q, scales, zeros, group_size)`` is the reference inverse, in float32.  torch
tensors are accepted anywhere an array is (they are copied to host numpy arrays first).

``pack_int4(q, packing)`` is the device form a kernel reads: ``(N, K / 2)`` bytes, each column's
codes in the ``Packing``'s order along K (the order a schedule's register fragments want them,
``lower.synthesis.packing_for``), two a byte, low nibble first; ``unpack_int4`` inverts it.
"""

from __future__ import annotations

import numpy as np

from . import dtypes as dt
from .packing import Packing

__all__ = ["GROUP_SIZES", "SCALE_DTYPES", "quantize_int4", "dequantize_int4", "num_groups", "pack_int4",
           "unpack_int4"]

#: The group sizes along K that quantisation offers (``None``: one group per column).
GROUP_SIZES = (32, 64, 128, None)

#: The element types scales can be returned in.
SCALE_DTYPES = ("f32", "f16", "bf16")


def _host(x, name: str) -> np.ndarray:
    """``x`` as a host numpy array (torch tensors are detached and copied to the CPU)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":
            x = x.float()       # numpy has no bfloat16 of torch's; f32 holds every bf16 exactly
        x = x.numpy()
    try:
        return np.asarray(x)
    except Exception as e:  # pragma: no cover - depends on what the caller passes
        raise ValueError(f"{name}: cannot read {type(x).__name__} as an array ({e}); pass a numpy "
                         f"array or a torch tensor") from None


def _check_group_size(group_size) -> None:
    if group_size is not None and (isinstance(group_size, bool) or group_size not in GROUP_SIZES):
        raise ValueError(f"group_size={group_size!r} is not supported; allowed: 32, 64, 128 or None "
                         f"(one group per column of K rows)")


def num_groups(k: int, group_size: int | None) -> int:
    """How many groups K rows make: ``ceil(k / group_size)`` (the last one may be partial), 1 for
    ``group_size=None``."""
    _check_group_size(group_size)
    return 1 if group_size is None else -(-int(k) // group_size)


def _check_weight(w: np.ndarray, what: str) -> None:
    if w.ndim != 2:
        raise ValueError(f"{what}: w has shape {w.shape}; it must be 2-D (K, N), the B operand of "
                         f"C = A @ B (transpose an (N, K) weight with w.T)")
    if w.shape[0] == 0 or w.shape[1] == 0:
        raise ValueError(f"{what}: w has shape {w.shape}; K and N must be at least 1")


def quantize_int4(w, group_size: int | None = 128, signed: bool = True, zero_point: bool = False,
                  scale_dtype: str = "f32") -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Quantise the ``(K, N)`` weight ``w`` to 4-bit codes with one scale (and zero point) per
    group of ``group_size`` rows of a column; returns ``(q, scales, zeros)``, see the module
    docstring.  ``signed`` picks int4 codes (-8..7) or uint4 codes (0..15); ``zero_point`` adds a
    per-group zero point (asymmetric quantisation) instead of the type's default (0 / 8)."""
    what = "quantize_int4"
    _check_group_size(group_size)
    if not isinstance(signed, (bool, np.bool_)):
        raise ValueError(f"{what}: signed={signed!r}; allowed: True (int4 codes -8..7) or False (uint4 "
                         f"codes 0..15)")
    if not isinstance(zero_point, (bool, np.bool_)):
        raise ValueError(f"{what}: zero_point={zero_point!r}; allowed: True (a zero point per group) or "
                         f"False (symmetric)")
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"{what}: scale_dtype={scale_dtype!r}; allowed: {', '.join(SCALE_DTYPES)}")
    w = _host(w, "w")
    _check_weight(w, what)
    if w.dtype.kind not in "fiub" and w.dtype != dt.bf16.np:
        raise ValueError(f"{what}: w has dtype {w.dtype}; pass real numbers (a float or integer array)")
    x = w.astype(np.float64)
    if not np.isfinite(x).all():
        raise ValueError(f"{what}: w holds {int((~np.isfinite(x)).sum())} infinite or NaN values; "
                         f"quantise finite weights")
    K, N = x.shape
    gs = K if group_size is None else group_size
    G = num_groups(K, group_size)
    code = dt.i4 if signed else dt.u4
    qmin, qmax = (-8, 7) if signed else (0, 15)
    sd = dt.dtype(scale_dtype)

    # a partial last group is padded with copies of its first row: they change no max or min
    pad = G * gs - K
    xp = np.concatenate([x, np.repeat(x[(G - 1) * gs:][:1], pad, axis=0)], axis=0) if pad else x
    groups = xp.reshape(G, gs, N)
    if zero_point:
        lo = np.minimum(groups.min(axis=1), 0.0)     # the range always holds 0: zeros stay exact
        hi = np.maximum(groups.max(axis=1), 0.0)
        scale = (hi - lo) / (qmax - qmin)
    else:
        scale = np.abs(groups).max(axis=1) / 7.0
    with np.errstate(over="ignore"):
        scale = scale.astype(sd.np)
    if not np.isfinite(scale.astype(np.float64)).all():
        raise ValueError(f"{what}: a scale overflows {sd} (|w| up to {np.abs(x).max():g}); pass "
                         f"scale_dtype='f32'")
    s = scale.astype(np.float64)
    safe = np.where(s == 0, 1.0, s)
    if zero_point:
        zero = np.clip(np.rint(qmin - lo / safe), qmin, qmax)
    else:
        zero = np.full((G, N), 0.0 if signed else 8.0)
    q = np.clip(np.rint(groups / safe[:, None, :]) + zero[:, None, :], qmin, qmax)
    q = np.where(s[:, None, :] == 0, zero[:, None, :], q)
    q = q.reshape(G * gs, N)[:K].astype(np.int64).astype(code.np)
    zeros = zero.astype(np.int64).astype(code.np) if zero_point else None
    return q, scale, zeros


def dequantize_int4(q, scales, zeros=None, group_size: int | None = 128) -> np.ndarray:
    """``(K, N)`` float32 weights ``(q - zero) * scale`` of the codes ``q`` (``(K, N)``), the
    ``(G, N)`` ``scales`` and ``zeros`` (``None``: 0 for int4 codes, 8 for uint4 ones, which is
    why ``q`` must then be an int4 / uint4 array as ``quantize_int4`` returns it).  ``q - zero``
    is exact; the product is rounded once to float32."""
    what = "dequantize_int4"
    _check_group_size(group_size)
    q, s = _host(q, "q"), _host(scales, "scales")
    _check_weight(q, what)
    K, N = q.shape
    G = num_groups(K, group_size)
    if s.shape != (G, N):
        raise ValueError(f"{what}: scales has shape {s.shape}; {K} rows in groups of {group_size} and "
                         f"{N} columns need ({G}, {N})")
    if zeros is None:
        if q.dtype == dt.i4.np:
            z = np.zeros((G, N))
        elif q.dtype == dt.u4.np:
            z = np.full((G, N), 8.0)
        else:
            raise ValueError(f"{what}: zeros=None takes the zero point from q's type (0 for int4, 8 for "
                             f"uint4), but q has dtype {q.dtype}; pass q as returned by quantize_int4 or "
                             f"pass zeros= explicitly")
    else:
        z = _host(zeros, "zeros").astype(np.float64)
        if z.shape != (G, N):
            raise ValueError(f"{what}: zeros has shape {z.shape}; it must match scales, ({G}, {N})")
    rows = np.arange(K) // (K if group_size is None else group_size)
    codes = q.astype(np.int64).astype(np.float64)
    return ((codes - z[rows]).astype(np.float32) * s.astype(np.float32)[rows]).astype(np.float32)


def pack_int4(q, packing: Packing) -> np.ndarray:
    """The ``(K, N)`` int4 / uint4 codes ``q`` as a kernel reads them: ``(N, K / 2)`` uint8, row
    ``n`` holding column ``n``'s codes in ``packing``'s order along K, two a byte, low nibble
    first (``dtypes.pack``).  K must be a multiple of ``packing.block``."""
    q = _host(q, "q")
    _check_weight(q, "pack_int4")
    if q.dtype not in (dt.i4.np, dt.u4.np):
        raise ValueError(f"pack_int4: q has dtype {q.dtype}; pass int4 / uint4 codes as quantize_int4 returns them")
    if not isinstance(packing, Packing):
        raise ValueError(f"pack_int4: packing={packing!r}; pass a Packing (a W4A16 schedule's B packing)")
    if q.shape[0] % packing.block:
        raise ValueError(f"pack_int4: K={q.shape[0]} is not a multiple of the packing's block ({packing.block}); "
                         f"pad the weight with zero-point codes (and the activations with zeros)")
    code = dt.i4 if q.dtype == dt.i4.np else dt.u4
    return dt.pack(code, packing.pack(np.ascontiguousarray(q.T), axis=-1))


def unpack_int4(raw, packing: Packing, signed: bool) -> np.ndarray:
    """The inverse of ``pack_int4``: ``(K, N)`` int4 (``signed``) or uint4 codes."""
    raw = _host(raw, "raw")
    if raw.ndim != 2 or raw.dtype != np.uint8:
        raise ValueError(f"unpack_int4: raw has shape {raw.shape} and dtype {raw.dtype}; pass the (N, K / 2) uint8 "
                         f"array pack_int4 returns")
    codes = dt.unpack(dt.i4 if signed else dt.u4, raw)
    return np.ascontiguousarray(packing.unpack(codes, axis=-1).T)
