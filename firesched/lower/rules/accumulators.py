"""Accumulator rules: the ``Init`` of a register accumulator, and its store into global memory
(``Move RF -> GL``, or ``Reduce RF -> GL`` when partial results over units must be combined
first), with the epilogue's element-wise ops fused on the way.

The store walks the register layout of the accumulator: each thread visits its fragment values
in runs adjacent along the contiguous dim (pairs), applies the ops in f32 (loading the extra
tensors they read — a bias, a residual — with one vector load where the run allows), converts and
stores with one vector store where the row length keeps it aligned; everything is predicated
against the tensor's limits, so partial tiles need no special case::

    for each fragment tile (unrolled):  for each run of 2 values of this lane:
        epi = acc[r .. r+1];  epi += bias[col ..];  epi = relu(epi);  C[row, col ..] = cvt(epi)

Partial results over units (split-K across warps) are combined through shared memory first:
every part but the first writes its fragments, a barrier, the first part adds them up.

On sm_90a, inside warp-specialized consumer warpgroups, a wgmma accumulator goes through shared
memory and TMA stores instead (``store_via_tma``).
"""

from __future__ import annotations

import functools

import numpy as np

from ... import ir
from ... import ops as fops
from ...dtypes import f32, i32
from ...hardware.atoms import catalog, sm90a
from ...hardware.atoms.base import WGMMA
from ...ir.expr import IntExpr, Var, binop, ge, land, lt
from ...schedule import Node
from ...spec import Init, Move, Reduce
from ...tensor import GL, SH
from ..context import WARPGROUP_BARRIER, err, key, scope_barrier
from ..layouts import RFLayout, ThreadLayout, coord_table, value_runs
from ..lowerer import Lowerer, spec_rule
from .combine import components
from .partials import copies, zeroed_by_mma
from .smem import gl_offset, sh_offset, shared_buffer
from .stream_fixup import fixup, starts_tile
from .threads import store_thread_accumulator

LONG_FRAGMENT_RUNS = 4       # fragments with more runs iterate their repeated blocks in a loop
SPAN = 128                   # bytes of one 128B-swizzle row (a chunk of the TMA-store staging)
STORE_BUFFERS = 2            # TMA-store staging buffers per consumer warpgroup
EPILOGUE_BARRIER = WARPGROUP_BARRIER   # the warpgroup's own named barrier (warpgroup w uses 1 + w)


@spec_rule(Init, "RF")
def init_registers(lw: Lowerer, node: Node, ctx) -> list:
    lay = lw.reg_layout(node.spec.dst, node)
    if zeroed_by_mma(ctx, node.spec.dst.name, lay):
        return []
    size = lay.size * copies(ctx, node.spec.dst.name)      # (a copy per group: rules.partials)
    buf = lw.kb.reg(f"{node.spec.dst.name}_acc", node.spec.dst.dtype, size)
    value = node.spec.value
    if isinstance(value, tuple):
        # a monoid's accumulator: each component's registers start at its identity
        fills = [ir.RegFill(ir.RegRef(b, 0), lay.size, float(v)) for b, v in zip(components(lw, buf, len(value)), value)]
        return starts_tile(ctx, node.spec.dst.name, fills)
    return starts_tile(ctx, node.spec.dst.name, [ir.RegFill(ir.RegRef(buf, 0), size, float(value))])


@spec_rule(Move, "RF", "GL")
def store(lw: Lowerer, node: Node, ctx) -> list:
    return _store(lw, node, ctx, reduce_vars=())


@spec_rule(Reduce, "RF", "GL")
@spec_rule(Reduce, "RF", "SH")
@spec_rule(Reduce, "RF", "RF")
def combine_and_store(lw: Lowerer, node: Node, ctx) -> list:
    return _store(lw, node, ctx, reduce_vars=node.spec.axes)


def _store(lw: Lowerer, node: Node, ctx, reduce_vars) -> list:
    src, dst = node.spec.src, node.spec.dst
    lay = lw.reg_layout(src, node)
    acc = lw.kb.reg(f"{src.name}_acc", src.dtype, lay.size)
    out = _store_tile(lw, node, ctx, reduce_vars, lay, acc)
    if ctx.stream is not None and src.name == ctx.stream.acc and dst.memory == GL:
        return fixup(lw, node, ctx, acc, lay.size, out, reduce_vars)
    return out


def _store_tile(lw: Lowerer, node: Node, ctx, reduce_vars, lay, acc) -> list:
    spec = node.spec
    dst = spec.dst
    if isinstance(lay, ThreadLayout):
        return store_thread_accumulator(lw, node, ctx, lay, acc, reduce_vars)
    if dst.memory == SH:
        return store_to_shared(lw, node, ctx, lay, acc)
    room = _tma_staging(lw, node, ctx, lay)
    if room is not None:
        return store_via_tma(lw, node, ctx, lay, acc, lent=None if room is False else room)
    vars_, base, items, frag_loop = frag_iter(lw, ctx, lay)
    go = ctx.origin[key(dst)]
    glim = ctx.limit[key(dst)]
    out: list = [ir.Comment(f"{spec}")]
    rep = [(v, c) for v, c in lay.replicas if v in reduce_vars or not reduce_vars]
    if reduce_vars and rep:
        out += _unit_reduce(lw, node, ctx, lay, acc, vars_, base, items, rep, frag_loop)
    rdim, cdim = lay.dims
    # a run of fragment values lies along the accumulator's columns; where those are not C's
    # contiguous dim (Cᵀ = Bᵀ Aᵀ: the accumulator's rows are C's columns) a pair of lanes holding
    # adjacent rows swaps values so that each stores two along C's rows (row_partner), or each
    # value goes alone
    across = dst.tensor.major != cdim
    partner = row_partner(lay.tv) if across and dst.dtype.bits == 16 else None
    stmts = []
    for vs, coord, off in items:
        row = go[rdim] + coord[rdim]
        col = go[cdim] + coord[cdim]
        if across and partner is not None and len(vs) == 2:
            stmts += exchanged_pair(lw, ctx, node, acc, base + off, row, col, glim, partner, lay)
            continue
        if across:
            for j in range(len(vs)):
                stmts += epilogue_run(lw, ctx, node, ops_of(spec), acc, base + off + j, 1, dst, row, col + j, glim)
            continue
        stmts += epilogue_run(lw, ctx, node, ops_of(spec), acc, base + off, len(vs), dst, row, col, glim)
    body = ir.Seq(tuple(stmts))
    if frag_loop is not None:
        body = ir.For(frag_loop, frag_loop.extent, body, unroll=True)
    for v in reversed(vars_):
        body = ir.For(v, v.extent, body, unroll=True)
    if rep:
        body = ir.If(land(*[lt(ctx.vars[v], 1) for v, _ in rep]), body)
    out.append(body)
    return out


@spec_rule(Move, "RF", "SH")
def store_into_shared(lw: Lowerer, node: Node, ctx) -> list:
    return _store(lw, node, ctx, reduce_vars=())


def store_to_shared(lw: Lowerer, node: Node, ctx, lay: RFLayout, acc) -> list:
    """An MMA accumulator into a shared tile (a fused intermediate): each run of fragment values,
    through the ops in f32, converted and stored with one ``st.shared`` of the run (no predicate:
    on-chip tiles are whole)."""
    spec = node.spec
    dst = spec.dst
    if lay.replicas:
        raise err(node, "partial results over warps are combined on their way to global memory; this store goes "
                        "to shared memory", fix="drop split_k(..., across=WARP) from this part")
    for op in ops_of(spec):
        if op.extras():
            raise err(node, f"{op} reads an extra tensor; an on-chip intermediate's ops take constants only",
                      field="op", value=op, fix="apply the op where the intermediate is stored to global memory")
    vars_, base, items, frag_loop = frag_iter(lw, ctx, lay)
    go = ctx.origin[key(dst)]
    rdim, cdim = lay.dims
    sbuf = shared_buffer(lw, dst)
    out_dt = dst.dtype
    w = out_dt.bits // 8
    stmts = []
    for vs, coord, off in items:
        p = len(vs)
        work = lw.kb.reg("epi", f32, p)
        outr = lw.kb.reg(f"out_{out_dt.name}", out_dt, p)
        stmts += [ir.Pointwise("copy", ir.RegRef(work, j), (ir.RegRef(acc, base + off + j),)) for j in range(p)]
        stmts += apply_ops(lw, ctx, ops_of(spec), work, p, 0, 0, {})
        stmts += [ir.Pointwise("cvt", ir.RegRef(outr, j), (ir.RegRef(work, j),)) for j in range(p)]
        at = {rdim: go[rdim] + coord[rdim], cdim: go[cdim] + coord[cdim]}
        if p * w in (2, 4, 8, 16):
            stmts.append(ir.AtomCall(catalog.copy_atom("RF", "SH", p * w),
                                     (("dst", ir.MemRef(sbuf, sh_offset(lw, dst, ctx, at))), ("src", ir.RegRef(outr, 0))),
                                     comment=dst.name))
        else:
            for j in range(p):
                aj = {rdim: at[rdim], cdim: at[cdim] + j}
                stmts.append(ir.AtomCall(catalog.copy_atom("RF", "SH", w),
                                         (("dst", ir.MemRef(sbuf, sh_offset(lw, dst, ctx, aj))), ("src", ir.RegRef(outr, j))),
                                         comment=dst.name))
    body = ir.Seq(tuple(stmts))
    if frag_loop is not None:
        body = ir.For(frag_loop, frag_loop.extent, body, unroll=True)
    for v in reversed(vars_):
        body = ir.For(v, v.extent, body, unroll=True)
    return [ir.Comment(str(spec)), body]


def ops_of(spec) -> tuple:
    return tuple(getattr(spec, "ops", ()) or ())


@functools.lru_cache(maxsize=None)
def _repeat(tv) -> tuple[int, int, int] | None:
    """(values per block, row shift, col shift) when the fragment's values repeat in blocks whose
    coordinates shift by the same amount for every thread (wgmma's 64xN accumulator repeats an
    8-column block N/8 times); None otherwise."""
    nv, nt = tv.num_values, tv.num_threads
    table = coord_table(tv)
    for block in range(2, nv // 2 + 1):
        if nv % block:
            continue
        shift = table[0, block] - table[0, 0]
        blocks = table.reshape(nt, nv // block, block, 2)
        want = blocks[:, :1] + np.arange(nv // block)[None, :, None, None] * shift[None, None, None, :]
        if np.array_equal(blocks, want):
            return block, int(shift[0]), int(shift[1])
    return None


def frag_iter(lw: Lowerer, ctx, lay: RFLayout):
    """(unrolled loop vars, [(values, coordinate exprs relative to the tensor, register offset)],
    the loop over repeated value blocks or None) for every fragment run of this thread."""
    vars_ = [Var(f"f{lw.pb.tmp()}", c) for _, c, _ in lay.seq]
    origin = lay.unit_origin(vars_, ctx.vars)
    base = lay.offset({d: sum(v * s for (dd, c, s), v in zip(lay.seq, vars_) if dd == d) for d in lay.dims})
    tv = lay.tv
    lane = ctx.scope.tid % lay.atom.threads
    runs = value_runs(tv)
    rep = _repeat(tv) if len(runs) > LONG_FRAGMENT_RUNS else None
    items = []
    if rep is None:
        for vs in runs:
            r, c = tv.coord(lane, vs[0])
            items.append((vs, {lay.dims[0]: origin[lay.dims[0]] + r, lay.dims[1]: origin[lay.dims[1]] + c}, vs[0]))
        return vars_, base, items, None
    block, dr, dc = rep
    j = Var(f"f{lw.pb.tmp()}", tv.num_values // block)
    for vs in runs:
        if vs[0] >= block:
            break
        r, c = tv.coord(lane, vs[0])
        items.append((vs, {lay.dims[0]: origin[lay.dims[0]] + r + j * dr,
                           lay.dims[1]: origin[lay.dims[1]] + c + j * dc}, j * block + vs[0]))
    return vars_, base, items, j


def _unit_reduce(lw, node, ctx, lay, acc, vars_, base, items, rep, frag_loop=None) -> list:
    """Partial results over units (split-K across warps or warpgroups): parts 1.. write their
    fragments to shared memory, part 0 adds them up.  ``items`` may index the repeated value
    blocks of a long fragment through ``frag_loop`` (``frag_iter``), which then encloses them."""
    if len(rep) != 1:
        raise err(node, "split-K across warps can be applied once per block")
    (var, parts), = rep
    m, n = lay.shape
    red = lw.kb.shared_buf("splitk_smem", f32, (parts - 1) * m * n, 128, f"split-K partials {parts - 1} x {m}x{n} f32")
    kp = ctx.vars[var]
    st4 = catalog.copy_atom("RF", "SH", 4)
    ld4 = catalog.copy_atom("SH", "RF", 4)
    tmp = lw.kb.reg("splitk_tmp", f32, 1)
    rdim, cdim = lay.dims
    writes, reads = [], []
    for vs, coord, off in items:
        for j, _v in enumerate(vs):
            r, c = coord[rdim], coord[cdim] + j
            reg = ir.RegRef(acc, base + off + j)
            writes.append(ir.AtomCall(st4, (("dst", ir.MemRef(red, (kp - 1) * (m * n) + r * n + c)), ("src", reg))))
            for p in range(1, parts):
                roff = (p - 1) * (m * n) + r * n + c
                reads.append(ir.AtomCall(ld4, (("dst", ir.RegRef(tmp, 0)), ("src", ir.MemRef(red, roff)))))
                reads.append(ir.Pointwise("add", reg, (reg, ir.RegRef(tmp, 0))))

    def nest(stmts):
        b = ir.Seq(tuple(stmts))
        if frag_loop is not None:
            b = ir.For(frag_loop, frag_loop.extent, b, unroll=True)
        for v in reversed(vars_):
            b = ir.For(v, v.extent, b, unroll=True)
        return b

    return [ir.Comment(f"split-K over {parts} warp groups: reduce through shared memory"),
            ir.If(ge(kp, 1), nest(writes)), scope_barrier(ctx, "partials written"), ir.If(lt(kp, 1), nest(reads))]


@functools.lru_cache(maxsize=None)
def row_partner(tv) -> int | None:
    """The lane mask ``x`` (1, 2, 4, 8 or 16) of a fragment whose lane ``l ^ x`` holds, for every
    value, the element one row away in the same column, the even row in the lane whose bit ``x``
    is clear; None if no mask does.  The m16n8 C fragment and wgmma's D have ``x = 4``::

        lane l (bit 2 clear):   (r,   c) (r,   c+1)        after the swap:   (r, c) (r+1, c)
        lane l ^ 4:             (r+1, c) (r+1, c+1)                           (r, c+1) (r+1, c+1)
    """
    lanes, values = tv.num_threads, tv.num_values
    for x in (1, 2, 4, 8, 16):
        if x >= min(lanes, 32):
            break
        ok = True
        for lane in range(lanes):
            odd = (lane // x) % 2
            for v in range(values):
                r, c = tv.coord(lane, v)
                r2, c2 = tv.coord(lane ^ x, v)
                if r % 2 != odd or c2 != c or r2 != r ^ 1:
                    ok = False
                    break
            if not ok:
                break
        if ok:
            return x
    return None


def exchanged_pair(lw, ctx, node, acc, reg_off, row, col, glim, x, lay) -> list:
    """Store the pair of accumulator values at (row, col), (row, col + 1) of a ``Cᵀ`` fragment (the
    accumulator's rows are C's contiguous dim) as two elements adjacent along C's rows: the lane
    with the even row keeps column ``col`` and takes its partner's (lane ``^ x``, row + 1) value
    there; the partner keeps ``col + 1`` and takes this lane's.  One shuffle, and one vector store
    instead of two (``row_partner`` draws it)."""
    spec = node.spec
    dst = spec.dst
    rdim, cdim = lay.dims
    ops_ = ops_of(spec)
    vals = [lw.kb.reg(f"epi_{j}", f32, 1) for j in range(2)]
    out: list = []
    for j, w in enumerate(vals):
        out.append(ir.Pointwise("copy", ir.RegRef(w, 0), (ir.RegRef(acc, reg_off + j),)))
        out += apply_ops(lw, ctx, ops_, w, 1, row, col + j, glim)
    lane = ctx.scope.tid % 32
    odd = (lane // x) % 2
    even = lt(odd, 1)
    send, got = lw.kb.reg("swap_send", f32, 1), lw.kb.reg("swap_got", f32, 1)
    mask = lw.kb.reg("lane_mask", i32, 1)
    pair = lw.kb.reg("swap_pair", f32, 2)

    def copy(d, s):
        return ir.Pointwise("copy", d, (s,))

    out += [copy(ir.RegRef(send, 0), ir.RegRef(vals[0], 0)),
            ir.If(even, copy(ir.RegRef(send, 0), ir.RegRef(vals[1], 0))),
            ir.RegFill(ir.RegRef(mask, 0), 1, float(x)),
            ir.AtomCall(catalog.by_name("shfl_sync_bfly_b32"), (("dst", ir.RegRef(got, 0)), ("src", ir.RegRef(send, 0)),
                                                              ("lane_mask", ir.RegRef(mask, 0))),
                        comment=f"swap with lane ^ {x}: the neighbouring row's value of my column"),
            copy(ir.RegRef(pair, 0), ir.RegRef(got, 0)), copy(ir.RegRef(pair, 1), ir.RegRef(vals[1], 0)),
            ir.If(even, ir.Seq((copy(ir.RegRef(pair, 0), ir.RegRef(vals[0], 0)),
                                copy(ir.RegRef(pair, 1), ir.RegRef(got, 0)))))]
    gbuf = lw.kb.gbuf(dst, write=True)
    crow, ccol = col + odd, row - odd                  # C's row and its first column of the pair
    coord = {**ctx.origin.get(key(dst), {}), rdim: ccol, cdim: crow}
    goff = gl_offset(gbuf, dst.tensor, coord)
    return out + store_values(lw, pair, 2, dst.dtype, gbuf, goff, crow, ccol, glim, axes=(cdim, rdim))


# --------------------------------------------------------------------------- epilogue ops

def epilogue_run(lw, ctx, node, ops_, acc, reg_off, p, dst, row, col, glim) -> list:
    """Apply ``ops_`` to ``p`` adjacent accumulator values at (row, col..col+p-1) and store."""
    out_dt = dst.dtype
    gbuf = lw.kb.gbuf(dst, write=True)
    rdim, cdim = lw.pb.out_axes()
    coord = {**ctx.origin.get(key(dst), {}), rdim: row, cdim: col}
    goff = gl_offset(gbuf, dst.tensor, coord)
    stmts = []
    work = lw.kb.reg("epi", f32, p)
    for j in range(p):
        stmts.append(ir.Pointwise("copy", ir.RegRef(work, j), (ir.RegRef(acc, reg_off + j),)))
    stmts += apply_ops(lw, ctx, ops_, work, p, row, col, glim)
    return stmts + store_values(lw, work, p, out_dt, gbuf, goff, row, col, glim)


def apply_ops(lw, ctx, ops_, work, p, row, col, glim, preloaded=None) -> list:
    """The epilogue ops on ``p`` f32 registers of ``work`` (columns ``col`` .. ``col + p - 1`` of
    row ``row``).  Extra tensors are loaded here, ``p`` elements with one vector load where the row
    length allows it, unless ``preloaded`` maps the extra's name to f32 registers that already hold
    its ``p`` values (a bias shared by several rows of a fragment)."""
    stmts = []
    for op in ops_:
        for name, args in op.scalar():
            srcs_of = []
            for a in args:
                if isinstance(a, fops.Extra) and preloaded and a.name in preloaded:
                    srcs_of.append(preloaded[a.name])
                elif isinstance(a, fops.Extra):
                    xf, loads = load_extra(lw, ctx, a, p, row, col, glim)
                    stmts += loads
                    srcs_of.append(xf)
                else:
                    srcs_of.append(float(a))
            for j in range(p):
                srcs = [ir.RegRef(work, j)] + [ir.RegRef(x, j) if isinstance(x, ir.RegBuffer) else x
                                               for x in srcs_of]
                stmts.append(ir.Pointwise(name, ir.RegRef(work, j), tuple(srcs)))
    return stmts


def load_extra(lw, ctx, a, p, row, col, glim):
    """``p`` values of extra tensor ``a`` at (row, col .. col + p - 1) into new f32 registers:
    (the register buffer, the statements).  Out-of-range elements read as zero."""
    buf = lw.kb.extra_buf(a)
    xr = lw.kb.reg(f"x_{a.name}", buf.dtype, p)
    xf = lw.kb.reg(f"xf_{a.name}", f32, p)
    stmts = load_extra_raw(lw, ctx, a, p, row, col, glim, xr, 0)
    stmts += [ir.Pointwise("cvt", ir.RegRef(xf, j), (ir.RegRef(xr, j),)) for j in range(p)]
    return xf, stmts


def load_extra_raw(lw, ctx, a, p, row, col, glim, xr, off) -> list:
    """Loads of ``p`` values of extra tensor ``a`` at (row, col ..) into registers ``xr[off ..]``
    of its own dtype: one vector load when the p elements are contiguous, aligned and in range
    together (col a multiple of p, as fragment pairs are, and the row length a multiple of p)."""
    buf = lw.kb.extra_buf(a)
    w = buf.dtype.bits // 8
    rdim, cdim = lw.pb.out_axes()
    in_row = lt(row, glim[rdim])
    n_lim = glim[cdim]
    if a.kind == "vector_m":
        offs = [(row, in_row)] * p
    elif a.kind == "vector_n":
        offs = [(col + j, lt(col + j, n_lim)) for j in range(p)]
    else:
        out = lw.pb.output
        origin = ctx.origin.get((out.name, "GL"), {})
        dims = lw.pb.extra_dims(a)
        offs = []
        for j in range(p):
            coord = {**origin, rdim: row, cdim: col + j}
            o = 0
            for d, s in zip(dims, buf.strides):
                o = o + coord.get(d, 0) * s
            offs.append((o, land(in_row, lt(col + j, n_lim))))
    vec = (p > 1 and a.kind != "vector_m" and isinstance(n_lim, int) and n_lim % p == 0
           and buf.shape[-1] % p == 0 and (p * w) in (2, 4, 8, 16))
    if vec:
        return [ir.AtomCall(catalog.copy_atom("GL", "RF", p * w),
                            (("dst", ir.RegRef(xr, off)), ("src", ir.MemRef(buf, offs[0][0]))), offs[0][1],
                            comment=f"{a.name} for the epilogue")]
    return [ir.AtomCall(catalog.copy_atom("GL", "RF", w),
                        (("dst", ir.RegRef(xr, off + j)), ("src", ir.MemRef(buf, o))), pred,
                        comment=f"{a.name} for the epilogue") for j, (o, pred) in enumerate(offs)]


def store_values(lw, work, p, out_dt, gbuf, goff, row, col, glim, axes=None) -> list:
    """Convert ``p`` f32 registers to ``out_dt`` and store them at ``goff`` (one vector store when
    the row length keeps it aligned), predicated against the limits of ``axes`` (row dim, column
    dim; the output's epilogue axes by default)."""
    rdim, cdim = axes or lw.pb.out_axes()
    n_lim = glim[cdim]
    aligned = isinstance(n_lim, int) and n_lim % p == 0 and gbuf.shape[-1] % p == 0
    outr = lw.kb.reg(f"out_{out_dt.name}", out_dt, p)
    stmts = []
    for j in range(p):
        stmts.append(ir.Pointwise("cvt" if out_dt != f32 else "copy", ir.RegRef(outr, j), (ir.RegRef(work, j),)))
    w = out_dt.bits // 8
    if aligned and p > 1 and (p * w) in (2, 4, 8, 16):
        atom = catalog.copy_atom("RF", "GL", p * w)
        stmts.append(ir.AtomCall(atom, (("dst", ir.MemRef(gbuf, goff)), ("src", ir.RegRef(outr, 0))),
                                 land(lt(row, glim[rdim]), lt(col, n_lim)), comment=gbuf.name))
    else:
        atom = catalog.copy_atom("RF", "GL", w)
        for j in range(p):
            stmts.append(ir.AtomCall(atom, (("dst", ir.MemRef(gbuf, goff + j)), ("src", ir.RegRef(outr, j))),
                                     land(lt(row, glim[rdim]), lt(col + j, n_lim)), comment=gbuf.name))
    return stmts


# --------------------------------------------------------------------------- TMA-store epilogue

def _tma_staging(lw, node, ctx, lay):
    """Where the TMA-store epilogue stages, or None when the store goes from registers.

    The store goes through shared memory and TMA when a warp-specialized consumer warpgroup
    stores a wgmma accumulator into a C whose rows TMA can address (its consumer warpgroups
    synchronise among themselves with named barriers, so staging costs no block-wide barrier),
    and the staging has room: in bytes an operand's warpgroup has finished reading (that
    operand's buffer, ``borrow.borrowable``), or beside the kernel's other buffers within the
    target's limit (``False``: a buffer of its own)."""
    if not (ctx.specialized and lw.target.has_tma and lay.atom.family == WGMMA and not lay.replicas):
        return None
    if node.spec.dst.tensor.major != lay.dims[1]:
        return None             # the accumulator's columns are not C's rows (Cᵀ = Bᵀ Aᵀ)
    if staging(lw, node, lay) is None:
        return None
    lent = _borrowed(lw, node, ctx, lay)
    if lent is not None:
        return lent
    out_dt = lw.pb.gbuf(node.spec.dst).dtype
    own = ir.shared_bytes([*lw.kb.shared.values(), ir.SharedBuffer("C_smem", out_dt, _staging_elems(lw, node, lay),
                                                                   1024)])
    # 1 KiB: the barriers declared after it
    return False if own + 1024 <= lw.target.smem_per_block_optin else None


def _warpgroups(lay) -> int:
    nwg = 1
    for _d, c, _s, _v in lay.par:
        nwg *= c
    return nwg


def _staging_elems(lw, node, lay) -> int:
    return _warpgroups(lay) * STORE_BUFFERS * 64 * staging(lw, node, lay)


def _swizzled(ob: int):
    """Element offset, within a staging row of 128 bytes, of column ``j`` of row ``r``: the 16-byte
    chunk index XOR the row mod 8 (TMA's and wgmma's 128B swizzle, Swizzle<3,4,3> on bytes)."""
    def swz(r, j):
        byte = j * ob
        return (binop("^", byte // 16, r % 8) * 16 + byte % 16) // ob
    return swz


def _borrowed(lw, node, ctx, lay):
    """The operand buffer the staging of ``node`` occupies (``borrow.borrowable``), or None."""
    from .borrow import borrowable

    out_dt = lw.pb.gbuf(node.spec.dst).dtype
    if len(lay.par) != 1 or lay.par[0][0] != lay.dims[0] or lay.par[0][2] != 64:
        return None             # warpgroups not over the accumulator's rows in 64-row tiles
    return borrowable(lw, node, ctx, lay.dims[0], lay.dims[1], _warpgroups(lay), STORE_BUFFERS,
                      staging(lw, node, lay), out_dt, _swizzled(out_dt.bits // 8))


def staging(lw, node, lay):
    """(buffer size, tensor map, columns per chunk) of the TMA-store epilogue, or None where C
    cannot take TMA stores (rows not a multiple of 16 bytes, an output narrower than 16 bits, a
    tile that is no whole number of 128-byte chunks)."""
    dst = node.spec.dst
    gc = lw.pb.gbuf(dst)
    ob = gc.dtype.bits // 8
    if gc.dtype.bits < 16 or (gc.shape[-1] * ob) % 16 or len(gc.shape) not in sm90a.TMA_STORES:
        return None
    cc = SPAN // ob
    if lay.shape[1] % cc:
        return None
    return cc


def store_via_tma(lw, node, ctx, lay, acc, lent=None) -> list:
    """Registers -> swizzled shared memory -> TMA store, 64 rows x one 128-byte span of columns
    at a time, double-buffered per warpgroup::

        for each column chunk c (BN / span of them; counted on across a persistent block's tiles):
          thread 0 of the warpgroup: wait until its store of chunk c-2 has read its buffer
          barrier (the warpgroup's 128 threads)     # the buffer is free
          each thread: ops on its D pairs of chunk c, cvt, st.shared into buffer c % 2
          fence.proxy.async; barrier (warpgroup)   # the tile is visible to the async proxy
          thread 0 of the warpgroup: TMA store of the 64 x span box; commit

    TMA drops the parts of a box outside C, so edge tiles need no predicates.  A bias over N is
    loaded when the tile starts (in flight during the K loop) and parked in the warpgroup's shared
    copy, which the chunks read (``_vector_prefetch``).  The last stores are waited for when the
    role ends.  ``lent``: the operand buffer the staging occupies (``borrow.borrowable``), or
    None for bytes of its own."""
    spec = node.spec
    dst = spec.dst
    cc = staging(lw, node, lay)
    gc = lw.pb.gbuf(dst)
    out_dt = gc.dtype
    ob = out_dt.bits // 8
    BN = lay.shape[1]
    nwg = _warpgroups(lay)
    note = (f"{STORE_BUFFERS} buffers x {nwg} consumer warpgroups x 64x{cc} {out_dt}, 128B swizzle "
            f"(TMA-store staging)")
    size = _staging_elems(lw, node, lay)
    if lent is not None and "C_smem" not in lw.kb.shared:
        # in the rows of an operand each warpgroup has finished reading (borrow.py)
        lw.kb.add_shared(ir.SharedBuffer("C_smem", out_dt, size, 1024, note, alias=lent.name))
    buf = lw.kb.shared_buf("C_smem", out_dt, size, 1024, note)
    outer = dst.tensor.storage_dims[:-2]          # batch dims: boxes of extent 1
    tmap = lw.kb.param(ir.TensorMapParam(f"tmap_{gc.name}", gc, (1,) * len(outer) + (64, cc), SPAN), write=True)
    tma_store = sm90a.TMA_STORES[len(gc.shape)]
    lane = ctx.scope.tid % 128
    wg = ctx.scope.tid // 128
    go = ctx.origin[key(dst)]
    rdim, cdim = lay.dims
    m0 = go[rdim] + _par_offset(ctx, lay, rdim)
    n0 = go[cdim] + _par_offset(ctx, lay, cdim)
    glim = ctx.limit[key(dst)]
    lead = lt(lane, 1)
    pairs = cc // 8 * 2                       # D pairs of one thread inside one chunk
    work = lw.kb.reg("epi", f32, 2)
    outr = lw.kb.reg(f"out_{out_dt.name}", out_dt, 2)
    st = catalog.copy_atom("RF", "SH", 2 * ob)
    ops_ = ops_of(spec)
    vec_smem = _vector_prefetch(lw, ctx, node, lay, lane, wg, n0, nwg)
    out = [ir.Comment(f"{spec}: D fragments -> C_smem (128B swizzle) -> TMA store, {BN // cc} chunks of 64x{cc}")]
    nc = BN // cc
    shared_cols = [a for op in ops_ for _, args in op.scalar() for a in args if getattr(a, "kind", None) == "vector_n"]
    for c in range(nc):
        b = (ctx.tile_index * nc + c) % STORE_BUFFERS
        base = (b * nwg + wg) * 64 * cc
        # pairs 2i and 2i+1 of a thread hold the same two columns in rows r and r + 8: a bias over N
        # is loaded once for both
        q = Var(f"e{c}", pairs // 2)
        body = []
        pre = {}
        _, qcol = sm90a.d_coord(lane, c * pairs + 2 * q)
        for a in shared_cols:
            if a.name in pre:
                continue
            sbuf = vec_smem.get(a.name)
            if sbuf is None:
                pre[a.name], loads = load_extra(lw, ctx, a, 2, 0, n0 + qcol, glim)
                body += loads
                continue
            raw = lw.kb.reg(f"x_{a.name}", sbuf.dtype, 2)
            pre[a.name] = lw.kb.reg(f"xf_{a.name}", f32, 2)
            body.append(ir.AtomCall(catalog.copy_atom("SH", "RF", 2 * sbuf.dtype.bits // 8),
                                    (("dst", ir.RegRef(raw, 0)), ("src", ir.MemRef(sbuf, wg * BN + qcol))), 1,
                                    f"{a.name} of columns +{2} (shared copy)"))
            body += [ir.Pointwise("cvt", ir.RegRef(pre[a.name], j), (ir.RegRef(raw, j),)) for j in range(2)]
        for h in range(2):
            pair = c * pairs + 2 * q + h
            r, col = sm90a.d_coord(lane, pair)
            cw = col - c * cc                       # column inside the chunk
            swz = _swizzled(ob)(r, cw)          # Swizzle<3,4,3> on the 128-byte rows
            row_g, col_g = m0 + r, n0 + col
            body += [ir.Pointwise("copy", ir.RegRef(work, j), (ir.RegRef(acc, 2 * pair + j),)) for j in range(2)]
            body += apply_ops(lw, ctx, ops_, work, 2, row_g, col_g, glim, preloaded=pre)
            body += [ir.Pointwise("cvt" if out_dt != f32 else "copy", ir.RegRef(outr, j), (ir.RegRef(work, j),))
                     for j in range(2)]
            body.append(ir.AtomCall(st, (("dst", ir.MemRef(buf, base + r * cc + swz)),
                                         ("src", ir.RegRef(outr, 0))), 1, "C pair"))
        out += [
            ir.If(lead, _call(catalog.with_immediates(sm90a.tma_wait_read, n=STORE_BUFFERS - 1),
                              comment="the store that last used this buffer has read it")),
            ir.Barrier("the C_smem buffer is free", bar_id=EPILOGUE_BARRIER + wg, threads=128),
            ir.For(q, pairs // 2, ir.Seq(tuple(body)), unroll=True),
            _call(sm90a.fence_proxy_async, comment="st.shared -> visible to the TMA store"),
            ir.Barrier(f"chunk {c} is in C_smem", bar_id=EPILOGUE_BARRIER + wg, threads=128),
            ir.If(lead, ir.Seq((
                _call(tma_store, tmap=tmap, c0=ir.Scalar(n0 + c * cc), c1=ir.Scalar(m0),
                      **{f"c{i + 2}": ir.Scalar(go[d]) for i, d in enumerate(reversed(outer))},
                      src=ir.MemRef(buf, base), comment=f"C rows +64, columns {c * cc}..+{cc}"),
                _call(sm90a.tma_commit)))),
        ]
    if lent is not None and ctx.repeated:
        # a persistent block refills the borrowed operand at its next tile (behind the consumers'
        # barrier): the stores must have read the rows by then
        out.append(ir.If(lead, _call(catalog.with_immediates(sm90a.tma_wait_read, n=0),
                                     comment=f"the stores have read {lent.name}'s rows: the next tile may refill them")))
    if ctx.hoists is not None:
        # the block may end once its stores have read shared memory: their global writes complete
        # before the grid does (a dependent launch's griddepcontrol.wait sees them)
        end = ir.If(lt(lane, 1), _call(catalog.with_immediates(sm90a.tma_wait_read, n=0),
                                       comment="the last TMA stores have read shared memory"))
        if end not in ctx.hoists.scope_end:
            ctx.hoists.scope_end.append(end)
    return out


def _par_offset(ctx, lay, d) -> IntExpr:
    off: IntExpr = 0
    for dd, _c, s, var in lay.par:
        if dd == d:
            off = off + ctx.vars[var] * s
    return off


def _vector_prefetch(lw, ctx, node, lay, lane, wg, n0, nwg) -> dict:
    """Biases over N: each is loaded from global memory when a tile starts (two elements per
    consumer thread, in flight during the K loop) and stored after it into the warpgroup's shared
    copy of the tile's BN values, so that the epilogue reads shared memory instead of waiting on
    global loads.  Returns the shared buffers by name; the loads and stores go to the hoists."""
    if ctx.hoists is None:
        return {}
    BN = lay.shape[1]
    seen, bufs = set(), {}
    rdim, cdim = lw.pb.out_axes()
    out_t = lw.pb.output.tensor
    glim = {rdim: out_t.extent(rdim), cdim: out_t.extent(cdim)}
    mine = lt(lane, BN // 2)
    for op in ops_of(node.spec):
        for _, args in op.scalar():
            for a in args:
                if getattr(a, "kind", None) != "vector_n" or a.name in seen:
                    continue
                seen.add(a.name)
                dt = lw.kb.extra_buf(a).dtype
                sbuf = lw.kb.shared_buf(f"{a.name}_smem", dt, nwg * BN, 16, f"{a.name}[n0 .. n0+{BN}) per consumer "
                                                                            f"warpgroup")
                raw = lw.kb.reg(f"xt_{a.name}", dt, 2)
                ctx.hoists.tile_start.append(
                    ir.If(mine, ir.Seq(tuple(load_extra_raw(lw, ctx, a, 2, 0, n0 + 2 * lane, glim, raw, 0)))))
                ctx.hoists.before_post.append(
                    ir.If(mine, ir.AtomCall(catalog.copy_atom("RF", "SH", 2 * dt.bits // 8),
                                            (("dst", ir.MemRef(sbuf, wg * BN + 2 * lane)), ("src", ir.RegRef(raw, 0))),
                                            1, f"{a.name} for this tile's epilogue")))
                bufs[a.name] = sbuf
    return bufs


def _call(atom, comment="", pred=1, **args):
    return ir.AtomCall(atom, tuple(args.items()), pred, comment)
