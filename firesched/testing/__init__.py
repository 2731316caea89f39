"""Testing schedules: property tests over drawn schedules and inputs, a numpy reference of specs,
and one-atom microkernels.

* ``reference(spec, *arrays)``, ``schedule_reference(schedule, *arrays)`` (``testing.reference``):
  what a spec (and a schedule, with the epilogue and prologue ops its strategies added) means, in
  numpy;
* ``assert_schedule_correct(schedule, examples=3, arch="sm_80", atol=, rtol=)``
  (``testing.check``): interpret the schedule on random inputs and compare with the reference;
  a mismatch names the seed, the inputs and the worst element;
* ``schedules(spec)``, ``strategy_chains(spec)``, ``refused_chains(spec)``, ``arrays_for(spec)``
  (``testing.strategies``): Hypothesis strategies.  Hypothesis is a development dependency: these
  four are imported on first use, and say ``pip install hypothesis`` when it is missing;
* ``microkernel``: one-atom test kernels for the atom catalog;
* ``planting``: ``map_leaves`` / ``planted``, to plant a protocol error in a lowered program and
  show that the interpreter reports it.

``docs/tutorials/property-testing.md`` walks through them.
"""

from __future__ import annotations

from .check import TOLERANCES, Tolerance, assert_schedule_correct, compare, random_arrays, tolerance
from .reference import reference, schedule_reference

_HYPOTHESIS = ("schedules", "strategy_chains", "refused_chains", "arrays_for", "try_schedule")

__all__ = ["reference", "schedule_reference", "assert_schedule_correct", "random_arrays", "compare", "tolerance",
           "Tolerance", "TOLERANCES", *_HYPOTHESIS]


def __getattr__(name: str):
    """The Hypothesis strategies, imported on first use (``firesched.testing.strategies``)."""
    if name in _HYPOTHESIS:
        from . import strategies

        return getattr(strategies, name)
    raise AttributeError(f"module 'firesched.testing' has no attribute {name!r}")
