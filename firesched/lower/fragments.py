"""Register fragments as tables: which element of a register tensor each lane holds in each of
its registers, for the element-wise work and reductions done on fragments (``on_fragments()``).

A tensor an MMA reads or writes has an ``RFLayout`` (``layouts.py``).  Its table lists, for every
register, the element's coordinate relative to the unit's part, as a function of the lane.  A
tensor over fewer dims that is combined with it — the row max of attention's scores — is its
*projection*: one register per distinct row a lane holds, and the lanes that hold the same rows
are its replicas (a butterfly over their lane bits finishes a reduction)::

    S: m16n8 accumulator tiles, 16x64 per warp          mx = rowmax(S): projection onto q
      lane l, tile j:  (l/4,     8j + 2(l%4) + {0,1})     lane l:  rows l/4 and l/4 + 8
                       (l/4 + 8, 8j + 2(l%4) + {0,1})     replicas: lanes l ^ 1, l ^ 2 (one quad)

Two tables of the same elements in different registers — the scores' accumulator and the A
operand of the next MMA (P kept in registers) — are matched coordinate by coordinate: each
register of one has its element in a register of the other *in the same lane*, or the tensors
cannot be converted in registers, which is a ``ScheduleError`` naming both.
"""

from __future__ import annotations

import functools

import attrs
import numpy as np

from ..schedule import Node
from ..spec import Move, Pointwise, Reduce
from ..tensor import RF
from .context import err
from .layouts import RFLayout, coords


@attrs.frozen(eq=False)
class FragTable:
    """Register tensor ``key`` over ``dims``: register ``i`` of every lane holds the element that
    register ``regs[i]`` of the MMA layout ``base`` holds, restricted to ``dims``; the lanes
    ``lane ^ x`` for ``x`` spanned by ``masks`` hold the same elements."""

    key: object
    dims: tuple[str, ...]
    base: RFLayout
    regs: tuple[int, ...]
    masks: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return len(self.regs)

    @property
    def lanes(self) -> int:
        return self.base.atom.threads

    @property
    def par(self) -> tuple:
        return tuple(p for p in self.base.par if p[0] in self.dims)

    @property
    def replicas(self) -> tuple:
        return self.base.replicas

    def coord(self, lane, i: int) -> dict:
        """The element of register ``i`` (relative to the unit's part) in lane ``lane`` (an int or
        an index expression)."""
        c = _base_coord(self.base, lane, self.regs[i])
        return {d: c[d] for d in self.dims}

    @functools.cached_property
    def numeric(self) -> np.ndarray:
        """``numeric[lane, i]``: the coordinate tuple (one entry per dim) of register ``i``."""
        di = [self.base.dims.index(d) for d in self.dims]
        tab = np.asarray(coords(self.base.tv), dtype=np.int64)[:self.lanes]
        seq = np.array([[_seq_coord(self.base, r)[self.base.dims[k]] for k in di] for r in self.regs],
                       dtype=np.int64).reshape(self.size, len(di))
        vals = np.array([r % self.base.values for r in self.regs], dtype=np.int64)
        # one numpy gather for every (lane, register, dim): the tables of wgmma fragments are 128
        # lanes by up to a few hundred registers, and are built for every fragment leaf
        return seq[None, :, :] + tab[:, vals][:, :, di]


def _seq_coord(lay: RFLayout, r: int) -> dict:
    """The tile origin of base register ``r``: its sequential repetition's indices times steps."""
    c = {d: 0 for d in lay.dims}
    for (d, n, s), st in zip(lay.seq, lay.strides()):
        c[d] += ((r // st) % n) * s
    return c


def _base_coord(lay: RFLayout, lane, r: int) -> dict:
    return dict(_base_coord_items(lay, lane, r))


@functools.lru_cache(maxsize=65536)
def _base_coord_items(lay: RFLayout, lane, r: int) -> tuple:
    # remembered: the lowering asks for every register's coordinate of the same lane expression at
    # each fragment leaf, and building the index expressions is most of the cost
    c = _seq_coord(lay, r)
    a, b = lay.tv.coord(lane, r % lay.values)
    c[lay.dims[0]] = c[lay.dims[0]] + a
    c[lay.dims[1]] = c[lay.dims[1]] + b
    return tuple(c.items())


def table_of(lay) -> FragTable:
    """The table of an MMA operand's layout (an ``RFLayout``), or ``lay`` if it is one already."""
    if isinstance(lay, FragTable):
        return lay
    return _mma_table(lay)


@functools.lru_cache(maxsize=256)
def _mma_table(lay: RFLayout) -> FragTable:
    return FragTable(lay.key, lay.dims, lay, tuple(range(lay.size)))


def project(t: FragTable, key, dims: tuple[str, ...], node: Node) -> FragTable:
    """The table of a tensor over ``dims`` (a subset of ``t``'s) combined with ``t``'s elements:
    one register per distinct coordinate a lane holds (numbered the same in every lane)."""
    dropped = [d for d in t.dims if d not in dims]
    for d, c, _s, var in t.base.par:
        if d in dropped:
            raise err(node, f"{key.name} keeps one value per {', '.join(dims)} of {t.key.name}, whose {d} is split over "
                            f"{c} units ({var}): the fragments' lanes cannot combine across units",
                      fix=f"keep {d} inside one warp (tile and map the other dims onto warps)")
    sub = t.numeric[:, :, [t.dims.index(d) for d in dims]]
    cid = _ids(sub)
    slots: dict = {}
    slot_of = np.array([slots.setdefault(c, len(slots)) for c in cid[0].tolist()], dtype=np.int64)
    # in every lane, the registers that hold one coordinate are in one slot (the slot lane 0 gives them)
    if _splits(cid, slot_of):
        raise err(node, f"{key.name} cannot be held with the rows of {t.key.name}: its registers group "
                        "different elements in different lanes")
    first = [int(np.argmax(slot_of == j)) for j in range(len(slots))]
    out = FragTable(key, tuple(dims), t.base, tuple(t.regs[i] for i in first))
    rows = out.numeric
    masks = []
    bit = 1
    lanes = np.arange(t.lanes)
    while bit < t.lanes:
        if np.array_equal(rows, rows[lanes ^ bit]):
            masks.append(bit)
        bit <<= 1
    # the lanes that hold an element must be exactly one group of replicas: a reduction's
    # butterfly over the masks then sees every lane's part once
    group = 1 << len(masks)
    rid = _ids(rows)
    holders = (rid[:, None, :] == rid[None, :, :]).sum(axis=1)      # [lane, j]: lanes holding its element
    bad = np.argwhere(holders != group)
    if len(bad):
        lane, j = bad[0]
        raise err(node, f"{key.name}: {int(holders[lane, j])} lanes hold the same element of {t.key.name}'s rows, "
                        f"which no butterfly over lane bits {masks} combines")
    return attrs.evolve(out, masks=tuple(masks))


def register_map(dst: FragTable, src: FragTable, node: Node) -> list[int]:
    """For each register of ``dst``, the register of ``src`` holding the same element (restricted
    to ``src``'s dims) in the same lane — the same index in every lane."""
    pos = [dst.dims.index(d) for d in src.dims]
    want = dst.numeric[:, :, pos]
    have = src.numeric[:dst.lanes]
    # every coordinate numbered, then eq[lane, i, j]: src register j of the lane holds the element of
    # its dst register i (one comparison of small integers instead of a search per lane and register)
    ids = _ids(np.concatenate([want, have], axis=1))
    want_id, have_id = ids[:, :dst.size], ids[:, dst.size:]
    eq = want_id[:, :, None] == have_id[:, None, :]
    hit = eq.any(axis=2)
    first = eq.argmax(axis=2)                       # the first src register holding it, per lane
    found = first[0]                                # lane 0's, where it has one
    # lane by lane, register by register: the first lane without the element, or whose register
    # ``found`` does not hold it, is the error (the first one in that order, as a search would meet it)
    agree = np.take_along_axis(eq, found[None, :, None], axis=2)[:, :, 0]
    bad = ~hit | ~agree
    for i in range(dst.size):
        lanes = np.nonzero(bad[:, i])[0]
        if not len(lanes):
            continue
        lane = int(lanes[0])
        if not hit[lane, i]:
            raise err(node, f"element {dict(zip(src.dims, want[lane, i].tolist()))} of {src.key.name} is not held "
                            f"by lane {lane}, which needs it for {dst.key.name}: the two fragments are laid out by "
                            "different lanes, so the conversion cannot stay in registers",
                      fix=f"use MMA tiles whose fragments agree (e.g. the m16n8k16 accumulator of "
                          f"{src.key.name} and the A operand of the next m16n8k16)")
        raise err(node, f"{dst.key.name} and {src.key.name} number their registers differently in different "
                        "lanes; a register-to-register conversion needs the same numbering in every lane")
    return [int(j) for j in found]


def _ids(a: np.ndarray) -> np.ndarray:
    """``a[..., k]`` coordinate tuples numbered: equal tuples get equal ids; shape ``a.shape[:-1]``.
    Mixed radix over each dim's range (np.unique over rows sorts them, several times slower)."""
    if a.size == 0:             # no registers, or no dims (every tuple the empty one)
        return np.zeros(a.shape[:-1], dtype=np.int64)
    axes = tuple(range(a.ndim - 1))
    lo, hi = a.min(axis=axes), a.max(axis=axes)
    if np.prod([float(h - lw + 1) for lw, h in zip(lo, hi)]) >= 2.0 ** 62:       # ids would overflow
        return np.unique(a.reshape(-1, a.shape[-1]), axis=0, return_inverse=True)[1].reshape(a.shape[:-1])
    out = np.zeros(a.shape[:-1], dtype=np.int64)
    for k in range(a.shape[-1]):
        out = out * int(hi[k] - lo[k] + 1) + (a[..., k] - lo[k])
    return out


def _splits(cid: np.ndarray, slot_of: np.ndarray) -> bool:
    """Whether some lane holds one coordinate (``cid[lane, i]``) in registers of different slots."""
    lanes, size = cid.shape
    lane = np.broadcast_to(np.arange(lanes, dtype=np.int64)[:, None], (lanes, size)).ravel()
    c = cid.ravel()
    slot = np.broadcast_to(slot_of, (lanes, size)).ravel()
    # sorted by lane, then coordinate, then slot (three keys: a combined lane * range + id key
    # would overflow where the ids run near 2**62)
    order = np.lexsort((slot, c, lane))
    ln, k, s = lane[order], c[order], slot[order]
    return bool(np.any((ln[1:] == ln[:-1]) & (k[1:] == k[:-1]) & (s[1:] != s[:-1])))


def is_fragment_leaf(n: Node) -> bool:
    return (n.atom is None and getattr(n.strategy, "fragments", False) and not n.loops and not n.children
            and isinstance(n.spec, (Pointwise, Move, Reduce)))


def fragment_layouts(block: Node, known: dict) -> dict:
    """The tables of every register tensor the fragment leaves below ``block`` touch: an MMA's
    operands from ``known`` (their ``RFLayout``), the others projected from the tensors they are
    combined with (a row vector from the fragment whose rows it holds), in tree order until
    nothing changes."""
    leaves = [n for n in block.walk() if is_fragment_leaf(n)]
    out: dict = {}

    def get(t):
        if t.memory != RF:
            return None
        if t.tensor in out:
            return out[t.tensor]
        lay = known.get(t.tensor)
        return table_of(lay) if isinstance(lay, (RFLayout, FragTable)) else None

    changed = True
    while changed:
        changed = False
        for n in leaves:
            sp = n.spec
            tiles = [t for t in sp.operands if t.memory == RF]
            have = {t.tensor: get(t) for t in tiles}
            full = [t for t in tiles if have[t.tensor] is not None]
            if not full:
                continue
            widest = max(full, key=lambda t: len(t.dims))
            for t in tiles:
                if have[t.tensor] is not None:
                    continue
                if set(t.dims) <= set(widest.dims):
                    out[t.tensor] = project(have[widest.tensor], t.tensor, tuple(t.dims), n)
                    changed = True
    for n in leaves:
        for t in n.spec.operands:
            if t.memory == RF and get(t) is None:
                raise err(n, f"register tensor {t.name} is held by no fragment: no MMA reads or writes it and no "
                             "fragment it is combined with covers its dims", field=t.name,
                          fix="combine it with an MMA's operand (its rows or columns), or give it to an MMA")
    return out


__all__ = ["FragTable", "table_of", "project", "register_map", "fragment_layouts", "is_fragment_leaf"]
