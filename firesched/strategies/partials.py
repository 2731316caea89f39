"""``scale_partials()``: apply an int4 operand's group scales to the f32 partial products of its
groups instead of to every dequantised weight.

::

    Move<warpgroup>(B:SH u4[128x64] packed -> B:RF f16[128x64]) with group_scale(S[k/128, n], zero=8)
    MatMul<warpgroup>(B:RF f16[128x64], A:SH f16[16x128], C:RF f32[16x64]) acc f32       <- focus
        ==> scale_partials()
    Move<warpgroup>(B:SH u4[128x64] packed -> B:RF f16[128x64]) with group_scale(S[k/128, n], zero=8) on partials
    MatMul<warpgroup>(B:RF f16[128x64], A:SH f16[16x128], C:RF f32[16x64]) acc f32
      Init<warpgroup>(C_groups:RF f32[16x64] = 0)
      MatMul<warpgroup>(B:RF f16[128x64], A:SH f16[16x128], C_groups:RF f32[16x64]) acc f32   <- focus
      ScaleAdd<warpgroup>(C_groups:RF f32[16x64] x1 group -> C:RF f32[16x64]) by S[k/128, n]

``Σ_k (q_k - z) s_g x_k = s_g Σ_k (q_k - z) x_k`` over the k of one group: the dequantising move
leaves ``q - z`` (an exact small integer in f16 / bf16), the MatMul accumulates each group of the
tile into its own register copy of the partial product, and ``ScaleAdd`` multiplies each copy by
its group's scale in f32 and adds it to the accumulator (``lower.rules.partials``).  A thread
then spends, per group, a few fma on its accumulator values instead of one multiply a pair of
weights — what bounds a small-M int4 GEMM, whose threads dequantise far more weights than they
hold accumulator values.  The products differ from scaling the weights only in rounding: the
scale is applied in f32 instead of rounding each scaled weight to f16.
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..ops import GroupScale
from ..schedule import Node
from ..spec import Init, MatMul, Move, ScaleAdd
from ..tensor import RF, WARP, WARPGROUP, Tensor, Tile
from .base import Strategy


def group_copies(k_tile: int, group_size: int | None) -> int | None:
    """The register copies of the accumulator ``scale_partials`` keeps for a K tile of
    ``k_tile``: one per group it holds, one where it lies inside a group (a group size that is a
    multiple of it, or whole columns); None where the two do not nest."""
    if group_size is None or group_size % k_tile == 0:
        return 1
    if k_tile % group_size == 0:
        return k_tile // group_size
    return None


def _scale_of(spec) -> GroupScale | None:
    return next((op for op in spec.ops if isinstance(op, GroupScale)), None)


@attrs.frozen(repr=False)
class scale_partials(Strategy):
    """``scale_partials()``: the group scales of the dequantised operand multiply each group's
    partial product (in f32, once the MMAs of the K tile are done) instead of every weight (see
    the module docstring for the tree before and after).

    Apply it to the MatMul that reads the operand ``move_to_regs`` and ``prologue(...,
    ops.group_scale(...))`` dequantise, before ``tile(k=...) >> done(atom)``.  Its K tile holds
    ``K tile / group_size`` groups (a register copy of the accumulator each), or lies inside one
    group (a group size that is a multiple of the K tile, or whole columns); ``check()`` refuses
    a schedule whose K tiles do not start where groups start (a split-K part beginning inside a
    group)."""

    def apply(self, sched):
        node = sched.open_focus(self)
        spec = node.spec
        if not isinstance(spec, MatMul) or spec.level not in (WARP, WARPGROUP) or spec.c.memory != RF:
            raise ScheduleError("scale_partials applies to a warp's or warpgroup's MatMul into its register "
                                "accumulator", strategy=self, spec=spec, field="focus",
                                fix="apply it after move_to_regs(...) and prologue(..., ops.group_scale(...)), "
                                    "before tile(k=...) >> done(atom)")
        moves = [n for n in sched.nodes() if isinstance(n.spec, Move) and n.spec.dst.memory == RF
                 and _scale_of(n.spec) is not None and n.spec.dst.tensor in (spec.a.tensor, spec.b.tensor)]
        if not moves:
            raise ScheduleError("no operand of the MatMul is dequantised with group scales", strategy=self,
                                spec=spec, field="operand",
                                fix='move_to_regs("B"), prologue("B", ops.group_scale("S", 128)) before scale_partials()')
        op = _scale_of(moves[0].spec)
        operand = moves[0].spec.dst
        if op.partials:
            raise ScheduleError(f"{operand.name}'s group scales already multiply partial products", strategy=self,
                                spec=spec, field="scale", value=op, fix="apply scale_partials() once")
        kt = spec.k
        g = op.group_size
        groups = group_copies(kt, g)
        if groups is None:
            raise ScheduleError(f"the K tile of {kt} neither holds whole groups of {g} nor lies in one", strategy=self,
                                spec=spec, field="k", value=kt, allowed=f"a multiple or a divisor of {g}",
                                fix=f"tile(k=...) so that the MatMul's K tile is a multiple or a divisor of {g}")
        c = spec.c
        pt = Tensor(f"{c.name}_groups", spec.acc, RF, c.dims, c.shape, c.tensor.major)
        part = Tile(pt, pt.shape)
        scaled = attrs.evolve(op, partials=True)
        new = attrs.evolve(node, strategy=self, pre=(Node(Init(part, 0.0, spec.level)),),
                           body=(Node(spec.with_operand(c.name, part)),),
                           post=(Node(ScaleAdd(part, c, spec.level, scaled, operand.name, groups)),))
        sched = sched.replace_focus(new)
        targets = {n.spec for n in moves}

        def leave_codes(n):
            if isinstance(n.spec, Move) and n.spec in targets:
                ops = tuple(scaled if o == op else o for o in n.spec.ops)
                return attrs.evolve(n, spec=attrs.evolve(n.spec, ops=ops))
            return n

        return sched.map_nodes(leave_codes)

    def __repr__(self):
        return "scale_partials()"

    __str__ = __repr__


__all__ = ["scale_partials", "group_copies"]
