"""Software pipelines in registers: a K loop whose fragments come straight from global memory.

A weight-streaming kernel at small M (int4 codes dequantised into an MMA fragment by
``move_to_regs`` of an operand left in global memory, ``rules.dequant``) has nothing to stage in
shared memory: each lane's words of codes are contiguous in the packed tensor, and no other lane
reads them.  What it needs is many loads in flight, which a loop that loads and then computes
each K step does not give (every step waits a whole DRAM latency).  ``pipeline(stages=S)`` on
such a loop makes the loads a ring of ``S`` register slots per thread::

    prologue: load step 0 .. S-2 into slots 0 .. S-2          (kernel start, where it can: below)
    for k:    load step k+S-1 into slot (k+S-1) % S           (predicated off past the loop)
              compute step k from slot k % S                   (ldmatrix of A, dequantise, mma)

The ring's loads are the body's loads from global memory into registers (codes, group scales,
zero points) that nothing earlier in the body touches; everything else keeps its order.  The
loop is unrolled (a slot is a register array indexed by a constant).

Where the loop runs once per block (no enclosing sequential loop, no persistent tile loop, one
role) the prologue is issued early (``place_early_rings``): right after the block's first group
of cp.async copies is committed (the activations the loop reads first, requested before the
ring's loads would queue ahead of them), or at the kernel's start where no such group is — the
first codes are then in flight while the activations land, instead of after them.

Measured on an H100 (W4A16 at M = 1 and 16, N = K = 4096 and 8192, bench/README.md): the
weight-streaming kernels built this way ran 7.4-8.5 us at N = K = 4096 (the best tiles) against 6.1-6.7 us for the
cp.async ring through shared memory, and 17.8-26.5 against 15.5-16.3 at 8192; the placement of
the prologue (kernel start, after the activations' commit, in place) moved them by less than the
spread of a run.  ``recipes.w4a16.plan`` keeps the shared-memory ring.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...hardware.atoms.base import COPY
from ...ir.expr import Var, free_vars, land, lt
from ...ir.rewrite import flat, map_operand, map_stmt, substitute_stmt, walk
from ...schedule import Node
from ...tensor import GL, RF
from ..context import PRODUCER, err
from ..liveness import register_uses
from ..lowerer import Lowerer, loop_rule
from ..rules.decompose import advance, loop_stop, loops
from .pipeline import chain_moves, staged_moves


def register_moves(node: Node) -> list[Node]:
    """The global -> register moves a reduction loop of ``node`` makes every iteration
    (``move_to_regs`` of int4 codes left in GL)."""
    return chain_moves(node, GL, RF)


def register_pipelined(lw: Lowerer, node: Node, lp) -> bool:
    return (lp.unit is None and lp.stages > 1 and lp.dim in node.spec.reduction_dims
            and not staged_moves(node) and bool(register_moves(node)))


def _global_load(s) -> bool:
    if not isinstance(s, ir.AtomCall) or s.atom.family != COPY:
        return False
    args = dict(s.args)
    return (isinstance(args.get("dst"), ir.RegRef) and isinstance(args.get("src"), ir.MemRef)
            and isinstance(args["src"].buffer, ir.GlobalBuffer) and args["src"].buffer.role == "in")


def _split(stmts: list) -> tuple[list, list]:
    """(ring loads, the rest in order): loads of read-only global inputs into registers that no
    earlier statement of the rest touches; the rest writes none of the memory they read."""
    loads, rest, touched = [], [], set()
    for s in stmts:
        if _global_load(s) and dict(s.args)["dst"].buffer.name not in touched:
            loads.append(s)
            continue
        rest.append(s)
        touched.update(name for x in walk([s]) for name, _ in register_uses(x))
    return loads, rest


@loop_rule(register_pipelined)
def register_ring(lw: Lowerer, node: Node, ctx, lp, rest: list) -> list:
    S, n = lp.stages, lp.count
    if loop_stop(node, ctx, lp) is not None:
        raise err(node, f"pipeline(stages={S}) keeps its ring in registers, over a loop unrolled at compile time; "
                        f"{lp} stops at a diagonal, which only a loop that runs at run time can",
                  strategy=node.strategy, field="stages", value=S, allowed="1 here",
                  fix="stage the operand in shared memory (move_to_smem) for a diagonal stop")
    v = Var(lp.var, n)
    inner = loops(lw, node, advance(attrs.evolve(ctx, repeated=ctx.repeated or n > 1), node, lp, v), rest)
    stmts = [x for x in flat(inner) if not isinstance(x, ir.Comment)]
    if not stmts:
        return []                 # a part of the loop nest that runs none of it (a ring's issue side)
    loads, compute = _split(stmts)
    if not loads:
        raise err(node, f"pipeline(stages={S}) on {lp}: the loop's moves into registers issue no load from global "
                        f"memory to keep in flight", strategy=node.strategy, field="stages", value=S,
                  allowed="1 here", fix="drop pipeline(...) from this loop")
    written = {dict(x.args)["dst"].buffer.name for x in walk(compute)
               if isinstance(x, ir.AtomCall) and isinstance(dict(x.args).get("dst"), ir.MemRef)}
    if any(dict(s.args)["src"].buffer.name in written for s in loads):
        raise err(node, f"pipeline(stages={S}) on {lp}: the loop writes memory its loads read, so they cannot be "
                        f"issued steps ahead", strategy=node.strategy, field="stages", value=S, allowed="1 here")
    regs = list(dict.fromkeys(dict(s.args)["dst"].buffer for s in loads))
    ring = {b.name: (lw.kb.reg(f"{b.name}_ring", b.dtype, b.size * S), b.size) for b in regs}

    def at(stmts: list, it, pred=1) -> list:
        """``stmts`` of iteration ``it``, their registers in slot ``it % S``."""
        def slot(r):
            if isinstance(r, ir.RegRef) and r.buffer.name in ring:
                buf, size = ring[r.buffer.name]
                return ir.RegRef(buf, it % S * size + r.offset)
            return map_operand(r, lambda x: x)

        out = [map_stmt(substitute_stmt(s, {v: it}), lambda x: x, slot) for s in stmts]
        return out if pred == 1 else [attrs.evolve(s, pred=land(pred, s.pred)) for s in out]

    ahead = min(S - 1, n)
    j = Var(f"{lp.var}_r", ahead)
    prologue = ir.For(j, ahead, ir.Seq(tuple(at(loads, j))), unroll=True)
    step = [ir.Comment(f"{lp}: the loads of step {lp.var} + {S - 1} into register slot "
                       f"({lp.var} + {S - 1}) % {S}, then step {lp.var} from slot {lp.var} % {S}"),
            *at(loads, v + (S - 1), lt(v + (S - 1), n)), *at(compute, v)]
    body = [ir.For(v, n, ir.Seq(tuple(step)), unroll=True)]
    head = [ir.Comment(f"{lp}: a ring of {S} register slots; steps 0 .. {ahead - 1} loaded first "
                       f"(transforms.register_ring)"), prologue]
    # the prologue at the kernel's start: where the loop runs once per block (one role, no
    # enclosing loop that repeats it) and its addresses are of the thread and block indices alone
    # (and the prologue's own variable; an enclosing loop of one iteration is at 0)
    used = {x for s in walk([prologue]) if isinstance(s, ir.AtomCall)
            for x in free_vars(dict(s.args)["src"].offset) | free_vars(s.pred)}
    once = {x: 0 for x in used if x.extent == 1}
    kernel_vars = {ir.TID_NAME, *ir.BID_NAMES, j.name}
    early = (not ctx.repeated and isinstance(ctx.tile_index, int) and ctx.part != PRODUCER and not ctx.specialized
             and all(x.name in kernel_vars for x in used if x not in once))
    if early:
        lw.notes.setdefault("early_ring", []).extend(substitute_stmt(s, once) if once else s for s in head)
        return body
    return head + body


def place_early_rings(lw: Lowerer, setup: list, work: list) -> tuple[list, list]:
    """(setup, work) with the register rings' prologues (``lw.notes["early_ring"]``) issued right
    after the block's first group of cp.async copies is committed (the activations its loop reads
    first: requested before the ring's loads, which would otherwise queue ahead of them), or at
    the start of the setup where no copy group is committed at the top of the block's work."""
    early = lw.notes.pop("early_ring", [])
    if not early:
        return setup, work
    placed = _after_first_commit(work, early)
    return (setup, placed) if placed is not None else ([*early, *setup], work)


def _after_first_commit(stmts: list, early: list) -> list | None:
    """``stmts`` with ``early`` right after their first cp.async commit, looking through sequences
    and loops of one iteration (which run their body once, where it is); None if there is none
    before the first other loop or branch."""
    ring = {n for x in walk(early) for n, _ in register_uses(x)}
    top = flat(stmts)
    for i, x in enumerate(top):
        if isinstance(x, ir.AsyncCommit):
            return [*top[:i + 1], *early, *top[i + 1:]]
        inside = list(walk([x]))
        if not any(isinstance(y, ir.AsyncCommit) for y in inside) and not any(
                n in ring for y in inside for n, _ in register_uses(y)):
            continue                    # nothing of the ring, no commit: the prologue may pass it
        if isinstance(x, ir.For) and x.extent == 1 and x.stop is None:
            inner = _after_first_commit([x.body], early)
            if inner is not None:
                return [*top[:i], attrs.evolve(x, body=ir.Seq(tuple(inner))), *top[i + 1:]]
        return None
    return None


__all__ = ["register_ring", "register_pipelined", "register_moves"]
