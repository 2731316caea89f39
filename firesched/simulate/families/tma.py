"""TMA (sm_90a): tensor-map loads of 2-D and 3-D boxes (2-D ones also multicast to several blocks of
a cluster), stores, and their bulk async-group commit / wait.

A load's box (zeros outside the tensor) is written into shared memory at issue by the async
proxy, tagged with its mbarrier and the phase its bytes complete: the bytes are accounted at
issue, so in lockstep code a phase is either complete or can never be.  A thread may read (or
overwrite) a tagged element only after it has observed that phase, and a load into memory that
other threads read must be ordered after those reads.  A store reads its box at issue (checked
like a read of the issuing thread, plus the proxy fence), writes the in-bounds elements to global
memory and keeps its source in flight until its bulk group is retired.  Swizzled boxes must have
an inner extent equal to the swizzle span (the only form the lowering emits).

A box of any rank is placed alike (``hardware.tma.box_byte_offsets_nd``): coordinates ``c0`` ..
``c{r-1}`` innermost first, an element outside the tensor in any dimension reads as zero (load)
or is not written (store), and a load completes the bytes of the whole box, out-of-bounds
elements included, as the hardware counts them.
"""

from __future__ import annotations

import numpy as np

from ... import ir
from ...errors import InternalError
from ...hardware import tma as tma_format
from ...hardware.atoms import catalog
from ..messages import describe
from .operands import bar_ids, scalar


def tma(k, s):
    """TMA: a load, a multicast load, a store, a bulk commit_group or a bulk wait_group."""
    name = s.atom.name
    if name in ("tma_load_2d", "tma_load_3d", "tma_load_4d", "tma_load_5d", "tma_load_2d_multicast"):
        _copy(k, s, load=True)
    elif name in ("tma_store_2d", "tma_store_3d", "tma_store_4d", "tma_store_5d"):
        _copy(k, s, load=False)
    elif name == "tma_commit":
        k.tma.commit(k.ctx.active())
    elif name in ("tma_wait_read", "tma_wait"):
        n = catalog.immediates_of(s.atom).get("n")
        if n is None:
            raise InternalError(f"{describe(s)}: substitute $n first (catalog.with_immediates(atom, n=...))")
        k.tma.retire(n)
    else:
        raise InternalError(f"{describe(s)}: unknown TMA atom {name}")


def _tmap(k, s) -> ir.TensorMapParam:
    tm = s.arg("tmap")
    if not isinstance(tm, ir.TensorMapParam) or k.mem.tmaps.get(tm.name) != tm:
        k.ctx.hazard(f"{describe(s)}: operand tmap must be a TensorMapParam of the kernel, not {tm!r}")
    if k.mem.pending:
        k.mem.check_dependent(tm.buffer.name)
    return tm


def _copy(k, s, load: bool):
    ctx, mem, bars = k.ctx, k.mem, k.bars
    on, _ = ctx.enabled(s)
    if on.size == 0:
        return
    atom = s.atom
    tm = _tmap(k, s)
    gbuf = tm.buffer
    bits = gbuf.dtype.bits
    eb = max(bits // 8, 1)
    box = tuple(int(x) for x in tm.box)
    rank = len(box)
    # the atom's coordinate operands c0, c1, ... say the rank of the map it was written for
    names = [o.name for o in atom.operands if o.name[:1] == "c" and o.name[1:].isdigit()]
    if len(names) != rank:
        ctx.hazard(f"{describe(s)}: {atom.name} takes a tensor map of rank {len(names)}; {tm.name} has rank "
                   f"{rank} (buffer {gbuf.name} of shape {gbuf.shape}): use the {rank}-D TMA atom")
    bc = box[-1]
    nbox = int(np.prod(box))
    if tm.swizzle and bc * eb != tm.swizzle:
        raise InternalError(f"{describe(s)}: the interpreter models swizzled TMA boxes whose inner extent "
                            f"equals the swizzle span; {tm.name} has {bc * eb} bytes with {tm.swizzle}-byte "
                            f"swizzle")
    ref = s.arg("dst" if load else "src")
    if not isinstance(ref, ir.MemRef) or not isinstance(ref.buffer, ir.SharedBuffer):
        raise InternalError(f"{describe(s)}: a TMA {'load writes' if load else 'store reads'} shared memory")
    sh = mem.shared_of(ref.buffer)
    if sh.buf.dtype.bits != gbuf.dtype.bits:
        raise InternalError(f"{describe(s)}: shared buffer {sh.buf.name} holds {sh.buf.dtype}, the tensor "
                            f"map {tm.name} moves {gbuf.dtype}")
    # coords[p]: coordinate p (innermost first) of each enabled thread
    coords = [scalar(k, s, f"c{p}")[on] for p in range(rank)]
    # a map of 4-bit elements counts its innermost coordinate in bytes (two elements)
    coords[0] = coords[0] * tm.unit
    offs = ctx.per_thread(ref.offset)[on]
    mem.check_align(atom, ref, offs, on)
    ids = bar_ids(k, s, "mbar", on) if load else None
    C = ctx.C
    if s.atom.name == "tma_load_2d_multicast":
        masks = scalar(k, s, "mask")[on]
        bad = (masks <= 0) | (masks >= 1 << C)
        if bad.any():
            i = np.flatnonzero(bad)[0]
            ctx.hazard(f"TMA multicast mask {int(masks[i]):#x} of thread {int(on[i])}: a cluster of "
                       f"{C} block(s) takes a non-empty mask below {1 << C:#x}")
        targets = [[q for q in range(C) if int(m) >> q & 1] for m in masks.tolist()]
    else:
        targets = [[int(ctx.rank[t])] for t in on.tolist()]
    gl = mem.arrays[gbuf.name]
    shape = tuple(int(x) for x in gbuf.shape)
    strides = tuple(int(x) for x in gbuf.strides)
    # the box's index along dimension d (outermost first), shaped to broadcast over the box
    steps = [np.arange(n, dtype=np.int64).reshape((1,) * d + (n,) + (1,) * (rank - 1 - d))
             for d, n in enumerate(box)]
    for i, t in enumerate(on.tolist()):
        inside = np.ones(box, dtype=bool)
        flat = np.zeros(box, dtype=np.int64)
        for d in range(rank):
            # dimension d (outermost first) takes coordinate rank-1-d (innermost first)
            g = int(coords[rank - 1 - d][i]) + steps[d]
            inside = inside & (g >= 0) & (g < shape[d])
            flat = flat + np.clip(g, 0, shape[d] - 1) * strides[d]
        if bits < 8:
            # bytes of 4-bit elements land row after row, unswizzled (TensorMapParam allows no other)
            elems = int(offs[i]) + np.arange(nbox, dtype=np.int64).reshape(box)
        else:
            byte = sh.base + int(offs[i]) * eb
            elems = (tma_format.box_byte_offsets_nd(box, eb, tm.swizzle, byte) - sh.base) // eb
        e = elems.ravel()
        mem.check_bounds(ref, e[None, :], np.array([t]), "TMA box " + ("write" if load else "read"))
        if load:
            vals = np.zeros(box, dtype=gbuf.dtype.np)
            vals[inside] = gl[flat[inside]]
            if vals.dtype != sh.data.dtype:
                vals = vals.view(sh.data.dtype)
            for q in targets[i]:
                # the box lands at the same offset of each target block, and completes a
                # transaction on that block's mbarrier at the same offset
                eq = e + q * sh.n
                bar_id = int(ids[i]) % max(bars.n, 1) + q * bars.n
                bar = bars.get(bar_id, t)
                mem.tma_land(sh, eq, t, vals.ravel(), bar_id, bar.phase, ctx.sid(s))
                k.tma.load(bar_id, bar.phase, ctx.sid(s))
                bar.tx -= tm.box_bytes       # the whole box, out-of-bounds elements included
                bar.complete()
        else:
            e = e + int(ctx.rank[t]) * sh.n
            mem.sh_read(sh, e, np.full(e.size, t, dtype=np.int64))
            mem.proxy_check(sh, e, f"the TMA store of thread {t}")
            vals = sh.data[e].reshape(box)
            if vals.dtype != gl.dtype:
                vals = vals.view(gl.dtype)
            gl[flat[inside]] = vals[inside]
            k.tma.store(t, sh, e, ctx.sid(s))
