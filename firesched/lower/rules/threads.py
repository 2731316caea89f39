"""Rules of a thread's element-wise work (``done()`` without an atom) and of the register
accumulators such work fills.

A leaf ``Pointwise``, ``Move`` or ``Reduce`` at the thread level holds a few elements per operand
(its tile).  Its rule loads each input tile into registers — the widest vector access that the
tile's contiguous extent, the origin's alignment and the tensor's row length allow, predicated
against the global limits (a whole vector is in or out when the row length is a multiple of it;
otherwise element by element) —, computes in f32 (broadcasting an input along the dims it lacks),
and stores the output tile the same way::

    Pointwise<thread>(add: X:GL f16[1x8], Y:GL f16[1x8] -> O:GL f16[1x8])
      ld.global.v4 X -> x[0..8];  ld.global.v4 Y -> y[0..8]
      o[i] = cvt(x[i] + y[i]) for i < 8;  st.global.v4 o -> O

A leaf ``Reduce`` folds its input into the register accumulator ``tile(<reduced dim>=...)`` made.
Units mapped over the reduced dims hold partial results of the same elements (``replicas`` of the
accumulator's layout); its store combines them: butterfly shuffles among the lanes of a warp, then
shared memory among warps, and the first replica stores::

    lanes:    acc = op(acc, shfl.bfly(acc, 16)); ... ; acc = op(acc, shfl.bfly(acc, 1))
    warps:    lane 0 of each warp -> smem[warp]; barrier; replica 0 folds the other warps; barrier
    cluster:  (the blocks of a cluster split the reduced dim) replica 0 -> its block's part;
              barrier.cluster; fold every block's part, ranks in order (ld.shared::cluster)
    store:    if every replica index is 0 (and, to global memory, in the cluster's first block):
              Y[...] = cvt(ops(acc))

A tuple reduction (``Reduce`` with a ``monoids.Monoid``) holds ``k`` registers per element and
folds a thread's elements with the monoid's passes; every level above moves the ``k`` components
together and merges them with the monoid's combine (``combine.Combine``), so it exchanges once
per level like a sum, and the store writes each output from the merged tuple.
"""

from __future__ import annotations

import math

import attrs

from ... import ir
from ... import ops as fops
from ...dtypes import f32, i32
from ...hardware.atoms import catalog, sm70, sm80, sm90a
from ...hardware.atoms import convert as cv
from ...hardware.atoms.base import CP_ASYNC
from ...ir.expr import BinOp, IntExpr, Select, Sum, Var, add, binop, free_vars, ge, land, lt, minimum, mod
from ...schedule import Node
from ...spec import Move, Pointwise, Reduce
from ...tensor import GL, RF, SH
from ..context import err, key
from ..layouts import ThreadLayout
from ..lowerer import Lowerer, leaf_rule
from .combine import COMBINE, Combine, combine_of, components, fold_elements, guarded
from .smem import gl_offset, sh_offset, shared_buffer

WIDTHS = (16, 8, 4, 2, 1)


def elements(tile) -> list[dict[str, int]]:
    """The local coordinates of a tile's elements, row-major over its dims."""
    out = [{}]
    for d, n in zip(tile.dims, tile.shape):
        out = [{**c, d: i} for c in out for i in range(n)]
    return out


SHIFTED_RUN = 8         # elements of a run shifted_run takes from two aligned vectors (16 bytes of 16-bit values)


def reg_index(tile, coord: dict[str, int]) -> int:
    """Register index of ``coord`` in a thread's copy of a memory ``tile``: row-major in the
    tensor's storage order (its major dim innermost), so that the elements one vector access moves
    sit in consecutive registers whichever dim is contiguous (a transposed output included)."""
    ext = dict(zip(tile.dims, tile.shape))
    i = 0
    for d in tile.tensor.storage_dims:
        if d in ext:
            i = i * ext[d] + coord.get(d, 0) % ext[d]
    return i


def alignment(e: IntExpr) -> int:
    """The largest power of two that divides ``e`` for every value of its variables (0 for 0)."""
    if isinstance(e, int):
        return e & -e if e else 1 << 30
    if isinstance(e, Sum):
        for t, c in e.terms:
            if isinstance(t, BinOp) and t.op == "%" and isinstance(t.b, int) and t.b > 0:
                # e = e' - c·m·(g // m) with e' = e - c·(g % m) + c·g: as aligned as both (an
                # aligned window's shift, -(s % m), next to the row's start s)
                rest = e - c * t + c * t.a
                return min(alignment(rest), alignment(c * t.b))
        g = 0 if e.const == 0 else e.const
        for t, c in e.terms:
            g = math.gcd(g, c * min(alignment(t), 1 << 20))
        return (g & -g) if g else 1 << 30
    if isinstance(e, BinOp) and e.op in ("min", "max"):
        # one of the two, whichever it is: a partial tile's limit, min(extent, origin + tile)
        return min(alignment(e.a), alignment(e.b))
    if isinstance(e, BinOp) and e.op == "*":
        return min(alignment(e.a) * alignment(e.b), 1 << 30)
    if isinstance(e, Select):
        return min(alignment(e.a), alignment(e.b))
    return 1


def _reg_of(lw: Lowerer, tile) -> ir.RegBuffer:
    lay = lw.reg_layout(tile)
    return lw.kb.reg(f"{tile.name}_acc", tile.dtype, lay.size)


def access(lw: Lowerer, ctx, tile, regs: ir.RegBuffer, *, write: bool, what: str, skip=None) -> list:
    """Load (``write=False``) or store the thread's ``tile`` of a global or shared tensor from / to
    ``regs[0 ..]`` in the tensor's storage order (``reg_index``), with the widest vectors the
    layout allows; in an aligned window (``align``: a lower limit along the row) the widest
    vectors the flat offset's alignment allows, the row's edge vectors element by element
    (``window_access``).  ``skip`` (a causal mask, for a load from global memory): a vector whose first
    element it masks is masked whole and is not loaded (its registers are overwritten by the
    mask)."""
    t = tile.tensor
    c = t.major
    eb = t.dtype.bits // 8
    if t.dtype.bits % 8:
        raise err(tile, f"{t.name}: element-wise leaves move whole bytes; {t.dtype} is packed",
                  fix="move 4-bit tensors through the int4 GEMM's dequantising moves")
    o = ctx.origin[key(tile)]
    n_c = tile.extent(c)
    runs = [e for e in elements(tile) if e[c] == 0]
    low: dict = {}
    if t.memory == GL:
        buf = lw.kb.gbuf(tile, write=write)
        lim = ctx.limit[key(tile)]
        low = ctx.low.get(key(tile), {})
        row_len = t.extent(c)
        lim_c = lim.get(c)
        # a whole vector is in or out of the tensor when the limit along the row is a multiple of
        # it for every block (checked below): a constant, or the limit of a partial parent tile
        # whose terms all are (min(cols, rank * part + part) of a cluster's part of the row)
        can_vec = lim_c is not None
    else:
        buf = shared_buffer(lw, tile)
        lay = lw.smem_layout(tile)
        row_len = lay.cols if lay.col_dim == c else 1
        lim, lim_c, can_vec = {}, None, lay.col_dim == c
    v = 1
    if can_vec:
        for w in WIDTHS:
            vv = w // eb
            if vv >= 1 and w >= eb and n_c % vv == 0 and row_len % vv == 0 and alignment(o[c]) % vv == 0 \
                    and (lim_c is None or alignment(lim_c) % vv == 0) and (t.memory != SH or _sh_chunk_ok(lay, vv, eb)):
                v = vv
                break
    window = 1
    if c in low:
        # an aligned window (align): vectors aligned in memory whose ends may reach past the row
        # into its neighbours'; such a vector goes element by element (window_access)
        starts = [gl_offset(buf, t, {d: o[d] + e.get(d, 0) for d in t.dims}) for e in runs]
        for w in WIDTHS:
            vv = w // eb
            if vv > v and w >= eb and n_c % vv == 0 and all(alignment(st) % vv == 0 for st in starts):
                window = vv
                break
    out = []
    for e in runs:
        if c in low and (window > 1 or (v == 1 and n_c > 1)):
            # in the window: aligned vectors, or (an operand along the row only, a weight, which
            # starts anywhere in it) the run's elements, unpredicated where all lie in the row
            step = window if window > 1 else n_c
            for j0 in range(0, n_c, step):
                local = {**e, c: j0}
                at = {d: o[d] + local.get(d, 0) for d in t.dims}
                elementwise = window_access(buf, t, at, step, regs, reg_index(tile, local), write, what, lim, low,
                                            skip, aligned=window > 1)
                if window == 1 and not write and skip is None and _shifts_whole_runs(ctx, t, step):
                    r0 = reg_index(tile, local)
                    staged = staged_run(lw, ctx, buf, t, at, regs, r0, what, lim, low)
                    out += staged if staged is not None else shifted_run(lw, ctx, buf, t, at, regs, r0, what, lim,
                                                                         low, elementwise)
                else:
                    out += elementwise
            continue
        for j0 in range(0, n_c, v):
            local = {**e, c: j0}
            r0 = reg_index(tile, local)
            coord = {d: o[d] + local.get(d, 0) for d in t.dims}
            if t.memory == GL:
                addr = ir.MemRef(buf, gl_offset(buf, t, coord))
                # (a causal load: the vector runs along the mask's columns, masked whole when its
                # first element is, so a causal row reads its visible part only)
                pred = land(_inside(t, coord, lim, low), _visible(skip, write, c, coord))
            else:
                addr = ir.MemRef(buf, sh_offset(lw, tile, ctx, {d: o[d] + local.get(d, 0) for d in t.dims}))
                pred = 1
            atom = _copy(t.memory.name, write, v * eb)
            args = (("dst", addr), ("src", ir.RegRef(regs, r0))) if write else (("dst", ir.RegRef(regs, r0)), ("src", addr))
            out.append(ir.AtomCall(atom, args, pred, comment=what))
    return out


def _visible(skip, write: bool, c: str, coord: dict) -> IntExpr:
    """For a load under causal mask ``skip`` along ``c``: whether the element at ``coord`` is
    visible (row + diagonal >= column), else 1."""
    if skip is None or write or skip.col != c or skip.row not in coord:
        return 1
    return lt(coord[c], coord[skip.row] + skip.diagonal + 1)


def _inside(t, coord: dict, lim: dict, low: dict) -> IntExpr:
    """Whether the element at global ``coord`` of ``t`` lies inside it: below every limit, and at
    or above the lower limits of an aligned window (``align``)."""
    return land(*[lt(coord[d], lim[d]) for d in t.storage_dims if d in lim],
                *[ge(coord[d], low[d]) for d in t.storage_dims if d in low])


def window_access(buf, t, coord: dict, v: int, regs: ir.RegBuffer, r0: int, write: bool, what: str,
                  lim: dict, low: dict, skip, aligned: bool = True) -> list:
    """One aligned vector of ``v`` elements of an aligned window (``align``) at ``coord``, where the
    row may begin or end inside the vector: the whole vector where all of it lies in the row, else
    its elements one by one, each where it lies in the row (a load leaves the others zero); not
    ``aligned`` (an operand along the row only, which starts anywhere), ``v`` element accesses
    unpredicated where all of them lie in the row::

        row r:          |<----------------- the row ----------------->|
        vectors:  | a b c [d e f g h] ... [i j k l m n o p] ... [q r s] t u v w x |
                    ^ row r-1's                                        ^ row r+1's
                  the first and the last vector: elements d..h and q..s only
    """
    c = t.major
    eb = t.dtype.bits // 8
    first, last = dict(coord), {**coord, c: coord[c] + (v - 1)}
    # (a causal load reads no vector whose first element the mask hides)
    whole = land(_inside(t, first, lim, low), _inside(t, last, lim, low), _visible(skip, write, c, coord))
    one = _copy("GL", write, eb)

    def call(atom, at, r, pred):
        mem = ir.MemRef(buf, gl_offset(buf, t, at))
        args = (("dst", mem), ("src", ir.RegRef(regs, r))) if write else (("dst", ir.RegRef(regs, r)), ("src", mem))
        return ir.AtomCall(atom, args, pred, comment=what)

    parts = []
    for j in range(v):
        at = {**coord, c: coord[c] + j}
        parts.append(call(one, at, r0 + j, land(_inside(t, at, lim, low), _visible(skip, write, c, at))))
    if not aligned:
        inner = tuple(attrs.evolve(p, pred=1) for p in parts)
        if whole == 1:
            return list(inner)
        return [ir.If(whole, ir.Seq(inner)), ir.If(binop("==", whole, 0), ir.Seq(tuple(parts)))]
    vec = _copy("GL", write, v * eb)
    if whole == 1:
        return [call(vec, coord, r0, 1)]
    # a store writes nothing of a vector wholly outside the row (a window's pass past its end):
    # its element stores are skipped under one test, not predicated off one by one (a load
    # still takes them, which leave its registers zero)
    edge = binop("==", whole, 0)
    if write:
        edge = land(edge, _touches(t, first, last, lim, low))
    return [call(vec, coord, r0, whole), ir.If(edge, ir.Seq(tuple(parts)))]


def _touches(t, first: dict, last: dict, lim: dict, low: dict) -> IntExpr:
    """Whether any element from ``first`` to ``last`` (consecutive along ``t.major``) lies inside
    ``t``: the first below the limits, the last at or above the lower ones (``_inside``)."""
    return land(*[lt(first[d], lim[d]) for d in t.storage_dims if d in lim],
                *[ge(last[d], low[d]) for d in t.storage_dims if d in low])


def _shifts_whole_runs(ctx, t, n: int) -> bool:
    """Whether the runs of ``n`` elements of ``t`` (an operand along the row only, in an aligned
    window) can come from the aligned 16-byte vectors holding them (``shifted_run``): a 1-d
    global tensor of a 16-bit type, runs of 8, a window of 8."""
    c = t.major
    return (t.memory == GL and t.dtype.bits == 16 and n == SHIFTED_RUN and len(t.storage_dims) == 1
            and ctx.shift.get(c, (0, 0))[1] == SHIFTED_RUN)


def shifted_run(lw: Lowerer, ctx, buf, t, coord: dict, regs: ir.RegBuffer, r0: int, what: str, lim: dict,
                low: dict, elementwise: list) -> list:
    """A run of 8 elements of an operand along the row only (a weight, a bias) in an aligned
    window: the window moved the row's frame back by its phase, so the run starts ``q`` elements
    into an aligned vector of the operand, the same ``q`` for every run of the block.  It loads
    the two aligned 16-byte vectors holding the run and takes values ``q .. q + 7``
    (``convert.shift_halves_b16x8``: selp and prmt) instead of eight 2-byte loads::

        W:        | w0 .. w7 | w8 .. w15 | w16 .. w23 | ...        (aligned vectors)
        window:      |<- the run: w5 .. w12 ->|                    q = 5
        lo, hi:   | w0 .. w7 | w8 .. w15 |   -> shift_halves(q = 5) -> w5 .. w12

    Where the pair would reach outside the operand (its last run) or the run outside the row,
    ``elementwise`` (``window_access``'s element loads) instead."""
    c = t.major
    shift, vec = ctx.shift[c]
    q = mod(shift + vec, vec)              # shift is -(the row's phase), in -(vec - 1) .. 0
    base = coord[c] - q
    pair = lw.kb.reg(f"{t.name}_pair", t.dtype, 2 * vec)
    ld = _copy("GL", False, vec * t.dtype.bits // 8)
    loads = tuple(ir.AtomCall(ld, (("dst", ir.RegRef(pair, k * vec)),
                                   ("src", ir.MemRef(buf, gl_offset(buf, t, {**coord, c: base + k * vec})))),
                              1, comment=f"{t.name}: the aligned vectors holding a run of the window")
                  for k in (0, 1))
    take = ir.AtomCall(cv.shift_halves_b16x8, (("d", ir.RegRef(regs, r0)), ("lo", ir.RegRef(pair, 0)),
                                               ("hi", ir.RegRef(pair, vec)), ("q", ir.Scalar(q))),
                       comment=f"{what}: values q .. q + 7 of the pair")
    inside = land(ge(coord[c], low.get(c, 0)), lt(base + 2 * vec - 1, lim[c]))
    # (in a rolled loop of many passes batch_loads hoists the pair's loads out of the branch,
    # predicated, and keeps several passes' of them in flight)
    return [ir.If(inside, ir.Seq((*loads, take))), ir.If(binop("==", inside, 0), ir.Seq(tuple(elementwise)))]


def staged_run(lw: Lowerer, ctx, buf, t, coord: dict, regs: ir.RegBuffer, r0: int, what: str, lim: dict,
               low: dict) -> list | None:
    """A run of 8 elements of an operand along the row only, in the aligned window of a
    persistent block whose rows all start at one phase (``to_blocks(persistent=True)`` with a grid
    of a multiple of 8 blocks, ``transforms.blocks``): the block shifts the whole operand once,
    before its first row, into a shared buffer in the window's frame (``_stage_window_raw``, zero
    outside the operand), and each row's run is one aligned 16-byte shared load::

        W (global):     | w0 .. w7 | w8 .. w15 | ...                       phase 3: q = 5
        W_win (shared): | 0 0 0 w0 .. w4 | w5 .. w12 | w13 .. w20 | ...    filled once a block
        a run:                            [  one ld.shared.v4  ]          every row of the block

    None where the block walks no tiles (not persistent), where the phase is not proved the same
    from tile to tile (a grid of other sizes), where the code is not the whole block's (a role
    of a warp-specialized block), or where the window cannot be filled from a raw copy
    (``_copies_raw``: no cp.async, or an operand of another form): ``shifted_run`` then."""
    tv = ctx.tile_index
    if not isinstance(tv, Var) or ctx.part is not None or ctx.specialized or ctx.scope is None \
            or ctx.scope.elected or ctx.scope.first:
        return None
    c = t.major
    shift, vec = ctx.shift[c]
    frame = [shift, *lim.values(), *low.values()]
    if any(tv in free_vars(e) for e in frame):
        return None
    if not _copies_raw(lw, buf, t, lim, low):
        return None
    eb = t.dtype.bits // 8
    n = -(-(t.extent(c) + vec - 1) // vec) * vec          # the window's length, whole vectors
    sbuf = lw.kb.shared.get(f"{t.name}_win")
    if sbuf is None:
        # (two vectors more than the window: the raw copy's, one before the operand and its last)
        sbuf = lw.kb.shared_buf(f"{t.name}_win", t.dtype, n + 2 * vec, 16,
                                f"{t.name} in the window's frame of this block's phase, shifted once a block")
        _stage_window_raw(lw, ctx, buf, t, sbuf, n)
    p = add(coord[c], -1 * shift)                         # the run's place in the window: aligned
    ld = _copy("SH", False, vec * eb)
    return [ir.AtomCall(ld, (("dst", ir.RegRef(regs, r0)), ("src", ir.MemRef(sbuf, p))), lt(p, n),
                        comment=f"{what}: the run, shifted once a block")]


#: the most window vectors a thread shifts between two barriers when a persistent window is filled
#: from its raw copy (``_stage_window_raw``): 8 registers each, before the block's rows hold any
RAW_SHIFT_BATCH = 6
#: ... and their pairs within a quarter of the registers the launch leaves a thread
RAW_SHIFT_SHARE = 4
#: the raw copy's atom: cached in L1, so that the blocks of an SM fetch the operand from L2 once
#: (the L2-only ``cp_async_16`` measured 1.26 times as slow at LayerNorm 4096 x 4095 on an H200;
#: blocks starting their copies at slots of their own instead of slot 0 measured the same)
RAW_COPY = sm80.cp_async_16_ca


def _copies_raw(lw: Lowerer, buf, t, lim: dict, low: dict) -> bool:
    """Whether a persistent window of ``t`` is filled from a raw copy (``_stage_window_raw``): the
    target has cp.async, ``t`` is a 1-d contiguous global operand and the window's limits are its
    own (zeros outside it, no other bound)."""
    c = t.major
    if CP_ASYNC not in lw.target.families or len(buf.shape) != 1 or tuple(buf.strides) != (1,):
        return False
    hi, lo = lim.get(c), low.get(c, 0)
    return isinstance(hi, int) and hi == t.extent(c) == buf.shape[0] and isinstance(lo, int) and lo == 0


def _stage_window_raw(lw: Lowerer, ctx, buf, t, sbuf, n: int) -> None:
    """The setup of ``staged_run`` where the target has cp.async (``_copies_raw``): the block
    copies the operand's aligned 16-byte vectors into ``sbuf`` as they are, one vector up, with
    zeros around them (the last vector partial: cp.async's src-size zero-fills it), then shifts
    each window vector in place from the two raw vectors holding it::

        W (global):   | w0 .. w7 | w8 .. w15 | ... | w4088 .. w4094 |          4,095 values
        slots:        |    0    |    1     |     2     | ... |      512        | 513, 514 |
        raw copy:     | 0 .. 0  | w0 .. w7 | w8 .. w15 | ... | w4088 .. w4094 0 | 0 .. 0 |
        phase 3 (q 5): window vector j = values 5 .. 12 of slots j, j + 1:
                      | 0 0 0 w0 .. w4 | w5 .. w12 | ...      (phase 0: slot j + 1 itself)

    The copies (cp.async, cached in L1: the blocks of an SM copy the same vectors) go out in a
    group of their own, which a block walking tiles issues before its first tiles' copies and
    waits for alone (``driver._window_copies_first``): the shift runs while those are in flight.
    Each window vector costs two shared loads, the shift (``convert.shift_halves_b16x8``) and a
    shared store; loading each run's two vectors from global memory into registers instead took
    about 80 instructions a vector and a memory round trip per batch of passes (bench/README.md,
    2026-11-29, measured on an H200).  Window vector j reads slot j + 1, which the thread of vector j + 1 overwrites:
    a batch of vectors reads all its slots, the block meets, then the batch writes (a later
    batch reads only slots above those an earlier one wrote)."""
    c = t.major
    shift, vec = ctx.shift[c]
    threads, tid = ctx.scope.threads, ctx.scope.tid
    eb = t.dtype.bits // 8
    extent = t.extent(c)
    slots = n // vec + 2
    # the raw copy: slot i holds the operand's vector i - 1 (slot 0 and those past it: zeros),
    # through L1 (the blocks of an SM read the same vectors)
    k = Var(f"{t.name}_win_raw", -(-slots // threads))
    i = k * threads + tid
    first = (i - 1) * vec
    inside = land(ge(i, 1), lt(first, extent))
    copy = ir.AtomCall(RAW_COPY, (("dst", ir.MemRef(sbuf, i * vec)), ("src", ir.MemRef(buf, first))), inside,
                       comment=f"{t.name}'s vector i - 1 as it is (zeros around it)",
                       src_bytes=minimum(extent - first, vec) * eb)
    raw = [ir.Comment(f"{t.name} copied as it is, a vector up, for its window ({t.name}_win)"),
           ir.For(k, k.extent, ir.If(lt(i, slots), copy) if k.extent * threads != slots else copy, unroll=True)]
    # the shift: window vector j = values q .. q + 7 of slots j + 1 + (shift - q) / vec and the next
    q = mod(shift + vec, vec)
    vectors = n // vec
    passes = -(-vectors // threads)
    # even batches of at most RAW_SHIFT_BATCH, their pairs within a quarter of the registers the
    # launch leaves a thread (RMSNorm's 8,191-column windows on 40 registers spilled 88 bytes with six)
    cap = lw.target.thread_regs(threads, lw.kb.min_blocks_per_sm)
    most = max(1, min(RAW_SHIFT_BATCH, cap // RAW_SHIFT_SHARE // (2 * vec * eb // 4)))
    batch = -(-passes // -(-passes // most))
    pair = lw.kb.reg(f"{t.name}_win_pair", t.dtype, 2 * vec * batch)
    run = lw.kb.reg(f"{t.name}_win_run", t.dtype, vec)
    b = Var(f"{t.name}_win_batch", -(-passes // batch))
    jj = Var(f"{t.name}_win_pass", batch)
    j = (b * batch + jj) * threads + tid
    live = land(lt(b * batch + jj, passes), lt(j, vectors))
    lo = add(j * vec, add(shift, -1 * q)) + vec
    ld = _copy("SH", False, vec * eb)
    reads = ir.For(jj, batch, ir.If(live, ir.Seq(tuple(
        ir.AtomCall(ld, (("dst", ir.RegRef(pair, jj * (2 * vec) + h * vec)), ("src", ir.MemRef(sbuf, lo + h * vec))),
                    comment=f"{t.name}: slot {'j + 1' if h else 'j'} of window vector j (q = 0: j + 1, j + 2)")
        for h in (0, 1)))), unroll=True)
    take = ir.AtomCall(cv.shift_halves_b16x8, (("d", ir.RegRef(run, 0)), ("lo", ir.RegRef(pair, jj * (2 * vec))),
                                               ("hi", ir.RegRef(pair, jj * (2 * vec) + vec)), ("q", ir.Scalar(q))),
                       comment=f"{t.name}: window vector j, values q .. q + 7 of its slots")
    st = ir.AtomCall(_copy("SH", True, vec * eb), (("dst", ir.MemRef(sbuf, j * vec)), ("src", ir.RegRef(run, 0))),
                     comment=f"{t.name}'s window vector j, in place")
    writes = ir.For(jj, batch, ir.If(live, ir.Seq((take, st))), unroll=True)
    shiftloop = ir.For(b, b.extent, ir.Seq((reads, ir.Barrier(comment=f"{t.name}: this batch's slots are read"),
                                            writes)))
    # the setup: every window's raw copy, one wait, the shifts, rebuilt as each operand adds its
    # part (a block walking tiles issues the copies before its tiles' and waits for them alone:
    # driver._window_copies_first)
    notes = lw.notes.setdefault("window_raw", {"copies": [], "shifts": [], "stmt": None})
    notes["copies"] += raw
    notes["shifts"] += [ir.Comment(f"{t.name} shifted into its window's frame in place"), shiftloop]
    setup = lw.notes.setdefault("setup", [])
    setup[:] = [x for x in setup if x is not notes["stmt"]]
    notes["stmt"] = ir.Seq((*notes["copies"], ir.AsyncCommit(), ir.AsyncWait(0),
                            ir.Barrier(comment="the operands' raw copies have landed"), *notes["shifts"],
                            ir.Barrier(comment="the windows are filled")))
    setup.append(notes["stmt"])


def _copy(mem: str, write: bool, width: int):
    return catalog.copy_atom("RF", mem, width) if write else catalog.copy_atom(mem, "RF", width)


def _sh_chunk_ok(lay, v: int, eb: int) -> bool:
    """A vector of ``v`` elements stays contiguous under the shared tile's swizzle (it permutes
    whole chunks of 2**base elements)."""
    sw = lay.swizzle
    return sw is None or not sw.bits or (1 << sw.base) % v == 0


def _operand_regs(lw: Lowerer, ctx, tile, stmts: list, prefix: str, skip=None):
    """The registers holding ``tile``'s elements for this thread (loading them if they are in
    memory; ``skip`` as ``access``'s), and a function from element coordinate to register
    offset."""
    if tile.memory == RF:
        lay = lw.reg_layout(tile)
        regs = _reg_of(lw, tile)
        o = ctx.origin[key(tile)]
        return regs, (lambda coord: lay.offset({d: o[d] + coord.get(d, 0) for d in tile.dims}))
    regs = lw.kb.reg(f"{prefix}_{tile.name}", tile.dtype, _count(tile))
    stmts += access(lw, ctx, tile, regs, write=False, what=f"{tile.name} for this thread", skip=skip)
    return regs, (lambda coord: reg_index(tile, coord))


def _count(tile) -> int:
    n = 1
    for s in tile.shape:
        n *= s
    return n


def scalar_steps(ops_) -> list[tuple[str, tuple]]:
    """The scalar steps of ``ops_``; a positional op (a mask) is one ``("mask", (op,))`` step.
    Ops that read an extra tensor are refused: element-wise leaves take it as an input."""
    steps = []
    for op in ops_:
        if getattr(op, "positional", False):
            steps.append(("mask", (op,)))
            continue
        for name, args in op.scalar():
            if any(isinstance(a, fops.Extra) for a in args):
                raise err(op, f"{op} reads an extra tensor; an element-wise leaf's ops take constants only",
                          fix="add the tensor as an input of the Pointwise instead")
            steps.append((name, args))
    return steps


def _elementwise(lw: Lowerer, node: Node, ctx, op: str, inputs, out, ops_) -> list:
    stmts: list = []
    steps = scalar_steps(ops_)
    # a move whose first step is a causal mask need not read what the mask replaces
    skip = steps[0][1][0] if op == "copy" and steps and steps[0][0] == "mask" and \
        isinstance(steps[0][1][0], fops.CausalMask) else None
    srcs = [_operand_regs(lw, ctx, t, stmts, "x", skip=skip) for t in inputs]
    # a plain move rounds each element once from its source (a bit copy between equal dtypes); a
    # masked move into shared memory between equal dtypes copies the bits and writes -inf over the
    # masked elements (no conversions through f32: the causal load of a staged softmax row, 5 %
    # faster in bf16 on an H100 at 65,536 columns; into registers it measured 2-5 % slower at
    # 20,480, so registers keep the conversions)
    direct = op == "copy" and not steps
    bits = op == "copy" and bool(steps) and all(n == "mask" for n, _ in steps) and out.memory == SH and \
        all(t.dtype == out.dtype for t in inputs)
    # two work registers: a pair of elements computed, then rounded into the output's 16-bit pair
    # by one instruction (transforms.pair_conversions)
    work = None if direct or bits else lw.kb.reg("w_pair", f32, 2)
    if out.memory == RF:
        y, y_at = _operand_regs(lw, ctx, out, [], "y")
    else:
        y = lw.kb.reg(f"y_{out.name}", out.dtype, _count(out))

        def y_at(coord):
            return reg_index(out, coord)
    where = _positions(node, ctx, (*inputs, out)) if any(n == "mask" for n, _ in steps) else None
    converts: list = []
    for i, e in enumerate(elements(out)):
        args = tuple(ir.RegRef(r, at(e)) for r, at in srcs)
        if direct or bits:
            stmts.append(ir.Pointwise("cvt", ir.RegRef(y, y_at(e)), args))
            for _, a in steps if bits else ():
                stmts += _mask(node, a[0], where(e), ir.RegRef(y, y_at(e)))
            continue
        w = ir.RegRef(work, i % 2)
        stmts.append(ir.Pointwise(op, w, args))
        for name, a in steps:
            if name == "mask":
                stmts += _mask(node, a[0], where(e), w)
                continue
            stmts.append(ir.Pointwise(name, w, (w, *a)))
        converts.append(ir.Pointwise("cvt", ir.RegRef(y, y_at(e)), (w,)))
        if len(converts) == 2:
            stmts += converts
            converts = []
    stmts += converts
    if out.memory != RF:
        stmts += access(lw, ctx, out, y, write=True, what=f"{out.name} of this thread")
    return [ir.Comment(str(node.spec)), *stmts]


def _positions(node: Node, ctx, tiles):
    """The kernel-level coordinates of the leaf's elements, for a positional op: a global operand
    over every dim of the output carries them (its origin is where the element sits in the
    kernel's tensor; an on-chip tile's origin is relative to its block)."""
    out = tiles[-1]
    for t in reversed(tiles):
        if t.memory == GL and set(out.dims) <= set(t.dims):
            o = ctx.origin[key(t)]
            return lambda e: {d: o[d] + e.get(d, 0) for d in out.dims}
    raise err(node, "a positional op (a mask) reads the element's coordinates, which this leaf takes from a global "
                    f"operand over all of {', '.join(out.dims)}; it has none",
              fix="apply the mask where the tensor is read from or written to global memory (e.g. the Move that "
                  "loads it)")


def _mask(node: Node, op, coord: dict, work: ir.RegRef) -> list:
    """``work = -inf`` where ``op`` (a ``CausalMask``) masks the element at ``coord``."""
    for d in (op.row, op.col):
        if d not in coord:
            raise err(node, f"{op} names dim {d!r}, which the masked tensor lacks (dims: {', '.join(coord)})",
                      field="ops", value=str(op), fix=f"ops.causal(row=..., col=...) with two of {', '.join(coord)}")
    masked = lt(coord[op.row] + op.diagonal, coord[op.col])
    fill = ir.RegFill(work, 1, float("-inf"))
    if isinstance(masked, int):
        return [fill] if masked else []
    return [ir.If(masked, fill)]


@leaf_rule(Pointwise)
def pointwise_leaf(lw: Lowerer, node: Node, ctx) -> list:
    spec: Pointwise = node.spec
    return _elementwise(lw, node, ctx, spec.op, spec.inputs, spec.out, spec.ops)


@leaf_rule(Move)
def move_leaf(lw: Lowerer, node: Node, ctx) -> list:
    spec: Move = node.spec
    return _elementwise(lw, node, ctx, "copy", (spec.src,), spec.dst, spec.ops)


@leaf_rule(Reduce)
def reduce_leaf(lw: Lowerer, node: Node, ctx) -> list:
    spec: Reduce = node.spec
    src, dst = spec.src, spec.dst
    if dst.memory != RF:
        raise err(node, f"a thread's part of a reduction folds into a register accumulator; {dst.name} is in "
                        f"{dst.memory}", fix=f"tile the reduced dims ({', '.join(spec.axes)}) first: tiling them "
                                              "creates the accumulator, and its store combines the threads' parts")
    stmts: list = []
    x, x_at = _operand_regs(lw, ctx, src, stmts, "x")
    lay = lw.reg_layout(dst)
    acc = lw.kb.reg(f"{dst.name}_acc", dst.dtype, lay.size)
    o = ctx.origin[key(dst)]
    m = spec.monoid
    op = COMBINE[spec.op] if m is None else None
    # an element past a global tensor's edge reads as zero: the identity of a sum, not of a max or
    # a min (nor an element a monoid may count), whose folds skip it; registers past a register
    # tensor's extent hold no element at all
    if src.memory == GL:
        lim = ctx.limit.get(key(src), {}) if op != "add" else {}
    elif src.memory == RF:
        # (nor, along a cluster's split dim, past the row's end in the last block: a limit that is
        # an expression, context._register_limits)
        pad = lw.reg_layout(src, node).padded_dims()
        lim = {d: v for d, v in ctx.limit.get(key(src), {}).items() if d in pad or not isinstance(v, int)}
    else:
        # a shared tile ends where the row does in a cluster's last block (its part may reach
        # past the row: lower.context._register_limits); the copy that filled it zeroed that end
        # (and a padded buffer's tile ends before the buffer: place(..., pad=))
        lim = {d: v for d, v in ctx.limit.get(key(src), {}).items()
               if not isinstance(v, int) or v < src.tensor.extent(d)}
    so = ctx.origin.get(key(src), {})
    # an aligned window's elements before the row (align): skipped like those past its end (a
    # global sum reads them as zero)
    low = {d: v for d, v in ctx.low.get(key(src), {}).items() if d in so and (src.memory != GL or op != "add")}
    # where the limit and the leaf's origin are multiples of the leaf's extent along a dim (a
    # cluster part ending on a whole vector), the leaf's elements there are all in or all out:
    # one predicate, the first element's, so that the folds share one branch
    whole = {d for d in lim if d in so and d not in low and alignment(lim[d]) % src.extent(d) == 0
             and alignment(so[d]) % src.extent(d) == 0}
    groups: dict[int, list] = {}
    folds: list = []
    for e in elements(src):
        v = lay.offset({d: o[d] + e.get(d, 0) for d in dst.dims})
        inside = land(*[lt(so[d] + (0 if d in whole else e.get(d, 0)), lim[d]) for d in src.tensor.storage_dims
                        if d in lim], *[ge(so[d] + e.get(d, 0), low[d]) for d in src.tensor.storage_dims if d in low])
        groups.setdefault(v, []).append((ir.RegRef(x, x_at(e)), inside))
        if m is None:
            r = ir.RegRef(acc, v)
            folds.append((ir.Pointwise(op, r, (r, ir.RegRef(x, x_at(e)))), inside))
    # in an aligned window (align) only the leaves at the row's two ends hold elements outside
    # it: a leaf tests its first and last element once, and folds them all unguarded where both
    # lie in the row
    ends = touches = None
    if low:
        head, tail = elements(src)[0], elements(src)[-1]
        ends = land(*[lt(so[d] + e.get(d, 0), lim[d]) for e in (head, tail) for d in src.tensor.storage_dims
                      if d in lim],
                    *[ge(so[d] + head.get(d, 0), low[d]) for d in src.tensor.storage_dims if d in low])
        # (whether any of the leaf's elements lies in the row: a leaf wholly past its end, a
        # window's last pass on most threads, folds nothing and skips its guarded fold)
        dims = [d for d in src.tensor.storage_dims if d in lim or d in low]
        touches = _touches(src.tensor, {d: so[d] + head.get(d, 0) for d in dims},
                           {d: so[d] + tail.get(d, 0) for d in dims}, lim, low)
    if m is not None:
        # whether every element of this fold is present unconditionally: where all of an
        # accumulator's folds are, every part of it counts the same elements (Combine.even)
        even = ends is None and all(p == 1 for xs in groups.values() for _, p in xs)
        lw.notes.setdefault("even_folds" if even else "uneven_folds", set()).add(acc.name)
    if m is None:
        stmts += _window_split(ends, [f for f, _ in folds], guarded(folds), touches)
    else:
        # a monoid folds the elements of each accumulator element as one tuple (its passes),
        # combined once into the running tuple
        accs = components(lw, acc, m.k)
        for v, xs in groups.items():
            preds = [p for _, p in xs]
            whole_fold = fold_elements(lw, m, accs, v, [a for a, _ in xs], [1] * len(xs))
            if ends is None and preds[0] != 1 and all(p == preds[0] for p in preds):
                # the elements are all in or all out (a whole vector, a cluster part ending on
                # one): the whole fold, its combine included, under the one test — absent
                # elements combine nothing, and present ones fold unguarded, so a count the fold
                # divides by is a constant (Welford's mean: a multiply, not a division)
                stmts.append(ir.If(preds[0], ir.Seq(tuple(whole_fold))))
                continue
            stmts += _window_split(ends, whole_fold, fold_elements(lw, m, accs, v, [a for a, _ in xs], preds),
                                   touches)
    return [ir.Comment(str(spec)), *stmts]


def _window_split(ends, whole: list, edge: list, touches=1) -> list:
    """``edge`` (the guarded statements), or in an aligned window ``whole`` where ``ends`` (the
    leaf's first and last elements lie in the row) and ``edge`` where not but ``touches`` (some
    element lies in it: a fold of no element changes nothing, so a leaf wholly outside the row
    skips it)."""
    if ends is None or whole == edge:
        return edge
    if ends == 1:
        return whole
    return [ir.If(ends, ir.Seq(tuple(whole))), ir.If(land(binop("==", ends, 0), touches), ir.Seq(tuple(edge)))]


# --------------------------------------------------------------------------- combine and store

def butterfly(lw: Lowerer, acc: ir.RegBuffer, size: int, masks, op: str | Combine) -> list:
    """``acc[v] = op(acc[v], acc[v] of lane ^ m)`` for each lane mask ``m`` in turn, for every
    register ``v < size``: after the last, every lane of a group holds the group's result.  With a
    ``Combine`` of ``k`` components, each is shuffled and the tuples combine once per mask."""
    if not masks:
        return []
    comb = op if isinstance(op, Combine) else Combine(1, op)
    accs = components(lw, acc, comb.k)
    tmp = lw.kb.reg("shfl", f32, comb.k)
    mask = lw.kb.reg("lane_mask", i32, 1)
    out: list = []
    for m in masks:
        out.append(ir.RegFill(ir.RegRef(mask, 0), 1, float(m)))
        for v in range(size):
            a = [ir.RegRef(c, v) for c in accs]
            b = [ir.RegRef(tmp, j) for j in range(comb.k)]
            for j, (r, t) in enumerate(zip(a, b)):
                if j in comb.kept:
                    continue                 # equal in every lane (Combine.kept)
                out.append(ir.AtomCall(sm70.shfl_sync_bfly_b32, (("dst", t), ("src", r),
                                                                ("lane_mask", ir.RegRef(mask, 0))), comment=f"lanes ^ {m}"))
            out += comb.step(lw, a, b)
    return out


def store_thread_accumulator(lw: Lowerer, node: Node, ctx, lay: ThreadLayout, acc: ir.RegBuffer,
                             reduce_vars) -> list:
    """Combine the replicas of a thread-held accumulator (see the module docstring) and store it,
    with the node's ops, from the first replica.  A monoid's accumulator moves its components
    together at every level (``combine.Combine``) and stores each of its outputs."""
    spec = node.spec
    dst = spec.dst
    comb = combine_of(spec)
    if comb is not None and comb.monoid is not None:
        # even: the accumulator's folds were all lowered, none of them skipping an element
        even = acc.name in lw.notes.get("even_folds", ()) and acc.name not in lw.notes.get("uneven_folds", ())
        comb = attrs.evolve(comb, even=even)
    op = comb
    rep = [(v, c) for v, c in lay.replicas if v in reduce_vars or not reduce_vars] if op is not None else []
    if lay.replicas and op is None:
        raise err(node, f"{spec.src.name} holds partial results over units ({', '.join(v for v, _ in lay.replicas)}) "
                        "but its store does not combine them", fix="reduce over the mapped dims (a Reduce spec)")
    k = comb.k if comb is not None else 1
    accs = components(lw, acc, k)
    outs = spec.output_ops() if isinstance(spec, Reduce) else ((dst, tuple(getattr(spec, "ops", ()) or ())),)
    out: list = [ir.Comment(str(spec))]
    # into a register local, every replica keeps the combined result (an all-reduce): the threads
    # that hold partial results are the threads that read the result next
    everyone = any(t.memory == RF for t, _ in outs)
    lane_masks, lane_digits, warp_parts = [], [], []
    for var, _count in rep:
        ts, c = ctx.spans[var]
        per_warp = max(1, 32 // ts) if ts < 32 else 1          # the units of var one warp holds
        lanes = min(c, per_warp)
        # the lanes of a warp halve their partial results (shuffles), so a warp's share is a power
        # of two; the warps' shares are folded through shared memory, any number of them
        if lanes & (lanes - 1) or c % lanes or (c > lanes and ts * lanes % 32):
            raise err(node, f"partial results over {c} units ({var}), {ts} threads apart: the lanes of a warp "
                            "combine theirs with shuffles that halve them, so the count must be a power of two "
                            "within a warp, or whole warps' worth beyond one", field=var, value=c,
                      fix=f"map a power-of-two number of units, or a multiple of the units one warp holds ({per_warp})")
        lane_masks += [ts << i for i in range(int(math.log2(lanes)))]
        if lanes > 1:
            lane_digits.append((ts, lanes))
        if c > lanes:
            # the part of the replicas beyond a warp: warps (ts * lanes) / 32 apart
            warp_parts.append((ts * lanes // 32, c // lanes))
    if lane_masks and ctx.scope.threads < 32:
        raise err(node, f"the partial results of {dst.name} are combined across lanes with warp shuffles, which need "
                        f"whole warps; the block has {ctx.scope.threads} threads", field="threads",
                  value=ctx.scope.threads, allowed=">= 32", fix="map at least 32 threads per block")
    out += butterfly(lw, acc, lay.size, sorted(lane_masks, reverse=True), op)
    tid = ctx.scope.tid
    if warp_parts:
        W = ctx.scope.threads // 32
        # warp w's partial result, component j of element v, at (w * k + j) * size + v
        n = lay.size
        red = lw.kb.shared_buf(f"{dst.name}_partials", f32, W * k * n, 16,
                               f"{dst.name}'s partial results, one set per warp"
                               + (f" ({k} components each)" if k > 1 else ""))
        warp = tid // 32
        lane0 = land(*[lt((tid // ts) % lanes, 1) for ts, lanes in lane_digits])
        st = catalog.copy_atom("RF", "SH", 4)
        ld = catalog.copy_atom("SH", "RF", 4)
        # the warps of one group of replicas, as offsets from its first: every combination of the
        # warp-level digits (more than one when several mapped loops reach past a warp)
        groups = [0]
        for wstride, wc in warp_parts:
            groups = [g + j * wstride for j in range(wc) for g in groups]
        tree = everyone and comb.monoid is not None and len(groups) > 2
        if tree and len(groups) & (len(groups) - 1):
            # lanes that fold two warps' results meet lanes that fold one (below): their counts
            # differ, so every component is exchanged (none is kept)
            comb = op = attrs.evolve(comb, even=False)
        # (a component every warp holds alike, Combine.kept, is neither written nor read)
        moved = [j for j in range(k) if j not in comb.kept]
        writes = [ir.AtomCall(st, (("dst", ir.MemRef(red, (warp * k + j) * n + v)), ("src", ir.RegRef(accs[j], v))))
                  for v in range(n) for j in moved]
        first = land(*[lt(ctx.vars[vv], 1) for vv, _ in rep])
        part = lw.kb.reg("part", f32, k)
        if everyone:
            # every warp folds its group's partial results in the same order (the group's first
            # warp first), so that every replica holds bitwise the same result
            base = warp
            for wstride, wc in warp_parts:
                base = base - ((warp // wstride) % wc) * wstride
            reads = [ir.AtomCall(ld, (("dst", ir.RegRef(accs[j], v)), ("src", ir.MemRef(red, (base * k + j) * n + v))))
                     for v in range(n) for j in moved]
        else:
            base, reads = warp, []           # only the first replica folds, onto its own result
        if tree:
            # a monoid's combine is costly (a division, exponentials): instead of folding the
            # G partial results one after the other, lane l takes that of warp group[l % P] (P
            # the largest power of two <= G), folds that of group[l % P + P] where there is one,
            # and the lanes combine them in log2(P) shuffles (each warp alike)::
            #
            #     smem: | w0 | w1 | ... | wP-1 | wP | .. | wG-1 |
            #     lane l <- w[l % P]  (+) w[l % P + P] if l % P + P < G;  butterfly over lanes ^ 1, .. P/2
            #
            # (the lanes pair in different orders, so their results may differ in the last bits)
            G = len(groups)
            P = 1 << (G.bit_length() - 1)
            lane = tid % 32

            def offset(index: IntExpr) -> IntExpr:
                """The warp offset of the group's ``index``-th warp (its digits, first fastest)."""
                off, p = 0, 1
                for wstride, wc in warp_parts:
                    off = off + (index // p % wc) * wstride
                    p *= wc
                return off

            def load(dst: list, index: IntExpr) -> list:
                return [ir.AtomCall(ld, (("dst", ir.RegRef(dst[j], v)),
                                         ("src", ir.MemRef(red, ((base + offset(index)) * k + j) * n + v))))
                        for v in range(n) for j in moved]

            reads = load(accs, lane % P)
            if G > P:
                rest = components(lw, lw.kb.reg("part_rest", f32, n), k)
                more = load(rest, lane % P + P)
                for v in range(n):
                    more += op.step(lw, [ir.RegRef(a, v) for a in accs], [ir.RegRef(r, v) for r in rest])
                reads.append(ir.If(lt(lane % P, G - P), ir.Seq(tuple(more))))
            reads += butterfly(lw, acc, n, [1 << i for i in range(int(math.log2(P)))], op)
            groups = groups[:1]
        # the warps' results fold one after another: a kept count is one warp's, taken before
        snaps = {}
        for v in range(n) if len(groups) > 1 else ():
            snap, snaps[v] = op.snapshot(lw, [ir.RegRef(a, v) for a in accs], v)
            reads += snap
        for g in groups[1:]:
            for v in range(n):
                for j in moved:
                    reads.append(ir.AtomCall(ld, (("dst", ir.RegRef(part, j)),
                                                  ("src", ir.MemRef(red, ((base + g) * k + j) * n + v)))))
                reads += op.step(lw, [ir.RegRef(a, v) for a in accs], [ir.RegRef(part, j) for j in range(k)],
                                 snaps[v] or None)
        out += [ir.If(lane0, ir.Seq(tuple(writes))), ir.Barrier(f"{dst.name}'s partial results are in shared memory"),
                *(reads if everyone else [ir.If(first, ir.Seq(tuple(reads)))])]
        if ctx.repeated or not everyone:
            out.append(ir.Barrier(f"{dst.name}'s partial results were read"))
    first = land(*[lt(ctx.vars[v], 1) for v, _ in rep]) if rep else 1
    cl = ctx.cluster
    across = op is not None and cl is not None and cl.dim not in dst.tensor.dims
    if across:
        out += _cluster_combine(lw, node, ctx, lay, accs, op, first, everyone)
    for i, (t, ops_) in enumerate(outs):
        stores = _store_elements(lw, ctx, node, lay, accs, t, ops_, comb, i)
        # one replica stores (every one, into a register local); one block of a cluster into
        # global memory, where the cluster's blocks hold the same result
        guard = land(first, lt(cl.rank, 1)) if across and t.memory == GL else first
        if t.memory != RF and guard != 1:
            stores = [ir.If(guard, ir.Seq(tuple(stores)))]
        out += stores
    return out


def _cluster_combine(lw: Lowerer, node: Node, ctx, lay: ThreadLayout, accs: list, op: Combine, first,
                     everyone: bool) -> list:
    """Combine the block results of a reduction whose reduced dim the blocks of a thread-block
    cluster split (``to_blocks(cluster=C)``), through distributed shared memory::

        block q:  if first replica: part = acc              (its own shared memory)
                  barrier.cluster                             (every block's part is visible)
                  acc = part@0 op part@1 op ... part@C-1      (ld.shared::cluster, ranks in order)
                  ...
                  barrier.cluster at the end of the kernel    (no block leaves while others read)

    A monoid's part is its ``k`` components (``part[j * size + v]``), combined with its program:
    a tuple reduction costs one ``barrier.cluster``, like a sum.  Every block folds the same parts
    in the same order, so every block (and, into a register local, every thread) holds bitwise the
    same result.  A persistent block, which refills its part buffers tile after tile, waits for
    the others' reads right after each combine instead."""
    spec = node.spec
    dst = spec.dst
    C = ctx.cluster.size
    # the blocks' parts fold one after another and carry their counts (none is kept)
    op = attrs.evolve(op, even=False)
    k = op.k
    n = lay.size
    if accs[0].dtype.bits != 32:
        raise err(node, f"a cluster combines 32-bit partial results; {spec.src.name} accumulates in {accs[0].dtype}",
                  field="acc", value=str(accs[0].dtype), allowed="f32", fix="accumulate the reduction in f32")
    if getattr(ctx.cluster, "exchange", "barrier") == "push":
        return _cluster_push(lw, node, ctx, lay, accs, op, first, everyone)
    part = lw.kb.shared_buf(f"{dst.name}_cluster", f32, k * n, 16,
                            f"this block's part of {dst.name}, read by every block of the cluster")
    st = catalog.copy_atom("RF", "SH", 4)
    publish = [ir.AtomCall(st, (("dst", ir.MemRef(part, j * n + v)), ("src", ir.RegRef(accs[j], v))))
               for v in range(n) for j in range(k)]
    tmp = lw.kb.reg("cluster_part", f32, k)
    fold: list = []
    for q in range(C):
        for v in range(n):
            for j in range(k):
                into = ir.RegRef(accs[j], v) if q == 0 else ir.RegRef(tmp, j)
                fold.append(ir.AtomCall(sm90a.ld_shared_cluster_4, (("dst", into), ("src", ir.MemRef(part, j * n + v)),
                                                                    ("cta", ir.Scalar(q))), comment=f"block rank {q}"))
            if q:
                fold += op.step(lw, [ir.RegRef(a, v) for a in accs], [ir.RegRef(tmp, j) for j in range(k)])
    sync = ir.AtomCall(sm90a.barrier_cluster, (), 1, f"every block's part of {dst.name} is in its shared memory")
    out = [ir.Comment(f"{dst.name}: combine the parts of the cluster's {C} blocks"),
           *(publish if first == 1 else [ir.If(first, ir.Seq(tuple(publish)))]), sync,
           *(fold if everyone or first == 1 else [ir.If(first, ir.Seq(tuple(fold)))])]
    # a block must not leave while another may still read its part: each part buffer is written
    # once per launch, so one barrier at the end of the kernel covers every combine (a persistent
    # block refills its buffers per tile, so it waits here)
    if ctx.repeated or ctx.hoists is None:
        out.append(ir.AtomCall(sm90a.barrier_cluster, (), 1, f"every block has read the parts of {dst.name}"))
    else:
        end = ir.AtomCall(sm90a.barrier_cluster, (), 1, "no block leaves while another may read its shared memory")
        if not any(getattr(x, "atom", None) is sm90a.barrier_cluster for x in ctx.hoists.scope_end):
            ctx.hoists.scope_end.append(end)
    return out


def _cluster_push(lw: Lowerer, node: Node, ctx, lay: ThreadLayout, accs: list, op: Combine, first,
                  everyone: bool) -> list:
    """The cluster's combine with pushes (``to_blocks(cluster=C, exchange="push")``): each block
    stores its part into slot ``rank`` of every block's buffer with ``st.async``, whose bytes
    complete on the receiver's mbarrier; a block waits for its own mbarrier — its peers' parts have
    landed — and folds the slots, ranks in order::

        kernel start:  thread 0: mbarrier.init(bar, 1); arrive.expect_tx(bar, C·k·4 bytes)
                       barrier.cluster            (every block's mbarrier is initialised)
        block q:       first replica: for r in 0..C-1: st.async part -> slots[q] of block r
                       try_wait.parity.acquire.cluster(bar, 0)   (the C parts have landed here)
                       acc = slots[0] op slots[1] op ... slots[C-1]

                  block 0          block 1          block 2
        slots:   |p0|p1|p2|       |p0|p1|p2|       |p0|p1|p2|     p_q: pushed by block q

    No ``barrier.cluster`` per exchange nor at the end: a block leaves after its own wait, when
    every push into it has landed (it waits for no thread of another block).  Each exchange has
    its own buffer and mbarrier, used once per launch (one tile per block: not persistent)."""
    spec = node.spec
    dst = spec.dst
    C = ctx.cluster.size
    k = op.k
    n = lay.size
    if ctx.repeated or ctx.hoists is None:
        raise err(node, "exchange='push' fills each exchange's buffer and mbarrier once per launch; this block "
                        "takes several tiles", field="exchange", value="push", allowed="'barrier' here",
                  fix="to_blocks(cluster=..., exchange='barrier'), or one tile per block")
    rank = ctx.cluster.rank
    slots = lw.kb.shared_buf(f"{dst.name}_pushed", f32, C * k * n, 16,
                             f"every block's part of {dst.name}, pushed by its owner into slot rank")
    bar = lw.kb.mbarrier(f"{dst.name}_landed", 1, f"every block's part of {dst.name} has landed")
    tid = ctx.scope.tid
    init = (ir.AtomCall(sm90a.mbarrier_init, (("bar", ir.MemRef(bar, 0)), ("count", ir.Scalar(1)))),
            ir.AtomCall(sm90a.mbarrier_arrive_expect_tx, (("bar", ir.MemRef(bar, 0)),
                                                          ("bytes", ir.Scalar(C * k * n * 4))),
                        comment=f"the cluster's {C} parts of {dst.name}"),
            ir.AtomCall(sm90a.fence_mbarrier_init, ()))
    # the kernel's setup: every exchange's mbarrier initialised, then one barrier.cluster after all
    # of them (re-placed last when a later exchange adds its own)
    setup = lw.notes.setdefault("setup", [])
    setup[:] = [x for x in setup if getattr(x, "atom", None) is not sm90a.barrier_cluster
                or "pushes may target" not in x.comment]
    setup += [ir.If(lt(tid, 1), ir.Seq(init)),
              ir.AtomCall(sm90a.barrier_cluster, (), 1, "every block's mbarriers are initialised: the cluster's "
                                                        "pushes may target them")]
    push = [ir.AtomCall(sm90a.st_async_cluster_4, (("dst", ir.MemRef(slots, (rank * k + j) * n + v)),
                                                   ("src", ir.RegRef(accs[j], v)), ("bar", ir.MemRef(bar, 0)),
                                                   ("cta", ir.Scalar(q))), comment=f"into block rank {q}")
            for q in range(C) for v in range(n) for j in range(k)]
    ld = catalog.copy_atom("SH", "RF", 4)
    tmp = lw.kb.reg("cluster_part", f32, k)
    # acquire at cluster scope: the peers' complete_tx released their stores at cluster scope
    fold: list = [ir.AtomCall(sm90a.mbarrier_try_wait_cluster, (("bar", ir.MemRef(bar, 0)), ("parity", ir.Scalar(0))),
                              comment=f"every block's part of {dst.name} has landed here")]
    for q in range(C):
        for v in range(n):
            for j in range(k):
                into = ir.RegRef(accs[j], v) if q == 0 else ir.RegRef(tmp, j)
                fold.append(ir.AtomCall(ld, (("dst", into), ("src", ir.MemRef(slots, (q * k + j) * n + v))),
                                        comment=f"the part of block rank {q}"))
            if q:
                fold += op.step(lw, [ir.RegRef(a, v) for a in accs], [ir.RegRef(tmp, j) for j in range(k)])
    return [ir.Comment(f"{dst.name}: every block pushes its part into the cluster's {C} blocks"),
            *(push if first == 1 else [ir.If(first, ir.Seq(tuple(push)))]),
            *(fold if everyone or first == 1 else [ir.If(first, ir.Seq(tuple(fold)))])]


def _store_elements(lw: Lowerer, ctx, node: Node, lay: ThreadLayout, accs: list, dst, ops_, comb, which: int) -> list:
    """Every element this thread holds of output ``which`` (``dst``): its value (a monoid's
    finish), ops in f32, convert, store (predicated)."""
    steps = scalar_steps(ops_)
    work = lw.kb.reg("w", f32, 1)
    vars_ = [Var(f"f{lw.pb.tmp()}", c) for _, c, _ in lay.seq]
    origin = lay.unit_origin(vars_, ctx.vars)
    go = ctx.origin[key(dst)]
    t = dst.tensor
    stmts = []
    for e in elements_of_shape(lay.dims, lay.leaf):
        coord = {d: origin[d] + e[d] for d in lay.dims}
        off = lay.offset(coord)
        if comb is None:
            stmts.append(ir.Pointwise("copy", ir.RegRef(work, 0), (ir.RegRef(accs[0], off),)))
        else:
            stmts += comb.finish(lw, which, [ir.RegRef(a, off) for a in accs], ir.RegRef(work, 0))
        for name, a in steps:
            if name == "mask":
                raise err(node, f"{a[0]} masks elements of a tensor; a reduction's result takes value ops only",
                          fix="mask the reduction's input (the Move or Pointwise that produces it)")
            stmts.append(ir.Pointwise(name, ir.RegRef(work, 0), (ir.RegRef(work, 0), *a)))
        gcoord = {d: go[d] + coord.get(d, 0) for d in t.dims}
        y = lw.kb.reg(f"y_{dst.name}", dst.dtype, 1)
        stmts.append(ir.Pointwise("cvt", ir.RegRef(y, 0), (ir.RegRef(work, 0),)))
        if dst.memory == GL:
            buf = lw.kb.gbuf(dst, write=True)
            pred = _inside(t, gcoord, ctx.limit[key(dst)], ctx.low.get(key(dst), {}))
            stmts.append(ir.AtomCall(catalog.copy_atom("RF", "GL", t.dtype.bits // 8),
                                     (("dst", ir.MemRef(buf, gl_offset(buf, t, gcoord))), ("src", ir.RegRef(y, 0))),
                                     pred, comment=dst.name))
        elif dst.memory == RF:
            dlay = lw.reg_layout(dst, node)
            dregs = lw.kb.reg(f"{dst.name}_acc", dst.dtype, dlay.size)
            stmts[-1] = ir.Pointwise("cvt", ir.RegRef(dregs, dlay.offset(gcoord)), (ir.RegRef(work, 0),))
        elif dst.memory == SH:
            buf = shared_buffer(lw, dst)
            stmts.append(ir.AtomCall(catalog.copy_atom("RF", "SH", t.dtype.bits // 8),
                                     (("dst", ir.MemRef(buf, sh_offset(lw, dst, ctx, gcoord))), ("src", ir.RegRef(y, 0))),
                                     comment=dst.name))
        else:
            raise err(node, f"no store of a register accumulator into {dst.memory}")
    body = ir.Seq(tuple(stmts))
    for v in reversed(vars_):
        body = ir.For(v, v.extent, body, unroll=True)
    return [body]


def elements_of_shape(dims, shape) -> list[dict[str, int]]:
    out = [{}]
    for d, n in zip(dims, shape):
        out = [{**c, d: i} for c in out for i in range(n)]
    return out


__all__ = ["pointwise_leaf", "move_leaf", "reduce_leaf", "store_thread_accumulator", "access", "elements",
           "RF"]
