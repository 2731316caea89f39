"""Loop nests of register-only MMAs, run as stacked issues.

A warp tile's inner loops are a perfect nest of MMAs (``for m: for n: for k: mma(d[m, n], a[m],
b[n], c[m, n])``): each iteration is one numpy call for every warp of the batch, and much of its
cost is the interpreter's, not numpy's.  Such a nest runs here a few iterations at a time: their
tiles gathered from the register file in one indexing per operand, computed by one call of the
atom's semantics and scattered back in one indexing, exactly as the iterations one after
another would compute them (each tile's semantics sees the same values; numpy's batched matmul
computes each tile on its own).  About 256 tiles a call: larger stacks leave the cache and are
slower.

It applies only where running the iterations together cannot differ from running them in order,
and cannot report anything: the body is one MMA ``AtomCall`` with register operands only and a
non-zero constant predicate, every thread of the block (batch) is active, the kernel does not track
wgmma register ownership, every iteration's register offsets are the same for every thread
(ints) and in range, and no iteration writes a register that another iteration reads or writes
(an iteration may update its own accumulator in place).  Everywhere else the loop runs as
written, so that what it computes and reports is what it always did.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import ir
from ..hardware.atoms import base as atoms
from ..ir.expr import free_vars
from .convert import to_dtype
from .families import EXECUTORS, collectives
from .tables import atom_tables

#: Tiles (thread groups x iterations) computed by one call of an atom's semantics.
STACK_TILES = 256


class Nest:
    """What a ``For`` statement's loops and MMA are, when they are a nest this module can run."""

    __slots__ = ("names", "extents", "call", "tab", "operands", "outer", "plans")

    def __init__(self, loops, call, tab, outer):
        self.names = tuple(loop.var.name for loop in loops)
        self.extents = tuple(int(loop.extent) for loop in loops)
        self.call = call
        self.tab = tab
        self.operands = (*tab.inputs, tab.output)
        self.outer = outer                  # the other variables the register offsets use
        self.plans: dict = {}               # by the values of ``outer`` and the groups issuing: a Plan, or None


class Plan:
    """One run of a nest: its iterations cut into chunks, each with the register offsets of its
    iterations per operand (``(first, step)`` where they step evenly, else the offsets)."""

    __slots__ = ("chunks",)

    def __init__(self, chunks):
        self.chunks = chunks                # [(iterations, {operand: (first, step) or offsets})]


def nest_of(s: ir.For) -> Nest | None:
    """The MMA nest that ``s`` is, or None (the statement facts only; ``run_nest`` checks the rest)."""
    loops = []
    body = s
    while True:
        if isinstance(body, ir.For):
            loops.append(body)
            body = body.body
        elif isinstance(body, ir.Seq) and len(body.body) == 1:
            body = body.body[0]
        elif isinstance(body, (list, tuple)) and len(body) == 1:
            body = body[0]
        else:
            break
    if not isinstance(body, ir.AtomCall) or body.atom.family != atoms.MMA:
        return None
    if type(body.pred) is not int or not body.pred:
        return None
    if any(not isinstance(ref, ir.RegRef) for _, ref in body.args):
        return None
    names = [loop.var.name for loop in loops]
    if len(set(names)) != len(names) or any(type(loop.extent) is not int or loop.extent < 1 or loop.stop is not None
                                          for loop in loops):
        return None
    if np.prod([int(loop.extent) for loop in loops]) < 2:
        return None
    tab = atom_tables(body.atom)
    operands = (*tab.inputs, tab.output)
    if any(n not in tab.tile_regs for n in operands):
        return None
    outer = set()
    for n in operands:
        off = body.arg(n).offset
        outer |= {v.name for v in free_vars(off)} if not isinstance(off, int) else set()
    return Nest(loops, body, tab, tuple(sorted(outer - set(names))))


def run_nest(k, s: ir.For) -> bool:
    """Run ``s`` as stacked MMA issues if it is a nest this module can run now; whether it did."""
    entry = k.memo.get(("nest", id(s)))
    if entry is None or entry[0] is not s:
        entry = k.memo[("nest", id(s))] = (s, nest_of(s))
    nest = entry[1]
    if nest is None:
        return False
    ctx, regs = k.ctx, k.regs
    if regs.track_wgmma or not ctx.full or EXECUTORS.get(atoms.MMA) is not collectives.mma:
        return False
    key = tuple(ctx.env.get(n) for n in nest.outer)
    if any(type(v) is not int for v in key):
        return False                        # an offset that may differ between threads
    call, tab = nest.call, nest.tab
    ctx.stmt = call                         # as the first iteration would
    groups = ctx.issuing_groups(call)       # every thread active, pred non-zero: every group
    G = groups.shape[0]
    if G == 0:
        return False
    collectives.check_mma_operands(k, call, tab)
    plan = nest.plans.get((key, G), False)
    if plan is False:
        plan = nest.plans[(key, G)] = _plan(k, nest, G)
    if plan is None:
        return False
    atom = call.atom
    out = call.arg(tab.output)
    dt = out.buffer.dtype
    for count, offs in plan.chunks:
        n = count * G
        tiles = []
        for name in tab.inputs:
            flat, idx = _stack_index(k, call.arg(name), groups, tab.tile_regs[name], count, offs[name])
            t = flat[idx]
            want = tab.dtypes[name].np
            tiles.append((t if t.dtype == want else t.astype(want)).reshape(n, *tab.tile[name]))
        d = np.asarray(atom.semantics(*tiles)).reshape(n, -1)
        flat, idx = _stack_index(k, out, groups, tab.tile_regs[tab.output], count, offs[tab.output])
        flat[idx] = d if d.dtype == dt.np else to_dtype(d, dt)
    return True


def _plan(k, nest: Nest, G: int) -> Plan | None:
    """Each iteration's register offsets of ``nest`` in the current environment, checked (uniform,
    in range, no iteration writing what another accesses) and cut into chunks of about
    ``STACK_TILES`` tiles of ``G`` groups; None where a check fails (the loop then runs as
    written, and reports what fails)."""
    ctx, regs = k.ctx, k.regs
    env = ctx.env
    call, tab = nest.call, nest.tab
    for name in nest.operands:
        if not regs.declared(call.arg(name).buffer):
            return None
    saved = {n: env[n] for n in nest.names if n in env}
    iters = list(itertools.product(*(range(e) for e in nest.extents)))
    offs = {name: np.empty(len(iters), dtype=np.int64) for name in nest.operands}
    try:
        for i, values in enumerate(iters):
            env.update(zip(nest.names, values))
            for name in nest.operands:
                off = ctx.ev(call.arg(name).offset)
                if np.ndim(off) != 0:
                    return None
                offs[name][i] = int(off)
    finally:
        for n in nest.names:
            env.pop(n, None)
        env.update(saved)
    for name in nest.operands:
        size = call.arg(name).buffer.size
        top = tab.tile_regs[name][2]
        if (offs[name] < 0).any() or (offs[name] + top >= size).any():
            return None
    if not _independent(call, tab, offs):
        return None
    per = max(1, STACK_TILES // G)
    chunks = []
    for i0 in range(0, len(iters), per):
        part = slice(i0, min(i0 + per, len(iters)))
        chunks.append((part.stop - part.start, {name: _progression(offs[name][part]) for name in nest.operands}))
    return Plan(chunks)


def _independent(call, tab, offs) -> bool:
    """Whether no iteration writes a register that another iteration reads or writes (registers
    ``offset .. offset + top`` of each operand, a superset of those it accesses)."""
    out = call.arg(tab.output).buffer.name
    wlo = offs[tab.output]
    whi = wlo + tab.tile_regs[tab.output][2]
    other = ~np.eye(wlo.size, dtype=bool)
    for name in (*tab.inputs, tab.output):
        if call.arg(name).buffer.name != out:
            continue                        # another buffer: other registers
        lo = offs[name]
        hi = lo + tab.tile_regs[name][2]
        meet = (wlo[:, None] <= hi[None, :]) & (lo[None, :] <= whi[:, None])
        if (meet & other).any():
            return False
    return True


def _progression(offs: np.ndarray):
    """``(first, step)`` where the offsets step evenly (one cached index then serves every chunk
    alike), else the offsets themselves."""
    steps = np.diff(offs)
    if steps.size == 0:
        return int(offs[0]), 0
    if (steps == steps[0]).all():
        return int(offs[0]), int(steps[0])
    return offs.copy()


def _stack_index(k, ref: ir.RegRef, groups: np.ndarray, where, count: int, offs):
    """``(flat registers, index)``: ``flat[index]`` is the ``[count x G, E]`` stack of the tiles of
    ``ref`` at ``count`` iterations' offsets ``offs`` (``Registers.tile_index`` for several offsets
    at once; C order, so that the tiles are)."""
    lanes, regs, _ = where
    buf = ref.buffer
    flat = k.regs.flat[buf.name]
    even = isinstance(offs, tuple)
    n, step = (count, offs[1]) if even else (1, 0)
    # by identity of the (read-only, cached) thread-group and atom tables, which the entry keeps alive
    key = ("stack", id(groups), buf.size, id(lanes), n, step)
    hit = k.memo.get(key)
    if hit is None or hit[0] is not groups or hit[1] is not lanes:
        steps = np.arange(n, dtype=np.int64) * step
        idx = np.ascontiguousarray((groups[:, lanes] * buf.size + regs)[None] + steps[:, None, None])
        hit = k.memo[key] = (groups, lanes, idx.reshape(-1, idx.shape[-1]))
    if even:
        return flat[offs[0]:], hit[2]
    # uneven offsets: this chunk's own index (not cached: such chunks are rare)
    base = hit[2]
    return flat, (base[None] + offs[:, None, None]).reshape(-1, base.shape[-1])
