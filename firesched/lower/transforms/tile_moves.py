"""Tile moves: the copies a warp-specialized producer issues once per block tile.

A ``move_to_smem(..., via=(sm90a.tma_load_2d,))`` that sits above the pipelined loop — its
tile is read by every step of the loop, attention's query tile — is filled once per block
tile, not once per step.  Under ``warp_specialize`` the producer issues it too, on a ring of its
own whose loop is the block's tile loop (a persistent block's ``tile_i``; one round in a plain
grid), built from the same ``MbarrierRing`` as the pipelined loop's::

    producer thread 0:  for tile:  for kt: acquire(it); expect; TMA the step's tiles
                                          kt == 0: acquire(tile) (wait tile_empty); expect; TMA the tile
    consumers:          for tile:  wait(tile) (tile_full)
                                   for kt: wait(it); compute; release(it)
                                   release(tile) (tile_empty: one arrival per warpgroup)
                                   the rest of the tile (attention: the last O += P V is retired,
                                   O normalised and stored)

The consumers release the tile once the pipelined loop is done (every wgmma that read it has
retired there, as for the ring's last stage), so the next tile's copy — and the first stages of
the next tile's ring — arrive while the consumers finish the tile.  (FlashAttention-3's Q
pipeline; CuTe DSL's ``PipelineTmaAsync`` of one stage.)

In a block that walks several tiles (persistent), the producer issues the tile after the first
step of its loop (``AFTER_FIRST_STEP``), as FlashAttention-3 issues K before Q: the first step's
stage is free before the consumers are done with the previous tile (they released it S - 1
steps before their loop ends), so the next tile's first K and V tiles are already in flight when
the release lets the tile's copy go, and the consumers then wait for the tile alone rather than
for it and the stage queued behind it.  A block of one tile has nothing to prefetch: there the
tile goes first, ahead of the stages the consumers need after it.  (Untimed against the tile
first; ``AFTER_FIRST_STEP = False`` issues it first everywhere.)

The ring is as deep as the moved tile has stages: one, unless a schedule gives it more.  One is
what fits where this matters: attention at head dim 128 holds three 128-key K and V stages
(192 KiB) and a 128-query Q tile (32 KiB) in the 227 KiB a block may have, leaving no room for a
second Q; and with the release at the end of the key loop a second buffer would only let the
copy start earlier than the work it has to hide (the last step, the normalisation, the store).

Only the copies move to the producer: a tile move must precede the pipelined loop in tree order
(the producer issues it first), lie in no loop of the block but the tile loop, and be read by
nothing after the pipelined loop (its release is placed there).  A move that is not a TMA copy
stays with the consumers (every consumer thread's cp.async, as before).
"""

from __future__ import annotations

import attrs

from ... import ir
from ...hardware.atoms.base import TMA
from ...ir.expr import IntExpr, Var, lt
from ...schedule import Node
from ...spec import Move
from ...tensor import BLOCK, GL, SH
from ..context import CONSUMER, err, frames
from .pipeline import MbarrierRing, staged_moves, tile_bytes

#: the producer issues a block tile's tile moves after the first step of its pipelined loop (the
#: module docstring says why), not before the loop
AFTER_FIRST_STEP = True


def is_tma_fill(node: Node) -> bool:
    """A global -> shared move given a TMA atom (``move_to_smem(..., via=(sm90a.tma_load_2d,))``)."""
    sp = node.spec
    return (isinstance(sp, Move) and sp.src.memory == GL and sp.dst.memory == SH and bool(node.via)
            and getattr(node.via[0], "family", None) == TMA)


def ring_tiles(root: Node) -> frozenset:
    """The shared tensors a pipelined loop's ring fills (every other TMA fill is a tile move)."""
    out = set()
    for n in root.walk():
        if n.spec.level == BLOCK and any(lp.unit is None and lp.dim in n.spec.reduction_dims for lp in n.loops):
            out |= {m.spec.dst.name for m in staged_moves(n)}
    return frozenset(out)


def tile_move_names(root: Node) -> frozenset:
    """The shared tensors of ``root``'s tile moves: TMA fills no pipelined loop's ring fills."""
    ringed = ring_tiles(root)
    return frozenset(n.spec.dst.name for n in root.walk() if is_tma_fill(n) and n.spec.dst.name not in ringed)


def _path(root: Node, target: Node) -> list[Node] | None:
    if root is target:
        return [root]
    for c in root.children:
        p = _path(c, target)
        if p is not None:
            return [root] + p
    return None


def tile_moves(block: Node, loop_node: Node) -> list[Node]:
    """The tile moves of ``block`` whose warp-specialized loop is on ``loop_node``, in tree order;
    a ``ScheduleError`` for one the producer cannot issue once per tile (see the module docstring)."""
    names = tile_move_names(block)
    if not names:
        return []
    path = _path(block, loop_node)
    if path is None:  # pragma: no cover - the specialized loop is found below the block
        raise err(block, "the warp-specialized loop is not below the block")
    moves, after = [], []
    looped = False                  # inside a loop of a node above (its body holds the path)
    for i, p in enumerate(path):
        nxt = path[i + 1] if i + 1 < len(path) else None
        # before the loop: the node's pre, and its body up to the child on the path (the loop
        # node's body is the loop's); after it: the rest of that body, and the node's post
        if nxt is None:
            before, rest = [(c, looped) for c in p.pre], list(p.post)
        else:
            k = next(j for j, c in enumerate(p.children) if c is nxt)
            before = [(c, looped or (bool(p.loops) and j >= len(p.pre))) for j, c in enumerate(p.children[:k])]
            rest = list(p.children[k + 1:])
            looped = looped or (bool(p.loops) and k >= len(p.pre))
        for c, in_loop in before:
            for m in c.walk():
                if is_tma_fill(m) and m.spec.dst.name in names:
                    if c is not m or in_loop:
                        raise err(m, f"{m.spec.dst.name} is copied by TMA above the pipelined loop but inside "
                                     "another loop of the block: a warp-specialized producer issues such a copy "
                                     "once per block tile", strategy=m.strategy,
                                  fix=f"move_to_smem({m.spec.dst.name!r}, ...) right under the block tile, or "
                                      "drop via= (the consumers copy it with cp.async)")
                    moves.append(m)
        after += rest
    found = {m.spec.dst.name for m in moves}
    for n in block.walk():
        if is_tma_fill(n) and n.spec.dst.name in names and n.spec.dst.name not in found:
            raise err(n, f"{n.spec.dst.name} is copied by TMA outside the pipelined loop's ring and not before "
                         "the loop: a warp-specialized producer issues a copy once per block tile only ahead of "
                         "the loop", strategy=n.strategy,
                      fix=f"move_to_smem({n.spec.dst.name!r}, ...) before the loop's tile(...) / online_softmax(...), "
                          "or drop via= (the consumers copy it with cp.async)")
    for c in after:
        for n in c.walk():
            late = [t.name for t in n.spec.operands if t.memory == SH and t.name in found]
            if late:
                raise err(n, f"{late[0]} is read after the pipelined loop; a warp-specialized producer's tile copy "
                             "is released when the loop is done (the next tile's copy may overwrite it)",
                          strategy=n.strategy,
                          fix=f"drop via= from move_to_smem({late[0]!r}, ...) (the consumers copy it), or read it "
                              "only inside the loop")
    return moves


@attrs.define(eq=False)
class TileRing:
    """The ring of a warp-specialized block's tile moves: ``ring`` (an ``MbarrierRing`` of
    ``depth`` stages, iterated once per block tile), the ``moves`` and their shared tensors
    (``names``)."""

    ring: MbarrierRing
    moves: list
    names: frozenset
    #: the producer's statements of one block tile, issued after the pipelined loop's first step
    #: (``after_step``); set in the producer's copy of the ring (``producer_copy``)
    producer: tuple = ()

    @classmethod
    def create(cls, lw, moves: list[Node], consumers: int) -> "TileRing":
        """Ask the kernel for the ring's mbarriers: a full one per stage (the tiles' bytes) and an
        empty one (``consumers`` arrivals: one per consumer warpgroup)."""
        depth = max(1, min(m.spec.dst.tensor.stages for m in moves))
        total = sum(tile_bytes(m) for m in moves)
        ring = MbarrierRing.create(lw, depth, total, consumers=consumers, name="tile")
        return cls(ring, list(moves), frozenset(m.spec.dst.name for m in moves))

    @property
    def depth(self) -> int:
        return self.ring.stages

    def stage(self, it: IntExpr) -> IntExpr:
        """The stage block tile ``it`` (the tile loop's iteration) fills."""
        return it % self.depth if self.depth > 1 else 0

    def stages(self, it: IntExpr) -> dict:
        """``Ctx.stage`` entries of the moved tiles for block tile ``it``."""
        return {n: self.stage(it) for n in self.names}

    def issue(self, lw, ctx) -> list:
        """The producer's statements of one block tile (``ctx``: its elected thread, at the tile):
        wait until the consumers released the stage, announce its bytes, issue every copy (by the
        moves' own rule, on this ring's full barrier)."""
        it = ctx.tile_index
        c = attrs.evolve(ctx, ring=self.ring, stage={**ctx.stage, **self.stages(it)})
        out = [*self.ring.acquire(it), *self.ring.before_issue(self.stage(it))]
        for m in self.moves:
            out += lw.lower(m, frames(c, [m.spec]))
        return out

    def producer_copy(self, lw, ctx) -> tuple["TileRing", list]:
        """The ring as the producer's pipelined loop sees it, and the statements the producer runs
        before that loop: in a block that walks tiles (``ctx.tile_index`` a loop variable) with
        ``AFTER_FIRST_STEP``, the issue rides in the ring copy (``after_step`` places it in the
        loop) and nothing runs before; else the issue runs before the loop."""
        stmts = self.issue(lw, ctx)
        if AFTER_FIRST_STEP and not isinstance(ctx.tile_index, int):
            return attrs.evolve(self, producer=tuple(stmts)), []
        return self, stmts

    def after_step(self, kt: Var) -> list:
        """The producer's statements after step ``kt`` of the pipelined loop: the tile's issue
        after the first."""
        if not self.producer:
            return []
        return [ir.If(lt(kt, 1), ir.Seq(self.producer))]

    def wait_for(self, ctx, name: str) -> list | None:
        """The consumers' statements for the tile move of ``name``, where the move stood: a wait
        for this block tile's copies; None where the copy is not the producer's (another part,
        another tensor)."""
        if ctx.part != CONSUMER or name not in self.names:
            return None
        return self.ring.wait(ctx.tile_index)

    def release(self, ctx) -> list:
        """One arrival per consumer warpgroup on the tile's empty barrier, once the pipelined loop
        that reads the tiles is done (its wgmma retired)."""
        lane = ctx.scope.tid % 128
        return [ir.If(lt(lane, 1), self.ring.release(self.stage(ctx.tile_index),
                                                    f"release {', '.join(sorted(self.names))} for the next block tile"))]


__all__ = ["TileRing", "tile_moves", "tile_move_names", "ring_tiles", "is_tma_fill"]
