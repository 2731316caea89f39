"""Rules of ``on_fragments()`` leaves: element-wise work and reductions on the register fragments
the threads hold (``lower.fragments`` says which element each register holds).

Each register of the output is computed from the registers of the inputs that hold the same
element in the same lane (an input over fewer dims — a row vector — is broadcast: every
register of a row reads that row's register); nothing moves between threads::

    O *= alpha (rows):     for each register i of O:  o[i] = o[i] * alpha[row slot of i]
    P = S (cvt to f16):    p[map(i)] = cvt(s[i])     (the m16n8 accumulator and the A operand of
                                                      m16n8k16 hold the same elements per lane)

A reduction folds the thread's registers of each output element, then finishes across the lanes
that share it with butterfly shuffles::

    mx = rowmax(S):  mx[j] = max(s[i] for i of row j);  mx[j] = max(mx[j], shfl.bfly(mx[j], 1));
                     mx[j] = max(mx[j], shfl.bfly(mx[j], 2))

Positional ops (``ops.causal``, ``ops.edge``) read the element's coordinate in the kernel's
tensors: the origin the global tensors over that dim have reached (the block's tile, the key
loop's step) plus the register's place in the unit's part.  An edge mask is left out where the
tiles divide the tensor.  A store to global memory (attention's log-sum-exp) is written by the
first lane of each group of replicas, predicated at the tensor's edge.
"""

from __future__ import annotations

from ... import ir
from ... import ops as fops
from ...dtypes import f32
from ...hardware.atoms import catalog
from ...ir.expr import ge, land, lt
from ...schedule import Node
from ...spec import Move, Pointwise, Reduce
from ...tensor import GL, RF
from ..context import err, key
from ..fragments import FragTable, register_map, table_of
from ..lowerer import Lowerer, fragment_rule
from .smem import gl_offset
from .threads import butterfly, scalar_steps

COMBINE = {"sum": "add", "mean": "add", "max": "max", "min": "min"}
IDENTITY = {"add": 0.0, "max": float("-inf"), "min": float("inf")}


def _table(lw: Lowerer, tile, node: Node) -> FragTable:
    lay = lw.rf.get(tile.tensor)
    if lay is None:
        raise err(node, f"register tensor {tile.name} is held by no fragment", field=tile.name,
                  fix="combine it with an MMA's operand, or give it to an MMA")
    t = table_of(lay)
    if tuple(tile.shape) != tuple(tile.tensor.shape):
        raise err(node, f"on_fragments() works on whole register tensors; {tile.name}'s tile is "
                        f"{'x'.join(map(str, tile.shape))} of {'x'.join(map(str, tile.tensor.shape))}",
                  fix="apply on_fragments() to the spec before tiling it")
    if t.replicas:
        raise err(node, f"{tile.name} holds partial results over units ({', '.join(v for v, _ in t.replicas)}), "
                        "which element-wise work cannot read", fix="drop split_k(..., across=WARP) from its MMA")
    return t


def _buffer(lw: Lowerer, tile, t: FragTable) -> ir.RegBuffer:
    """The registers of ``tile``: an MMA's A or B fragments, or an accumulator (C, a row vector)."""
    frag = t.key == t.base.key and t.base.operand in ("a", "b")
    return lw.kb.reg(f"{tile.name}_frag" if frag else f"{tile.name}_acc", tile.dtype, t.size)


def _same_units(node: Node, ctx, a: FragTable, b: FragTable) -> None:
    """``b``'s parts per unit must be ``a``'s along ``b``'s dims: the same warps hold the same rows."""
    def units(t):
        return sorted((d, c, s, ctx.spans.get(v)) for d, c, s, v in t.par if d in b.dims)
    if units(a) != units(b) or a.lanes != b.lanes:
        raise err(node, f"{a.key.name} and {b.key.name} are split over units differently "
                        f"({_describe(a)} vs {_describe(b)}): a thread would need elements another thread holds",
                  fix="map the MMAs that produce and consume them onto the same warps (the same tile(...) >> to_warps())")


def _describe(t: FragTable) -> str:
    return ", ".join(f"{d} over {c} units" for d, c, _, _ in t.par) or "one unit"


def _lane(ctx, t: FragTable):
    return ctx.scope.tid % t.lanes


def _global(ctx, node: Node, t: FragTable, i: int) -> dict:
    """The kernel-level coordinates of register ``i``'s element (an expression of the lane), and
    the global tensor that gives each dim's origin."""
    local = t.coord(_lane(ctx, t), i)
    entered = {lp.var for lp, _ in ctx.units}
    out = {}
    for d in t.dims:
        src = _origin_of(ctx, d)
        if src is None:
            raise err(node, f"a positional op reads the {d} coordinate, which no global tensor of the kernel has",
                      fix="mask along a dim of the kernel's tensors")
        c = src[d] + local[d]
        for pd, _c, s, var in t.par:
            if pd == d and var not in entered:
                c = c + ctx.vars[var] * s
        out[d] = c
    return out


def _origin_of(ctx, d: str):
    for k in sorted(ctx.origin):
        if k[1] == "GL" and d in ctx.origin[k]:
            return ctx.origin[k]
    return None


def _extent_of(lw: Lowerer, d: str) -> int | None:
    for t in lw.pb.spec.operands:
        if t.memory == GL and d in t.tensor.dims:
            return t.tensor.extent(d)
    return None


def _masked(lw: Lowerer, node: Node, ctx, op, t: FragTable, i: int, coord=None):
    """The predicate under which ``op`` masks register ``i`` (1: never, an expression otherwise)."""
    if isinstance(op, fops.CausalMask):
        if (op.row, op.col, op.diagonal) in ctx.unmasked:
            return 0            # a loop step wholly on the visible side of the diagonal
        for d in (op.row, op.col):
            if d not in t.dims:
                raise err(node, f"{op} names dim {d!r}, which {t.key.name} lacks (dims: {', '.join(t.dims)})",
                          field="ops", value=str(op))
        c = coord if coord is not None else _global(ctx, node, t, i)
        return lt(c[op.row] + op.diagonal, c[op.col])
    if isinstance(op, fops.EdgeMask):
        return _past_edge(lw, node, ctx, t, i, op.dim, coord)
    raise err(node, f"{op} is positional, and on_fragments() knows the causal and edge masks only", field="ops",
              value=str(op))


def _past_edge(lw: Lowerer, node: Node, ctx, t: FragTable, i: int, d: str, coord=None):
    """Whether register ``i``'s element lies past the kernel tensors' edge along ``d`` (0 where
    the tiles divide the tensor)."""
    ext, c = _edge(lw, node, ctx, t, i, d, coord)
    return 0 if ext is None else ge(c, ext)


def _inside(lw: Lowerer, node: Node, ctx, t: FragTable, i: int, d: str):
    """The negation of ``_past_edge``: 1 where the tiles divide the tensor."""
    ext, c = _edge(lw, node, ctx, t, i, d)
    return 1 if ext is None else lt(c, ext)


def _edge(lw: Lowerer, node: Node, ctx, t: FragTable, i: int, d: str, coord=None):
    if d not in t.dims:
        raise err(node, f"an edge mask along {d!r}, which {t.key.name} lacks (dims: {', '.join(t.dims)})")
    ext = _extent_of(lw, d)
    if ext is None:
        raise err(node, f"no global tensor of the kernel has dim {d!r}, so it has no edge to mask")
    if ext % t.key.extent(d) == 0:
        return None, None    # the tiles divide the tensor: no element lies past its edge
    c = coord if coord is not None else _global(ctx, node, t, i)
    return ext, c[d]


def _compute(lw, node, ctx, t: FragTable, i: int, op: str, args: tuple, steps, dst: ir.RegRef) -> list:
    """``dst = steps(op(*args))`` for register ``i`` of table ``t`` (in f32; one conversion into
    ``dst`` when it is narrower)."""
    wide = dst.buffer.dtype == f32
    w = dst if wide else ir.RegRef(lw.kb.reg("fw", f32, 1), 0)
    out = [ir.Pointwise(op, w, args)]
    coord = None
    for name, a in steps:
        if name == "mask":
            op_ = a[0]
            if coord is None and not isinstance(op_, fops.EdgeMask):
                coord = _global(ctx, node, t, i)
            cond = _masked(lw, node, ctx, op_, t, i, coord)
            fill = ir.RegFill(w, 1, op_.value if isinstance(op_, fops.EdgeMask) else float("-inf"))
            if not isinstance(cond, int):
                out.append(ir.If(cond, fill))
            elif cond:
                out.append(fill)
            continue
        out.append(ir.Pointwise(name, w, (w, *a)))
    if not wide:
        out.append(ir.Pointwise("cvt", dst, (w,)))
    return out


def _elementwise(lw: Lowerer, node: Node, ctx, op: str, inputs, out, ops_) -> list:
    steps = scalar_steps(ops_)
    if out.memory == GL:
        return _store(lw, node, ctx, op, inputs, out, steps)
    if out.memory != RF:
        raise err(node, f"on_fragments() writes registers or global memory; {out.name} is in {out.memory}")
    t = _table(lw, out, node)
    y = _buffer(lw, out, t)
    srcs = []
    for x in inputs:
        if x.memory != RF:
            raise err(node, f"on_fragments() reads registers; {x.name} is in {x.memory}",
                      fix=f"load {x.name} into registers first (move_to_regs)")
        tx = _table(lw, x, node)
        _same_units(node, ctx, t, tx)
        srcs.append((_buffer(lw, x, tx), register_map(t, tx, node)))
    stmts: list = [ir.Comment(str(node.spec))]
    direct = op == "copy" and not steps
    for i in range(t.size):
        args = tuple(ir.RegRef(b, m[i]) for b, m in srcs)
        if direct:
            stmts.append(ir.Pointwise("cvt" if y.dtype != args[0].buffer.dtype else "copy", ir.RegRef(y, i), args))
            continue
        stmts += _compute(lw, node, ctx, t, i, op, args, steps, ir.RegRef(y, i))
    return stmts


def _store(lw: Lowerer, node: Node, ctx, op, inputs, out, steps) -> list:
    """Element-wise work whose result goes to global memory: each element once, from the first
    lane of its replicas, predicated at the tensor's edge."""
    rf = [x for x in inputs if x.memory == RF]
    kept = tuple(d for d, s in zip(out.dims, out.shape) if s > 1 or d in (rf[0].dims if rf else ()))
    drive = next((x for x in rf if set(x.dims) == set(kept)), None)
    if drive is None:
        raise err(node, f"{out.name} is stored from the fragments of a register input over its dims "
                        f"({', '.join(kept)}); the inputs are {', '.join(x.name for x in inputs)}")
    t = _table(lw, drive, node)
    srcs = []
    for x in inputs:
        if x.memory != RF:
            raise err(node, f"on_fragments() reads registers; {x.name} is in {x.memory}")
        tx = _table(lw, x, node)
        _same_units(node, ctx, t, tx)
        srcs.append((_buffer(lw, x, tx), register_map(t, tx, node)))
    buf = lw.kb.gbuf(out, write=True)
    o = ctx.origin[key(out)]
    lim = ctx.limit.get(key(out), {})
    lane = _lane(ctx, t)
    first = land(*[lt(lane % (2 * m), m) for m in t.masks]) if t.masks else 1
    yv = lw.kb.reg(f"y_{out.name}", out.dtype, 1)
    st = catalog.copy_atom("RF", "GL", out.dtype.bits // 8)
    stmts: list = [ir.Comment(str(node.spec))]
    for i in range(t.size):
        args = tuple(ir.RegRef(b, m[i]) for b, m in srcs)
        stmts += _compute(lw, node, ctx, t, i, op, args, steps, ir.RegRef(yv, 0))
        g = _global(ctx, node, t, i)
        at = {d: o[d] for d in out.dims}
        inside = [first]
        for d in t.dims:
            at[d] = g[d]
            if d in lim:
                inside.append(lt(g[d], lim[d]))
        stmts.append(ir.AtomCall(st, (("dst", ir.MemRef(buf, gl_offset(buf, out.tensor, at))),
                                      ("src", ir.RegRef(yv, 0))), land(*inside), out.name))
    return stmts


@fragment_rule(Pointwise)
def pointwise_fragments(lw: Lowerer, node: Node, ctx) -> list:
    sp: Pointwise = node.spec
    return _elementwise(lw, node, ctx, sp.op, sp.inputs, sp.out, sp.ops)


@fragment_rule(Move)
def move_fragments(lw: Lowerer, node: Node, ctx) -> list:
    sp: Move = node.spec
    return _elementwise(lw, node, ctx, "copy", (sp.src,), sp.dst, sp.ops)


@fragment_rule(Reduce)
def reduce_fragments(lw: Lowerer, node: Node, ctx) -> list:
    sp: Reduce = node.spec
    src, dst = sp.src, sp.dst
    if src.memory != RF or dst.memory != RF:
        raise err(node, "on_fragments() reduces register fragments into registers", field="memory",
                  value=f"{src.memory} -> {dst.memory}", allowed="RF -> RF")
    ts, td = _table(lw, src, node), _table(lw, dst, node)
    _same_units(node, ctx, ts, td)
    if set(td.dims) != set(ts.dims) - set(sp.axes):
        raise err(node, f"{dst.name} must keep the dims of {src.name} that the reduction does not remove "
                        f"({', '.join(d for d in ts.dims if d not in sp.axes)}); it has {', '.join(td.dims)}")
    op = COMBINE[sp.op]
    x = _buffer(lw, src, ts)
    acc = _buffer(lw, dst, td)
    owner = register_map(ts, td, node)          # the dst register of each src register
    stmts: list = [ir.Comment(str(sp))]
    for j in range(td.size):
        r = ir.RegRef(acc, j)
        stmts.append(ir.RegFill(r, 1, IDENTITY[op]))
        for i in (i for i in range(ts.size) if owner[i] == j):
            fold = ir.Pointwise(op, r, (r, ir.RegRef(x, i)))
            inside = land(*[_inside(lw, node, ctx, ts, i, d) for d in sp.axes])
            if inside != 1:
                fold = ir.If(inside, fold)
            stmts.append(fold)
    stmts += butterfly(lw, acc, td.size, td.masks, op)
    ops_ = tuple(sp.ops)
    if sp.op == "mean":
        n = 1
        for d in sp.axes:
            n *= src.extent(d)
        ops_ = (fops.scale(1.0 / n),) + ops_
    steps = scalar_steps(ops_)
    for j in range(td.size):
        r = ir.RegRef(acc, j)
        for name, a in steps:
            if name == "mask":
                raise err(node, "a reduction's ops take no masks; mask its input", field="ops", value=str(a[0]))
            stmts.append(ir.Pointwise(name, r, (r, *a)))
    return stmts


__all__ = ["pointwise_fragments", "move_fragments", "reduce_fragments"]
