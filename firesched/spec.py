"""Specs: immutable descriptions of a computation at one level of the GPU hierarchy.

* ``MatMul(a, b, c, level, acc)`` — ``c (+)= a @ b`` accumulated in ``acc``;
* ``Move(src, dst, level, ops)`` — copy a tile between memories, applying element-wise ``ops``
  (an epilogue on C's store, a prologue on A/B's load);
* ``Init(dst, value, level)`` — fill a tile (the accumulator before a reduction loop);
* ``Pointwise(op, inputs, out, level)``, ``Reduce(op, src, dst, axes, level)``;
* ``Fused(body)`` — a spec whose meaning is its body of specs (FMHA, MLP, LSTM cells).

A spec prints like Fireiron: ``MatMul<block>(A:SH f16[128x32], B:SH f16[32x128], C:RF f32[128x128])``.
"""

from __future__ import annotations

import attrs

from .dtypes import DType, dtype
from .tensor import GL, KERNEL, Level, Tensor, Tile

# The schedule layer sits above specs and registers ``Schedule.of`` here when it is imported, so
# that ``spec.schedule(...)`` works without this module importing upward.
_SCHEDULE_OF = None


def bind_scheduler(of) -> None:
    """Called by ``firesched.schedule``: ``of(spec) -> Schedule``."""
    global _SCHEDULE_OF
    _SCHEDULE_OF = of


def _scheduler():
    if _SCHEDULE_OF is None:  # pragma: no cover - firesched/__init__ imports the schedule
        raise RuntimeError("spec.schedule() needs firesched.schedule, which is not imported")
    return _SCHEDULE_OF


def _opstr(ops) -> str:
    return (" with " + ", ".join(map(str, ops))) if ops else ""


@attrs.frozen(repr=False)
class MatMul:
    """``c (+)= a @ b``: a is (m, k), b is (k, n), c is (m, n); accumulate in ``acc``."""

    a: Tile
    b: Tile
    c: Tile
    level: Level
    acc: DType = attrs.field(converter=dtype)

    @property
    def m(self) -> int:
        return self.c.extent("m")

    @property
    def n(self) -> int:
        return self.c.extent("n")

    @property
    def k(self) -> int:
        return self.a.extent("k")

    @property
    def extents(self) -> dict[str, int]:
        return {"m": self.m, "n": self.n, "k": self.k}

    def operand(self, name: str) -> Tile:
        for t in (self.a, self.b, self.c):
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def operands(self) -> tuple[Tile, Tile, Tile]:
        return (self.a, self.b, self.c)

    def with_operand(self, name: str, tile: Tile) -> "MatMul":
        for field in ("a", "b", "c"):
            if getattr(self, field).name == name:
                return attrs.evolve(self, **{field: tile})
        raise KeyError(name)

    def with_extents(self, **ext: int) -> "MatMul":
        return attrs.evolve(self, a=self.a.with_extent(**ext), b=self.b.with_extent(**ext),
                            c=self.c.with_extent(**ext))

    @classmethod
    def kernel(cls, M: int, N: int, K: int, *, a="f16", b="f16", c="f16", acc="f32",
               layout: str = "RR", names: tuple[str, str, str] = ("A", "B", "C")) -> "MatMul":
        """The kernel-level spec of ``C[M,N] = A[M,K] @ B[K,N]``.

        ``layout`` gives the majorness of A then B: ``R`` row-major (A's k / B's n contiguous),
        ``C`` column-major (A's m / B's k contiguous).  C is row-major.
        """
        for name, v in (("M", M), ("N", N), ("K", K)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"MatMul.kernel: {name} must be a positive int, got {v!r}")
        if not (isinstance(layout, str) and len(layout) == 2 and set(layout) <= {"R", "C"}):
            raise ValueError(f"MatMul.kernel: layout={layout!r}; allowed 'RR', 'RC', 'CR', 'CC' "
                             "(majorness of A then B: R = row-major, C = column-major)")
        an, bn, cn = names
        ta = Tensor(an, a, GL, ("m", "k"), (M, K), "k" if layout[0] == "R" else "m")
        tb = Tensor(bn, b, GL, ("k", "n"), (K, N), "n" if layout[1] == "R" else "k")
        tc = Tensor(cn, c, GL, ("m", "n"), (M, N), "n")
        return cls(Tile(ta, (M, K)), Tile(tb, (K, N)), Tile(tc, (M, N)), KERNEL, acc)

    def schedule(self, *strategies):
        """Refine this spec with ``strategies`` (applied in order); see ``firesched.schedule``."""
        return _scheduler()(self).apply(*strategies)

    def __repr__(self):
        return f"MatMul({self.a!r}, {self.b!r}, {self.c!r}, {self.level!r}, {self.acc!r})"

    def __str__(self):
        return f"MatMul<{self.level}>({self.a}, {self.b}, {self.c}) acc {self.acc}"


@attrs.frozen(repr=False)
class Move:
    """Copy ``src`` to ``dst`` (same logical extents), applying ``ops`` element-wise on the way."""

    src: Tile
    dst: Tile
    level: Level
    ops: tuple = ()

    def __repr__(self):
        return f"Move({self.src!r}, {self.dst!r}, {self.level!r}, {self.ops!r})"

    def __str__(self):
        return f"Move<{self.level}>({self.src} -> {self.dst}){_opstr(self.ops)}"


@attrs.frozen(repr=False)
class Init:
    """Fill ``dst`` with ``value``."""

    dst: Tile
    value: float
    level: Level

    def __repr__(self):
        return f"Init({self.dst!r}, {self.value!r}, {self.level!r})"

    def __str__(self):
        return f"Init<{self.level}>({self.dst} = {self.value:g})"


@attrs.frozen(repr=False)
class Pointwise:
    """``out = op(*inputs)`` element by element."""

    op: str
    inputs: tuple[Tile, ...]
    out: Tile
    level: Level

    def __str__(self):
        return f"Pointwise<{self.level}>({self.op}: {', '.join(map(str, self.inputs))} -> {self.out})"


@attrs.frozen(repr=False)
class Reduce:
    """``dst = op-reduction of src over axes`` (e.g. the split-K partial sums)."""

    op: str
    src: Tile
    dst: Tile
    axes: tuple[str, ...]
    level: Level
    ops: tuple = ()

    def __str__(self):
        return (f"Reduce<{self.level}>({self.op} over {','.join(self.axes)}: {self.src} -> {self.dst})"
                f"{_opstr(self.ops)}")


@attrs.frozen(repr=False)
class Fused:
    """A generic spec whose meaning is its body of specs, run in order."""

    body: tuple
    level: Level = KERNEL

    def __str__(self):
        return f"Fused<{self.level}>[{'; '.join(map(str, self.body))}]"


Spec = MatMul | Move | Init | Pointwise | Reduce | Fused
