"""What every strategy shares: the ``Strategy`` base, ``>>`` chains, validation helpers.

A strategy is a frozen value with ``apply(schedule) -> schedule``.  ``a >> b`` is the chain that
applies ``a`` then ``b``; a chain is itself a strategy, prints as ``a >> b`` and hashes by value.
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..schedule import Node, Schedule


class Strategy:
    """Base of strategy values."""

    def apply(self, sched: Schedule) -> Schedule:  # pragma: no cover - abstract
        raise NotImplementedError

    def __rshift__(self, other: "Strategy") -> "Chain":
        if not isinstance(other, Strategy):
            raise ScheduleError(f"cannot chain {self} >> {other!r}: the right side is not a strategy",
                                field="right operand", value=other)
        left = self.parts if isinstance(self, Chain) else (self,)
        right = other.parts if isinstance(other, Chain) else (other,)
        return Chain(left + right)


@attrs.frozen(repr=False)
class Chain(Strategy):
    """``a >> b >> ...``: apply each in turn."""

    parts: tuple[Strategy, ...]

    def apply(self, sched: Schedule) -> Schedule:
        for p in self.parts:
            sched = p.apply(sched)
        return sched

    def __repr__(self):
        return " >> ".join(repr(p) for p in self.parts)

    def __str__(self):
        return " >> ".join(str(p) for p in self.parts)


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
