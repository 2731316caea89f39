"""Addresses of tiles: the shared buffer of a staged tensor and element offsets in it (through its
inferred layout), and element offsets in global tensors."""

from __future__ import annotations

from ... import ir
from ...ir.expr import IntExpr
from ..lowerer import Lowerer


def shared_buffer(lw: Lowerer, tile) -> ir.SharedBuffer:
    """The shared buffer of ``tile``'s tensor, laid out by ``lw.smem``."""
    t = tile.tensor
    lay = lw.smem_layout(tile)
    note = f"{lay.stages} stage(s) x {'x'.join(map(str, t.shape))} {t.dtype}"
    if lay.span:
        major = "K-major" if lay.boxes == 1 else f"boxes of {lay.box_cols} columns"
        note += f", {major}, {lay.span}B swizzle"
    elif t.swizzle is not None and t.swizzle.bits:
        note += f", {t.swizzle}"
    return lw.kb.shared_buf(f"{t.name}_smem", t.dtype, lay.size, lay.align, note)


def sh_offset(lw: Lowerer, tile, ctx, coord: dict[str, IntExpr]) -> IntExpr:
    """Element offset in ``tile``'s shared buffer of frame coordinate ``coord``."""
    lay = lw.smem_layout(tile)
    shape = dict(zip(tile.tensor.dims, tile.tensor.shape))
    r = lay.row(coord, shape)
    return lay.offset(r, coord[lay.col_dim], ctx.stage.get(tile.name, 0))


def gl_offset(buf: ir.GlobalBuffer, tensor, coord: dict[str, IntExpr]) -> IntExpr:
    """Element offset of global coordinate ``coord`` (missing dims at 0)."""
    off: IntExpr = 0
    for d, s in zip(tensor.storage_dims, buf.strides):
        off = off + coord.get(d, 0) * s
    return off
