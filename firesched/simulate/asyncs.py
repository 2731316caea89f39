"""The asynchronous model: operations issued now that complete later, and what they hold meanwhile.

The interpreter computes every asynchronous operation at issue (its data is known then) but
keeps its effects *in flight* until the instruction that completes it, so that an access that
the hardware would not order after the completion is caught:

* cp.async: the destination is in flight (``Shared.inflight``) until an ``AsyncWait`` (or a
  ``cp.async.wait_group`` atom) of the issuing thread completes its group; the landing then
  counts as a write by the issuing thread at the wait.  Groups are numbered per thread: a commit
  closes the open group, a wait for ``N`` pending completes every group but the last ``N``.
* wgmma: the result is written at issue, but the accumulators (and the ``_rs`` A fragment) stay
  owned by the wgmma (``Registers.busy``) and its shared operands stay being read
  (``Shared.async_rd``) until a ``wgmma.wait_group`` of every thread of the warpgroup retires its
  group.  A warpgroup's first wgmma must follow a ``wgmma.fence``.
* TMA store: its shared source is being read until a ``cp.async.bulk.wait_group[.read]`` of the
  issuing thread retires its bulk group.  TMA load: the box is written at issue, tagged with the
  mbarrier phase its bytes complete (``Shared.tma_bar``); the load is outstanding until then.

Whatever is still in flight when a block ends is a hazard (``check_end`` of each).
"""

from __future__ import annotations

import numpy as np

from .lockstep import Lockstep
from .mbarriers import MBarriers
from .memory import aligned_rows
from .messages import listing
from .registers import Registers

# --------------------------------------------------------------------------- cp.async


class InFlightCopy:
    """The cp.async copies of one statement execution that have not landed yet: rows ``rows`` of
    ``sh.rows(per)`` (``[R]``, a row per copy, or per = 1 and a row per element) by threads
    ``thr`` in their groups ``group`` (``[R]`` each), with their ``values`` (``[R, per]``)."""

    __slots__ = ("sh", "rows", "per", "thr", "group", "values", "sid")

    def __init__(self, sh, rows, per, thr, group, values, sid):
        self.sh, self.rows, self.per, self.thr, self.group, self.values, self.sid = sh, rows, per, thr, group, values, sid


class CpAsyncGroups:
    """The cp.async groups of the running block: each thread's open group, the copies in flight."""

    def __init__(self, ctx: Lockstep):
        self.ctx = ctx

    def reset(self):
        self.open = np.zeros(self.ctx.T, dtype=np.int64)
        self.pending: list[InFlightCopy] = []

    def commit(self, thr: np.ndarray):
        """``cp.async.commit_group`` by threads ``thr``: their open group closes."""
        self.open[thr] += 1

    def issue(self, sh, first: np.ndarray, thr: np.ndarray, values: np.ndarray, sid: int):
        """Copies of ``values`` (``[R, per]``) into the ``per`` entries of ``sh`` from each of
        ``first`` by threads ``thr`` (``[R]``), in the threads' open groups; the destination is in
        flight from now.  Kept as rows of ``sh.rows(per)`` where whole rows, else element by element."""
        per = values.shape[1]
        rows = aligned_rows(first, per)
        if rows is None:
            rows, thr, values = (first[:, None] + np.arange(per)).ravel(), np.repeat(thr, per), values.reshape(-1, 1)
            per = 1
        H = sh.rows(per)
        H.put("inflight", rows, thr[:, None])
        H.put("inflight_stmt", rows, np.int64(sid))
        self.pending.append(InFlightCopy(sh, rows, per, thr.copy(), self.open[thr], values, sid))

    def wait(self, pending: int, write):
        """``cp.async.wait_group pending`` by the active threads: every copy of theirs in a group
        older than their last ``pending`` lands, no longer in flight and written (as a store of
        the issuing threads, checked when issued) by ``write(sh, rows, thr, values, sid, per)``."""
        if not self.pending:
            return
        mask = self.ctx.mask
        keep = []
        limit = self.open - pending           # groups below this are complete
        for rec in self.pending:
            done = mask[rec.thr] & (rec.group < limit[rec.thr])
            if done.all():
                write(rec.sh, rec.rows, rec.thr, rec.values, rec.sid, rec.per)
            elif done.any():
                write(rec.sh, rec.rows[done], rec.thr[done], rec.values[done], rec.sid, rec.per)
                rest = ~done
                keep.append(InFlightCopy(rec.sh, rec.rows[rest], rec.per, rec.thr[rest], rec.group[rest],
                                         rec.values[rest], rec.sid))
            else:
                keep.append(rec)
        self.pending = keep

    def check_end(self):
        if self.pending:
            rec = self.pending[0]
            self.ctx.hazard_at(
                rec.sid,
                f"async copies never waited for: thread {int(rec.thr[0])}'s cp.async into SH buffer "
                f"{rec.sh.buf.name!r} offset {int(rec.rows[0]) * rec.per} (group {int(rec.group[0])}) is still in "
                f"flight when the block ends; threads {listing(np.unique(np.concatenate([p.thr for p in self.pending])))} "
                f"have copies in flight")


# --------------------------------------------------------------------------- TMA

class BulkStore:
    """One TMA store whose shared-memory source is still being read."""

    __slots__ = ("thread", "group", "sh", "elems", "sid")

    def __init__(self, thread, group, sh, elems, sid):
        self.thread, self.group, self.sh, self.elems, self.sid = thread, group, sh, elems, sid


class TmaOps:
    """The TMA operations of the running block not complete yet: stores by bulk async-group, loads
    by the mbarrier phase their bytes complete."""

    def __init__(self, ctx: Lockstep, bars: MBarriers):
        self.ctx = ctx
        self.bars = bars

    def reset(self):
        self.open = np.zeros(self.ctx.T, dtype=np.int64)      # open bulk async-group (TMA stores)
        self.stores: list[BulkStore] = []
        self.loads: list[tuple[int, int, int]] = []           # (barrier id, phase, statement id)

    def commit(self, thr: np.ndarray):
        """``cp.async.bulk.commit_group`` by threads ``thr``."""
        self.open[thr] += 1

    def store(self, t: int, sh, e: np.ndarray, sid: int):
        """Thread ``t``'s TMA store of statement ``sid`` reads entries ``e`` of ``sh`` from now."""
        sh.begin_async_read(e, sid)
        self.stores.append(BulkStore(t, int(self.open[t]), sh, e, sid))

    def load(self, bar_id: int, phase: int, sid: int):
        """A TMA load of statement ``sid`` completes on ``phase`` of mbarrier ``bar_id``."""
        self.loads.append((bar_id, phase, sid))

    def retire(self, n: int):
        """``cp.async.bulk.wait_group[.read] n`` by the active threads: their stores in groups older
        than their last ``n`` stop reading shared memory."""
        ctx = self.ctx
        act = ctx.active()
        flag = np.zeros(ctx.T, dtype=bool)
        flag[act] = True
        limit = self.open - n
        keep = []
        for rec in self.stores:
            if flag[rec.thread] and rec.group < limit[rec.thread]:
                rec.sh.end_async_read(rec.elems)
            else:
                keep.append(rec)
        self.stores = keep

    def check_end(self):
        ctx = self.ctx
        if self.stores:
            rec = self.stores[0]
            ctx.hazard_at(rec.sid, f"TMA store never waited for: thread {rec.thread}'s store from SH buffer "
                                   f"{rec.sh.buf.name!r} is still reading shared memory when the block ends "
                                   f"(cp.async.bulk.commit_group and cp.async.bulk.wait_group.read are missing)")
        for bar_id, phase, sid in self.loads:
            bar = self.bars.by_id.get(bar_id)
            if bar is not None and bar.phase <= phase:
                ctx.hazard_at(sid, f"TMA load never completed: its mbarrier {self.bars.name(bar_id)} is still in "
                                   f"phase {bar.phase} when the block ends ({bar.pending} of {bar.count} arrivals "
                                   f"and {bar.tx} transaction bytes outstanding)")


# --------------------------------------------------------------------------- wgmma

class InFlightWgmma:
    """One issued wgmma not yet retired by every thread of its warpgroup."""

    __slots__ = ("thr", "group", "regs", "smem", "sid", "retired")

    def __init__(self, thr, group, regs, smem, sid):
        self.thr, self.group, self.regs, self.smem, self.sid = thr, group, regs, smem, sid
        self.retired = np.zeros(thr.size, dtype=bool)


class WgmmaGroups:
    """The wgmma groups of the running block: each thread's open group and fence, the wgmmas in
    flight with the registers and shared elements they hold."""

    def __init__(self, ctx: Lockstep, regs: Registers):
        self.ctx = ctx
        self.regs = regs

    def reset(self):
        T = self.ctx.T
        self.open = np.zeros(T, dtype=np.int64)          # open wgmma group of each thread
        self.fenced = np.zeros(T, dtype=bool)            # has executed a wgmma.fence
        self.pending: list[InFlightWgmma] = []

    def fence(self, thr: np.ndarray):
        """``wgmma.fence`` by threads ``thr``: registers accessed before it may feed a wgmma."""
        self.fenced[thr] = True
        for touch in self.regs.touch.values() if self.regs.track_wgmma else ():
            touch[thr] = 0

    def commit(self, thr: np.ndarray):
        """``wgmma.commit_group`` by threads ``thr``."""
        self.open[thr] += 1

    def hold(self, thr: np.ndarray, regs: list, sid: int):
        """The wgmma of statement ``sid`` by warpgroup ``thr`` owns registers ``regs`` (``(name,
        offset, count)`` each) from now."""
        for name, off, cnt in regs:
            self.regs.busy[name][thr, off:off + cnt] += 1
            self.regs.busy_stmt[name][thr, off:off + cnt] = sid
            self.regs.busy_any[name] = True

    def track(self, thr: np.ndarray, regs: list, smem: list, sid: int):
        """Remember the wgmma issued by ``thr`` until every thread of it retires its group; then
        its registers and its shared operands ``smem`` (``(Shared, entries)`` each) are free."""
        self.pending.append(InFlightWgmma(thr.copy(), self.open[thr].copy(), regs, smem, sid))

    def retire(self, thr: np.ndarray, n: int):
        """``wgmma.wait_group n`` by threads ``thr``: their wgmmas in groups older than their last
        ``n`` release their registers, and once every thread of a wgmma retired it, its shared
        operands."""
        flag = np.zeros(self.ctx.T, dtype=bool)
        flag[thr] = True
        limit = self.open - n
        keep = []
        for rec in self.pending:
            done = flag[rec.thr] & (rec.group < limit[rec.thr]) & ~rec.retired
            if done.any():
                t = rec.thr[done]
                for name, off, cnt in rec.regs:
                    self.regs.busy[name][t, off:off + cnt] -= 1
                    self.regs.busy_any[name] = bool(self.regs.busy[name].any())
                rec.retired |= done
            if rec.retired.all():
                for sh, e in rec.smem:
                    sh.end_async_read(e)
            else:
                keep.append(rec)
        self.pending = keep

    def check_end(self):
        if self.pending:
            rec = self.pending[0]
            self.ctx.hazard_at(rec.sid, f"wgmma never waited for: the wgmma of threads {listing(rec.thr)} is "
                                        f"still in flight when the block ends (wgmma.commit_group and "
                                        f"wgmma.wait_group are missing)")
