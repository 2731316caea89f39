"""The TMA rule of ``Move GL -> SH`` (``move_to_smem(..., via=(sm90a.tma_load_2d,))``).

One elected thread issues the tile as 2-D boxes of the tensor map, each completing a transaction
on the ring's *full* mbarrier of the stage (the ring's producer has already announced the stage's
bytes).  The shared layout is the one the boxes leave: rows of one swizzle span (a K-major
operand), or boxes one span wide side by side (a row-major B)::

    B:GL [K x N] row-major, tile 64 x 256, 128-byte boxes:   4 boxes of 64 k x 64 n, 8 KiB apart

A tensor whose rows are not a multiple of 16 bytes cannot be described by a tensor map: the rule
asks the program for a workspace with padded rows and a launch that copies the tensor into it
first (``pad_kernel``); the padding lies outside the map's extent and is never read.

In a thread-block cluster, an operand that does not depend on the clustered dimension (B, when
blocks pair along M) is the same tile in every block: each block loads 1/C of it and multicasts
its share into all of them.
"""

from __future__ import annotations

import itertools
import math

from ... import ir
from ...hardware.atoms import catalog, sm90a
from ...hardware.descriptors import SWIZZLE_SPANS
from ...hardware.tma import TMA_DATA_TYPES
from ...ir.expr import IntExpr, bounds, evaluate, free_vars, lt, minimum, substitute
from ...layout import Swizzle
from ...schedule import Node
from ...spec import Move
from ..context import err, key
from ..layouts import SmemLayout
from ..lowerer import Lowerer, spec_rule
from .smem import shared_buffer

PAD_CHUNK = 16             # bytes one thread of the row-padding kernel stores
PAD_THREADS = 256


@spec_rule(Move, "GL", "SH", via="tma")
def tma_load(lw: Lowerer, node: Node, ctx) -> list:
    spec: Move = node.spec
    src, dst = spec.src, spec.dst
    if not lw.target.has_tma:
        raise err(node, f"TMA copies need sm_90a; the target is {lw.target.name}", field="via",
                  value=node.via, fix="check/compile with arch='sm_90a', or drop via= (cp.async)")
    if ctx.tiles is not None:
        wait = ctx.tiles.wait_for(ctx, dst.name)
        if wait is not None:
            # a warp-specialized block's tile move: its producer issued the copy
            # (transforms.tile_moves); the consumers wait for it here
            return wait
    ring = ctx.ring
    if ring is None or not hasattr(ring, "full_bar"):
        raise err(node, "a TMA copy completes on an mbarrier: it needs the stage ring of a pipelined loop, or a "
                        "warp-specialized producer (a copy above the pipelined loop, once per block tile)",
                  fix="tile(k=...), move_to_smem(..., via=...), then pipeline(stages=...) [and warp_specialize()]")
    if not ctx.scope.elected:  # pragma: no cover - the pipeline elects its issuing thread
        raise err(node, "a TMA copy is issued by one thread")
    t = src.tensor
    rank = len(t.shape)
    if rank not in sm90a.TMA_LOADS:
        raise err(node, f"TMA copies of {rank}-d tensors are not built (tensor maps of rank "
                        f"{', '.join(map(str, sorted(sm90a.TMA_LOADS)))})", field="tensor", value=t.name,
                  fix="drop via= to copy with cp.async")
    if t.dtype.bits != 4 and (t.dtype.bits % 8 or t.dtype.name not in TMA_DATA_TYPES):
        raise err(node, f"TMA cannot move {t.dtype} elements", field="dtype", value=str(t.dtype),
                  allowed=", ".join(sorted(TMA_DATA_TYPES)) + ", and 4-bit codes (as bytes)")
    lay = lw.smem_layout(dst)
    stage = ctx.stage.get(dst.name, 0)
    sbuf = shared_buffer(lw, dst)
    o = ctx.origin[key(src)]
    rdim, cdim = lay.row_dims[-1], lay.col_dim
    rows, bx = lay.rows, lay.box_cols
    base = stage * lay.stage_elems if lay.stages > 1 else 0
    bar = ring.full_bar(stage, dst.name)
    cl = ctx.cluster
    C = cl.size if cl is not None else 1
    row0 = o[rdim]
    if cl is not None and cdim != cl.dim and rdim == cl.dim and cl.clamp is not None:
        # a block of a cluster whose tile lies past the tensor (the last cluster is not full) loads
        # the last tile again, so that the cluster's multicasts still add up; it stores nothing
        row0 = minimum(row0, cl.clamp)
    multicast = C > 1 and cl.dim not in t.dims
    if multicast and rank != 2:
        raise err(node, "TMA multicast of batched tensors is not built (2-d maps only)", field="cluster", value=C,
                  fix="cluster=1 for a batched GEMM")
    for d, extent in ((rdim, rows), (cdim, lay.cols)):
        reach = _reads_past_its_part(ctx, src, d, extent)
        if reach is not None:
            raise err(node, f"a TMA box of {extent} along {d} from the tile's origin reaches past the elements the "
                            f"block owns ({d} < {reach[0]} in a block, of {reach[1]} in {t.name}): TMA fills zeros only "
                            f"past the tensor's end, so the box would read another block's part", field="via",
                      value=node.via, fix="split K into parts that are whole K tiles (K / parts a multiple of the K "
                                          "tile), or copy with cp.async (drop via=)")
    box_rows = rows // C if (multicast and bx == lay.cols) else rows
    # the dims of the tensor the tile does not span (a batch index) are boxes of extent 1
    outer = tuple(d for d in t.storage_dims[:-2])
    tmap = tensor_map(lw, node, src, (1,) * len(outer) + (box_rows, bx), lay.span)
    unit = tmap.unit            # 4-bit codes: the innermost coordinate counts bytes
    if multicast and unit > 1:
        raise err(node, f"TMA multicast of {t.dtype} codes is not built", field="cluster", value=C,
                  fix="cluster=1, or copy the codes with cp.async (drop via=)")
    out = []
    if not multicast:
        load = sm90a.TMA_LOADS[rank]
        for b in range(lay.boxes):
            what = f"{t.name} tile {rows}x{bx}" if lay.boxes == 1 else f"{t.name} columns {b * bx}..+{bx}"
            coords = {"c0": ir.Scalar((o[cdim] + b * bx) // unit), "c1": ir.Scalar(row0)}
            for i, d in enumerate(reversed(outer)):
                coords[f"c{i + 2}"] = ir.Scalar(o[d])
            out.append(_call(load, dst=ir.MemRef(sbuf, base + b * rows * bx), tmap=tmap, **coords, mbar=bar,
                             comment=what))
        return out
    mask = ir.Scalar((1 << C) - 1)
    rank = cl.rank
    if bx != lay.cols:
        if lay.boxes % C:
            raise err(node, f"a cluster of {C} sharing {lay.boxes} box(es) of {bx} columns of {t.name} (each block "
                            "multicasts an equal share)", fix=f"a tile a multiple of {C * bx} wide, or cluster=1")
        for j in range(lay.boxes // C):
            b = j * C + rank
            out.append(_call(sm90a.tma_load_2d_multicast, dst=ir.MemRef(sbuf, base + b * rows * bx), tmap=tmap,
                             c0=ir.Scalar(o[cdim] + b * bx), c1=ir.Scalar(row0), mbar=bar, mask=mask,
                             comment=f"{t.name} columns ({j * C} + rank) * {bx}..+{bx}, to every block of the cluster"))
        return out
    if rows % (8 * C):
        raise err(node, f"a cluster of {C} sharing a {rows}-row tile of {t.name}",
                  fix=f"a tile of a multiple of {8 * C} rows, or cluster=1")
    h = rows // C
    out.append(_call(sm90a.tma_load_2d_multicast, dst=ir.MemRef(sbuf, base + rank * h * bx), tmap=tmap,
                     c0=ir.Scalar(o[cdim]), c1=ir.Scalar(row0 + rank * h), mbar=bar, mask=mask,
                     comment=f"{t.name} rows rank * {h}..+{h}, to every block of the cluster"))
    return out


#: the most assignments of a limit's variables ``_reads_past_its_part`` enumerates
LIMIT_CASES = 1 << 16


def _reads_past_its_part(ctx, src, d: str, extent: int):
    """``(limit, tensor extent)`` where a box of ``extent`` elements along ``d`` from ``src``'s
    origin can reach past the tile's limit while the tensor goes on, else None.  TMA zero-fills
    only what lies past the tensor map's extent, so such a box reads elements another block owns —
    a K split across blocks whose parts are not whole K tiles::

        K = 1344 in 3 parts of 448, K tiles of 128:   part 0 | 0 .. 447 | its 4th tile 384 .. 511
                                                                            reads part 1's 448 .. 511

    Every assignment of the limit's variables (a few block indices) is tried, with the origin's
    largest value over the others (``ir.expr.bounds``)."""
    lim = ctx.limit.get(key(src), {}).get(d)
    if lim is None:
        return None
    T = src.tensor.extent(d)
    o = ctx.origin[key(src)][d]
    names = sorted({v.name: v for v in free_vars(lim)}.values(), key=lambda v: v.name)
    if any(v.extent is None for v in names) or math.prod(v.extent for v in names) > LIMIT_CASES:
        return None          # too many block indices to try: left undecided
    for values in itertools.product(*(range(v.extent) for v in names)):
        env = {v.name: x for v, x in zip(names, values)}
        stop = evaluate(lim, env)
        if stop >= T:
            continue
        hi = bounds(substitute(o, env))[1]
        if hi is not None and hi + extent > stop:
            return stop, T
    return None


def tma_smem_layout(node: Node, tensor, stages: int) -> SmemLayout:
    """The shared layout TMA boxes leave: rows of the tensor's contiguous dim, cut into boxes one
    swizzle span wide where the row is wider, each box swizzled as the hardware swizzles it
    (16-byte chunks XORed with the row bits above them), ``stages`` copies, 1024-byte aligned (a
    128-byte swizzle repeats every 8 rows of 128 bytes)."""
    eb = tensor.dtype.bits // 8
    sw = tensor.swizzle
    if tensor.dtype.bits == 4:
        # int4 codes travel as bytes in plain rows (no swizzle mode splits a byte's two codes;
        # a dequantising move reads them a word per lane, rows 16 bytes or more apart)
        if sw is not None and sw.bits:
            raise err(node, f"{tensor.name} holds {tensor.dtype} codes, which TMA copies unswizzled",
                      field="swizzle", value=sw, allowed="Swizzle(0, 0, 0)",
                      fix=f"move_to_smem({tensor.name!r}, swizzle=Swizzle(0, 0, 0), via=(sm90a.tma_load_2d,))")
        dims = tensor.storage_dims
        rows = 1
        for d in dims[:-1]:
            rows *= tensor.extent(d)
        cols = tensor.extent(dims[-1])
        if cols % 32:
            raise err(node, f"{tensor.name}'s tile rows are {cols} codes; TMA moves rows of 16-byte multiples",
                      field="tile", value=cols, allowed="a multiple of 32 codes")
        return SmemLayout(dims[:-1], dims[-1], rows, cols, cols, Swizzle(0, 0, 0), stages, align=128, span=0)
    span = 16 << sw.bits if sw is not None and sw.bits and eb and (1 << sw.base) * eb == 16 else 0
    if span not in SWIZZLE_SPANS:
        raise err(node, f"{tensor.name}'s shared tile has swizzle {sw}, which is no wgmma/TMA swizzle mode",
                  field="swizzle", value=sw,
                  allowed="Sw<1,M,S>, Sw<2,M,S>, Sw<3,M,S> on 16-byte units (32, 64, 128-byte spans)",
                  fix="drop swizzle= to let move_to_smem choose")
    dims = tensor.storage_dims
    rows = 1
    for d in dims[:-1]:
        rows *= tensor.extent(d)
    cols = tensor.extent(dims[-1])
    box_cols = min(cols, span // eb)
    if cols % box_cols:
        raise err(node, f"{tensor.name}'s tile is {cols} elements wide, no whole number of {box_cols}-element TMA "
                        f"boxes ({span}-byte swizzle span)", field="tile", value=cols,
                  fix=f"a tile a multiple of {box_cols} wide")
    base = (16 // eb).bit_length() - 1
    hw = Swizzle(sw.bits, base, 3)
    return SmemLayout(dims[:-1], dims[-1], rows, cols, box_cols, hw, stages, align=1024, span=span)


def tensor_map(lw: Lowerer, node: Node, src, box, span: int) -> ir.TensorMapParam:
    """The tensor map of ``src``'s tensor (of its row-padded copy where its rows are not 16-byte
    multiples) with boxes of ``box`` elements, made once per launch and passed as a parameter."""
    maps = lw.notes.setdefault("tensor_maps", {})
    k = (src.name, box, span)
    if k not in maps:
        g = lw.pb.gbuf(src)
        if (g.shape[-1] * g.dtype.bits) % 128:
            if g.dtype.bits < 8:
                raise err(node, f"{src.name}'s rows are {g.shape[-1]} codes, no whole number of 16 bytes: a tensor "
                                f"map cannot describe them", field="shape", value=g.shape,
                          fix="pad the rows to a multiple of 32 codes, or copy with cp.async (drop via=)")
            g = padded(lw, g)
        try:
            maps[k] = lw.kb.param(ir.TensorMapParam(f"tmap_{src.name}", g, box, span))
        except ValueError as e:
            raise err(node, f"no tensor map can describe {src.name}'s tile: {e}", field="box", value=box) from None
    return maps[k]


def padded(lw: Lowerer, src: ir.GlobalBuffer) -> ir.GlobalBuffer:
    """The row-padded workspace copy of ``src``, filled by a launch that runs before this one."""
    pads = lw.pb.padded
    if src.name not in pads:
        eb = src.dtype.bits // 8
        ld = -(-src.shape[-1] * eb // 16) * 16 // eb
        rows = 1
        for s in src.shape[:-1]:
            rows *= s
        # the workspace holds whole padded rows; the tensor map sees the same memory in the
        # tensor's own shape with rows ld elements apart
        store = ir.GlobalBuffer(f"{src.name}_padded", src.dtype, (rows, ld), (ld, 1), "workspace")
        lw.pb.workspace(store)
        flat = ir.GlobalBuffer(src.name, src.dtype, (rows, src.shape[-1]), (src.shape[-1], 1), src.role)
        lw.pb.kernels.append(pad_kernel(lw, flat, store))
        strides, acc = [], ld
        for s in reversed(src.shape[:-1]):
            strides.append(acc)
            acc *= s
        pads[src.name] = ir.GlobalBuffer(store.name, store.dtype, src.shape, tuple(reversed(strides)) + (1,),
                                         "workspace")
    return pads[src.name]


def pad_kernel(lw: Lowerer, src: ir.GlobalBuffer, dst: ir.GlobalBuffer) -> ir.Kernel:
    """Copy ``src`` into ``dst``, whose rows are padded to a multiple of 16 bytes: each thread
    moves one 16-byte chunk of a padded row (element loads, zeros past the row's end, one vector
    store)."""
    rows, cols = src.shape
    ld = dst.shape[1]
    eb = src.dtype.bits // 8
    v = PAD_CHUNK // eb
    chunks = ld // v
    total = rows * chunks
    T = PAD_THREADS
    blocks = -(-total // T)
    tid = ir.tid(T)
    idx: IntExpr = ir.bid(0, blocks) * T + tid
    row, c0 = idx // chunks, (idx % chunks) * v
    vals = ir.RegBuffer("chunk", src.dtype, v)
    ld_atom = catalog.copy_atom("GL", "RF", eb)
    st_atom = catalog.copy_atom("RF", "GL", PAD_CHUNK)
    body = [ir.AtomCall(ld_atom, (("dst", ir.RegRef(vals, j)), ("src", ir.MemRef(src, row * cols + c0 + j))),
                        lt(c0 + j, cols), f"element {j} (zero past the row's end)") for j in range(v)]
    body.append(ir.AtomCall(st_atom, (("dst", ir.MemRef(dst, row * ld + c0)), ("src", ir.RegRef(vals, 0))),
                            1, f"{PAD_CHUNK} bytes of the padded row"))
    note = f"{src.name} ({rows}x{cols}, rows of {cols * eb} bytes) -> {dst.name} (rows of {ld * eb} bytes)"
    return ir.Kernel(f"firesched_pad_{src.name}", (src, dst), (blocks, 1, 1), T, (), (vals,),
                     ir.Seq((ir.Comment(note), ir.If(lt(idx, total), ir.Seq(tuple(body))))), header=note)


def _call(atom, comment="", pred=1, **args):
    return ir.AtomCall(atom, tuple(args.items()), pred, comment)
