"""Consumer warpgroups taking turns to issue their wgmma groups (``warp_specialize(pingpong=True)``).

Round robin on named barriers ``PINGPONG_BARRIER + w`` of 256 threads (the warpgroup that waits
and the one that passes the turn on)::

    consumers start:  warpgroup 0 arrives on its own barrier (the first turn is its)
    each wgmma group: bar.sync   PINGPONG + w          (my turn)
                      wgmma.fence; wgmma ...; wgmma.commit_group
                      bar.arrive PINGPONG + (w+1) % W  (the next warpgroup's turn)
                      wgmma.wait_group                 (outside the turn: the next one issues)

so the tensor cores run one warpgroup's MMAs while another works on what its last ones produced
(FlashAttention-3's warpgroup scheduling: one warpgroup's softmax under the other's GEMMs).
Every warpgroup issues the same groups (the loops' bounds are the block's), so each turn taken
was passed on; the last turn passed on is never taken, which ends with the block.  The rules
that issue a wgmma group (a fused body's MatMul, a pipelined K loop's step) wrap it in
``take_turn``; the turns are the consumers' only use of these barrier ids.
"""

from __future__ import annotations

from ... import ir
from ...ir.expr import floordiv, lt
from ..context import PINGPONG_BARRIER

#: the comments of the two barriers ``take_turn`` puts around a group (they name its turn barriers)
TURN_WAIT = "wait for this warpgroup's turn to issue wgmma"
TURN_PASS = "pass the turn to the next consumer warpgroup"


def is_turn(st) -> bool:
    """Whether ``st`` is one of the barriers ``take_turn`` puts around a wgmma group."""
    return isinstance(st, ir.Barrier) and bool(st.threads) and st.comment in (TURN_WAIT, TURN_PASS)


def first_turn(ctx) -> list:
    """Where the consumers start, with ``ctx.pingpong`` warpgroups taking turns: warpgroup 0
    arrives on its own turn barrier, so its first ``bar.sync`` there completes."""
    if ctx.pingpong < 2:
        return []
    return [ir.If(lt(ctx.scope.tid, 128), ir.Barrier("the first turn to issue wgmma is consumer warpgroup 0's",
                                                     bar_id=PINGPONG_BARRIER, threads=256, arrive=True))]


def take_turn(ctx, group: list) -> list:
    """The wgmma group ``group`` (``wgmma.fence`` .. ``wgmma.commit_group``) issued in the
    warpgroup's turn when ``ctx.pingpong`` consumer warpgroups take turns (see the module
    docstring); unchanged otherwise."""
    W = ctx.pingpong
    if W < 2:
        return group
    wg = floordiv(ctx.scope.tid, 128)
    return [ir.Barrier(TURN_WAIT, bar_id=PINGPONG_BARRIER + wg, threads=256),
            *group,
            ir.Barrier(TURN_PASS, bar_id=PINGPONG_BARRIER + (wg + 1) % W,
                       threads=256, arrive=True)]
