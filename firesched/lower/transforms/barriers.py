"""Barriers a kernel does not need: rules place a block-wide barrier wherever their own reasoning
asks for one, without seeing their neighbours' (a copy into shared memory ends with "the tile is
filled", the next part of a fused kernel starts with "the earlier parts are done with it", a
block reduction ends with "the partial results were read" so that the next one may overwrite
them).  A barrier orders what the block's threads did since the barrier before it with what they
do until the barrier after it; it is needed only where those two stretches touch one buffer and
one of them writes it::

    bar P  ─┐                                           bar P
    reads Partials     (before: reads Partials)         reads Partials
    bar B  ─┤  B orders before ↔ after          ->     (B: no barrier needed here)
    writes Other       (after: writes Other, reads X)   writes Other
    reads X                                             reads X
    bar N  ─┘                                           bar N

Before and after are followed along every path of the program: into branches (a branch may be
skipped), around loops (the next iteration comes back to the loop's start; a loop may run no
iteration) and out of them, up to the next block-wide barrier on that path or the kernel's start
and end.  Barrier B goes where no buffer is written on one side and touched on the other (shared
or global memory, by name; registers are a thread's own).  Then every pair of accesses B
ordered is still ordered: one of the two lies beyond P or N, which stay.  The barriers are
visited in program order and each is judged against the ones still there, so dropping several
never leaves a pair unordered.

What the analysis cannot see through keeps every barrier beside it: atoms other than plain
loads and stores, ldmatrix / stmatrix, register-only ones (MMA, shuffles, conversions) and
``cp.async``; named barriers; warp-specialized roles.  ``cp.async`` writes shared memory at a
time of its own, which a barrier after the issue does not order (``cp.async.wait_group`` and a
barrier after it do), so the copy counts as a write after a barrier (the readers before must be
done before it is issued) and not before one; a wait counts as a write of every buffer before a
barrier (the copies it completes become visible there).  The interpreter's race detection checks
the result on every kernel the tests run.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...hardware.atoms.base import CONVERT, COPY, CP_ASYNC, LDMATRIX, MMA, SHUFFLE, STMATRIX

#: atom families whose memory accesses are their memory operands, performed when issued
PLAIN = frozenset({COPY, LDMATRIX, STMATRIX, MMA, SHUFFLE, CONVERT})


@attrs.frozen
class Effect:
    """The buffers a stretch of the kernel reads and writes (``every``: it may touch any)."""

    reads: frozenset = frozenset()
    writes: frozenset = frozenset()
    every: bool = False

    def __or__(self, other: Effect) -> Effect:
        return Effect(self.reads | other.reads, self.writes | other.writes, self.every or other.every)

    @property
    def empty(self) -> bool:
        return not (self.reads or self.writes or self.every)

    def conflicts(self, other: Effect) -> bool:
        """Whether a barrier between this stretch and ``other`` orders two accesses to one
        buffer, one of them a write."""
        if self.empty or other.empty:
            return False
        if self.every or other.every:
            return True
        return bool(self.writes & (other.reads | other.writes) or self.reads & other.writes)


NOTHING = Effect()
EVERYTHING = Effect(every=True)


def _block_wide(s) -> bool:
    return isinstance(s, ir.Barrier) and s.threads == 0 and not s.arrive and isinstance(s.bar_id, int) \
        and s.bar_id == 0


def _atom_effect(s: ir.AtomCall, before: bool) -> Effect:
    fam = s.atom.family
    if fam not in PLAIN and fam != CP_ASYNC:
        return EVERYTHING
    reads, writes = set(), set()
    for name, ref in s.args:
        if isinstance(ref, ir.RegRef):
            continue
        if not isinstance(ref, ir.MemRef):
            return EVERYTHING
        # a memory operand is an address: the move reads ``src`` and writes ``dst``
        if name == "src":
            reads.add(ref.buffer.name)
        elif name == "dst":
            if not (fam == CP_ASYNC and before):
                writes.add(ref.buffer.name)
        else:
            return EVERYTHING
    return Effect(frozenset(reads), frozenset(writes))


def _children(s) -> list:
    if isinstance(s, ir.Seq):
        return list(s.body)
    if isinstance(s, (ir.For, ir.If)):
        return [s.body if isinstance(s, ir.For) else s.then]
    return []


class _Scan:
    """Effects of statements up to the first block-wide barrier on each path, forward
    (``before=False``: the stretch after a barrier) or backward (``before=True``)."""

    def __init__(self, before: bool):
        self.before = before
        self.memo: dict[int, tuple[Effect, bool]] = {}

    def stmts(self, stmts: list) -> tuple[Effect, bool]:
        """(what the paths through ``stmts`` touch before a barrier, whether a path gets
        through without one)."""
        acc = NOTHING
        for s in reversed(stmts) if self.before else stmts:
            e, through = self.stmt(s)
            acc = acc | e
            if not through:
                return acc, False
        return acc, True

    def stmt(self, s) -> tuple[Effect, bool]:
        key = id(s)
        if key not in self.memo:
            self.memo[key] = self._stmt(s)
        return self.memo[key]

    def _stmt(self, s) -> tuple[Effect, bool]:
        if isinstance(s, (ir.Comment, ir.RegFill, ir.Pointwise, ir.AsyncCommit)):
            return NOTHING, True
        if isinstance(s, ir.AsyncWait):
            # the thread's copies complete here; a barrier after publishes them
            return (EVERYTHING if self.before else NOTHING), True
        if isinstance(s, ir.Barrier):
            return (NOTHING, False) if _block_wide(s) else (EVERYTHING, True)
        if isinstance(s, ir.AtomCall):
            return _atom_effect(s, self.before), True
        if isinstance(s, ir.Seq):
            return self.stmts(list(s.body))
        if isinstance(s, ir.If):
            return self.stmts([s.then])[0], True
        if isinstance(s, ir.For):
            e, through = self.stmts([s.body])
            runs = s.extent >= 1 and s.stop is None
            return e, through or not runs
        return EVERYTHING, True


def _side(path: list, before: bool) -> Effect:
    """What the block's threads touch between the barrier at ``path`` (a list of (container,
    children, index) from the kernel's top level down) and the block-wide barrier before it
    (``before``) or after it, along every path."""
    scan = _Scan(before)
    acc = NOTHING
    for container, children, i in reversed(path):
        rest = children[:i] if before else children[i + 1:]
        e, through = scan.stmts(rest)
        acc = acc | e
        if not through:
            return acc
        if isinstance(container, ir.For):
            # the loop's other iterations (the one before, or the one after, and on)
            acc = acc | scan.stmts(children)[0]
    return acc


def _barrier_paths(stmts: list, path: list, out: list) -> None:
    for i, s in enumerate(stmts):
        here = path + [(i,)]
        if _block_wide(s):
            out.append(here)
        elif isinstance(s, (ir.Seq, ir.For, ir.If)):
            _barrier_paths(_children(s), here, out)


def _frames(body: list, steps: list) -> list:
    frames, container, children = [], None, body
    for (i,) in steps:
        frames.append((container, children, i))
        container = children[i]
        children = _children(container)
    return frames


def _replace(stmts: list, steps: list, new) -> list:
    (i,), rest = steps[0], steps[1:]
    out = list(stmts)
    if not rest:
        out[i] = new
        return out
    s = out[i]
    kids = _replace(_children(s), rest, new)
    if isinstance(s, ir.Seq):
        out[i] = ir.Seq(tuple(kids))
    elif isinstance(s, ir.For):
        out[i] = attrs.evolve(s, body=kids[0])
    else:
        out[i] = attrs.evolve(s, then=kids[0])
    return out


def without_redundant_barriers(body: list) -> list:
    """``body`` (a kernel's top-level statements) without the block-wide barriers that order no
    two accesses to one buffer (see the module docstring); each becomes a comment saying so."""
    body = list(body)
    paths: list = []
    _barrier_paths(body, [], paths)
    for steps in paths:
        frames = _frames(body, steps)
        if _side(frames, True).conflicts(_side(frames, False)):
            continue
        container, children, i = frames[-1]
        body = _replace(body, steps, ir.Comment(f"({children[i].comment}: no barrier needed here)"))
    return body


__all__ = ["without_redundant_barriers", "Effect"]
