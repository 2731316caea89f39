"""Shared memory a TMA-store epilogue borrows: the rows of an operand tile its warpgroup has
finished reading.

A warp-specialized block whose consumer warpgroups each multiply their own 64 rows of a shared
operand (attention's Q: ``tile(q=64) >> to_warpgroups()`` over S = Q Kᵀ) no longer needs those
rows once the warpgroup's last wgmma group has completed, which the epilogue waits for before it
reads its accumulator.  The epilogue's staging buffers (``accumulators.store_via_tma``: for each
buffer b and warpgroup w, 64 rows x one 128-byte span) then fit in the operand's own bytes when
the operand is laid out in boxes of one span::

    Q_smem (128 x 128 f16, boxes of 64 columns)      staging (2 buffers x 2 warpgroups x 64x64)
    box 0: rows   0..63  (warpgroup 0) ........ =     buffer 0, warpgroup 0
           rows  64..127 (warpgroup 1) ........ =     buffer 0, warpgroup 1
    box 1: rows   0..63  (warpgroup 0) ........ =     buffer 1, warpgroup 0
           rows  64..127 (warpgroup 1) ........ =     buffer 1, warpgroup 1

so each warpgroup writes only rows it alone read.  Without it, attention's 128 x 128 tiles on a
three-stage K/V ring (224 KiB) have no room for 32 KiB of staging.

``borrowable`` proves the conditions from the schedule and the layouts, or returns None:

* no producer's tile ring refills the operand: it is written once, before the key loop (a
  persistent block's consumers refill it at the start of each tile, behind their barrier; the
  epilogue then waits until its stores have read the rows before it leaves the tile);
* it is one stage of the staging's element type, rows = 64 x the warpgroups, boxes of the span,
  and every staged (buffer, warpgroup, row, column) lands on the operand's element of that
  warpgroup's row (checked on the layouts' offsets);
* every node that reads it lies before the store in the schedule, is a MatMul (wgmma: asynchronous
  reads, complete once the warpgroup's groups are waited for), and sits under a loop that maps
  the store's row dim onto the same warpgroups in 64-row tiles.

The interpreter runs both names on the same elements (``ir.SharedBuffer.alias``), so a staging
write that meets a read still in flight or another warpgroup's read is reported as a race.
"""

from __future__ import annotations

from ... import ir
from ...schedule import Node
from ...spec import MatMul, Move
from ...tensor import SH, Level

WARPGROUP_ROWS = 64


def borrowable(lw, node: Node, ctx, rdim: str, cdim: str, nwg: int, buffers: int, cc: int, out_dt, swz):
    """The shared buffer whose bytes the staging of ``node`` (``buffers`` x ``nwg`` boxes of 64 x
    ``cc`` elements of ``out_dt``, element (b, w, r, j) at ``((b * nwg + w) * 64 + r) * cc +
    swz(r, j)``) may occupy, or None."""
    if ctx.tiles is not None:
        return None                   # the producer refills tiles on a ring of their own
    size = buffers * nwg * WARPGROUP_ROWS * cc
    for buf in lw.kb.shared.values():
        if isinstance(buf, ir.MBarrier) or buf.alias or buf.dtype != out_dt or buf.size < size:
            continue
        tile = _tile_of(lw, buf)
        if tile is None or tile.name in ctx.staged or buf.align < 1024:
            continue
        if _same_elements(lw, tile, rdim, cdim, nwg, buffers, cc, swz) and _read_by_own_warpgroup(
                lw, node, tile, rdim, nwg):
            return buf
    return None


def _tile_of(lw, buf):
    for t in lw.smem:
        if f"{t}_smem" == buf.name:
            for n in lw.pb.sched.nodes():
                for op in n.spec.operands:
                    if op.memory == SH and op.name == t:
                        return op
    return None


def _same_elements(lw, tile, rdim, cdim, nwg, buffers, cc, swz) -> bool:
    lay = lw.smem_layout(tile)
    if lay.stages != 1 or lay.col_dim != cdim or lay.box_cols != cc or lay.row_dims != (rdim,):
        return False
    if lay.rows != nwg * WARPGROUP_ROWS or lay.boxes < buffers:
        return False
    shape = dict(zip(tile.tensor.dims, tile.tensor.shape))
    for b in range(buffers):
        for w in range(nwg):
            for r in (0, 1, 5, 7, 8, 63):
                for j in (0, 7, 8, cc // 2 + 3, cc - 1):
                    row = lay.row({rdim: w * WARPGROUP_ROWS + r}, shape)
                    if lay.offset(row, b * cc + j) != ((b * nwg + w) * WARPGROUP_ROWS + r) * cc + swz(r, j):
                        return False
    return True


def _read_by_own_warpgroup(lw, store: Node, tile, rdim: str, nwg: int) -> bool:
    """Every reader of ``tile`` precedes ``store`` and reads it under a warpgroup loop over
    ``rdim`` in 64-row tiles (and only MatMuls read it)."""
    order = {id(n): i for i, n in enumerate(lw.pb.sched.nodes())}
    at = order.get(id(store))
    if at is None:
        return False
    ok = True
    seen = False

    def visit(n: Node, mapped: bool):
        nonlocal ok, seen
        reads = [op for op in n.spec.operands if op.memory == SH and op.name == tile.name]
        if isinstance(n.spec, Move) and n.spec.dst.memory == SH and n.spec.dst.name == tile.name:
            reads = []                # the copy that fills it
        here = mapped or any(lp.unit == Level.WARPGROUP and lp.count == nwg
                             and lp.step(rdim) == WARPGROUP_ROWS for lp in n.loops)
        if reads and (n.atom is not None or not n.children):
            seen = True
            if not (isinstance(n.spec, MatMul) and here and order[id(n)] < at):
                ok = False
        for c in n.children:
            visit(c, here)

    visit(lw.pb.sched.root, False)
    return ok and seen


__all__ = ["borrowable", "WARPGROUP_ROWS"]
