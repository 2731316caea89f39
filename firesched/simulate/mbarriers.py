"""mbarrier objects: arrival counts, transaction bytes, phases, and what a phase releases.

``init`` sets the arrival count of each phase; ``arrive`` counts one arrival, ``arrive.expect_tx``
adds transaction bytes first, a TMA load's bytes count down; a phase completes when its arrivals
and its bytes are all in.  Each phase collects the vector clocks (and observed phases) of the
threads that arrive on it, and a wait that sees the phase complete acquires them: this is how
warp-specialized roles and the blocks of a cluster order their shared-memory accesses (see
``order``).  Using a barrier before its init, or in the init's barrier epoch by another thread,
is a hazard.

An mbarrier has one copy per block of a cluster: block r's mbarrier i has id ``r * n + i``, where
``n`` is the number of mbarriers of one block.  An arrival on another block's copy (a remote
arrive) must happen before that block ends, which ``check_remote`` verifies at the block's end.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from .lockstep import Lockstep
from .messages import listing
from .order import Order


class MBarrier:
    """The state of one mbarrier: arrivals per phase, arrivals and transaction bytes still
    missing in the current phase, and the number of completed phases."""

    __slots__ = ("count", "pending", "tx", "phase", "init_thread", "init_epoch", "acc", "last", "obs_acc",
                 "obs_last")

    def __init__(self, count: int, init_thread: int, init_epoch: int, threads: int, nbars: int):
        self.count = count
        self.pending = count
        self.tx = 0
        self.phase = 0
        self.init_thread = init_thread
        self.init_epoch = init_epoch
        # vector clocks: the join of the arrivals of the current phase, and of the last completed one
        self.acc = np.zeros(threads, dtype=np.int64)
        self.last = np.zeros(threads, dtype=np.int64)
        # likewise the mbarrier phases the arriving threads had observed (knowledge passes on)
        self.obs_acc = np.zeros(nbars, dtype=np.int64)
        self.obs_last = np.zeros(nbars, dtype=np.int64)

    def complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count
            self.last, self.acc = self.acc, np.zeros_like(self.acc)
            self.obs_last, self.obs_acc = self.obs_acc, np.zeros_like(self.obs_acc)


class MBarriers:
    """The mbarriers of the running block (cluster), by id, with the kernel's layout of them."""

    def __init__(self, kernel: ir.Kernel, ctx: Lockstep, order: Order):
        self.ctx = ctx
        self.order = order
        self.base: dict[str, int] = {}      # first id of each ir.MBarrier buffer
        self.sizes: dict[str, int] = {}
        n = 0
        for b in kernel.shared:
            if isinstance(b, ir.MBarrier):
                self.base[b.name] = n
                self.sizes[b.name] = b.size
                n += int(b.size)
        self.n = n                          # per block; block r's mbarrier i has id r * n + i

    def reset(self):
        self.by_id: dict[int, MBarrier] = {}   # the initialised ones
        # arrivals on another block's mbarrier: (thread, its own clock then, target rank, id, statement)
        self.remote: list[tuple[int, int, int, int, int]] = []

    def name(self, bar_id: int) -> str:
        """``full[1]`` (``of block rank 1`` in a cluster): the buffer and index of mbarrier ``bar_id``."""
        rank, local = divmod(bar_id, max(self.n, 1))
        where = f" of block rank {rank}" if self.ctx.C > 1 else ""
        for name, base in self.base.items():
            if base <= local < base + self.sizes[name]:
                return f"{name}[{local - base}]{where}"
        return f"#{bar_id}"

    def remote_ids(self, ids: np.ndarray, cta: np.ndarray, thr: np.ndarray) -> np.ndarray:
        """The ids of the same mbarriers as ``ids`` (the callers' own) in the blocks of rank ``cta``."""
        C = self.ctx.C
        bad = (cta < 0) | (cta >= C)
        if bad.any():
            i = np.flatnonzero(bad)[0]
            self.ctx.hazard(f"cluster rank {int(cta[i])} (thread {int(thr[i])}) is outside the cluster of "
                            f"{C} block(s)")
        return ids % max(self.n, 1) + cta * self.n

    def init(self, bar_id: int, count: int, t: int):
        """``mbarrier.init`` of ``bar_id`` with ``count`` arrivals per phase, by thread ``t``."""
        self.by_id[bar_id] = MBarrier(count, t, self.order.epoch, self.order.Tg, self.order.obs.shape[1])
        self.order.obs[:, bar_id] = 0

    def get(self, bar_id: int, t: int) -> MBarrier:
        """Mbarrier ``bar_id`` as thread ``t`` uses it: initialised, and the init visible to ``t``."""
        bar = self.by_id.get(bar_id)
        if bar is None:
            self.ctx.hazard(f"mbarrier {self.name(bar_id)} used by thread {t} before mbarrier.init")
        if bar.init_epoch == self.order.epoch and bar.init_thread != t:
            self.ctx.hazard(f"mbarrier {self.name(bar_id)} used by thread {t} in the barrier epoch of its "
                            f"mbarrier.init by thread {bar.init_thread}: the init is not visible yet (a Barrier, "
                            f"after fence.mbarrier_init, must come between them)")
        return bar

    def arrive(self, bar: MBarrier, bar_id: int, t: int):
        """One arrival of thread ``t``, which has released its clock into the phase already."""
        if bar.pending <= 0:
            self.ctx.hazard(f"mbarrier {self.name(bar_id)}: thread {t} arrives on phase {bar.phase}, whose "
                            f"{bar.count} arrival(s) are all in already (its transactions are still pending)")
        bar.pending -= 1
        bar.complete()

    def stuck_wait(self, on, ids, parity) -> str | None:
        """Why the try_wait.parity of threads ``on`` on barriers ``ids`` cannot return yet, or None."""
        for b in np.unique(ids).tolist():
            sel = ids == b
            bar = self.by_id[b]
            c = bar.phase
            stuck = parity[sel] == c % 2
            if stuck.any():
                p = int(parity[sel][stuck][0])
                return (f"mbarrier wait on parity {p} that can never complete: mbarrier {self.name(b)} "
                        f"has completed {c} phase(s), so parity {p} names phase {c}, which still misses "
                        f"{bar.pending} of {bar.count} arrival(s) and {bar.tx} transaction byte(s) (threads "
                        f"{listing(on[sel][stuck])}; the phase that completed last has parity {(c - 1) % 2})")
        return None

    def check_remote(self):
        """Every arrival on another block's mbarrier must happen before that block's end: some
        thread of the block synchronised with it (waited on its phase, or a barrier.cluster
        followed it).  Otherwise the block may exit, and its shared memory be reused, first."""
        ctx = self.ctx
        for t, c, q, b, sid in self.remote:
            if (self.order.known(ctx.tid[ctx.rank == q], t) >= c).any():
                continue
            ctx.hazard_at(sid, f"remote mbarrier arrival after the target block may have exited: thread {t} (block rank "
                          f"{int(ctx.rank[t])}) arrives on mbarrier {self.name(b)}, and nothing in block rank "
                          f"{q} waits for it before that block ends (a barrier.cluster at the end keeps the "
                          f"cluster's blocks alive until all remote arrivals are done)")
