"""The rule of an aligned window (``align(c=vec)``): a loop of one step whose origin moves back by
the row's phase.

The row's first element sits at flat offset ``s`` of its tensor (``s = r · cols`` for row ``r``);
the window starts at the vector boundary ``vec · (s // vec)``, so every tensor in scope along the
aligned dim moves its origin by::

    shift = -(s mod vec)                  (0 .. -(vec - 1))

A row tensor's offset ``s + shift + j`` is then ``vec · (s // vec) + j``, which
``threads.alignment`` proves aligned, and the shift's bounds let the window's middle vectors
drop their edge tests (``ir.expr.bounds``: a vector of a middle pass lies in the row).  The global
tensors keep their limits and gain a lower one, 0 (the window's first elements belong to the row
before); on-chip tensors created inside the window learn where the row lies in them
(``context._in_window``).

A thread-block cluster's part of a row (``to_blocks(cluster=C)`` along the aligned dim, parts of
whole vectors) starts at the row's phase too, so it takes the same shift; its window reaches into
the next part, whose elements are that part's block's, so a part's low bound is its own first
element and its limit its own end (or the row's)::

    part i:   [i·L, i·L + L)  of the row        window:  [i·L - p, i·L + L - p + vec - 1)
              low = i·L, limit = min(cols, i·L + L): the window's elements outside are masked
"""

from __future__ import annotations

import attrs

from ...ir.expr import minimum, mod
from ...schedule import Node
from ...tensor import GL
from ..context import err, key
from ..lowerer import Lowerer, loop_rule
from .smem import gl_offset


def _aligned(lw, node: Node, lp) -> bool:
    return lp.align > 0


@loop_rule(_aligned)
def aligned_window(lw: Lowerer, node: Node, ctx, lp, rest: list) -> list:
    d, vec = lp.dim, lp.align
    starts = {}
    for t in node.spec.operands:
        if t.memory != GL or d not in t.dims or len(t.tensor.storage_dims) < 2:
            continue
        o = ctx.origin[key(t)]
        buf = lw.pb.gbuf(t)
        starts[t.name] = gl_offset(buf, t.tensor, {**o, d: o[d]})
    if not starts:
        raise err(node, f"align({d}={vec}) aligns the rows of a global tensor over {d} and another dim; "
                        f"{node.spec} has none", strategy=node.strategy,
                  fix="align a block's row of a 2-d (or more) tensor")
    first = next(iter(starts.values()))
    other = [n for n, s in starts.items() if s != first]
    if other:
        names = ", ".join(starts)
        raise err(node, f"align({d}={vec}) moves every operand by one phase, but the rows of {names} start at "
                        f"different offsets ({next(iter(starts))}: {first}, {other[0]}: {starts[other[0]]})",
                  strategy=node.strategy, field=d, value=vec,
                  fix="align rows of tensors of one shape (equal strides), or leave align out")
    shift = -1 * mod(first, vec)
    part = getattr(ctx.cluster, "dim", None) == d
    for k, o in list(ctx.origin.items()):
        if d not in o:
            continue
        if k[1] != "GL":
            raise err(node, f"{k[0]} ({k[1]}) is in scope above align({d}={vec}): it would keep the frame before the "
                            "shift", strategy=node.strategy, fix="apply align right after to_blocks")
        ctx = ctx.with_origin(k, {**o, d: o[d] + shift})
        if part:
            # a cluster's part of the row: its window reaches into the parts beside it, whose
            # elements it leaves to them
            ext = next((t.extent(d) for t in node.spec.operands if key(t) == k), None)
            ctx = ctx.with_low(k, {**ctx.low.get(k, {}), d: o[d]})
            if ext is not None:
                ctx = ctx.with_limit(k, {**ctx.limit[k], d: minimum(ctx.limit[k][d], o[d] + ext)})
        else:
            ctx = ctx.with_low(k, {**ctx.low.get(k, {}), d: 0})
    ctx = attrs.evolve(ctx, shift={**ctx.shift, d: (shift, vec)})
    return lw.loops(node, ctx, rest)


__all__ = ["aligned_window"]
