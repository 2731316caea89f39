"""The lowering driver: a checked schedule → the launches of an ``ir.Program``.

The kernel-level part of the tree decides the launches.  A chain of kernel-level nodes whose loops
are all mapped onto blocks, ending in a block-level node, is one launch: those loops are its grid
(``transforms.blocks`` orders them) and the block-level node its work.  Kernel-level children in a
node's ``pre``/``post`` are launches of their own, before/after (split-K's reduction of the
partial sums; an unrefined one gets the default schedule of its kind).

For one launch the driver infers the layouts of the block's on-chip tensors, binds the loops
mapped onto units (warpgroups, warps) to the thread index, places global tensors at the block's
tile, and asks the rules for the block's statements — once, or, with warp specialization, once per
role (``transforms.specialize``).  What the rules asked for (shared memory, mbarriers, registers,
parameters, setup) becomes the kernel.  Before any of that, ``checks.precheck`` refuses in O(tree)
time what could never fit.
"""

from __future__ import annotations

import attrs

from .. import ir
from ..errors import InternalError, ScheduleError
from ..hardware.atoms.base import CP_ASYNC, TMA, WGMMA
from ..hardware.target import SM80, SM90A
from ..hardware.target import target as get_target
from ..ir.rewrite import walk
from ..schedule import Node, Schedule
from ..spec import Fused, MatMul, Reduce
from ..tensor import BLOCK, GL, KERNEL, SH, THREAD, WARP, WARPGROUP
from . import checks, liveness
from .context import CONSUMER, PRODUCER, Ctx, Hoists, Scope, enter_global, err
from .fragments import fragment_layouts
from .layouts import SmemLayout, plain_smem_layout, register_layouts, thread_layouts
from .lowerer import Lowerer
from .program import KernelBuilder, ProgramBuilder
from .rules import decompose, turns
from .rules.elementwise import reduce_launch
from .rules.smem import shared_buffer
from .rules.tma import tma_smem_layout
from .transforms import pipeline as pipe
from .transforms import specialize as ws
from .transforms import tile_moves as tm
from .transforms import tile_prefetch as tp
from .transforms.barriers import without_redundant_barriers
from .transforms.batch_loads import batched_loads
from .transforms.blocks import block_order
from .transforms.early_loads import early_loads
from .transforms.launches import programmatic_launches
from .transforms.pair_conversions import paired_conversions
from .transforms.register_ring import place_early_rings
from .transforms.split_guards import split_guards

UNIT_THREADS = {WARPGROUP: 128, WARP: 32, THREAD: 1}
REG_OVERHEAD = 40             # registers a kernel spends on addresses, loop state, predicates


def resolve_target(sched: Schedule, target):
    if target is None:
        # a schedule built on sm_90a-only atoms can only mean sm_90a; otherwise the oldest target
        # that runs the sm_80 atoms
        uses_sm90 = any(n.atom is not None and n.atom.min_target == "sm_90a" for n in sched.nodes()) or any(
            v.family in (TMA,) for n in sched.nodes() for v in n.via)
        return SM90A if uses_sm90 else SM80
    return get_target(target)


#: Programs lowered in this process, by (schedule, its repr, target, programmatic), oldest first:
#: a schedule is usually checked and then interpreted or compiled, and each of those lowers it.
#: Lowering is a pure function of the schedule's frozen tree, so an equal schedule lowers to an
#: equal program; the repr is in the key too because equality does not tell ``1`` from ``1.0`` or
#: ``0.0`` from ``-0.0`` (an op's constant), which the program does.  Only successes are kept: a
#: refusal is raised afresh each time.  The programs are frozen values, shared by the callers.
_LOWERED: dict = {}
_LOWERED_MAX = 32


def lower(sched: Schedule, target=None, programmatic: bool | None = None, *, fresh: bool = False) -> ir.Program:
    """The kernel IR of ``sched``; raises ``ScheduleError`` for anything that cannot be lowered
    (checking a schedule is lowering it).  ``programmatic``: whether the program's first kernel is
    launched programmatically too and its last lets the next launch start (``transforms.launches``,
    chained); None: the first where the target has ``griddepcontrol`` (sm_90a), unless the
    schedule's grid is sized to the SMs (``_sm_sized_grid``), and the last only in a program of one
    kernel.  A schedule lowered before in this process (``_LOWERED``) returns the same program,
    unless ``fresh``: what ``firesched.compile(..., use_cache=False)`` asks for, to see a change
    of a module's tunable (``transforms.early_loads.EARLY_SHARE``) that the schedule does not hold."""
    tgt = resolve_target(sched, target)
    check_programmatic(programmatic)        # before the lookup: True == 1, and 1 is refused
    key = (sched, repr(sched), tgt, programmatic)
    try:
        hash(key)
    except TypeError:                       # a strategy holding an unhashable value: not kept
        fresh = True
    if fresh:
        return _lower(sched, tgt, programmatic)
    prog = _LOWERED.pop(key, None)
    if prog is None:
        prog = _lower(sched, tgt, programmatic)
        if len(_LOWERED) >= _LOWERED_MAX:
            _LOWERED.pop(next(iter(_LOWERED)))
    _LOWERED[key] = prog                    # (re)inserted last: the most recently used
    return prog


def _lower(sched: Schedule, tgt, programmatic: bool | None) -> ir.Program:
    """``lower`` without the memo, on a resolved target."""
    if programmatic and not tgt.has_pdl:
        raise ScheduleError(f"a programmatic launch needs griddepcontrol, which {tgt.name} lacks",
                            field="programmatic", value=programmatic, allowed="False or None on this target",
                            fix="compile(schedule, arch='sm_90a', programmatic=True), or leave programmatic=None")
    checks.precheck(sched, tgt)
    pb = ProgramBuilder(sched, tgt)
    _launches(pb, sched.root, outer=())
    prog = pb.program()
    if programmatic is None:
        chained = tgt.has_pdl and not _sm_sized_grid(sched)
        return programmatic_launches(prog, tgt, chained=chained, release=chained and len(prog.kernels) == 1)
    return programmatic_launches(prog, tgt, chained=programmatic)


def check_programmatic(programmatic) -> None:
    """``ScheduleError`` unless ``programmatic`` is None, True or False (``lower``, ``compile``)."""
    if programmatic is not None and not isinstance(programmatic, bool):
        raise ScheduleError("programmatic is None, True or False", field="programmatic", value=programmatic,
                            allowed="None (where the target can), True, False")


def _sm_sized_grid(sched: Schedule) -> bool:
    """Whether ``sched`` launches a grid sized to the SMs (``to_blocks(persistent=True)``, stream-K),
    which ``lower`` does not chain by default: such a launch holds the GPU for its whole life, so
    overlapping its launch saves nothing measurable.  A GEMM of 8192³ on a persistent grid read
    3.4 % slower chained in two eager runs on an H100, and 0.1-1.9 % slower through CUDA graphs
    (0-0.3 % eagerly) in a later run (bench/README.md, "Launches that overlap the one before"
    and "Chained launches by default")."""
    return any(lp.persistent or lp.stream for n in sched.nodes() for lp in n.loops)


def _launches(pb: ProgramBuilder, node: Node, outer: tuple) -> None:
    """The launches of kernel-level ``node`` (inside the block loops ``outer`` of its parents)."""
    if node.spec.level != KERNEL:  # pragma: no cover - the caller only passes kernel-level nodes
        raise err(node, "a launch starts at a kernel-level spec")
    for p in node.pre:
        _launches(pb, p, ())
    if node.loops and all(lp.unit == BLOCK for lp in node.loops):
        loops = outer + tuple((lp, node) for lp in node.loops)
        child = node.body[-1] if node.body else None
        if child is not None and child.spec.level == KERNEL:
            for c in node.body[:-1]:
                _launches(pb, c, ())
            _launches(pb, child, loops)
        elif child is not None:
            _kernel(pb, node, child, loops)
        else:  # pragma: no cover - a mapping always has a body
            raise err(node, "nothing to launch")
    elif not node.loops and not node.body and node.atom is None:
        if isinstance(node.spec, Reduce):
            pb.kernels.append(reduce_launch(pb, node, _name(pb, node.spec)))
        else:
            raise err(node, "this kernel-level spec is not refined: no rule launches it as it is",
                      fix="start the chain with tile(...) >> to_blocks()")
    else:
        seq = [lp for lp in node.loops if lp.unit != BLOCK]
        what = ", ".join(f"{lp.var} over {'/'.join(d for d, _ in lp.steps)}" for lp in seq)
        raise err(node, "the kernel-level spec must be tiled onto blocks"
                        + (f": its loops {what} are not mapped onto blocks" if seq else ""),
                  strategy=node.strategy,
                  fix="map each tiling of the kernel-level spec: tile("
                      + ", ".join(f"{d}=..." for d in node.spec.dims) + ") >> to_blocks()")
    for p in node.post:
        _launches(pb, p, ())


def _name(pb: ProgramBuilder, spec) -> str:
    base = f"firesched_{type(spec).__name__.lower()}"
    names = {k.name for k in pb.kernels}
    name, i = base, 2
    while name in names:
        name, i = f"{base}_{i}", i + 1
    return name


def _inner_units(n: Node, level) -> int:
    """Units of ``level`` the loops of ``n`` and below map onto: nested loops multiply, sibling
    subtrees (the parts of a fused spec) share the same units, so the widest counts."""
    own = 1
    for lp in n.loops:
        if lp.unit == BLOCK:
            raise err(n, "blocks can only be mapped at the kernel level")
        if lp.unit == level:
            own *= lp.count
    return own * max((_inner_units(c, level) for c in n.children), default=1)


def _threads(n: Node) -> int:
    """Threads the unit-mapped loops of ``n``'s subtree need (0 when none is mapped)."""
    levels = {lp.unit for m in n.walk() for lp in m.loops}
    return max((_inner_units(n, level) * UNIT_THREADS[level] for level in (WARPGROUP, WARP, THREAD)
                if level in levels), default=0)


def block_threads(block: Node) -> int:
    """Threads of the block: for each unit level, the units its loops map onto times their size;
    the widest level decides.  The parts of a fused spec run in the same threads, one after the
    other, so they must map the same number of them (a part on fewer threads would need the
    others to skip it, and its barriers to count fewer threads)."""
    for m in block.walk():
        if isinstance(m.spec, Fused) and len(m.body) > 1:
            # (a part with no loop mapped onto units — element-wise work on fragments — runs on
            # the threads that hold them)
            counts = [_threads(c) for c in m.body]
            if len(set(counts) - {0}) > 1:
                raise err(m, "the parts of a fused spec map different numbers of threads: "
                             + ", ".join(f"part {i}: {c}" for i, c in enumerate(counts)),
                          fix="map every part onto the same warps (e.g. to_warps(2, 2) in each)")
    _check_nesting(block)
    n = _threads(block)
    if n == 0:
        raise err(block, "no loop of the block is mapped onto warps (or warpgroups, or threads)",
                  fix="tile the block's work with tile(m=..., n=...) >> to_warps()")
    return n


def _check_nesting(n: Node) -> None:
    """Units mapped inside a unit must fit in it: a warp has 32 threads, a warpgroup 4 warps.
    (Mapping 64 threads below a warp would give each warp's index to 32 threads while the
    thread loop spans 64, so two warps' rows would be reduced together.)  Threads mapped inside
    a warp must also fill it: with 4 of them, lanes 4..31 would take the indices of lanes 0..3
    again and store the same elements a second time."""
    finer = (WARPGROUP, WARP, THREAD)
    for level in (WARPGROUP, WARP):
        if not any(lp.unit == level for lp in n.loops):
            continue
        for c in n.children:
            for f in finer[finer.index(level) + 1:]:
                need = _inner_units(c, f) * UNIT_THREADS[f]
                inner = next((m for m in c.walk() if any(lp.unit == f for lp in m.loops)), None)
                if inner is not None and level == WARP and f == THREAD and need < UNIT_THREADS[WARP]:
                    raise err(inner, f"{need} threads are mapped inside one warp, which has 32: the other "
                                     f"{32 - need} lanes would repeat their work and store the same elements again",
                              strategy=inner.strategy, field="threads", value=need, allowed="32 threads per warp",
                              fix="tile the warp's part so that to_threads() maps 32 units (e.g. a larger or "
                                  "finer tile), or map threads without to_warps() above them")
                if need > UNIT_THREADS[level]:
                    inner = next(m for m in c.walk() if any(lp.unit == f for lp in m.loops))
                    cap = UNIT_THREADS[level] // UNIT_THREADS[f]
                    detail = "" if f == THREAD else f" ({need} threads; a {level} has {UNIT_THREADS[level]})"
                    raise err(inner, f"{need // UNIT_THREADS[f]} {f}s are mapped inside one {level}, "
                                     f"which holds {cap}{detail}",
                              strategy=inner.strategy, field=f"{f}s", value=need // UNIT_THREADS[f],
                              allowed=f"at most {cap} {f}s per {level}",
                              fix=f"tile the {level}'s part more coarsely before to_{f}s(), or map more "
                                  f"{level}s above it")
    for c in n.children:
        _check_nesting(c)


def bind_units(block: Node, scope: Scope) -> tuple[dict, dict]:
    """Each unit-mapped loop variable as an expression of the scope's thread index, and its span
    (thread stride, count).  The loops of one level are linearised row-major, outer loops slower:
    a loop's stride is the units of its level that the loops after it and below it take (nested
    loops: split-K over warps above the warp tiles; siblings — the parts of a fused spec — each
    start again at the same units)."""
    out, spans = {}, {}

    def go(n: Node):
        for level in UNIT_THREADS:
            mine = [lp for lp in n.loops if lp.unit == level]
            stride = max((_inner_units(c, level) for c in n.children), default=1)
            for lp in reversed(mine):
                out[lp.var] = (scope.tid // (UNIT_THREADS[level] * stride)) % lp.count
                spans[lp.var] = (UNIT_THREADS[level] * stride, lp.count)
                stride *= lp.count
        for c in n.children:
            go(c)

    go(block)
    return out, spans


def _enter_scope(ctx: Ctx, block: Node, scope: Scope, **kw) -> Ctx:
    exprs, spans = bind_units(block, scope)
    return attrs.evolve(ctx, scope=scope, spans={**ctx.spans, **spans}, **kw).bind(**exprs)


def shared_layouts(block: Node) -> tuple[dict[str, SmemLayout], list]:
    """The layout of every shared tensor below ``block`` — as a global -> shared move fills it
    (TMA boxes, or per-thread copies), or row-major for one a strategy placed there (a fused
    intermediate) —, and the tiles of those a move fills, in tree order."""
    out, tiles = {}, []
    # tiles a wgmma reads through a matrix descriptor: per-thread copies fill them in the
    # canonical layout TMA would leave (swizzle-span boxes), the one a descriptor can describe
    by_wgmma = {t.name for n in block.walk() if n.atom is not None and n.atom.family == WGMMA
                for t in n.spec.operands if t.memory == SH}
    # a pipelined loop's TMA ring has at least two stages; a tile move's (transforms.tile_moves) is
    # as deep as its tile
    once = tm.tile_move_names(block)

    def go(n: Node):
        sp = n.spec
        if type(sp).__name__ == "Move" and sp.src.memory == GL and sp.dst.memory == SH and sp.dst.name not in out:
            t = sp.dst.tensor
            if n.via and n.via[0].family == TMA:
                out[t.name] = tma_smem_layout(n, t, t.stages if t.name in once else max(t.stages, 2))
            elif t.name in by_wgmma:
                out[t.name] = tma_smem_layout(n, t, t.stages)
            else:
                out[t.name] = plain_smem_layout(t)
            tiles.append(sp.dst)
        for c in n.children:
            go(c)

    def placed(n: Node):
        for t in n.spec.operands:
            if t.memory == SH and t.name not in out:
                out[t.name] = plain_smem_layout(t.tensor)
        for c in n.children:
            placed(c)

    go(block)
    placed(block)
    return out, tiles


def _kernel(pb: ProgramBuilder, chain_node: Node, block: Node, block_loops) -> None:
    """One launch: ``block_loops`` on the grid, ``block`` (a block-level node) the work."""
    tgt = pb.target
    kb = KernelBuilder(pb, _name(pb, chain_node.spec))
    smem, staged = shared_layouts(block)
    rf = {**thread_layouts(block), **register_layouts(block)}
    rf.update(fragment_layouts(block, rf))
    lw = Lowerer(pb, kb, tgt, rf=rf, smem=smem)
    order = block_order(block_loops, block, tgt)
    kb.grid = order.grid
    spec_loop = ws.specialized_loop(block)
    threads = block_threads(block)
    if order.cluster is not None:
        if not tgt.has_clusters:
            raise err(block, f"thread-block clusters need sm_90a; the target is {tgt.name}", field="cluster",
                      value=order.cluster.size, allowed="1",
                      fix="split_k(..., combine='fixup') or combine='launch' (W4A16: cluster_combine=False)"
                      if order.cluster.split else "to_blocks() without cluster=")
        if (spec_loop is None and not order.cluster.split
                and any(isinstance(m.spec, MatMul) for m in block.walk())):
            raise err(block, "the sm_90a GEMM lowering does not handle clusters without warp specialization: their "
                             "blocks release each other's stages from consumer warpgroups",
                      fix="add warp_specialize() after pipeline(...), or drop cluster=")
        kb.cluster = order.cluster.size
    kb.min_blocks_per_sm = max((lp.occupancy for lp, _ in block_loops), default=1)
    _check_early(lw, block, threads + (128 if spec_loop else 0))
    for t in staged:            # the staged tiles first, in tree order: they hold the big, aligned buffers
        shared_buffer(lw, t)

    stream = None
    if order.stream is not None:
        what = order.stream.strategy
        if not isinstance(block.spec, MatMul) or block.spec.c.memory != GL:
            raise err(block, f"{what} splits a MatMul's K loop over blocks: the block's work must be the MatMul "
                             "that stores C", fix=f"apply {what} to the kernel-level MatMul, then tile(m=..., "
                                                  "n=...) >> to_blocks()")
        stream = attrs.evolve(order.stream, acc=block.spec.c.name)
    # the block's tile: global tensors enter at 0 and move with the block loops
    ctx = Ctx(vars=dict(order.bindings), tile_index=order.tile_var if order.tile_var is not None else 0,
              repeated=order.tile_var is not None,
              cluster=order.cluster if order.cluster is None or not order.cluster.split else None, stream=stream)
    owners = []
    for _, owner in block_loops:
        if owner not in owners:
            owners.append(owner)
    for sp in [pb.spec, chain_node.spec] + [o.spec for o in owners] + [block.spec]:
        for t in sp.operands:
            if t.memory == GL and (t.name, "GL") not in ctx.origin:
                ctx = enter_global(ctx, t)
    for lp, owner in block_loops:
        ctx = decompose.advance(ctx, owner, lp, order.bindings[lp.var])
        ctx = attrs.evolve(ctx, made_by={**ctx.made_by, **{d: owner.strategy for d, _ in lp.steps}})

    def per_tile(stmts: list) -> list:
        if order.tile_var is None:
            return stmts
        body = stmts if order.tile_valid == 1 else [ir.If(order.tile_valid, ir.Seq(tuple(stmts)))]
        return [ir.Comment(f"tiles of this block: {order.tile_var.extent}"),
                ir.For(order.tile_var, order.tile_var.extent, ir.Seq(tuple(body)))]

    tile_stages = max((lp.stages for lp, _ in block_loops), default=1)
    if tile_stages > 1 and (order.tile_var is None or spec_loop is not None):
        raise err(block, f"pipeline(stages={tile_stages}) over the block's tile loop needs a persistent grid of "
                         "one role (its blocks walk tiles; a warp-specialized producer has a ring of its own)",
                  field="stages", value=tile_stages, allowed="1",
                  fix="to_blocks(persistent=True) without warp_specialize(), or drop this pipeline(...)")
    if spec_loop is None:
        kb.threads = threads
        scope = Scope(threads, ir.tid(threads))
        hoists = Hoists()
        c = _enter_scope(ctx, block, scope, hoists=hoists, hoist_node=block)
        copies = None
        if tile_stages > 1:
            moves = tp.prefetched_moves(block)
            copies = tp.TileCopies(frozenset(m.spec.dst.name for m in moves), tile_stages, order.tile_var)
            c = attrs.evolve(c, tile_copies=copies, stage={**c.stage, **{n: copies.stage() for n in copies.names}})
        work = lw.lower(block, c)
        setup, work = place_early_rings(lw, lw.notes.get("setup", []), work)
        if copies is not None:
            prologue, loop = tp.pipelined_tiles(copies, order.tile_var.extent, order.tile_valid, work)
            tiles = [ir.Comment(f"tiles of this block: {order.tile_var.extent}, {tile_stages - 1} copied ahead"), loop]
            if _only_window_copies(lw, setup):
                setup = _window_copies_first(lw, setup, prologue)
            elif any(isinstance(st, (ir.AsyncCommit, ir.AsyncWait)) for st in walk(setup)):
                # (a setup waiting on copies of its own would wait for these too)
                tiles = [*prologue, *tiles]
            else:
                # the first tiles' copies in flight while the block sets up (the weights' windows it
                # stages once: tile_prefetch.prefetched_moves)
                setup = [*prologue, *setup]
        else:
            tiles = per_tile(work)
        body = without_redundant_barriers([*setup, *tiles, *hoists.scope_end])
        body = split_guards(early_loads(batched_loads(body, kb), kb), kb.threads)
    else:
        body = _specialized(lw, ctx, block, spec_loop, threads, per_tile)
        if lw.notes.get("early_ring"):
            # (register rings issue their first loads early only in one-role kernels)
            raise InternalError("a register ring's prologue was left unplaced in a warp-specialized kernel")
    body = paired_conversions(body, lw.target)
    check_resources(lw, block, body)
    pb.kernels.append(kb.build(ir.Seq(tuple(body)), header=str(pb.sched)))


def _only_window_copies(lw: Lowerer, setup: list) -> bool:
    """Whether the only async copies of ``setup`` are the persistent windows' raw copies
    (``rules.threads._stage_window_raw``), which go out before the first tiles' copies
    (``_window_copies_first``)."""
    raw = lw.notes.get("window_raw")
    if raw is None or not any(st is raw["stmt"] for st in setup):
        return False
    rest = [st for st in setup if st is not raw["stmt"]]
    return not any(isinstance(st, (ir.AsyncCommit, ir.AsyncWait)) or getattr(st, "atom", None) is not None
                   and st.atom.family == CP_ASYNC for st in walk(rest))


def _window_copies_first(lw: Lowerer, setup: list, prologue: list) -> list:
    """``setup`` with the persistent windows' raw copies issued first, the first tiles' copies
    (``prologue``) after them, and a wait for the windows' group alone before their shift, so that
    the block shifts its windows while its first rows are still in flight::

        W, B raw copies; commit          group 1
        tile 0's copies; commit          group 2 (and more with more stages)
        wait_group 1; barrier            group 1 landed
        shift W, B in shared memory      tile 0 still in flight
    """
    raw = lw.notes["window_raw"]
    groups = sum(isinstance(st, ir.AsyncCommit) for st in prologue)
    fill = ir.Seq((ir.AsyncWait(groups), ir.Barrier(comment="the operands' raw copies have landed"),
                   *raw["shifts"], ir.Barrier(comment="the windows are filled")))
    return [*raw["copies"], ir.AsyncCommit(), *prologue, *(fill if st is raw["stmt"] else st for st in setup)]


def _specialized(lw: Lowerer, ctx: Ctx, block: Node, spec_loop, consumer_threads: int, per_tile) -> list:
    """Producer and consumer roles of a warp-specialized block (``transforms.specialize``)."""
    node, lp = spec_loop
    kb = lw.kb
    if pipe.ring_kind(node) != "tma":  # pragma: no cover - warp_specialize() already requires TMA moves
        raise err(node, "warp specialization needs a TMA ring")
    preg, creg = lp.specialize[:2]
    pingpong = lp.specialize[2:] == (1,)
    nwg = consumer_threads // 128
    if consumer_threads % 128:
        raise err(block, f"{consumer_threads} consumer threads: warp-specialized consumers are whole warpgroups",
                  fix="tile(m=64) >> to_warpgroups() below the pipeline")
    ws.check_budget(block, lw.target, nwg, preg, creg, blocks=kb.min_blocks_per_sm)
    if pingpong and nwg < 2:
        raise err(block, f"warp_specialize(pingpong=True) with {nwg} consumer warpgroup: ping-pong passes the turn "
                         "to issue wgmma between consumer warpgroups", field="pingpong", value=True,
                  allowed="False with one consumer warpgroup",
                  fix="two or more consumer warpgroups (tile(m=64) >> to_warpgroups() under a 128-row tile), or "
                      "pingpong=False")
    C = ctx.cluster.size if ctx.cluster is not None else 1
    kb.threads = 128 * (nwg + 1)
    tid = ir.tid(kb.threads)
    if lp.separate:
        # pipeline(separate=True): each staged operand on full and empty barriers of its own
        ring = pipe.OperandRings.create(lw, pipe.ring_stages(lp, "tma"), node, consumers=nwg * C, cluster=C)
    else:
        ring = pipe.MbarrierRing.create(lw, pipe.ring_stages(lp, "tma"), pipe.stage_bytes(node), consumers=nwg * C,
                                        cluster=C)
    # copies above the pipelined loop, once per block tile: the producer issues them on a ring of
    # their own, the consumers wait for them and release them after the loop
    moves = tm.tile_moves(block, node)
    if moves and C > 1:
        raise err(moves[0], f"{moves[0].spec.dst.name} is copied by the producer once per block tile; in a "
                            "thread-block cluster that is not built (its release would have to reach every block)",
                  field="cluster", value=C, allowed="1", fix="to_blocks() without cluster=, or drop via= from "
                                                             f"move_to_smem({moves[0].spec.dst.name!r}, ...)")
    tiles = tm.TileRing.create(lw, moves, nwg) if moves else None
    base = attrs.evolve(ctx, ring=ring, specialized=True, tiles=tiles)
    if tiles is not None:
        base = attrs.evolve(base, stage={**base.stage, **tiles.stages(base.tile_index)})
    pscope = Scope(128, tid, elected=True)
    pctx = _enter_scope(base, block, pscope, part=PRODUCER)
    first = []
    if tiles is not None:
        # the tile moves' issue, before the pipelined loop or riding in the producer's copy of the
        # ring into the loop (transforms.tile_moves.AFTER_FIRST_STEP)
        ptiles, first = tiles.producer_copy(lw, pctx)
        pctx = attrs.evolve(pctx, tiles=ptiles)
    producer = [ir.If(ir.expr.lt(tid, 1), ir.Seq(tuple(per_tile(first + lw.lower(block, pctx)))))]
    cscope = Scope(128 * nwg, ir.role_tid(128 * nwg), first=128)
    hoists = Hoists()
    cctx = _enter_scope(base, block, cscope, part=CONSUMER, hoists=hoists, hoist_node=block)
    if pingpong:
        cctx = attrs.evolve(cctx, pingpong=nwg)
    consumers = [*turns.first_turn(cctx), *per_tile(lw.lower(block, cctx)), *hoists.scope_end]
    # the barriers' counts are known once the roles are lowered (the consumers' loop may release
    # a stage by every thread's arrival: transforms.pipeline)
    init = ring.init() + (tiles.ring.init() if tiles is not None else [])
    body: list = [ir.Comment(str(block.spec)), ir.If(ir.expr.lt(tid, 1), ir.Seq(tuple(init)))]
    if C > 1:
        body.append(_call_cluster("every block's mbarriers are initialised: the cluster's multicasts and "
                                  "arrivals may target them"))
    else:
        body.append(ir.Barrier("mbarriers initialised"))
    # what the roles' rules asked to run first, by every thread (a split's cluster exchange: its
    # mbarrier's initialisation and a barrier.cluster)
    body += lw.notes.get("setup", [])
    body.append(ws.roles(preg, creg, producer, consumers, 128 * nwg, groups=nwg if pingpong else 1))
    if C > 1:
        body.append(_call_cluster("no block leaves while the others may still arrive on its mbarriers"))
    ws.one_block_per_sm(kb)
    return body


def _call_cluster(comment: str):
    from ..hardware.atoms import sm90a

    return ir.AtomCall(sm90a.barrier_cluster, (), 1, comment)


def _check_early(lw: Lowerer, block: Node, threads: int) -> None:
    """Resource checks that need nothing but the tree, before any statement is built (shared memory
    was estimated by ``checks.precheck``; registers are counted once the rules asked for them)."""
    tgt = lw.target
    if threads > tgt.max_threads_per_block:
        raise err(block, f"{threads} threads per block", field="threads", value=threads,
                  allowed=f"<= {tgt.max_threads_per_block}")


def check_resources(lw: Lowerer, block: Node, body) -> None:
    """What the launch asked for (``body``: the kernel's statements, whose register lifetimes
    give its register peak), against the target's limits."""
    kb, tgt = lw.kb, lw.target
    own = [b for b in kb.shared.values() if not b.alias]
    smem = sum(b.nbytes for b in own) + 128 * len(own)
    limit = tgt.smem_per_block_optin
    if smem > limit:
        parts = ", ".join(f"{b.name}: {b.nbytes} B" for b in kb.shared.values())
        raise err(block, f"shared memory over the target's limit: {smem} bytes ({parts})",
                  field="shared memory", value=smem, allowed=f"<= {limit} bytes on {tgt.name}",
                  fix="use fewer pipeline stages or smaller block / K tiles")
    # the most register words live at once (buffers that live at different times share registers)
    peak = liveness.pressure(body, kb.regs)
    words = peak.words
    if words + REG_OVERHEAD > tgt.regs_per_thread:
        parts = ", ".join(f"{name}: {w}" for name, w in peak.live)
        raise err(block, f"registers over budget: about {words + REG_OVERHEAD} per thread at the peak ({parts} "
                         f"live at once, +{REG_OVERHEAD} for addressing)", field="registers",
                  value=words + REG_OVERHEAD, allowed=f"<= {tgt.regs_per_thread}",
                  fix="use smaller warp tiles (more warps per block) or a smaller block tile")
    if kb.threads > tgt.max_threads_per_block:
        raise err(block, f"{kb.threads} threads per block", field="threads", value=kb.threads,
                  allowed=f"<= {tgt.max_threads_per_block}")
    occ = kb.min_blocks_per_sm
    if occ > 1:
        # the registers the compiler may use follow from the occupancy (it caps them); threads and
        # shared memory are what they are, and must fit ``occ`` times on one SM: the bytes the
        # launch asks for (the buffers laid out as the kernel lays them out), each block beside
        # the driver's reserve
        laid = ir.shared_bytes(kb.shared.values())
        for what, need, have in (("threads", kb.threads * occ, tgt.max_threads_per_sm),
                                 ("shared memory", (laid + tgt.smem_reserved_per_block if kb.shared else 0) * occ,
                                  tgt.smem_per_sm),
                                 ("blocks", occ, tgt.max_blocks_per_sm)):
            if need > have:
                each = (f", each with the {tgt.smem_reserved_per_block} bytes the driver keeps for a block"
                        if what == "shared memory" and tgt.smem_reserved_per_block else "")
                raise err(block, f"to_blocks(occupancy={occ}) needs {need} {what} per SM ({occ} blocks{each}); "
                                 f"{tgt.name} has {have}", field="occupancy", value=occ,
                          allowed=f"<= {max(1, occ * have // need)}",
                          fix="lower the occupancy, or use fewer threads / less shared memory per block")


__all__ = ["lower", "resolve_target", "block_threads", "bind_units", "ScheduleError", "WGMMA"]
