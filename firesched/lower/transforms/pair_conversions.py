"""Two f32 values rounded into a 16-bit pair by one instruction.

Rules convert a result to its 16-bit output type one element at a time (``Pointwise("cvt")``: an
element-wise leaf's output, an accumulator's epilogue).  On the GPU each such conversion is one
``F2FP`` that fills half a register, and the two halves of a pair are then joined by a byte
permute: three instructions a pair.  ``cvt.rn.{f16x2,bf16x2}.f32`` rounds both at once into the
register the pair is stored from (``convert.cvt_f32x2_f16x2`` / ``cvt_f32x2_bf16x2``)::

    y[2k]   = cvt(w[j])          ->   y[2k .. 2k+1] = cvt_f32x2_bf16x2(w[j .. j+1])
    y[2k+1] = cvt(w[j + 1])           (one F2FP.PACK_AB instead of two and a PRMT)

The pass pairs two conversions that follow each other in a sequence (comments between allowed)
where the first writes element ``2k`` and the second ``2k + 1`` of one f16 / bf16 register
buffer, from consecutive registers ``j``, ``j + 1`` of one f32 buffer.  Both round to nearest even
either way, so the kernel computes the same bits; nothing else moves.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...hardware.atoms import convert as cv

_PAIR = {"f16": cv.cvt_f32x2_f16x2, "bf16": cv.cvt_f32x2_bf16x2}


def _conversion(s):
    """(dst, src) of a convert from an f32 register into an f16 / bf16 register, else None."""
    if not isinstance(s, ir.Pointwise) or s.op != "cvt" or len(s.srcs) != 1:
        return None
    dst, src = s.dst, s.srcs[0]
    if not (isinstance(dst, ir.RegRef) and isinstance(src, ir.RegRef)):
        return None
    if dst.buffer.dtype.name not in _PAIR or src.buffer.dtype.name != "f32":
        return None
    if not (isinstance(dst.offset, int) and isinstance(src.offset, int)):
        return None
    return dst, src


def _pair(a, b):
    """The one atom call for conversions ``a`` then ``b``, or None where they are no pair."""
    ca, cb = _conversion(a), _conversion(b)
    if ca is None or cb is None:
        return None
    (da, sa), (db, sb) = ca, cb
    if da.buffer != db.buffer or sa.buffer != sb.buffer or da.offset % 2 or db.offset != da.offset + 1 \
            or sb.offset != sa.offset + 1:
        return None
    return ir.AtomCall(_PAIR[da.buffer.dtype.name], (("d", da), ("src", sa)), origin=a.origin,
                       comment="two elements rounded into one register")


def _seq(stmts) -> list:
    out: list = []
    pending = None          # index in out of a conversion that may start a pair
    for s in stmts:
        s = _inner(s)
        if isinstance(s, ir.Comment):
            out.append(s)
            continue
        if pending is not None:
            both = _pair(out[pending], s)
            if both is not None:
                out[pending] = both
                pending = None
                continue
        out.append(s)
        pending = len(out) - 1 if _conversion(s) is not None else None
    return out


def _inner(s):
    if isinstance(s, ir.Seq):
        return ir.Seq(tuple(_seq(s.body)))
    if isinstance(s, ir.For):
        return attrs.evolve(s, body=_inner(s.body))
    if isinstance(s, ir.If):
        return attrs.evolve(s, then=_inner(s.then))
    if isinstance(s, ir.Roles):
        return attrs.evolve(s, roles=tuple(attrs.evolve(r, body=_inner(r.body)) for r in s.roles))
    return s


def paired_conversions(body: list, target) -> list:
    """``body`` (a kernel's statements) with each pair of conversions the module docstring
    describes made one ``cvt_f32x2_*`` atom call, where ``target`` has the instruction (sm_80 and
    later)."""
    if not target.supports(cv.cvt_f32x2_f16x2):
        return list(body)
    return _seq(body)


__all__ = ["paired_conversions"]
