"""Tuple reductions: a ``Reduce`` whose combine is a monoid over several f32 values.

A plain reduction combines one value per element (sum, max).  Some row statistics need several
that only make sense together, and are cheapest combined in one exchange:

* softmax's ``(max, sum of exp)``, merged online::

      m = max(m1, m2);   s = s1·exp(c·(m1 - m)) + s2·exp(c·(m2 - m))

* LayerNorm's ``(count, mean, M2)``, merged by Chan's parallel formula (numerically robust: no
  ``E[x²] - E[x]²`` cancellation for rows of a large mean)::

      n = n1 + n2;   d = mean2 - mean1;   mean = mean1 + d·n2/n;   M2 = M2_1 + M2_2 + d²·n1·n2/n

A monoid is data: its components, their identity, and straight-line programs of scalar ops
(``firesched.ops.SCALAR_OPS``) over named f32 values, which the lowering prints and the
interpreter runs like any other scalar op:

* ``passes``: how one thread folds a few of its elements into a fresh tuple ``b`` — each pass
  visits every element ``x`` once (a max, then the sum of exponentials relative to it), and
  ``between[i]`` runs after pass ``i`` (a sum divided by the count);
* ``combine``: ``a = a (+) b``, in place on ``a`` (through temporaries ``t0, t1, ...``); it is the
  step of every level — the thread's running tuple, warp shuffles, shared memory across warps, and
  distributed shared memory across the blocks of a cluster;
* ``finish``: one program per output (the ``Reduce``'s ``dst``, then its ``more`` tiles), from the
  combined tuple ``a`` into ``y``.

Names in programs: ``a0 a1 ..`` the running tuple, ``b0 b1 ..`` the other one, ``x`` the element,
``t0 t1 ..`` temporaries, ``y`` an output; a float is a constant.  ``reference`` gives the
outputs in numpy (float64) from the whole reduced array, for ``firesched.testing``.
"""

from __future__ import annotations

from typing import Callable

import attrs
import numpy as np

from .ops import LOG2E, SCALAR_OPS


@attrs.frozen
class Step:
    """``dst = op(*args)``: one scalar op of a monoid's program (names as the module says)."""

    op: str
    dst: str
    args: tuple


def _check_program(name: str, field: str, prog, k: int, reads: set[str]) -> None:
    """A program names known ops with their arity, and values it may read."""
    have = set(reads)
    for s in prog:
        sop = SCALAR_OPS.get(s.op)
        if sop is None or sop.arity != len(s.args):
            raise ValueError(f"Monoid {name!r}: {field} step {s} names op {s.op!r} with {len(s.args)} args; "
                             f"allowed: ops of firesched.ops.SCALAR_OPS with their arity")
        for a in s.args:
            if not isinstance(a, (int, float)) and a not in have:
                raise ValueError(f"Monoid {name!r}: {field} step {s} reads {a!r} before it is written; "
                                 f"readable: {', '.join(sorted(have))}")
        have.add(s.dst)
        if s.dst[0] not in "abty" or (s.dst[0] == "a" and int(s.dst[1:]) >= k):
            raise ValueError(f"Monoid {name!r}: {field} step {s} writes {s.dst!r}; allowed: a0..a{k - 1}, b.., "
                             "t.., y")


@attrs.frozen
class Monoid:
    """A reduction operator over ``len(identity)`` f32 components (see the module docstring)."""

    name: str
    identity: tuple[float, ...]
    passes: tuple[tuple[Step, ...], ...]
    between: tuple[tuple[Step, ...], ...]
    combine: tuple[Step, ...]
    finish: tuple[tuple[Step, ...], ...]
    reference: Callable = attrs.field(eq=False, hash=False, repr=False)
    params: tuple = ()                     # what distinguishes two monoids of one name (a scale)
    # the component that counts the elements folded (Welford's n), or None: where no element of
    # a reduction is skipped, every part counts as many, so the lowering need not exchange it —
    # a part takes its partner's count from its own, and the compiler folds the count and the
    # combine's divisions by it into constants
    count: int | None = None

    def __attrs_post_init__(self):
        k = self.k
        a = {f"a{i}" for i in range(k)}
        b = {f"b{i}" for i in range(k)}
        if len(self.between) != len(self.passes):
            raise ValueError(f"Monoid {self.name!r}: one between program per pass ({len(self.passes)}), got "
                             f"{len(self.between)}")
        for i, (p, w) in enumerate(zip(self.passes, self.between)):
            _check_program(self.name, f"passes[{i}]", p, k, b | {"x"})
            _check_program(self.name, f"between[{i}]", w, k, b)
        _check_program(self.name, "combine", self.combine, k, a | b)
        if self.count is not None and not (isinstance(self.count, int) and 0 <= self.count < k):
            raise ValueError(f"Monoid {self.name!r}: count={self.count!r}; allowed: None or a component "
                             f"index 0..{k - 1}")
        for j, f in enumerate(self.finish):
            _check_program(self.name, f"finish[{j}]", f, k, a)
            if not any(s.dst == "y" for s in f):
                raise ValueError(f"Monoid {self.name!r}: finish[{j}] never writes y")

    @property
    def k(self) -> int:
        """The number of components."""
        return len(self.identity)

    @property
    def outputs(self) -> int:
        """The number of outputs (the ``Reduce``'s ``dst`` and its ``more`` tiles)."""
        return len(self.finish)

    def __str__(self):
        return self.name + (f"({', '.join(f'{p:g}' for p in self.params)})" if self.params else "")


def run(prog, env: dict) -> dict:
    """Run a program on numpy values (float64; what ``firesched.testing`` and the tests use to
    check a monoid's programs against its ``reference``)."""
    for s in prog:
        env[s.dst] = SCALAR_OPS[s.op].np(*[a if isinstance(a, (int, float)) else env[a] for a in s.args])
    return env


def _softmax_ref(c: float):
    def ref(x, axis):
        m = np.max(x, axis=axis)
        safe = np.where(np.isneginf(m), 0.0, m)
        return m, np.sum(np.exp(c * (x - np.expand_dims(safe, axis))), axis=axis)
    return ref


def softmax_stats(scale: float = 1.0) -> Monoid:
    """``(max x, sum exp(scale·(x - max x)))`` of the reduced elements: the two statistics of a
    softmax (``scale`` > 0), combined online.  A maximum of -inf (every element masked) counts as 0
    in the exponentials (``exp2_scaled_diff``), so empty parts give ``(-inf, 0)`` and no NaN."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"monoids.softmax_stats: scale={scale!r}; allowed: a positive number")
    c = float(scale)
    # exp(c·(x - m)) as 2^(c2·(x - m)), c2 = c·log2(e): one ex2.approx an element (expf's range
    # reduction made the staged softmax issue-bound on an H100)
    c2 = c * LOG2E
    return Monoid(
        "softmax_stats", (float("-inf"), 0.0),
        passes=((Step("max", "b0", ("b0", "x")),),
                (Step("exp2_scaled_diff", "t0", ("x", "b0", c2)), Step("add", "b1", ("b1", "t0")))),
        between=((), ()),
        combine=(Step("max", "t0", ("a0", "b0")),
                 Step("exp2_scaled_diff", "t1", ("a0", "t0", c2)), Step("mul", "t1", ("a1", "t1")),
                 Step("exp2_scaled_diff", "t2", ("b0", "t0", c2)), Step("mul", "t2", ("b1", "t2")),
                 Step("add", "a1", ("t1", "t2")), Step("copy", "a0", ("t0",))),
        finish=((Step("copy", "y", ("a0",)),), (Step("copy", "y", ("a1",)),)),
        reference=_softmax_ref(c), params=(c,) if c != 1.0 else ())


def _welford_ref(x, axis):
    return np.mean(x, axis=axis), np.var(x, axis=axis)


def welford() -> Monoid:
    """``(mean x, biased variance x)`` of the reduced elements, through ``(count, mean, M2)``:
    each thread's elements in two passes (their mean, then the sum of squared deviations from
    it), the tuples merged by Chan's formula.  Elements a reduction skips (padding) do not count,
    so the mean and variance are over the elements present wherever the row is split.  The merge's
    division (a count by the merged count, at most 2^31) is ``div_approx``: within 2 ulp, two
    instructions, where the IEEE division's routine took a dozen at every merge of a row's
    tuples (each thread's leaves, the warp's lanes, the block's warps)."""
    return Monoid(
        "welford", (0.0, 0.0, 0.0),
        passes=((Step("add", "b0", ("b0", 1.0)), Step("add", "b1", ("b1", "x"))),
                (Step("sub", "t0", ("x", "b1")), Step("mul", "t0", ("t0", "t0")), Step("add", "b2", ("b2", "t0")))),
        between=((Step("max", "t0", ("b0", 1.0)), Step("div", "b1", ("b1", "t0"))), ()),
        combine=(Step("sub", "t0", ("b1", "a1")),                      # d = mean2 - mean1
                 Step("add", "t1", ("a0", "b0")),                      # n
                 Step("max", "t2", ("t1", 1.0)),
                 Step("div_approx", "t2", ("b0", "t2")),               # w = n2 / n (0 when n = 0)
                 Step("mul", "t3", ("t0", "t2")),
                 Step("add", "a1", ("a1", "t3")),                      # mean1 + d·w
                 Step("mul", "t3", ("t3", "t0")),
                 Step("mul", "t3", ("t3", "a0")),                      # d²·n1·n2/n
                 Step("add", "a2", ("a2", "b2")),
                 Step("add", "a2", ("a2", "t3")),
                 Step("copy", "a0", ("t1",))),
        finish=((Step("copy", "y", ("a1",)),),
                (Step("max", "t0", ("a0", 1.0)), Step("div", "y", ("a2", "t0")))),
        reference=_welford_ref, count=0)


def _sum_squares_ref(x, axis):
    return (np.sum(x * x, axis=axis),)


def sum_squares() -> Monoid:
    """``sum x²`` of the reduced elements: RMSNorm's statistic folded straight from the row
    (each square taken as the element is read), with no tensor of squares between the row and
    the reduction — what lets a row part that waits in shared memory, predicated at the row's
    end, keep its registers free (a tensor of squares would be held whole)."""
    return Monoid(
        "sum_squares", (0.0,),
        passes=((Step("mul", "t0", ("x", "x")), Step("add", "b0", ("b0", "t0"))),),
        between=((),),
        combine=(Step("add", "a0", ("a0", "b0")),),
        finish=((Step("copy", "y", ("a0",)),),),
        reference=_sum_squares_ref)


__all__ = ["Monoid", "Step", "softmax_stats", "welford", "sum_squares", "run"]
