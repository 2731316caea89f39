"""``Move SH -> RF`` (or ``GL -> RF``) of int4 codes into a float operand fragment: the
dequantising move.  From global memory each lane reads its words where the packed tensor keeps
them (contiguous, as in shared memory), predicated at the tensor's edges.

The unit that issues the MMA (a warp for ``mma.sync``'s B, a warpgroup of 128 threads for
wgmma's ``_rs`` A) loads its part of a packed int4 tile one 32-bit word (eight codes) at a time, converts
each word with a ``convert`` atom into four f16x2 (bf16x2) registers and multiplies them by the
group's scale (``ops.group_scale``, a prologue op), so the fragment an MMA reads is dequantised
weights — the codes never exist as floats in memory::

    ld.global.b16  s, [scales + (k / group) * N + n]      one scale per (group, column), first (or
                                                          ld.shared of the stage the K loop's ring
                                                          filled: transforms.staged_scales)
    ld.shared.b32  w, [B_smem + word of this lane]        8 codes: k of one lane's 2 k16 steps
                                                          (.v4: 4 words, where the packing allows)
    dequant_u4z8   (q0 q1 q2 q3) <- w                     lop3 magic numbers, q = code - 8
    scale_f16x2    q_i <- q_i * (s, s)                     last: the fragment registers of the MMA

Which word a lane reads is not chosen here: the tensor's ``Packing`` says where each logical k
is stored, and the rule checks — lane by lane, value by value, as the ldmatrix rule does — that
every word holds eight values of one lane's fragment, in the convert atom's order, at register
offsets every lane shares.  A packing that does not fit (one written by hand, or derived for
another consumer) is a ``ScheduleError`` naming both; ``lower.synthesis.packing_for`` derives
the one that fits.
"""

from __future__ import annotations

from ... import ir
from ...hardware.atoms import catalog
from ...hardware.atoms.convert import source_index
from ...ir.expr import IntExpr, land, lt, to_c
from ...ops import GroupScale
from ...schedule import Node
from ...tensor import GL, WARP, WARPGROUP
from ..context import err, key
from ..lowerer import Lowerer
from .smem import gl_offset, sh_offset, shared_buffer
from .threads import alignment

WORD_CODES = 8          # codes in one 32-bit word


def lane_expr(table: list[int], lane: IntExpr, node: Node, what: str) -> IntExpr:
    """``table[lane]`` (``table[0] == 0``, one entry per thread of the unit: 32 lanes of a warp,
    128 threads of a warpgroup) as an expression of ``lane``: a sum over runs of lane bits, each a
    contiguous bit field times a stride (``(lane // 4) % 8 * 1``), which holds when ``table`` is
    linear over the bits of the lane — as every MMA fragment's is.  Raises otherwise."""
    nbits = len(table).bit_length() - 1
    coef = [table[1 << b] for b in range(nbits)]
    for lane_v in range(len(table)):
        if sum(c for b, c in enumerate(coef) if lane_v >> b & 1) != table[lane_v]:
            raise err(node, f"the lanes' {what} is not a sum over lane bits ({table}); this fragment has no "
                            f"per-lane address the dequantising move can form", field="packing")
    out: IntExpr = 0
    b = 0
    while b < nbits:
        if coef[b] == 0:
            b += 1
            continue
        e = b
        while e + 1 < nbits and coef[e + 1] == 2 * coef[e]:
            e += 1
        out = out + ((lane // (1 << b)) % (1 << (e - b + 1))) * coef[b]
        b = e + 1
    return out


def _words(lw: Lowerer, node: Node, lay, src, kdim: str, ndim: str):
    """The words each lane reads, as ``[(n, storage k, {nibble: register offset})]`` for lane 0
    and the per-lane offsets ``(dn[lane], dk[lane])`` added to every word's coordinates."""
    pk = src.tensor.packing
    part = lay.unit_part()
    kp, np_ = part[kdim], part[ndim]
    if kp % pk.block:
        raise err(node, f"a warp's part of {src.name} spans {kp} k; its packing stores blocks of {pk.block}",
                  field="tile", value=kp, allowed=f"a multiple of {pk.block}",
                  fix=f"tile(k=...) to a multiple of {pk.block} per warp")
    owner = lay.owner_fn()
    pos = pk.storage_of
    table: dict[int, dict[tuple[int, int], dict[int, int]]] = {}
    for k in range(kp):
        s = k - k % pk.block + int(pos[k % pk.block])
        for n in range(np_):
            lane, off = owner((k, n) if lay.dims[0] == kdim else (n, k))
            table.setdefault(lane, {}).setdefault((n, s // WORD_CODES), {})[s % WORD_CODES] = off
    threads = lay.atom.threads
    if sorted(table) != list(range(threads)):
        raise err(node, f"{lay.atom.name}'s {lay.operand} fragment is not spread over the {threads} threads of its unit")

    def ordered(lane):
        return sorted(table[lane].items(), key=lambda kv: min(kv[1].values()))

    first = ordered(0)
    dn, dk = [], []
    for lane in range(threads):
        mine = ordered(lane)
        shifts = set()
        for (w0, m0), (w1, m1) in zip(first, mine):
            if len(mine) != len(first) or m0 != m1:
                raise err(node, f"the packing of {src.name} does not deliver {lay.atom.name}'s {lay.operand} fragment: "
                                f"lane {lane}'s word at column {w1[0]}, word {w1[1]} holds values at register offsets "
                                f"{[m1[p] for p in sorted(m1)]} where lane 0's holds {[m0[p] for p in sorted(m0)]}",
                          field="packing", value=src.tensor.packing,
                          fix=f"pack {src.name} with lower.synthesis.packing_for({lay.atom.name}, "
                              f"{lay.operand!r}, <convert atom>) (recipes.gemm_w4a16 does)")
            shifts.add((w1[0] - w0[0], WORD_CODES * (w1[1] - w0[1])))
        if len(shifts) != 1:
            raise err(node, f"lane {lane} reads words of {src.name} at offsets from lane 0's that differ word to word",
                      field="packing", value=src.tensor.packing)
        a, b = shifts.pop()
        dn.append(a)
        dk.append(b)
    return [(w[0], WORD_CODES * w[1], m) for w, m in first], dn, dk


def _vector_runs(words, dk) -> list[tuple[int, int]]:
    """``(first word, count)``: the lane's words read by one load each — up to 4 (16 bytes) that
    are adjacent in storage (same column, consecutive storage positions) and aligned to the load's
    width for every lane (the packing puts them so: ``packing_for(..., words=4)``)."""
    out, i = [], 0
    while i < len(words):
        n, s, _ = words[i]
        r = 1
        for width in (4, 2):
            span = WORD_CODES * width
            if s % span == 0 and all(d % span == 0 for d in dk) and i + width <= len(words) and all(
                    words[i + j][0] == n and words[i + j][1] == s + WORD_CODES * j for j in range(width)):
                r = width
                break
        out.append((i, r))
        i += r
    return out


def dequant_to_registers(lw: Lowerer, node: Node, ctx) -> list:
    """The rule of a ``Move SH -> RF`` whose source holds int4 codes (see the module docstring)."""
    spec = node.spec
    src, dst = spec.src, spec.dst
    lay = lw.reg_layout(dst, node)
    if spec.level not in (WARP, WARPGROUP) or lay.atom.threads != (32 if spec.level == WARP else 128):
        raise err(node, f"register fragments of {lay.atom.name} are loaded by the unit that issues it "
                        f"({lay.atom.threads} threads): apply move_to_regs after "
                        f"{'to_warps()' if lay.atom.threads == 32 else 'to_warpgroups()'}",
                  field="level", value=str(spec.level), allowed="warp (mma.sync), warpgroup (wgmma)")
    if node.atom is not None:
        raise err(node, f"{src.name} holds {src.dtype} codes: the dequantising move reads words, not ldmatrix tiles",
                  field="atom", value=node.atom, allowed="None", fix=f"move_to_regs({src.name!r})")
    if src.tensor.packing is None:
        raise err(node, f"{src.name} holds {src.dtype} codes in logical order; a word of codes must hold one lane's "
                        f"fragment values", field="packing", value=None,
                  fix=f"give {src.name}'s tensor packing=lower.synthesis.packing_for({lay.atom.name}, "
                      f"{lay.operand!r}, <convert atom>) (recipes.gemm_w4a16 does)")
    pk = src.tensor.packing
    # the kernel's tensor the codes came from: a packing covers whole blocks of its k
    root = next((t.tensor for t in lw.pb.spec.operands if t.name == src.name), None)
    total = root.extent(src.tensor.major) if root is not None else pk.block
    if total % pk.block:
        raise err(node, f"{src.name}'s packing stores blocks of {pk.block} k, but {src.name} has {total} k: the last "
                        f"block is not whole", field="packing", value=pk,
                  allowed=f"a packing whose block divides {total}",
                  fix=f"pack with fewer words a load (packing_for(..., words=w) stores blocks of 32 * w k) so that "
                      f"a block divides {total}, as recipes.gemm_w4a16 does, or pad K")
    gk = ctx.origin.get((src.name, "GL"), {}).get(src.tensor.major)
    if gk is not None and alignment(gk) % pk.block:
        # a block stores its k interleaved (a word holds k 8 apart): a tile that starts inside
        # one (a split-K part of fewer k than the block) would read another tile's codes
        raise err(node, f"{src.name}'s tiles start at k = {to_c(gk)}, which is not always a multiple of its "
                        f"packing's {pk.block}-k blocks (a split-K part or K tile cuts a block)",
                  field="packing", value=pk, allowed=f"K tiles and split-K parts of multiples of {pk.block} k",
                  fix=f"split K into parts of a multiple of {pk.block} k (fewer parts), or pack with fewer "
                      f"words a load (packing_for(..., words=w) stores blocks of 32 * w k)")
    ops = tuple(spec.ops or ())
    scale = ops[0] if ops and isinstance(ops[0], GroupScale) else None
    if ops[1 if scale else 0:]:
        raise err(node, f"{ops[1 if scale else 0]} on dequantised weights is not lowered; only group_scale is",
                  field="op", value=ops[1 if scale else 0], allowed="ops.group_scale(...)")
    zero = scale.zero if scale else 0
    form = "i4" if src.dtype.name == "i4" else ("u4z8" if zero == 8 else "u4")
    conv = catalog.by_name(f"dequant_{form}_{dst.dtype.name}")
    mul = catalog.by_name(f"scale_{dst.dtype.name}x2")
    for a in (conv, mul):
        if not lw.target.supports(a):
            raise err(node, f"{lw.target.name} cannot issue {a.name}", field="target", value=lw.target.name,
                      allowed="sm_80 and later")
    kdim = src.tensor.major
    ndim = next(d for d in lay.dims if d != kdim)
    words, dn, dk = _words(lw, node, lay, src, kdim, ndim)
    # in storage order, so that words adjacent in shared memory (a lane's values over several k
    # steps: packing_for(..., words=4)) are read by one vector load whatever registers they feed
    words.sort(key=lambda w: (w[0], w[1]))

    lane = ctx.scope.tid % lay.atom.threads
    ln = lane_expr(dn, lane, node, "column")
    lk = lane_expr(dk, lane, node, "word")
    so = ctx.origin[key(src)]
    from_global = src.memory == GL
    sbuf = None if from_global else shared_buffer(lw, src)
    gbuf = lw.kb.gbuf(src) if from_global else None
    rbuf = lw.kb.reg(f"{dst.name}_frag", dst.dtype, lay.size)
    wbuf = lw.kb.reg(f"{src.name}_codes", src.dtype, WORD_CODES * len(words))
    src_of = source_index(conv)
    stmts: list = [ir.Comment(f"{spec}: {len(words)} words of {WORD_CODES} codes a lane, {conv.name}")]
    # the scales' global loads first, then the words' shared loads, all conversions, and the
    # multiplies last: the loads' latency hides under the conversions
    # (with scale.partials the scale multiplies each group's partial product instead: ScaleAdd)
    keys = _word_groups(node, scale, src, words) if scale else []
    scales = group_loads(lw, node, ctx, scale, 0, key(src), dst.dtype, keys, ln, kdim, ndim, stmts) \
        if scale and not scale.partials else None
    zeros = group_loads(lw, node, ctx, scale, 1, key(src), dst.dtype, keys, ln, kdim, ndim, stmts) \
        if scale and scale.zeros else None
    if zeros is not None:
        # q - zero as q * 1 + (-zero): one rounding of an exact difference (|q - zero| <= 15)
        one = lw.kb.reg("one_pair", dst.dtype, 2)
        stmts.append(ir.RegFill(ir.RegRef(one, 0), 2, 1.0))
        for j in range(zeros[0].size):
            r = ir.RegRef(zeros[0], j)
            stmts.append(ir.Pointwise("mul", r, (r, -1.0)))
        add = catalog.by_name(f"scale_add_{dst.dtype.name}x2")
    for i, r in _vector_runs(words, dk):
        n, s, _m = words[i]
        coord = {kdim: so[kdim] + s + lk, ndim: so[ndim] + n + ln}
        if sbuf is None:
            # straight from global memory: a word past the tensor's columns (or K) is not read;
            # its zeroed codes meet zero scales (and zero activations past K), and C's columns
            # past N are not stored
            lim = ctx.limit[key(src)]
            ok = land(*[lt(coord[d], lim[d]) for d in (ndim, kdim) if d in lim])
            call = ir.AtomCall(catalog.copy_atom("GL", "RF", 4 * r),
                               (("dst", ir.RegRef(wbuf, WORD_CODES * i)),
                                ("src", ir.MemRef(gbuf, gl_offset(gbuf, src.tensor, coord)))),
                               ok, comment=f"{src.name} codes, from global memory")
        else:
            call = ir.AtomCall(catalog.copy_atom("SH", "RF", 4 * r),
                               (("dst", ir.RegRef(wbuf, WORD_CODES * i)),
                                ("src", ir.MemRef(sbuf, sh_offset(lw, src, ctx, coord)))),
                               comment=f"{src.name} codes")
        stmts.append(call)
    muls: list = []
    # converted front to back in the fragment (the loads above stay in storage order): a wgmma
    # that reads the first k16 slices can issue while the later ones are converted
    # (transforms.interleave)
    for i in sorted(range(len(words)), key=lambda i: min(words[i][2].values())):
        _n, _s, m = words[i]
        offs = [m[int(src_of[v])] for v in range(WORD_CODES)]
        direct = offs == list(range(offs[0], offs[0] + WORD_CODES)) and offs[0] % 2 == 0
        out = rbuf if direct else lw.kb.reg(f"{dst.name}_deq", dst.dtype, WORD_CODES)
        base = offs[0] if direct else 0
        stmts.append(ir.AtomCall(conv, (("dst", ir.RegRef(out, base)), ("src", ir.RegRef(wbuf, WORD_CODES * i)))))
        scaled = []
        for r in range(WORD_CODES // 2 if scale else 0):
            q = ir.RegRef(out, base + 2 * r)
            if zeros is not None:
                scaled.append(ir.AtomCall(add, (("d", q), ("q", q), ("s", ir.RegRef(one, 0)),
                                                ("z", ir.RegRef(zeros[0], zeros[1][i])))))
            if scales is not None:
                scaled.append(ir.AtomCall(mul, (("d", q), ("q", q), ("s", ir.RegRef(scales[0], scales[1][i])))))
        if direct:
            muls += scaled          # in place in the fragment: after every conversion
        else:
            # through the one temporary: scaled and copied before the next word reuses it
            stmts += scaled
            stmts += [ir.Pointwise("copy", ir.RegRef(rbuf, offs[v]), (ir.RegRef(out, v),)) for v in range(WORD_CODES)]
    stmts += muls
    return stmts


def _word_groups(node, scale: GroupScale, src, words) -> list[tuple[int, int]]:
    """``(n, k)`` of each word's codes for ``group_loads``: its column in the fragment and the
    first logical k (from the tile's origin) of the codes it holds, which lie in one group."""
    pk = src.tensor.packing
    out = []
    for n, s, _m in words:
        # the logical k of the word's codes (global origins are absolute): a group holds them all
        ks = [s - s % pk.block + pk.order[(s + p) % pk.block] for p in range(WORD_CODES)]
        if scale.group_size and len({k // scale.group_size for k in ks}) != 1:
            raise err(node, f"a word of {src.name}'s codes spans k {min(ks)}..{max(ks)}, across groups of "
                            f"{scale.group_size}", field="group_size", value=scale.group_size,
                      fix="a packing whose words hold k of one group (packing_for's are 32 k apart at most)")
        out.append((n, min(ks)))
    return out


def group_loads(lw, node, ctx, scale: GroupScale, which: int, src: tuple[str, str], dtype, keys, ln, kdim, ndim,
                stmts, pairs: bool = True) -> tuple:
    """Load each distinct (group, column) value of ``scale``'s extra input ``which`` (0: the
    scales, 1: the zero points) that ``keys`` name — ``(n, k)``: column ``n`` (plus the lane's
    ``ln``) and logical k ``k`` from the origin of the codes' tile ``src`` (its name and memory, a
    key of ``ctx.origin``) — into a register
    (``pairs``: both halves of one, for the f16x2 / bf16x2 atoms); returns (the register buffer,
    each key's offset in it)."""
    extra = scale.extras()[which]
    sbuf_g = lw.kb.extra_buf(extra)
    rows, cols = sbuf_g.shape
    name = src[0]
    gl = ctx.origin.get((name, "GL"))
    if gl is None:
        raise err(node, f"the group scales of {name} are indexed by its global k and n; no global tile of "
                        f"{name} encloses this move", field="op", value=scale)
    # the K loop's ring stages the scales (transforms.staged_scales): read its current stage
    staged = lw.notes.get("staged_scales", {}).get(extra.name)
    if staged is not None and (staged.src != name or name not in ctx.stage):
        staged = None
    so = ctx.origin[src]
    where: dict[str, int] = {}
    loads = []
    per_key = []
    for n, k in keys:
        if staged is not None:
            g = staged.row(so[kdim] + k)                         # the row of this K tile's scales
            col = so[ndim] + n + ln                              # the block's column
        else:
            g = 0 if not scale.group_size else (gl[kdim] + k) // scale.group_size
            col = gl[ndim] + n + ln
        tag = f"{g if isinstance(g, int) else to_c(g)}|{n}"
        if tag not in where:
            where[tag] = len(loads)
            loads.append((g, col))
        per_key.append((2 if pairs else 1) * where[tag])
    width = 2 if pairs else 1
    reg = lw.kb.reg(f"{extra.name}_{'pair' if pairs else 'one'}", dtype, width * len(loads))
    what = f"{extra.name}[k / {scale.group_size or 'K'}, n]"
    # every load first, then the copies into the pairs' upper halves: the loads lead the move, so
    # a ring in registers (transforms.register_ring) can issue them steps ahead
    copies = []
    for j, (g, col) in enumerate(loads):
        if staged is not None:
            ld = catalog.copy_atom("SH", "RF", dtype.bits // 8)
            at = ir.MemRef(staged.buf, staged.offset(ctx.stage[name], g, col))
            stmts.append(ir.AtomCall(ld, (("dst", ir.RegRef(reg, width * j)), ("src", at)), comment=f"{what}, staged"))
        else:
            ld = catalog.copy_atom("GL", "RF", dtype.bits // 8)
            ok = land(lt(col, cols), lt(g, rows)) if not isinstance(g, int) else lt(col, cols)
            stmts.append(ir.AtomCall(ld, (("dst", ir.RegRef(reg, width * j)), ("src", ir.MemRef(sbuf_g, g * cols + col))),
                                     ok, comment=what))
        if pairs:
            copies.append(ir.Pointwise("copy", ir.RegRef(reg, 2 * j + 1), (ir.RegRef(reg, 2 * j),)))
    stmts += copies
    return reg, per_key


__all__ = ["dequant_to_registers", "group_loads", "lane_expr"]
