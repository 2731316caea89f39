"""Happens-before: barrier epochs, vector clocks and the mbarrier phases each thread has observed.

Two accesses of one shared element by different threads are a race unless something orders them.
Within one lockstep group a ``Barrier`` does, and the cheap test is the barrier epoch: an access
of an earlier epoch is ordered before every later one.  Warp specialization and thread-block
clusters order threads through mbarriers instead, so every thread also carries a vector clock:
``vc[t, u]`` is the last own-clock value of thread ``u`` that thread ``t`` has synchronised with,
``vc[t, t]`` is ``t``'s own clock, advanced at each release (barrier arrival, mbarrier arrive).
An access by ``u`` at own clock ``c`` happens before thread ``t``'s later access iff
``vc[t, u] >= c``.

Only threads that can synchronise with each other share clocks: the threads of one block, or of
one cluster.  When the interpreter runs several independent blocks at once (``kernel``), the
clocks are block-diagonal and stored that way, ``vc[g, t % Tg, u % Tg]`` for the sync group
``g = t // Tg`` of ``Tg`` threads; every access goes through the methods below, which take
global thread ids.

Knowledge of mbarrier phases travels the same way: ``obs[t, b]`` is how many phases of mbarrier
``b`` thread ``t`` has observed (by waiting on it, or from a thread it synchronised with); a TMA
load's data may be read only by a thread that has observed the phase it completes.
"""

from __future__ import annotations

import numpy as np


class Order:
    """The happens-before state of the running block (cluster, batch of blocks), reset per run."""

    def __init__(self, threads: int, track_phases: bool, nbars: int, group: int = 0):
        self.T = threads
        self.Tg = group or threads          # threads of one sync group (a block, or a cluster)
        self.G = threads // self.Tg
        self.tid = np.arange(threads, dtype=np.int64)
        self.track_phases = track_phases    # only kernels that use sm_90a atoms pay for ``obs``
        self.nbars = nbars                  # mbarriers of all blocks run together

    def reset(self):
        self.epoch = 0
        self.vc = np.broadcast_to(np.eye(self.Tg, dtype=np.int64), (self.G, self.Tg, self.Tg)).copy()
        # the diagonal, own clocks by global thread id: only a thread's own release advances it
        # (an acquire never raises it), so it is kept beside ``vc`` for a one-gather ``own``
        self.clock = np.ones(self.T, dtype=np.int64)
        self.obs = np.zeros((self.T, max(self.nbars, 1)), dtype=np.int64) if self.track_phases else None

    # ----------------------------------------------------------------- reading clocks

    def own(self, t):
        """Own clock of threads ``t`` (an int or an array)."""
        return self.clock[t]

    def ordered(self, other: np.ndarray, clock: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Whether the accesses of threads ``other`` at their own clocks ``clock`` happen before
        the threads ``t`` now (element-wise; ``other < 0`` means no access).  A thread of another
        sync group is never ordered."""
        o = np.maximum(other, 0)
        g, lt = np.divmod(t, self.Tg)
        go, lo = np.divmod(o, self.Tg)
        return (other < 0) | ((go == g) & (self.vc[g, lt, lo] >= clock))

    def known(self, rows: np.ndarray, t: int) -> np.ndarray:
        """``vc[u, t]`` for each thread ``u`` of ``rows`` (one sync group with ``t``)."""
        return self.vc[t // self.Tg, rows % self.Tg, t % self.Tg]

    # ----------------------------------------------------------------- synchronising

    def join_all(self):
        """Every thread synchronises with its whole sync group (a block-wide barrier)."""
        self.vc[...] = self.vc.max(axis=1, keepdims=True)
        lt = np.arange(self.Tg)
        self.vc[:, lt, lt] += 1
        self.clock += 1
        if self.obs is not None:
            if self.G == 1:
                self.obs[...] = self.obs.max(axis=0)
            else:
                o = self.obs.reshape(self.G, self.Tg, -1)
                o[...] = o.max(axis=1, keepdims=True)

    def join_each(self, groups: np.ndarray):
        """Each row of ``groups`` (``[K, n]`` threads, a row within one sync group) synchronises:
        its threads acquire what all of them have released (the blocks of a cluster at a
        ``__syncthreads``, each on its own)."""
        g, lt = np.divmod(groups, self.Tg)
        rows = self.vc[g, lt]                                   # [K, n, Tg]
        self.vc[g, lt] = rows.max(axis=1, keepdims=True)
        self.vc[g, lt, lt] += 1
        self.clock[groups] += 1
        if self.obs is not None:
            o = self.obs[groups]
            self.obs[groups] = o.max(axis=1, keepdims=True)

    def join(self, grp: np.ndarray):
        """Threads ``grp`` (of one sync group) synchronise (a barrier): each acquires what all
        have released."""
        self.join_each(np.asarray(grp, dtype=np.int64)[None, :])

    def release(self, t: int, into: np.ndarray):
        """Thread ``t`` releases its clock into ``into`` (an mbarrier phase; ``Tg`` entries)."""
        np.maximum(into, self.vc[t // self.Tg, t % self.Tg], out=into)

    def tick(self, t: int):
        """Thread ``t`` advances its own clock (after a release)."""
        g, lt = divmod(t, self.Tg)
        self.vc[g, lt, lt] += 1
        self.clock[t] += 1

    def acquire(self, thr: np.ndarray, released: np.ndarray):
        """Threads ``thr`` (of one sync group) acquire the clocks ``released`` (``Tg`` entries)."""
        g, lt = np.divmod(thr, self.Tg)
        self.vc[g, lt] = np.maximum(self.vc[g, lt], released)
