"""``assert_schedule_correct``: interpret a schedule on inputs and compare with its spec's meaning.

No Hypothesis here: inputs come from numpy's generator, one seed per example, so a failure names a
seed that reproduces it (``random_arrays(schedule, seed)``).  The Hypothesis strategies that draw
schedules and inputs live in ``firesched.testing.strategies``.
"""

from __future__ import annotations

from typing import Callable

import attrs
import numpy as np

from .. import dtypes as dt
from ..api import interpret
from ..errors import HazardError
from ..schedule import Schedule
from .reference import extra_inputs, input_tiles, schedule_reference

__all__ = ["Tolerance", "TOLERANCES", "tolerance", "random_arrays", "assert_schedule_correct", "compare"]


@attrs.frozen
class Tolerance:
    """``|got - want| <= atol * max(1, max |want|) + rtol * |want|`` element by element: ``atol``
    is relative to the result's scale (sums of products cancel to values near zero, whose error
    is that of the large terms), ``rtol`` to each element."""

    atol: float
    rtol: float


#: by the result's element type: about two roundings of it (16-bit types), f32 accumulation (f32)
TOLERANCES = {"f16": Tolerance(1e-2, 1e-2), "bf16": Tolerance(2e-2, 2e-2), "f32": Tolerance(1e-4, 1e-4),
              "f64": Tolerance(1e-9, 1e-9)}


def tolerance(dtype) -> Tolerance:
    """The default ``Tolerance`` for results of element type ``dtype`` (``TOLERANCES``)."""
    name = dt.dtype(dtype).name
    if name not in TOLERANCES:
        raise ValueError(f"tolerance: no default for element type {name!r}; allowed: {', '.join(TOLERANCES)} "
                         f"(pass atol= and rtol= to assert_schedule_correct)")
    return TOLERANCES[name]


def random_arrays(schedule: Schedule, seed: int = 0, *, scale: float = 1.0) -> tuple:
    """Inputs for ``interpret(schedule, *arrays)``: standard normal values times ``scale`` (float64,
    the interpreter rounds them to the schedule's types) from ``numpy.random.default_rng(seed)``,
    for the spec's inputs and then the extra tensors its ops read; 4-bit inputs get uniform codes
    of their type (int4 weights)."""
    rng = np.random.default_rng(seed)
    tiles = input_tiles(schedule.spec)
    shapes = [tuple(t.tensor.extent(d) for d in t.tensor.dims) for t in tiles]
    kinds = [t.tensor.dtype for t in tiles] + [None] * len(extra_inputs(schedule))
    shapes += [shape for _, shape in extra_inputs(schedule)]
    out = []
    for s, d in zip(shapes, kinds):
        if d is not None and d.is_subbyte:
            # 4-bit codes: every code of the type, uniformly (int4 weights)
            lo, hi = (-8, 7) if d.kind == "int" else (0, 15)
            out.append(rng.integers(lo, hi + 1, size=s).astype(np.float64))
        else:
            out.append(rng.standard_normal(s) * scale)
    return tuple(out)


def compare(got, want, tol: Tolerance, *, what: str = "result") -> str | None:
    """None when ``got`` is within ``tol`` of ``want``, else what differs (shape, non-finite
    values, or the worst element with both values and the allowed error)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, the reference's is {want.shape}"
    if not np.isfinite(got).all() and np.isfinite(want).all():
        i = tuple(int(v) for v in np.argwhere(~np.isfinite(got))[0])
        return f"{what}: non-finite value {got[i]} at {i} (want {want[i]:.6g})"
    if got.size == 0:
        return None
    scale = max(1.0, float(np.abs(want).max()))
    allowed = tol.atol * scale + tol.rtol * np.abs(want)
    err = np.abs(got - want)
    bad = err > allowed
    if not bad.any():
        return None
    worst = np.unravel_index(int(np.argmax(err - allowed)), err.shape)
    w = tuple(int(v) for v in worst)
    return (f"{what}: {int(bad.sum())} of {got.size} elements differ; worst at {w}: got {got[worst]:.6g}, "
            f"want {want[worst]:.6g} (error {err[worst]:.3g}, allowed {allowed[worst]:.3g} = atol {tol.atol:g} x "
            f"{scale:.3g} + rtol {tol.rtol:g} x |want|)")


def _describe_inputs(schedule: Schedule, arrays) -> str:
    names = [t.name for t in input_tiles(schedule.spec)] + [n for n, _ in extra_inputs(schedule)]
    lines = []
    for n, a in zip(names, arrays):
        a = np.asarray(a)
        body = np.array2string(a, precision=3, threshold=64, edgeitems=2, max_line_width=100)
        lines.append(f"    {n} {a.shape}:\n      " + body.replace("\n", "\n      "))
    return "\n".join(lines)


def assert_schedule_correct(schedule: Schedule, *, examples: int = 3, arch: str = "sm_80",
                            atol: float | None = None, rtol: float | None = None, seed: int = 0,
                            arrays=None, reference: Callable | None = None, scale: float = 1.0) -> None:
    """Interpret ``schedule`` (checked for ``arch``) on ``examples`` inputs and compare each result
    with the numpy meaning of its spec (``schedule_reference``, or ``reference(*arrays)``).

    Inputs are ``random_arrays(schedule, seed + i)`` for example ``i``, or the one tuple ``arrays``.
    The tolerance is that of the result's element type (``TOLERANCES``) unless ``atol`` / ``rtol``
    are given.  A mismatch raises ``AssertionError`` naming the example's seed, the inputs and the
    worst element; a hazard raises the interpreter's ``HazardError`` with the seed added as a note.
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"assert_schedule_correct: schedule must be a firesched Schedule, not "
                        f"{type(schedule).__name__} (build one with spec.schedule(...))")
    if not isinstance(examples, int) or examples < 1:
        raise ValueError(f"assert_schedule_correct: examples={examples!r}; allowed: an int >= 1")
    schedule.check(arch)
    ref = reference or (lambda *a: schedule_reference(schedule, *a))
    cases = [(None, tuple(arrays))] if arrays is not None else \
        [(seed + i, random_arrays(schedule, seed + i, scale=scale)) for i in range(examples)]
    outs = schedule.spec.outputs
    for s, inputs in cases:
        which = f"seed {s} (random_arrays(schedule, {s}))" if s is not None else "the given arrays"
        try:
            got = interpret(schedule, *inputs, target=arch)
        except HazardError as e:
            e.add_note(f"assert_schedule_correct: on the inputs of {which}")
            raise
        want = ref(*inputs)
        got_t = got if isinstance(got, tuple) else (got,)
        want_t = want if isinstance(want, tuple) else (want,)
        if len(got_t) != len(want_t):
            raise AssertionError(f"{schedule.spec}: the schedule returns {len(got_t)} results, the reference "
                                 f"{len(want_t)}")
        for t, g, w in zip(outs, got_t, want_t):
            base = tolerance(t.tensor.dtype)
            tol = Tolerance(base.atol if atol is None else atol, base.rtol if rtol is None else rtol)
            problem = compare(g, w, tol, what=t.name)
            if problem is not None:
                raise AssertionError(f"schedule differs from its spec on {which}\n  {problem}\n  spec: "
                                     f"{schedule.spec}\n  strategies: {', '.join(map(str, schedule.strategies))}"
                                     f"\n  inputs:\n{_describe_inputs(schedule, inputs)}")
