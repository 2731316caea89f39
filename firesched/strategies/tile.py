"""``tile(m=, n=, k=)``: split the focus into tiles.

M and N tiles become loops (sequential until ``to_blocks``/``to_warps`` maps them); a K tile is
always a sequential reduction loop.  Partial tiles are predicated, not forbidden.  When K is tiled
while C still lives in global memory, the accumulator moves to registers around the loop::

    MatMul<block>(A:GL[128x4096], B:GL[4096x128], C:GL[128x128])
      tile(k=32)
      Init<block>(C:RF f32[128x128] = 0)
      for k0 in seq(128):
        MatMul<block>(A:GL[128x32], B:GL[32x128], C:RF f32[128x128])   <- focus
      Move<block>(C:RF f32[128x128] -> C:GL f16[128x128])
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..schedule import Loop, Node, Schedule
from ..spec import Init, Move
from ..tensor import KERNEL, RF, Tensor, Tile
from .base import Strategy, fresh_var, positive_int


@attrs.frozen(repr=False)
class tile(Strategy):
    m: int | None = None
    n: int | None = None
    k: int | None = None

    def sizes(self) -> dict[str, int]:
        return {d: v for d, v in (("m", self.m), ("n", self.n), ("k", self.k)) if v is not None}

    def apply(self, sched: Schedule) -> Schedule:
        node = sched.open_focus(self)
        spec = node.spec
        sizes = self.sizes()
        if not sizes:
            raise ScheduleError("give at least one of m=, n=, k=", strategy=self, spec=spec,
                                fix="e.g. tile(m=128, n=128)")
        ext = spec.extents
        for d, v in sizes.items():
            positive_int(self, spec, d, v)
            # a block tile (or a K tile) may overhang a small problem: one partial tile, whose
            # edges the lowering predicates like any other; inner tiles must fit their parent
            if v > ext[d] and not (spec.level == KERNEL or d == "k"):
                raise ScheduleError(f"the {d} tile is larger than the spec's {d} extent {ext[d]}",
                                    strategy=self, spec=spec, field=d, value=v,
                                    allowed=f"1..{ext[d]}", fix=f"use {d}<={ext[d]}")
        if "k" in sizes and spec.level == KERNEL:
            raise ScheduleError("a K tile is a sequential loop inside a block; a kernel-level spec "
                                "has no block to run it yet", strategy=self, spec=spec, field="k",
                                value=sizes["k"], fix="apply tile(m=..., n=...) >> to_blocks() first")
        needs_acc = "k" in sizes and spec.c.memory != RF
        if needs_acc and ("m" in sizes or "n" in sizes):
            raise ScheduleError("tiling K while C is still in global memory creates the register "
                                "accumulator; tile M/N and K in separate strategies", strategy=self,
                                spec=spec, fix="e.g. tile(m=64, n=64) >> to_warps(), then tile(k=32)")
        loops = []
        for d in ("m", "n", "k"):
            if d in sizes:
                loops.append(Loop(fresh_var(sched, d) if not loops else _next_var(sched, loops, d),
                                  -(-ext[d] // sizes[d]), ((d, sizes[d]),)))
        child = spec.with_extents(**sizes)
        if not needs_acc:
            new = attrs.evolve(node, strategy=self, loops=tuple(loops), body=(Node(child),))
            return sched.replace_focus(new)
        c = spec.c
        acc_t = Tensor(c.name, spec.acc, RF, ("m", "n"), (spec.m, spec.n), "n")
        acc = Tile(acc_t, (spec.m, spec.n))
        child = attrs.evolve(child, c=acc)
        new = attrs.evolve(
            node, strategy=self, loops=tuple(loops),
            pre=(Node(Init(acc, 0.0, spec.level)),),
            body=(Node(child),),
            post=(Node(Move(acc, c, spec.level)),))
        return sched.replace_focus(new)

    def __repr__(self):
        return "tile(" + ", ".join(f"{d}={v}" for d, v in self.sizes().items()) + ")"

    __str__ = __repr__


def _next_var(sched: Schedule, loops: list[Loop], d: str) -> str:
    taken = {lp.var for lp in loops}
    v = fresh_var(sched, d)
    i = 0
    while v in taken:
        i += 1
        v = f"{d}{i}"
    return v
