"""The lockstep thread group: who runs, where it is, and how a hazard names that place.

Every thread of a block (of a thread-block cluster) runs each statement at once, vectorised over
numpy: ``tid`` is ``np.arange(threads)``, an index expression evaluates to an int (uniform) or to
one value per thread, and ``If`` narrows an active-thread mask.  Every other part of the
interpreter asks this object which threads execute the current statement and raises its hazards
through it, so that each message carries the kernel, the block (or cluster), the loop variables
and the statement involved.

A thread-block cluster of C blocks runs as one group of C x Tc threads: thread g is thread
g % Tc of the block of rank g // Tc.  ``tid`` counts the cluster's threads, ``ltid`` (what the
kernel's ``tid`` variable sees) a block's.  A batch of independent blocks (``batch`` > 1, see
``kernel``) runs the same way, as ranks of a group that never synchronise with each other, each
rank with its own block index.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import HazardError, InternalError
from ..hardware.atoms import base as atoms
from .exprs import compile_expr
from .messages import describe, listing, provenance
from .tables import thread_groups


class Lockstep:
    """The threads of the running block (cluster) and their position: the active mask, the
    index-variable environment, the enclosing loops and the current statement."""

    def __init__(self, kernel: ir.Kernel, batch: int = 1):
        self.kernel = kernel
        self.cluster = int(getattr(kernel, "cluster", 1) or 1)
        if batch > 1 and self.cluster > 1:
            raise InternalError(f"kernel {kernel.name!r}: clusters of {self.cluster} blocks do not run batched")
        self.batch = batch
        self.C = self.cluster * batch       # block ranks run together
        self.Tc = int(kernel.threads)
        self.T = self.C * self.Tc
        self.tid = np.arange(self.T, dtype=np.int64)
        self.rank = self.tid // self.Tc
        self.ltid = self.tid % self.Tc
        self.fns: dict[int, tuple] = {}     # id(expr) -> (expr, compiled); the expr keeps the id alive
        # statements get small ids so that per-element history (last writer's statement, ...) fits
        # in int64 arrays; the ids index this list for the messages
        self.stmts: list = []
        self.stmt_ids: dict[int, int] = {}
        self.stmt = None
        self.roles = None                   # the role scheduler while a Roles statement runs
        self._act_mask, self._act = None, None      # active()'s last mask and its thread ids

    def start_block(self, bid):
        """Position at the start of block (cluster) ``bid``: all threads active, no loops."""
        self.bid = bid
        bx = bid[0] + self.rank if self.C > 1 else bid[0]
        self.env = {ir.TID_NAME: self.ltid, ir.BID_NAMES[0]: bx, ir.BID_NAMES[1]: bid[1],
                    ir.BID_NAMES[2]: bid[2]}
        self._restart()

    def start_batch(self, bids):
        """Position at the start of the independent blocks ``bids`` (one per rank), run at once."""
        self.bid = bids[0]
        coords = np.asarray(bids, dtype=np.int64)[self.rank]          # [T, 3]
        self.env = {ir.TID_NAME: self.ltid}
        for d, name in enumerate(ir.BID_NAMES):
            col = coords[:, d]
            self.env[name] = int(col[0]) if (col == col[0]).all() else col
        self._restart()

    def _restart(self):
        self.loops: list[tuple[str, int]] = []
        self.mask = np.ones(self.T, dtype=bool)
        self.full = True
        self.stmt = None
        self.roles = None

    # ----------------------------------------------------------------- statements

    def sid(self, s) -> int:
        """The id of statement ``s`` (assigned on first use)."""
        i = self.stmt_ids.get(id(s))
        if i is None:
            i = self.stmt_ids[id(s)] = len(self.stmts)
            self.stmts.append(s)
        return i

    def stmt_str(self, i) -> str:
        return describe(self.stmts[int(i)]) if i >= 0 else "?"

    # ----------------------------------------------------------------- values and threads

    def ev(self, x):
        """Value of index expression ``x`` now (an int or a per-thread array)."""
        if type(x) is int:
            return x
        entry = self.fns.get(id(x))
        if entry is None:
            entry = self.fns[id(x)] = (x, compile_expr(x))
        return entry[1](self.env)

    def per_thread(self, x) -> np.ndarray:
        """Value of index expression ``x`` for every thread, ``[T]``."""
        v = self.ev(x)
        if np.ndim(v) == 0:
            return np.full(self.T, int(v), dtype=np.int64)
        return np.broadcast_to(np.asarray(v, dtype=np.int64), (self.T,))

    def active(self) -> np.ndarray:
        """The active threads' ids (``tid`` itself when all are).  Masks are replaced, never
        changed in place, so the ids of the last mask asked about are kept."""
        if self.full:
            return self.tid
        m = self.mask
        if m is not self._act_mask:
            self._act_mask, self._act = m, np.flatnonzero(m)
        return self._act

    def enabled(self, s) -> np.ndarray:
        """Thread ids that are active and whose ``pred`` is non-zero, and the active ones."""
        if type(s.pred) is int:
            act = self.active()
            return (act if s.pred else act[:0]), act
        p = self.per_thread(s.pred) != 0
        act = self.active()
        return act[p[act]], act

    def issuing_groups(self, s) -> np.ndarray:
        """Thread groups that issue the collective atom of ``s`` now (all threads of each active);
        ``[G, n]``.  Part of a group issuing it (divergence, a non-uniform pred) is a hazard."""
        groups = thread_groups(s.atom.group, self.T)
        if self.C > 1 and s.atom.group == atoms.BLOCK:
            groups = self.tid.reshape(self.C, self.Tc)
        on, _ = self.enabled(s)
        if on.size == self.T:
            return groups
        if on.size == 0:
            return groups[:0]
        flag = np.zeros(self.T, dtype=bool)
        flag[on] = True
        g = flag[groups]
        full = g.all(axis=1)
        part = g.any(axis=1) & ~full
        if part.any():
            k = np.flatnonzero(part)[0]
            missing = groups[k][~g[k]]
            self.hazard(f"collective atom {s.atom.name} ({s.atom.group}) issued by part of its thread group "
                        f"(divergent code or a non-uniform pred): threads {listing(groups[k][g[k]])} "
                        f"issue it, threads {listing(missing)} do not")
        return groups[full]

    # ----------------------------------------------------------------- errors

    def hazard(self, message: str, *, thread=None, other=None, other_thread=None, on=None):
        """Raise ``HazardError(message)``, saying where: first a short line (the kind of hazard, the
        buffer ``on``, the strategy whose lowering emitted the statement, and that of statement
        ``other`` — a statement id — when another access is involved), then the schedule nodes,
        ``thread``'s units and tiles in the schedule's terms, ``message``, the kernel, block, loops
        and the statement."""
        stmt_other = self.stmts[int(other)] if other is not None and int(other) >= 0 else None
        head, lines = provenance(self, self.stmt, message, thread=thread, other=stmt_other,
                                 other_thread=other_thread, on=on)
        where = f"kernel {self.kernel.name!r}, block {self.bid}"
        if self.C > 1:
            b = self.bid
            where = (f"kernel {self.kernel.name!r}, cluster of blocks ({b[0]}..{b[0] + self.C - 1}, {b[1]}, "
                     f"{b[2]}) (thread g is thread g % {self.Tc} of the block of rank g // {self.Tc})")
        if self.loops:
            where += ", " + ", ".join(f"{n}={v}" for n, v in self.loops)
        stmt = describe(self.stmt) if self.stmt is not None else "(end of block)"
        details = "".join(f"\n  {line}" for line in lines)
        raise HazardError(f"{head}{details}\n  {message}\n  in {where}\n  at {stmt}")

    def hazard_at(self, sid: int, message: str):
        """A hazard blamed on statement ``sid`` (an operation found unfinished at the block's end)."""
        self.stmt = self.stmts[sid]
        self.hazard(message)
