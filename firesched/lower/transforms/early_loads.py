"""Loads of read-only inputs issued at the kernel's start, not behind its barriers.

A row kernel reads its row, reduces it (shuffles, a block barrier, another reduction), and only
then reads what the output needs besides the row: LayerNorm's weight and bias, RMSNorm's weight.
Those loads do not depend on anything the kernel computes, yet they are issued after the
barriers, and each one waits a whole memory latency (an L2 round trip, ~0.5 us) while the block
holds its place on the SM.  The loads are volatile asm and the output's stores sit between them,
so neither NVRTC nor ptxas moves them up.  This pass does, where it is safe::

    for c in 0..2: x[c] = ld X[f(c)]             for c in 0..2 (unrolled): w'[c] = ld W[g(c)]
    stats(x); __syncthreads(); ...          ->   for c in 0..2: x[c] = ld X[f(c)]
    for c in 0..2 (unrolled):                    stats(x); __syncthreads(); ...
        w = ld W[g(c)]                           for c in 0..2 (unrolled):
        y = op(x, w); st Y[...], y                   y = op(x, w'[c]); st Y[...], y

Safe means: the loop is unrolled (its iterations' loads fit in registers of their own) and sits
at the kernel's top level after its first barrier; its leading statements are loads and the
moved ones read a global input of the kernel (``role="in"``) that no statement of the kernel
writes, at an address (and under a predicate) of the loop's index and the kernel's constant
indices (thread and block) alone; the loop body is straight-line; the loads' registers are the
loop's own (written by that load alone, dead after the loop).  A load then reads at the start
what it would have read later, and every other statement keeps its order.  The moved registers
stay live over the whole kernel: they may take at most ``1/EARLY_SHARE`` of the registers a
thread has at the SM's full occupancy, whatever the kernel asks for.
"""

from __future__ import annotations

from ... import ir
from ...hardware.atoms.base import CLUSTER, MBARRIER, SYNC
from ...hardware.target import SM90A
from ...ir.expr import Var, free_vars
from ...ir.rewrite import flat, map_stmt, substitute_stmt, walk
from .batch_loads import _dead_after, _events, _is_load, _straight, _written_buffers

#: atom families that may wait for other threads or for memory
WAITS = (CLUSTER, MBARRIER, SYNC)
#: the registers a thread has when the SM holds its most threads (2048 on sm_80 and sm_90)
FULL_OCCUPANCY_REGISTERS = SM90A.thread_regs(SM90A.max_threads_per_sm)
#: the share of those the moved loads may hold: at most 8 registers a thread, whatever the
#: block's size.  Measured on an H100 (bf16 row kernels): with up to 16, LayerNorm's weight and
#: bias of 16 values a thread took it from 44 to 55 registers (five blocks an SM to four) and ran
#: 3-4 % slower over 4,096 columns (a first budget of 32 took LayerNorm over 8,192 columns from 63
#: to 116 registers); with 8, RMSNorm over 1,024 columns ran 5 % faster and nothing slower
#: (bench/README.md)
EARLY_SHARE = 4


def early_loads(body: list, kb) -> list:
    """``body`` (a kernel's top-level statements, not warp-specialized) with the loads of
    read-only inputs that wait behind a barrier moved to its start (module docstring); ``kb``
    the kernel builder whose register arrays the moved loads take."""
    top = flat(body)
    first_barrier = next((i for i, s in enumerate(top) if _has_barrier(s)), None)
    if first_barrier is None:
        return body
    written = _written_buffers(_leaves(top))
    loop_vars = {x.var for x in walk(top) if isinstance(x, ir.For)}
    events: list = []
    spans: dict = {}
    _events(ir.Seq(tuple(top)), events, spans)
    budget = FULL_OCCUPANCY_REGISTERS // EARLY_SHARE
    early, out = [], []
    for i, s in enumerate(top):
        if i > first_barrier and isinstance(s, ir.For):
            moved = _move(s, kb, written, loop_vars, events, spans[id(s)], budget)
            if moved is not None:
                pre, s, regs = moved
                early.append(pre)
                budget -= regs
        out.append(s)
    if not early:
        return body
    return [ir.Comment("loads of read-only inputs, issued before the barriers (transforms.early_loads)"),
            *early, *out]


def _has_barrier(s) -> bool:
    """Whether ``s`` may wait: a block barrier, or a synchronising atom (a cluster barrier, an
    mbarrier operation, an async-group wait).  Only where the loads move from: moving them is safe
    anywhere, and worth it past a wait."""
    return any(isinstance(x, ir.Barrier) or (isinstance(x, ir.AtomCall) and x.atom.family in WAITS)
               for x in _leaves([s]))


def _leaves(stmts) -> list:
    """The statements of ``stmts`` that hold no others, outermost first."""
    return [x for x in walk(stmts) if not isinstance(x, (ir.Seq, ir.For, ir.If, ir.Roles))]


def _move(loop: ir.For, kb, written: set, loop_vars: set, events: list, span, budget: int):
    """``(prefetch loop, loop without the moved loads, registers taken)``, or None."""
    if not loop.unroll or loop.stop is not None:
        return None
    stmts = [x for x in flat([loop.body]) if not isinstance(x, ir.Comment)]
    if not stmts or not all(_straight(x) for x in stmts):
        return None
    lead = 0
    while lead < len(stmts) and _is_load(stmts[lead]):
        lead += 1
    others = set(loop_vars) - {loop.var}
    picked = []
    for s in stmts[:lead]:
        args = dict(s.args)
        src, dst = args["src"], args["dst"]
        if not (isinstance(src.buffer, ir.GlobalBuffer) and src.buffer.role == "in"
                and src.buffer.name not in written):
            continue
        if (free_vars(src.offset) | free_vars(s.pred)) & others:
            continue                        # an address that moves with an enclosing loop
        if sum(dst.buffer.name in writes for _, writes in events[span[0]:span[1]]) != 1:
            continue                        # the loop writes the registers elsewhere too
        if not _dead_after(dst.buffer.name, events, span):
            continue
        picked.append(s)
    if not picked:
        return None
    regs = loop.extent * sum(-(-s.atom.width // 4) for s in picked)
    if regs > budget:
        return None
    sizes = {dict(s.args)["dst"].buffer.name: dict(s.args)["dst"].buffer for s in picked}
    wide = {n: kb.reg(f"{n}_early", b.dtype, b.size * loop.extent) for n, b in sizes.items()}

    def widen(r):
        if isinstance(r, ir.RegRef) and r.buffer.name in wide:
            return ir.RegRef(wide[r.buffer.name], loop.var * sizes[r.buffer.name].size + r.offset)
        return r

    def remap(st):
        return map_stmt(st, lambda x: x, widen)

    # the prefetch loop has a variable of its own (the same iterations, the same offsets)
    e = Var(f"{loop.var.name}_e", loop.extent)
    pre = ir.For(e, loop.extent, substitute_stmt(ir.Seq(tuple(remap(s) for s in picked)), {loop.var: e}),
                 unroll=True)
    keep = [remap(s) for s in flat([loop.body]) if not any(s is p for p in picked)]
    return pre, ir.For(loop.var, loop.extent, ir.Seq(tuple(keep)), unroll=True), regs
