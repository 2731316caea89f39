"""Loads kept in flight across the iterations of a rolled loop.

A loop the lowering leaves rolled (it walks shared memory or global memory, not registers) runs
its body once an iteration: its loads, then what uses them.  Where an iteration loads a few bytes
a thread from global memory, each iteration waits a whole memory latency — a row of odd length
copied element by element into shared memory, a masked row loaded into registers and stored to
shared memory, the sum of two rows.  The loads of the iteration are volatile asm (they keep their
order with the stores around them), so neither NVRTC nor ptxas hoists the next iteration's loads
above this one's stores.  This pass does, wherever it is safe: the loads of ``B`` iterations
first, into ``B`` copies of their registers, then the rest of the ``B`` iterations in order::

    for it in 0..n:                          for ob in 0..ceil(n / B):
        x = ld.global X[f(it)]                   for j in 0..B (unrolled): if ob*B+j < n:
        y = op(x); st.shared Y[g(it)], y   ->        x'[j] = ld.global X[f(ob*B+j)]
                                                 for j in 0..B (unrolled): if ob*B+j < n:
                                                     y = op(x'[j]); st.shared Y[g(ob*B+j)], y

Safe means: the body is straight-line (atom calls, element-wise ops, register fills, branches of
those, comments: no barrier, no nested loop, no asynchronous copy or wait); its leading
statements are loads (an atom call from memory into registers), one of them from global memory;
no statement of the body writes a buffer those loads read (so an earlier load cannot overtake
the store it depends on); and the loads' registers are the iteration's own (nothing outside the
loop refers to them).  The loads of later iterations then read what they would have read, and
every other statement runs in its original order.

Loads further down the body lead it too where nothing before them touches their registers or
writes what they read: a later operand's plain loads, and the loads at the head of a branch,
predicated on its condition (a disabled load zeroes its registers, which the branch then does
not read)::

    x = ld X[..]                             x = ld X[..]
    if (in): w0 = ld W[..]; w1 = ld W[..]    w0 = ld W[..] if in;  w1 = ld W[..] if in
             w = shift(w0, w1, q)      ->    if (in): w = shift(w0, w1, q)
    if (!in): w = ld W[..] one by one        if (!in): w = ld W[..] one by one

(the shifted runs of a weight in an aligned window, ``threads.shifted_run``).  Loops of fewer than
``HOISTED_FROM`` iterations take their leading loads only: the hoisted loads' registers stay live
across the batch.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...hardware.atoms.base import CONVERT, COPY
from ...ir.expr import Var, land, lt
from ...ir.rewrite import flat, map_operand, map_stmt, substitute_stmt
from ..liveness import register_uses

#: the most iterations a batch takes
MAX_BATCH = 8
#: the share of a thread's registers (what the block's size and occupancy leave it) the copies of
#: a batch's loads may take, a 16-bit value a whole register: loads of whole 16-byte vectors up to
#: a half, element loads (at most ``ELEMENT_REGISTERS`` an iteration) a sixth.  Measured on an
#: H100 (bf16 and f16 staged rows, 65,536 to 262,144 columns, six blocks of 256 threads an SM):
#: causal softmax's masked row 2.3-2.65 -> 2.3-2.7 TB/s and add + RMSNorm 2.5-2.85 -> 2.8-2.95 with
#: vectors batched up to half the registers; LayerNorm's odd rows (three element loads an
#: iteration: row, weight, bias) spilled 8-104 bytes at that budget
VECTOR_SHARE = 2
ELEMENT_SHARE = 6
ELEMENT_REGISTERS = 2
#: the fewest iterations of a loop whose batch takes loads from further down its body (branches,
#: later operands).  Measured on an H100 (bf16, LayerNorm and RMSNorm rows in shared memory in
#: their aligned window, the weight's shifted runs, TB/s batched / not): LayerNorm 8192 x 6001
#: (3 passes) 1.67 / 2.18, 4096 x 8191 (5) 1.60 / 1.85, 2048 x 16383 (9) 1.87 / 1.85, 1024 x
#: 24569 (12) 1.94 / 1.80, 1024 x 32767 (17) 1.79 / 1.45; RMSNorm 2.68 / 2.70, 2.52 / 2.59,
#: 2.52 / 2.45, 2.39 / 2.27, 2.30 / 1.98
HOISTED_FROM = 8


def batched_loads(body: list, kb) -> list:
    """``body`` (a kernel's statements) with every rolled loop that qualifies (module docstring)
    batched; ``kb`` the kernel builder whose register arrays the batches take."""
    events: list = []
    spans: dict = {}
    _events(ir.Seq(tuple(body)), events, spans)
    return [_walk(s, kb, events, spans) for s in body]


def _walk(s, kb, events, spans):
    if isinstance(s, ir.Seq):
        return ir.Seq(tuple(_walk(x, kb, events, spans) for x in s.body))
    if isinstance(s, ir.If):
        return ir.If(s.cond, _walk(s.then, kb, events, spans))
    if isinstance(s, ir.Roles):
        return s
    if isinstance(s, ir.For):
        if not s.unroll and s.stop is None:
            done = _batch(s, kb, events, spans[id(s)])
            if done is not None:
                return done
        return ir.For(s.var, s.extent, _walk(s.body, kb, events, spans), s.unroll, s.stop)
    return s


def _events(s, out: list, spans: dict) -> None:
    """The register arrays each leaf statement of ``s`` reads and writes, in program order, into
    ``out`` as ``(reads, writes)``; ``spans`` maps each loop (by id) to its range of events."""
    if isinstance(s, ir.Seq):
        for x in s.body:
            _events(x, out, spans)
    elif isinstance(s, ir.For):
        start = len(out)
        _events(s.body, out, spans)
        spans[id(s)] = (start, len(out))
    elif isinstance(s, ir.If):
        _events(s.then, out, spans)
    elif isinstance(s, ir.Roles):
        for r in s.roles:
            _events(r.body, out, spans)
    else:
        uses = register_uses(s)
        out.append(({n for n, w in uses if not w}, {n for n, w in uses if w}))


def _dead_after(name: str, events: list, span: tuple[int, int]) -> bool:
    """Whether register array ``name`` is written before it is read after the loop of ``span``
    (in program order, then around to the kernel's start, for the loops that enclose it)."""
    start, end = span
    for reads, writes in events[end:] + events[:start]:
        if name in reads:
            return False
        if name in writes:
            return True
    return True


def _straight(s) -> bool:
    """Whether ``s`` is straight-line code this pass may reorder across iterations."""
    if isinstance(s, ir.Seq):
        return all(_straight(x) for x in s.body)
    if isinstance(s, ir.If):
        return _straight(s.then)
    if isinstance(s, ir.AtomCall):
        # synchronous loads and stores, and register-only conversions (a shifted run's values)
        return s.atom.family in (COPY, CONVERT)
    return isinstance(s, (ir.Pointwise, ir.RegFill, ir.Comment))


def _is_load(s) -> bool:
    if not isinstance(s, ir.AtomCall) or s.atom.family != "copy":
        return False
    args = dict(s.args)
    return isinstance(args.get("dst"), ir.RegRef) and isinstance(args.get("src"), ir.MemRef)


def _leaves(stmts):
    """The leaf statements of ``stmts``, through sequences and branches."""
    for s in stmts:
        for x in flat([s]):
            if isinstance(x, ir.If):
                yield from _leaves([x.then])
            else:
                yield x


def _written_buffers(stmts) -> set:
    """Names of the memory buffers ``stmts`` write (through branches)."""
    return {dict(x.args)["dst"].buffer.name for x in _leaves(stmts)
            if isinstance(x, ir.AtomCall) and isinstance(dict(x.args).get("dst"), ir.MemRef)}


def _leading(stmts: list, hoist: bool) -> tuple[list, list]:
    """(loads, rest): the loads that may lead the body — its leading loads, and with ``hoist``
    loads further down, or at the head of a branch (predicated on its condition), that nothing
    before them touches (their registers) or writes (what they read) — and the other statements
    in order (module docstring)."""
    loads, rest = [], []
    touched, written = set(), set()       # the registers and the memory of rest

    def free(x) -> bool:
        args = dict(x.args)
        return args["dst"].buffer.name not in touched and args["src"].buffer.name not in written

    def keep(s) -> None:
        rest.append(s)
        touched.update(n for x in _leaves([s]) for n, _ in register_uses(x))
        written.update(_written_buffers([s]))

    for s in stmts:
        if _is_load(s) and (not rest or (hoist and free(s))):
            loads.append(s)
            continue
        if hoist and isinstance(s, ir.If):
            body = [x for x in flat([s.then]) if not isinstance(x, ir.Comment)]
            k = 0
            while k < len(body) and _is_load(body[k]) and free(body[k]):
                k += 1
            if k:
                loads += [attrs.evolve(x, pred=land(s.cond, x.pred)) for x in body[:k]]
                if body[k:]:
                    keep(ir.If(s.cond, ir.Seq(tuple(body[k:]))))
                continue
        keep(s)
    return loads, rest


def _batch(loop: ir.For, kb, events: list, span: tuple[int, int]) -> ir.For | None:
    stmts = [x for x in flat([loop.body]) if not isinstance(x, ir.Comment)]
    if loop.extent < 2 or not stmts or not all(_straight(x) for x in stmts):
        return None
    loads, rest = _leading(stmts, hoist=loop.extent >= HOISTED_FROM)
    if not loads or not rest:
        return None
    srcs = {dict(s.args)["src"].buffer for s in loads}
    if not any(isinstance(b, ir.GlobalBuffer) for b in srcs):
        return None
    if {b.name for b in srcs} & _written_buffers(rest + loads):
        return None
    # in the order of the loads: the batch registers are declared in it (a set would print them
    # in an order of the process's hashing, a different source each run)
    regs = list(dict.fromkeys(dict(s.args)["dst"].buffer for s in loads))
    if not all(_dead_after(b.name, events, span) for b in regs):
        return None                     # a later statement reads what the loop's last load left
    per_iter = sum(-(-s.atom.width // 4) for s in loads)
    if all(s.atom.width == 16 for s in loads):
        share = VECTOR_SHARE
    elif per_iter <= ELEMENT_REGISTERS:
        share = ELEMENT_SHARE
    else:
        return None
    cap = kb.target.thread_regs(kb.threads, kb.min_blocks_per_sm)
    batch = min(MAX_BATCH, loop.extent, cap // share // max(1, per_iter))
    if batch < 2:
        return None
    outer = -(-loop.extent // batch)
    ob, j = Var(f"{loop.var.name}_b", outer), Var(f"{loop.var.name}_j", batch)
    it = ob * batch + j
    wide = {b.name: kb.reg(f"{b.name}_batch", b.dtype, b.size * batch) for b in regs}
    sizes = {b.name: b.size for b in regs}

    def widen(r):
        if isinstance(r, ir.RegRef) and r.buffer.name in wide:
            return ir.RegRef(wide[r.buffer.name], j * sizes[r.buffer.name] + r.offset)
        return map_operand(r, lambda x: x)

    def part(stmts, loads: bool):
        body = substitute_stmt(map_stmt(ir.Seq(tuple(stmts)), lambda x: x, widen), {loop.var: it})
        if outer * batch != loop.extent:
            # the last batch reaches past the loop: its loads are predicated off, the rest skipped
            live = lt(it, loop.extent)
            body = ir.Seq(tuple(attrs.evolve(s, pred=land(live, s.pred)) for s in body.body)) if loads else \
                ir.If(live, body)
        return ir.For(j, batch, body, unroll=True)

    return ir.For(ob, outer, ir.Seq((ir.Comment(f"the loads of {batch} iterations in flight at a time"),
                                     part(loads, True), part(rest, False))))
