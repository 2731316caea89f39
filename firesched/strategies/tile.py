"""``tile(**dims)``: split the focus into tiles along any of its named dimensions.

Tiles of the dimensions the focus keeps (m, n, a batch dimension, a row of a norm) become loops,
sequential until ``to_blocks``/``to_warps``/``to_threads`` maps them; a tile of a dimension the
focus reduces over (a MatMul's k, a Reduce's axes) is always a sequential reduction loop.  Partial
tiles are predicated where their data lives in global memory; tiles of on-chip data must divide
it (``check()`` says so).  When a reduction dimension is tiled while the output still lives in
global memory, the accumulator moves to registers around the loop::

    MatMul<block>(A:GL[128x4096], B:GL[4096x128], C:GL[128x128])
      tile(k=32)
      Init<block>(C:RF f32[128x128] = 0)
      for k0 in seq(128):
        MatMul<block>(A:GL[128x32], B:GL[32x128], C:RF f32[128x128])   <- focus
      Move<block>(C:RF f32[128x128] -> C:GL f16[128x128])
"""

from __future__ import annotations

import attrs

from .. import ops as fops
from ..errors import ScheduleError
from ..schedule import Loop, Node, Schedule
from ..spec import Init, MatMul, Move, Pointwise, Reduce
from ..tensor import KERNEL, RF, Tensor, Tile
from .base import Strategy, fresh_var, positive_int


@attrs.frozen(repr=False, init=False)
class tile(Strategy):
    """``tile(m=128, n=128)``, ``tile(k=32)``, ``tile(b=1, m=64)``: tile sizes by dimension name.

    Splits the focus into tiles of the given sizes along the named dimensions; the loops over the
    tiles are sequential until a ``to_blocks`` / ``to_warps`` / ``to_threads`` / ``to_warpgroups``
    right after it maps them onto units.  Dimensions not named keep their extent; a tile larger
    than a kernel-level extent gives one partial tile (predicated)::

        MatMul<kernel>(A:GL f16[256x512], B:GL f16[512x128], C:GL f16[256x128]) acc f32   <- focus
          tile(m=128, n=128)
          for m0 in seq(2), n0 in seq(1):
            MatMul<kernel>(A:GL f16[128x512], B:GL f16[512x128], C:GL f16[128x128]) acc f32   <- focus

    A dimension the focus reduces over (a MatMul's ``k``, a Reduce's axes) becomes a sequential
    reduction loop, and the output moves to a register accumulator around it (the module
    docstring shows the ``Init`` and the store it creates); tile it in a strategy of its own.

    * ``**sizes``: dimension name -> tile size (a positive int), e.g. ``m=128``; at least one.
    * ``unroll``: False makes the sequential loops of a warp- or warpgroup-level focus run at run
      time (``#pragma unroll 1``) instead of being unrolled, where nothing in their body indexes
      registers by their variable (else ``ScheduleError`` at lowering).  Unrolled, the compiler
      may keep every iteration's loop-invariant addresses in registers across an enclosing loop
      (the attention key loop's query-fragment addresses: 16 registers at head dim 128); rolled,
      each iteration computes its own.  Loops above the warp level run at run time already::

        MatMul<warp>(Q:SH f16[32x128], K:SH f16[64x128], S:RF f32[32x64]) acc f32   <- focus
          tile(d=32, unroll=False)
          for d0 in seq(4) rolled:
            MatMul<warp>(Q:SH f16[32x32], K:SH f16[64x32], S:RF f32[32x64]) acc f32   <- focus
    """

    sizes: tuple[tuple[str, int], ...]
    unroll: bool = True

    def __init__(self, *, unroll: bool = True, **sizes: int):
        self.__attrs_init__(tuple(sizes.items()), unroll)

    def apply(self, sched: Schedule) -> Schedule:
        node = sched.open_focus(self)
        spec = node.spec
        sizes = dict(self.sizes)
        if not sizes:
            raise ScheduleError("give at least one of " + ", ".join(f"{d}=" for d in spec.dims), strategy=self,
                                spec=spec, fix="e.g. tile(m=128, n=128)")
        if not isinstance(self.unroll, bool):
            raise ScheduleError("unroll must be True or False", strategy=self, spec=spec, field="unroll",
                                value=self.unroll, allowed="True, False")
        ext = spec.extents
        for d, v in sizes.items():
            if d not in ext:
                raise ScheduleError(f"the focus has no dimension {d!r}", strategy=self, spec=spec, field=d,
                                    value=v, allowed=", ".join(spec.dims))
            positive_int(self, spec, d, v)
        red = set(spec.reduction_dims)
        for d, v in sizes.items():
            # a block tile (or a reduction tile) may overhang a small problem: one partial tile, whose
            # edges the lowering predicates like any other; inner tiles must fit their parent
            # (element-wise kinds may overhang at any level: global edges are predicated, and
            # registers that threads hold pad past their tensor)
            if v > ext[d] and not (spec.level == KERNEL or d in red or isinstance(spec, (Pointwise, Move, Reduce))):
                raise ScheduleError(f"the {d} tile is larger than the spec's {d} extent {ext[d]}",
                                    strategy=self, spec=spec, field=d, value=v,
                                    allowed=f"1..{ext[d]}", fix=f"use {d}<={ext[d]}")
        reduced = [d for d in sizes if d in red]
        if reduced and spec.level == KERNEL and not isinstance(spec, Reduce):
            raise ScheduleError(f"a {reduced[0]} tile is a sequential reduction loop inside a block; a "
                                "kernel-level spec has no block to run it yet", strategy=self, spec=spec,
                                field=reduced[0], value=sizes[reduced[0]],
                                fix="apply tile(" + ", ".join(f"{d}=..." for d in spec.dims if d not in red)
                                    + ") >> to_blocks() first (split_k(..., across=BLOCK) splits k over blocks)")
        out = _output(spec)
        # a kernel-level Reduce tiled along a reduced dim creates no accumulator: its parts go to
        # blocks (to_blocks() then makes them partial results that a second launch combines)
        # (a reduction into a register local that ``place(name, RF)`` made — the output of the
        # schedule's root, a part of a fused spec — needs one too: the local holds the result)
        # (a MatMul into registers accumulates there: C (+)= A B, the scores and the output of an
        # attention's key loop)
        placed = (isinstance(spec, Reduce) and out is not None and out.memory == RF
                  and any(out.tensor == t.tensor for t in sched.root.spec.outputs))
        needs_acc = bool(reduced) and out is not None and (out.memory != RF or placed) and spec.level != KERNEL
        if needs_acc and len(reduced) != len(sizes):
            raise ScheduleError(f"tiling {reduced[0]} while the output is still in global memory creates the "
                                "register accumulator; tile the other dimensions and the reduction in separate "
                                "strategies", strategy=self, spec=spec,
                                fix=f"e.g. tile(...) >> to_warps(), then tile({reduced[0]}=...)")
        loops = []
        taken: set[str] = set()
        for d in spec.dims:
            if d in sizes:
                var = _fresh(sched, d, taken)
                taken.add(var)
                loops.append(Loop(var, -(-ext[d] // sizes[d]), ((d, sizes[d]),), rolled=not self.unroll))
        child = spec.with_extents(**sizes)
        if not needs_acc:
            new = attrs.evolve(node, strategy=self, loops=tuple(loops), body=(Node(child),))
            return sched.replace_focus(new)
        acc = _accumulator(spec, child)
        child = child.with_operand(out.name, acc)
        if isinstance(child, Reduce) and child.more:
            # the tuple of a monoid accumulates whole in ``acc``; its store finishes every output
            child = attrs.evolve(child, more=(), more_ops=())
        new = attrs.evolve(
            node, strategy=self, loops=tuple(loops),
            pre=(Node(Init(acc, _identity(spec), spec.level)),),
            body=(Node(child),),
            post=(Node(_store(spec, acc, out)),))
        return sched.replace_focus(new)

    def __repr__(self):
        return "tile(" + ", ".join([f"{d}={v!r}" for d, v in self.sizes] + ([] if self.unroll else ["unroll=False"])) + ")"

    __str__ = __repr__


def _output(spec):
    if isinstance(spec, MatMul):
        return spec.c
    if isinstance(spec, Reduce):
        return spec.dst
    return None


def _store(spec, acc, out):
    """The store of the accumulator: a plain move for a MatMul; for a Reduce, the combine of the
    partial results that units mapped over the reduced dims hold (a mean is a sum scaled by the
    count), then its ops."""
    if not isinstance(spec, Reduce):
        return Move(acc, out, spec.level)
    ops = tuple(spec.ops)
    op = spec.op
    if spec.monoid is not None:
        return Reduce(op, acc, out, (), spec.level, ops, spec.acc, spec.more, spec.more_ops)
    if op == "mean":
        n = 1
        for d in spec.reduction_dims:
            n *= spec.extents[d]
        ops = (fops.scale(1.0 / n),) + ops
        op = "sum"
    return Reduce(op, acc, out, (), spec.level, ops, spec.acc)


def _identity(spec) -> float | tuple:
    if isinstance(spec, Reduce) and spec.monoid is not None:
        return spec.monoid.identity
    if isinstance(spec, Reduce) and spec.op == "max":
        return float("-inf")
    if isinstance(spec, Reduce) and spec.op == "min":
        return float("inf")
    return 0.0


def _accumulator(spec, child) -> Tile:
    """The register accumulator of ``spec``'s output over ``child``'s tile: the output's dims of
    extent > 1 and its matrix roles, in the accumulation dtype."""
    out = _output(child)
    keep = (spec.m_dim, spec.n_dim) if isinstance(spec, MatMul) else ()
    on = out.on_chip(RF, keep=keep)
    t = on.tensor
    # a reduction into a register local (``place(name, RF)``) accumulates its partial results in
    # registers of their own: the local holds the combined result in every thread that reads it
    name = f"{t.name}_p" if out.memory == RF else t.name
    acc_t = Tensor(name, spec.acc, RF, t.dims, t.shape, t.major)
    return Tile(acc_t, t.shape)


def _fresh(sched: Schedule, d: str, taken: set[str]) -> str:
    v = fresh_var(sched, d)
    i = int(v[len(d):])
    while v in taken:
        i += 1
        v = f"{d}{i}"
    return v
