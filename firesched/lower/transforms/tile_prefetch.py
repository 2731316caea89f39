"""A persistent block's tile loop as a software pipeline: the next tiles' copies in flight.

``pipeline(stages=S)`` over a persistent grid's tile loop (no K loop below it: a row kernel
whose row waits in shared memory) makes each shared tensor that a ``Move`` fills from global
memory once a tile ``S`` deep.  The copies of tile ``i + S - 1`` are issued while tile ``i``
computes, so a block always has a tile's loads in flight — the overlap a plain grid gets from
its next blocks starting while the others compute, kept in a grid of as many blocks as the SMs
hold (``to_blocks(persistent=True)``), whose blocks do once what does not depend on the tile::

    prologue:  issue tiles 0 .. S-2 (each its cp.async group)
    for i:     wait until tile i landed (S-2 groups may stay pending); barrier
               issue tile i+S-1 into stage (i+S-1) % S; commit (an empty group past the last)
               compute tile i from stage i % S

One barrier a tile does both jobs, as in a K loop's ``CpAsyncRing``: every thread's copies of
tile ``i`` are visible after it, and every thread has finished tile ``i - 1`` — the last
reads of stage ``(i + S - 1) % S`` — before anyone refills that stage.

The global -> shared rule (``rules.copies``) lowers each such move where the tree has it, with
the tile's stage, and hands its copies to ``TileCopies`` instead of emitting them there; the
driver places them here, in the loop variable of the tile they fetch.  What a copy reads must not
depend on the tile's work (it is issued before that work): the strategy takes moves from global
memory into shared memory only, and a copy whose addresses name a variable of the block's other
loops is refused.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...ir.expr import Var, free_vars, land, lt, substitute
from ...ir.rewrite import map_stmt, substitute_stmt, walk
from ...schedule import Node
from ...spec import Move
from ...tensor import BLOCK, GL, SH
from ..context import err


def prefetched_moves(block: Node) -> list[Node]:
    """The moves under ``block`` that fill a shared tensor from global memory once a tile and whose
    tensor is more than one stage deep (``pipeline`` over the tile loop made it so): those under
    no loop of more than one step."""
    out = []

    def go(n: Node, looped: bool):
        looped = looped or any(lp.count > 1 and lp.unit != BLOCK for lp in n.loops)
        sp = n.spec
        if (isinstance(sp, Move) and sp.src.memory == GL and sp.dst.memory == SH and sp.dst.tensor.stages > 1
                and not looped):
            out.append(n)
        for c in n.children:
            go(c, looped)

    go(block, False)
    return out


@attrs.define(eq=False)
class TileCopies:
    """The copies of the prefetched moves, as the rule lowered them for tile ``tile`` (the tile
    loop's variable) into stage ``tile % stages``."""

    names: frozenset
    stages: int
    tile: Var
    copies: list = attrs.field(factory=list)

    def stage(self):
        return self.tile % self.stages

    def record(self, node: Node, stmts: list) -> list:
        """Keep the copies ``stmts`` of ``node``'s move; what the tree gets in their place."""
        allowed = {self.tile.name} | {st.var.name for st in walk(stmts) if isinstance(st, ir.For)}
        seen: set = set()

        def note(x):
            seen.update(v.name for v in free_vars(x) if v.name not in allowed and not _hardware(v))
            return x

        for st in stmts:
            map_stmt(st, note)
        loop_vars = sorted(seen)
        if loop_vars:
            raise err(node, f"{node.spec.dst.name} is copied one tile ahead, but its addresses name "
                            f"{', '.join(loop_vars)}, a loop's variable other than the tile's",
                      strategy="pipeline", fix="copy the tile whole, outside the block's other loops")
        self.copies.extend(stmts)
        return [ir.Comment(f"{node.spec}: issued {self.stages - 1} tile(s) ahead (pipeline over the "
                           "block's tile loop)")]

    def issue(self, at) -> list:
        """The copies of tile ``at`` (an expression of the tile variable)."""
        return [substitute_stmt(st, {self.tile: at}) for st in self.copies]


def _hardware(v) -> bool:
    """Thread and block indices (not loop variables)."""
    return v.name in (ir.nodes.TID_NAME, ir.nodes.ROLE_TID_NAME, *ir.nodes.BID_NAMES)


def pipelined_tiles(ring: TileCopies, extent: int, valid, work: list) -> tuple[list, ir.For]:
    """The prologue and the tile loop of a persistent block whose copies ``ring`` recorded;
    ``valid``: whether the block's tile ``ring.tile`` exists (1: always); ``work``: the tile's
    lowered work (the copies already taken out of it)."""
    S, ti = ring.stages, ring.tile

    def exists(at):
        ok = lt(at, extent) if not isinstance(at, int) else int(at < extent)
        return ok if valid == 1 else land(ok, substitute(valid, {ti: at}))

    prologue = []
    for s in range(S - 1):
        # (a commit group for every tile, empty where no block has it: the waits count S - 2)
        ok = exists(s)
        copies = ir.Seq(tuple(ring.issue(s)))
        prologue += [copies if ok == 1 else ir.If(ok, copies)] if ok != 0 else []
        prologue.append(ir.AsyncCommit())
    ahead = ti + (S - 1)
    body = [ir.AsyncWait(max(S - 2, 0)),
            ir.Barrier(f"tile {ti.name} landed; every thread is done with the stage it refills"),
            ir.If(exists(ahead), ir.Seq(tuple(ring.issue(ahead)))),
            ir.AsyncCommit(), *work]
    body = body if valid == 1 else [ir.If(valid, ir.Seq(tuple(body)))]
    return prologue, ir.For(ti, extent, ir.Seq(tuple(body)))


__all__ = ["prefetched_moves", "TileCopies", "pipelined_tiles"]
