"""Launch rules of open kernel-level specs that a strategy created (rather than the user).

``split_k(parts, across=BLOCK)`` leaves ``Reduce<kernel>(sum over kp: C_part -> C)`` after the
launch that computes the partial products, and a reduction tiled onto blocks along its reduced
dim leaves ``Reduce<kernel>(sum | max | min over cp: Y_part -> Y)``: each runs as its own launch
here, one thread per pair of output elements, folding the parts in f32 and applying the ops
before the store::

    idx = 2 * (block * 128 + thread):   acc = fold_p part[p, idx .. idx+1];  ops;  out[idx ..] = cvt(acc)
"""

from __future__ import annotations

from ... import ir
from ...dtypes import f32
from ...hardware.atoms import catalog
from ...ir.expr import IntExpr, lt
from ...schedule import Node
from ...spec import Reduce
from ..context import Ctx, err
from ..lowerer import Lowerer
from ..program import KernelBuilder, ProgramBuilder
from .accumulators import apply_ops, store_values

REDUCE_THREADS = 128          # threads per block of the reduction launch
LOADS_IN_FLIGHT = 8          # parts a thread loads before folding them
FOLD = {"sum": ("add", 0.0), "max": ("max", float("-inf")), "min": ("min", float("inf"))}


def reduce_launch(pb: ProgramBuilder, node: Node, name: str) -> ir.Kernel:
    spec: Reduce = node.spec
    axis = spec.src.tensor.dims[0]
    if spec.op not in FOLD or tuple(spec.axes) != (axis,) or spec.src.tensor.dims[1:] != spec.dst.tensor.dims:
        raise err(node, "an unrefined kernel-level Reduce launches by default only as a sum, max or min over "
                        "the leading dimension of a workspace of partial results (split-K's partial products, "
                        "a reduction's parts per block)",
                  fix="refine the Reduce with strategies (tile(...) >> to_blocks(), ...)")
    fold, start = FOLD[spec.op]
    kb = KernelBuilder(pb, name)
    lw = Lowerer(pb, kb, pb.target)
    ws = kb.gbuf(spec.src)
    out_t = spec.dst.tensor
    dims = out_t.storage_dims
    shape = [out_t.extent(d) for d in dims]
    parts = spec.src.tensor.extent(axis)
    N = shape[-1]
    total_elems = 1
    for s in shape:
        total_elems *= s
    p = 2 if N % 2 == 0 else 1
    T = REDUCE_THREADS
    total = total_elems // p
    blocks = -(-total // T)
    kb.grid, kb.threads = (blocks, 1, 1), T
    tid = ir.tid(T)
    idx: IntExpr = (ir.bid(0, blocks) * T + tid) * p
    coord: dict[str, IntExpr] = {}
    rest: IntExpr = idx
    for i, (d, s) in enumerate(zip(reversed(dims), reversed(shape))):
        if i == len(dims) - 1:
            coord[d] = rest
        else:
            coord[d] = rest % s
            rest = rest // s
    rdim, cdim = pb.out_axes()
    if cdim != dims[-1]:
        # a product computed transposed (Cᵀ = Bᵀ Aᵀ: the MatMul's n role is C's rows): this launch
        # walks C in storage order, whose rows and columns are not the roles' the ops index by
        if spec.ops:
            raise err(node, f"epilogue ops on the parts' sum of a transposed product (C's columns are "
                            f"{dims[-1]}, the MatMul's n is {cdim}) are not lowered", field="ops", value=spec.ops,
                      fix="drop split_k, or the epilogue ops")
        rdim, cdim = (dims[-2] if len(dims) > 1 else rdim), dims[-1]
    row, col = coord.get(rdim, 0), coord[cdim]
    glim = {rdim: out_t.extent(rdim) if rdim in out_t.dims else 1, cdim: N}
    ctx = Ctx(origin={(out_t.name, "GL"): {d: coord[d] for d in dims if d not in (rdim, cdim)}})
    work = kb.reg("epi", f32, p)
    # the parts' loads are issued before their folds (up to LOADS_IN_FLIGHT, each into registers
    # of its own), so they are in flight together rather than one L2 round trip after another;
    # the folds run in part order, the same order as ever: the result is bitwise reproducible
    batch = min(parts, LOADS_IN_FLIGHT)
    tmp = kb.reg("part", f32, p * batch)
    ld = catalog.copy_atom("GL", "RF", 4 * p)
    live = lt(idx, total_elems)
    stmts: list = [ir.RegFill(ir.RegRef(work, 0), p, start)]
    for j0 in range(0, parts, batch):
        js = range(j0, min(parts, j0 + batch))
        for j in js:
            stmts.append(ir.AtomCall(ld, (("dst", ir.RegRef(tmp, p * (j - j0))),
                                          ("src", ir.MemRef(ws, j * total_elems + idx))),
                                     live, comment=f"partial {'sum' if spec.op == 'sum' else 'result'} {j}"))
        for j in js:
            for q in range(p):
                stmts.append(ir.Pointwise(fold, ir.RegRef(work, q),
                                          (ir.RegRef(work, q), ir.RegRef(tmp, p * (j - j0) + q))))
    stmts += apply_ops(lw, ctx, spec.ops, work, p, row, col, glim)
    out = kb.gbuf(spec.dst, write=True)
    stmts += store_values(lw, work, p, spec.dst.dtype, out, idx, row, col, glim, axes=(rdim, cdim))
    return kb.build(ir.Seq((ir.Comment(str(spec)), ir.If(live, ir.Seq(tuple(stmts))))), header=str(spec))
