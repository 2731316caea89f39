"""The decomposition rule and the loop rules.

A node a strategy refined lowers as its ``pre`` children, then its loops around its ``body``
children, then its ``post`` children.  Each loop is one of:

* mapped onto a level (blocks, warpgroups, warps, threads): its variable is already bound to the
  unit's index (by the launch or the role); the rule only moves the operands' origins;
* a sequential loop over tiles: a ``For`` (unrolled below the block level, where its variable
  may index registers); the origins of the operands that have the loop's dim advance by the step
  each iteration, and where the last tile is partial, the global limit tightens so that the
  copies predicate it;
* a reduction loop whose body fills shared memory: a software pipeline (``transforms.pipeline``).

Partial tiles are predicated only where the data is in global memory.  A loop that cuts an
on-chip operand (shared or registers) into tiles that do not divide it would read or write past
the tile: that is a ``ScheduleError`` naming the strategy, before any code is built.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...hardware.atoms import catalog, sm90a
from ...hardware.atoms.base import WGMMA
from ...ir import rewrite as ir_rewrite
from ...ir.expr import IntExpr, Var, bounds, floordiv, free_vars, maximum, minimum
from ...schedule import Loop, Node
from ...spec import Fused, MatMul, Move
from ...tensor import GL, RF, SH, WARPGROUP
from ..context import err, frames, key
from ..layouts import ThreadLayout
from ..lowerer import Lowerer, decomposition_rule, loops_rule, special_loop, wants
from . import partials
from .turns import take_turn


@decomposition_rule
def decomposition(lw: Lowerer, node: Node, ctx) -> list:
    if (isinstance(node.spec, MatMul) and node.spec.level == WARPGROUP and not ctx.async_mma
            and any(n.atom is not None and n.atom.family == WGMMA for n in node.walk())):
        # a warpgroup's wgmma no pipeline retires (a MatMul among the parts of a fused body):
        # its k steps issue as one group, fenced before (the accumulator was just written by
        # other instructions) and waited for after (the next part reads it)
        inner = decomposition(lw, node, attrs.evolve(ctx, async_mma=True))
        if not any(isinstance(s, ir.AtomCall) and s.atom.family == WGMMA for s in ir_rewrite.walk(inner)):
            return inner            # a part that issues none here (a pipeline's producer side)
        group = [ir.AtomCall(sm90a.wgmma_fence, ()), *inner, ir.AtomCall(sm90a.wgmma_commit, ())]
        return [*take_turn(ctx, group), ir.AtomCall(catalog.with_immediates(sm90a.wgmma_wait, n=0), (),
                                                    comment="the group is done: its accumulator is read next")]
    ctx = frames(ctx, [node.spec] + [p.spec for p in node.pre])
    ctx = partials.enter(ctx, node)
    hoists = ctx.hoists if ctx.hoist_node is node else None
    if hoists is not None:
        # the hoists belong to this node only: children do not splice them again
        ctx = attrs.evolve(ctx, hoist_node=None)
    out: list = []
    for p in node.pre:
        if wants(p, ctx):
            out += lw.lower(p, ctx)
    out += loops(lw, node, ctx, list(node.loops))
    post: list = []
    for p in node.post:
        if wants(p, ctx):
            post += lw.lower(p, ctx)
    out, post = partials.retire(ctx, node, out, post)
    if hoists is None:
        return out + post
    return hoists.tile_start + out + hoists.before_post + post


def body(lw: Lowerer, node: Node, ctx) -> list:
    out: list = []
    fused = isinstance(node.spec, Fused)
    touched: dict[str, bool] = {}        # shared tensors the earlier parts touched -> written?
    for c in node.body:
        ctx = frames(ctx, [c.spec])
        if not wants(c, ctx):
            continue
        if fused:
            # the parts of a fused spec run one after the other in the same threads: a part that
            # touches shared memory an earlier part wrote (or writes what an earlier one read)
            # waits for every thread of the block to be done with the earlier part; so does one
            # that reads a global result an earlier part wrote (a norm's statistics: the barrier
            # makes the block's global writes visible to the block)
            reads, writes = shared_accesses(c)
            if any(touched.get(t) for t in reads | writes) or any(t in touched for t in writes):
                out.append(ir.Barrier(f"the earlier parts are done with {', '.join(sorted((reads | writes) & set(touched)))}"))
                touched = {}
            for t in reads:
                touched[t] = touched.get(t, False)
            for t in writes:
                touched[t] = True
        out += lw.lower(c, ctx)
        if ctx.async_mma and _fills_wgmma_registers(c, node):
            # the move wrote registers a wgmma of this body reads as A: a wgmma may use them only
            # after a fence (the pipeline retires the group before the next step writes them)
            out.append(ir.AtomCall(sm90a.wgmma_fence, (), comment=f"{c.spec.dst.name}'s fragment is ready"))
    return out


def _fills_wgmma_registers(c: Node, node: Node) -> bool:
    """Whether ``c`` is a move into registers that a wgmma in ``node``'s body reads as A."""
    spec = c.spec
    if not isinstance(spec, Move) or spec.dst.memory != RF:
        return False
    k = spec.dst.tensor
    return any(n.atom is not None and n.atom.family == WGMMA and isinstance(n.spec, MatMul) and n.spec.a.tensor == k
               for sib in node.body if sib is not c for n in sib.walk())


def shared_accesses(node: Node) -> tuple[set, set]:
    """(shared tensors ``node``'s subtree reads, those it writes; global tensors it writes, and
    those it reads, as ``"GL:name"``)."""
    reads, writes = set(), set()
    for n in node.walk():
        outs = {_mem_key(t) for t in n.spec.outputs if t.memory in (SH, GL)}
        writes |= outs
        reads |= {_mem_key(t) for t in n.spec.operands if t.memory in (SH, GL) and _mem_key(t) not in outs}
    return reads, writes


def _mem_key(t) -> str:
    return t.name if t.memory == SH else f"GL:{t.name}"


@loops_rule
def loops(lw: Lowerer, node: Node, ctx, rest: list[Loop]) -> list:
    if not rest:
        return body(lw, node, ctx)
    lp, rest = rest[0], rest[1:]
    check_divides(node, lp, ctx, lw)
    if node.strategy is not None:
        ctx = attrs.evolve(ctx, made_by={**ctx.made_by, **{d: node.strategy for d, _ in lp.steps}})
    if lp.unit is not None:
        if lp.rolled:
            raise err(node, f"the loop {lp} is mapped onto {lp.unit}s: unroll=False names a sequential loop, which "
                            "runs at run time or unrolled; a mapped loop's iterations run side by side",
                      strategy=node.strategy, fix="drop unroll=False from the tile that a to_*() strategy maps")
        var = ctx.vars.get(lp.var)
        if var is None:
            raise err(node, f"the loop {lp} is mapped onto {lp.unit}s, which this part of the kernel "
                            "cannot map (blocks map at the kernel level, warps and threads inside a block)")
        inner = attrs.evolve(ctx, units=ctx.units + ((lp, node.strategy),))
        return loops(lw, node, advance(inner, node, lp, var), rest)
    special = special_loop(lw, node, lp)
    if special is not None:
        return special(lw, node, ctx, lp, rest)
    v = Var(lp.var, lp.count)
    inner = loops(lw, node, advance(attrs.evolve(ctx, repeated=ctx.repeated or lp.count > 1), node, lp, v), rest)
    if not inner:
        return []
    # below the block level, and wherever the loop walks registers that threads hold (a row kept in
    # registers by a fused part), the loop is unrolled: its variable indexes registers
    regs = any(t.memory == RF and any(d in t.tensor.dims for d, _ in lp.steps) for t in node.spec.operands)
    stop = loop_stop(node, ctx, lp)
    if stop is not None and (node.spec.level >= WARPGROUP or regs):
        raise err(node, f"the loop {lp} stops at a diagonal, which needs a loop that runs at run time; this one "
                        "is unrolled (it walks registers or runs below the block)", strategy=node.strategy,
                  fix="stop at the diagonal on a block-level loop over tiles in memory")
    unroll = (node.spec.level >= WARPGROUP or regs) and not lp.rolled
    if lp.rolled and regs:
        raise err(node, f"the loop {lp} walks registers (an operand in registers has its dimension "
                        f"{lp.dim!r}): register indices must be known when the kernel is compiled, so it is "
                        "unrolled", strategy=node.strategy, fix="drop unroll=False from this tile")
    if lp.rolled:
        _check_rolled(node, lp, v, inner)
    loop = ir.For(v, lp.count, ir.Seq(tuple(inner)), unroll=unroll, stop=stop)
    if loop.unroll and _async_issues(inner):
        # A loop of wgmma issues (the K steps of one tile) is written out here: NVRTC's own
        # unrolling of the volatile asm left the descriptor arithmetic of each step in the loop
        # (2% of a 192x128-tile GEMM on an H100, measured against the written-out steps).
        return [ir_rewrite.expand(loop)]
    return [loop]


def _check_rolled(node: Node, lp: Loop, v: Var, stmts) -> None:
    """A loop that runs at run time (``tile(..., unroll=False)``) must index no registers by its
    variable: a register array indexed at run time lives in local memory."""
    for r in ir_rewrite.register_refs(ir.Seq(tuple(stmts))):
        if v in free_vars(r.offset):
            raise err(node, f"the loop {lp} runs at run time (unroll=False), but its body indexes the "
                            f"registers {r.buffer.name} by {v.name}: register indices must be known when the "
                            "kernel is compiled", strategy=node.strategy,
                      fix="drop unroll=False, or tile so that the registers the loop walks are refilled "
                          "inside it (a move_to_regs below the tile)")


def _async_issues(stmts) -> bool:
    """Whether ``stmts`` are asynchronous tensor-core issues only (comments aside)."""
    body = [s for s in ir_rewrite.flat(stmts) if not isinstance(s, ir.Comment)]
    return bool(body) and all(isinstance(s, ir.AtomCall) and s.atom.family == WGMMA for s in body)


def check_divides(node: Node, lp: Loop, ctx=None, lw=None) -> None:
    """A tile loop over an on-chip operand must divide it: nothing predicates shared memory or MMA
    fragments (the copies that fill them zero what lies outside global memory instead).  Registers
    that threads hold element by element may pad past the tensor: they are the thread's own, and
    a reduction skips them (``ThreadLayout.padded_dims``)."""
    sp = node.spec
    child = node.body[-1].spec if node.body else sp
    for d, step in lp.steps:
        for t in list(sp.operands) + [t for t in child.operands if t.name not in {x.name for x in sp.operands}]:
            if t.memory == GL or d not in t.tensor.dims:
                continue
            if t.memory == RF and lw is not None and isinstance(lw.rf.get(t.tensor), ThreadLayout):
                continue
            ext = t.extent(d)
            if t.memory == SH and ext % step and -(-ext // step) * step <= t.tensor.extent(d):
                # a buffer padded past the tile (place(..., pad=)): the last step's reads and
                # writes stay inside it, and the tile's limit stops the reductions
                continue
            if ext % step:
                what = f"{lp.unit}s" if lp.unit is not None else "tiles"
                fixes = sorted({s for s in range(1, ext + 1) if ext % s == 0 and s <= step}, reverse=True)[:3]
                maker = (ctx.made_by.get(d) if ctx is not None else None)
                made = f"{maker}" if maker is not None else f"the tile that made the {d} extent {ext}"
                raise err(node, f"the {d} {what} of {step} do not divide {t.name}:{t.memory}'s {d} extent {ext} "
                                f"(made by {made}): {t.name} lives on chip, where a partial tile cannot be predicated "
                                f"(it would read or write past the tile)", strategy=node.strategy, field=d, value=step,
                          allowed=f"a divisor of {ext} (e.g. {', '.join(map(str, fixes))})",
                          fix=f"make the {d} extent of {made} a multiple of {step}, or tile {d} by a divisor of {ext}")


def advance(ctx, node: Node, lp: Loop, var: IntExpr):
    """Move the origin of every tensor in scope that has one of the loop's dims (shared and
    register tensors created inside the loop are not in scope yet, so they keep their frame)."""
    for k in list(ctx.origin):
        o = dict(ctx.origin[k])
        lim = dict(ctx.limit.get(k, {}))
        changed = False
        for d, step in lp.steps:
            if d not in o:
                continue
            changed = True
            if k[1] == "GL" and d in lim:
                parent_ext = _extent(node, k[0], d)
                # (an aligned window, align(d=vec), reaches past the row's end wherever it starts:
                # the row's limit stays the tighter one)
                window = d in ctx.shift and isinstance(lim[d], int) and parent_ext is not None and \
                    parent_ext - (ctx.shift[d][1] - 1) >= lim[d]
                if parent_ext is not None and parent_ext % step and not window:
                    lim[d] = _min(lim[d], o[d] + parent_ext)
            o[d] = o[d] + var * step
        if changed:
            ctx = ctx.with_origin(k, o)
            if k[1] == "GL":
                ctx = ctx.with_limit(k, lim)
    return ctx


def loop_stop(node: Node, ctx, lp: Loop) -> IntExpr | None:
    """How many steps of ``lp`` run when it stops at a diagonal (``Loop.diagonal = (row,
    offset)``), or None for a loop that runs them all.

    The tile's last row ``r0 + rows - 1`` sees columns up to ``r0 + rows - 1 + offset``; step
    ``t`` starts at column ``c0 + t * step``; the steps that start past that are masked whole::

        rows r0 .. r0+rows-1       columns:  c0 | step 0 | step 1 | ... | step t |  (skipped)
                                                          the diagonal ^ lies in step t

    so ``stop = (r0 + rows + offset - c0 - 1) // step + 1`` (at most the loop's count: the
    printer and the interpreter take the minimum).  ``r0``, ``c0`` are the origins of a global
    operand of the node with the row (column) dim; the bound is the same for every thread of a
    block."""
    if not lp.diagonal:
        return None
    r0, rows, c0, offset, step = _diagonal_frame(node, ctx, lp)
    return floordiv(r0 + rows + offset - c0 - 1, step) + 1


def _diagonal_frame(node: Node, ctx, lp: Loop):
    """``(r0, rows, c0, offset, step)`` of a loop that stops at a diagonal: the tile's first row
    and its rows, the loop's first column, the diagonal's offset and the loop's step."""
    row, offset = lp.diagonal
    col, step = lp.dim, lp.step(lp.dim)
    r = c = None
    for t in node.spec.operands:
        if t.memory == GL and key(t) in ctx.origin:
            if r is None and row in t.tensor.dims:
                r = (ctx.origin[key(t)][row], t.extent(row))
            if c is None and col in t.tensor.dims:
                c = ctx.origin[key(t)][col]
    if r is None or c is None:
        raise err(node, f"the loop {lp} stops at the diagonal of {row} and {col}, but no global operand of "
                        f"{node.spec} carries {row if r is None else col}", strategy=node.strategy,
                  fix="stop at a diagonal only in a loop over the columns of a tensor whose rows the node holds")
    if not isinstance(offset, int) or offset < 0:
        raise err(node, f"the loop {lp} stops at diagonal offset {offset!r}", strategy=node.strategy,
                  field="diagonal", value=offset, allowed="an int >= 0 (below the main diagonal rows may see no "
                                                          "column at all)")
    return r[0], r[1], c, offset, step


def loop_visible(node: Node, ctx, lp: Loop) -> IntExpr | None:
    """How many leading steps of ``lp`` (a loop that stops at a diagonal, ``loop_stop``) lie wholly
    on the visible side of it, for every row of the tile: step ``t`` ends at column
    ``c0 + (t + 1) * step - 1``, which the tile's first row ``r0`` sees when it is at most
    ``r0 + offset``, so ``visible = (r0 + offset - c0 + 1) // step`` (at least 0; the caller takes
    the minimum with the stop).  Those steps need no causal mask."""
    if not lp.diagonal:
        return None
    r0, _, c0, offset, step = _diagonal_frame(node, ctx, lp)
    visible = floordiv(r0 + offset - c0 + 1, step)
    lo, _ = bounds(visible)
    return visible if lo is not None and lo >= 0 else maximum(visible, 0)


def _extent(node: Node, name: str, dim: str) -> int | None:
    """Extent along ``dim`` of global tensor ``name`` in the spec ``node`` tiles (or its child)."""
    specs = [node.spec] + ([node.body[-1].spec] if node.body else [])
    for sp in specs:
        for t in sp.operands:
            if t.name == name and t.memory == GL and dim in t.tensor.dims:
                return t.extent(dim)
    return None


def _min(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return minimum(a, b)


__all__ = ["decomposition", "body", "loops", "advance", "check_divides", "key", "loop_stop"]
