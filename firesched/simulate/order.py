"""Happens-before: barrier epochs, vector clocks and the mbarrier phases each thread has observed.

Two accesses of one shared element by different threads are a race unless something orders them.
Within one lockstep group a ``Barrier`` does, and the cheap test is the barrier epoch: an access
of an earlier epoch is ordered before every later one.  Warp specialization and thread-block
clusters order threads through mbarriers instead, so every thread also carries a vector clock:
``vc[t, u]`` is the last own-clock value of thread ``u`` that thread ``t`` has synchronised with,
``vc[t, t]`` is ``t``'s own clock, advanced at each release (barrier arrival, mbarrier arrive).
An access by ``u`` at own clock ``c`` happens before thread ``t``'s later access iff
``vc[t, u] >= c``.

Knowledge of mbarrier phases travels the same way: ``obs[t, b]`` is how many phases of mbarrier
``b`` thread ``t`` has observed (by waiting on it, or from a thread it synchronised with); a TMA
load's data may be read only by a thread that has observed the phase it completes.
"""

from __future__ import annotations

import numpy as np


class Order:
    """The happens-before state of the running block (cluster), reset per block."""

    def __init__(self, threads: int, track_phases: bool, nbars: int):
        self.T = threads
        self.tid = np.arange(threads, dtype=np.int64)
        self.track_phases = track_phases    # only kernels that use sm_90a atoms pay for ``obs``
        self.nbars = nbars                  # mbarriers of all blocks of the cluster

    def reset(self):
        self.epoch = 0
        self.vc = np.eye(self.T, dtype=np.int64)
        self.obs = np.zeros((self.T, max(self.nbars, 1)), dtype=np.int64) if self.track_phases else None

    def join_all(self):
        """Every thread synchronises (a block-wide barrier): each acquires what all have released."""
        self.vc[...] = self.vc.max(axis=0)
        self.vc[self.tid, self.tid] += 1
        if self.obs is not None:
            self.obs[...] = self.obs.max(axis=0)

    def join(self, grp: np.ndarray):
        """Threads ``grp`` synchronise (a barrier): each acquires what all have released."""
        self.vc[grp] = self.vc[grp].max(axis=0)
        self.vc[grp, grp] += 1
        if self.obs is not None:
            self.obs[grp] = self.obs[grp].max(axis=0)

    def ordered(self, other: np.ndarray, clock: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Whether the accesses of threads ``other`` at their own clocks ``clock`` happen before
        the threads ``t`` now (element-wise; ``other < 0`` means no access)."""
        o = np.maximum(other, 0)
        return (other < 0) | (self.vc[t, o] >= clock)
