"""Issue each wgmma of a step as soon as the registers it reads as A are written.

A body that fills a wgmma's A fragment in registers (a dequantising move) and then issues the
step's wgmmas, one per k16, lowers to "fill the whole fragment, fence, issue them all"::

    fill k16 steps 0-1 | fill 2-3 | fill 4-5 | fill 6-7 | fence | wgmma 0 .. wgmma 7
                                                                 ^ the tensor cores start here

The wgmma is asynchronous and each reads only its own k16 slice of the fragment, so the same
statements in a different order let the tensor cores start after the first slice, while the
threads fill the next ones::

    fill 0-1 | fence | wgmma 0, 1 | fill 2-3 | fence | wgmma 2, 3 | fill 4-5 | ...

``issue_when_ready`` moves each wgmma up to just after the last statement that writes a register
of its A slice (never before an earlier wgmma: they accumulate in order), with a fence before each
batch (PTX: a register write and a wgmma reading that register need a ``wgmma.fence`` between
them).  Nothing else moves, so the fill's own order decides how early each slice is ready
(``rules.dequant`` fills the fragment front to back).  The statements left after a wgmma write
other registers than those it reads, and never its accumulator: the pass applies only where that
holds, and returns None elsewhere (the body is then issued as it was).  Statements after the last
wgmma (the wait and the scaling of ``scale_partials``' group partial products) stay after it.
"""

from __future__ import annotations

from ... import ir
from ...hardware.atoms import sm90a
from ...hardware.atoms.base import WGMMA
from ...ir.rewrite import flat

#: the statements a fill may hold (anything else, such as a loop, a branch or a barrier, keeps the
#: body as it is)
_FILL = (ir.AtomCall, ir.Pointwise, ir.RegFill, ir.Comment)


def _is_wgmma(st) -> bool:
    return isinstance(st, ir.AtomCall) and st.atom.family == WGMMA


def _is_fence(st) -> bool:
    return isinstance(st, ir.AtomCall) and st.atom.name == sm90a.wgmma_fence.name


def _spans(st, roles: tuple[str, ...]):
    """``(buffer name, first, end)`` of the registers ``st`` accesses in ``roles`` ("in", "out",
    "inout"); None where an offset is not a constant."""
    out = []
    if isinstance(st, ir.AtomCall):
        ops = {op.name: op for op in st.atom.operands}
        for name, a in st.args:
            op = ops.get(name)
            if op is None or not isinstance(a, ir.RegRef) or op.role not in roles:
                continue
            if not isinstance(a.offset, int):
                return None
            # a copy atom moves its width in bytes, however many elements of the buffer that is
            n = (st.atom.values_for(a.buffer.dtype) if st.atom.width else 0) or op.values
            out.append((a.buffer.name, a.offset, a.offset + n))
    elif isinstance(st, ir.Pointwise):
        refs = ([st.dst] if "out" in roles else []) + \
            ([s for s in st.srcs if isinstance(s, ir.RegRef)] if "in" in roles else [])
        for r in refs:
            if not isinstance(r.offset, int):
                return None
            out.append((r.buffer.name, r.offset, r.offset + 1))
    elif isinstance(st, ir.RegFill) and "out" in roles:
        if not isinstance(st.ref.offset, int):
            return None
        out.append((st.ref.buffer.name, st.ref.offset, st.ref.offset + st.count))
    return out


def _overlap(a, b) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def issue_when_ready(body: list) -> list | None:
    """``body`` (a fill of wgmma A registers, a fence, the wgmmas) with each wgmma issued once its
    A registers are written, a fence before each batch (module docstring); None where the body
    is not of that form."""
    stmts = flat(body)
    first = next((i for i, s in enumerate(stmts) if _is_wgmma(s)), None)
    if first is None:
        return None
    while first > 0 and isinstance(stmts[first - 1], ir.Comment):
        first -= 1              # the first wgmma's comments go with it
    fill = [s for s in stmts[:first] if not _is_fence(s)]
    # what follows the last wgmma (a wait for the group and the scaling of its partial products:
    # rules.partials) stays after it, in order
    last = max(i for i, s in enumerate(stmts) if _is_wgmma(s))
    steps, tail = stmts[first:last + 1], stmts[last + 1:]
    if not all(isinstance(s, _FILL) for s in fill) or not all(_is_wgmma(s) or isinstance(s, ir.Comment)
                                                               for s in steps):
        return None
    # each wgmma with the comments before it
    mmas, lead = [], []
    for s in steps:
        if _is_wgmma(s):
            mmas.append((lead, s))
            lead = []
        else:
            lead.append(s)
    if len(mmas) < 2 or lead:
        return None
    accs, reads = set(), []
    for _, m in mmas:
        a = _spans(m, ("in",))
        d = _spans(m, ("inout", "out"))
        if a is None or d is None or not a:
            return None
        accs |= {name for name, _, _ in d}
        reads.append(a)
    writes = []
    for s in fill:
        w = _spans(s, ("out", "inout"))
        r = _spans(s, ("in", "inout"))
        if w is None or r is None:
            return None
        if isinstance(s, ir.AtomCall) and any(isinstance(a, ir.MemRef) and op.role != "in"
                                              for op in s.atom.operands for n, a in s.args if n == op.name):
            return None          # a store: it stays before the wgmmas that may read its memory
        if any(name in accs for name, _, _ in w + r):
            return None          # the accumulator is the wgmmas' until they retire
        writes.append(w)
    # the fill statement after which each wgmma is ready (-1: before any), in issue order
    at, ready = [], -1
    for a in reads:
        last = max((i for i, w in enumerate(writes) if any(_overlap(x, y) for x in w for y in a)), default=-1)
        ready = max(ready, last)
        at.append(ready)
    if at[0] == len(fill) - 1:
        return None              # the first wgmma needs the whole fill: nothing to overlap
    out: list = []

    def issue(after: int):
        batch = [(c, m) for (c, m), pos in zip(mmas, at) if pos == after]
        if batch:
            out.append(ir.AtomCall(sm90a.wgmma_fence, (), comment="the next k16 slices of the fragment are ready"))
            for c, m in batch:
                out.extend(c)
                out.append(m)

    issue(-1)
    for i, s in enumerate(fill):
        out.append(s)
        issue(i)
    return out + tail


__all__ = ["issue_when_ready"]
