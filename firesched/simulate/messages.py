"""One-line descriptions of statements and operands, for hazard and error messages.

A hazard is only useful if the reader can find the statement in the IR dump and the CUDA source,
so every message names the statement the way ``repr`` of the IR would not: the atom, its operands
(``SH``/``GL`` buffer and offset expression), its predicate and the lowering's comment.
"""

from __future__ import annotations

from .. import ir

# thread and offset lists in messages are cut after this many entries: enough to see the pattern
MAX_LISTED = 4


def describe(stmt) -> str:
    """A one-line description of a statement, for error messages."""
    if isinstance(stmt, ir.AtomCall):
        args = ", ".join(f"{n}={ref_str(r)}" for n, r in stmt.args)
        pred = "" if isinstance(stmt.pred, int) and stmt.pred == 1 else f" if ({stmt.pred})"
        note = f"  // {stmt.comment}" if stmt.comment else ""
        return f"AtomCall {stmt.atom!r}({args}){pred}{note}"
    if isinstance(stmt, ir.Barrier):
        named = f"({stmt.bar_id}, {stmt.threads} threads)" if stmt.threads else ""
        return "Barrier" + named + (f"  // {stmt.comment}" if stmt.comment else "")
    if isinstance(stmt, ir.Roles):
        return "Roles(" + ", ".join(f"{r.name}: threads {r.first}..{r.first + r.count - 1}" for r in stmt.roles) + ")"
    if isinstance(stmt, ir.AsyncCommit):
        return "AsyncCommit"
    if isinstance(stmt, ir.AsyncWait):
        return f"AsyncWait({stmt.pending})"
    if isinstance(stmt, ir.RegFill):
        return f"RegFill({ref_str(stmt.ref)} x{stmt.count} = {stmt.value})"
    if isinstance(stmt, ir.Pointwise):
        srcs = ", ".join(ref_str(s) if isinstance(s, ir.RegRef) else repr(s) for s in stmt.srcs)
        return f"Pointwise({ref_str(stmt.dst)} = {stmt.op}({srcs}))"
    if isinstance(stmt, ir.For):
        return f"For({stmt.var} < {stmt.extent})"
    if isinstance(stmt, ir.If):
        return f"If({stmt.cond})"
    return type(stmt).__name__


def ref_str(ref) -> str:
    """An operand as a message shows it: ``SH a[offset]``, ``GL x[offset]``, ``r[offset]``, ..."""
    if isinstance(ref, ir.MemRef):
        kind = "GL" if isinstance(ref.buffer, ir.GlobalBuffer) else "SH"
        return f"{kind} {ref.buffer.name}[{ref.offset}]"
    if isinstance(ref, ir.RegRef):
        return f"{ref.buffer.name}[{ref.offset}]"
    if isinstance(ref, ir.DescRef):
        return f"desc(SH {ref.buffer.name}[{ref.offset}], sw{ref.swizzle}, lbo {ref.lbo}, sbo {ref.sbo})"
    if isinstance(ref, ir.Scalar):
        return str(ref.value)
    if isinstance(ref, ir.TensorMapParam):
        return f"tmap {ref.name}"
    return repr(ref)


def listing(items) -> str:
    """``"0, 1, 2, 3, ... (40 in all)"``: thread ids or offsets, cut after ``MAX_LISTED``."""
    items = list(items)
    s = ", ".join(str(int(i)) for i in items[:MAX_LISTED])
    return s + (f", ... ({len(items)} in all)" if len(items) > MAX_LISTED else "")
