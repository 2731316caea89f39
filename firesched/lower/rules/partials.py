"""Group scales on partial products: the rule of ``ScaleAdd`` and the register copies of the
partial products it folds (``scale_partials()``).

A dequantising move that leaves ``code - zero`` (``ops.group_scale(..., partials=True)``) feeds
a MatMul that accumulates each group of ``group_size`` k into a register copy of its own,
``C_groups[g]`` (zeroed by the ``Init`` before it); once the MMAs are done, each copy is
multiplied by its group's scale in f32 and added to the accumulator::

    C_groups[0..G) = 0                                   (mma.sync; a wgmma starts each copy
    for k16 in the K tile:                                with scale-d = 0 instead)
        C_groups[k16 / group] += B(k16) · A(k16)
    wgmma: commit, wait for the group                                      (rules.decompose)
    for g, each fragment value v of this thread:
        C[v] = fma(float(S[group g of the tile, row n of v]), C_groups[g][v], C[v])

A thread's fragment values (MMA accumulator layout) lie in few rows n — two of a wgmma's
``m64nNk16`` D fragment, ``lane / 4`` and ``lane / 4 + 8`` of its warp's 16 — so each group
costs the thread two scale loads and ``N / 2`` fma, where scaling every weight costs a multiply
a pair of weights: 32 ``mul.f16x2`` a thread for a 64 x 128 tile of weights.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...dtypes import f32
from ...hardware.atoms import catalog, sm90a
from ...hardware.atoms.base import WGMMA
from ...ir import rewrite as ir_rewrite
from ...ir.expr import IntExpr, minimum, to_c
from ...schedule import Node
from ...spec import ScaleAdd
from ...tensor import RF
from ..context import err, key
from ..layouts import coords
from ..lowerer import Lowerer, spec_rule
from .dequant import group_loads, lane_expr
from .threads import alignment


@attrs.frozen
class PartialGroups:
    """What a node whose ``post`` is a ``ScaleAdd`` tells the MMAs below it: their accumulator
    ``name`` has ``groups`` register copies, copy ``(k - base) // group`` for the k step at
    ``k`` of the dequantised operand (``operand`` in registers, along ``kdim``)."""

    groups: int
    group: int
    operand: str
    kdim: str
    base: IntExpr


def enter(ctx, node: Node):
    """``ctx`` for the children of ``node``: the partial copies its ``ScaleAdd`` post child folds."""
    adds = [p.spec for p in node.post if isinstance(p.spec, ScaleAdd)]
    if not adds:
        return ctx
    parts = dict(ctx.partials)
    for sa in adds:
        t = next((t for t in node.spec.operands if t.name == sa.operand and t.memory == RF), None)
        if t is None:
            raise err(node, f"the scaled partial products of {sa.src.name} are grouped by the k of {sa.operand} in "
                            f"registers, which {node.spec} does not read", field="operand", value=sa.operand)
        kdim = node.spec.k_dim
        ext = t.extent(kdim)
        group = ext // sa.groups if sa.groups > 1 else ext
        # the K tile (each copy's share of it) must start where a group starts: a K tile of 128 at
        # k = 64 (a split-K part of 64 k) straddles two groups of 128, each with its own scale
        gk = ctx.origin.get((sa.operand, "GL"), {}).get(kdim)
        need = min(group, sa.scale.group_size) if sa.scale.group_size else 0
        if need and gk is not None and alignment(gk) % need:
            raise err(node, f"{sa.operand}'s K tiles of {ext} start at k = {to_c(gk)}, not always a multiple of "
                            f"{need}: a tile's partial product would span two groups of {sa.scale.group_size} with "
                            f"different scales", strategy=node.strategy, field="k", value=ext,
                      allowed=f"K tiles (and split-K parts) starting at multiples of {need}",
                      fix="split K into parts of a multiple of the group size, a smaller K tile, or no "
                          "scale_partials()")
        parts[sa.src.name] = PartialGroups(sa.groups, group, sa.operand, kdim, ctx.origin[key(t)][kdim])
    return attrs.evolve(ctx, partials=parts)


def retire(ctx, node: Node, body: list, post: list) -> tuple[list, list]:
    """``node``'s body and post statements with what a ``ScaleAdd`` among its post children
    waits for when it reads partial products the body's wgmmas wrote: the group committed and
    done.  The post's leading statements that touch no register the wgmmas write (the loads of
    the scales and their conversions) go before the wait, so their latency hides under the
    wgmmas.  Synchronous MMAs need nothing."""
    if not ctx.async_mma or not any(isinstance(p.spec, ScaleAdd) for p in node.post):
        return body, post
    regs = {a.buffer.name for s in ir_rewrite.walk(body) if isinstance(s, ir.AtomCall) and s.atom.family == WGMMA
            for _n, a in s.args if isinstance(a, ir.RegRef)}
    if not regs:
        return body, post
    lead = 0
    while lead < len(post) and not _registers(post[lead]) & (regs | {"*"}):
        lead += 1
    wait = [ir.AtomCall(sm90a.wgmma_commit, ()),
            ir.AtomCall(catalog.with_immediates(sm90a.wgmma_wait, n=0), (),
                        comment="the group's partial products are done: they are scaled next")]
    return body + post[:lead] + wait, post[lead:]


def _registers(st) -> set:
    """The names of the register buffers statement ``st`` (and anything nested in it) touches;
    every name for a statement this does not know."""
    out = set()
    for s in ir_rewrite.walk([st]):
        if isinstance(s, ir.AtomCall):
            out |= {a.buffer.name for _n, a in s.args if isinstance(a, ir.RegRef)}
        elif isinstance(s, ir.Pointwise):
            out |= {r.buffer.name for r in (s.dst, *s.srcs) if isinstance(r, ir.RegRef)}
        elif isinstance(s, ir.RegFill):
            out.add(s.ref.buffer.name)
        elif not isinstance(s, (ir.Comment, ir.Seq, ir.For, ir.If, ir.Roles)):
            return {"*"} | out
    return out


def copies(ctx, name: str) -> int:
    """How many register copies accumulator ``name`` has (1 unless it holds partial products)."""
    pg = ctx.partials.get(name)
    return pg.groups if pg is not None else 1


def zeroed_by_mma(ctx, name: str, lay) -> bool:
    """Whether the MMAs zero accumulator ``name``'s copies (register layout ``lay``) themselves: a
    wgmma's first k step of each group starts from zero (``scale-d`` 0, ``accumulate``), so its
    ``Init`` writes nothing."""
    return name in ctx.partials and lay.atom.family == WGMMA


def accumulate(ctx, spec) -> IntExpr:
    """A wgmma's ``scale-d``: 0 on the first k step of a group's copy, which it starts; else 1."""
    pg = ctx.partials.get(spec.c.name)
    if pg is None:
        return 1
    t = next(t for t in spec.operands if t.name == pg.operand and t.memory == RF)
    return minimum((ctx.origin[key(t)][pg.kdim] - pg.base) % pg.group, 1)


def copy_offset(ctx, spec, size: int) -> IntExpr:
    """The register offset of the copy an MMA ``spec`` accumulates into (0 for a plain one)."""
    pg = ctx.partials.get(spec.c.name)
    if pg is None or pg.groups == 1:
        return 0
    t = next(t for t in spec.operands if t.name == pg.operand and t.memory == RF)
    return (ctx.origin[key(t)][pg.kdim] - pg.base) // pg.group * size


@spec_rule(ScaleAdd, "RF", "RF")
def scale_add(lw: Lowerer, node: Node, ctx) -> list:
    """``C += Σ_g float(S[g, n]) · C_groups[g]`` over this thread's accumulator values (see the
    module docstring)."""
    spec: ScaleAdd = node.spec
    sc = spec.scale
    lay_p = lw.reg_layout(spec.src, node)
    lay_c = lw.reg_layout(spec.dst, node)
    if lay_p.atom != lay_c.atom or lay_p.frag != lay_c.frag:
        raise err(node, f"{spec.src.name} and {spec.dst.name} are not fragments of one MMA atom",
                  field="dst", value=spec.dst)
    # the codes the scales go with: the operand's shared tile (or global, loaded straight into
    # registers), whose origin the dequantising move indexed them by
    src = next((k for k in ((spec.operand, "SH"), (spec.operand, "GL")) if k in ctx.origin), None)
    pg = ctx.partials.get(spec.src.name)
    if src is None or pg is None:
        raise err(node, f"a ScaleAdd folds the partial products of a MatMul over {spec.operand}'s codes, which "
                        f"scale_partials() puts before it; none encloses this one", field="operand",
                  value=spec.operand, fix="scale_partials() on the MatMul that reads the dequantised operand")
    kdim = pg.kdim
    ndim = next((d for d in lay_c.dims if d != kdim and d in dict(ctx.origin[src])), None)
    if ndim is None:
        raise err(node, f"{spec.dst.name} shares no dim with {spec.operand} but k", field="dst", value=spec.dst)

    # each value's row n: lane 0's, plus a shift that is the same for every value of the lane
    tv = lay_c.tv
    table = coords(tv)
    ni = lay_c.dims.index(ndim)
    n0 = [table[0][v][ni] for v in range(tv.num_values)]
    dn = []
    for lane in range(len(table)):
        shifts = {table[lane][v][ni] - n0[v] for v in range(tv.num_values)}
        if len(shifts) != 1:
            raise err(node, f"{lay_c.atom.name}'s accumulator rows differ from lane 0's by more than one shift",
                      field="atom", value=lay_c.atom.name)
        dn.append(shifts.pop())
    lane = ctx.scope.tid % lay_c.atom.threads
    ln = lane_expr(dn, lane, node, "row")

    # the fragment tiles of this node's tile, in registers of P (from 0) and of C (at its origin)
    f0, f1 = lay_c.frag
    shape = dict(zip(spec.dst.dims, spec.dst.shape))
    oc = ctx.origin[key(spec.dst)]
    op = ctx.origin[key(spec.src)]
    d0, d1 = lay_c.dims
    tiles = [{d0: r, d1: c} for r in range(0, shape[d0], f0) for c in range(0, shape[d1], f1)]
    size = lay_p.size
    keys, uses = [], []
    for g in range(spec.groups):
        for t in tiles:
            for v in range(tv.num_values):
                # group g's first k, from the codes' tile origin (which moves with this node's)
                keys.append((t[ndim] + n0[v], g * pg.group))
                uses.append((g, t, v))
    stmts: list = [ir.Comment(str(spec))]
    dtype = lw.kb.extra_buf(sc.extras()[0]).dtype
    reg, where = group_loads(lw, node, ctx, sc, 0, src, dtype, keys, ln, kdim, ndim, stmts, pairs=False)
    # one f32 copy of each scale, then the fmas
    sf = lw.kb.reg(f"{sc.name}_f32", f32, reg.size)
    stmts += [ir.Pointwise("cvt", ir.RegRef(sf, j), (ir.RegRef(reg, j),)) for j in sorted(set(where))]
    acc_p = lw.kb.reg(f"{spec.src.name}_acc", f32, size * spec.groups)
    acc_c = lw.kb.reg(f"{spec.dst.name}_acc", f32, lay_c.size)
    for (g, t, v), j in zip(uses, where):
        pc = lay_c.offset({d: oc[d] + t[d] for d in (d0, d1)}) + v
        pp = g * size + lay_p.offset({d: op[d] + t[d] for d in (d0, d1)}) + v
        stmts.append(ir.Pointwise("fma", ir.RegRef(acc_c, pc),
                                  (ir.RegRef(sf, j), ir.RegRef(acc_p, pp), ir.RegRef(acc_c, pc))))
    return stmts


__all__ = ["PartialGroups", "enter", "retire", "copies", "zeroed_by_mma", "accumulate", "copy_offset", "scale_add"]
