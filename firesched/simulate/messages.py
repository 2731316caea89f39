"""One-line descriptions of statements and operands, for hazard and error messages.

A hazard is only useful if the reader can find the statement in the IR dump and the CUDA source,
so every message names the statement the way ``repr`` of the IR would not: the atom, its operands
(``SH``/``GL`` buffer and offset expression), its predicate and the lowering's comment.
"""

from __future__ import annotations

from .. import ir
from ..errors import InternalError

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
        return ("BarrierArrive" if stmt.arrive else "Barrier") + named + (f"  // {stmt.comment}" if stmt.comment else "")
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
        stop = "" if stmt.stop is None else f", stop {stmt.stop}"
        return f"For({stmt.var} < {stmt.extent}{stop})"
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


# --------------------------------------------------------------------------- provenance

def short_spec(spec) -> str:
    """``Move<warp>(A:SH -> A:RF)``: a spec's kind, level and operands, without tile shapes."""
    outs = [t for t in spec.outputs]
    ins = [t for t in spec.operands if all(t is not o for o in outs)]
    names = ", ".join(f"{t.name}:{t.memory.name}" for t in ins)
    return f"{type(spec).__name__}<{spec.level}>({names} -> {', '.join(f'{t.name}:{t.memory.name}' for t in outs)})"


def strategy_of(path) -> str:
    """The strategy a hazard is blamed on: the one that refined the node (its own rule emitted the
    statement), else the one that made it (an open move, an init or an atom leaf is made by the
    strategy of the node above it)."""
    node = path[-1]
    if node.strategy is not None and not node.children and not node.loops and len(path) > 1 \
            and path[-2].strategy is not None:
        return f"{node.strategy} under {path[-2].strategy}"     # a thread's leaf, done()
    if node.strategy is not None:
        return str(node.strategy)
    for up in reversed(path[:-1]):
        if up.strategy is not None:
            return str(up.strategy)
    return f"the lowering of {short_spec(node.spec)}"


def node_line(path) -> str:
    """The node of a path, with the strategy that refined or made it and its pipelined loops."""
    node = path[-1]
    how = "refined by" if node.strategy is not None else "made by"
    loops = "; loops " + ", ".join(str(lp) for lp in node.loops) if node.loops else ""
    return f"{node.spec}, {how} {strategy_of(path)}{loops}"


def _value(ctx, x, thread: int) -> str:
    """Index expression ``x`` for ``thread`` now, or the expression where it cannot be evaluated
    here (a variable of a loop the statement is no longer in)."""
    if isinstance(x, int):
        return str(x)
    try:
        return str(int(ctx.per_thread(x)[thread]))
    except (KeyError, IndexError, NameError, InternalError):   # a loop variable not bound here
        return str(x)


def coordinates(ctx, origin, thread: int) -> str:
    """``thread 1 = block m0=0, n0=1; warp m1=1, n1=0; loops k0=2``: which unit a thread is, in the
    schedule's loop names, and the sequential loops the interpreter is in."""
    parts, by_unit = [], {}
    for var, unit, x in origin.coords:
        by_unit.setdefault(unit, []).append(f"{var}={_value(ctx, x, thread)}")
    parts += [f"{unit} {', '.join(vs)}" for unit, vs in by_unit.items()]
    if ctx.loops:
        parts.append("loops " + ", ".join(f"{n}={v}" for n, v in ctx.loops))
    return f"thread {thread}" + (" = " + "; ".join(parts) if parts else "")


def tiles(ctx, origin, thread: int) -> str:
    """``A:SH[m 16:32, k 0:16], A:RF[m 0:16, k 0:16]``: where the node's tiles are for ``thread``
    (global tensors in elements of the tensor; on-chip ones in their frame)."""
    out = []
    for name, dims in origin.tiles:
        rng = []
        for d, start, n in dims:
            s = _value(ctx, start, thread)
            rng.append(f"{d} {s}:{int(s) + n}" if s.lstrip("-").isdigit() else f"{d} {s} (+{n})")
        out.append(f"{name}[{', '.join(rng)}]")
    return ", ".join(out)


def common_node(a, b):
    """The innermost node on both paths (by identity), or None."""
    last = None
    for x, y in zip(a, b):
        if x is not y:
            break
        last = x
    return last


def provenance(ctx, stmt, message: str, *, thread=None, other=None, other_thread=None, on=None):
    """``(first line, detail lines)`` of a hazard at ``stmt``: the kind of hazard, the buffer and
    the strategy at fault first; then the schedule node, the thread's units and tiles, the node of
    the other statement involved (``other``: the racing write or read, the copy in flight) and the
    innermost node around both, whose lowering orders them.  Statements with no ``origin``
    (hand-written IR) get the kind alone."""
    kind = message.split(": ", 1)[0]
    if len(kind) > 100:
        kind = kind[:97] + "..."
    head = kind + (f" on {on}" if on else "")
    origin = getattr(stmt, "origin", None)
    other_origin = getattr(other, "origin", None)
    lines = []
    if origin is not None and origin.path:
        head += f" in {strategy_of(origin.path)}"
        lines.append(f"this side: {node_line(origin.path)}")
        if thread is None:
            act = ctx.active()
            thread = int(act[0]) if act.size else None
        if thread is not None:
            lines.append(f"  {coordinates(ctx, origin, int(thread))}")
            if origin.tiles:
                lines.append(f"  tiles {tiles(ctx, origin, int(thread))}")
    if other_origin is not None and other_origin.path:
        head += f", against {strategy_of(other_origin.path)}"
        who = f"; thread {int(other_thread)}" if other_thread is not None else ""
        lines.append(f"other side: {node_line(other_origin.path)}{who}")
        if origin is not None and origin.path:
            around = common_node(origin.path, other_origin.path)
            if around is not None:
                up = _path_to(origin.path, around)
                looped = next((i for i in range(len(up), 0, -1) if up[i - 1].loops), None)
                inside = ""
                if looped is not None and looped < len(up):
                    inside = (f"; inside its loop {', '.join(str(lp) for lp in up[looped - 1].loops)} of "
                              f"{strategy_of(up[:looped])}")
                lines.append(f"between them: {node_line(up)}{inside} (the innermost schedule node around both: "
                             f"its lowering places what orders them, barriers and waits)")
    if origin is not None and origin.path:
        chain = [str(n.strategy) for n in origin.path if n.strategy is not None]
        if chain:
            lines.append("schedule path (from the block): " + " / ".join(chain))
    return head, lines


def _path_to(path, node):
    for i, n in enumerate(path):
        if n is node:
            return path[:i + 1]
    return path
