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
* clusters (``cluster=C``): blocks ``C*i .. C*i + C-1`` form a thread-block cluster that takes C
  consecutive tiles of the clustered loop for one tile of the other (a MatMul: C row-tiles of
  one column of tiles, whose shared B tile is loaded once and multicast; a row reduction: the C
  parts of one row, combined through distributed shared memory).  When the row-tiles do not
  fill the last cluster, its spare blocks load a duplicate of the last row-tile and store nothing.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...ir.expr import IntExpr, Var, binop, lt, minimum
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


@attrs.frozen
class BlockOrder:
    grid: tuple[int, int, int]
    bindings: dict                          # loop var -> tile index expression
    tile_var: Var | None = None             # a persistent block's loop over its tiles
    tile_valid: IntExpr = 1
    cluster: ClusterInfo | None = None


def block_order(block_loops, node, target) -> BlockOrder:
    """The grid and the tile index of every block-mapped loop of ``block_loops`` ((loop, owner)
    pairs, outermost first)."""
    loops = [lp for lp, _ in block_loops]
    persistent = any(lp.persistent for lp in loops)
    cluster = max((lp.cluster for lp in loops), default=1)
    if cluster > 1:
        order = _clusters(loops, node, target, cluster, persistent)
    elif persistent:
        order = _persistent(loops, target)
    else:
        order = _grid(loops, node)
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


def _persistent(loops, target) -> BlockOrder:
    tiles = 1
    for lp in loops:
        tiles *= lp.count
    # one block per SM, or as many as to_blocks(occupancy=N) keeps resident on each
    blocks = min(tiles, target.sm_count * max(lp.occupancy for lp in loops))
    iters = -(-tiles // blocks)
    ti = Var("tile_i", iters)
    t = ir.bid(0, blocks) + ti * blocks
    bind = _linear_tiles(loops, t)
    valid = lt(t, tiles) if iters * blocks > tiles else 1
    return BlockOrder((blocks, 1, 1), bind, ti, valid)


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
    clusters = min(tiles, target.sm_count * max(lp.occupancy for lp in loops) // C) if persistent else tiles
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
    info = ClusterInfo(C, lm.dim, rank, (Mt - 1) * step if Mt % C else None, lt(mi, Mt) if Mt % C else 1)
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
