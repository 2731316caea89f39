"""Register pressure of a kernel body: the most register words a thread holds live at once.

Summing every register buffer of a kernel overstates what it needs when buffers live at
different times: attention's scores ``S`` and probabilities ``P`` of one key tile, the K
fragments of the first MatMul and the V fragments of the second are never all live together.
``check()`` refuses a kernel whose *peak* exceeds the target's registers, so it needs lifetimes.

The body is read in program order, one position per leaf statement.  A buffer lives from its
first use to its last; a loop stretches that:

* a buffer used inside a loop and outside it lives through the whole loop (its value enters or
  leaves the loop: the running max of attention, a GEMM's accumulator);
* a buffer used only inside a loop whose first use there is a read carries a value from one
  iteration to the next: it also lives through the whole loop::

      pos:   0      1 ... 5 [ 6   7   8   9 ] 10
             init O         [ S=  m=  P=  O+=]  store O        O: 0..10   S: 6..8   P: 8..9
                            └─ for kv ───────┘

The result is an estimate of what the code asks for, not of what ptxas allocates (it adds
addresses, loop state and predicates: ``driver.REG_OVERHEAD``); a compiled kernel that spills
anyway warns with its spill bytes.
"""

from __future__ import annotations

import attrs

from .. import ir
from ..ir.rewrite import map_stmt


@attrs.frozen
class Pressure:
    """The peak: register words live at once, and the buffers live there (name -> words)."""

    words: int
    live: tuple[tuple[str, int], ...]


def words_of(buf: ir.RegBuffer) -> int:
    """32-bit registers a buffer takes (16-bit values pack two to a register)."""
    return -(-int(buf.size) * buf.dtype.bits // 32)


def register_uses(st) -> list[tuple[str, bool]]:
    """(buffer name, is a write) for every register operand of one leaf statement."""
    if isinstance(st, ir.RegFill):
        return [(st.ref.buffer.name, True)]
    if isinstance(st, ir.Pointwise):
        out = [(s.buffer.name, False) for s in st.srcs if isinstance(s, ir.RegRef)]
        return out + [(st.dst.buffer.name, True)]
    if isinstance(st, ir.AtomCall):
        out = []
        for name, ref in st.args:
            if isinstance(ref, ir.RegRef):
                try:
                    role = st.atom.operand(name).role
                except KeyError:
                    role = "in"
                out.append((ref.buffer.name, role == "out"))
        return sorted(out, key=lambda u: u[1])     # an instruction reads its inputs before it writes
    refs: list = []

    def grab(r):
        if isinstance(r, ir.RegRef):
            refs.append(r.buffer.name)
        return r

    map_stmt(st, lambda x: x, grab)
    return [(n, False) for n in refs]      # unknown statements: reads (the longer lifetime)


def pressure(body, regs: dict) -> Pressure:
    """The peak register words of ``body`` over the buffers ``regs`` (name -> ``RegBuffer``)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    loops: list[tuple[int, int, dict]] = []      # (start, end, {name: first use is a read})
    pos = 0
    open_loops: list[tuple[int, dict]] = []

    def visit(st):
        nonlocal pos
        if st is None:
            return
        if isinstance(st, (list, tuple)):
            for c in st:
                visit(c)
        elif isinstance(st, ir.Seq):
            for c in st.body:
                visit(c)
        elif isinstance(st, ir.For):
            seen: dict = {}
            open_loops.append((pos, seen))
            visit(st.body)
            start, _ = open_loops.pop()
            loops.append((start, pos - 1, seen))
        elif isinstance(st, ir.If):
            visit(st.then)
        elif isinstance(st, ir.Roles):
            for r in st.roles:
                visit(r.body)
        else:
            for name, write in register_uses(st):
                if name not in regs:
                    continue
                first.setdefault(name, pos)
                last[name] = pos
                for _, seen in open_loops:
                    seen.setdefault(name, not write)
            pos += 1

    visit(body)
    span = {n: [first[n], last[n]] for n in first}
    for start, end, seen in loops:
        for name, read_first in seen.items():
            s = span[name]
            if read_first or s[0] < start or s[1] > end:
                s[0], s[1] = min(s[0], start), max(s[1], end)
    if not span:
        return Pressure(0, ())
    # sweep: +words at a span's start, -words after its end
    events: dict[int, int] = {}
    for name, (a, b) in span.items():
        w = words_of(regs[name])
        events[a] = events.get(a, 0) + w
        events[b + 1] = events.get(b + 1, 0) - w
    best, at, run = 0, 0, 0
    for p in sorted(events):
        run += events[p]
        if run > best:
            best, at = run, p
    live = tuple(sorted(((n, words_of(regs[n])) for n, (a, b) in span.items() if a <= at <= b),
                        key=lambda x: -x[1]))
    return Pressure(best, live)


__all__ = ["Pressure", "pressure", "words_of"]
