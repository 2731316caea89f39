"""Per-thread copies: COPY (loads, stores, register moves) and cp.async with its groups.

A copy moves bits: buffers of equal width but different dtypes are reinterpreted, never
converted.  ``pred`` and the ``If`` mask both disable a thread: a disabled COPY load zeroes its
registers without reading (or bounds-checking) its source, a disabled store does nothing, a
disabled CP_ASYNC zero-fills its destination (still in flight until waited for, as the hardware's
``src-size`` 0 form does).
"""

from __future__ import annotations

import re

import numpy as np

from ... import ir
from ...errors import HazardError, InternalError
from ..messages import describe
from .operands import bar_ids, scalar


def copy(k, s):
    """COPY: ``values_for(dtype)`` contiguous elements per enabled thread."""
    ctx, mem, regs = k.ctx, k.mem, k.regs
    atom = s.atom
    src, dst = s.arg("src"), s.arg("dst")
    sdt, ddt = src.buffer.dtype, dst.buffer.dtype
    if sdt.bits != ddt.bits:
        raise InternalError(f"{describe(s)}: source dtype {sdt} and destination dtype {ddt} differ in width")
    n = atom.values_for(sdt)
    if n == 0:
        raise InternalError(f"{describe(s)}: atom {atom.name} ({atom.width} bytes) cannot move {sdt} elements")
    on, act = ctx.enabled(s)
    load = isinstance(dst, ir.RegRef) and isinstance(src, ir.MemRef)
    lane = np.arange(n, dtype=np.int64)[None, :]
    if on.size:
        if isinstance(src, ir.RegRef):
            R, idx = regs.index(src, n, on)
            vals = R[idx]
        else:
            base = ctx.per_thread(src.offset)[on]
            mem.check_bounds(src, base[:, None] + lane, on, "read")
            mem.check_align(atom, src, base, on)
            vals = mem.read(src, base[:, None] + lane, np.broadcast_to(on[:, None], (on.size, n)), on)
        if sdt != ddt:
            vals = vals.view(ddt.np) if sdt.np.itemsize == ddt.np.itemsize else vals.astype(ddt.np)
        if isinstance(dst, ir.RegRef):
            R, idx = regs.index(dst, n, on)
            R[idx] = vals
        else:
            base = ctx.per_thread(dst.offset)[on]
            mem.check_bounds(dst, base[:, None] + lane, on, "write")
            mem.check_align(atom, dst, base, on)
            mem.write(dst, base[:, None] + lane, np.broadcast_to(on[:, None], (on.size, n)), on, vals)
    if load and on.size != act.size:
        off = act[~np.isin(act, on)]
        R, idx = regs.index(dst, n, off)
        R[idx] = 0


def _cluster_ranks(k, s, what: str):
    """The threads ``s`` enables and the cluster rank (``cta`` operand) each addresses; a rank
    outside the cluster is a hazard (``what`` names the access)."""
    ctx = k.ctx
    on, _ = ctx.enabled(s)
    if on.size == 0:
        return on, on
    cta = scalar(k, s, "cta")[on]
    bad = (cta < 0) | (cta >= ctx.cluster)
    if bad.any():
        i = np.flatnonzero(bad)[0]
        ctx.hazard(f"{what} cluster rank {int(cta[i])} (thread {int(on[i])}): the cluster has {ctx.cluster} "
                   f"block(s)", thread=int(on[i]))
    return on, cta


def _remote_access(k, s, side: str, what: str, access: str):
    """The threads of the distributed-shared-memory access ``s`` whose ``side`` operand (``src``:
    a load, ``dst``: a push) is another block's copy of a shared buffer: (the enabled threads,
    the cluster rank each addresses, each one's offset in the buffer, the values a thread moves,
    the buffer's memory), with the ranks, bounds and alignment checked; where no thread is
    enabled, (empty, empty, None, n, None).  ``what`` names the access in a bad rank's report,
    ``access`` in a bounds one."""
    ctx, mem = k.ctx, k.mem
    atom = s.atom
    src, dst, ref = s.arg("src"), s.arg("dst"), s.arg(side)
    if not isinstance(ref, ir.MemRef) or not isinstance(ref.buffer, ir.SharedBuffer):
        raise InternalError(f"{describe(s)}: {atom.name} {'reads' if side == 'src' else 'writes'} a shared buffer")
    sdt, ddt = src.buffer.dtype, dst.buffer.dtype
    n = atom.values_for(ref.buffer.dtype)
    if sdt.bits != ddt.bits or n == 0:
        raise InternalError(f"{describe(s)}: atom {atom.name} cannot move {sdt} into {ddt}")
    on, cta = _cluster_ranks(k, s, what)
    if on.size == 0:
        return on, cta, None, n, None
    base = ctx.per_thread(ref.offset)[on]
    mem.check_bounds(ref, base[:, None] + np.arange(n, dtype=np.int64)[None, :], on, access)
    mem.check_align(atom, ref, base, on)
    return on, cta, base, n, mem.shared_of(ref.buffer)


def dsmem(k, s):
    """DSMEM: each enabled thread loads ``values_for(dtype)`` elements from the copy of a shared
    buffer that the block of cluster rank ``cta`` holds, at the offset of its own (a read of that
    block's memory, checked against its writers: a ``barrier.cluster`` orders them); or pushes
    them there (``st_async_cluster_4``, ``dsmem_push``)."""
    if s.atom.name == "st_async_cluster_4":
        return dsmem_push(k, s)
    ctx, mem, regs = k.ctx, k.mem, k.regs
    src, dst = s.arg("src"), s.arg("dst")
    on, cta, base, n, sh = _remote_access(k, s, "src", "distributed shared memory load from",
                                          "read (distributed shared memory)")
    if on.size == 0:
        return
    # the target block's copy: ranks are the cluster's blocks, and only a cluster runs together
    e = base[:, None] + np.arange(n, dtype=np.int64)[None, :] + \
        (ctx.rank[on] - ctx.rank[on] % ctx.cluster + cta)[:, None] * sh.n
    mem.sh_read(sh, e, np.broadcast_to(on[:, None], e.shape))
    vals = sh.data[e]
    if src.buffer.dtype != dst.buffer.dtype:
        vals = vals.view(dst.buffer.dtype.np)
    R, idx = regs.index(dst, n, on)
    R[idx] = vals


def dsmem_push(k, s):
    """``st.async`` into the copy of a shared buffer that the block of cluster rank ``cta`` holds
    (at the offset of the caller's own), completing its bytes on that block's copy of the mbarrier
    ``bar``: the data lands like a TMA load's — tagged with the mbarrier's phase, so a reader of
    that block must have waited on the phase (``try_wait.parity``) first."""
    ctx, mem, regs, bars = k.ctx, k.mem, k.regs, k.bars
    src, dst = s.arg("src"), s.arg("dst")
    sdt, ddt = src.buffer.dtype, dst.buffer.dtype
    on, cta, base, n, sh = _remote_access(k, s, "dst", "st.async into", "write (st.async)")
    if on.size == 0:
        return
    lane = np.arange(n, dtype=np.int64)
    R, idx = regs.index(src, n, on)
    vals = np.asarray(R[idx]).reshape(on.size, n)
    if sdt != ddt:
        vals = vals.view(ddt.np)
    ids = bar_ids(k, s, "bar", on)
    target = (ctx.rank[on] - ctx.rank[on] % ctx.cluster + cta).astype(np.int64)
    bar_id = ids.astype(np.int64) % max(bars.n, 1) + target * bars.n
    elems = (base + target * sh.n)[:, None] + lane[None, :]
    nbytes = n * ddt.bits // 8
    if _push_at_once(k, s, sh, on, elems, vals, bar_id, nbytes):
        return
    for i, t in enumerate(on.tolist()):
        b = int(bar_id[i])
        bar = bars.get(b, t)
        mem.tma_land(sh, elems[i], t, vals[i], b, bar.phase, ctx.sid(s))
        k.tma.load(b, bar.phase, ctx.sid(s))
        bar.tx -= nbytes
        bar.complete()


def _push_at_once(k, s, sh, on, elems, vals, bar_id, nbytes: int) -> bool:
    """Land the ``st.async`` pushes of all threads ``on`` as one write where that is exactly what
    landing them thread by thread (``dsmem_push``'s loop) does: each element is written once, each
    thread's mbarrier is initialised and visible to it, and no check fails (the loop then finds the
    hazard and reports it as it meets it).  The bytes of each thread land in the phase its
    mbarrier is in when they do, after the pushes before it (a push can complete a phase).
    Returns whether it landed them."""
    ctx, mem, bars = k.ctx, k.mem, k.bars
    flat = elems.ravel()
    if np.unique(flat).size != flat.size:
        return False
    threads, ids = on.tolist(), bar_id.tolist()
    state: dict[int, tuple[int, int, int]] = {}      # mbarrier -> (tx, pending, phase) as the pushes go
    phases = np.empty(on.size, dtype=np.int64)
    for i, (t, b) in enumerate(zip(threads, ids)):
        bar = bars.by_id.get(b)
        if bar is None or (bar.init_epoch == bars.order.epoch and bar.init_thread != t):
            return False                             # bars.get reports it, in the loop
        tx, pending, phase = state.get(b, (bar.tx, bar.pending, bar.phase))
        phases[i] = phase
        tx -= nbytes
        if pending == 0 and tx == 0:
            phase, pending = phase + 1, bar.count
        state[b] = (tx, pending, phase)
    n = elems.shape[1]
    try:
        mem.tma_land(sh, flat, np.repeat(on, n), vals.reshape(-1), np.repeat(bar_id, n), np.repeat(phases, n),
                     ctx.sid(s))
    except HazardError:
        return False
    for i, (t, b) in enumerate(zip(threads, ids)):
        bar = bars.get(b, t)
        k.tma.load(b, int(phases[i]), ctx.sid(s))
        bar.tx -= nbytes
        bar.complete()
    return True


def cp_async(k, s):
    """CP_ASYNC: read the source now, check the destination like a write now, land it at the wait."""
    ctx, mem = k.ctx, k.mem
    atom = s.atom
    src, dst = s.arg("src"), s.arg("dst")
    if not isinstance(dst, ir.MemRef) or not isinstance(dst.buffer, ir.SharedBuffer):
        raise InternalError(f"{describe(s)}: cp.async must write shared memory")
    sdt, ddt = src.buffer.dtype, dst.buffer.dtype
    if sdt.bits != ddt.bits:
        raise InternalError(f"{describe(s)}: source dtype {sdt} and destination dtype {ddt} differ in width")
    n = atom.values_for(ddt)
    if n == 0:
        raise InternalError(f"{describe(s)}: atom {atom.name} ({atom.width} bytes) cannot move {ddt} elements")
    act = ctx.active()
    if act.size == 0:
        return
    p = (ctx.per_thread(s.pred)[act] != 0) if type(s.pred) is not int else np.full(act.size, bool(s.pred))
    sh = mem.target(dst)
    dbase = ctx.per_thread(dst.offset)[act]                   # each thread copies a row of n
    mem.check_bounds_rows(dst, dbase, n, act, "write (cp.async destination)")
    mem.check_align(atom, dst, dbase, act)
    on = act[p]
    vals = None
    if on.size:
        sbase = ctx.per_thread(src.offset)[on]
        if s.src_bytes is None:
            mem.check_bounds_rows(src, sbase, n, on, "read (cp.async source)")
            mem.check_align(atom, src, sbase, on)
            data = mem.read_rows(src, sbase, on, n)           # a copy: it lands later
        else:
            mem.check_align(atom, src, sbase, on)
            data = _partial_rows(mem, src, sbase, on, n, ctx.per_thread(s.src_bytes)[on] * 8 // sdt.bits)
        if sdt != ddt:
            data = data.view(ddt.np) if sdt.np.itemsize == ddt.np.itemsize else data.astype(ddt.np)
        if on.size == act.size:
            vals = data
        else:
            vals = np.zeros((act.size, n), dtype=ddt.np)
            vals[p] = data
    if vals is None:
        vals = np.zeros((act.size, n), dtype=ddt.np)
    first = mem.in_block(sh, dbase, act)
    mem.sh_write_check_rows(sh, first, act, n)
    k.cp.issue(sh, first, act, vals, ctx.sid(s))


def _partial_rows(mem, src, first, thr, n: int, got) -> np.ndarray:
    """A partial chunk of each thread (``cp.async``'s src-size): the first ``got`` of the ``n``
    elements from each offset of ``first`` read (and bounds-checked), the rest zero."""
    got = np.clip(got, 0, n)
    lane = np.arange(n, dtype=np.int64)[None, :]
    keep = lane < got[:, None]
    addr = np.where(keep, first[:, None] + lane, first[:, None])
    some = got > 0
    mem.check_bounds(src, addr[some], thr[some], "read (cp.async source)")
    data = np.zeros((first.size, n), dtype=src.buffer.dtype.np)
    if some.any():
        rows = np.broadcast_to(thr[some][:, None], (int(some.sum()), n))
        data[some] = np.where(keep[some], mem.read(src, addr[some], rows, thr[some]), 0)
    return data


def commit(k, s):
    """``AsyncCommit`` (or the ``cp_async_commit`` atom): the active threads close their group."""
    k.ctx.stmt = s
    k.cp.commit(k.ctx.active())


def wait(k, s):
    """``AsyncWait(pending)``: the active threads' groups but the last ``pending`` land."""
    k.ctx.stmt = s
    k.cp.wait(int(s.pending), k.mem.sh_land)


def wait_atom(k, s):
    """A ``cp.async.wait_group N`` / ``wait_all`` atom: ``AsyncWait(N)``; wait_all first commits
    the open group, as the PTX instruction does."""
    k.ctx.stmt = s
    n = wait_count(s.atom)
    if "wait_all" in s.atom.ptx:
        k.cp.commit(k.ctx.active())
    k.cp.wait(n, k.mem.sh_land)


def wait_count(atom) -> int:
    """The ``pending`` count of a ``cp.async.wait_group N`` atom (its immediate substituted by
    ``catalog.with_immediates``); ``wait_all`` waits for everything."""
    m = re.search(r"wait_group\s+(\d+)", atom.ptx)
    if m:
        return int(m.group(1))
    if "wait_all" in atom.ptx:
        return 0
    raise InternalError(f"atom {atom.name}: cannot tell how many groups it leaves pending from its PTX "
                        f"{atom.ptx!r}; substitute the immediate with catalog.with_immediates(atom, n=...)")
