"""The memory model: global and shared buffers, bounds and alignment, and the race checks.

Global memory is one flat numpy array per buffer, shared by the kernels of a program; nothing is
checked there but bounds (a kernel's blocks run one after another, so global races between
blocks cannot be seen).  Shared memory starts as zeros in every block, and each element remembers
its access history so that every access can be checked against the ones before it:

* races: a read of an element another thread wrote since the last barrier (RAW), a write of an
  element another thread wrote (WAW) or read (WAR) since the last barrier, unless the vector
  clocks of ``order`` put the earlier access before this one.  An element keeps the epoch, the
  thread, the statement and the thread's own clock of its last write and of up to two distinct
  readers.  A statement reads before it writes: two threads writing one element in one statement
  race, several reading it do not.  Collective atoms (ldmatrix, wgmma) access memory on behalf of
  the thread whose address they use.
* in-flight data: the destination of a cp.async is in flight (``inflight``) until its group
  completes; any access before then is a hazard.
* the async proxy (sm_90a): a generic-proxy write (st.shared, stmatrix, cp.async) must be covered
  by a ``fence.proxy.async`` of its thread before wgmma or a TMA store reads it (``proxy_w``); an
  in-flight async-proxy reader (wgmma, TMA store) forbids overwriting its source (``async_rd``);
  the data of a TMA load is tagged with its mbarrier and phase (``tma_bar``, ``tma_phase``) and may
  be accessed only by a thread that has observed that phase.

Within a thread-block cluster every shared buffer has one copy per block; addresses are element
offsets of the issuing thread's own copy, which ``in_block`` turns into entries of the whole.
Accesses of whole aligned rows (vector loads, ldmatrix, cp.async) are tested and recorded a row
at a time (``Rows``), with the same per-element tests; where one fails, the element-by-element
path reports it.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import InternalError
from .convert import to_dtype
from .lockstep import Lockstep
from .mbarriers import MBarriers
from .messages import listing
from .order import Order

# --------------------------------------------------------------------------- global arrays


def load_global(buf: ir.GlobalBuffer, value) -> np.ndarray:
    """The flat array of global buffer ``buf`` holding ``value`` (its ``shape``, or flat; None:
    zeros)."""
    flat = np.zeros(buf.size, dtype=buf.dtype.np)
    if value is None:
        return flat
    value = np.asarray(value)
    if tuple(value.shape) == tuple(buf.shape):
        _strided(buf, flat)[...] = to_dtype(value, buf.dtype)
    elif value.ndim == 1 and value.size == buf.size:
        flat[...] = to_dtype(value, buf.dtype)
    else:
        raise ValueError(f"run_program: array for {buf.name!r} has shape {value.shape}; the buffer has "
                         f"shape {buf.shape} (or flat size {buf.size})")
    return flat


def unload_global(buf: ir.GlobalBuffer, flat: np.ndarray) -> np.ndarray:
    """The flat array of ``buf`` as an array of its ``shape`` (a copy)."""
    if buf.size == 0:
        return np.zeros(buf.shape, dtype=buf.dtype.np)
    return np.array(_strided(buf, flat))


def _strided(buf: ir.GlobalBuffer, flat: np.ndarray) -> np.ndarray:
    item = flat.dtype.itemsize
    return np.lib.stride_tricks.as_strided(flat, shape=buf.shape, strides=[s * item for s in buf.strides])


# --------------------------------------------------------------------------- shared buffers

#: The dtype of the access history: thread and statement ids, clocks, epochs and phases stay far
#: below 2**31, and the history of a batch of blocks is megabytes that every shared access
#: gathers and scatters at random; half the bytes make those accesses about twice as fast.
HISTORY = np.int32


class Shared:
    """One shared buffer of the running block (of each block of a running cluster): data plus the
    access history of each element."""

    __slots__ = ("buf", "n", "data", "w_epoch", "writer", "w_stmt", "r_epoch", "reader", "reader2",
                 "r_stmt", "w_clock", "r_clock", "r_clock2", "inflight", "inflight_stmt", "base", "sm90", "proxy_w", "async_rd",
                 "async_rd_stmt", "tma_bar", "tma_phase", "scratch", "_rows")

    def __init__(self, buf: ir.SharedBuffer, base: int, sm90: bool = False, copies: int = 1):
        # one copy per block of a thread-block cluster: block r's element e is entry r * n + e
        self.n = buf.size
        n = buf.size * copies
        self.buf = buf
        self.base = base
        self.data = np.zeros(n, dtype=buf.dtype.np)
        self.w_epoch = np.full(n, -1, dtype=HISTORY)
        self.writer = np.full(n, -1, dtype=HISTORY)
        self.w_stmt = np.full(n, -1, dtype=HISTORY)
        self.r_epoch = np.full(n, -1, dtype=HISTORY)
        self.reader = np.full(n, -1, dtype=HISTORY)   # first distinct reader this epoch
        self.reader2 = np.full(n, -1, dtype=HISTORY)  # a second distinct reader, or -1
        self.r_stmt = np.full(n, -1, dtype=HISTORY)
        # the own clock (see order.Order.own) of the writer / the two readers at their access
        self.w_clock = np.full(n, -1, dtype=HISTORY)
        self.r_clock = np.full(n, -1, dtype=HISTORY)
        self.r_clock2 = np.full(n, -1, dtype=HISTORY)
        self.inflight = np.full(n, -1, dtype=HISTORY)  # issuing thread of an in-flight cp.async
        self.inflight_stmt = np.full(n, -1, dtype=HISTORY)
        self.scratch = np.empty(n, dtype=np.int64)      # for _by_address; never read before written
        # sm_90a tracking: the thread of a generic-proxy write not yet covered by its
        # fence.proxy.async, in-flight async-proxy readers (wgmma, TMA store) and the mbarrier
        # phase a TMA load's data waits for
        self.sm90 = sm90
        if sm90:
            self.proxy_w = np.full(n, -1, dtype=HISTORY)
            self.async_rd = np.zeros(n, dtype=HISTORY)
            self.async_rd_stmt = np.full(n, -1, dtype=HISTORY)
            self.tma_bar = np.full(n, -1, dtype=HISTORY)
            self.tma_phase = np.full(n, -1, dtype=HISTORY)
        self._rows: dict[int, Rows] = {}

    def rows(self, per: int) -> Rows:
        """The arrays of this buffer seen as rows of ``per`` elements (views, made once)."""
        v = self._rows.get(per)
        if v is None:
            v = self._rows[per] = Rows(self, per)
        return v

    def take(self, name: str, u: np.ndarray) -> np.ndarray:
        """``getattr(self, name)[u]`` (the protocol ``Rows`` shares)."""
        return getattr(self, name)[u]

    def put(self, name: str, u: np.ndarray, v) -> None:
        """``getattr(self, name)[u] = v``."""
        getattr(self, name)[u] = v

    def reset(self):
        self.data[...] = 0
        for a in (self.w_epoch, self.writer, self.w_stmt, self.r_epoch, self.reader, self.reader2,
                  self.r_stmt, self.inflight, self.inflight_stmt, self.w_clock, self.r_clock, self.r_clock2):
            a[...] = -1
        if self.sm90:
            for a in (self.proxy_w, self.async_rd_stmt, self.tma_bar, self.tma_phase):
                a[...] = -1
            self.async_rd[...] = 0

    def begin_async_read(self, e: np.ndarray, sid: int):
        """An async-proxy operation (wgmma, TMA store) of statement ``sid`` starts reading ``e``."""
        self.async_rd[e] += 1
        self.async_rd_stmt[e] = sid

    def end_async_read(self, e: np.ndarray):
        """It has finished (retired by its wait_group)."""
        self.async_rd[e] -= 1


class Rows:
    """The arrays of a ``Shared`` (its data and its access history) as ``[rows, per]`` views:
    element e is entry ``e % per`` of row ``e // per``.  An access of whole aligned rows (a vector
    load, an ldmatrix row, a cp.async) tests and records the same per-element history through
    them, indexed by row: ``per`` times fewer indices, each moving a contiguous row.  The arrays
    are never reallocated (``reset`` fills them), so the views stay valid."""

    __slots__ = ("per", "moves", "data", "w_epoch", "writer", "w_stmt", "r_epoch", "reader", "reader2",
                 "r_stmt", "w_clock", "r_clock", "r_clock2", "inflight", "inflight_stmt", "proxy_w", "async_rd",
                 "tma_bar")

    def __init__(self, sh: Shared, per: int):
        self.per = per
        # each array also as one opaque item per row: np.take and np.put then move whole rows,
        # several times faster than numpy's fancy indexing of [rows, per] arrays
        self.moves: dict[str, tuple[np.ndarray, np.dtype]] = {}
        for name in self.__slots__[2:]:
            a = getattr(sh, name, None)         # the sm_90a arrays exist only where tracked
            if a is None:
                setattr(self, name, None)
                continue
            rows = a[: a.size // per * per].reshape(-1, per)
            setattr(self, name, rows)
            item = np.dtype((np.void, per * a.dtype.itemsize))
            self.moves[name] = (rows.view(item).reshape(-1), item)

    def take(self, name: str, r: np.ndarray) -> np.ndarray:
        """Rows ``r`` of array ``name``, ``[R, per]``."""
        return np.take(getattr(self, name), r, axis=0)

    def put(self, name: str, r: np.ndarray, v) -> None:
        """Set rows ``r`` of array ``name`` to ``v`` (a scalar, an ``[R, 1]`` column or ``[R, per]``
        of the array's dtype; anything else as numpy's indexing assigns it)."""
        rows = getattr(self, name)
        v = np.asarray(v)
        R, per = r.size, self.per
        if v.dtype != rows.dtype:
            if v.dtype.kind not in "iu" or rows.dtype.kind not in "iu":
                rows[r] = v
                return
            v = v.astype(rows.dtype)        # ids and clocks into the history's dtype
        if v.ndim == 0:
            v = np.full(R * per, v, dtype=rows.dtype)
        elif v.shape == (R, 1):
            v = np.repeat(v.reshape(R), per)
        elif v.shape == (R, per):
            v = np.ascontiguousarray(v)
        else:
            rows[r] = v
            return
        flat, item = self.moves[name]
        np.put(flat, r, v.view(item).reshape(R))


def aligned_rows(first: np.ndarray, per: int) -> np.ndarray | None:
    """The row numbers (``Rows``) of accesses of ``per`` elements from each of ``first``, or None
    where they are not whole rows (one element each, or a start that is not a multiple of ``per``)."""
    if per <= 1 or first.size == 0 or (first % per).any():
        return None
    return first // per


def _rows_by_address(sh: Shared, addr: np.ndarray, thr: np.ndarray):
    """``_by_address`` of ``addr`` (``[..., per]``) for threads ``thr`` (same shape), a row at a
    time where each row is one thread's ``per`` contiguous elements starting at a multiple of
    ``per`` (vector and ldmatrix accesses): two such rows coincide or do not meet, so the rows'
    first elements decide, and there are ``per`` times fewer of them."""
    a, t = addr.ravel(), thr.ravel()
    per = addr.shape[-1] if addr.ndim > 1 else 1
    if per > 1 and thr.strides[-1] == 0:
        first = addr[..., 0].ravel()
        if not (first % per).any() and (addr == addr[..., :1] + np.arange(per)).all():
            _, lo, hi = _by_address(sh, first, thr[..., 0].ravel())
            return a, np.repeat(lo, per), np.repeat(hi, per)
    return _by_address(sh, a, t)


def _by_address(sh: Shared, addr: np.ndarray, thr: np.ndarray):
    """For each access of a statement (``addr``, ``thr``, flat): its address, and the smallest and
    largest thread accessing that address in the statement.  Addresses may repeat; what is
    computed from these per address is the same for each repeat, so scattering it is harmless."""
    if addr.size <= 1:
        return addr, thr, thr
    s = sh.scratch
    pos = np.arange(addr.size, dtype=np.int64)
    s[addr] = pos
    if (s[addr] == pos).all():                  # every address once: the common case
        return addr, thr, thr
    s[addr] = np.iinfo(np.int64).max
    np.minimum.at(s, addr, thr)
    tmin = s[addr]
    s[addr] = -1
    np.maximum.at(s, addr, thr)
    return addr, tmin, s[addr]


# --------------------------------------------------------------------------- the memory of a run

class Memory:
    """The global arrays a kernel sees and the shared buffers of its running block (cluster)."""

    def __init__(self, kernel: ir.Kernel, arrays: dict[str, np.ndarray], ctx: Lockstep, order: Order,
                 bars: MBarriers, sm90: bool):
        self.ctx = ctx
        self.order = order
        self.bars = bars                    # to name the mbarrier phase a TMA load's data waits for
        self.arrays = arrays
        # run_kernel takes whatever arrays the caller has; a parameter it lacks starts as zeros
        for p in kernel.params:
            b = p.buffer if isinstance(p, ir.TensorMapParam) else p
            if b.name not in arrays:
                arrays[b.name] = np.zeros(b.size, dtype=b.dtype.np)
        self.kernel_name = kernel.name
        self.globals = {p.name: p for p in kernel.params if not isinstance(p, ir.TensorMapParam)}
        self.tmaps = {p.name: p for p in kernel.params if isinstance(p, ir.TensorMapParam)}
        offsets = kernel.shared_offsets()
        self.shared = {b.name: Shared(b, offsets[b.name], sm90, ctx.C) for b in kernel.shared if not b.alias}
        for b in kernel.shared:
            if b.alias:
                # an alias is the same elements, with the same access history
                own = self.shared.get(b.alias)
                if own is None or own.buf.dtype != b.dtype or own.buf.size < b.size:
                    raise InternalError(f"shared buffer {b.name!r} aliases {b.alias!r}, which the kernel does not "
                                        f"declare with its element type and at least its size")
                self.shared[b.name] = own
        self.xchg = None                    # the launch's flags (``families.flags.Exchange``), if any
        # a programmatic launch: buffers it may touch only after griddep_wait (``families.griddep``)
        self.pending: frozenset = frozenset()
        self.waited = np.zeros(ctx.T, dtype=bool)

    def reset(self):
        for sh in self.shared.values():
            sh.reset()
        self.waited[:] = False

    def check_dependent(self, name: str) -> None:
        """A programmatic launch touches global buffer ``name``: an earlier kernel of the program
        touched it too (or, for the program's first kernel, the launch before the program may
        have), so every thread must have waited for that kernel first."""
        if name in self.pending and not self.waited.all():
            self.ctx.hazard(f"kernel {self.kernel_name!r} is launched programmatically (it may run while the "
                            f"kernel before it finishes) and touches {name!r}, which an earlier kernel of the "
                            f"program (or, for its first kernel, the launch before the program) may also "
                            f"touch, before every thread has executed griddep_wait",
                            on=f"GL buffer {name!r}")

    # ----------------------------------------------------------------- buffers and addresses

    def target(self, ref: ir.MemRef):
        """The ``Shared`` state ``ref`` addresses, or None for global memory."""
        buf = ref.buffer
        if isinstance(buf, ir.SharedBuffer):
            sh = self.shared.get(buf.name)
            if sh is None or (sh.buf is not buf and sh.buf != buf and buf.alias != sh.buf.name):
                self.ctx.hazard(f"shared buffer {buf.name!r} is not declared by the kernel")
            return sh
        if isinstance(buf, ir.GlobalBuffer):
            known = self.globals.get(buf.name)
            if known is not buf and known != buf:
                self.ctx.hazard(f"global buffer {buf.name!r} is not a parameter of the kernel")
            if self.pending:
                self.check_dependent(buf.name)
            return None
        raise InternalError(f"MemRef to {buf!r}, which is neither global nor shared")

    def shared_of(self, buf) -> Shared:
        """The ``Shared`` state of ``buf``, which must be a shared buffer of the kernel."""
        sh = self.shared.get(getattr(buf, "name", None))
        if not isinstance(buf, ir.SharedBuffer) or sh is None or (sh.buf is not buf and sh.buf != buf
                                                                  and buf.alias != sh.buf.name):
            self.ctx.hazard(f"shared buffer {getattr(buf, 'name', buf)!r} is not declared by the kernel")
        return sh

    def in_block(self, sh: Shared, addr: np.ndarray, thr: np.ndarray) -> np.ndarray:
        """Element offsets ``addr`` of ``sh`` in the block of threads ``thr`` (same shape): the
        entries of that block's copy in a cluster."""
        if self.ctx.C == 1:
            return addr
        if thr.ndim > 1 and thr.strides[-1] == 0:      # a thread per row: one rank per row
            thr = thr[..., :1]
        return addr + self.ctx.rank[thr] * sh.n

    def check_bounds(self, ref: ir.MemRef, addr: np.ndarray, thr: np.ndarray, what: str):
        size = ref.buffer.size
        bad = (addr < 0) | (addr >= size)
        if bad.any():
            rows = np.flatnonzero(bad.reshape(addr.shape[0], -1).any(axis=1))
            first = addr.reshape(addr.shape[0], -1)[rows[0]]
            off = int(first[(first < 0) | (first >= size)][0])
            kind = "SH" if isinstance(ref.buffer, ir.SharedBuffer) else "GL"
            self.ctx.hazard(f"out-of-bounds {what}: {kind} buffer {ref.buffer.name!r} (size {size}) at offset "
                            f"{off} by thread {int(thr[rows[0]])} (threads {listing(thr[rows])} are out of bounds)",
                            thread=int(thr[rows[0]]), on=f"{kind} buffer {ref.buffer.name!r}")

    def check_bounds_rows(self, ref: ir.MemRef, first: np.ndarray, per: int, thr: np.ndarray, what: str):
        """``check_bounds`` of rows of ``per`` contiguous elements from each offset of ``first``
        (``[R]``), by threads ``thr``: a row is in bounds when its ends are."""
        if ((first < 0) | (first > ref.buffer.size - per)).any():
            self.check_bounds(ref, first[:, None] + np.arange(per), thr, what)

    def check_align(self, atom, ref: ir.MemRef, addr0: np.ndarray, thr: np.ndarray):
        align = int(getattr(atom, "alignment", 0) or 0)
        if align <= 1:
            return
        bits = ref.buffer.dtype.bits
        base = self.shared[ref.buffer.name].base if isinstance(ref.buffer, ir.SharedBuffer) else 0
        byte = base * 8 + addr0 * bits
        bad = byte % (8 * align) != 0
        if bad.any():
            i = np.flatnonzero(bad)
            self.ctx.hazard(f"misaligned address: {atom.name} needs {align}-byte aligned addresses; buffer "
                            f"{ref.buffer.name!r} offset {int(addr0[i[0]])} by thread {int(thr[i[0]])} "
                            f"(threads {listing(thr[i])})", thread=int(thr[i[0]]), on=f"buffer {ref.buffer.name!r}")

    # ----------------------------------------------------------------- accesses

    def read(self, ref: ir.MemRef, addr: np.ndarray, thr2d: np.ndarray, thr: np.ndarray) -> np.ndarray:
        """Read memory at ``addr`` (``[k, n]``, bounds already checked) for threads ``thr`` (``[k]``)."""
        sh = self.target(ref)
        if sh is None:
            if ref.buffer.exchange:
                self.xchg.check_read(self.ctx, ref.buffer.name, addr, thr2d)
            return self.arrays[ref.buffer.name][addr]
        addr = self.in_block(sh, addr, thr2d)
        self.sh_read(sh, addr, thr2d)
        return sh.data[addr]

    def read_rows(self, ref: ir.MemRef, first: np.ndarray, thr: np.ndarray, per: int) -> np.ndarray:
        """``read`` of rows: the ``[R, per]`` elements from each offset of ``first`` (``[R]``, bounds
        already checked) for threads ``thr`` (``[R]``)."""
        sh = self.target(ref)
        if sh is None:
            if ref.buffer.exchange:
                rows = first[:, None] + np.arange(per)
                self.xchg.check_read(self.ctx, ref.buffer.name, rows, np.broadcast_to(thr[:, None], rows.shape))
            flat = self.arrays[ref.buffer.name]
            r = aligned_rows(first, per)
            if r is not None:
                return np.take(flat[: flat.size // per * per].reshape(-1, per), r, axis=0)
            return flat[first[:, None] + np.arange(per)]
        e = self.in_block(sh, first, thr)
        self.sh_read_rows(sh, e, thr, per)
        r = aligned_rows(e, per)
        return sh.rows(per).take("data", r) if r is not None else sh.data[e[:, None] + np.arange(per)]

    def write(self, ref: ir.MemRef, addr: np.ndarray, thr2d: np.ndarray, thr: np.ndarray, values):
        """Write ``values`` at ``addr`` (bounds already checked) for threads ``thr``."""
        sh = self.target(ref)
        if sh is None:
            self.arrays[ref.buffer.name][addr] = values
            if ref.buffer.exchange:
                self.xchg.wrote(ref.buffer.name, addr, thr2d)
            return
        self.sh_write(sh, self.in_block(sh, addr, thr2d), thr2d, values)

    def sh_read(self, sh: Shared, addr: np.ndarray, thr: np.ndarray):
        """Check and record reads of ``addr`` (any shape) by ``thr`` (same shape)."""
        ctx, order = self.ctx, self.order
        a, t = addr.ravel(), thr.ravel()
        if sh.sm90:
            self.sm90_read_check(sh, a, t)
        inf = sh.inflight[a]
        if (inf >= 0).any():
            i = np.flatnonzero(inf >= 0)
            ctx.hazard(f"read of in-flight async data: thread {int(t[i[0]])} reads SH buffer "
                       f"{sh.buf.name!r} offset {int(a[i[0]])}, whose cp.async by thread {int(inf[i[0]])} "
                       f"({ctx.stmt_str(sh.inflight_stmt[a[i[0]]])}) has not been completed by an "
                       f"AsyncWait (threads {listing(np.unique(t[i]))} read in-flight data)",
                       thread=int(t[i[0]]), other=sh.inflight_stmt[a[i[0]]], other_thread=int(inf[i[0]]),
                       on=f"SH buffer {sh.buf.name!r}")
        E = order.epoch
        bad = sh.w_epoch[a] == E
        if bad.any():
            bad &= sh.writer[a] != t
        if bad.any():
            bad &= ~order.ordered(sh.writer[a], sh.w_clock[a], t)
        if bad.any():
            i = np.flatnonzero(bad)
            j = i[0]
            ctx.hazard(f"race (read after write): thread {int(t[j])} reads SH buffer {sh.buf.name!r} offset "
                       f"{int(a[j])}, written by thread {int(sh.writer[a[j]])} since the last barrier "
                       f"(at {ctx.stmt_str(sh.w_stmt[a[j]])}); {i.size} element read(s) race, by threads "
                       f"{listing(np.unique(t[i]))}", thread=int(t[j]), other=sh.w_stmt[a[j]],
                       other_thread=int(sh.writer[a[j]]), on=f"SH buffer {sh.buf.name!r}")
        u, tmin, tmax = _rows_by_address(sh, addr, thr)
        self._note_readers(sh, u, tmin, tmax)

    def sh_read_rows(self, sh: Shared, first: np.ndarray, thr: np.ndarray, per: int):
        """``sh_read`` of rows: thread ``thr[r]`` reads the ``per`` elements from entry ``first[r]``
        (``[R]`` each).  Whole aligned rows are tested and recorded a row at a time (``Rows``);
        where any test fails, or the rows are not whole, ``sh_read`` does it element by element,
        so that what it reports is what it always reported."""
        r = aligned_rows(first, per)
        if r is not None and self._read_rows(sh, sh.rows(per), r, thr):
            return
        addr = first[:, None] + np.arange(per)
        self.sh_read(sh, addr, np.broadcast_to(thr[:, None], addr.shape))

    def _read_rows(self, sh: Shared, H: Rows, r: np.ndarray, thr: np.ndarray) -> bool:
        """``sh_read``'s tests and records on rows ``r`` of ``H`` read by ``thr``; False (having
        changed nothing) where a test fails or a TMA tag needs the per-element test."""
        order = self.order
        t = thr[:, None]
        if sh.sm90 and (H.take("tma_bar", r) >= 0).any():
            return False
        if (H.take("inflight", r) >= 0).any():
            return False
        bad = H.take("w_epoch", r) == order.epoch
        if bad.any():
            w = H.take("writer", r)
            bad &= w != t
            if bad.any() and not order.ordered(w, H.take("w_clock", r), t)[bad].all():
                return False
        _, tmin, tmax = _by_address(sh, r, thr)
        self._note_readers(H, r, tmin[:, None], tmax[:, None])
        return True

    def _note_readers(self, H, u, tmin, tmax):
        """Record the readers of this epoch of elements ``u`` of ``H`` (a ``Shared``, or its
        ``Rows`` with ``tmin``/``tmax`` a column): keep the first distinct reader, and a second one
        that differs from it, so that a later writer can find a reader other than itself."""
        ctx, order = self.ctx, self.order
        E = order.epoch
        cur = H.take("r_epoch", u) == E
        sid = ctx.sid(ctx.stmt)
        two = tmax != tmin
        second = np.where(two, tmax, -1)
        if not cur.any() or ((H.take("reader", u) == tmin) & (H.take("reader2", u) == second) | ~cur).all():
            # the common cases: the first reads of these elements this epoch, or reads again by
            # the threads that read them before; what the general case below computes then
            H.put("r_clock", u, order.own(tmin))
            H.put("r_clock2", u, np.where(two, order.own(tmax), -1))
            H.put("reader", u, tmin)
            H.put("reader2", u, second)
            H.put("r_epoch", u, np.int64(E))
            H.put("r_stmt", u, np.int64(sid))
            return
        r1 = np.where(cur, H.take("reader", u), -1)
        r2 = np.where(cur, H.take("reader2", u), -1)
        fresh = r1 < 0
        new1 = np.where(fresh, tmin, r1)
        cand = np.where(tmin != new1, tmin, np.where(tmax != new1, tmax, -1))
        new2 = np.where(r2 >= 0, r2, cand)
        c1 = np.where(cur, H.take("r_clock", u), -1)
        c2 = np.where(cur, H.take("r_clock2", u), -1)
        own1 = order.own(np.maximum(new1, 0))
        own2 = order.own(np.maximum(new2, 0))
        H.put("r_clock", u, np.where((new1 == tmin) | (new1 == tmax), own1, c1))
        H.put("r_clock2", u, np.where((new2 >= 0) & ((new2 == tmin) | (new2 == tmax)), own2, c2))
        H.put("reader", u, new1)
        H.put("reader2", u, new2)
        H.put("r_epoch", u, np.int64(E))
        H.put("r_stmt", u, np.int64(sid))

    def sh_write_check(self, sh: Shared, addr: np.ndarray, thr: np.ndarray):
        """Check writes of ``addr`` by ``thr``; return (unique addresses, their writer)."""
        ctx, order = self.ctx, self.order
        a, t = addr.ravel(), thr.ravel()
        if sh.sm90:
            self.sm90_write_check(sh, a, t)
        inf = sh.inflight[a]
        if (inf >= 0).any():
            i = np.flatnonzero(inf >= 0)
            ctx.hazard(f"overwrite of in-flight async data: thread {int(t[i[0]])} writes SH buffer "
                       f"{sh.buf.name!r} offset {int(a[i[0]])}, whose cp.async by thread {int(inf[i[0]])} "
                       f"({ctx.stmt_str(sh.inflight_stmt[a[i[0]]])}) has not been completed by an AsyncWait",
                       thread=int(t[i[0]]), other=sh.inflight_stmt[a[i[0]]], other_thread=int(inf[i[0]]),
                       on=f"SH buffer {sh.buf.name!r}")
        u, tmin, tmax = _by_address(sh, a, t)
        dup = tmin != tmax
        if dup.any():
            i = np.flatnonzero(dup)
            j = i[np.argmin(u[i])]
            ctx.hazard(f"race (write after write): threads {int(tmin[j])} and {int(tmax[j])} both write SH "
                       f"buffer {sh.buf.name!r} offset {int(u[j])} in the same statement", thread=int(tmin[j]),
                       on=f"SH buffer {sh.buf.name!r}")
        E = order.epoch
        waw = (sh.w_epoch[u] == E) & (sh.writer[u] != tmin)
        if waw.any():
            waw &= ~order.ordered(sh.writer[u], sh.w_clock[u], tmin)
        if waw.any():
            i = np.flatnonzero(waw)
            j = i[np.argmin(u[i])]
            ctx.hazard(f"race (write after write): thread {int(tmin[j])} writes SH buffer {sh.buf.name!r} "
                       f"offset {int(u[j])}, written by thread {int(sh.writer[u[j]])} since the last barrier "
                       f"(at {ctx.stmt_str(sh.w_stmt[u[j]])}); {np.unique(u[i]).size} element(s) race, written by threads "
                       f"{listing(np.unique(tmin[i]))}", thread=int(tmin[j]), other=sh.w_stmt[u[j]],
                       other_thread=int(sh.writer[u[j]]), on=f"SH buffer {sh.buf.name!r}")
        other, war = self.unordered_reader(sh, u, tmin)
        if war.any():
            i = np.flatnonzero(war)
            j = i[np.argmin(u[i])]
            ctx.hazard(f"race (write after read): thread {int(tmin[j])} writes SH buffer {sh.buf.name!r} "
                       f"offset {int(u[j])}, read by thread {int(other[j])} since the last barrier "
                       f"(at {ctx.stmt_str(sh.r_stmt[u[j]])}); {np.unique(u[i]).size} element(s) race, written by threads "
                       f"{listing(np.unique(tmin[i]))}", thread=int(tmin[j]), other=sh.r_stmt[u[j]],
                       other_thread=int(other[j]), on=f"SH buffer {sh.buf.name!r}")
        return u, tmin

    def unordered_reader(self, sh: Shared, u: np.ndarray, t: np.ndarray):
        """For each element ``u`` written by ``t``: a reader of this epoch other than ``t`` whose read
        is not ordered before ``t`` (or -1), and whether there is one."""
        order = self.order
        cur = sh.take("r_epoch", u) == order.epoch
        if not cur.any():
            return np.full(u.shape, -1, dtype=np.int64), np.zeros(u.shape, dtype=bool)
        r1, r2 = np.where(cur, sh.take("reader", u), -1), np.where(cur, sh.take("reader2", u), -1)
        bad1 = (r1 >= 0) & (r1 != t)
        bad2 = (r2 >= 0) & (r2 != t)
        if bad1.any():
            bad1 &= ~order.ordered(r1, sh.take("r_clock", u), t)
        if bad2.any():
            bad2 &= ~order.ordered(r2, sh.take("r_clock2", u), t)
        return np.where(bad1, r1, r2), bad1 | bad2

    def sh_write_check_rows(self, sh: Shared, first: np.ndarray, thr: np.ndarray, per: int):
        """``sh_write_check`` of rows: thread ``thr[r]`` writes the ``per`` elements from entry
        ``first[r]`` (``[R]`` each), tested a row at a time where they are whole rows and pass;
        otherwise (or to report what fails) element by element."""
        r = aligned_rows(first, per)
        if r is not None and self._write_rows_ok(sh, sh.rows(per), r, thr):
            return
        addr = first[:, None] + np.arange(per)
        self.sh_write_check(sh, addr, np.broadcast_to(thr[:, None], addr.shape))

    def _write_rows_ok(self, sh: Shared, H: Rows, r: np.ndarray, thr: np.ndarray) -> bool:
        """Whether ``sh_write_check`` passes for rows ``r`` of ``H`` written by ``thr``."""
        order = self.order
        if sh.sm90 and ((H.take("async_rd", r) > 0).any() or (H.take("tma_bar", r) >= 0).any()):
            return False
        if (H.take("inflight", r) >= 0).any():
            return False
        _, tmin, tmax = _by_address(sh, r, thr)
        if (tmin != tmax).any():
            return False
        t = tmin[:, None]
        waw = H.take("w_epoch", r) == order.epoch
        if waw.any():
            w = H.take("writer", r)
            waw &= w != t
            if waw.any() and not order.ordered(w, H.take("w_clock", r), t)[waw].all():
                return False
        return not self.unordered_reader(H, r, t)[1].any()

    def sh_write(self, sh: Shared, addr: np.ndarray, thr: np.ndarray, values: np.ndarray, sid=None):
        """Check and record writes of ``values`` at ``addr`` by ``thr`` (the current statement's)."""
        u, w = self.sh_write_check(sh, addr, thr)
        self._record_write(sh, addr, u, w, values, sid)

    def sh_land(self, sh: Shared, rows: np.ndarray, thr: np.ndarray, values: np.ndarray, sid: int, per: int):
        """Record the landing of cp.async copies of statement ``sid``: rows ``rows`` of
        ``sh.rows(per)`` (``[R]``) by threads ``thr`` (``[R]``), ``values`` ``[R, per]``; a write of
        the issuing threads now.  It was checked as one when issued, and since then its elements
        have been in flight, so that any other access of them was a hazard: nothing new can race
        with it, and the issuing threads' clocks have only advanced."""
        H = sh.rows(per)
        w = thr[:, None]
        H.put("inflight", rows, np.int64(-1))
        H.put("inflight_stmt", rows, np.int64(-1))
        H.put("writer", rows, w)
        H.put("w_clock", rows, self.order.own(w))
        H.put("w_epoch", rows, np.int64(self.order.epoch))
        H.put("w_stmt", rows, np.int64(sid))
        H.put("data", rows, values)
        if sh.sm90:
            H.put("proxy_w", rows, w)      # a generic-proxy write, not yet fenced
            H.put("tma_bar", rows, np.int64(-1))

    def _record_write(self, sh: Shared, addr, u, w, values, sid):
        sh.writer[u] = w
        sh.w_clock[u] = self.order.own(w)
        sh.w_epoch[u] = self.order.epoch
        sh.w_stmt[u] = self.ctx.sid(self.ctx.stmt) if sid is None else sid
        sh.data[addr.ravel()] = values.ravel()
        if sh.sm90:
            sh.proxy_w[u] = w               # a generic-proxy write, not yet fenced
            sh.tma_bar[u] = -1

    # ----------------------------------------------------------------- sm_90a: the async proxy

    def sm90_read_check(self, sh: Shared, a: np.ndarray, t: np.ndarray):
        """A read of TMA-loaded data needs the load's mbarrier phase observed by the reader."""
        tag = sh.tma_bar[a]
        if (tag >= 0).any():
            i = np.flatnonzero(tag >= 0)
            ok = self.order.obs[t[i], tag[i]] > sh.tma_phase[a[i]]
            if not ok.all():
                j = i[np.flatnonzero(~ok)[0]]
                self.ctx.hazard(self.early_tma_message("read", sh, a, t, j, i[~ok]), thread=int(t[j]),
                                on=f"SH buffer {sh.buf.name!r}")

    def early_tma_message(self, what, sh, a, t, j, bad) -> str:
        bar_id, phase = int(sh.tma_bar[a[j]]), int(sh.tma_phase[a[j]])
        bar = self.bars.by_id.get(bar_id)
        state = (f"the barrier has completed {bar.phase} phase(s)" if bar is not None else "the barrier")
        seen = int(self.order.obs[t[j], bar_id])
        return (f"{what} before mbarrier phase completes: thread {int(t[j])} {what}s SH buffer "
                f"{sh.buf.name!r} offset {int(a[j])}, which an async write (TMA load, st.async) fills in phase {phase} (parity "
                f"{phase % 2}) of mbarrier {self.bars.name(bar_id)}; {state}, but this thread has only "
                f"observed {seen} (a try_wait.parity on parity {phase % 2} must succeed first; a wait on "
                f"the other parity returns at once on the stale phase); threads "
                f"{listing(np.unique(t[bad]))} are affected")

    def sm90_write_check(self, sh: Shared, a: np.ndarray, t: np.ndarray):
        """A write must not overwrite the source of an in-flight async-proxy reader, nor TMA-loaded
        data whose phase the writer has not observed."""
        rd = sh.async_rd[a]
        if (rd > 0).any():
            i = np.flatnonzero(rd > 0)[0]
            self.ctx.hazard(f"overwrite of shared memory read by an in-flight async operation: thread {int(t[i])} "
                            f"writes SH buffer {sh.buf.name!r} offset {int(a[i])}, which "
                            f"{self.ctx.stmt_str(sh.async_rd_stmt[a[i]])} still reads (wgmma: wgmma.wait_group; "
                            f"TMA store: cp.async.bulk.wait_group.read)", thread=int(t[i]),
                            other=sh.async_rd_stmt[a[i]], on=f"SH buffer {sh.buf.name!r}")
        tag = sh.tma_bar[a]
        if (tag >= 0).any():
            i = np.flatnonzero(tag >= 0)
            ok = self.order.obs[t[i], tag[i]] > sh.tma_phase[a[i]]
            if not ok.all():
                j = i[np.flatnonzero(~ok)[0]]
                self.ctx.hazard(self.early_tma_message("write", sh, a, t, j, i[~ok]), thread=int(t[j]),
                                on=f"SH buffer {sh.buf.name!r}")

    def proxy_check(self, sh: Shared, a: np.ndarray, who: str):
        """An async-proxy read (by ``who``) of generic-proxy writes needs their fence.proxy.async."""
        w = sh.proxy_w[a]
        if (w >= 0).any():
            i = np.flatnonzero(w >= 0)
            j = i[0]
            self.ctx.hazard(f"missing fence.proxy.async: {who} reads SH buffer {sh.buf.name!r} offset {int(a[j])}, "
                            f"written through the generic proxy by thread {int(w[j])} (at "
                            f"{self.ctx.stmt_str(sh.w_stmt[a[j]])}) with no fence.proxy.async of that thread since; "
                            f"{i.size} element(s), written by threads {listing(np.unique(w[i]))}",
                            other=sh.w_stmt[a[j]], other_thread=int(w[j]), on=f"SH buffer {sh.buf.name!r}")

    def fence_proxy(self, act: np.ndarray):
        """``fence.proxy.async`` by threads ``act``: their generic-proxy writes become visible to
        the async proxy."""
        for sh in self.shared.values():
            if act.size == self.ctx.T:
                sh.proxy_w[...] = -1
            else:
                sh.proxy_w[np.isin(sh.proxy_w, act)] = -1

    def async_write_check(self, sh: Shared, a: np.ndarray, t):
        """Checks for an async-proxy write (a TMA load landing) of ``a`` by thread ``t``'s issue
        (``t``: one thread, or one per element of ``a``)."""
        ctx = self.ctx
        thr = np.full(a.size, t, dtype=np.int64) if np.ndim(t) == 0 else np.asarray(t, dtype=np.int64)
        self.sm90_write_check(sh, a, thr)
        u, first = np.unique(a, return_index=True)
        issuer = thr[first]
        other, war = self.unordered_reader(sh, u, issuer)
        if war.any():
            i = np.flatnonzero(war)
            j = i[0]
            ctx.hazard(f"race (write after read): the TMA load issued by thread {int(issuer[j])} overwrites SH "
                       f"buffer {sh.buf.name!r} offset {int(u[j])}, read by thread {int(other[j])} since the last "
                       f"barrier (at {ctx.stmt_str(sh.r_stmt[u[j]])}); {i.size} element(s) race — a barrier "
                       f"(or an 'empty' mbarrier) must separate the readers from the refill", thread=int(issuer[j]),
                       other=sh.r_stmt[u[j]], other_thread=int(other[j]), on=f"SH buffer {sh.buf.name!r}")
        inf = sh.inflight[a]
        if (inf >= 0).any():
            i = np.flatnonzero(inf >= 0)[0]
            ctx.hazard(f"TMA load into in-flight async data: SH buffer {sh.buf.name!r} offset {int(a[i])} is "
                       f"the destination of a cp.async by thread {int(inf[i])} that no AsyncWait completed",
                       thread=int(thr[i]), other=sh.inflight_stmt[a[i]], other_thread=int(inf[i]),
                       on=f"SH buffer {sh.buf.name!r}")

    def tma_land(self, sh: Shared, e: np.ndarray, t, values: np.ndarray, bar_id, phase, sid: int):
        """A TMA load issued by thread ``t`` writes ``values`` at ``e``, tagged with the mbarrier
        phase that completes it (the async proxy writes it, so no proxy fence is owed).  ``t``,
        ``bar_id`` and ``phase`` are one each or one per element of ``e`` (the pushes of several
        threads landing at once, ``families.copies.dsmem_push``); nothing is written where a check
        fails."""
        self.async_write_check(sh, e, t)
        sh.data[e] = values
        sh.writer[e] = t
        sh.w_epoch[e] = -1     # async proxy: ordered by the mbarrier, not by Barrier epochs
        sh.w_stmt[e] = sid
        sh.proxy_w[e] = -1
        sh.tma_bar[e] = bar_id
        sh.tma_phase[e] = phase
