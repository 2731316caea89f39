"""Planting hazards in lowered programs: the tests that prove a check catches a protocol error
remove or change one kind of statement and expect the interpreter to report it.

* ``map_leaves(stmt, fn)``: ``stmt`` with ``fn`` applied to every leaf statement (an ``AtomCall``,
  a ``Barrier``, ...); ``fn`` returns the replacement, or None to drop the leaf (a loop or an
  ``If`` left without a body is dropped too);
* ``planted(program, fn, kernel=-1, branches=None)``: ``program`` with ``map_leaves`` applied to
  one kernel's body; ``branches``, a function of an ``If`` returning its replacement, first
  applied to every branch (an unguarded branch: ``attrs.evolve(s, cond=1)``).
"""

from __future__ import annotations

import attrs

from .. import ir


def map_leaves(stmt, fn, branches=None):
    """``stmt`` with ``fn`` applied to every leaf statement (None drops it); ``branches``, if
    given, to every ``If`` (before its body is mapped)."""
    if isinstance(stmt, ir.Seq):
        return ir.Seq(tuple(x for x in (map_leaves(s, fn, branches) for s in stmt.body) if x is not None))
    if isinstance(stmt, ir.If) and branches is not None:
        stmt = branches(stmt)
    if isinstance(stmt, (ir.For, ir.If)):
        field = "body" if isinstance(stmt, ir.For) else "then"
        inner = map_leaves(getattr(stmt, field), fn, branches)
        return None if inner is None else attrs.evolve(stmt, **{field: inner})
    if isinstance(stmt, ir.Roles):
        return ir.Roles(tuple(attrs.evolve(r, body=map_leaves(r.body, fn, branches)) for r in stmt.roles))
    return fn(stmt)


def planted(program: ir.Program, fn, kernel: int = -1, branches=None) -> ir.Program:
    """``program`` with ``map_leaves(body, fn, branches)`` applied to kernel ``kernel`` (default
    the last)."""
    kernels = list(program.kernels)
    kernels[kernel] = attrs.evolve(kernels[kernel], body=map_leaves(kernels[kernel].body, fn, branches))
    return attrs.evolve(program, kernels=tuple(kernels))
