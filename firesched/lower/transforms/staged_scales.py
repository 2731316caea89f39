"""Group scales staged by a K loop's ring (cp.async or TMA), beside the operand tiles they scale.

A ``group_scale`` prologue op (``ops.group_scale``) reads one scale per (group, column) for every
K tile of an int4 operand.  Loaded from global memory inside the K loop, those loads sit on each
tile's critical path: an L2 round trip before the first multiply.  When the loop is a cp.async
ring, the op asks the ring to stage them instead: each stage gets the scale rows of its K tile for
the block's columns, copied with the tile's other chunks and waited for with them, and the
dequantising move (``rules.dequant``) reads them from shared memory::

    stage s:  B_smem[s]  (n x k codes)     S_smem[s]  (rows x n scales: rows = max(1, BK / group))
              issued together, one commit group, one wait, one barrier

In a TMA ring (``move_to_smem(..., via=tma)``, a warp-specialized producer) the stage's scales are
one more box, ``rows x n`` of the scale tensor, landing on the stage's *full* mbarrier with the
operand tiles: the producer announces their bytes with the tiles' (``scale_bytes``), so a consumer
that waited for the stage has its scales too::

    producer:  arrive.expect_tx(full[s], tile bytes + rows*n*2)
               TMA B tile -> B_smem[s];  TMA A tile -> A_smem[s];  TMA S box -> S_smem[s]
    consumer:  wait(full[s]);  ld.shared S_smem[s] ...; dequantise; wgmma; arrive(empty[s])

``plan_scales`` finds the ops and lays out the buffers (none where a row of scales cannot be
copied in 4-byte chunks, or a tensor map cannot describe the box, or the group and the K tile do
not nest: those keep the global loads); ``issue_scales`` (cp.async) and ``issue_scales_tma`` are
the producer's part for one tile.  The plans are handed to the dequantising move through
``Lowerer.notes["staged_scales"]``; a second role lowering the same loop (a warp-specialized
block's consumers) finds them there.
"""

from __future__ import annotations

import math

import attrs

from ... import ir
from ...hardware.atoms import catalog
from ...ir.expr import IntExpr, Var, _as_sum, land, lt
from ...ops import GroupScale
from ...schedule import Node
from ...spec import Move
from ...tensor import SH
from ..lowerer import Lowerer

COPY_WIDTHS = (16, 8, 4)


@attrs.frozen(eq=False)
class StagedScales:
    """The scales of ``op`` on operand ``src``: ``rows`` x ``cols`` a stage of ``buf``, copied
    ``width`` bytes a chunk; ``k_dim``/``n_dim`` are the operand's dims."""

    op: GroupScale
    extra: object          # the op's extra tensor staged (its scales, or its zero points)
    src: str
    buf: ir.SharedBuffer
    rows: int
    cols: int
    width: int
    k_dim: str
    n_dim: str
    tmap: ir.TensorMapParam | None = None     # the box's tensor map (a TMA ring), else cp.async chunks

    @property
    def stage_bytes(self) -> int:
        """Bytes one stage of the scales receives (what a TMA ring's producer announces)."""
        return self.rows * self.cols * self.buf.dtype.bits // 8

    def row(self, k_in_tile: IntExpr) -> IntExpr:
        """The stage's row holding the scale of k (relative to the K tile)."""
        return 0 if self.rows == 1 else k_in_tile // self.op.group_size

    def offset(self, stage: IntExpr, row: IntExpr, col: IntExpr) -> IntExpr:
        return stage * (self.rows * self.cols) + row * self.cols + col


def _alignment(x: IntExpr, step: int) -> int:
    """The largest power of two every value of ``x + i * step`` (any i) is a multiple of.  Every
    term of a sum is an integer (a variable, or ``bid_x % 2``, ``t // 4``, ...), so its coefficient
    divides it: a cluster's K part ``bid_x % 2 * 2048`` is 2048-aligned."""
    terms, const = _as_sum(x) if not isinstance(x, int) else ({}, x)
    g = step
    for c in terms.values():
        g = math.gcd(g, c)
    g = math.gcd(g, const)
    return g & -g if g else step


def plan_scales(lw: Lowerer, node: Node, moves: list, stages: int, ctx, lp, *, tma: bool = False
                ) -> list[StagedScales]:
    """The group scales read in ``node``'s K loop ``lp`` by dequantising moves of the tiles
    ``moves`` stage, laid out ``stages`` deep in shared memory (registered for the dequantising
    move), copied by cp.async chunks or (``tma``) one TMA box a stage.  A K tile must begin at a
    group's start or lie inside one group (its origins, from ``ctx``, are multiples of the tile or
    of the group): a split-K part that starts inside a group keeps the global loads."""
    tiles = {m.spec.dst.name: m.spec.dst.tensor for m in moves}
    known = lw.notes.get("staged_scales", {})
    plans: dict[str, StagedScales] = {}
    for n in node.walk():
        sp = n.spec
        if not (isinstance(sp, Move) and sp.src.memory == SH and sp.src.name in tiles):
            continue
        for op in sp.ops or ():
            if not isinstance(op, GroupScale) or any(p.op == op for p in plans.values()):
                continue
            t = tiles[sp.src.name]
            kd = t.major
            nd = next((d for d in t.dims if d != kd), None)
            if nd is None:
                continue
            bk, bn = t.extent(kd), t.extent(nd)
            gs = op.group_size or 0
            if gs and (gs % bk if gs >= bk else bk % gs):
                continue
            origin = ctx.origin.get((sp.src.name, "GL"), {}).get(kd)
            if gs and (origin is None or _alignment(origin, dict(lp.steps).get(kd, bk)) % min(gs, bk)):
                continue
            rows = 1 if not gs or gs >= bk else bk // gs
            for e in op.extras():                      # the scales, and the zero points if any
                if e.name in known and known[e.name].op == op:
                    plans[e.name] = known[e.name]      # planned by the loop's other role
                    continue
                gbuf = lw.kb.extra_buf(e)
                eb = gbuf.dtype.bits // 8
                width = next((w for w in COPY_WIDTHS if (bn * eb) % w == 0 and (gbuf.shape[1] * eb) % w == 0),
                             None)
                if width is None:
                    continue
                tmap = None
                if tma:
                    try:
                        tmap = ir.TensorMapParam(f"tmap_{e.name}", gbuf, (rows, bn))
                    except ValueError:
                        continue                       # no tensor map describes the box: global loads
                    lw.kb.param(tmap)
                buf = lw.kb.shared_buf(f"{e.name}_smem", gbuf.dtype, stages * rows * bn, 128 if tma else 16,
                                       f"{stages} stage(s) x {rows}x{bn} {gbuf.dtype} group {e.name}")
                plans[e.name] = StagedScales(op, e, sp.src.name, buf, rows, bn, width, kd, nd, tmap)
    lw.notes.setdefault("staged_scales", {}).update(plans)
    return list(plans.values())


def issue_scales(lw: Lowerer, ctx, plans: list[StagedScales], stage: IntExpr) -> list:
    """The producer's copies of the scales of the K tile the operands' origins in ``ctx`` are at,
    into ``stage``: every thread of the scope copies chunks; chunks past the tensor's rows or
    columns are zero-filled (cp.async with 0 source bytes)."""
    out: list = []
    for p in plans:
        gbuf = lw.kb.extra_buf(p.extra)
        G, N = gbuf.shape
        o = ctx.origin[(p.src, "GL")]
        g0 = 0 if not p.op.group_size else o[p.k_dim] // p.op.group_size
        per = p.width // (gbuf.dtype.bits // 8)
        cpr = p.cols // per
        total = p.rows * cpr
        T = ctx.scope.threads
        iters = -(-total // T)
        it = Var(f"c{lw.pb.tmp()}", iters)
        chunk = it * T + ctx.scope.tid
        r, cc = chunk // cpr, (chunk % cpr) * per
        row, col = g0 + r, o[p.n_dim] + cc
        call = ir.AtomCall(catalog.copy_atom("GL", "SH", p.width),
                           (("dst", ir.MemRef(p.buf, p.offset(stage, r, cc))), ("src", ir.MemRef(gbuf, row * N + col))),
                           land(lt(row, G), lt(col, N)), comment=f"{p.extra.name} rows of this K tile -> shared")
        body = call if total % T == 0 else ir.If(lt(chunk, total), call)
        out += [ir.Comment(f"{p.extra.name}: {total} chunks of {per} x {gbuf.dtype} over {T} threads"),
                ir.For(it, iters, ir.Seq((body,)), unroll=True)]
    return out


def issue_scales_tma(lw: Lowerer, ctx, plans: list[StagedScales], stage: IntExpr, bar: ir.MemRef) -> list:
    """The producer's TMA boxes of the scales of the K tile the operands' origins in ``ctx`` are
    at, into ``stage``, completing on ``bar`` (the stage's full mbarrier, whose expected bytes
    include ``StagedScales.stage_bytes``); rows and columns past the tensor arrive as zeros."""
    from ...hardware.atoms import sm90a

    out: list = []
    for p in plans:
        o = ctx.origin[(p.src, "GL")]
        g0 = 0 if not p.op.group_size else o[p.k_dim] // p.op.group_size
        out.append(ir.AtomCall(sm90a.tma_load_2d, (("dst", ir.MemRef(p.buf, p.offset(stage, 0, 0))),
                                                   ("tmap", p.tmap), ("c0", ir.Scalar(o[p.n_dim])),
                                                   ("c1", ir.Scalar(g0)), ("mbar", bar)),
                               comment=f"{p.extra.name} rows of this K tile ({p.rows}x{p.cols}) -> shared"))
    return out


__all__ = ["StagedScales", "plan_scales", "issue_scales", "issue_scales_tma"]
