"""Loops whose guards are settled on most iterations, split so those run unguarded.

A loop over a row's or a tile's chunks guards its accesses against the edges: the window's first
run may start before the row, its last chunk may pass the row's end, a batch of two iterations
may run one past the loop.  Each guard is an ``If`` (or an atom's ``pred``) that the printer turns
into a branch or a predicate, with its address arithmetic and its zero-filled ``else``, on every
iteration, although on all but the first and the last few it holds for every thread::

    for c in 0..9 (rolled):                       for c in 0..1:  body(c)            (guarded)
        if (c*2048 + tid*8 >= p) load(...)    ->   for c' in 0..6: body(c' + 1)       (no guards)
        if (c*2048 + tid*8 + 7 < n + p) ...       for c in 0..2:  body(c + 7)        (guarded)

A guard is *settled* on an iteration when its condition is provably true, or provably false, for
every value of the other variables (threads, blocks, the unrolled loops inside) —
``ir.expr.bounds`` over their extents.  In a rolled loop (no run-time ``stop``) the longest run of
iterations where every guard is settled becomes a loop of its own with the settled guards
resolved (a true ``If`` is its body, a false one is dropped, a true ``pred`` is gone); the
iterations before and after it keep the original body.  An unrolled loop (the compiler writes it
out anyway) whose body branches to an element-by-element edge path (an aligned window's,
``rules.threads.window_access``) is written out here, each iteration with its settled guards
resolved, on blocks of up to ``WRITTEN_OUT_THREADS`` threads (measured).  Iterations run in the
same order and each runs the same statements it ran before, so the program means the same; it
only does less work per iteration.

Only loops that do not synchronize (no barrier, no wait for asynchronous copies or mbarriers),
issue no asynchronous copy or tensor-core operation, hold at most ``MAX_BODY`` statements and move
at least ``MIN_ACCESS_BYTES`` a thread in one of their accesses are split:

* the body is printed up to three times, and a loop that synchronizes or copies asynchronously is
  a pipeline (a GEMM's K loop and prologue, an attention key loop) whose look-ahead guards and
  edge steps its own rule lays out, in kernels that run at the register limit;
* a loop of narrow accesses only (a row kernel's element plan: one 2-byte element a thread an
  iteration) loses its batching without its guards: ptxas then interleaves the batch's loads with
  their uses, each load waiting on its own (add + RMSNorm over 131,071 columns, bf16, on an H100:
  1.29-1.36x the time split; bench/README.md).  The predicated loads it had stay grouped.

A first version of this pass (2026-11-27) faulted on the GPU where ptxas rebased a tail loop's
shared address on the register the middle loop had advanced (bench/README.md, "Row loops split
around their settled guards"); the kernels of this one run clean under compute-sanitizer and the
GPU row tests, which are what would show it again.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...hardware.atoms.base import (
    CLUSTER,
    COPY,
    CP_ASYNC,
    LDMATRIX,
    MBARRIER,
    MMA,
    STMATRIX,
    SYNC,
    TMA,
    WGMMA,
)
from ...ir.expr import BinOp, Var, add, bounds, free_vars, mul, substitute
from ...ir.rewrite import substitute_stmt, walk

#: statements a loop body may hold to be split (it is printed up to three times)
MAX_BODY = 400
#: iterations a loop may have to be examined one by one
MAX_EXTENT = 512
#: the fewest iterations the unguarded loop must take
MIN_RUN = 2
#: the largest block whose unrolled loops' settled iterations are written out unguarded.  Measured
#: on an H200 (bench/rows.py, bf16, against the rolled loops' split alone): 256-thread staged
#: windows of add + RMSNorm 2048 x 12289 and 4096 x 12373 0.947 and 0.934 of the time, RMSNorm
#: 1024 x 24569 0.982; but LayerNorm's 512-thread blocks at 16,383 and 24,569 columns 1.011 and
#: 1.046, add + RMSNorm's 1,024-thread register window at 24,569 1.043
WRITTEN_OUT_THREADS = 256
#: a loop is split only if one of its accesses moves this many bytes a thread (a vector plan's)
MIN_ACCESS_BYTES = 16


def split_guards(body: list, threads: int) -> list:
    """``body`` (a kernel's statements, on blocks of ``threads`` threads) with its rolled loops
    split around the iterations whose guards are all settled, and its unrolled loops' settled
    iterations written out unguarded on blocks of up to ``WRITTEN_OUT_THREADS`` (module
    docstring)."""
    return [_stmt(s, threads <= WRITTEN_OUT_THREADS) for s in body]


def _stmt(st, write_out: bool):
    if isinstance(st, ir.Seq):
        return ir.Seq(tuple(_stmt(x, write_out) for x in st.body))
    if isinstance(st, ir.If):
        return ir.If(st.cond, _stmt(st.then, write_out))
    if isinstance(st, ir.For):
        return _split(attrs.evolve(st, body=_stmt(st.body, write_out)), write_out)
    return st


#: atom families that wait for other threads or for memory: a loop issuing one is not split
WAITS = (CLUSTER, MBARRIER, SYNC)


def _synchronizes(body) -> bool:
    return any(isinstance(s, (ir.Barrier, ir.AsyncWait, ir.AsyncCommit))
               or (isinstance(s, ir.AtomCall) and s.atom.family in WAITS) for s in walk([body]))


#: atom families a split loop may not issue: asynchronous copies and tensor-core operations (a
#: pipeline's prologue or a tile's fragments, whose rules lay out their own edges)
PIPELINED = (CP_ASYNC, TMA, MMA, WGMMA, LDMATRIX, STMATRIX)


def _pipelined(body) -> bool:
    return any(isinstance(s, ir.AtomCall) and s.atom.family in PIPELINED for s in walk([body]))


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


def _split(loop: ir.For, write_out: bool):
    if loop.stop is not None or not (2 if loop.unroll else 3) <= loop.extent <= MAX_EXTENT or \
            (loop.unroll and not write_out):
        return loop
    v = loop.var
    # by name: an expression may hold the loop's variable with another extent (the loop's own is
    # its iteration count, a pipeline's look-ahead index another)
    conds = [c for c in _conditions(loop.body) if any(x.name == v.name for x in free_vars(c))]
    if (not conds or sum(1 for _ in walk([loop.body])) > MAX_BODY or _synchronizes(loop.body)
            or _widest_access(loop.body) < MIN_ACCESS_BYTES or _pipelined(loop.body)):
        return loop
    if loop.unroll:
        return _written_out(loop, conds)
    settled = [all(decided(substitute(c, {v.name: i})) for c in conds) for i in range(loop.extent)]
    lo, hi = _longest_run(settled)
    if hi - lo < MIN_RUN:
        return loop
    parts = []
    if lo > 0:
        parts.append(_part(loop, 0, lo, "head", resolve=False))
    parts.append(_part(loop, lo, hi, "mid", resolve=True))
    if hi < loop.extent:
        parts.append(_part(loop, hi, loop.extent, "tail", resolve=False))
    return ir.Seq(tuple(parts))


def _written_out(loop: ir.For, conds: list):
    """An unrolled loop (written out by the compiler anyway) whose guards settle on some
    iterations: each iteration written out here, its settled guards resolved (an iteration runs
    as its own code, so no loop needs to be cut around it)::

        for c in 0..2 (unrolled):                     c = 0: if (tid*8 >= p) ...  (guarded)
            if (c*1024 + tid*8 >= p) ...       ->     c = 1: ...                  (none tested)
                                                      c = 2: if (...) ...         (guarded)
    """
    v = loop.var
    if not _edge_path(loop.body) or \
            not any(all(decided(substitute(c, {v.name: i})) for c in conds) for i in range(loop.extent)):
        # (a loop of whole vectors whose last pass is predicated keeps its one test a pass: written
        # out, LayerNorm's rows of 40,000 f16 spilled 4 bytes at 64 registers; no iteration would
        # lose all its tests)
        return loop
    parts = []
    for i in range(loop.extent):
        body = substitute_stmt(loop.body, {v.name: i})
        parts.append(ir.Seq((ir.Comment(f"{v.name} = {i}"), _resolved(body) or ir.Seq(()))))
    return ir.Seq(tuple(parts))


def _edge_path(body) -> bool:
    """Whether ``body`` branches to narrower accesses at an edge (an aligned window's element
    path: ``rules.threads.window_access``), the code a settled iteration drops."""
    return any(isinstance(s, ir.If) and any(isinstance(a, ir.AtomCall) and a.atom.family == COPY
                                            and a.atom.width < MIN_ACCESS_BYTES for a in walk([s.then]))
               for s in walk([body]))


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


def _part(loop: ir.For, lo: int, hi: int, tag: str, *, resolve: bool):
    """Iterations ``lo .. hi - 1`` of ``loop``: a loop over a fresh variable offset by ``lo`` (the
    body alone where there is one iteration), its guards resolved with ``resolve``."""
    n = hi - lo
    if n == 1:
        body = substitute_stmt(loop.body, {loop.var.name: lo})
        return ir.Seq((ir.Comment(f"{loop.var.name} = {lo} ({tag})"),
                       _resolved(body) if resolve else body))
    var = Var(f"{loop.var.name}_{tag}", n)
    body = substitute_stmt(loop.body, {loop.var.name: add(var, lo)})
    if resolve:
        body = _resolved(body)
    note = (f"{loop.var.name} = {lo} .. {hi - 1}: every guard settled, none tested" if resolve
            else f"{loop.var.name} = {lo} .. {hi - 1}: guarded")
    return ir.Seq((ir.Comment(note), ir.For(var, n, body)))


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
