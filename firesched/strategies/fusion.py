"""``epilogue(*ops)`` and ``prologue(operand, *ops)``: fuse element-wise ops into the moves.

An epilogue attaches to the store of the accumulator into C (or to the split-K reduction that
produces C)::

    Move<block>(C:RF f32[128x128] -> C:GL f16[128x128])
        ==> epilogue(bias(bias[n]), relu())
    Move<block>(C:RF f32[128x128] -> C:GL f16[128x128]) with bias(bias[n]), relu()

A prologue attaches to the shared → register move of A or B, so the op runs on the fragments
right after they are loaded (seed 000 §VII: ReLU on A).
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..ops import Cast, EpilogueOp, GroupScale
from ..schedule import find_store
from ..spec import Move
from ..tensor import GL, RF, SH
from .base import Strategy
from .split_k import _replace_node


def _check_ops(strategy, spec, ops, *, allow_extras: bool):
    for op in ops:
        if not isinstance(op, EpilogueOp):
            raise ScheduleError("not an element-wise op", strategy=strategy, spec=spec, field="op", value=op,
                                allowed="firesched.ops.bias/residual/relu/gelu/sigmoid/tanh/scale/cast")
        if isinstance(op, GroupScale):
            if allow_extras:
                raise ScheduleError("group_scale dequantises an int4 operand as it is loaded: it is a prologue op",
                                    strategy=strategy, spec=spec, field="op", value=op,
                                    fix='prologue("B", ops.group_scale("scales", 128))')
            continue
        if op.extras() and not allow_extras:
            raise ScheduleError("a prologue op cannot read extra tensors", strategy=strategy, spec=spec,
                                field="op", value=op, allowed="relu, gelu, sigmoid, tanh, scale")
        if isinstance(op, Cast) and not allow_extras:
            raise ScheduleError("cast is an epilogue op", strategy=strategy, spec=spec, field="op", value=op)


@attrs.frozen(repr=False)
class epilogue(Strategy):
    """``epilogue(*ops)``: apply element-wise ops to the output where the accumulator is stored::

        Move<block>(C:RF f32[128x128] -> C:GL f16[128x128])
            ==> epilogue(ops.bias("bias"), ops.relu())
        Move<block>(C:RF f32[128x128] -> C:GL f16[128x128]) with bias(bias[n]), relu()

    The store is found anywhere in the tree (the focus is unchanged), so it may come after
    ``done``; it needs the store a ``tile(k=...)`` created.  Ops run on the f32 accumulator.

    * ``*ops``: ``firesched.ops`` values: ``bias(name, axis)`` and ``residual(name)`` read extra
      tensors (kernel inputs after the spec's, in this order; names must be new), ``relu``,
      ``gelu``, ``sigmoid``, ``tanh``, ``scale(alpha)`` are unary, and ``cast(dtype)``, at most one
      and last, changes the output's dtype.
    """

    ops: tuple

    def __init__(self, *ops):
        self.__attrs_init__(tuple(ops))

    def apply(self, sched):
        root = sched.root.spec
        _check_ops(self, root, self.ops, allow_extras=True)
        names = {t.name for t in root.operands}
        seen = set()
        for op in self.ops:
            for e in op.extras():
                if e.name in names or e.name in seen:
                    raise ScheduleError(f"extra tensor name {e.name!r} is already used", strategy=self,
                                        spec=root, field="name", value=e.name,
                                        allowed=f"a name other than {sorted(names | seen)}")
                seen.add(e.name)
        casts = [op for op in self.ops if isinstance(op, Cast)]
        if len(casts) > 1 or (casts and self.ops[-1] is not casts[0]):
            raise ScheduleError("at most one cast, and it comes last", strategy=self, spec=root,
                                field="ops", value=self.ops)
        found = find_store(sched, root.outputs[-1].name)
        if found is None:
            raise ScheduleError("there is no accumulator store to fuse into yet", strategy=self, spec=root,
                                fix="apply tile(k=...) (which creates the store of C) before epilogue(...)")
        path, i = found
        holder = path[-1]
        st = holder.post[i]
        if st.spec.ops:
            raise ScheduleError("the store of C already has an epilogue", strategy=self, spec=st.spec,
                                fix="give all ops in one epilogue(...)")
        ops = tuple(op for op in self.ops if not isinstance(op, Cast))
        new_st = attrs.evolve(st, spec=attrs.evolve(st.spec, ops=ops))
        holder = attrs.evolve(holder, post=holder.post[:i] + (new_st,) + holder.post[i + 1:])
        sched = _replace_node(sched, path, holder)
        if casts:
            sched = _recast(sched, root.outputs[-1].tensor, casts[0].dtype)
        return sched

    def __repr__(self):
        return "epilogue(" + ", ".join(map(repr, self.ops)) + ")"

    def __str__(self):
        return "epilogue(" + ", ".join(map(str, self.ops)) + ")"


def _recast(sched, tensor, dt):
    new_t = attrs.evolve(tensor, dtype=dt)

    def fix(node):
        sp = node.spec
        changed = {}
        for f in attrs.fields(type(sp)):
            v = getattr(sp, f.name)
            if hasattr(v, "tensor") and getattr(v, "tensor", None) == tensor:
                changed[f.name] = attrs.evolve(v, tensor=new_t)
        return attrs.evolve(node, spec=attrs.evolve(sp, **changed)) if changed else node

    return sched.map_nodes(fix)


@attrs.frozen(repr=False)
class prologue(Strategy):
    """``prologue(operand, *ops)``: apply unary ops to an input's fragments as they are loaded into
    registers (from shared memory; int4 codes also straight from global memory)::

        Move<warp>(A:SH f16[64x32] Sw<2,3,3> -> A:RF f16[64x32])
            ==> prologue("A", ops.relu())
        Move<warp>(A:SH f16[64x32] Sw<2,3,3> -> A:RF f16[64x32]) with relu()

    Every register move of the operand gets the ops (the focus is unchanged); it needs
    ``move_to_regs(operand)`` first.

    * ``operand``: an input of the schedule's spec (``"A"`` or ``"B"``).
    * ``*ops``: at least one op that reads no extra tensor: ``relu``, ``gelu``, ``sigmoid``,
      ``tanh``, ``scale``.
    """

    operand: str
    ops: tuple

    def __init__(self, operand, *ops):
        self.__attrs_init__(operand, tuple(ops))

    def apply(self, sched):
        root = sched.root.spec
        names = [t.name for t in root.inputs]
        if self.operand not in names:
            raise ScheduleError("a prologue applies to A or B", strategy=self, spec=root, field="operand",
                                value=self.operand, allowed=", ".join(map(repr, names)))
        _check_ops(self, root, self.ops, allow_extras=False)
        if not self.ops:
            raise ScheduleError("give at least one op", strategy=self, spec=root, fix='prologue("A", relu())')
        # register moves of the operand: from shared memory, or (int4 codes) straight from global
        hits = [n for n in sched.nodes() if isinstance(n.spec, Move) and n.spec.src.memory in (SH, GL)
                and n.spec.dst.memory == RF and n.spec.dst.name == self.operand]
        if not hits:
            raise ScheduleError(f"no register move of {self.operand} to fuse into", strategy=self, spec=root,
                                fix=f"apply move_to_regs({self.operand!r}) before prologue(...)")

        _check_dequant(self, root, hits)
        hit_specs = [h.spec for h in hits]

        def fix(node):
            if isinstance(node.spec, Move) and node.spec in hit_specs:
                return attrs.evolve(node, spec=attrs.evolve(node.spec, ops=node.spec.ops + self.ops))
            return node

        return sched.map_nodes(fix)

    def __repr__(self):
        return f"prologue({self.operand!r}, " + ", ".join(map(repr, self.ops)) + ")"


    def __str__(self):
        return f"prologue({self.operand}, " + ", ".join(map(str, self.ops)) + ")"


def _check_dequant(strategy, root, hits) -> None:
    """A ``group_scale`` comes first, once, on an int4 operand's dequantising move, with a zero
    point the dequantisation atoms subtract exactly; its scales' name is new."""
    scales = [op for op in strategy.ops if isinstance(op, GroupScale)]
    quantised = hits[0].spec.src.dtype.name in ("u4", "i4")
    if not scales:
        return
    if not quantised:
        raise ScheduleError(f"group_scale dequantises int4 codes; {strategy.operand} is {hits[0].spec.src.dtype}",
                            strategy=strategy, spec=root, field="op", value=scales[0],
                            allowed="relu, gelu, sigmoid, tanh, scale")
    if len(scales) > 1 or strategy.ops[0] is not scales[0] or any(
            isinstance(op, GroupScale) for h in hits for op in h.spec.ops):
        raise ScheduleError("one group_scale, first among the operand's prologue ops", strategy=strategy,
                            spec=root, field="ops", value=strategy.ops)
    op = scales[0]
    if op.partials:
        raise ScheduleError("group_scale(partials=True) is what scale_partials() leaves on the dequantising move; a "
                            "prologue scales the weights themselves", strategy=strategy, spec=root, field="partials",
                            value=True, allowed="False",
                            fix="prologue(..., ops.group_scale(...)), then scale_partials() on the MatMul that "
                                "reads the dequantised operand")
    allowed = (0, 8) if hits[0].spec.src.dtype.name == "u4" else (0,)
    if op.zero not in allowed:
        raise ScheduleError(f"{hits[0].spec.src.dtype} codes are dequantised with zero point "
                            f"{' or '.join(map(str, allowed))}", strategy=strategy, spec=root, field="zero",
                            value=op.zero, allowed=", ".join(map(str, allowed)),
                            fix="quantise with firesched.quant.quantize_int4 (zero_point=False), or pass "
                                "per-group zero points: group_scale(..., zeros='Z')")
    names = {t.name for t in root.operands}
    for e in op.extras():
        if e.name in names:
            raise ScheduleError(f"the name {e.name!r} of group_scale's extra input is already used", strategy=strategy,
                                spec=root, field="name", value=e.name, allowed=f"a name other than {sorted(names)}")
