"""Warpgroup atoms (sm_90a): wgmma, its fence / commit_group / wait_group, and setmaxnreg.

wgmma is issued by whole warpgroups.  Its result is computed at issue (D = A @ B + D in float64,
rounded once to f32; D = A @ B where ``scale_d`` is 0), and the operation stays in flight until
its group is retired (``asyncs.WgmmaGroups``).  A warpgroup's first wgmma must follow a
``wgmma.fence``, and a register that another instruction accessed since the thread's last fence
may not feed a wgmma ("missing wgmma.fence"); wgmma after wgmma on the same accumulators needs no
fence.  Shared operands are read through their descriptors (``descriptors.operand_byte_offsets``,
all four swizzle modes; the start must be 16-byte aligned and, swizzled, on an 8-row swizzle-atom
boundary) on behalf of the warpgroup's first thread, and must be covered by a
``fence.proxy.async`` of their writers.
"""

from __future__ import annotations

import numpy as np

from ... import ir
from ...errors import InternalError
from ...hardware import descriptors
from ...hardware.atoms import catalog, sm90a
from ..messages import describe, listing
from ..tables import atom_tables
from .operands import scalar


def wgmma_sync(k, s):
    """WGMMA_SYNC: ``wgmma.fence``, ``wgmma.commit_group`` or ``wgmma.wait_group N``."""
    name = s.atom.name
    groups = k.ctx.issuing_groups(s)
    if groups.shape[0] == 0:
        return
    thr = groups.ravel()
    if name == "wgmma_fence":
        k.wg.fence(thr)
    elif name == "wgmma_commit":
        k.wg.commit(thr)
    elif name == "wgmma_wait":
        n = catalog.immediates_of(s.atom).get("n")
        if n is None:
            raise InternalError(f"{describe(s)}: substitute $n first (catalog.with_immediates(atom, n=...))")
        k.wg.retire(thr, n)
    else:
        raise InternalError(f"{describe(s)}: unknown wgmma synchronisation atom {name}")


def setmaxnreg(k, s):
    """SETMAXNREG: a no-op for the interpreter, but one that whole warpgroups must execute."""
    n = catalog.immediates_of(s.atom).get("n")
    if n is None or not 24 <= n <= 256 or n % 8:
        raise InternalError(f"{describe(s)}: setmaxnreg needs an immediate $n in 24..256, a multiple "
                            f"of 8 (catalog.with_immediates); got {n!r}")
    k.ctx.issuing_groups(s)         # whole warpgroups or a hazard; otherwise a no-op


def _regs(k, s, name: str, count: int) -> tuple[str, int]:
    """Register operand ``name`` of a wgmma: its buffer name and (warpgroup-uniform) offset."""
    ref = s.arg(name)
    if not isinstance(ref, ir.RegRef):
        raise InternalError(f"{describe(s)}: wgmma operand {name} takes a RegRef, not {ref!r}")
    buf = ref.buffer
    if not k.regs.declared(buf):
        k.ctx.hazard(f"register buffer {buf.name!r} is not declared by the kernel")
    off = k.ctx.ev(ref.offset)
    if np.ndim(off) != 0:
        raise InternalError(f"{describe(s)}: wgmma register offsets must be the same for every thread")
    off = int(off)
    if off < 0 or off + count > buf.size:
        k.ctx.hazard(f"register buffer {buf.name!r} (size {buf.size}) accessed at offsets {off}..{off + count - 1} "
                     f"by a wgmma: out of range")
    return buf.name, off


def _fenced(k, name: str, off: int, cnt: int, thr: np.ndarray, what: str):
    """Registers a wgmma reads must not have been accessed since the threads' last wgmma.fence."""
    touch = k.regs.touch[name][thr, off:off + cnt]
    if touch.any():
        rows = np.flatnonzero(touch.any(axis=1))
        sid = int(touch[rows[0]][touch[rows[0]] > 0][0]) - 1
        k.ctx.hazard(f"missing wgmma.fence: the wgmma reads its {what} registers {name}[{off}..{off + cnt - 1}], "
                     f"which {k.ctx.stmt_str(sid)} accessed after the last wgmma.fence of threads "
                     f"{listing(thr[rows])}")


def _operand(k, s, ref, rows: int, major: str, who: int, thr: np.ndarray, dtype) -> tuple:
    """The [rows, 16] tile a descriptor operand names, and its elements (for in-flight marks)."""
    ctx, mem = k.ctx, k.mem
    if not isinstance(ref, ir.DescRef):
        raise InternalError(f"{describe(s)}: a wgmma descriptor operand takes an ir.DescRef, not {ref!r}")
    sh = mem.shared_of(ref.buffer)
    eb = sh.buf.dtype.bits // 8
    if sh.buf.dtype.bits != dtype.bits:
        raise InternalError(f"{describe(s)}: shared buffer {sh.buf.name} holds {sh.buf.dtype}; the wgmma "
                            f"reads {dtype}")
    off = ctx.per_thread(ref.offset)[thr]
    if (off != off[0]).any():
        ctx.hazard(f"wgmma descriptor offset differs between the threads of a warpgroup "
                   f"({listing(np.unique(off))}); it must be warpgroup-uniform")
    start = sh.base + int(off[0]) * eb
    if start % 16:
        ctx.hazard(f"wgmma descriptor of SH buffer {sh.buf.name!r} starts at shared byte {start}, which is "
                   f"not 16-byte aligned (the descriptor drops the low 4 bits)")
    if ref.swizzle and (start // ref.swizzle) % 8:
        ctx.hazard(f"wgmma descriptor of SH buffer {sh.buf.name!r} starts at shared byte {start}, inside "
                   f"row {(start // ref.swizzle) % 8} of a {ref.swizzle}-byte swizzle atom: the first row "
                   f"must sit on a multiple of {8 * ref.swizzle} bytes (firesched encodes base offset 0)")
    byte = descriptors.operand_byte_offsets(start, ref.lbo, ref.sbo, ref.swizzle, rows, major=major, elem_bytes=eb)
    rel = byte - sh.base
    bad = (rel < 0) | (rel >= sh.buf.size * eb)
    if bad.any():
        r, c = (int(x[0]) for x in np.nonzero(bad))
        ctx.hazard(f"wgmma operand outside its buffer: element ({r}, {c}) of the descriptor of SH buffer "
                   f"{sh.buf.name!r} (size {sh.buf.size}) is at element offset {int(rel[r, c]) // eb}")
    e = (rel // eb).ravel()
    if ctx.C > 1:
        e = e + int(ctx.rank[who]) * sh.n
    mem.sh_read(sh, e, np.full(e.size, who, dtype=np.int64))
    mem.proxy_check(sh, e, f"the wgmma of threads {int(thr[0])}..{int(thr[-1])}")
    data = sh.data[e]
    if data.dtype != dtype.np:
        data = data.view(dtype.np)
    return data.reshape(rows, -1), (sh, e)


def wgmma(k, s):
    """WGMMA: per issuing warpgroup, compute D now and keep its registers and operands in flight."""
    ctx, regs, wg = k.ctx, k.regs, k.wg
    atom = s.atom
    tab = atom_tables(atom)
    groups = ctx.issuing_groups(s)
    if groups.shape[0] == 0:
        return
    m, n, kk = (int(x) for x in atom.shape)
    ab = atom.dtype_of("a")
    dref = s.arg("d")
    if dref.buffer.dtype.bits != 32:
        raise InternalError(f"{describe(s)}: the accumulators are f32 registers, not {dref.buffer.dtype}")
    nd = n // 2
    dname, doff = _regs(k, s, "d", nd)
    rs = any(o.name == "a" for o in atom.operands)
    if rs:
        aref = s.arg("a")
        if aref.buffer.dtype.bits != 16:
            raise InternalError(f"{describe(s)}: the A fragment is 16-bit registers, not {aref.buffer.dtype}")
        aname, aoff = _regs(k, s, "a", 8)
    scale = scalar(k, s, "scale_d")
    D = regs.arrays[dname]
    sid = ctx.sid(s)
    for thr in groups:
        sc = scale[thr]
        if (sc != sc[0]).any():
            ctx.hazard(f"wgmma scale_d differs within the warpgroup of threads {int(thr[0])}..{int(thr[-1])}")
        if not wg.fenced[thr].all():
            ctx.hazard(f"missing wgmma.fence: the first wgmma of the warpgroup of threads "
                       f"{int(thr[0])}..{int(thr[-1])} must follow a wgmma.fence")
        _fenced(k, dname, doff, nd, thr, "accumulator")
        smem = []
        if rs:
            _fenced(k, aname, aoff, 8, thr, "A fragment")
            vals = regs.arrays[aname][thr, aoff:aoff + 8]
            if vals.dtype != ab.np:
                vals = vals.view(ab.np)
            a_tile = np.zeros(m * kk, dtype=vals.dtype)
            a_tile[tab.tv["a"].ravel()] = vals.ravel()
            a_tile = a_tile.reshape(kk, m).T
        else:
            a_tile, rd = _operand(k, s, s.arg("desc_a"), m, sm90a.a_major(atom), int(thr[0]), thr, ab)
            smem.append(rd)
        bt, rd = _operand(k, s, s.arg("desc_b"), n, sm90a.b_major(atom), int(thr[0]), thr, ab)
        smem.append(rd)
        idx = tab.tv["d"]
        if sc[0] != 0:
            c_tile = np.zeros(m * n, dtype=np.float32)
            c_tile[idx.ravel()] = D[thr, doff:doff + nd].astype(np.float32).ravel()
            c_tile = c_tile.reshape(n, m).T
        else:
            c_tile = np.zeros((m, n), dtype=np.float32)
        d = np.asarray(atom.semantics(a_tile, bt.T, c_tile), dtype=np.float32)
        D[thr, doff:doff + nd] = np.ravel(d, order="F")[idx].astype(D.dtype)
        held = [(dname, doff, nd)] + ([(aname, aoff, 8)] if rs else [])
        wg.hold(thr, held, sid)
        # (each operand was also recorded as a read by the warpgroup in this barrier epoch, by
        # ``_operand``, so that a later write by a thread of another warpgroup, a TMA refill of the
        # stage, needs a barrier between)
        for sh, e in smem:
            sh.begin_async_read(e, sid)
        wg.track(thr, held, smem, sid)
