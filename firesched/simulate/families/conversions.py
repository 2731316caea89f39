"""Register -> register conversions of one thread: the ``convert`` family (int4 dequantisation,
f16x2 / bf16x2 group scaling).

Each enabled thread runs the atom on its own registers.  A register buffer holds one element per
entry in its dtype (a u4 buffer one nibble, an f16 buffer one half), so an operand of ``regs``
32-bit registers is ``values`` consecutive elements from the ``RegRef``'s offset, in value order.
The executor packs each input operand's elements into the words the hardware registers would
hold (``convert.to_words``: element 0 in the lowest bits), runs the atom's bit-exact semantics on
the words of every thread at once, and unpacks the result into the destination's elements.  The
buffers' dtypes only need the atom's widths: bits are reinterpreted (an i4 atom reads a u4 buffer
as its nibbles), never converted.  A disabled thread (``pred``, ``If``) leaves its destination
untouched, as a predicated-off instruction does.
"""

from __future__ import annotations

import numpy as np

from ... import ir
from ...errors import InternalError
from ...hardware.atoms import convert as cv
from ..messages import describe


def convert(k, s):
    """CONVERT: ``dst = semantics(src...)`` on the registers of each enabled thread."""
    ctx, regs = k.ctx, k.regs
    atom = s.atom
    on, _ = ctx.enabled(s)
    if on.size == 0:
        return
    words = []
    out = None
    for o in atom.operands:
        ref = s.arg(o.name)
        if isinstance(ref, ir.Scalar) and o.tv is None and o.role == "in":
            # a run-time scalar (shift_halves' q): its value for each thread, one word
            words.append(ctx.per_thread(ref.value)[on][:, None])
            continue
        if o.memory != "RF" or o.tv is None:
            raise InternalError(f"{describe(s)}: atom {atom.name} operand {o.name} is no register fragment")
        want = atom.dtype_of(o.name)
        have = ref.buffer.dtype
        if have.bits != want.bits:
            raise InternalError(f"{describe(s)}: operand {o.name} of {atom.name} wants {want} registers; "
                                f"{ref.buffer.name!r} holds {have}")
        if o.role == "out":
            out = (o, ref)
            continue
        R, idx = regs.index(ref, o.values, on)
        words.append(cv.to_words(R[idx], have))
    if out is None:
        raise InternalError(f"atom {atom.name} has no output register operand")
    o, ref = out
    result = np.asarray(atom.semantics(*words), dtype=np.uint32)
    if result.shape != (on.size, o.regs):
        raise InternalError(f"{atom.name}: semantics returned words of shape {result.shape}; the "
                            f"destination wants {(on.size, o.regs)}")
    R, idx = regs.index(ref, o.values, on)
    R[idx] = cv.from_words(result, ref.buffer.dtype)
