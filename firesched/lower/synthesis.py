"""Layout synthesis for dequantising moves: the packing of an int4 operand, derived from atoms.

An int4 weight reaches an MMA through a register move that reads one 32-bit word of eight
codes and a ``convert`` atom that turns it into four f16x2 (bf16x2) registers.  For the word to
feed the MMA directly, its eight codes must be eight values of *one* lane's operand fragment,
in the order the convert atom leaves them.  Given the consumer's TV layout and the convert
atom's value order (``convert.source_index``), this module derives the storage order of the
operand (a ``Packing`` of its k dim) that makes it so — the user never writes it::

    consumer: mma.m16n8k16 B (k16 x n8), lane l holds column n = l // 4 and
              k = 2t, 2t+1, 2t+8, 2t+9 (t = l % 4), 4 values a k16 step
    word:     8 values = one lane's values over 2 k16 steps -> a block of 32 k per column
    lanes:    the 4 lanes of a column take words 0..3 of the block, in lane order
    order:    nibble p of word w holds the k of the lane's value v with source_index[v] = p

``packing_for(consumer, operand, convert)`` returns it; ``lower.rules.dequant`` reads words
through it and checks, lane by lane, that a tensor's packing delivers the consumer's values.
"""

from __future__ import annotations

import functools

from ..hardware.atoms.base import Atom
from ..hardware.atoms.convert import source_index
from ..packing import Packing
from .layouts import coords

#: which axis of the operand's TV tile is the reduction dim k
K_AXIS = {"a": 1, "b": 0}


def packing_for(consumer: Atom, operand: str, convert: Atom, words: int = 1) -> Packing:
    """The packing of the k dim of ``consumer``'s ``operand`` (``"a"`` or ``"b"``) under which
    each 32-bit word of codes is one lane's next ``convert``-many fragment values, in the order
    ``convert`` leaves them (see the module docstring), and each lane's ``words`` consecutive
    words (its values over ``words`` times as many k steps) are adjacent, so that one vector
    load (``words=4``: 16 bytes) reads them.  ``ValueError`` names what does not fit: a word
    that cannot hold whole runs of a lane's values, or lanes whose words do not tile a block.

    ``words=1``: blocks of 32 k (for ``mma.m16n8k16``), word ``w`` of a column's block is lane
    ``w``'s; ``words=4``: blocks of 128 k, words ``4w .. 4w+3`` are lane ``w``'s four k32 steps."""
    if operand not in K_AXIS:
        raise ValueError(f"packing_for: operand={operand!r}; allowed 'a', 'b' (the operand read from registers)")
    if words not in (1, 2, 4):
        raise ValueError(f"packing_for: words={words!r}; allowed 1, 2, 4 (a 4-, 8- or 16-byte load a lane)")
    tv = consumer.operand(operand).tv
    ka = K_AXIS[operand]
    tile_k = tv.tile[ka]
    cs = coords(tv)
    per_word = convert.operand("src").values
    # a lane's values on one line (one row of the operand's other dim), in value order
    runs: dict[tuple[int, int], list[int]] = {}
    for lane, vals in enumerate(cs):
        for v, c in enumerate(vals):
            runs.setdefault((c[1 - ka], lane), []).append(v)
    per_run = {len(r) for r in runs.values()}
    if len(per_run) != 1 or per_word % next(iter(per_run)):
        raise ValueError(f"packing_for: a word of {per_word} codes cannot hold whole runs of {consumer.name}'s "
                         f"{operand} (a lane holds {sorted(per_run)} values on a line)")
    per_line = per_run.pop()
    reps = per_word // per_line              # k steps of the atom one word covers
    step = reps * tile_k                     # k one word of every lane of a line covers
    block = words * step
    lines: dict[int, list[int]] = {}
    for line, lane in runs:
        lines.setdefault(line, []).append(lane)
    order = [-1] * block
    src_of = source_index(convert)
    for line, lanes in lines.items():
        if len(lanes) * per_word != step:
            raise ValueError(f"packing_for: {len(lanes)} lanes share a line of {consumer.name}'s {operand}; "
                             f"their words do not make a block of {step} k")
        for w, lane in enumerate(sorted(lanes)):
            for j in range(words):
                ks = [j * step + r * tile_k + cs[lane][v][ka] for r in range(reps) for v in runs[(line, lane)]]
                for v, k in enumerate(ks):
                    order[8 * (w * words + j) + int(src_of[v])] = k
    return Packing(block, tuple(order))


def lane_reads(consumer: Atom, operand: str, words: int) -> list[tuple[int, int]]:
    """``(row, storage k)`` of each lane's first word of a block under ``packing_for(consumer,
    operand, ..., words)``: the row is the lane's line of the operand's other dim, the k where its
    ``words`` words start (the lanes of a line take their words in lane order)."""
    tv = consumer.operand(operand).tv
    ka = K_AXIS[operand]
    cs = coords(tv)
    lines: dict[int, list[int]] = {}
    for lane, vals in enumerate(cs):
        lines.setdefault(vals[0][1 - ka], []).append(lane)
    out = [(0, 0)] * len(cs)
    for line, lanes in lines.items():
        for w, lane in enumerate(sorted(lanes)):
            out[lane] = (line, 8 * words * w)
    return out


def wavefronts(byte_addrs, width: int) -> int:
    """Shared-memory wavefronts a warp's ``width``-byte loads at ``byte_addrs`` take: per phase
    (the lanes whose loads fill 128 bytes), the most distinct 4-byte words one bank serves."""
    per = max(1, 128 // width)
    total = 0
    for p in range(0, len(byte_addrs), per):
        banks: dict[int, set] = {}
        for a in byte_addrs[p:p + per]:
            for word in range(a // 4, (a + width) // 4):
                banks.setdefault(word % 32, set()).add(word)
        total += max(len(v) for v in banks.values())
    return total


# a pure function of its (hashable) arguments that tries every swizzle, about 0.3 s a call; a
# recipe asks it again for each plan of the same tile
@functools.lru_cache(maxsize=256)
def swizzle_for_words(consumer: Atom, operand: str, words: int, rows: int, row_elems: int, elem_bits: int):
    """The swizzle of a ``rows`` x ``row_elems`` shared tile of ``elem_bits``-bit codes (K-major:
    a row per line of the operand) under which a warp's word loads of ``packing_for(..., words)``
    take the fewest wavefronts, found by trying every swizzle that keeps 16-byte chunks whole
    (fewest bits first); ``Swizzle(0, 0, 0)`` when none does better than none.  The loads are
    evaluated at every k block of a row and every group of lines a warp reads."""
    from ..layout import Swizzle

    reads = lane_reads(consumer, operand, words)
    width = 4 * words
    chunk = (16 * 8 // elem_bits).bit_length() - 1          # elements per 16 bytes, log2
    span = max(r for r, _ in reads) + 1

    def cost(sw: Swizzle) -> int:
        total = 0
        for r0 in range(0, rows - span + 1, span):
            for k0 in range(0, row_elems, 8 * words * 4):
                offs = [sw((r0 + r) * row_elems + k0 + k) for r, k in reads]
                total += wavefronts([o * elem_bits // 8 for o in offs], width)
        return total

    best = Swizzle(0, 0, 0)
    best_cost = cost(best)
    for bits in (1, 2, 3):
        for base in range(chunk, chunk + 3):
            for shift in range(bits, 6):
                if (1 << (base + shift + bits)) > rows * row_elems:
                    continue
                sw = Swizzle(bits, base, shift)
                c = cost(sw)
                if c < best_cost:
                    best, best_cost = sw, c
    return best


__all__ = ["packing_for", "K_AXIS", "lane_reads", "wavefronts", "swizzle_for_words"]
