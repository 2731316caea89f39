"""The register file: each register buffer is a ``[threads, size]`` array, zero in every block.

Registers are private to their thread, so they cannot race; what is checked is the offset range
of every access and, in kernels that issue wgmma, the registers an asynchronous wgmma owns: its
accumulators (and the A fragment of the ``_rs`` form) are in flight until a ``wgmma.wait_group``
retires it (``busy``), and a wgmma may use a register only if no other instruction accessed it
since the thread's last ``wgmma.fence`` (``touch``).  Every access goes through ``index``, which
is what makes those two checks complete.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from .convert import to_dtype
from .lockstep import Lockstep
from .messages import listing


class Registers:
    """The register buffers of the running block (cluster), by name."""

    def __init__(self, kernel: ir.Kernel, ctx: Lockstep, track_wgmma: bool):
        self.ctx = ctx
        self.arrays = {r.name: np.zeros((ctx.T, r.size), dtype=r.dtype.np) for r in kernel.regs}
        self.bufs = {r.name: r for r in kernel.regs}
        self.track_wgmma = track_wgmma      # only kernels that issue wgmma pay for the tracking
        self._tile_idx: dict = {}           # tile_index's tables (holding their arrays' ids alive)
        self.flat = {n: a.reshape(-1) for n, a in self.arrays.items()}

    def reset(self):
        for r in self.arrays.values():
            r[...] = 0
        if self.track_wgmma:
            # per register: statement id + 1 of the last access by another instruction since the
            # thread's last wgmma.fence (0: none), and in-flight wgmma uses with their statement
            self.touch = {n: np.zeros(r.shape, dtype=np.int64) for n, r in self.arrays.items()}
            self.busy = {n: np.zeros(r.shape, dtype=np.int64) for n, r in self.arrays.items()}
            self.busy_stmt = {n: np.full(r.shape, -1, dtype=np.int64) for n, r in self.arrays.items()}
            # whether any register of a buffer is in flight (set by a wgmma's hold, recomputed when
            # one retires): most accesses touch buffers no wgmma owns, and skip the lookup
            self.busy_any = dict.fromkeys(self.arrays, False)

    def declared(self, buf) -> bool:
        """Whether register buffer ``buf`` is one of the kernel's."""
        return not (self.arrays.get(buf.name) is None or (self.bufs[buf.name] is not buf and self.bufs[buf.name] != buf))

    def index(self, ref: ir.RegRef, n: int, thr: np.ndarray):
        """``(array, index)`` selecting ``n`` registers from ``ref`` for each thread of ``thr``."""
        ctx = self.ctx
        buf = ref.buffer
        R = self.arrays.get(buf.name)
        if R is None or (self.bufs[buf.name] is not buf and self.bufs[buf.name] != buf):
            ctx.hazard(f"register buffer {buf.name!r} is not declared by the kernel")
        off = ctx.ev(ref.offset)
        rows = slice(None) if thr is ctx.tid else thr
        if type(off) is int or np.ndim(off) == 0:
            off = int(off)
            if off < 0 or off + n > buf.size:
                ctx.hazard(f"register buffer {buf.name!r} (size {buf.size}) accessed at offsets "
                           f"{off}..{off + n - 1}: out of range (threads {listing(thr)})")
            if self.track_wgmma:
                self.watch(buf.name, (rows, slice(off, off + n)), thr)
            return R, (rows, slice(off, off + n))
        offs = self._per_thread_value(off)[thr]
        cols = offs[:, None] + np.arange(n)[None, :]
        bad = (cols < 0) | (cols >= buf.size)
        if bad.any():
            t = np.flatnonzero(bad.any(axis=1))
            ctx.hazard(f"register buffer {buf.name!r} (size {buf.size}) accessed at offset "
                       f"{int(cols[t[0]][bad[t[0]]][0])}: out of range (threads {listing(thr[t])})")
        if self.track_wgmma:
            self.watch(buf.name, (thr[:, None], cols), thr)
        return R, (thr[:, None], cols)

    def column(self, ref: ir.RegRef, thr: np.ndarray) -> np.ndarray:
        """The one register ``ref`` of each thread of ``thr``, ``[len(thr)]``: ``index(ref, 1, thr)``
        (with its checks) read as a vector, without the ``[n, 1]`` intermediate."""
        R, (rows, cols) = self.index(ref, 1, thr)
        if type(cols) is slice:
            return R[rows, cols.start]
        return R[rows, cols][:, 0]

    def put_column(self, ref: ir.RegRef, thr: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` (``[len(thr)]``, of the buffer's dtype) into the one register ``ref`` of
        each thread of ``thr``, through ``index(ref, 1, thr)`` and its checks."""
        R, (rows, cols) = self.index(ref, 1, thr)
        if type(cols) is slice:
            R[rows, cols.start] = values
        else:
            R[rows, cols] = values[:, None]

    def _per_thread_value(self, v) -> np.ndarray:
        if np.ndim(v) == 0:
            return np.full(self.ctx.T, int(v), dtype=np.int64)
        return np.broadcast_to(np.asarray(v, dtype=np.int64), (self.ctx.T,))

    def watch(self, name: str, sel, thr):
        """A non-wgmma access of registers ``sel`` of buffer ``name``: a hazard while a wgmma uses
        them; remembered so that a wgmma without a wgmma.fence in between is caught."""
        busy = self.busy[name][sel] if self.busy_any[name] else None
        if busy is not None and busy.any():
            b = np.broadcast_to(self.busy_stmt[name][sel], busy.shape)[busy > 0]
            rows = np.broadcast_to(np.asarray(thr)[:, None], busy.shape)[busy > 0] if np.ndim(thr) else thr
            self.ctx.hazard(f"read or write of wgmma registers before wgmma.wait_group: threads "
                            f"{listing(np.unique(rows))} access register buffer {name!r}, which the in-flight "
                            f"{self.ctx.stmt_str(b[0])} uses as its accumulator or A fragment; retire it with "
                            f"wgmma.commit_group and wgmma.wait_group first")
        self.touch[name][sel] = self.ctx.sid(self.ctx.stmt) + 1

    # ----------------------------------------------------------------- collective atoms

    def tile_index(self, ref: ir.RegRef, groups: np.ndarray, where) -> tuple[np.ndarray, np.ndarray] | None:
        """``(flat registers, index)``: ``flat[index]`` is the ``[G, E]`` stack of tiles of ``ref``
        whose element e of group g is register ``where[1][e]`` of thread ``groups[g, where[0][e]]``
        (an atom's ``AtomTables.tile_regs``) — one gather or scatter for a whole collective atom.
        None where the per-access bookkeeping must see each access (wgmma ownership, an offset that
        differs between threads): ``read_group`` and ``write_group`` then."""
        if self.track_wgmma:
            return None
        buf = ref.buffer
        off = self.ctx.ev(ref.offset)
        if type(off) is not int:
            if np.ndim(off) != 0:
                return None
            off = int(off)
        lanes, regs, top = where
        if off < 0 or off + top >= buf.size or not self.declared(buf):
            return None                     # read_group reports it
        fixed = not groups.flags.writeable  # a cached thread-group table: its id is stable
        key = (id(groups), buf.size, id(lanes))
        hit = self._tile_idx.get(key) if fixed else None
        if hit is None:
            # C order: fancy indexing along axis 1 leaves ``groups[:, lanes]`` in Fortran order, and
            # gathering through it would hand semantics strided tiles (twice as slow, here and there)
            idx = np.ascontiguousarray(groups[:, lanes] * buf.size + regs)
            if fixed:
                self._tile_idx[key] = (groups, lanes, idx)
        else:
            idx = hit[2]
        return self.flat[buf.name][off:], idx

    def _group_threads(self, groups) -> np.ndarray:
        """The threads of ``groups`` in order: ``ctx.tid`` itself when they are all the threads in
        order (a whole block of warps), so that ``index`` selects rows by a slice."""
        thr = groups.ravel()
        if thr.size == self.ctx.T and thr[0] == 0 and thr[-1] == thr.size - 1 and (thr[1:] > thr[:-1]).all():
            return self.ctx.tid
        return thr

    def read_group(self, ref, groups, nvals):
        """``[G, n, nvals]`` registers of ``ref`` for the ``[G, n]`` threads of ``groups``."""
        R, idx = self.index(ref, nvals, self._group_threads(groups))
        return R[idx].reshape(groups.shape[0], groups.shape[1], nvals)

    def write_group(self, ref, groups, vals):
        """Write ``[G, n, V]`` values into ``V`` registers of ``ref`` of the threads of ``groups``,
        rounded to its dtype where they are not of it already."""
        thr = self._group_threads(groups)
        G, n, V = vals.shape
        R, idx = self.index(ref, V, thr)
        dt = ref.buffer.dtype
        R[idx] = to_dtype(vals.reshape(G * n, V), dt) if vals.dtype != dt.np else vals.reshape(G * n, V)
