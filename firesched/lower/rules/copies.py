"""Move rules between global, shared and register memory, each picking its atom from the layouts
around it.

* ``Move GL -> SH`` (``move_to_smem``): every thread of the scope copies 16-byte chunks (the widest
  ``cp.async`` that the row length and the tile width allow, or the atom ``via=`` names) into the
  shared layout, zero-filling what lies outside the tensor; rows that are not 4-byte aligned
  fall back to element copies through registers.  A ``via=`` TMA atom hands the move to the TMA
  rule (``tma``).
* ``Move SH -> RF`` (``move_to_regs``): the ldmatrix variant whose fragments are exactly the ones
  the consuming atom reads (checked lane by lane and value by value against the register
  layout); prologue ops run on the fragments right after the load.
"""

from __future__ import annotations

import functools
import math

import attrs

from ... import ir
from ...hardware.atoms import catalog, sm80, sm90a
from ...hardware.atoms.base import CP_ASYNC, LDMATRIX, Atom
from ...ir.expr import IntExpr, Var, land, lt, minimum
from ...ir.rewrite import substitute_stmt
from ...schedule import Node
from ...spec import Move
from ...tensor import WARP
from ..context import err, key, scope_barrier
from ..layouts import RFLayout, coords
from ..lowerer import Lowerer, spec_rule
from .dequant import dequant_to_registers
from .smem import gl_offset, sh_offset, shared_buffer
from .threads import alignment

QUANTISED = ("u4", "i4")     # codes the SH -> RF move dequantises

COPY_WIDTHS = (16, 8, 4)     # cp.async widths, widest first
SYNC_BATCH = 8               # elements a thread of an element copy keeps in flight (SyncCopy)
# widest first; of one width, the matrix orders the consumer's registers may take
LDMATRIX_ATOMS = (sm80.ldmatrix_x4, sm80.ldmatrix_x4_trans, sm80.ldmatrix_x4_cols, sm80.ldmatrix_x4_trans_cols,
                  sm80.ldmatrix_x2, sm80.ldmatrix_x2_trans, sm80.ldmatrix_x2_cols,
                  sm80.ldmatrix_x1, sm80.ldmatrix_x1_trans)


class SyncCopy:
    """An element-wise synchronous copy through a register (rows not 4-byte aligned)."""

    family = "sync_copy"

    def __init__(self, width: int):
        self.width = width

    def values_for(self, dt) -> int:
        return max(1, self.width * 8 // dt.bits)


@spec_rule(Move, "GL", "SH")
def global_to_shared(lw: Lowerer, node: Node, ctx) -> list:
    if ctx.units:
        unit_lp, by = ctx.units[-1]
        raise err(node, f"move_to_smem({node.spec.dst.name!r}) inside a loop mapped onto {unit_lp.unit}s ({by}): a copy "
                        "into a block's shared memory is issued by the whole block",
                  fix="stage the operands (move_to_smem, pipeline) before splitting the work over warps "
                      "(split_k(..., across=WARP), to_warps())")
    spec: Move = node.spec
    src, dst = spec.src, spec.dst
    if spec.ops or src.dtype != dst.dtype:
        # cp.async copies bytes: element-wise ops and conversions need the values in registers
        raise err(node, f"a block's copy into shared memory copies bytes; this move "
                        f"{'applies ' + ', '.join(map(str, spec.ops)) if spec.ops else 'converts'} on the way",
                  field="ops" if spec.ops else "dtype", value=spec.ops or f"{src.dtype} -> {dst.dtype}",
                  allowed="a move without ops between tiles of one dtype",
                  fix="map the move onto threads (tile(...) >> to_threads(), done()): each thread loads, "
                      "applies the ops in registers and stores to shared memory")
    t = src.tensor
    lay = lw.smem_layout(dst)
    cdim = lay.col_dim
    rows, cols = lay.rows, lay.cols
    eb = t.dtype.bits
    gbuf = lw.kb.gbuf(src)
    sbuf = shared_buffer(lw, dst)
    o = ctx.origin[key(src)]
    lim = ctx.limit[key(src)]
    ld = t.extent(cdim)
    T = ctx.scope.threads

    def chunks(vec: int, cpr: int, one_row: bool = False):
        """The copy in chunks of ``vec`` elements, ``cpr`` a row: (chunks, iterations, loop
        variable, chunk, its column, global coordinates, global and shared offsets);
        ``one_row``: the tile is one row (the chunks past it are not issued)."""
        total = rows * cpr
        iters = -(-total // T)
        it = Var(f"c{lw.pb.tmp()}", iters)
        chunk = it * T + ctx.scope.tid
        cc = chunk * vec if one_row else (chunk % cpr) * vec
        local = _rows_to_coords(lay, dst.tensor, 0 if one_row else chunk // cpr)
        local[cdim] = cc
        gcoord = {d: o[d] + local.get(d, 0) for d in t.storage_dims}
        soff = lay.offset(lay.row(local, dict(zip(dst.tensor.dims, dst.tensor.shape))), cc,
                          ctx.stage.get(dst.name, 0))
        return total, iters, it, chunk, cc, gcoord, gl_offset(gbuf, t, gcoord), soff

    window = _window_chunks(lw, node, ctx, src, lay, cdim, eb, chunks)
    if window is not None:
        atom, vec, (total, iters, it, chunk, cc, gcoord, goff, soff) = window
    else:
        # a buffer padded past the tile (place(..., pad=)): chunks must divide the tile itself, so
        # that none straddles its end into the next tile or past the tensor
        atom = copy_atom(node, math.gcd(cols, src.extent(cdim)) if cols > src.extent(cdim) else cols, ld, eb)
        vec = atom.values_for(t.dtype) if atom.family in (CP_ASYNC, "copy") else 1
        total, iters, it, chunk, cc, gcoord, goff, soff = chunks(vec, cols // vec)
    if atom.family == CP_ASYNC and not lw.target.supports(atom):
        raise err(node, f"{lw.target.name} has no cp.async to fill shared memory with", field="target",
                  value=lw.target.name, allowed="sm_80 and later", fix="check/compile for sm_80 or later")
    out: list = [ir.Comment(f"{spec}: {total} chunks of {vec} x {t.dtype} over {T} threads"
                            + (" (an aligned window: the row's last chunk partial)" if window else ""))]
    in_tile = lt(chunk, total) if total % T else 1
    in_bounds = land(*[lt(gcoord[d], lim[d]) for d in t.storage_dims if d in lim])
    if cols > src.extent(cdim):
        # a buffer padded past the tile (place(..., pad=)): its tail is zero-filled, not read
        # from the next tile's elements
        in_bounds = land(in_bounds, lt(cc, src.extent(cdim)))
    if atom.family == CP_ASYNC:
        # chunks outside the tensor are zero-filled by cp.async itself (src-size 0); chunks
        # outside the tile (when threads outnumber them) are not issued at all.  In an aligned
        # window a chunk reads up to the row's end (src-size), the rest zero-filled
        part = None if window is None else minimum(atom.width, (lim[cdim] - gcoord[cdim]) * (eb // 8))
        call = ir.AtomCall(atom, (("dst", ir.MemRef(sbuf, soff)), ("src", ir.MemRef(gbuf, goff))),
                           in_bounds, comment=f"{t.name} tile -> shared", src_bytes=part)
        out.append(ir.For(it, iters, call if in_tile == 1 else ir.If(in_tile, call), unroll=True))
    else:
        # element copies through registers, SYNC_BATCH of a thread's elements at a time: all of a
        # batch's loads are issued before its first store waits on one, so that a thread keeps
        # that many loads in flight (one load, then its store, would wait a memory latency per
        # element)
        batch = min(SYNC_BATCH, iters)
        outer = -(-iters // batch)
        tmp = lw.kb.reg(f"{t.name}_stage_tmp", t.dtype, vec * batch)
        ld_atom = catalog.copy_atom("GL", "RF", atom.width)
        st_atom = catalog.copy_atom("RF", "SH", atom.width)
        ob, j = Var(f"c{lw.pb.tmp()}", outer), Var(f"c{lw.pb.tmp()}", batch)
        load = ir.AtomCall(ld_atom, (("dst", ir.RegRef(tmp, j * vec)), ("src", ir.MemRef(gbuf, goff))),
                           land(in_tile, in_bounds), comment=f"{t.name}: unaligned rows, element copies "
                                                             f"{batch} at a time")
        store = ir.AtomCall(st_atom, (("dst", ir.MemRef(sbuf, soff)), ("src", ir.RegRef(tmp, j * vec))), in_tile)
        # the copy's iteration it = ob * batch + j; the last batch may reach past the thread's chunks
        load, store = (substitute_stmt(st, {it: ob * batch + j}) for st in (load, store))
        if outer * batch != iters:
            more = lt(ob * batch + j, iters)
            load, store = (attrs.evolve(st, pred=land(more, st.pred)) for st in (load, store))
        body = ir.Seq((ir.For(j, batch, load, unroll=True), ir.For(j, batch, store, unroll=True)))
        out.append(ir.For(ob, outer, body, unroll=True))
    if ctx.tile_copies is not None and dst.name in ctx.tile_copies.names:
        if atom.family != CP_ASYNC:
            how = getattr(atom, "name", "element copies")
            raise err(node, f"{dst.name} is copied one tile ahead (pipeline over the block's tile loop), but its "
                            f"copy goes element by element through registers ({how}, not cp.async: rows not "
                            "4-byte aligned, or a target without cp.async): only cp.async copies stay in flight "
                            "while the block computes", field="stages",
                      value=dst.tensor.stages, allowed="1 for this move",
                      fix="align(c=...) the row to 16-byte windows, or drop pipeline(...) over the tile loop")
        return ctx.tile_copies.record(node, out)
    if dst.name in ctx.staged:
        return out
    # no ring fills this tile: the copy is synchronous — the tile's previous readers are done
    # before it, and the tile has landed (for every thread) after it
    sync = [ir.AsyncCommit(), ir.AsyncWait(0)] if atom.family == CP_ASYNC else []
    if lay.span:
        # a wgmma reads this tile through the async proxy: the writers fence their copies first
        sync.append(ir.AtomCall(sm90a.fence_proxy_async, (), comment=f"{dst.name}_smem is visible to wgmma"))
    return [scope_barrier(ctx, f"the previous readers of {dst.name}_smem are done"), *out, *sync,
            scope_barrier(ctx, f"{dst.name}_smem is filled")]


def _window_chunks(lw, node: Node, ctx, src, lay, cdim: str, eb: int, chunks):
    """In an aligned window (``align(c=vec)``) the row's chunks start on the vector boundary at or
    before its first element, so they take whole ``cp.async`` chunks although the row length is
    no multiple of one (an odd row)::

        global:   | .. row r-1 ..|p ------ row r (cols elements) ------|.. row r+1 ..
        chunks:   [ 8 ][ 8 ][ 8 ] ... [ 8 ][ 8 ][ 8 ]                  (16 bytes each)
                  the first holds p elements of row r-1 (read, never used: the row's
                  reductions skip them); the last reads up to the row's end (src-size)

    The widest chunk whose every global offset ``alignment`` proves aligned and whose whole
    chunks fit the shared buffer: (atom, elements a chunk, ``chunks(...)``'s values), or None
    outside a window (or where no such chunk exists)."""
    if cdim not in ctx.shift or node.via or eb % 8:
        return None
    for w in COPY_WIDTHS:
        v = w * 8 // eb
        if v < 2:
            continue
        cpr = -(-src.extent(cdim) // v)
        if cpr * v > lay.cols:
            continue
        got = chunks(v, cpr, one_row=lay.rows == 1)
        if alignment(got[6]) * eb % (w * 8) == 0 and alignment(got[7]) * eb % (w * 8) == 0:
            return catalog.copy_atom("GL", "SH", w), v, got
    return None


def _rows_to_coords(lay, tensor, r: IntExpr) -> dict[str, IntExpr]:
    """Frame coordinates of flat row ``r`` over the layout's row dims (outermost first)."""
    out: dict[str, IntExpr] = {}
    shape = dict(zip(tensor.dims, tensor.shape))
    rest = r
    for i, d in enumerate(reversed(lay.row_dims)):
        if i == len(lay.row_dims) - 1:
            out[d] = rest
        else:
            out[d] = rest % shape[d]
            rest = rest // shape[d]
    return out


def copy_atom(node: Node, cols: int, ld: int, eb: int):
    """The widest chunk copy for a tile ``cols`` elements wide out of rows ``ld`` elements long.

    Tile origins along the contiguous dim are multiples of the tile width (and split-K parts
    multiples of 64), so whole chunks stay inside or outside the tensor when the row length and the
    tile width are multiples of the chunk."""
    user = node.via[0] if node.via else None
    for w in COPY_WIDTHS:
        v = w * 8 // eb
        if v and cols % v == 0 and ld % v == 0 and (user is None or user.width == w):
            a = catalog.copy_atom("GL", "SH", w)
            if user is None or user == a:
                return a
    if user is not None:
        raise err(node, f"{user!r} cannot copy this tile: rows of {ld} elements are not "
                        f"{user.width}-byte aligned or the tile width {cols} is not a multiple",
                  field="via", value=user, fix="drop via= to let firesched choose the widest legal copy")
    w = eb // 8
    if w < 1:
        raise err(node, f"sub-byte tensors need 16-byte aligned rows (row length {ld})")
    return catalog.copy_atom("GL", "SH", w) if w >= 4 else SyncCopy(w)


# --------------------------------------------------------------------------- GL -> RF

@spec_rule(Move, "GL", "RF")
def global_to_registers(lw: Lowerer, node: Node, ctx) -> list:
    """A warp's (or warpgroup's) operand fragment loaded straight from global memory: only the
    dequantising move of int4 codes does so (``rules.dequant``; each lane's words are contiguous
    in the packed tensor); other fragments come through shared memory (``ldmatrix``)."""
    src = node.spec.src
    if src.dtype.name not in QUANTISED:
        raise err(node, f"{src.name} is {src.dtype} in global memory: MMA fragments of it are loaded from shared "
                        f"memory (ldmatrix)", field="operand", value=src.name,
                  allowed="int4 codes (u4, i4) in GL; any operand in SH",
                  fix=f"apply move_to_smem({src.name!r}) at the block level first")
    return dequant_to_registers(lw, node, ctx)


# --------------------------------------------------------------------------- SH -> RF

@spec_rule(Move, "SH", "RF")
def shared_to_registers(lw: Lowerer, node: Node, ctx) -> list:
    spec: Move = node.spec
    src, dst = spec.src, spec.dst
    if src.dtype.name in QUANTISED:
        return dequant_to_registers(lw, node, ctx)
    lay = lw.reg_layout(dst, node)
    if spec.level != WARP:
        raise err(node, "register fragments are loaded per warp: apply move_to_regs after to_warps()",
                  field="level", value=str(spec.level), allowed="warp")
    rdim, cdim = src.tensor.storage_dims[-2:]
    candidates = [node.atom] if node.atom is not None else list(LDMATRIX_ATOMS)
    reasons = []
    for atom in candidates:
        if not lw.target.supports(atom):
            reasons.append(f"{atom.name}: {lw.target.name} has no ldmatrix")
            continue
        why = ldmatrix_fits(atom, lay, src, rdim, cdim)
        if why is None:
            return _emit_ldmatrix(lw, node, ctx, atom, lay, src, dst, rdim, cdim)
        reasons.append(f"{atom.name}: {why}")
    raise err(node, f"no ldmatrix delivers {dst.name}'s fragments in the layout "
                    f"{lay.atom.name} reads:\n    " + "\n    ".join(reasons),
              field="atom", value=node.atom,
              fix="drop atom= to let firesched choose, or stage the operand with the other majorness")


def ldmatrix_fits(atom: Atom, lay: RFLayout, src, rdim: str, cdim: str) -> str | None:
    """Why ``atom`` cannot load the fragments of ``lay`` from ``src`` (None when it can)."""
    if atom.family != LDMATRIX:
        return "not an ldmatrix"
    if src.dtype.bits != 16:
        return f"ldmatrix moves 16-bit elements, {src.name} is {src.dtype}"
    return _ldmatrix_tiles_fit(atom, lay, rdim, cdim)


@functools.lru_cache(maxsize=4096)
def _ldmatrix_tiles_fit(atom: Atom, lay: RFLayout, rdim: str, cdim: str) -> str | None:
    # remembered: a lowering asks this of every candidate atom at each operand load, and the
    # check walks every lane and value of every atom tile of the warp's part
    ar, ac = atom.operand("dst").tv.tile
    g = {rdim: ar, cdim: ac}
    part = lay.unit_part()
    for d in (rdim, cdim):
        if part[d] % g[d]:
            return f"its {ar}x{ac} tile does not divide the warp's {part[rdim]}x{part[cdim]} part"
    tv = atom.operand("dst").tv
    cs = coords(tv)
    owner = lay.owner_fn()
    for i0 in range(0, part[rdim], ar):
        for i1 in range(0, part[cdim], ac):
            base = None
            for lane in range(32):
                for v in range(tv.num_values):
                    r, c = cs[lane][v]
                    logical = {rdim: i0 + r, cdim: i1 + c}
                    own_lane, off = owner((logical[lay.dims[0]], logical[lay.dims[1]]))
                    if own_lane != lane:
                        return (f"lane {lane} would receive element {logical} that the consumer expects "
                                f"in lane {own_lane}")
                    if lane == 0 and v == 0:
                        base = off
                    elif off != base + v:
                        return "the values arrive in a register order the consumer does not use"
    return None


def _emit_ldmatrix(lw, node, ctx, atom, lay, src, dst, rdim, cdim) -> list:
    """One ldmatrix per atom tile of the warp's part, unrolled here so that each issue's first
    register is a constant (an x1/x2 issue may start inside a consumer fragment)."""
    ar, ac = atom.operand("dst").tv.tile
    part = lay.unit_part()
    rbuf = lw.kb.reg(f"{dst.name}_frag", dst.dtype, lay.size)
    sbuf = shared_buffer(lw, src)
    addr = atom.operand("src").addr
    lane = ctx.scope.tid % 32
    a_idx = addr(lane % addr.size())
    a_r, a_c = a_idx % ar, a_idx // ar
    so = ctx.origin[key(src)]
    r0, c0 = atom.operand("dst").tv.coord(0, 0)
    ops_ = tuple(getattr(node.spec, "ops", ()) or ())
    stmts: list = [ir.Comment(f"{node.spec}: {atom.name}")]
    for i0 in range(0, part[rdim], ar):
        for i1 in range(0, part[cdim], ac):
            first = {rdim: i0 + r0, cdim: i1 + c0}
            _, reg_off = lay.owner((first[lay.dims[0]], first[lay.dims[1]]))
            soff = sh_offset(lw, src, ctx, {rdim: so[rdim] + i0 + a_r, cdim: so[cdim] + i1 + a_c})
            stmts.append(ir.AtomCall(atom, (("dst", ir.RegRef(rbuf, reg_off)), ("src", ir.MemRef(sbuf, soff))),
                                     comment=f"{src.name} fragments for {lay.atom.name}"))
            for op in ops_:
                for name, args in op.scalar():
                    for v in range(atom.operand("dst").values):
                        r = ir.RegRef(rbuf, reg_off + v)
                        stmts.append(ir.Pointwise(name, r, (r, *args)))
    return stmts
