"""Warp specialization: the ``Roles`` statement, run as coroutines of lockstep groups.

Each role (producer, consumers) is a lockstep group of its own: its threads' mask, loop variables
and current statement.  Roles cannot run one after another (a consumer waits on an mbarrier the
producer fills, and the producer on one the consumers free), nor in lockstep with each other, so
each runs on a Python thread holding a baton; exactly one runs at a time.  A role whose
``mbarrier.try_wait`` cannot return yet hands the baton to the next role that can run (one not
started, or whose wait has become satisfiable), round robin; when none can, the block is reported
as a deadlock with every role's wait.  The scheduling is deterministic, so a hazard found under
one interleaving is found again.

A block-wide ``Barrier`` inside a role is a hazard (roles synchronise with named barriers and
mbarriers); in a cluster, each block's roles run as roles of their own, and a role of ``groups``
> 1 runs as that many groups of its threads, each a role of its own (consumer warpgroups that
take turns: a named barrier one of them waits on hands the baton over like an mbarrier wait).
"""

from __future__ import annotations

import threading

import numpy as np

from .. import ir
from ..errors import HazardError
from .lockstep import Lockstep
from .messages import listing


def run_roles(ctx: Lockstep, s: ir.Roles, execute):
    """Check that the roles of ``s`` partition whole warps of the block, then run them, each body
    through ``execute(stmt)``."""
    ctx.stmt = s
    if ctx.roles is not None:
        ctx.hazard("Roles inside a role: warp specialization does not nest")
    if not ctx.full:
        ctx.hazard(f"Roles inside divergent code: threads {listing(np.flatnonzero(~ctx.mask))} do not "
                   f"reach it; the roles must partition threads of the whole block")
    taken = np.zeros(ctx.T, dtype=bool)
    for r in s.roles:
        lo, n = int(r.first), int(r.count)
        if lo % 32 or n % 32 or n <= 0 or lo < 0 or lo + n > ctx.Tc:
            ctx.hazard(f"role {r.name!r} covers threads {lo}..{lo + n - 1}: roles are whole warps of "
                       f"the block's {ctx.Tc} threads")
        g = int(getattr(r, "groups", 1))
        if g < 1 or n % g or (n // g) % 32:
            ctx.hazard(f"role {r.name!r} of {n} threads in {g} groups: the groups are equal whole warps")
        if taken[lo:lo + n].any():
            ctx.hazard(f"role {r.name!r} overlaps another role at threads {listing(np.flatnonzero(taken[lo:lo + n]) + lo)}")
        taken[lo:lo + n] = True
    # a cluster's blocks run their roles each on their own; a batch of independent blocks runs
    # each role of all its blocks as one lockstep group (they are the same program on other data)
    ranks = [list(range(ctx.C))] if ctx.batch > 1 else [[r] for r in range(ctx.C)]
    RoleScheduler(ctx, execute, s.roles, ranks, ctx.Tc).run()


class Abort(BaseException):
    """Unwinds the role threads of a run that stopped (a hazard in another role)."""


class RoleScheduler:
    """Runs the roles of a ``Roles`` statement as coroutines, one at a time.

    Each role is a lockstep group of its own (its threads' mask, loop variables and current
    statement) executing on a Python thread; a baton lets exactly one run.  A role whose
    ``mbarrier.try_wait`` cannot return yet hands the baton to the next role that can run (one
    not started, or whose wait has become satisfiable), round robin; when none can, the roles
    deadlock and the wait is reported.  The scheduling is deterministic.
    """

    def __init__(self, ctx: Lockstep, execute, roles, ranks=((0,),), threads: int = 0):
        self.ctx = ctx
        self.execute = execute
        self.cv = threading.Condition()
        self.roles = []
        for group in ranks:             # block ranks whose roles run together
            for r in roles:
                parts = int(getattr(r, "groups", 1))
                size = int(r.count) // parts
                for j in range(parts):
                    mask = np.zeros(ctx.T, dtype=bool)
                    for b in group:
                        lo = b * threads + int(r.first) + j * size
                        mask[lo:lo + size] = True
                    env = dict(ctx.env)
                    env[ir.ROLE_TID_NAME] = ctx.ltid - int(r.first)
                    name = r.name if parts == 1 else f"{r.name} (group {j} of {parts})"
                    name = name if len(ranks) == 1 else f"{name} (block rank {group[0]})"
                    self.roles.append(dict(role=r, name=name, ctx=(mask, False, env, list(ctx.loops), None),
                                           ready=None, why="", done=False, started=False))
        self.turn = None
        self.error: BaseException | None = None
        self.finished = False

    def run(self):
        k = self.ctx
        saved = (k.mask, k.full, k.env, k.loops, k.stmt)
        k.roles = self
        threads = [threading.Thread(target=self._body, args=(r,), daemon=True) for r in self.roles]
        for t in threads:
            t.start()
        try:
            with self.cv:
                self.turn = self.roles[0]
                self.cv.notify_all()
                while not self.finished:
                    self.cv.wait()
            for t in threads:
                t.join()
        finally:
            k.roles = None
            k.mask, k.full, k.env, k.loops, k.stmt = saved
        if self.error is not None:
            raise self.error

    def _body(self, r):
        with self.cv:
            while self.turn is not r and not self.finished:
                self.cv.wait()
            if self.finished:
                return
        k = self.ctx
        k.mask, k.full, k.env, k.loops, k.stmt = r["ctx"]
        r["started"] = True
        try:
            self.execute(r["role"].body)
        except Abort:
            return
        except BaseException as e:          # a hazard (or a bug): stop every role, report it
            self._stop(e)
            return
        r["done"] = True
        nxt = self._next(r)
        if nxt is None:
            waiting = [x for x in self.roles if not x["done"]]
            self._stop(self._deadlock(waiting) if waiting else None)
            return
        self._hand(nxt)

    def _ready(self, r) -> bool:
        return not r["done"] and (not r["started"] or r["ready"] is None or r["ready"]())

    def _next(self, cur):
        i = self.roles.index(cur)
        order = self.roles[i + 1:] + self.roles[:i + 1]
        return next((r for r in order if self._ready(r)), None)

    def _hand(self, nxt):
        with self.cv:
            self.turn = nxt
            self.cv.notify_all()

    def _stop(self, error):
        with self.cv:
            if self.error is None:
                self.error = error
            self.finished = True
            self.cv.notify_all()

    def _deadlock(self, waiting) -> HazardError:
        """The hazard naming what each role in ``waiting`` waits for."""
        lines = [f"  role {r['name']!r} waits: {r['why'] or '(not started)'}" for r in waiting]
        try:
            self.ctx.hazard("deadlock: every role of the warp-specialized block waits on an mbarrier phase "
                            "or a named barrier that nothing left can complete\n" + "\n".join(lines))
        except HazardError as e:
            return e

    def block(self, ready, why: str):
        """Called by the running role: wait until ``ready()`` holds, letting the others run."""
        k = self.ctx
        cur = next(r for r in self.roles if r is self.turn)
        cur["ready"], cur["why"] = ready, why
        cur["ctx"] = (k.mask, k.full, k.env, k.loops, k.stmt)
        nxt = self._next(cur)
        if nxt is None:
            raise self._deadlock([r for r in self.roles if not r["done"]])
        if nxt is not cur:
            with self.cv:
                self.turn = nxt
                self.cv.notify_all()
                while self.turn is not cur and not self.finished:
                    self.cv.wait()
                if self.finished:
                    raise Abort()
        k.mask, k.full, k.env, k.loops, k.stmt = cur["ctx"]
        cur["ready"], cur["why"] = None, ""
