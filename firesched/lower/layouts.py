"""Layout inference: where every element of an on-chip tensor lives.

Register tensors (``RFLayout``) are distributed by their *consumer*: the path of loops from the
node that created the tensor down to the atom that reads or writes it.  Loops over the tensor's
dims mapped onto warps or warpgroups say which unit holds which part, sequential (unrolled) loops
say which registers, and the atom's thread-value layout says which lane and value::

    C:RF f32[128x128], warps 2x2 (64x64 each), 4x8 mma m16n8 tiles per warp:
      par  = (m, 2 warps, 64), (n, 2 warps, 64)        -> which warp
      seq  = (m, 4, 16), (n, 8, 8)                      -> registers [m-tile][n-tile][value]
      atom = mma_m16n8k16 C fragment (4 values/lane)    -> which lane, which value

Producers (ldmatrix), the accumulator's init and store are derived from that layout and checked
against it.  A unit-mapped loop that does not touch an accumulator's dims (split-K over warps)
makes *replicas*: partial results the store must combine.

Shared tensors (``SmemLayout``) are laid out by their *producer*: rows of the tensor's contiguous
dim, cut into boxes where a TMA box must be narrower than the row (one swizzle span), each box
row-major with the tensor's swizzle XORed into its element offsets, and ``stages`` copies for a
pipeline ring::

    B:SH f16[64x256] (k rows, n contiguous), 128-byte TMA boxes of 64 columns:
      box 0: cols 0..63   (64 x 64, 8 KiB)   box 1: cols 64..127   ...   then stage 1
"""

from __future__ import annotations

import functools

import attrs
import numpy as np

from ..hardware.atoms.base import WGMMA, Atom
from ..ir import nodes as ir_nodes
from ..ir.expr import IntExpr, Sum, bounds, free_vars
from ..layout import Swizzle
from ..schedule import Node
from ..spec import Fused, MatMul, ScaleAdd
from ..tensor import RF, SH, THREAD, WARP, WARPGROUP
from .context import err

UNIT_LEVELS = (WARPGROUP, WARP, THREAD)


# --------------------------------------------------------------------------- registers

class _SequentialTiles:
    """Registers of a tensor repeated over the sequential loops ``seq`` ((dim, count, step), outer
    first) around a block of ``values`` registers per repetition (an MMA fragment, or a thread's
    element-wise leaf)."""

    __slots__ = ()

    @property
    def size(self) -> int:
        n = self.values
        for _, c, _ in self.seq:
            n *= c
        return n

    def strides(self) -> list[int]:
        out, acc = [], self.values
        for _, c, _ in reversed(self.seq):
            out.append(acc)
            acc *= c
        return out[::-1]

    def unit_origin(self, seq_vars, unit_vars: dict) -> dict[str, IntExpr]:
        """The origin (relative to the tensor) of the repetition that ``seq_vars`` (one variable
        per ``seq`` loop) index, in the part of the unit whose mapped loop variables ``unit_vars``
        binds (by loop variable name)."""
        origin: dict[str, IntExpr] = {d: 0 for d in self.dims}
        for (d, _c, s), v in zip(self.seq, seq_vars):
            origin[d] = origin[d] + v * s
        for d, _c, s, var in self.par:
            origin[d] = origin[d] + unit_vars[var] * s
        return origin

    def seq_offset(self, origin: dict[str, IntExpr]) -> IntExpr:
        """Register offset of the repetition holding tile origin ``origin`` (relative to the tensor)."""
        off: IntExpr = 0
        for (d, c, s), st in zip(self.seq, self.strides()):
            off = off + ((origin[d] // s) % c) * st
        return off


@attrs.frozen
class RFLayout(_SequentialTiles):
    """Where each element of a register tensor lives (see the module docstring)."""

    key: object                                    # the register tensor
    dims: tuple[str, str]
    shape: tuple[int, int]
    atom: Atom
    operand: str                                   # the atom's operand: "a" | "b" | "c" | "d"
    seq: tuple[tuple[str, int, int], ...]          # (dim, count, step), registers, outer first
    par: tuple[tuple[str, int, int, str], ...]     # (dim, count, step, loop var): warps / warpgroups
    replicas: tuple[tuple[str, int], ...]          # (loop var, count): partial results over units

    @property
    def tv(self):
        return self.atom.operand(self.operand).tv

    @property
    def frag(self) -> tuple[int, int]:
        return self.tv.tile

    @property
    def values(self) -> int:
        return self.tv.num_values

    def offset(self, origin: dict[str, IntExpr]) -> IntExpr:
        """Register offset of the fragment whose tile origin (relative to the tensor) is ``origin``."""
        return self.seq_offset(origin)

    def owner(self, coord: tuple[int, int]) -> tuple[int, int]:
        """(lane, register offset) holding the element at integer ``coord`` (relative to the unit's
        part of the tensor)."""
        return self.owner_fn()(coord)

    def owner_fn(self):
        """``owner`` with the layout's tables looked up once, for asking about many coordinates
        (``seq_offset`` evaluated on integers: the same value without building an expression)."""
        f0, f1 = self.frag
        inv = inverse(self.tv)
        d0, d1 = self.dims
        seq = tuple(zip(self.seq, self.strides()))

        def owner(coord):
            r, c = coord
            lane, v = inv[r % f0, c % f1]
            origin = {d0: r - r % f0, d1: c - c % f1}
            off = 0
            for (d, count, step), stride in seq:
                off += ((origin[d] // step) % count) * stride
            return int(lane), off + int(v)

        return owner

    def unit_part(self) -> dict[str, int]:
        """Extent along each dim of the part one unit (warp / warpgroup) holds."""
        part = dict(zip(self.dims, self.shape))
        for d, _c, s, _ in self.par:
            part[d] = s
        return part


def matmul_operand_name(atom: Atom, which: str) -> str:
    """The atom operand that holds MatMul operand ``which`` ("a", "b", "c")."""
    if which == "c" and atom.family == WGMMA:
        return "d"
    return which


def register_layouts(block: Node) -> dict:
    """Every register tensor consumed by a MatMul atom below ``block``, and its layout, keyed by
    the tensor (two register tensors may share a name: a fused part's accumulator and the next
    part's fragments of it)."""
    out: dict[tuple[str, str], RFLayout] = {}
    # an accumulator that a ScaleAdd adds group partial products into (``scale_partials``) is no
    # MMA's C itself: it is laid out as the MMA that writes the partial products would lay it out
    folded = {n.spec.src.tensor: n.spec.dst for n in block.walk() if isinstance(n.spec, ScaleAdd)}

    def go(n: Node, path: list):
        here = path + [n]
        if n.atom is not None and isinstance(n.spec, MatMul):
            for which, t in (("a", n.spec.a), ("b", n.spec.b), ("c", n.spec.c)):
                if t.memory != RF:
                    continue
                k = t.tensor
                if k not in out:
                    out[k] = _derive(k, t, which, n.atom, here)
                dst = folded.get(k) if which == "c" else None
                if dst is not None and dst.tensor not in out:
                    out[dst.tensor] = _derive(dst.tensor, dst, which, n.atom, here)
        for c in n.children:
            go(c, here)

    go(block, [])
    return out


def _frame_start(k, path: list) -> int:
    """Where register tensor ``k``'s frame starts in ``path``: at the node that creates it, the
    parent of the first node that has it as an operand (its loops — a K loop, a reduced dim mapped
    onto threads — are the first that iterate over the tensor's life)."""
    for i, n in enumerate(path):
        if any(t.tensor == k for t in n.spec.operands):
            if i and isinstance(n.spec, Fused) and _walks(path[i - 1], k):
                # a fused body's own tensor (the scores of one key tile) lives inside one
                # iteration of the loop around the body, which walks its dims tile by tile
                return i
            return max(i - 1, 0)
    return 0


def _walks(n: Node, k) -> bool:
    """Whether ``n`` has a sequential loop over one of register tensor ``k``'s dims."""
    return any(lp.unit is None and any(d in k.dims for d, _ in lp.steps) for lp in n.loops)


def _derive(k, tile, which: str, atom: Atom, path: list) -> RFLayout:
    start = _frame_start(k, path)
    dims = tile.tensor.dims
    if len(dims) != 2:
        raise err(path[-1], f"register tensor {tile.name} has dims {dims}; an MMA fragment is 2-D",
                  fix="tile the other dimensions to 1 before staging the operand")
    mm = path[-1].spec
    m_, n_, k_ = mm.roles
    want = {"a": (m_, k_), "b": (k_, n_), "c": (m_, n_)}[which]
    if set(dims) == set(want):
        # the fragment's rows and columns are the atom's (B is k x n, however the tensor names
        # its dims: attention's K is (kv, d), read as d x kv)
        dims = want
    seq, par, rep = [], [], []
    for n in path[start:]:
        for lp in n.loops:
            mine = [(d, s) for d, s in lp.steps if d in dims]
            if not mine:
                if lp.unit in UNIT_LEVELS and which == "c":
                    rep.append((lp.var, lp.count))
                continue
            d, s = mine[0]
            if lp.unit in (WARP, WARPGROUP):
                par.append((d, lp.count, s, lp.var))
            elif lp.unit is None:
                seq.append((d, lp.count, s))
            else:
                raise err(n, f"register tensor {tile.name} is split over {lp.unit}s; only warps, warpgroups "
                             "and sequential loops can hold MMA fragments")
    # steps must nest: each loop's step divides the one above it (per dim)
    last = {d: None for d in dims}
    for d, _c, s in [(d, c, s) for d, c, s, *_ in par] + seq:
        if last[d] is not None and last[d] % s:
            raise err(path[-1], f"the tiles of register tensor {tile.name} along {d} do not nest "
                                f"({s} does not divide {last[d]})", fix="use power-of-two tile sizes")
        last[d] = s
    lay = RFLayout(k, dims, tuple(tile.tensor.extent(d) for d in dims), atom, matmul_operand_name(atom, which), tuple(seq),
                   tuple(par), tuple(rep))
    f0, f1 = lay.frag
    for d, f in zip(dims, (f0, f1)):
        if last[d] is not None and last[d] != f:
            raise err(path[-1], f"register tensor {tile.name}: the innermost tile along {d} is {last[d]}, "
                                f"the atom's fragment is {f}")
    return lay


# --------------------------------------------------------------------------- thread registers

@attrs.frozen
class ThreadLayout(_SequentialTiles):
    """A register tensor that threads hold element by element (no MMA fragment): each thread holds
    the ``leaf`` tile its element-wise leaf touches (row-major over ``dims``), repeated over the
    sequential loops between the tensor's creation and the leaf (``seq``, outer first); loops
    mapped onto units that cut the tensor's dims say which unit holds which part (``par``); loops
    mapped onto units over other dims make ``replicas``, each unit holding a partial result of
    the same elements (a reduction split over threads), which the store combines::

        Y:RF f32[1] of a row sum, 32 lanes x 8 elements each:  leaf (1,), replicas (c1: 32 lanes)
    """

    key: object                                    # the register tensor
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    leaf: tuple[int, ...]
    seq: tuple[tuple[str, int, int], ...]
    par: tuple[tuple[str, int, int, str], ...]
    replicas: tuple[tuple[str, int], ...]

    @property
    def values(self) -> int:
        n = 1
        for s in self.leaf:
            n *= s
        return n

    def padded_dims(self) -> tuple[str, ...]:
        """Dims along which the threads' tiles reach past the tensor's extent: the registers there
        hold no element (a row of 1000 in tiles of 8 per thread pads 1000..1007), and a
        reduction over them skips them."""
        out = []
        for i, d in enumerate(self.dims):
            cover = self.leaf[i]
            for dd, c, s in self.seq:
                if dd == d:
                    cover = max(cover, c * s)
            for dd, c, s, _ in self.par:
                if dd == d:
                    cover = max(cover, c * s)
            if cover > self.shape[i]:
                out.append(d)
        return tuple(out)

    def offset(self, origin: dict[str, IntExpr]) -> IntExpr:
        """Register offset of the element at ``origin`` (relative to the tensor, within this
        thread's part): the sequential tiles outside, the leaf's row-major index inside."""
        off = self.seq_offset(origin)
        inner: IntExpr = 0
        for d, n in zip(self.dims, self.leaf):
            inner = inner * n + origin[d] % n if n > 1 else inner * n
        return off + inner


def thread_layouts(block: Node) -> dict:
    """Every register tensor a thread's element-wise leaf below ``block`` reads or writes.

    A register tensor that several leaves touch (an intermediate the parts of a fused spec share,
    ``place(name, RF)``) is held where the first one puts it; every other leaf must reach its
    elements through the same mapping onto units and the same tiles, or it would read registers
    another thread holds."""
    out: dict[tuple[str, str], ThreadLayout] = {}
    first: dict = {}

    def go(n: Node, path: list):
        here = path + [n]
        if n.atom is None and n.strategy is not None and not n.children and not n.loops and \
                not getattr(n.strategy, "fragments", False):
            for t in n.spec.operands:
                k = t.tensor
                if t.memory != RF:
                    continue
                start = _frame_start(k, here)
                if k not in out:
                    out[k] = _derive_thread(k, t, here)
                    first[k] = (n, _ownership(k, here[start:]))
                elif _ownership(k, here[start:]) != first[k][1]:
                    raise err(n, f"register tensor {t.name} is held by the threads of another part as "
                                 f"{_describe(first[k][1])}, but this leaf reaches it as "
                                 f"{_describe(_ownership(k, here[start:]))}: each thread can only read "
                                 "the registers it holds", field=t.name,
                              value=str(first[k][0].spec),
                              fix="give every part that touches it the same tiles and mappings "
                                  "(e.g. the same tile(c=...) >> to_threads())")
        for c in n.children:
            go(c, here)

    go(block, [])
    return out


def _ownership(k, path: list) -> tuple:
    """Which unit and register hold each element of register tensor ``k`` along ``path`` (its
    frame down to a leaf): the unit-mapped loops (over any dim: they number the threads) and the
    sequential loops over the tensor's dims, loops of one iteration left out, then the leaf's tile."""
    dims = k.dims
    out = []
    for n in path:
        for lp in n.loops:
            if lp.count == 1:
                continue
            mine = tuple((d, s) for d, s in lp.steps if d in dims)
            if lp.unit in UNIT_LEVELS:
                out.append((str(lp.unit), lp.count, mine))
            elif lp.unit is None and mine:
                out.append(("seq", lp.count, mine))
    leaf = path[-1].spec
    tile = next(t for t in leaf.operands if t.tensor == k)
    return tuple(out), tuple(tile.shape)


def _describe(own) -> str:
    loops, leaf = own
    parts = [f"{u}({c}{''.join(f', {d}={s}' for d, s in m)})" for u, c, m in loops]
    return " > ".join(parts + [f"tiles {'x'.join(map(str, leaf))}"])


def _derive_thread(k, tile, path: list) -> ThreadLayout:
    start = _frame_start(k, path)
    dims = tile.tensor.dims
    seq, par, rep = [], [], []
    for n in path[start:]:
        for lp in n.loops:
            mine = [(d, s) for d, s in lp.steps if d in dims]
            if not mine:
                if lp.unit in UNIT_LEVELS:
                    rep.append((lp.var, lp.count))
                continue
            d, s = mine[0]
            if lp.unit in UNIT_LEVELS:
                par.append((d, lp.count, s, lp.var))
            elif lp.unit is None:
                seq.append((d, lp.count, s))
    return ThreadLayout(k, dims, tuple(tile.tensor.shape), tuple(tile.shape), tuple(seq), tuple(par), tuple(rep))


# --------------------------------------------------------------------------- shared memory

@attrs.frozen
class SmemLayout:
    """A shared tile of ``rows`` x ``cols`` elements (``cols`` along the tensor's contiguous dim;
    ``rows`` the other dims, outermost first), cut into boxes of ``box_cols`` columns, each box
    row-major with ``swizzle`` on its element offsets; ``stages`` copies of it."""

    row_dims: tuple[str, ...]
    col_dim: str
    rows: int
    cols: int
    box_cols: int
    swizzle: Swizzle | None
    stages: int = 1
    align: int = 128
    span: int = 0               # bytes of the hardware swizzle mode (TMA / wgmma), 0 for none

    @property
    def stage_elems(self) -> int:
        n = self.rows * self.cols
        sw = self.swizzle
        if sw is not None and sw.bits and self.box_cols == self.cols:
            # a swizzle permutes offsets within blocks of 2**(base + shift + bits) elements: a tile
            # that ends inside such a block reaches past its end (3x24 under Sw<1,3,3> moves
            # element 64 to 72), so a stage takes whole blocks
            period = 1 << (sw.base + sw.shift + sw.bits)
            n = -(-n // period) * period
        return n

    @property
    def size(self) -> int:
        return self.stage_elems * self.stages

    @property
    def boxes(self) -> int:
        return self.cols // self.box_cols

    def row(self, coord: dict[str, IntExpr], shape: dict[str, int]) -> IntExpr:
        """The flat row index of a coordinate over ``row_dims``."""
        r: IntExpr = 0
        for d in self.row_dims:
            r = r * shape[d] + coord[d]
        return r

    def linear(self, r: IntExpr, c: IntExpr) -> IntExpr:
        """Element offset of (row, col) within a stage, before the swizzle."""
        if self.box_cols == self.cols:
            return r * self.cols + c
        return (c // self.box_cols) * (self.rows * self.box_cols) + r * self.box_cols + c % self.box_cols

    def offset(self, r: IntExpr, c: IntExpr, stage: IntExpr = 0) -> IntExpr:
        """Element offset of (row, col) of stage ``stage``, swizzled.  A swizzle of the box's own
        offsets equals the hardware's swizzle of absolute addresses because boxes start on a
        multiple of the swizzle's period (the buffer is aligned to it)."""
        lin = self.linear(r, c)
        if self.swizzle is not None and self.swizzle.bits:
            if self.box_cols == self.cols:
                lin = swizzle_split(self.swizzle, lin)
            else:
                box = self.rows * self.box_cols
                lin = (lin // box) * box + self.swizzle(lin % box)
        if self.stages > 1:
            lin = stage * self.stage_elems + lin
        return lin


def swizzle_split(sw: Swizzle, x: IntExpr) -> IntExpr:
    """``sw(x)``, written as ``sw(a) ^ sw(b)`` where ``x = a + b`` splits into the terms that
    depend on the thread index (``a``) and the rest (``b``: unrolled loop indices, constants)
    and the two parts never set the same bit.

    Then ``a + b = a ^ b``, and a swizzle is linear over XOR (it XORs some bits of its argument
    into others), so ``sw(a + b) = sw(a) ^ sw(b)``.  The per-thread part is computed once and
    shared by every unrolled copy; ``sw(b)`` folds to a constant in each::

        Q row tid % 16, 16-element step d0:   sw(tid%16*128 + d0*16)
                                            = sw(tid%16*128) ^ sw(d0*16)
            bits:  tid%16*128 -> 7..10,  d0*16 -> 4..6   (disjoint: no carry between them)

    Anything else (overlapping bits, unknown ranges, negative terms) is swizzled whole."""
    if not isinstance(x, Sum):
        return sw(x)
    thread, rest = [], []
    for t, c in x.terms:
        names = {v.name for v in free_vars(t)}
        (thread if names & _THREAD_INDEX else rest).append((t, c))
    if not thread or (not rest and x.const == 0):
        return sw(x)
    a = sum((t * c for t, c in thread), 0)
    b = sum((t * c for t, c in rest), x.const)
    ma, mb = _bit_mask(thread, 0), _bit_mask(rest, x.const)
    if ma is None or mb is None or ma & mb:
        return sw(x)
    return sw(a) ^ sw(b)


_THREAD_INDEX = frozenset((ir_nodes.TID_NAME, ir_nodes.ROLE_TID_NAME))


def _bit_mask(terms, const: int) -> int | None:
    """Every bit ``sum(c * t) + const`` may set (terms ``(t, c)``, each ``t >= 0`` bounded), or
    None when unknown.  Terms whose own bits are disjoint add without carries: their masks OR;
    otherwise the mask spans the sum's range."""
    masks = [const] if const else []
    if const < 0:
        return None
    for t, c in terms:
        lo, hi = bounds(t)
        if lo is None or hi is None or lo < 0 or c <= 0:
            return None
        low = (c & -c).bit_length() - 1            # c * t is a multiple of 2**low
        masks.append(((1 << (c * hi).bit_length()) - 1) & ~((1 << low) - 1))
    union = 0
    for m in masks:
        if union & m:
            break
        union |= m
    else:
        return union
    hi = const + sum(c * bounds(t)[1] for t, c in terms)
    low = min((m & -m).bit_length() - 1 for m in masks if m)
    return ((1 << hi.bit_length()) - 1) & ~((1 << low) - 1)


def plain_smem_layout(tensor, stages: int | None = None) -> SmemLayout:
    """The layout of a shared tensor filled by per-thread copies: one box per row."""
    dims = tensor.storage_dims
    rows = 1
    for d in dims[:-1]:
        rows *= tensor.extent(d)
    cols = tensor.extent(dims[-1])
    return SmemLayout(dims[:-1], dims[-1], rows, cols, cols, tensor.swizzle,
                      tensor.stages if stages is None else stages)


@functools.lru_cache(maxsize=None)
def inverse(tv):
    return tv.inverse()


@functools.lru_cache(maxsize=None)
def coord_table(tv) -> np.ndarray:
    """(row, col) of every (thread, value) of the tile, int64 of shape [threads, values, 2]."""
    rows = tv.tile[0]
    idx = tv._table()
    if rows == 1:
        return np.stack([np.zeros_like(idx), idx], axis=-1)
    return np.stack([idx % rows, idx // rows], axis=-1)


@functools.lru_cache(maxsize=None)
def coords(tv):
    """``coords(tv)[thread][value]`` = (row, col) of the tile."""
    return tuple(tuple((int(r), int(c)) for r, c in lane) for lane in coord_table(tv).tolist())


@functools.lru_cache(maxsize=None)
def value_runs(tv) -> tuple[tuple[int, ...], ...]:
    """Group a fragment's values into runs adjacent along the tile's columns (same for every lane),
    at most two long (a vector store of two elements)."""
    tab = coord_table(tv)
    # next_to[v] : value v sits one column right of value v - 1 in the same row, for every lane
    step = tab[:, 1:] - tab[:, :-1]
    next_to = np.all((step[..., 0] == 0) & (step[..., 1] == 1), axis=0)
    runs, cur = [], [0]
    for v in range(1, tv.num_values):
        if next_to[v - 1] and len(cur) < 2:
            cur.append(v)
        else:
            runs.append(tuple(cur))
            cur = [v]
    runs.append(tuple(cur))
    return tuple(runs)


__all__ = ["RFLayout", "ThreadLayout", "SmemLayout", "register_layouts", "thread_layouts", "plain_smem_layout", "matmul_operand_name",
           "inverse", "coords", "coord_table", "value_runs", "SH"]
