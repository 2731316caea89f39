"""Block order: which tile each block computes (a tile scheduler).

The loops a schedule maps onto blocks (``to_blocks``) become the grid:

* plain: the mapped loops, innermost on ``blockIdx.x``, then y and z;
* grouped (``group=G``): the two grouped loops (rows and columns of tiles: M and N of a MatMul)
  share grid x, walked column-major in groups of G row-tiles, so that the blocks resident at once
  touch G rows of A tiles and few columns of B tiles (L2 reuse); other loops go to y and z::

      group of G=2 row-tiles:   t0 t2 t4 ...      (t = blockIdx.x within the group)
                                t1 t3 t5 ...

* persistent (``persistent=True``): one block per SM, at most one per tile; block ``b`` walks
  tiles ``b, b + grid, b + 2*grid, ...`` in the same order, in a loop around the block's work;
* reversed (``reverse=True``): each mapped loop's tile index counted down, so the last tiles
  start first (causal attention's longest query tiles);
* stream-K (a ``stream_k(parts)`` loop among them): the chunks (tile, kc), kc fastest, split into
  one contiguous range per block of a persistent grid, each walked from the top down
  (``StreamK``; ``strategies.stream_k`` draws it);
* split-K fix-up (a ``split_k(parts, combine="fixup")`` loop among them): the walk of the plain
  grid; each block also gets a slot of the partial-sum workspace, a tile's parts in consecutive
  slots, and the block of the last part adds the others (``SplitFixup``);
* split-K in a cluster (``split_k(parts, combine="cluster")``): blocks ``P*t .. P*t + P-1`` are
  the ``P`` K parts of tile ``t`` (the other block loops' tiles, row-major), one cluster, part =
  cluster rank; the last rank adds the others' partial sums (``SplitFixup(via_cluster=True)``)::

      cluster 0: | t0 kp0 | t0 kp1 |   cluster 1: | t1 kp0 | t1 kp1 |   ...   (P = 2)
                      push --^                         push --^
* clusters (``cluster=C``): blocks ``C*i .. C*i + C-1`` form a thread-block cluster that takes C
  consecutive tiles of the clustered loop for one tile of the other (a MatMul: C row-tiles of
  one column of tiles, whose shared B tile is loaded once and multicast; a row reduction: the C
  parts of one row, combined through distributed shared memory).  When the row-tiles do not
  fill the last cluster, its spare blocks load a duplicate of the last row-tile and store nothing.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...ir.expr import IntExpr, Var, binop, floordiv, ge, lt, minimum, mod, select
from ..context import err

GRID_LIMITS = (2 ** 31 - 1, 65535, 65535)


@attrs.frozen
class ClusterInfo:
    """The launch's thread-block clusters: ``size`` blocks along the row-tiles of dim ``dim``;
    ``rank`` of this block; ``clamp``, the last valid origin along ``dim`` (None when every
    block's tile is valid) and ``store_ok``, whether this block's tile is inside the tensor."""

    size: int
    dim: str
    rank: IntExpr
    clamp: IntExpr | None
    store_ok: IntExpr
    exchange: str = "barrier"          # how split reductions combine: "barrier" or "push" (to_blocks)
    # split_k(..., combine="cluster"): the blocks are K parts of one tile, which share no operand
    # tile (nothing multicast, no ring across blocks); only the split's fix-up addresses the others
    split: bool = False


@attrs.frozen
class StreamK:
    """A stream-K launch (``strategies.stream_k``) over ``blocks`` blocks, ``parts`` chunks per tile.

    Data-parallel first, stream-K for the rest (CUTLASS's hybrid): all but the last full wave of
    tiles are whole tiles, block ``bid`` taking tiles ``bid``, ``bid + blocks``, ... one chunk per
    step (the first ``dp`` steps); the remaining tiles' ``total`` chunks are split into one
    contiguous range per block, ``lo`` .. ``hi - 1`` (numbered from the first of those tiles),
    which the block walks from the top down.  Blocks running at once so work on neighbouring
    tiles, as in the plain persistent order (operands shared in L2).  Step ``unit`` is chunk
    ``kc`` of tile ``tile``.  ``acc`` names the accumulator the chunks build (set by the driver).
    """

    parts: int
    blocks: int
    total: int
    dp: int
    bid: IntExpr
    unit: Var
    lo: IntExpr
    hi: IntExpr
    tile: IntExpr
    kc: IntExpr
    max_partners: int
    acc: str = ""

    strategy = "stream_k"       # what users wrote, and what the fix-up's comments call it
    kind = "stream-K"
    counted = False             # a flag a block (its partners vary along the walk)

    @property
    def in_dp(self) -> IntExpr:
        return lt(self.unit, self.dp) if self.dp else 0

    @property
    def sk_chunk(self) -> IntExpr:
        """The step's chunk in the stream-K range (meaningful past the data-parallel steps)."""
        return self.hi - 1 - (self.unit - self.dp)

    @property
    def first(self) -> IntExpr:
        """Whether this step starts the block's work on a tile (the accumulator starts at 0)."""
        return _or(binop("==", self.unit, self.dp), binop("==", self.kc, self.parts - 1))

    @property
    def last(self) -> IntExpr:
        """Whether this step ends the block's work on a tile (its partial or final tile is stored)."""
        return _or(binop("==", self.unit, self.dp + self.hi - self.lo - 1), binop("==", self.kc, 0))

    @property
    def top(self) -> IntExpr:
        """Whether this block holds the tile's top chunk: it stores the tile (else a partial)."""
        return select(self.in_dp, 1, ge(self.hi, (floordiv(self.sk_chunk, self.parts) + 1) * self.parts))

    @property
    def partial(self) -> IntExpr:
        """Whether this block's work on the tile is a partial tile for a higher block (not ``top``)."""
        return select(self.in_dp, 0, lt(self.hi, (floordiv(self.sk_chunk, self.parts) + 1) * self.parts))

    @property
    def slot(self) -> IntExpr:
        """This block's slot of the partial-sum workspace and its flag."""
        return self.bid

    @property
    def slots(self) -> int:
        return self.blocks

    def partner(self, p: IntExpr) -> IntExpr:
        """The slot of the ``p``-th partner whose partial sums are added (block ``bid - 1`` first)."""
        return self.bid - 1 - p

    def block_of(self, g: IntExpr) -> IntExpr:
        """The block whose stream-K range holds chunk ``g``."""
        return floordiv((g + 1) * self.blocks - 1, self.total)

    @property
    def partners(self) -> IntExpr:
        """How many lower-numbered blocks hold chunks of this step's tile (their partial sums are
        added in, block ``bid - 1`` first)."""
        first = floordiv(self.sk_chunk, self.parts) * self.parts
        return select(self.in_dp, 0, self.bid - self.block_of(first))


@attrs.frozen
class SplitFixup:
    """Split-K over the blocks of one launch, combined in it (``split_k(..., combine="fixup")``):
    ``parts`` blocks share each of ``tiles`` tiles, block (``tile``, ``kp``) computing part ``kp``
    from a zero accumulator.  The blocks of parts below the last store their partial sums in
    slot ``slot`` (a tile's parts consecutive) and add 1 to the tile's counter; the block of the
    last part waits for the count ``parts - 1``, adds the partial sums (part ``parts - 2``
    first) and stores the tile.  ``acc`` names the accumulator (set by the driver).  The fix-up
    rule (``lower.rules.stream_fixup``) reads it as it reads ``StreamK``."""

    parts: int
    kp: IntExpr
    tile: IntExpr
    tiles: int
    acc: str = ""
    # split_k(..., combine="cluster"): the parts are the ranks of a cluster, and the lower ones push
    # their partial sums into the top one's shared memory (no workspace, no counter)
    via_cluster: bool = False

    first = 1               # every block starts its tile from zero ...
    last = 1                # ... and ends its work on it
    kind = "split-K"
    counted = True              # one counter a tile, that every lower part adds to

    @property
    def strategy(self) -> str:
        """What users wrote, as the fix-up's errors and comments call it."""
        return f"split_k(..., combine={'cluster' if self.via_cluster else 'fixup'!r})"

    @property
    def slot(self) -> IntExpr:
        return self.kp + self.tile * self.parts

    @property
    def slots(self) -> int:
        return self.tiles * self.parts

    @property
    def top(self) -> IntExpr:
        return binop("==", self.kp, self.parts - 1)

    @property
    def partial(self) -> IntExpr:
        return lt(self.kp, self.parts - 1)

    @property
    def max_partners(self) -> int:
        return self.parts - 1

    @property
    def partners(self) -> int:
        return self.parts - 1

    def partner(self, p: IntExpr) -> IntExpr:
        return self.slot - 1 - p


def _or(a: IntExpr, b: IntExpr) -> IntExpr:
    return select(a, 1, b)


@attrs.frozen
class BlockOrder:
    grid: tuple[int, int, int]
    bindings: dict                          # loop var -> tile index expression
    tile_var: Var | None = None             # a persistent block's loop over its tiles
    tile_valid: IntExpr = 1
    cluster: ClusterInfo | None = None
    stream: StreamK | SplitFixup | None = None


def block_order(block_loops, node, target) -> BlockOrder:
    """The grid and the tile index of every block-mapped loop of ``block_loops`` ((loop, owner)
    pairs, outermost first)."""
    loops = [lp for lp, _ in block_loops]
    persistent = any(lp.persistent for lp in loops)
    cluster = max((lp.cluster for lp in loops), default=1)
    split_cluster = [lp for lp in loops if lp.fixup and lp.cluster > 1]
    if split_cluster:
        order = _split_cluster(loops, split_cluster[0], node, persistent)
    elif any(lp.stream for lp in loops):
        order = _stream_k(loops, node, target, cluster)
    elif cluster > 1:
        order = _clusters(loops, node, target, cluster, persistent)
    elif persistent:
        order = _persistent(loops, target, max((lp.align for m in node.walk() for lp in m.loops), default=0))
    else:
        order = _grid(loops, node)
    fixups = [lp for lp in loops if lp.fixup]
    if fixups and not split_cluster:
        order = _split_fixup(order, loops, fixups, node, cluster)
    if any(lp.reverse for lp in loops):
        # to_blocks(reverse=True): the same walk, each tile index counted down
        bind = dict(order.bindings)
        for lp in loops:
            if lp.reverse:
                bind[lp.var] = (lp.count - 1) - bind[lp.var]
        order = attrs.evolve(order, bindings=bind)
    for axis, limit in enumerate(GRID_LIMITS):
        if order.grid[axis] > limit:
            raise err(node, f"grid dimension {'xyz'[axis]} would be {order.grid[axis]} blocks",
                      field=f"gridDim.{'xyz'[axis]}", value=order.grid[axis], allowed=f"<= {limit}",
                      fix="use larger block tiles, or group=... in to_blocks() to put the M x N tiles on grid x")
    return order


def _grouped_index(t: IntExpr, Mt: int, Nt: int, G: int) -> tuple[IntExpr, IntExpr]:
    """(row-tile, column-tile) of linear tile ``t`` in groups of ``G`` row-tiles, column-major."""
    per_group = G * Nt
    first_m = _div(t, per_group) * G
    size_m = _min(Mt - first_m, G)
    local = _mod(t, per_group)
    return first_m + _mod(local, size_m), _div(local, size_m)


def _grid(loops, node) -> BlockOrder:
    grid = [1, 1, 1]
    bind = {}
    grouped = [lp for lp in loops if lp.group > 1]
    if grouped and len(loops) - max(len(grouped) - 1, 0) > 3:
        raise err(node, f"{len(loops)} loops mapped to blocks; the grid has 3 dimensions",
                  fix="tile some dimensions inside the block instead, or use group= to share grid x")
    if grouped:
        lm, ln = grouped
        rest = [lp for lp in loops if lp.group == 1]
        Mt, Nt, G = lm.count, ln.count, lm.group
        pid = ir.bid(0, Mt * Nt)
        bind[lm.var], bind[ln.var] = _grouped_index(pid, Mt, Nt, G)
        grid[0] = Mt * Nt
        for axis, lp in enumerate(reversed(rest), start=1):
            grid[axis] = lp.count
            bind[lp.var] = ir.bid(axis, lp.count)
    else:
        # loops of one tile take no grid dimension; beyond three, the outer ones share grid z
        # (row-major: batch and heads of attention, with the query tiles on x)
        live = list(loops)
        if len(loops) > 3:
            for lp in loops:
                if lp.count == 1:
                    bind[lp.var] = 0
            live = [lp for lp in loops if lp.count > 1]
        inner, outer = live[-2:] if len(live) > 3 else live, live[:-2] if len(live) > 3 else []
        for axis, lp in enumerate(reversed(inner)):
            grid[axis] = lp.count
            bind[lp.var] = ir.bid(axis, lp.count)
        if outer:
            z = 1
            for lp in outer:
                z *= lp.count
            grid[2] = z
            bind.update(_linear_tiles(outer, ir.bid(2, z)))
    return BlockOrder(tuple(grid), bind)


def _persistent(loops, target, phase: int = 0) -> BlockOrder:
    tiles = 1
    for lp in loops:
        tiles *= lp.count
    # one block per SM, or as many as to_blocks(occupancy=N) keeps resident on each
    blocks = min(tiles, target.sm_count * max(lp.occupancy for lp in loops))
    if phase > 1 and blocks > phase:
        # rows in an aligned window (align(c=vec)): a grid of a multiple of vec blocks walks rows
        # whose starts keep one phase in each block (row r + k * blocks starts k * blocks * cols
        # later), so what depends on the phase alone is done once a block (rules.threads.staged_run)
        blocks -= blocks % phase
    iters = -(-tiles // blocks)
    ti = Var("tile_i", iters)
    t = ir.bid(0, blocks) + ti * blocks
    bind = _linear_tiles(loops, t)
    valid = lt(t, tiles) if iters * blocks > tiles else 1
    return BlockOrder((blocks, 1, 1), bind, ti, valid)


def _stream_k(loops, node, target, cluster: int) -> BlockOrder:
    streams = [lp for lp in loops if lp.stream]
    tiles_of = [lp for lp in loops if not lp.stream]
    if len(streams) > 1:
        raise err(node, "two stream_k loops over one launch", fix="apply stream_k(...) once")
    if cluster > 1 or any(lp.reverse for lp in loops):
        what = "clusters" if cluster > 1 else "reverse=True"
        raise err(node, f"stream_k walks the grid in its own order; to_blocks({what}) cannot be combined with it",
                  field="to_blocks", value=what, fix="drop cluster= / reverse= from to_blocks(), or drop stream_k")
    sk = streams[0]
    p = sk.count
    tiles = 1
    for lp in tiles_of:
        tiles *= lp.count
    blocks = min(tiles * p, target.sm_count * max(lp.occupancy for lp in loops))
    # whole tiles for all but the last full wave; the rest (one to two waves) is stream-K's
    dp_tiles = max(tiles // blocks - 1, 0)
    total = (tiles - dp_tiles * blocks) * p
    dp = dp_tiles * p
    bid = ir.bid(0, blocks)
    lo = floordiv(bid * total, blocks)
    hi = floordiv((bid + 1) * total, blocks)
    unit = Var("unit", dp + -(-total // blocks))
    g = hi - 1 - (unit - dp)
    if dp:
        in_dp = lt(unit, dp)
        tile = select(in_dp, bid + floordiv(unit, p) * blocks, dp_tiles * blocks + floordiv(g, p))
        kc = select(in_dp, (p - 1) - mod(unit, p), mod(g, p))
    else:
        tile, kc = floordiv(g, p), mod(g, p)
    bind = {sk.var: kc, **_linear_tiles(tiles_of, tile)}
    valid = lt(unit, dp + hi - lo) if total % blocks else 1
    # a tile's chunks span at most ceil((parts - 1) / shortest range) + 1 blocks
    shortest = total // blocks
    partners = min(blocks - 1, -(-(p - 1) // shortest) + 1)
    info = StreamK(p, blocks, total, dp, bid, unit, lo, hi, tile, kc, partners)
    return BlockOrder((blocks, 1, 1), bind, unit, valid, stream=info)


def _split_fixup(order: BlockOrder, loops, fixups, node, cluster: int) -> BlockOrder:
    """The fix-up of ``split_k(..., combine="fixup")`` over ``order``'s walk: tile = the other
    block loops' tiles, row-major; slot ``kp + parts * tile``, so a tile's parts hold consecutive
    slots.  A part waits for the lower parts of its tile; their blocks come earlier in the walk
    (lower block ids: ``split_k`` comes before ``to_blocks``, so its loop is the outermost of the
    grid, and the GPU starts lower ids first), so it cannot deadlock."""
    if len(fixups) > 1:
        raise err(node, "two split_k(..., combine='fixup') loops over one launch", fix="apply split_k(...) once")
    # a persistent block walks several tiles: one of its top parts could wait for a partner that a
    # later block holds, which the interpreter (blocks one after another) cannot order
    persistent = order.tile_var is not None
    if order.stream is not None or cluster > 1 or persistent or any(lp.reverse for lp in loops):
        what = ("stream_k" if order.stream is not None else "cluster=" if cluster > 1
                else "persistent=True" if persistent else "reverse=True")
        raise err(node, f"split_k(..., combine='fixup') with {what}: the last part's block must come after the "
                        "others in the walk, one block a tile part", field="combine", value="fixup",
                  allowed="'launch' here", fix=f"drop {what}, or use split_k(..., combine='launch')")
    fx = fixups[0]
    tile, tiles = 0, 1
    for lp in reversed([lp for lp in loops if not lp.fixup]):
        tile = tile + order.bindings[lp.var] * tiles
        tiles *= lp.count
    return attrs.evolve(order, stream=SplitFixup(fx.count, order.bindings[fx.var], tile, tiles))


def _split_cluster(loops, kp, node, persistent: bool) -> BlockOrder:
    """``split_k(parts, combine="cluster")``: cluster ``t`` holds the ``parts`` K parts of tile ``t``
    of the other block loops (row-major, grouped loops in their grouped order), part = rank."""
    what = "split_k(..., combine='cluster')"
    others = [lp for lp in loops if lp is not kp]
    for other in others:
        if other.cluster > 1:
            raise err(node, f"{what} makes each tile's K parts a cluster; loop {other.var} is clustered too",
                      field="cluster", value=other.cluster, allowed="1", fix="to_blocks() without cluster=")
        if other.fixup or other.stream:
            raise err(node, f"{what} with another split of K over blocks (loop {other.var})", field="combine",
                      value="cluster", fix="apply one split_k(...) or stream_k(...)")
    if persistent:
        raise err(node, f"{what} with persistent=True: a tile's parts are the blocks of one cluster, one tile a "
                        "cluster", field="persistent", value=True, allowed="False",
                  fix="to_blocks() without persistent=, or split_k(..., combine='launch')")
    C = kp.count
    tiles = 1
    for lp in others:
        tiles *= lp.count
    bid = ir.bid(0, tiles * C)
    rank = _mod(bid, C)
    t = _div(bid, C)
    bind = {**(_linear_tiles(others, t) if others else {}), kp.var: rank}
    info = ClusterInfo(C, kp.dim, rank, None, 1, kp.exchange, split=True)
    return BlockOrder((tiles * C, 1, 1), bind, None, 1, info, SplitFixup(C, rank, t, tiles, via_cluster=True))


def _linear_tiles(loops, t: IntExpr) -> dict:
    """Tile indices of linear tile ``t``: grouped loops innermost in their grouped order, the
    others row-major outside them."""
    bind = {}
    grouped = [lp for lp in loops if lp.group > 1]
    rest = [lp for lp in loops if lp.group == 1] if grouped else list(loops)
    if grouped:
        lm, ln = grouped
        inner = lm.count * ln.count
        t_in = t if not rest else _mod(t, inner)
        bind[lm.var], bind[ln.var] = _grouped_index(t_in, lm.count, ln.count, lm.group)
        t = _div(t, inner) if rest else t
    stride = 1
    for i, lp in enumerate(reversed(rest)):
        idx = _div(t, stride) if stride > 1 else t
        bind[lp.var] = idx if i == len(rest) - 1 else _mod(idx, lp.count)
        stride *= lp.count
    return bind


def _clusters(loops, node, target, C: int, persistent: bool) -> BlockOrder:
    lm = next((lp for lp in loops if lp.cluster > 1), None)
    others = [lp for lp in loops if lp is not lm]
    if len(others) > 1:
        raise err(node, "clusters pair the tiles of the clustered loop with one other loop mapped to blocks",
                  fix="tile(m=..., n=...) >> to_blocks(cluster=2) with no other block loops")
    ln = others[0] if others else None
    Mt, Nt = lm.count, (ln.count if ln is not None else 1)
    Mg = -(-Mt // C)
    G = max(1, -(-lm.group // C))
    tiles = Mg * Nt
    # a persistent grid: as many clusters as the SMs hold at once, at least one (a target with fewer
    # SMs than a cluster has blocks still runs them, several blocks to an SM)
    clusters = min(tiles, max(1, target.sm_count * max(lp.occupancy for lp in loops) // C)) if persistent else tiles
    iters = -(-tiles // clusters)
    blocks = clusters * C
    bid = ir.bid(0, blocks)
    rank = _mod(bid, C)
    ti = Var("tile_i", iters) if persistent else None
    t = _div(bid, C) + (ti * clusters if ti is not None else 0)
    if G > 1:
        mg, ni = _grouped_index(t, Mg, Nt, G)
    else:
        mg, ni = _div(t, Nt), _mod(t, Nt)
    mi = mg * C + rank
    valid = lt(t, tiles) if iters * clusters > tiles else 1
    step = lm.step(lm.dim)
    info = ClusterInfo(C, lm.dim, rank, (Mt - 1) * step if Mt % C else None, lt(mi, Mt) if Mt % C else 1,
                       lm.exchange)
    bind = {lm.var: mi, **({ln.var: ni} if ln is not None else {})}
    return BlockOrder((blocks, 1, 1), bind, ti, valid, info)


def _min(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return minimum(a, b)


def _mod(a: IntExpr, b: IntExpr) -> IntExpr:
    return a % b if isinstance(b, int) else binop("%", a, b)


def _div(a: IntExpr, b: IntExpr) -> IntExpr:
    return a // b if isinstance(b, int) else binop("//", a, b)
