"""Schedule → kernel IR, by rules that compose (``docs/architecture.md`` walks one schedule through).

* ``driver``: launches, the block's scope and roles, resources;
* ``lowerer``: the rule registry and the dispatcher;
* ``context``: what a node is lowered in (origins, limits, stages, scope, pipeline part);
* ``layouts``: register and shared-memory layout inference;
* ``program``: the builders rules ask for resources;
* ``checks``: O(tree) checks before any statement is built;
* ``rules/``: one rule per kind of node; ``transforms/``: block order, pipelines, specialization.

Checking a schedule is lowering it: ``Schedule.check()`` calls ``lower``.
"""

from .. import schedule as _schedule
from . import rules, transforms  # noqa: F401  (importing them registers the rules)
from .driver import lower

_schedule.bind_lowering(lower)

__all__ = ["lower"]
