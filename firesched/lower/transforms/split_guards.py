"""Rolled loops whose guards are settled on most iterations, split so those run unguarded.

A loop over a row's or a tile's chunks guards its accesses against the edges: the window's first
run may start before the row, its last chunk may pass the row's end, a batch of two iterations
may run one past the loop.  Each guard is an ``If`` (or an atom's ``pred``) that the printer turns
into a branch or a predicate, with its address arithmetic and its zero-filled ``else``, on every
iteration, although on all but the first and the last few it holds for every thread::

    for c in 0..9 (rolled):                       for c in 0..9 (rolled):
        if (c*2048 + tid*8 >= p) load(...)    ->       if (1 <= c && c < 7): body(c), no guards
        if (c*2048 + tid*8 + 7 < n + p) ...           if (!(1 <= c && c < 7)): body(c), guarded

The pass looks at every rolled loop (not unrolled, no run-time ``stop``) whose body's guards
mention its variable, and at each iteration on its own: a guard is *settled* there when its
condition is provably true, or provably false, for every value of the other variables (threads,
blocks, the unrolled loops inside) — ``ir.expr.bounds`` over their extents.  On the longest run
of iterations where every guard is settled the loop runs a copy of its body with the settled
guards resolved (a true ``If`` is its body, a false one is dropped, a true ``pred`` is gone),
chosen by one branch on the iteration, the same for every thread; the other iterations run the
original body.  Iterations run in the same order and each runs the same statements it ran
before, so the program means the same; it only does less work per iteration.

Only loops that do not synchronize (no barrier, no wait for asynchronous copies or mbarriers),
hold at most ``MAX_BODY`` statements and move at least ``MIN_ACCESS_BYTES`` a thread in one of
their accesses are split:

* the body is printed up to three times, and a loop that synchronizes is a pipeline (a GEMM's K
  loop, an attention key loop) whose look-ahead guards and edge steps its own rule lays out, in
  kernels that run at the register limit;
* a loop of narrow accesses only (a row kernel's element plan: one 2-byte element a thread an
  iteration) loses its batching without its guards: ptxas then interleaves the batch's loads with
  their uses, each load waiting on its own (add + RMSNorm over 131,071 columns, bf16, on an H100:
  1.29-1.36x the time split; bench/README.md).  The predicated loads it had stay grouped.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...hardware.atoms.base import CLUSTER, MBARRIER, SYNC
from ...ir.expr import BinOp, add, binop, bounds, free_vars, ge, land, lt, mul, substitute
from ...ir.rewrite import walk

#: statements a loop body may hold to be split (it is printed up to three times)
MAX_BODY = 400
#: iterations a loop may have to be examined one by one
MAX_EXTENT = 512
#: the fewest iterations the unguarded loop must take
MIN_RUN = 2
#: a loop is split only if one of its accesses moves this many bytes a thread (a vector plan's)
MIN_ACCESS_BYTES = 16


def split_guards(body: list) -> list:
    """``body`` (a kernel's statements) with its rolled loops split around the iterations whose
    guards are all settled (module docstring)."""
    return [_stmt(s) for s in body]


def _stmt(st):
    if isinstance(st, ir.Seq):
        return ir.Seq(tuple(_stmt(x) for x in st.body))
    if isinstance(st, ir.If):
        return ir.If(st.cond, _stmt(st.then))
    if isinstance(st, ir.For):
        return _split(attrs.evolve(st, body=_stmt(st.body)))
    return st


#: atom families that wait for other threads or for memory: a loop issuing one is not split
WAITS = (CLUSTER, MBARRIER, SYNC)


def _synchronizes(body) -> bool:
    return any(isinstance(s, (ir.Barrier, ir.AsyncWait, ir.AsyncCommit))
               or (isinstance(s, ir.AtomCall) and s.atom.family in WAITS) for s in walk([body]))


def _widest_access(body) -> int:
    return max((s.atom.width for s in walk([body]) if isinstance(s, ir.AtomCall)), default=0)


def _conditions(body) -> list:
    out = []
    for s in walk([body]):
        if isinstance(s, ir.If):
            out.append(s.cond)
        elif isinstance(s, ir.AtomCall) and not isinstance(s.pred, int):
            out.append(s.pred)
    return out


def _split(loop: ir.For):
    if loop.unroll or loop.stop is not None or not 3 <= loop.extent <= MAX_EXTENT:
        return loop
    v = loop.var
    # by name: an expression may hold the loop's variable with another extent (the loop's own is
    # its iteration count, a pipeline's look-ahead index another)
    conds = [c for c in _conditions(loop.body) if any(x.name == v.name for x in free_vars(c))]
    if (not conds or sum(1 for _ in walk([loop.body])) > MAX_BODY or _synchronizes(loop.body)
            or _widest_access(loop.body) < MIN_ACCESS_BYTES):
        return loop
    settled = [all(decided(substitute(c, {v.name: i})) for c in conds) for i in range(loop.extent)]
    lo, hi = _longest_run(settled)
    if hi - lo < MIN_RUN:
        return loop
    fast = _resolved(loop.body) or ir.Seq(())
    if lo == 0 and hi == loop.extent:
        return attrs.evolve(loop, body=ir.Seq((ir.Comment("every guard settled on every iteration"), fast)))
    # one loop, a branch on the iteration (the same for every thread): three loops over the same
    # addresses made ptxas (CUDA 13.0) rebase the last loop's addresses on the register the middle
    # loop had advanced (an illegal shared read on an H100, bench/README.md)
    inside = land(ge(v, lo), lt(v, hi))
    return attrs.evolve(loop, body=ir.Seq((
        ir.Comment(f"{v.name} = {lo} .. {hi - 1}: every guard settled, none tested"),
        ir.If(inside, fast),
        ir.If(binop("==", inside, 0), loop.body))))


def _longest_run(flags: list) -> tuple[int, int]:
    best, start = (0, 0), None
    for i, f in enumerate(flags + [False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = None
    return best


def _resolved(st):
    """``st`` with settled guards resolved: a true ``If`` becomes its body, a false one nothing, a
    true predicate none."""
    if isinstance(st, ir.Seq):
        return ir.Seq(tuple(x for x in (_resolved(s) for s in st.body) if x is not None))
    if isinstance(st, ir.If):
        if provably_true(st.cond):
            return _resolved(st.then)
        if provably_false(st.cond):
            return None
        return ir.If(st.cond, _resolved(st.then) or ir.Seq(()))
    if isinstance(st, ir.For):
        return attrs.evolve(st, body=_resolved(st.body) or ir.Seq(()))
    if isinstance(st, ir.AtomCall) and not isinstance(st.pred, int) and provably_true(st.pred):
        return attrs.evolve(st, pred=1)
    return st


def decided(cond) -> bool:
    """``cond`` is the same (true, or false) for every value of its variables."""
    return provably_true(cond) or provably_false(cond)


def _difference(a, b):
    return add(a, mul(-1, b))


def provably_true(cond) -> bool:
    """``cond`` holds for every value of its variables (their extents), by interval bounds."""
    if isinstance(cond, int):
        return cond != 0
    if not isinstance(cond, BinOp):
        lo, _ = bounds(cond)
        return lo is not None and lo > 0
    if cond.op == "&&":
        return provably_true(cond.a) and provably_true(cond.b)
    if cond.op == "<":
        _, hi = bounds(_difference(cond.a, cond.b))
        return hi is not None and hi < 0
    if cond.op == ">=":
        lo, _ = bounds(_difference(cond.a, cond.b))
        return lo is not None and lo >= 0
    if cond.op == "==" and cond.b == 0:
        return provably_false(cond.a)
    if cond.op == "!=" and cond.b == 0:
        return provably_true(cond.a)
    return False


def provably_false(cond) -> bool:
    """``cond`` fails for every value of its variables."""
    if isinstance(cond, int):
        return cond == 0
    if not isinstance(cond, BinOp):
        lo, hi = bounds(cond)
        return lo == 0 and hi == 0
    if cond.op == "&&":
        return provably_false(cond.a) or provably_false(cond.b)
    if cond.op == "<":
        lo, _ = bounds(_difference(cond.a, cond.b))
        return lo is not None and lo >= 0
    if cond.op == ">=":
        _, hi = bounds(_difference(cond.a, cond.b))
        return hi is not None and hi < 0
    if cond.op == "==" and cond.b == 0:
        return provably_true(cond.a)
    if cond.op == "!=" and cond.b == 0:
        return provably_false(cond.a)
    return False


__all__ = ["split_guards", "provably_true", "provably_false", "decided", "MAX_BODY", "MIN_ACCESS_BYTES"]
