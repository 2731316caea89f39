"""Register -> register conversions of one thread: int4 dequantisation, group scaling, a run
of 16-bit values that starts anywhere taken from the two aligned vectors holding it
(``shift_halves_b16x8``, below), and two f32 values rounded into one f16x2 / bf16x2 register
(``cvt_f32x2_f16x2``, ``cvt_f32x2_bf16x2``).

Family ``convert`` (``Atom.family``), the foundation of weight-only int4 GEMMs (W4A16): a 32-bit
register holding eight packed 4-bit weights becomes four registers of f16x2 (or bf16x2) without
one int -> float conversion per element, by magic numbers:

* ``dequant_u4_f16``, ``dequant_u4_bf16`` — unsigned nibbles ``u`` in 0..15 -> ``u``;
* ``dequant_u4z8_f16``, ``dequant_u4z8_bf16`` — unsigned nibbles with zero point 8 (offset
  binary) -> ``u - 8`` in -8..7;
* ``dequant_i4_f16``, ``dequant_i4_bf16`` — two's complement nibbles ``s`` in -8..7 -> ``s``;
* ``scale_f16x2``, ``scale_bf16x2`` — ``d = q * s`` on a pair of halves (the group scale);
* ``scale_add_f16x2``, ``scale_add_bf16x2`` — ``d = q * s + z``, rounded once (a scale and a
  pre-scaled zero point ``z = -zero * s``).

The trick.  ``lop3.b32`` computes any bitwise function of three words.  With ``mask`` selecting
one nibble in each 16-bit half and ``magic`` the bits of 1024.0 in f16 (``0x6400``: its ulp is 1,
so the ten mantissa bits count units), ``(q & mask) | magic`` is the f16 pair ``1024 + nibble``;
subtracting 1024 leaves the nibble, exactly.  A nibble in bits 4..7 of a half lands sixteen
times too high, ``1024 + 16 n``; ``fma`` with 1/16 and -64 brings it down, also exactly.  The
signed form first flips the nibble's top bit (``n ^ 8`` is ``s + 8``, offset binary), folded
into the same ``lop3`` as ``(q & mask) ^ (magic | 0x0008)``, and subtracts 1024 + 8.  bf16 has
seven mantissa bits, so its magic is 128.0 (``0x4300``) and a nibble must sit in bits 0..3 of
its half: the source is shifted by 4, 8 and 12 instead of the 1/16 ``fma``.  bf16x2 ``sub`` and
``mul`` need sm_90, so the bf16 atoms use ``fma.rn.bf16x2`` (sm_80) with 1.0 and -128, or with
-0.0 as the addend of a product (``a * b + -0`` is ``a * b`` for every input, signed zeros too).

Value order.  Value ``i`` of the source operand is nibble ``i`` (bits ``4i .. 4i+3``) of its
register.  Value ``v`` of the destination is the low (``v`` even) or high (``v`` odd) half of
register ``v // 2``.  One lop3 fills both halves of a register from the same nibble position of
the two 16-bit halves of the source, so register ``j`` holds nibbles ``j`` and ``j + 4``::

    source word   bits 31                                                0
                  +-------+-------+-------+-------+-------+-------+-------+-------+
                  |  n7   |  n6   |  n5   |  n4   |  n3   |  n2   |  n1   |  n0   |
                  +-------+-------+-------+-------+-------+-------+-------+-------+
                  '----------- high half --------''------------ low half ---------'

    destination   dst[0] = (lo: n0, hi: n4)        dst[2] = (lo: n2, hi: n6)
    (lo = bits    dst[1] = (lo: n1, hi: n5)        dst[3] = (lo: n3, hi: n7)
     0..15)

    destination value v:  0   1   2   3   4   5   6   7
    holds nibble:         0   4   1   5   2   6   3   7     (source_index(atom))

As data: both operands are TV layouts of one thread over a 1 x 8 tile of weights (tile column
``c`` is weight ``c``), the source the identity and the destination
``(1, (2, 4)):(0, (4, 1))`` (value ``v = h + 2 j`` at column ``4 h + j``), so the atom's meaning
is "every weight of the tile converted in place" and the register order is the layouts'.
``source_index(atom)`` reads the permutation off the layouts and ``arrange_for`` inverts it: the
nibbles to pack so that the destination registers hold given weights in value order.  The
scale atoms are element-wise on a 1 x 2 tile with identity layouts.

Semantics are bit-exact models of the instruction sequence on uint32 words (``Atom.semantics``
of this family takes one ``[..., regs]`` uint32 array per input register operand and returns the
output's words): ``lop3`` evaluates its truth table, shifts are integer shifts, and every f16 /
bf16 ``sub``, ``mul`` and ``fma`` is computed exactly and rounded once to nearest even, with
subnormals kept (no ``.ftz``), as the ISA specifies.  A NaN result is the canonical NaN
``0x7fff``.  ``to_words`` / ``from_words`` convert between values and register words.

Minimum target: sm_80 for all (``lop3``, ``f16x2`` arithmetic exist earlier, but firesched's
oldest compiled target is sm_80; ``fma.rn.bf16x2`` needs it).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ... import dtypes as dt
from ...layout import Layout, TVLayout
from .base import CONVERT, THREAD, Atom, Operand

CATALOG = "convert"

FAMILY = CONVERT

#: The truth-table operands of ``lop3.b32`` (PTX ISA): a function F of three words is the
#: immediate ``F(0xF0, 0xCC, 0xAA)``.
_TA, _TB, _TC = 0xF0, 0xCC, 0xAA
LUT_AND_OR = (_TA & _TB) | _TC     # (a & b) | c  = 0xEA
LUT_AND_XOR = (_TA & _TB) ^ _TC    # (a & b) ^ c  = 0x6A

# The 1 x 8 weight tile: source value i at column i; destination value h + 2j at column 4h + j.
TV_NIBBLES = TVLayout(Layout((1, 8), (0, 1)), (1, 8))
TV_PAIRS = TVLayout(Layout((1, (2, 4)), (0, (4, 1))), (1, 8))
TV_HALVES = TVLayout(Layout((1, 2), (0, 1)), (1, 2))

_CANONICAL_NAN = 0x7FFF
_F16_BITS = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


# --------------------------------------------------------------------------- words and values

def to_words(values, dtype: dt.DType | str) -> np.ndarray:
    """``[..., n]`` values of ``dtype`` packed into ``[..., n * bits / 32]`` uint32 register words,
    value 0 in the lowest bits (4-bit types: two's complement nibbles; 16-bit types: halves)."""
    d = dt.dtype(dtype)
    v = np.asarray(values)
    per = 32 // d.bits
    if d.bits not in (4, 16, 32) or v.shape[-1] % per:
        raise ValueError(f"to_words: {v.shape[-1]} values of {d} do not fill whole 32-bit registers "
                         f"(allowed: 4-, 16- and 32-bit types, a multiple of {per} values)")
    if d.bits == 4:
        # ml_dtypes' int4 / uint4 convert to the integer they hold; the low nibble is the bit pattern
        bits = (v.astype(d.np).astype(np.int64) & 0xF).astype(np.uint32)
    elif d.bits == 16:
        bits = np.ascontiguousarray(v.astype(d.np)).view(np.uint16).astype(np.uint32)
    else:
        return np.ascontiguousarray(v.astype(d.np)).view(np.uint32)
    bits = bits.reshape(*v.shape[:-1], v.shape[-1] // per, per)
    shifts = (np.arange(per, dtype=np.uint32) * d.bits)
    return np.bitwise_or.reduce(bits << shifts, axis=-1).astype(np.uint32)


def from_words(words, dtype: dt.DType | str) -> np.ndarray:
    """Inverse of ``to_words``: ``[..., r]`` uint32 words as ``[..., r * 32 / bits]`` values."""
    d = dt.dtype(dtype)
    w = np.asarray(words, dtype=np.uint32)
    if d.bits == 32:
        return np.ascontiguousarray(w).view(d.np)
    if d.bits not in (4, 16):
        raise ValueError(f"from_words: no register packing for {d}; allowed: 4-, 16- and 32-bit types")
    per = 32 // d.bits
    shifts = np.arange(per, dtype=np.uint32) * d.bits
    parts = (w[..., None] >> shifts) & ((1 << d.bits) - 1)
    parts = parts.reshape(*w.shape[:-1], w.shape[-1] * per)
    if d.bits == 16:
        return np.ascontiguousarray(parts.astype(np.uint16)).view(d.np)
    if d.kind == "int":
        return ((parts.astype(np.int64) ^ 8) - 8).astype(d.np)
    return parts.astype(d.np)


# --------------------------------------------------------------------------- instruction models

def lop3(a, b, c, lut: int) -> np.ndarray:
    """``lop3.b32 d, a, b, c, lut``: bit ``k`` of ``d`` is bit ``4a_k + 2b_k + c_k`` of ``lut``."""
    a, b, c = (np.asarray(x, dtype=np.uint32) for x in (a, b, c))
    out = np.zeros(np.broadcast(a, b, c).shape, dtype=np.uint32)
    full = np.uint32(0xFFFFFFFF)
    for i in range(8):
        if lut >> i & 1:
            out |= (a if i & 4 else a ^ full) & (b if i & 2 else b ^ full) & (c if i & 1 else c ^ full)
    return out


def _halves(words) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(words, dtype=np.uint32)
    return (w & 0xFFFF).astype(np.uint16), (w >> 16).astype(np.uint16)


def _join(lo, hi) -> np.ndarray:
    return np.asarray(lo, dtype=np.uint32) | (np.asarray(hi, dtype=np.uint32) << 16)


def _to_f64(bits, kind: str) -> np.ndarray:
    # np.array, not ascontiguousarray: that one makes a 0-d array 1-d
    with np.errstate(invalid="ignore"):     # NaN patterns convert to NaN, quietly
        return np.array(bits, dtype=np.uint16, order="C").view(_F16_BITS[kind]).astype(np.float64)


def fma16(a, b, c, kind: str) -> np.ndarray:
    """``fma.rn`` of one 16-bit float type (``kind`` ``"f16"`` or ``"bf16"``) on uint16 bit
    patterns: ``a * b + c`` exactly, rounded once to nearest even, subnormals kept; NaN results
    are ``0x7fff``.

    The product of two 16-bit floats is exact in float64; the sum is split into its float64
    rounding ``s`` and the exact error ``e`` (TwoSum), then rounded *to odd* at float32 precision
    (24 bits, at least two more than the target's) and from there to nearest even: a correct
    single rounding of the exact value, which rounding ``s`` twice would not always be."""
    fa, fb, fc = (_to_f64(x, kind) for x in (a, b, c))
    fa, fb, fc = np.broadcast_arrays(fa, fb, fc)
    with np.errstate(over="ignore", invalid="ignore"):
        p = fa * fb
        s = p + fc
        bb = s - p
        e = (p - (s - bb)) + (fc - bb)
        f = s.astype(np.float32)
        d = s - f.astype(np.float64)
        finite = np.isfinite(fa) & np.isfinite(fb) & np.isfinite(fc) & np.isfinite(f)
        inexact = finite & ((d != 0) | (e != 0))
        toward = np.where(d != 0, np.sign(d), np.sign(np.where(finite, e, 0.0)))
        even = (f.view(np.uint32) & 1) == 0
        fix = inexact & even
        if fix.any():
            f = f.copy()
            f[fix] = np.nextafter(f[fix], (toward[fix] * np.inf).astype(np.float32))
        # inputs that are infinite or NaN: IEEE arithmetic in float64 has the same outcome
        f = np.where(np.isfinite(fa) & np.isfinite(fb) & np.isfinite(fc), f, s.astype(np.float32))
        out = np.array(f.astype(_F16_BITS[kind]), order="C").view(np.uint16)
    out[np.isnan(f)] = _CANONICAL_NAN
    return out


def _fma16x2(a, b, c, kind: str) -> np.ndarray:
    # both halves in one call of fma16, which is element-wise: half its numpy calls, which on a
    # warp's few words cost more than the arithmetic
    a, b, c = np.broadcast_arrays(*(np.asarray(x, dtype=np.uint32) for x in (a, b, c)))
    (al, ah), (bl, bh), (cl, ch) = _halves(a), _halves(b), _halves(c)
    out = fma16(np.stack((al, ah)), np.stack((bl, bh)), np.stack((cl, ch)), kind)
    return _join(out[0], out[1])


def _neg16x2(x) -> np.ndarray:
    return np.asarray(x, dtype=np.uint32) ^ np.uint32(0x80008000)


_ONE = {"f16": 0x3C003C00, "bf16": 0x3F803F80}
_MINUS_ZERO = 0x80008000


def sub16x2(a, b, kind: str) -> np.ndarray:
    """``sub.rn.{f16x2,bf16x2}``: ``a - b`` per half, rounded once (``a * 1 + (-b)``)."""
    return _fma16x2(a, _ONE[kind], _neg16x2(b), kind)


def mul16x2(a, b, kind: str) -> np.ndarray:
    """``mul.rn.{f16x2,bf16x2}``: ``a * b`` per half, rounded once (``a * b + (-0)``)."""
    return _fma16x2(a, b, _MINUS_ZERO, kind)


def fma16x2(a, b, c, kind: str) -> np.ndarray:
    """``fma.rn.{f16x2,bf16x2}``: ``a * b + c`` per half, rounded once."""
    return _fma16x2(a, b, c, kind)


# --------------------------------------------------------------------------- dequantisation
#
# The constants, as 16-bit patterns repeated in both halves of a word:
#   f16:  0x6400 = 1024     0x6408 = 1032 = 1024 + 8     0x2C00 = 1/16
#         0xD400 = -64      0xD480 = -72 = -(64 + 8)
#   bf16: 0x4300 = 128      0x4308 = 136 = 128 + 8       0x3F80 = 1.0
#         0xC300 = -128     0xC308 = -136

def _rep(h: int) -> int:
    return h | (h << 16)


_F16_MAGIC, _F16_MAGIC8 = 0x6400, 0x6408
_BF16_MAGIC, _BF16_MAGIC8 = 0x4300, 0x4308
_MASK_LO, _MASK_HI = 0x000F000F, 0x00F000F0

# (form) -> (lop3 function, magic of the low-nibble form, magic of the bits-4..7 form,
#            f16 subtrahend, f16 fma addend, bf16 fma addend)
_FORMS = {
    "u4": (LUT_AND_OR, _F16_MAGIC, _F16_MAGIC, 0x6400, 0xD400, 0xC300),
    "u4z8": (LUT_AND_OR, _F16_MAGIC, _F16_MAGIC, 0x6408, 0xD480, 0xC308),
    # two's complement: the xor flips each nibble's sign bit (bit 3, or bit 7 for bits 4..7)
    "i4": (LUT_AND_XOR, _F16_MAGIC | 0x0008, _F16_MAGIC | 0x0080, 0x6408, 0xD480, 0xC308),
}


def _dequant_f16_semantics(form: str):
    lut, magic_lo, magic_hi, sub, add, _ = _FORMS[form]

    def semantics(src):
        q = np.asarray(src, dtype=np.uint32)[..., 0]
        t = q >> np.uint32(8)
        out = []
        for word in (q, t):       # nibbles 0,4 / 1,5 from q; 2,6 / 3,7 from q >> 8
            lo = lop3(word, _MASK_LO, _rep(magic_lo), lut)
            hi = lop3(word, _MASK_HI, _rep(magic_hi), lut)
            out.append(sub16x2(lo, _rep(sub), "f16"))
            out.append(fma16x2(hi, _rep(0x2C00), _rep(add), "f16"))
        return np.stack(out, axis=-1)

    semantics.__name__ = f"dequant_{form}_f16"
    return semantics


def _dequant_bf16_semantics(form: str):
    lut, _, _, _, _, add = _FORMS[form]
    magic = _BF16_MAGIC | (0x0008 if form == "i4" else 0)

    def semantics(src):
        q = np.asarray(src, dtype=np.uint32)[..., 0]
        out = []
        for j in range(4):        # register j from the nibbles at bits 4j (low) and 16 + 4j (high)
            r = lop3(q >> np.uint32(4 * j), _MASK_LO, _rep(magic), lut)
            out.append(fma16x2(r, _rep(0x3F80), _rep(add), "bf16"))
        return np.stack(out, axis=-1)

    semantics.__name__ = f"dequant_{form}_bf16"
    return semantics


def _f16_ptx(form: str) -> str:
    lut, magic_lo, magic_hi, sub, add, _ = _FORMS[form]
    # $src is copied first: the outputs may share a register with it (no early clobber)
    return (
        "{ .reg .b32 fs_q, fs_t, fs_sub, fs_mul, fs_add; "
        "mov.b32 fs_q, $src; shr.u32 fs_t, $src, 8; "
        f"mov.b32 fs_sub, {_rep(sub):#010x}; mov.b32 fs_mul, {_rep(0x2C00):#010x}; "
        f"mov.b32 fs_add, {_rep(add):#010x}; "
        f"lop3.b32 $dst[0], fs_q, {_MASK_LO:#010x}, {_rep(magic_lo):#010x}, {lut:#04x}; "
        f"lop3.b32 $dst[1], fs_q, {_MASK_HI:#010x}, {_rep(magic_hi):#010x}, {lut:#04x}; "
        f"lop3.b32 $dst[2], fs_t, {_MASK_LO:#010x}, {_rep(magic_lo):#010x}, {lut:#04x}; "
        f"lop3.b32 $dst[3], fs_t, {_MASK_HI:#010x}, {_rep(magic_hi):#010x}, {lut:#04x}; "
        "sub.rn.f16x2 $dst[0], $dst[0], fs_sub; fma.rn.f16x2 $dst[1], $dst[1], fs_mul, fs_add; "
        "sub.rn.f16x2 $dst[2], $dst[2], fs_sub; fma.rn.f16x2 $dst[3], $dst[3], fs_mul, fs_add; }"
    )


def _bf16_ptx(form: str) -> str:
    lut, _, _, _, _, add = _FORMS[form]
    magic = _BF16_MAGIC | (0x0008 if form == "i4" else 0)
    lops = " ".join(f"lop3.b32 $dst[{j}], fs_q{j}, {_MASK_LO:#010x}, {_rep(magic):#010x}, {lut:#04x};"
                    for j in range(4))
    fmas = " ".join(f"fma.rn.bf16x2 $dst[{j}], $dst[{j}], fs_one, fs_add;" for j in range(4))
    return (
        "{ .reg .b32 fs_q0, fs_q1, fs_q2, fs_q3, fs_one, fs_add; "
        "mov.b32 fs_q0, $src; shr.u32 fs_q1, $src, 4; shr.u32 fs_q2, $src, 8; shr.u32 fs_q3, $src, 12; "
        f"mov.b32 fs_one, {_rep(0x3F80):#010x}; mov.b32 fs_add, {_rep(add):#010x}; "
        f"{lops} {fmas} }}"
    )


_FORM_DOC = {
    "u4": "unsigned nibbles u (0..15) -> u",
    "u4z8": "unsigned nibbles u with zero point 8 (offset binary) -> u - 8",
    "i4": "two's complement nibbles s (-8..7) -> s",
}


def _dequant(form: str, out: dt.DType) -> Atom:
    src_dtype = dt.i4 if form == "i4" else dt.u4
    f16 = out == dt.f16
    how = ("lop3 into 1024 + n, then sub.f16x2 / fma.rn.f16x2 by 1/16" if f16
           else "shifts and lop3 into 128 + n, then fma.rn.bf16x2")
    return Atom(
        name=f"dequant_{form}_{out}", family=CONVERT, group=THREAD, kind="Move", shape=(1, 8),
        dtypes=(("dst", out), ("src", src_dtype)),
        operands=(
            Operand("dst", "out", "RF", regs=4, values=8, tv=TV_PAIRS),
            Operand("src", "in", "RF", regs=1, values=8, tv=TV_NIBBLES),
        ),
        ptx=_f16_ptx(form) if f16 else _bf16_ptx(form),
        min_target="sm_80", src_memory="RF", dst_memory="RF",
        semantics=_dequant_f16_semantics(form) if f16 else _dequant_bf16_semantics(form),
        catalog=CATALOG,
        doc=f"Thread dequantisation of one register of 8 packed 4-bit weights into 4 {out}x2 "
            f"registers, {_FORM_DOC[form]} ({how}); register j holds nibbles j and j + 4.",
    )


dequant_u4_f16 = _dequant("u4", dt.f16)
dequant_u4z8_f16 = _dequant("u4z8", dt.f16)
dequant_i4_f16 = _dequant("i4", dt.f16)
dequant_u4_bf16 = _dequant("u4", dt.bf16)
dequant_u4z8_bf16 = _dequant("u4z8", dt.bf16)
dequant_i4_bf16 = _dequant("i4", dt.bf16)


# --------------------------------------------------------------------------- group scales

def _scale_semantics(kind: str, add: bool):
    if add:
        def semantics(q, s, z):
            return fma16x2(np.asarray(q, np.uint32), np.asarray(s, np.uint32), np.asarray(z, np.uint32), kind)
    else:
        def semantics(q, s):
            return mul16x2(np.asarray(q, np.uint32), np.asarray(s, np.uint32), kind)
    semantics.__name__ = f"scale{'_add' if add else ''}_{kind}x2"
    return semantics


def _scale_ptx(kind: str, add: bool) -> str:
    if add:
        return f"fma.rn.{kind}x2 $d, $q, $s, $z;"
    if kind == "f16":
        return "mul.rn.f16x2 $d, $q, $s;"
    # mul.bf16x2 needs sm_90: a product plus -0 is the product, rounded once, on sm_80
    return f"{{ .reg .b32 fs_z; mov.b32 fs_z, {_MINUS_ZERO:#010x}; fma.rn.bf16x2 $d, $q, $s, fs_z; }}"


def _scale(kind: dt.DType, add: bool) -> Atom:
    operands = [Operand("d", "out", "RF", values=2, tv=TV_HALVES),
                Operand("q", "in", "RF", values=2, tv=TV_HALVES),
                Operand("s", "in", "RF", values=2, tv=TV_HALVES)]
    if add:
        operands.append(Operand("z", "in", "RF", values=2, tv=TV_HALVES))
    what = "d = q * s + z (rounded once)" if add else "d = q * s"
    return Atom(
        name=f"scale{'_add' if add else ''}_{kind}x2", family=CONVERT, group=THREAD, kind="Pointwise",
        shape=(1, 2), dtypes=tuple((o.name, kind) for o in operands), operands=tuple(operands),
        ptx=_scale_ptx(str(kind), add), min_target="sm_80",
        semantics=_scale_semantics(str(kind), add), catalog=CATALOG,
        doc=f"Thread {kind}x2 group scaling, {what}, on both halves of a register (round to nearest "
            f"even, subnormals kept).",
    )


scale_f16x2 = _scale(dt.f16, False)
scale_bf16x2 = _scale(dt.bf16, False)
scale_add_f16x2 = _scale(dt.f16, True)
scale_add_bf16x2 = _scale(dt.bf16, True)


# --------------------------------------------------------------------------- shifted halves

# 8 consecutive 16-bit values, value i at column i (the identity: register j holds values 2j, 2j + 1)
TV_EIGHT = TVLayout(Layout((1, 8), (0, 1)), (1, 8))


def _shift_halves_semantics(lo, hi, q):
    """``d`` = halves ``q .. q + 7`` (``q`` mod 8) of the 16 halves of ``lo`` then ``hi``."""
    lo, hi = np.asarray(lo, np.uint32), np.asarray(hi, np.uint32)
    words = np.concatenate([lo, hi], axis=-1)
    halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(*words.shape[:-1], 16)
    start = (np.asarray(q, np.int64)[..., 0] & 7)[..., None]
    picked = np.take_along_axis(halves, start + np.arange(8), axis=-1)
    return (picked[..., 0::2] | (picked[..., 1::2] << 16)).astype(np.uint32)


def _shift_halves_ptx() -> str:
    # a barrel shifter over the 8 words of (lo, hi): by 2 words where q & 4, by 1 where q & 2
    # (selp), then each output word one prmt of two neighbours — bytes 0-3 (q even) or 2-5 (q odd)
    words = [f"$lo[{i}]" for i in range(4)] + [f"$hi[{i}]" for i in range(4)]
    by2 = " ".join(f"selp.b32 fs_e{i}, {words[i + 2]}, {words[i]}, fs_p2;" for i in range(6))
    by1 = " ".join(f"selp.b32 fs_f{i}, fs_e{i + 1}, fs_e{i}, fs_p1;" for i in range(5))
    perm = " ".join(f"prmt.b32 $d[{i}], fs_f{i}, fs_f{i + 1}, fs_s;" for i in range(4))
    regs = ", ".join([f"fs_e{i}" for i in range(6)] + [f"fs_f{i}" for i in range(5)] + ["fs_s", "fs_t"])
    return (f"{{ .reg .pred fs_p1, fs_p2; .reg .b32 {regs}; "
            "and.b32 fs_t, $q, 4; setp.ne.b32 fs_p2, fs_t, 0; and.b32 fs_t, $q, 2; setp.ne.b32 fs_p1, fs_t, 0; "
            "and.b32 fs_t, $q, 1; mul.lo.u32 fs_t, fs_t, 0x2222; add.u32 fs_s, fs_t, 0x3210; "
            f"{by2} {by1} {perm} }}")


#: d = values q .. q + 7 of the 16 values of lo then hi (16-bit values, q a run-time 0 .. 7): a
#: run of eight elements that starts anywhere, from the two aligned 16-byte vectors holding it
#: (an operand along the row of an aligned window, threads.shifted_run)::
#:
#:     lo = | v0 v1 v2 v3 v4 v5 v6 v7 |  hi = | v8 .. v15 |       q = 3:  d = | v3 .. v10 |
shift_halves_b16x8 = Atom(
    name="shift_halves_b16x8", family=CONVERT, group=THREAD, kind="Move", shape=(1, 8),
    dtypes=(("d", dt.f16), ("lo", dt.f16), ("hi", dt.f16), ("q", dt.i32)),
    operands=(
        Operand("d", "out", "RF", regs=4, values=8, tv=TV_EIGHT),
        Operand("lo", "in", "RF", regs=4, values=8, tv=TV_EIGHT),
        Operand("hi", "in", "RF", regs=4, values=8, tv=TV_EIGHT),
        Operand("q", "in", "RF", regs=1, values=1),
    ),
    ptx=_shift_halves_ptx(), min_target="sm_80", src_memory="RF", dst_memory="RF",
    semantics=_shift_halves_semantics, catalog=CATALOG,
    doc="Thread funnel shift of 16-bit values: d = values q .. q + 7 (q mod 8, a 32-bit scalar) of lo then hi, "
        "by selp and prmt (any 16-bit type: the bits move unchanged).",
)


# --------------------------------------------------------------------------- rounding pairs

def _round_f32_to_16(words, kind: str) -> np.ndarray:
    """f32 bit patterns rounded to one 16-bit float type (``cvt.rn``: nearest even, subnormals
    kept, overflow to infinity), NaN as the canonical ``0x7fff``."""
    f = np.array(words, dtype=np.uint32, order="C").view(np.float32)     # (a 0-d array stays 0-d)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.array(f.astype(_F16_BITS[kind]), order="C").view(np.uint16).astype(np.uint32)
    out[np.isnan(f)] = _CANONICAL_NAN
    return out


def _pair_semantics(kind: str):
    def semantics(src):
        w = np.asarray(src, dtype=np.uint32)
        return (_round_f32_to_16(w[..., 0], kind) | (_round_f32_to_16(w[..., 1], kind) << np.uint32(16)))[..., None]

    semantics.__name__ = f"cvt_f32x2_{kind}x2"
    return semantics


def _pair(kind: dt.DType) -> Atom:
    return Atom(
        name=f"cvt_f32x2_{kind}x2", family=CONVERT, group=THREAD, kind="Move", shape=(1, 2),
        dtypes=(("d", kind), ("src", dt.f32)),
        operands=(
            Operand("d", "out", "RF", regs=1, values=2, tv=TV_HALVES),
            Operand("src", "in", "RF", regs=2, values=2, float_regs=True, tv=TV_HALVES),
        ),
        # cvt's first source goes to the upper half
        ptx=f"cvt.rn.{kind}x2.f32 $d, $src[1], $src[0];", min_target="sm_80", src_memory="RF",
        dst_memory="RF", semantics=_pair_semantics(str(kind)), catalog=CATALOG,
        doc=f"Thread conversion of two f32 registers into one {kind}x2 register (round to nearest even, "
            f"subnormals kept, NaN canonical): value 0 in the low half.",
    )


#: d = (round(src[0]) in the low half, round(src[1]) in the high half): two elements of a 16-bit
#: output rounded by one instruction, where one conversion each and a byte permute to pack them
#: took three (``transforms.pair_conversions`` puts it where a kernel converts element pairs)::
#:
#:     src[0] = 1.0f  src[1] = -2.5f   ->   d = | hi: -2.5 | lo: 1.0 |   (bits 31..16 | 15..0)
cvt_f32x2_f16x2 = _pair(dt.f16)
cvt_f32x2_bf16x2 = _pair(dt.bf16)


DEQUANT_ATOMS: tuple[Atom, ...] = (
    dequant_u4_f16, dequant_u4z8_f16, dequant_i4_f16, dequant_u4_bf16, dequant_u4z8_bf16, dequant_i4_bf16,
)
SCALE_ATOMS: tuple[Atom, ...] = (scale_f16x2, scale_bf16x2, scale_add_f16x2, scale_add_bf16x2)
SHIFT_ATOMS: tuple[Atom, ...] = (shift_halves_b16x8,)
PAIR_ATOMS: tuple[Atom, ...] = (cvt_f32x2_f16x2, cvt_f32x2_bf16x2)
ATOMS: tuple[Atom, ...] = DEQUANT_ATOMS + SCALE_ATOMS + SHIFT_ATOMS + PAIR_ATOMS


# --------------------------------------------------------------------------- value order

def source_index(atom: Atom) -> np.ndarray:
    """``[values]``: the source value (nibble) that destination value ``v`` of ``atom`` holds, read
    off the two operands' TV layouts (``[0, 4, 1, 5, 2, 6, 3, 7]`` for every dequant atom)."""
    if atom.family != CONVERT or atom.kind != "Move":
        raise ValueError(f"source_index: {atom!r} is no dequantisation atom; allowed: "
                         f"{', '.join(a.name for a in DEQUANT_ATOMS)}")
    src, dst = atom.operand("src").tv, atom.operand("dst").tv
    where = {int(src.index(0, i)): i for i in range(src.num_values)}
    return np.array([where[int(dst.index(0, v))] for v in range(dst.num_values)], dtype=np.int64)


def arrange_for(atom: Atom, values) -> np.ndarray:
    """The source values (nibble order, ``[..., 8]``) for which ``atom``'s destination holds
    ``values`` (``[..., 8]``) in value order: the inverse of ``source_index``, what a packing step
    applies to the weights before writing them to memory."""
    v = np.asarray(values)
    idx = source_index(atom)
    if v.shape[-1] != idx.size:
        raise ValueError(f"arrange_for: the last axis has {v.shape[-1]} values; {atom.name} converts "
                         f"{idx.size} at a time")
    out = np.empty_like(v)
    out[..., idx] = v
    return out
