"""The strategy base: a frozen value with ``apply(schedule) -> schedule``; ``a >> b`` chains them.

A chain is itself a strategy, prints as ``a >> b`` and hashes by value.  This sits below the
schedule (which applies strategies) and the ``strategies`` package (which defines them), so that
neither has to import the other's layer.
"""

from __future__ import annotations

import attrs

from .errors import ScheduleError


class Strategy:
    """Base of strategy values."""

    def apply(self, sched):  # pragma: no cover - abstract
        """Refine ``sched`` (a ``firesched.schedule.Schedule``): return the new schedule, or raise a
        ``ScheduleError`` that names this strategy, the spec and what would fix it."""
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

    def apply(self, sched):
        for p in self.parts:
            sched = p.apply(sched)
        return sched

    def __repr__(self):
        return " >> ".join(repr(p) for p in self.parts)

    def __str__(self):
        return " >> ".join(str(p) for p in self.parts)
