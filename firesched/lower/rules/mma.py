"""Atom rules of the MatMul families: ``mma.sync`` (warp, operands in registers) and ``wgmma``
(warpgroup, A and B read from shared memory through matrix descriptors, or A from registers).

An operand in registers is bound to the registers its layout gives the tile's origin; an operand
in shared memory is bound to a descriptor of the tile's start in the canonical layout the
producer left there (K-major rows one swizzle span long, or MN-major boxes one span wide)::

    K-major A, 128-byte span (64 f16 of k):  LBO unused (16), SBO = 8 rows x 128 B = 1024
    MN-major B, boxes of 64 n x BK k:        LBO = one box (BK x 128 B), SBO = 8 k-rows x 128 B

wgmma is asynchronous: the fence before it, the commit after it and the wait that retires it are
placed by the pipeline that feeds it (``transforms.pipeline``), or around the node here when no
pipeline encloses it.
"""

from __future__ import annotations

from ... import ir
from ...hardware.atoms import catalog, sm90a
from ...hardware.atoms.base import MMA, WGMMA
from ...hardware.descriptors import SWIZZLE_SPANS
from ...schedule import Node
from ...spec import MatMul
from ...tensor import RF, SH
from ..context import err, key
from ..layouts import matmul_operand_name
from ..lowerer import Lowerer, atom_rule
from .partials import accumulate, copies, copy_offset
from .smem import shared_buffer

MODES = SWIZZLE_SPANS


@atom_rule(MMA)
def mma_sync(lw: Lowerer, node: Node, ctx) -> list:
    spec: MatMul = node.spec
    args = {}
    for which, t in (("a", spec.a), ("b", spec.b), ("c", spec.c)):
        lay = lw.reg_layout(t, node)
        o = ctx.origin.get(key(t))
        if which == "c":
            # (an accumulator of group partial products has a copy per group: rules.partials)
            buf = lw.kb.reg(f"{t.name}_acc", spec.acc, lay.size * copies(ctx, t.name))
            args[which] = ir.RegRef(buf, copy_offset(ctx, spec, lay.size) + lay.offset(o))
            continue
        buf = lw.kb.reg(f"{t.name}_frag", t.dtype, lay.size)
        args[which] = ir.RegRef(buf, lay.offset(o))
    return [ir.AtomCall(node.atom, (("d", args["c"]), ("a", args["a"]), ("b", args["b"]), ("c", args["c"])),
                        comment=str(spec))]


@atom_rule(WGMMA)
def wgmma(lw: Lowerer, node: Node, ctx) -> list:
    spec: MatMul = node.spec
    atom = node.atom
    if not lw.target.has_wgmma:
        raise err(node, f"wgmma needs sm_90a; the target is {lw.target.name}", field="target",
                  value=lw.target.name, allowed="sm_90a", fix="check/compile with arch='sm_90a'")
    lay_c = lw.reg_layout(spec.c, node)
    acc = lw.kb.reg(f"{spec.c.name}_acc", spec.acc, lay_c.size * copies(ctx, spec.c.name))
    args = [("d", ir.RegRef(acc, copy_offset(ctx, spec, lay_c.size) + lay_c.offset(ctx.origin[key(spec.c)])))]
    if spec.a.memory == RF:
        lay_a = lw.reg_layout(spec.a, node)
        a_frag = lw.kb.reg(f"{spec.a.name}_frag", spec.a.dtype, lay_a.size)
        args.append(("a", ir.RegRef(a_frag, lay_a.offset(ctx.origin[key(spec.a)]))))
    else:
        args.append(("desc_a", descriptor(lw, node, ctx, spec.a, spec.k_dim, "A")))
    args.append(("desc_b", descriptor(lw, node, ctx, spec.b, spec.k_dim, "B")))
    args.append(("scale_d", ir.Scalar(accumulate(ctx, spec))))
    if not ctx.async_mma:
        # no pipeline retires this wgmma: fence, issue, commit and wait right here
        return [_call(sm90a.wgmma_fence), ir.AtomCall(atom, tuple(args), comment=str(spec)),
                _call(sm90a.wgmma_commit), _call(catalog.with_immediates(sm90a.wgmma_wait, n=0))]
    return [ir.AtomCall(atom, tuple(args), comment=str(spec))]


def descriptor(lw: Lowerer, node: Node, ctx, tile, k_dim: str, which: str) -> ir.DescRef:
    """The matrix descriptor of operand ``tile`` (in shared memory) at its current origin."""
    atom = node.atom
    if tile.memory != SH:
        raise err(node, f"wgmma reads {which} ({tile.name}) from shared memory; it is in {tile.memory}",
                  fix=f"move_to_smem({tile.name!r}, via=(sm90a.tma_load_2d,))")
    lay = lw.smem_layout(tile)
    eb = tile.dtype.bits // 8
    span = lay.span
    if span not in MODES:
        raise err(node, f"wgmma reads shared operands in a swizzled canonical layout; {tile.name}'s shared tile "
                        f"has none (it was not filled by TMA with a 32/64/128-byte swizzle)",
                  fix=f"move_to_smem({tile.name!r}, via=(sm90a.tma_load_2d,))")
    k_major = lay.col_dim == k_dim
    if which == "A" and (not k_major) != (sm90a.a_major(atom) == "MN"):
        a_mn = not k_major
        raise err(node, f"A is {'MN' if a_mn else 'K'}-major in shared memory, so wgmma reads it "
                        f"{'MN' if a_mn else 'K'}-major", field="atom", value=atom,
                  fix="use the _ss_tnspa variant (sm90a.wgmma_atom(n, dtype, a_mn_major=True))" if a_mn else
                      "use a K-major A variant")
    if which == "B" and (not k_major) != (sm90a.b_major(atom) == "MN"):
        b_mn = not k_major
        want = "the _tnspb variant" if b_mn else "the plain _ss variant"
        raise err(node, f"B is {'row' if b_mn else 'column'}-major, so wgmma reads it "
                        f"{'MN' if b_mn else 'K'}-major", field="atom", value=atom, fix=f"use {want}")
    if k_major and lay.box_cols * eb != span:
        # a K tile wider than the span is boxes of one span each; a k step of 16 stays in one box
        raise err(node, f"{tile.name}'s shared swizzle spans {span} bytes but its K tile is {lay.cols * eb} bytes: "
                        f"wgmma reads a K-major tile in boxes one swizzle span deep", field="swizzle",
                  value=tile.tensor.swizzle,
                  allowed=f"a {lay.cols * eb}-byte span ({', '.join(f'{w} B: tile(k={w // eb})' for w in MODES)})",
                  fix="drop swizzle= to let move_to_smem choose, or change tile(k=...)")
    o = ctx.origin[key(tile)]
    shape = dict(zip(tile.tensor.dims, tile.tensor.shape))
    start = lay.linear(lay.row(o, shape), o[lay.col_dim])
    stage = ctx.stage.get(tile.name, 0)
    if lay.stages > 1:
        start = stage * lay.stage_elems + start
    buf = shared_buffer(lw, tile)
    if k_major:
        return ir.DescRef(buf, start, span, 16, 8 * span)
    return ir.DescRef(buf, start, span, lay.rows * span, 8 * span)


def _call(atom, comment="", pred=1, **args):
    return ir.AtomCall(atom, tuple(args.items()), pred, comment)


__all__ = ["mma_sync", "wgmma", "descriptor", "matmul_operand_name"]
