"""Synchronisation: block-wide, named and cluster barriers, mbarrier operations, proxy fences,
and the SYNC atoms that stand for a barrier or a cp.async commit / wait.

A barrier starts a new barrier epoch and joins the vector clocks of the threads it synchronises
(``order``): a ``Barrier`` synchronises the whole block (each block of a cluster on its own) and
must be reached by all of it; a named barrier (``bar.sync id, threads``) synchronises the threads
that reach it with the same id, which must be exactly ``threads`` whole warps of one lockstep
group; ``barrier.cluster`` synchronises every thread of the cluster.

mbarrier: an arrive releases the thread's clock (and the phases it has observed) into the phase,
and a ``try_wait.parity(P)`` that returns acquires them.  On a barrier whose completed-phase
count is ``c`` the wait returns at once when ``P != c % 2`` (the last phase of parity P is
complete), and otherwise waits for phase ``c``.  Every asynchronous contribution is accounted at
issue, so in lockstep code a phase that is incomplete when a wait reaches it can never complete:
that is a deadlock, unless another warp-specialized role can still run (the wait then hands the
baton over; see ``roles``).
"""

from __future__ import annotations

import numpy as np

from ...errors import InternalError
from ..messages import describe, listing
from .copies import commit, wait_atom
from .operands import bar_ids, scalar


def barrier(k, s):
    """``Barrier`` (``__syncthreads``, or a named barrier when it names a thread count)."""
    ctx, order = k.ctx, k.order
    ctx.stmt = s
    threads = int(getattr(s, "threads", 0) or 0)
    if threads:
        _named(k, s, threads)
        return
    if not ctx.full:
        missing = np.flatnonzero(~ctx.mask)
        inside = " (a role of a warp-specialized kernel: use a named barrier)" if ctx.roles else ""
        ctx.hazard(f"barrier inside divergent code{inside}: threads {listing(missing)} of the block do "
                   f"not reach it (threads {listing(np.flatnonzero(ctx.mask))} do)")
    order.epoch += 1
    if ctx.C > 1:                   # __syncthreads: each block of the cluster (batch) on its own
        order.join_each(ctx.tid.reshape(ctx.C, ctx.Tc))
        return
    order.join_all()


def _named(k, s, threads: int):
    """``bar.sync id, threads`` / ``bar.arrive id, threads``: the active threads with the same
    ``id`` (an int, or an index expression such as one barrier per warpgroup) count towards the
    barrier's ``threads``, whole warps at a time.  A group that brings all ``threads`` at once
    synchronises on the spot; otherwise the barrier collects arrivals across groups (roles, or the
    groups of a role that do not keep in step) and completes when they reach ``threads``: every
    thread that synced then acquires what every arriving thread released, and a ``bar.sync``
    group waits for that, letting the other roles run (in lockstep code, or when nothing left can
    arrive, that wait is a deadlock).  A ``bar.arrive`` never waits; arrivals still pending when
    the block ends are no hazard (the hardware resets its barriers per block: the last turn
    ping-pong consumers pass on is never taken)."""
    ctx = k.ctx
    act = ctx.active()
    arrive = bool(getattr(s, "arrive", False))
    ids = ctx.per_thread(getattr(s, "bar_id", 0))[act]
    if threads % 32 or not 0 < threads <= ctx.Tc:
        ctx.hazard(f"named barrier with {threads} threads: the thread count must be a multiple of 32, "
                   f"at most the block's {ctx.Tc}")
    ranks = ctx.rank[act]
    waits = []
    for bid, r in sorted(set(zip(ids.tolist(), ranks.tolist()))):
        grp = act[(ids == bid) & (ranks == r)]
        if not 1 <= bid < 16:
            ctx.hazard(f"named barrier id {bid} (threads {listing(grp)}): ids are 1..15 (0 is the "
                       f"block-wide barrier)")
        warps = np.unique(grp // 32)
        if warps.size * 32 != grp.size:
            ctx.hazard(f"named barrier {bid} is reached by threads {listing(grp)} ({grp.size}, in {warps.size} "
                       f"warp(s)): whole warps arrive at a named barrier")
        state = k.named.get((r, bid))
        if state is None and grp.size == threads and not arrive:
            k.order.join(grp)           # the whole barrier at once: one lockstep group
            continue
        if state is None:
            state = k.named[(r, bid)] = NamedBarrier(threads, k.order)
        if state.threads != threads:
            ctx.hazard(f"named barrier {bid} expects {state.threads} threads, and threads {listing(grp)} reach it "
                       f"expecting {threads}")
        if state.arrived + grp.size > threads:
            ctx.hazard(f"named barrier {bid} expects {threads} threads, but threads {listing(grp)} bring its "
                       f"arrivals to {state.arrived + grp.size}")
        phase = state.phase
        state.add(grp, wait=not arrive)
        if state.phase == phase and not arrive:         # not complete yet: wait for this phase
            waits.append((bid, state, phase, grp))
    for bid, state, phase, grp in waits:
        if state.phase > phase:
            continue
        why = (f"named barrier {bid} waits for {threads} threads; {state.arrived} have arrived "
               f"(threads {listing(grp)} wait)")
        if ctx.roles is None:
            ctx.hazard(why + "; in lockstep execution nothing after this wait can arrive")
        ctx.roles.block(lambda state=state, phase=phase: state.phase > phase, why)


class NamedBarrier:
    """A named barrier collecting arrivals across groups: how many have arrived in the current
    phase, the join of their clocks (and observed mbarrier phases), and the threads waiting."""

    def __init__(self, threads: int, order):
        self.threads = threads
        self.order = order
        self.arrived = 0
        self.phase = 0
        self.acc = np.zeros(order.Tg, dtype=np.int64)
        self.obs = None if order.obs is None else np.zeros(order.obs.shape[1], dtype=np.int64)
        self.waiting: list = []

    def add(self, grp: np.ndarray, wait: bool):
        """Threads ``grp`` (one sync group) arrive: they release their clocks into the phase and
        advance them; when the phase is complete every waiting thread acquires the join."""
        o = self.order
        g, lt = np.divmod(grp, o.Tg)
        np.maximum(self.acc, o.vc[g, lt].max(axis=0), out=self.acc)
        if self.obs is not None:
            np.maximum(self.obs, o.obs[grp].max(axis=0), out=self.obs)
        o.vc[g, lt, lt] += 1
        o.clock[grp] += 1
        self.arrived += grp.size
        if wait:
            self.waiting.append(grp)
        if self.arrived == self.threads:
            for w in self.waiting:
                o.acquire(w, self.acc)
                if self.obs is not None:
                    o.obs[w] = np.maximum(o.obs[w], self.obs)
            self.phase += 1
            self.arrived = 0
            self.acc = np.zeros_like(self.acc)
            self.obs = None if self.obs is None else np.zeros_like(self.obs)
            self.waiting = []


def cluster(k, s):
    """CLUSTER: ``barrier.cluster`` arrive + wait: every thread of every block of the cluster."""
    ctx = k.ctx
    ctx.stmt = s
    if not ctx.full:
        ctx.hazard(f"cluster barrier inside divergent code or a role: threads "
                   f"{listing(np.flatnonzero(~ctx.mask))} of the cluster do not reach it")
    k.order.epoch += 1
    k.order.join(ctx.tid)


def sync(k, s):
    """SYNC atoms issued as ``AtomCall``: ``cp_async_commit`` is ``AsyncCommit``, a wait whose PTX
    names its count is ``AsyncWait``, any other (``bar_sync``) is a ``Barrier``."""
    name = s.atom.name
    if "commit" in name:
        commit(k, s)
    elif "wait" in name:
        wait_atom(k, s)
    else:
        barrier(k, s)


def fence(k, s):
    """FENCE: ``fence.proxy.async`` makes the threads' generic-proxy writes visible to the async
    proxy; ``fence.mbarrier_init`` has nothing to model (the init's visibility is a barrier's)."""
    act = k.ctx.active()
    if act.size == 0 or s.atom.name != "fence_proxy_async":
        return
    k.mem.fence_proxy(act)


def mbarrier(k, s):
    """MBARRIER: init, arrive, arrive.expect_tx, remote (cluster) arrive, try_wait.parity."""
    ctx, order, bars = k.ctx, k.order, k.bars
    on, _ = ctx.enabled(s)
    if on.size == 0:
        return
    name = s.atom.name
    ids = bar_ids(k, s, "bar", on)
    if name == "mbarrier_init":
        counts = scalar(k, s, "count")[on]
        if np.unique(ids).size != ids.size:
            ctx.hazard(f"mbarrier.init race: several threads initialise one mbarrier in one statement "
                       f"(threads {listing(on)})")
        for t, b, c in zip(on.tolist(), ids.tolist(), counts.tolist()):
            if not 1 <= c < 1 << 20:
                ctx.hazard(f"mbarrier.init of {bars.name(b)} with count {c}; it must be in 1..2**20-1")
            bars.init(b, c, t)
        return
    if name in ("mbarrier_try_wait", "mbarrier_try_wait_cluster"):
        parity = scalar(k, s, "parity")[on] & 1
        for b in np.unique(ids).tolist():
            for t in on[ids == b].tolist():
                bars.get(b, t)
        while True:
            stuck = bars.stuck_wait(on, ids, parity)
            if stuck is None:
                break
            if ctx.roles is None:
                ctx.hazard(stuck + "; in lockstep execution nothing after this wait can complete it")
            ctx.roles.block(lambda: bars.stuck_wait(on, ids, parity) is None, stuck)
        obs = order.obs
        for b in np.unique(ids).tolist():
            thr = on[ids == b]
            bar = bars.by_id[b]
            obs[thr, b] = np.maximum(obs[thr, b], bar.phase)
            order.acquire(thr, bar.last)               # acquire the phase's arrivals
            obs[thr] = np.maximum(obs[thr], bar.obs_last[:obs.shape[1]])
        return
    if name == "mbarrier_arrive_expect_tx":
        nbytes = scalar(k, s, "bytes")[on]
    if name == "mbarrier_arrive_cluster":
        ids = bars.remote_ids(ids, scalar(k, s, "cta")[on], on)
    for i, (t, b) in enumerate(zip(on.tolist(), ids.tolist())):
        bar = bars.get(b, t)
        if name == "mbarrier_arrive_expect_tx":
            if nbytes[i] < 0:
                ctx.hazard(f"mbarrier.arrive.expect_tx of {bars.name(b)} with {int(nbytes[i])} bytes")
            bar.tx += int(nbytes[i])
        elif name not in ("mbarrier_arrive", "mbarrier_arrive_cluster"):
            raise InternalError(f"{describe(s)}: unknown mbarrier atom {name}")
        order.release(t, bar.acc)
        np.maximum(bar.obs_acc, order.obs[t], out=bar.obs_acc)
        if ctx.C > 1 and b // bars.n != ctx.rank[t]:
            # an arrival on another block's mbarrier: that block must not exit before it
            bars.remote.append((t, int(order.own(t)), b // bars.n, b, ctx.sid(s)))
        order.tick(t)
        bars.arrive(bar, b, t)
