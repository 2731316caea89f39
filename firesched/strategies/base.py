"""What every strategy shares: validation helpers, fresh loop variables, the strategy record.

The ``Strategy`` base and ``>>`` chains live in ``firesched.strategy`` (re-exported here).
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..schedule import Node, Schedule
from ..strategy import Chain, Strategy

__all__ = ["Strategy", "Chain", "positive_int", "fresh_var", "record", "with_operand_in_parts"]


def positive_int(strategy, spec, field: str, value, *, allowed: str = "a positive int") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ScheduleError(f"{field} must be {allowed}", strategy=strategy, spec=spec, field=field,
                            value=value, allowed=allowed)
    return value


def fresh_var(sched: Schedule, dim: str) -> str:
    """A loop variable name not yet used in the tree: ``m0``, ``m1``, ..."""
    used = {lp.var for n in sched.nodes() for lp in n.loops}
    i = 0
    while f"{dim}{i}" in used:
        i += 1
    return f"{dim}{i}"


def record(node: Node, strategy) -> object:
    """The strategy to print on ``node`` after ``strategy`` refined it further."""
    if node.strategy is None:
        return strategy
    return node.strategy >> strategy


def with_operand_in_parts(parts: tuple, name: str, tile) -> tuple:
    """The unrefined parts of a fused node (those a strategy created with the fused spec) with
    operand ``name`` replaced by ``tile``, as in the fused spec."""
    out = []
    for p in parts:
        if name in {t.name for t in p.spec.operands}:
            p = attrs.evolve(p, spec=p.spec.with_operand(name, tile))
        out.append(p)
    return tuple(out)
