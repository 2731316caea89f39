"""Software pipelines: a reduction loop whose body fills shared memory becomes a ring of stages.

One ``Ring`` protocol — stages; the producer's acquire, issue and commit of a stage; the
consumers' wait for it and release of it — with two realisations:

* ``CpAsyncRing``: every thread issues ``cp.async`` copies into the stage and commits them as a
  group; waiting is ``cp.async.wait_group`` (at most S-2 groups in flight) plus a block barrier,
  which is also what frees the stage read one iteration ago;
* ``MbarrierRing``: one elected thread issues TMA boxes that complete a transaction count on the
  stage's *full* mbarrier; consumers wait on its phase parity.  With warp specialization the
  consumers release a stage by arriving on its *empty* mbarrier, which the producer waits on
  before refilling it; in a thread-block cluster they arrive in every block whose producer
  multicasts into this block.

The loop around the ring has two shapes.  In one role (every thread both issues and computes)::

    prologue: issue tiles 0 .. S-2
    for kt:   wait(kt); barrier                      # tile kt landed; stage (kt-1) % S is free
              issue tile kt+S-1 into stage (kt+S-1) % S
              compute tile kt from stage kt % S

and with warp specialization (``transforms.specialize`` runs the producer part and the consumer
part in different warpgroups)::

    producer: for it: acquire(it) (wait empty); expect bytes; issue     consumers: for it: wait(it);
                                                                                   compute; release

Asynchronous MMAs (wgmma) in the compute part are bracketed here: a fence before them, a commit
after, and a wait that keeps one group in flight (the previous stage is released once the group
that read it has retired).  Where the compute part is fragment loads then MMAs over K steps, the
fragments are double-buffered one step ahead (``prefetch_fragments``).
"""

from __future__ import annotations

import math

import attrs

from ... import ir
from ...hardware.atoms import catalog, sm90a
from ...hardware.atoms.base import MMA, TMA, WGMMA
from ...ir.expr import IntExpr, Var, bounds, ge, land, lt, minimum, substitute
from ...ir.rewrite import flat, map_operand, map_stmt
from ...ir.rewrite import walk as walk_ir
from ...schedule import Node
from ...spec import Fused, Move
from ...tensor import BLOCK, GL, SH
from ..context import CONSUMER, PRODUCER, WARPGROUP_BARRIER, Scope, err
from ..lowerer import Lowerer, loop_rule
from ..rules.decompose import advance, loop_stop, loop_visible
from ..rules.turns import take_turn
from .interleave import issue_when_ready
from .overlap import overlapped_loop
from .staged_scales import issue_scales, issue_scales_tma, plan_scales


def staged_moves(node: Node) -> list[Node]:
    """The global -> shared moves a reduction loop of ``node`` fills every iteration: those of the
    chain of loop-less refinements below it (the moves ``move_to_smem`` added beside the focus)."""
    return chain_moves(node, GL, SH)


def chain_moves(node: Node, src, dst) -> list[Node]:
    """The moves from memory ``src`` to ``dst`` a reduction loop of ``node`` makes every
    iteration: those of the chain of loop-less refinements below it (the moves ``move_to_smem``
    or ``move_to_regs`` added beside the focus)."""
    out = []
    n = node
    while True:
        for c in n.body:
            if isinstance(c.spec, Move) and c.spec.src.memory == src and c.spec.dst.memory == dst:
                out.append(c)
        nxt = n.body[-1] if n.body else None
        if nxt is None or type(nxt.spec) is not type(node.spec) or nxt.loops or nxt.atom is not None:
            return out
        n = nxt


def pipelined(lw: Lowerer, node: Node, lp) -> bool:
    return (lp.unit is None and node.spec.level == BLOCK and lp.dim in node.spec.reduction_dims
            and bool(staged_moves(node)))


def ring_kind(node: Node) -> str:
    moves = staged_moves(node)
    kinds = {"tma" if (m.via and m.via[0].family == TMA) else "cp_async" for m in moves}
    if len(kinds) > 1:
        raise err(node, "one pipeline ring fills its stages either with TMA or with cp.async, not both: "
                        + ", ".join(f"{m.spec.dst.name} by {'TMA' if m.via and m.via[0].family == TMA else 'cp.async'}"
                                    for m in moves),
                  fix="give every move_to_smem of the loop the same via=")
    return kinds.pop()


def ring_stages(lp, kind: str) -> int:
    """Stages of the ring of loop ``lp``: a TMA ring has at least two (the issue of the next tile
    overlaps the current one; one stage would serialise them)."""
    return max(lp.stages, 2) if kind == "tma" else lp.stages


# --------------------------------------------------------------------------- the rings

@attrs.define(eq=False)
class CpAsyncRing:
    """Stages filled by every thread's cp.async copies, one commit group per stage."""

    stages: int
    elected: bool = False
    # a stage a wgmma reads (through the async proxy) is fenced by the threads that copied into
    # it, once their copies landed and before the barrier that hands it over
    proxy_fence: bool = False

    def init(self) -> list:
        return []

    def before_issue(self, stage: IntExpr) -> list:
        return []

    def commit(self) -> list:
        return [ir.AsyncCommit()]

    commit_always = True       # a group per iteration, empty or not, keeps the wait count uniform

    def wait(self, it: IntExpr) -> list:
        return [ir.AsyncWait(max(self.stages - 2, 0)), *self.fence()]

    def fence(self) -> list:
        return [_call(sm90a.fence_proxy_async, comment="the copies are visible to wgmma")] if self.proxy_fence else []

    def drain(self) -> list:
        return [ir.AsyncWait(0)]


@attrs.define(eq=False)
class MbarrierRing:
    """Stages filled by TMA, each guarded by a *full* mbarrier (transaction bytes) and, when
    producer and consumers are different warpgroups, an *empty* one (consumer arrivals)."""

    stages: int
    full: ir.MBarrier
    empty: ir.MBarrier | None
    stage_bytes: int
    consumers: int = 1           # consumer warpgroups x cluster blocks that release a stage
    cluster: int = 1
    elected: bool = True
    arrivals: int = 1            # arrivals each consumer warpgroup makes (128: every thread its own)

    commit_always = False

    @classmethod
    def create(cls, lw: Lowerer, stages: int, stage_bytes: int, *, consumers: int = 0, cluster: int = 1,
               name: str = ""):
        """The ring's mbarriers, asked of the kernel (``name``: a prefix that keeps a second ring's
        barriers apart from the pipelined loop's, ``tile_full`` / ``tile_empty``)."""
        pre = f"{name}_" if name else ""
        full = lw.kb.mbarrier(f"{pre}full", stages, "one per stage: the stage's TMA bytes have landed")
        empty = None
        if consumers:
            note = f"one per stage: all {consumers // cluster} consumer warpgroups are done reading it"
            if cluster > 1:
                note += f", in each of the cluster's {cluster} blocks (their multicasts write it)"
            empty = lw.kb.mbarrier(f"{pre}empty", stages, note)
        return cls(stages, full, empty, stage_bytes, consumers or 1, cluster)

    def init(self) -> list:
        """mbarrier initialisation by one thread, made visible before anyone uses the ring."""
        S = self.stages
        init = [_call(sm90a.mbarrier_init, bar=ir.MemRef(self.full, s), count=ir.Scalar(1)) for s in range(S)]
        if self.empty is not None:
            init += [_call(sm90a.mbarrier_init, bar=ir.MemRef(self.empty, s),
                           count=ir.Scalar(self.consumers * self.arrivals)) for s in range(S)]
        return init + [_call(sm90a.fence_mbarrier_init)]

    def full_bar(self, stage: IntExpr, name: str = "") -> ir.MemRef:
        """The full barrier of ``stage`` (every staged tensor's copies complete on it)."""
        return ir.MemRef(self.full, stage)

    def before_issue(self, stage: IntExpr, extra_bytes: int = 0) -> list:
        """The producer's announcement of the stage's bytes: the staged tiles', plus
        ``extra_bytes`` that other copies of the step (staged group scales) land on it."""
        return [_call(sm90a.mbarrier_arrive_expect_tx, bar=ir.MemRef(self.full, stage),
                      bytes=ir.Scalar(self.stage_bytes + extra_bytes))]

    def commit(self) -> list:
        return []

    def wait(self, it: IntExpr) -> list:
        S = self.stages
        return [_call(sm90a.mbarrier_try_wait, bar=ir.MemRef(self.full, it % S), parity=ir.Scalar((it // S) % 2),
                      comment="the tile is in shared memory")]

    def acquire(self, it: IntExpr) -> list:
        S = self.stages
        return [_call(sm90a.mbarrier_try_wait, bar=ir.MemRef(self.empty, it % S), parity=ir.Scalar((it // S + 1) % 2),
                      comment="the consumers released the stage (the first round returns at once)")]

    def release(self, stage: IntExpr, comment: str) -> ir.Stmt:
        """One arrival on the stage's empty barrier; in a cluster, in every block (the producers of
        all of them multicast into this block's stage)."""
        if self.cluster == 1:
            return _call(sm90a.mbarrier_arrive, bar=ir.MemRef(self.empty, stage), comment=comment)
        return ir.Seq(tuple(_call(sm90a.mbarrier_arrive_cluster, bar=ir.MemRef(self.empty, stage), cta=ir.Scalar(q),
                                  comment=f"{comment} (block rank {q})") for q in range(self.cluster)))

    def drain(self) -> list:
        return []

    def pass_stage(self, stage: IntExpr) -> ir.Stmt:
        """Complete the stage's full phase without data (a step the consumers skip)."""
        return _call(sm90a.mbarrier_arrive, bar=ir.MemRef(self.full, stage),
                     comment="a step past the diagonal: the phase completes without data")


@attrs.define(eq=False)
class OperandRings:
    """One ``MbarrierRing`` per staged operand, all of ``stages`` stages (``pipeline(separate=True)``).

    Where the loop's code does not tell the operands apart it acts as one ring — waiting, acquiring,
    releasing and passing a stage does so on every operand's barriers — so a consumer or producer
    written for one ring stays right.  The producer's loop acquires, announces and issues each
    operand on its own (``pipeline``), and the overlapped consumer loop waits for and releases each
    operand at the group that reads it (``transforms.overlap``)::

        producer, step it:   acquire K; expect K; TMA K  |  acquire V; expect V; TMA V
        consumers, step j:   wait K(j); wait V(j-1); issue S(j) = Q K(j)ᵀ with O += P(j-1) V(j-1)
                             wait 1 -> release K(j) | softmax | wait 0 -> release V(j-1)
    """

    rings: dict                  # SH name -> MbarrierRing, in the order of the loop's moves
    stages: int

    commit_always = False
    elected = True

    @classmethod
    def create(cls, lw: Lowerer, stages: int, node: Node, *, consumers: int, cluster: int = 1):
        """A ring per staged move of ``node``'s loop, its barriers named after the operand
        (``K_full``, ``K_empty``, ...), each expecting that operand's bytes a stage."""
        rings = {}
        for m in staged_moves(node):
            name = m.spec.dst.name
            rings[name] = MbarrierRing.create(lw, stages, tile_bytes(m), consumers=consumers, cluster=cluster,
                                              name=name)
        return cls(rings, stages)

    @property
    def names(self) -> tuple:
        return tuple(self.rings)

    @property
    def cluster(self) -> int:
        return next(iter(self.rings.values())).cluster

    @property
    def arrivals(self) -> int:
        return next(iter(self.rings.values())).arrivals

    @arrivals.setter
    def arrivals(self, n: int) -> None:
        for r in self.rings.values():
            r.arrivals = n

    def init(self) -> list:
        return [x for r in self.rings.values() for x in r.init()]

    def full_bar(self, stage: IntExpr, name: str = "") -> ir.MemRef:
        if name not in self.rings:  # pragma: no cover - every staged move has its ring
            raise KeyError(f"no ring for {name!r}; the rings are {', '.join(self.rings)}")
        return self.rings[name].full_bar(stage)

    def before_issue(self, stage: IntExpr, extra_bytes: int = 0) -> list:
        """Every operand's announcement of its bytes (no other copies ride on these rings: the
        pipeline refuses staged scales with them, so ``extra_bytes`` is 0)."""
        return [x for r in self.rings.values() for x in r.before_issue(stage)]

    def commit(self) -> list:
        return []

    def wait(self, it: IntExpr) -> list:
        return [x for r in self.rings.values() for x in r.wait(it)]

    def acquire(self, it: IntExpr) -> list:
        return [x for r in self.rings.values() for x in r.acquire(it)]

    def release(self, stage: IntExpr, comment: str) -> ir.Stmt:
        return ir.Seq(tuple(r.release(stage, f"{comment} ({n})") for n, r in self.rings.items()))

    def drain(self) -> list:
        return []

    def pass_stage(self, stage: IntExpr) -> ir.Stmt:
        return ir.Seq(tuple(r.pass_stage(stage) for r in self.rings.values()))


def tile_bytes(move: Node) -> int:
    """Bytes of one stage of a staged move's shared tile."""
    t = move.spec.dst.tensor
    return math.prod(t.shape) * t.dtype.bits // 8


def stage_bytes(node: Node) -> int:
    """Bytes one stage of the ring of ``node``'s loop receives (every staged tile, whole)."""
    return sum(tile_bytes(m) for m in staged_moves(node))


def ring_for(lw: Lowerer, node: Node, lp, ctx):
    """The ring of ``node``'s loop ``lp``: the launch's (warp specialization creates it before the
    roles), or a new one whose initialisation joins the kernel's setup."""
    if ctx.ring is not None:
        return ctx.ring
    kind = ring_kind(node)
    S = ring_stages(lp, kind)
    if lp.separate:
        raise err(node, f"pipeline(separate=True) on {lp}: rings of their own per operand are the mbarrier rings "
                        "of a warp-specialized producer (TMA moves under warp_specialize())",
                  strategy=node.strategy, field="separate", value=True, allowed="False here",
                  fix="move_to_smem(..., via=(sm90a.tma_load_2d,)) and warp_specialize() after pipeline(...), or "
                      "separate=False")
    if kind == "cp_async":
        return CpAsyncRing(S, proxy_fence=any(lw.smem_layout(m.spec.dst).span for m in staged_moves(node)))
    rings = lw.notes.setdefault("rings", {})
    if id(lp) not in rings:
        ring = MbarrierRing.create(lw, S, stage_bytes(node))
        lw.notes.setdefault("setup", []).extend(
            [ir.If(lt(ctx.scope.tid, 1), ir.Seq(tuple(ring.init()))), ir.Barrier("mbarriers initialised")])
        rings[id(lp)] = ring
    return rings[id(lp)]


# --------------------------------------------------------------------------- the pipelined loop

@loop_rule(pipelined)
def pipeline(lw: Lowerer, node: Node, ctx, lp, rest) -> list:
    moves = staged_moves(node)
    staged = frozenset(m.spec.dst.name for m in moves)
    if ctx.staged and not (ctx.ring is not None and ctx.specialized and ctx.part is not None and ctx.staged == staged):
        # cp.async wait counts and mbarrier phases belong to one ring: a ring inside another's
        # loop would wait on the wrong copies
        raise err(node, f"the reduction loop {lp} fills shared memory ({', '.join(sorted(staged))}) inside the "
                        f"pipelined loop that fills {', '.join(sorted(ctx.staged))}: one pipeline ring per loop nest",
                  strategy=node.strategy,
                  fix="stage every operand at one reduction level: tile(k=...) once, then every move_to_smem, then "
                      "pipeline(...)")
    if ctx.units:
        unit_lp, by = ctx.units[-1]
        raise err(node, f"shared-memory copies inside a loop mapped onto {unit_lp.unit}s ({by}): a copy into a "
                        "block's shared memory is issued by the whole block", strategy=node.strategy,
                  fix="stage the operands (move_to_smem, pipeline) before splitting the work over warps "
                      "(split_k(..., across=WARP), to_warps())")
    ring = ring_for(lw, node, lp, ctx)
    for m in moves:
        have = m.spec.dst.tensor.stages
        want = ring.stages if isinstance(ring, CpAsyncRing) else max(have, 2)
        if have < want and not (isinstance(ring, (MbarrierRing, OperandRings)) and have <= 1 and want == 2):
            raise err(m, f"{m.spec.dst.name} is filled by the ring of {lp} ({ring.stages} stages) but its shared tile "
                         f"has {have} stage(s): move_to_smem({m.spec.dst.name!r}) came after pipeline(...)",
                      field="stages", value=have, allowed=str(want),
                      fix="apply pipeline(...) after every move_to_smem of the loop")
    # the ring also stages the group scales its dequantising moves read (staged_scales): cp.async
    # chunks in a one-role loop, one TMA box a stage in an mbarrier ring
    tma_ring = isinstance(ring, (MbarrierRing, OperandRings))
    scales = plan_scales(lw, node, moves, ring.stages, ctx, lp, tma=tma_ring) \
        if tma_ring or ctx.part is None else []
    n = lp.count
    S = ring.stages
    # a loop that stops at a diagonal runs N = min(n, stop) tiles: the prologue and the look-ahead
    # issue only tiles below N, so the copies of the skipped tiles never start
    stop = loop_stop(node, ctx, lp)
    # the ring numbers its iterations it_base + kt, n per block tile: in a persistent block a loop
    # that stops at a diagonal passes its skipped steps through the ring without data (warp-
    # specialized parts: pass_through); one role has no such steps
    walking = stop is not None and not isinstance(ctx.tile_index, int)
    if walking and ctx.part is None:
        raise err(node, f"the loop {lp} stops at a diagonal inside a persistent block's tile loop: its ring "
                        "counts a fixed number of tiles per block tile", strategy=node.strategy,
                  fix="stop at the diagonal in a non-persistent kernel, or warp_specialize() (its producer passes "
                      "the skipped steps through the ring)")
    N = n if stop is None else minimum(n, stop)

    split = isinstance(ring, OperandRings)
    if split and scales:
        raise err(node, f"pipeline(separate=True) on {lp}: staged group scales ride on one ring's stages",
                  strategy=node.strategy, field="separate", value=True, allowed="False with dequantising moves",
                  fix="pipeline(stages=...) without separate=True")

    def issue(kt: IntExpr, stage: IntExpr, only: str | None = None) -> list:
        """The copies of step ``kt`` into ``stage``: every staged operand's, or ``only``'s (with
        its ring's announcement of the bytes)."""
        c = advance(ctx, node, lp, kt)
        scope = ctx.scope
        if ring.elected and not scope.elected:
            scope = attrs.evolve(scope, elected=True)
        c = attrs.evolve(c, part=PRODUCER, staged=staged, ring=ring, scope=scope,
                         stage={**ctx.stage, **{s: stage for s in staged}},
                         issuing=None if only is None else frozenset({only}))
        if only is not None:
            return ring.rings[only].before_issue(stage) + lw.loops(node, c, rest)
        if tma_ring:
            # (separate rings stage no scales: refused above)
            return ring.before_issue(stage, sum(p.stage_bytes for p in scales)) + lw.loops(node, c, rest) + \
                (issue_scales_tma(lw, c, scales, stage, ring.full_bar(stage)) if scales else [])
        return ring.before_issue(stage) + lw.loops(node, c, rest) + issue_scales(lw, c, scales, stage)

    # a body of MatMuls only leaves its wgmma groups to the loop to retire (one in flight across
    # iterations); a fused body (attention's) reads an accumulator between its MatMuls, so each
    # MatMul retires its own group
    fused_body = any(isinstance(c.spec, Fused) for c in node.body)

    def compute(kt: IntExpr, stage: IntExpr, unmasked: bool = False) -> tuple[list, bool]:
        c = attrs.evolve(advance(ctx, node, lp, kt), part=CONSUMER, staged=staged, ring=ring,
                         async_mma=not fused_body, stage={**ctx.stage, **{s: stage for s in staged}})
        if unmasked:
            # a step wholly on the visible side of the loop's diagonal: no causal mask to apply
            c = attrs.evolve(c, unmasked=c.unmasked | {(lp.diagonal[0], lp.dim, lp.diagonal[1])})
        body = lw.loops(node, c, rest)
        return body, not fused_body and _has_async_mma(body)

    it_base = ctx.tile_index * n

    if ctx.part == PRODUCER:
        kt = Var(lp.var, n)
        it = it_base + kt
        # a warp-specialized block's tile moves may ride in the loop (transforms.tile_moves)
        after = ctx.tiles.after_step(kt) if ctx.tiles is not None else []
        if walking:
            # every step of the ring, the skipped ones completed by an arrival without data
            steps = [*ring.acquire(it), ir.If(lt(kt, N), ir.Seq(tuple(issue(kt, it % S)))),
                     ir.If(ge(kt, N), ring.pass_stage(it % S)), *after]
            return [ir.For(kt, n, ir.Seq(tuple(steps)))]
        if split:
            # each operand's stage is refilled as soon as its own readers released it
            steps = [x for name in ring.names for x in ring.rings[name].acquire(it) + issue(kt, it % S, name)]
            return [ir.For(kt, n, ir.Seq(tuple(steps + after)), stop=stop)]
        return [ir.For(kt, n, ir.Seq(tuple(ring.acquire(it) + issue(kt, it % S) + after)), stop=stop)]

    if ctx.part == CONSUMER:
        # the tiles a warp-specialized producer copies once per block tile are read by this loop
        # only: they are released once it is done, with its last stage (transforms.tile_moves)
        after = ctx.tiles.release(ctx) if ctx.tiles is not None else []
        if walking:
            after = after + pass_through(ctx, lp, n, N, it_base, ring)
        if lp.overlap:
            if not fused_body:
                raise err(node, f"pipeline(overlap=True) on {lp}: a body of MatMuls already keeps one wgmma group in "
                                "flight across steps; overlap rotates a fused body (MMA, element-wise work, MMA)",
                          strategy=node.strategy, field="overlap", value=True, allowed="False",
                          fix="pipeline(stages=...) without overlap")
            return overlapped_loop(node, ctx, lp, n, stop, it_base, S, ring, compute, lp.var + "_c",
                                   loop_visible(node, ctx, lp)) + after
        kc = Var(lp.var + "_c", n)
        it = it_base + kc
        body, is_async = compute(kc, it % S)
        lane = ctx.scope.tid % 128
        if is_async:
            fenced, writes_regs = _fenced_group(body)
            # a body that writes the registers its wgmmas read (a dequantising move of A) retires
            # its own group: the next step overwrites those registers
            keep = 0 if writes_regs else 1
            # a stage the warpgroup's threads read themselves (not only through wgmma, which the
            # wait retires for all of them) is released once all 128 are past their reads: each
            # thread arrives on its own (the empty barrier counts every consumer thread), or, in a
            # cluster (whose arrivals go to every block) or a loop whose skipped steps pass through
            # the ring (one arrival a warpgroup), one thread after a warpgroup barrier
            generic = _reads_generic(body, {f"{s}_smem" for s in staged} | {p.buf.name for p in scales})
            per_thread = generic and ring.cluster == 1 and not walking
            if per_thread:
                ring.arrivals = 128
            own = [ir.Barrier("the warpgroup's threads are done reading the stage",
                              bar_id=WARPGROUP_BARRIER + ctx.scope.tid // 128, threads=128)] \
                if generic and not per_thread else []

            def releasing(cond, stage, comment):
                cond = cond if per_thread else land(cond, lt(lane, 1))
                return ir.If(cond, ring.release(stage, comment + (" (every thread arrives)" if per_thread else "")))

            wait = _call(catalog.with_immediates(sm90a.wgmma_wait, n=keep),
                         comment="this K tile's wgmma are done" if keep == 0 else "the previous K tile's wgmma are done")
            if keep == 0:
                # the step's wgmmas are retired here: its stage goes back to the producer at once
                loop = [*ring.wait(it), *take_turn(ctx, fenced), wait, *own,
                        releasing(1, it % S, "release this stage")]
                tail = []
            else:
                loop = [*ring.wait(it), *take_turn(ctx, fenced), wait, *own,
                        releasing(ge(kc, 1), (it + S - 1) % S, "release the previous stage")]
                last = (it_base + n - 1) % S
                tail = [_call(catalog.with_immediates(sm90a.wgmma_wait, n=0)), *own,
                        releasing(1, last, "release the last stage")]
        else:
            loop = [*ring.wait(it), *body, ir.If(lt(lane, 1), ring.release(it % S, "release the stage"))]
            tail = []
        if stop is not None and is_async:  # pragma: no cover - a diagonal stops attention's fused loop only
            raise err(node, f"the loop {lp} stops at a diagonal with a wgmma group in flight across iterations")
        return [ir.Comment(f"K loop over {n} tiles of {lp.step(lp.dim)}, "
                           + ("one wgmma group in flight" if is_async else "synchronous MMAs")),
                ir.For(kc, n, ir.Seq(tuple(loop)), stop=stop), *tail, *after]

    if lp.overlap:
        raise err(node, f"pipeline(overlap=True) on {lp}: the rotated key loop is built for warp-specialized consumer "
                        "warpgroups (a producer keeps the ring full while they compute)", strategy=node.strategy,
                  field="overlap", value=True, allowed="False without warp_specialize()",
                  fix="warp_specialize() after pipeline(...), or overlap=False")
    # one role: every thread issues (or one elected thread) and computes
    if isinstance(ring, CpAsyncRing) and S == 1:
        kt = Var(lp.var, n)
        body, is_async = compute(kt, 0)
        if is_async:
            # the tile's wgmma group is retired before the next tile overwrites its stage
            body = [*_fenced_group(body)[0], _call(catalog.with_immediates(sm90a.wgmma_wait, n=0))]
        loop = [ir.Barrier("the previous tile's readers are done"), *issue(kt, 0), *ring.commit(),
                ir.AsyncWait(0), *ring.fence(), ir.Barrier("the tile is in shared memory"), *body]
        return [ir.Comment(f"K loop over {n} tiles of {lp.step(lp.dim)}, {S}-stage cp.async pipeline"),
                ir.For(kt, n, ir.Seq(tuple(loop)), stop=stop)]
    what = "cp.async pipeline" if isinstance(ring, CpAsyncRing) else "TMA + mbarrier ring"
    out: list = [ir.Comment(f"K loop over {n} tiles of {lp.step(lp.dim)}, {S}-stage {what}")]
    if ctx.repeated:
        # the ring is filled again each time an enclosing loop (a persistent block's tiles, an
        # outer tile loop) comes round: every thread must be done with the stages the previous
        # round's last iterations read
        out.append(ir.Barrier("the previous round's readers are done with the ring"))
    guard = _elected_guard(ring, ctx)

    def _one_role_steps(name: str, first, count_stop, unmasked: bool) -> ir.For:
        """Steps ``first`` .. ``first + count_stop - 1`` of the one-role loop (wait, issue the tile
        ``S - 1`` ahead, compute), the body lowered without the causal mask where ``unmasked``."""
        kv = Var(name, n)
        k_e = kv + first
        body_e, _ = compute(k_e, (it_base + k_e) % S if S > 1 else 0, unmasked)
        ahead_e = k_e + (S - 1)
        issue_e = issue(ahead_e, (it_base + ahead_e) % S)
        loop_e = [*ring.wait(it_base + k_e), ir.Barrier("tile kt landed; stage (kt-1) % S is free")]
        if ring.commit_always:
            loop_e += [ir.If(lt(ahead_e, N), ir.Seq(tuple(issue_e))), *ring.commit()]
        else:
            loop_e.append(guard(issue_e, lt(ahead_e, N)))
        return ir.For(kv, n, ir.Seq(tuple(loop_e + body_e)), stop=count_stop)
    # the ring counts iterations across a persistent block's tiles: tile kt is ring iteration
    # it_base + kt, in stage (it_base + kt) % S
    kt = Var(lp.var, n)
    it = it_base + kt
    ahead = kt + (S - 1)
    body, is_async = compute(kt, it % S if S > 1 else 0)
    for s in range(S - 1):
        ld = issue(s, (it_base + s) % S)
        ld = ld if s < n else []
        gate = stop is not None and (bounds(N)[0] or 0) <= s      # tile s may lie past the diagonal
        if ld and gate and ring.commit_always:
            ld = [ir.If(lt(s, N), ir.Seq(tuple(ld)))]
        if ring.commit_always:
            out += ld + ring.commit()
        elif ld:
            out.append(guard(ld, lt(s, N)) if gate else guard(ld))
    # the look-ahead copy runs only where kt + S - 1 < n: there kt is below n - S + 1, and a
    # variable of that extent (the same name, so the same value) lets the copies' bounds checks
    # see that the tile they fetch is inside the loop's range
    kt_ahead = Var(lp.var, n - (S - 1)) if n > S - 1 else kt
    issue_ahead = issue(kt_ahead + (S - 1), (it_base + kt_ahead + S - 1) % S)
    if is_async:
        body = [*_fenced_group(body)[0], _call(catalog.with_immediates(sm90a.wgmma_wait, n=0))]
    if isinstance(ring, CpAsyncRing) and lp.prefetch:
        split = split_ksteps(body)
        # the next tile's fragments are read one iteration early, also in the last one: only from
        # the ring's stages (whose index wraps), never from a tile the ring does not fill (which
        # the last iteration would read past)
        if split is not None and not _reads_only(split[1], {f"{s}_smem" for s in staged} | {p.buf.name for p in scales}):
            split = None
        if split is not None:
            # the next tile's fragments come from stage (kt + 1) % S; lowered afresh rather than
            # substituted, since expressions were simplified knowing kt < n
            nxt = kt + 1
            next_body, _ = compute(nxt, (it + 1) % S)
            split_next = split_ksteps(next_body)
            return out + prefetch_fragments(lw, ring, kt, n, S, ir.If(lt(ahead, N), ir.Seq(tuple(issue_ahead))),
                                            *split, split_next[1], stop=stop)
    visible = loop_visible(node, ctx, lp) if not is_async else None
    if visible is not None:
        # a loop that stops at a diagonal: the steps wholly left of it first, lowered without the
        # causal mask, then those it crosses
        V = minimum(visible, N)
        out += [_one_role_steps(lp.var, 0, V, True), _one_role_steps(lp.var + "m", V, N - V, False)]
        return out + ring.drain()
    loop = [*ring.wait(it), ir.Barrier("tile kt landed; stage (kt-1) % S is free")]
    if ring.commit_always:
        loop += [ir.If(lt(ahead, N), ir.Seq(tuple(issue_ahead))), *ring.commit()]
    else:
        loop.append(guard(issue_ahead, lt(ahead, N)))
    loop += body
    out.append(ir.For(kt, n, ir.Seq(tuple(loop)), stop=stop))
    out += ring.drain()
    return out


def pass_through(ctx, lp, n: int, N: IntExpr, it_base: IntExpr, ring) -> list:
    """The consumers' steps ``N .. n-1`` of a warp-specialized loop that stops at a diagonal in a
    persistent block: each waits for the stage the producer completed without data and releases
    it, so that the ring's phases stay those of ``n`` steps per block tile."""
    kp = Var(lp.var + "_p", n)
    k = kp + N
    lane = ctx.scope.tid % 128
    body = [*ring.wait(it_base + k), ir.If(lt(lane, 1), ring.release((it_base + k) % ring.stages,
                                                                        "release a step past the diagonal"))]
    return [ir.Comment("the steps past the diagonal, passed through the ring"),
            ir.For(kp, n, ir.Seq(tuple(body)), stop=n - N)]


def _elected_guard(ring, ctx):
    """Statements the ring's elected thread runs: ``If(tid < 1 [&& cond], ...)``."""

    def guard(stmts, cond=1):
        if not ring.elected or ctx.scope.elected:
            return ir.If(cond, ir.Seq(tuple(stmts))) if cond != 1 else ir.Seq(tuple(stmts))
        return ir.If(land(lt(ctx.scope.tid, 1), cond), ir.Seq(tuple(stmts)))

    return guard


def _shared_reads(stmts, *, src_only: bool = False, skip: str | None = None) -> set[str]:
    """The shared buffers the atom calls of ``stmts`` name as operands: every memory operand,
    or (``src_only``) only those passed as ``src``; ``skip``: an atom family left out (WGMMA,
    whose descriptors name the ring's stages themselves)."""
    return {a.buffer.name for s in walk_ir(stmts) if isinstance(s, ir.AtomCall) and s.atom.family != skip
            for name, a in s.args
            if isinstance(a, ir.MemRef) and isinstance(a.buffer, ir.SharedBuffer) and (name == "src" or not src_only)}


def _reads_generic(stmts, buffers: set) -> bool:
    """Whether a statement of ``stmts`` other than a wgmma reads one of the shared ``buffers``."""
    return bool(_shared_reads(stmts, src_only=True, skip=WGMMA) & buffers)


def _reads_only(stmts, buffers: set) -> bool:
    """Whether every shared-memory operand of ``stmts`` is one of ``buffers``."""
    return _shared_reads(stmts) <= buffers


def _fenced_group(body: list) -> tuple[list, bool]:
    """``body`` as one wgmma group (a fence before it, the commit after it), and whether other
    statements of it touch the registers its wgmmas read as A (a dequantising move fills them:
    then the group must be retired before the next step writes them again; the move's rule
    fences between it and the wgmma)."""
    a_regs = {a.buffer.name for st in walk_ir(body) if isinstance(st, ir.AtomCall) and st.atom.family == WGMMA
              for name, a in st.args if name == "a" and isinstance(a, ir.RegRef)}
    writes = bool(a_regs) and any(
        isinstance(a, ir.RegRef) and a.buffer.name in a_regs
        for st in walk_ir(body) if isinstance(st, (ir.AtomCall, ir.Pointwise)) and not (
            isinstance(st, ir.AtomCall) and st.atom.family == WGMMA)
        for a in _operands(st))
    if writes:
        # each wgmma issues once its slice of the fragment is filled, while the threads fill the
        # next slices (transforms.interleave)
        body = issue_when_ready(body) or body
    return [_call(sm90a.wgmma_fence), *body, _call(sm90a.wgmma_commit)], writes


def _operands(st) -> list:
    """The operands of an atom call or a pointwise statement."""
    if isinstance(st, ir.AtomCall):
        return [a for _, a in st.args]
    return [st.dst, *st.srcs]


def _has_async_mma(stmts) -> bool:
    return any(isinstance(s, ir.AtomCall) and s.atom.family == WGMMA for s in walk_ir(stmts))


# --------------------------------------------------------------------------- fragment prefetch

def split_ksteps(compute: list):
    """(k-step var, fragment loads, math) when the compute part of a K tile is one unrolled loop
    over an even number of warp K steps whose body is the fragments' loads (ldmatrix, or the
    word loads, conversions and scaling of a dequantising move) followed by the mma.  Every read
    of shared memory must be among the loads: the barrier that frees a stage sits before the
    last step's math."""
    top = [st for st in flat(compute) if not isinstance(st, ir.Comment)]
    if len(top) != 1 or not isinstance(top[0], ir.For) or not top[0].unroll or top[0].extent % 2:
        return None
    loop = top[0]
    body = flat([loop.body])
    loads, math, seen_math = [], [], False
    for st in body:
        if not seen_math and not _issues_mma(st) and isinstance(st, (ir.AtomCall, ir.Pointwise, ir.Comment, ir.If)):
            loads.append(st)
        else:
            seen_math = True
            math.append(st)
    has_mma = any(_issues_mma(s) for s in math)
    if not loads or not has_mma or _shared_reads(math):
        return None
    return loop.var, loads, math


def _issues_mma(st) -> bool:
    return any(isinstance(s, ir.AtomCall) and s.atom.family == MMA for s in walk_ir([st]))


def _written_registers(stmts) -> dict:
    """The register buffers ``stmts`` write (an atom's output operands, a pointwise's dst)."""
    out = {}
    for st in walk_ir(stmts):
        refs = []
        if isinstance(st, ir.AtomCall):
            outs = {o.name for o in st.atom.operands if o.role in ("out", "inout")}
            refs = [a for n, a in st.args if n in outs]
        elif isinstance(st, ir.Pointwise):
            refs = [st.dst]
        for r in refs:
            if isinstance(r, ir.RegRef):
                out[r.buffer.name] = r.buffer
    return out


def rewrite(st, env: dict, doubled: dict, parity: int):
    """``st`` with variables substituted and fragment buffers replaced by their double buffers."""

    def e(x):
        return substitute(x, env)

    def ref(r):
        if isinstance(r, ir.RegRef) and r.buffer.name in doubled:
            buf, size = doubled[r.buffer.name]
            return ir.RegRef(buf, e(r.offset) + parity * size)
        return map_operand(r, e)

    return map_stmt(st, e, ref)


def prefetch_fragments(lw: Lowerer, ring, kt: Var, n: int, S: int, issue, kvar: Var, frag_loads: list,
                       math: list, next_loads: list, stop: IntExpr | None = None) -> list:
    """The K loop with register fragments double-buffered one warp K-step ahead.

    Fragments of step ks+1 load while the MMAs of step ks run; the first step of tile kt+1 loads
    during the last step of tile kt, right after the one barrier of the iteration (which now sits
    there: every read of stage kt-1 happened before it, so the copies issued at the top of the next
    iteration may overwrite that stage)::

        wait; barrier; load frags(tile 0, step 0) -> buf 0
        for kt:  issue tile kt+S-1; commit
                 step 0: load frags(step 1) -> buf 1;  mma(buf 0)
                 ...
                 step KS-1: wait; barrier; load frags(tile kt+1, step 0) -> buf 0;  mma(buf 1)
    """
    KS = kvar.extent
    bufs = _written_registers(frag_loads)
    doubled = {}
    for name, b in bufs.items():
        d = ir.RegBuffer(b.name, b.dtype, 2 * b.size)
        lw.kb.regs[name] = d
        doubled[name] = (d, b.size)

    def part(stmts, kt_expr, ks, parity):
        env = {kvar.name: ks} if kt_expr is kt else {kvar.name: ks, kt.name: kt_expr}
        return [rewrite(s, env, doubled, parity) for s in stmts]

    pro = [*ring.wait(0), ir.Barrier("tile 0 landed"), *part(frag_loads, 0, 0, 0)]
    body: list = [issue, *ring.commit()]
    for ks in range(KS):
        if ks < KS - 1:
            body += part(frag_loads, kt, ks + 1, (ks + 1) % 2)
        else:
            body += [*ring.wait(kt + 1), ir.Barrier("tile kt+1 landed; stage kt-1 is no longer read"),
                     *part(next_loads, kt, 0, 0)]
        body += part(math, kt, ks, ks % 2)
    return [*pro, ir.For(kt, n, ir.Seq(tuple(body)), stop=stop), *ring.drain()]


def _call(atom, comment="", pred=1, **args):
    return ir.AtomCall(atom, tuple(args.items()), pred, comment)


__all__ = ["pipeline", "pipelined", "staged_moves", "ring_kind", "ring_stages", "stage_bytes", "tile_bytes",
           "chain_moves", "CpAsyncRing", "MbarrierRing", "OperandRings", "split_ksteps", "prefetch_fragments", "walk_ir", "Scope"]
