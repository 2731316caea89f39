"""How partial results of a reduction combine: one f32 register per element for a plain op
(``acc = op(acc, part)``: add, max, min), or the ``k`` component registers of a monoid's tuple
(``firesched.monoids``: softmax's ``(max, sum)``, LayerNorm's ``(count, mean, M2)``) with its
combine program.

Every level of a reduction's store — the lanes of a warp, the warps of a block, the blocks of a
cluster — moves the ``k`` components of each partial result together and combines them with
``Combine.step``, so a tuple reduction costs one exchange per level, like a sum.  Where no
element is skipped anywhere (``Combine.even``), every part counts the same elements, so a monoid's
count component is not exchanged at all: a butterfly's partner counts what the lane does, and a
part folded in a row counts what one part did before the row began (``Combine.snapshot``) — the
compiler then folds the counts, and the combine's divisions by them, into constants.  Component ``j``
of the accumulator ``<name>_acc`` lives in the register array ``<name>_acc`` (``j = 0``) or
``<name>_acc_c<j>``, each laid out as the accumulator's ``ThreadLayout``.
"""

from __future__ import annotations

import attrs

from ... import ir
from ...dtypes import f32
from ...spec import Reduce

COMBINE = {"sum": "add", "mean": "add", "max": "max", "min": "min"}


def components(lw, acc: ir.RegBuffer, k: int) -> list[ir.RegBuffer]:
    """The register arrays of the ``k`` components of accumulator ``acc`` (``acc`` itself first)."""
    return [acc] + [lw.kb.reg(f"{acc.name}_c{j}", f32, acc.size) for j in range(1, k)]


def program(lw, prog, env: dict) -> list:
    """The ``ir.Pointwise`` statements of a monoid program (``firesched.monoids.Step``s); ``env``
    maps the names it reads and writes (``a0``, ``b1``, ``x``, ``y``) to registers; temporaries
    ``t<i>`` take registers of their own."""
    out = []
    temps = None
    for s in prog:
        def ref(name):
            nonlocal temps
            if isinstance(name, (int, float)):
                return float(name)
            if name in env:
                return env[name]
            if temps is None:
                temps = lw.kb.reg("mono_t", f32, 4)
            i = int(name[1:])
            if i >= temps.size:
                temps = lw.kb.reg("mono_t", f32, i + 1)
            return ir.RegRef(temps, i)
        out.append(ir.Pointwise(s.op, ref(s.dst), tuple(ref(a) for a in s.args)))
    return out


@attrs.frozen
class Combine:
    """The combine of a reduction's partial results: ``k`` registers per element, and the
    statements of ``a (+)= b``."""

    k: int
    op: str = ""                 # a plain op's scalar op (add, max, min)
    monoid: object = None        # or a firesched.monoids.Monoid
    # every part folded the same elements (no element skipped anywhere): the monoid's count
    # component is then the same in ``a`` and ``b``, and is not exchanged (``kept``)
    even: bool = False

    @property
    def kept(self) -> frozenset:
        """The components a part keeps instead of exchanging: the monoid's count where the parts
        are even (each takes its partner's count from its own), none otherwise."""
        if self.even and self.monoid is not None and self.monoid.count is not None:
            return frozenset((self.monoid.count,))
        return frozenset()

    def step(self, lw, a: list, b: list, part: dict | None = None) -> list:
        """``a = a (+) b`` on one element: ``a`` and ``b`` hold its ``k`` components (RegRefs).
        A kept component of ``b`` is read from ``part`` (component -> register: what one part
        holds, where ``a`` folds several parts in a row) or, in a pairwise combine of two equal
        halves (a butterfly), from ``a``'s own."""
        if self.monoid is None:
            return [ir.Pointwise(self.op, a[0], (a[0], b[0]))]
        env = {f"a{j}": r for j, r in enumerate(a)}
        env.update({f"b{j}": r for j, r in enumerate(b)})
        out = []
        for j in sorted(self.kept):
            if part is not None:
                env[f"b{j}"] = part[j]
                continue
            # b's count is a's: copied first, as the program may write a's before reading b's
            keep = ir.RegRef(lw.kb.reg("mono_kept", f32, self.k), j)
            out.append(ir.Pointwise("copy", keep, (a[j],)))
            env[f"b{j}"] = keep
        return out + program(lw, self.monoid.combine, env)

    def snapshot(self, lw, a: list, slot: int = 0) -> tuple[list, dict]:
        """``(statements, part)``: copies of ``a``'s kept components, taken before ``a`` folds
        other parts in a row (each as large as ``a`` is now): ``step(..., part=part)``; ``slot``
        tells apart the snapshots of several elements live at once."""
        if not self.kept:
            return [], {}
        reg = lw.kb.reg("mono_part", f32, self.k * (slot + 1))
        part = {j: ir.RegRef(reg, slot * self.k + j) for j in sorted(self.kept)}
        return [ir.Pointwise("copy", part[j], (a[j],)) for j in part], part

    def finish(self, lw, out: int, a: list, y: ir.RegRef) -> list:
        """``y`` = output ``out`` of the combined components ``a`` (the value itself for a plain op)."""
        if self.monoid is None:
            return [ir.Pointwise("copy", y, (a[0],))]
        env = {f"a{j}": r for j, r in enumerate(a)}
        env["y"] = y
        return program(lw, self.monoid.finish[out], env)


def combine_of(spec) -> Combine | None:
    """The combine of ``spec``'s partial results (None for a spec that combines none: a Move)."""
    if not isinstance(spec, Reduce):
        return None
    if spec.monoid is not None:
        return Combine(spec.monoid.k, monoid=spec.monoid)
    return Combine(1, COMBINE.get(spec.op, "add"))


def fold_elements(lw, m, acc: list, v: int, xs: list, inside: list) -> list:
    """Fold a thread's elements ``xs`` (RegRefs; ``inside[i]`` the predicate of element ``i``, 1
    when it is always present) into component registers ``acc`` (element ``v`` of each) with
    monoid ``m``: the elements' own tuple through ``m.passes`` into fresh registers, then one
    combine into the accumulator::

        b = identity;  for each pass: for each x present: pass(b, x);  between(b)
        acc = acc (+) b
    """
    b = lw.kb.reg("mono_b", f32, m.k)
    bref = [ir.RegRef(b, j) for j in range(m.k)]
    out: list = [ir.RegFill(r, 1, float(val)) for r, val in zip(bref, m.identity)]
    env = {f"b{j}": r for j, r in enumerate(bref)}
    for steps, between in zip(m.passes, m.between):
        out += guarded([(s, pred) for x, pred in zip(xs, inside) for s in program(lw, steps, {**env, "x": x})])
        out += program(lw, between, env)
    return out + Combine(m.k, monoid=m).step(lw, [ir.RegRef(a, v) for a in acc], bref)


def guarded(stmts: list) -> list:
    """``(statement, predicate)`` pairs as statements: each run of consecutive statements under
    one predicate (1: always) in one ``If`` — a vector's elements, all in or all out, take one
    branch instead of one each."""
    out: list = []
    run: list = []
    pred = None
    for st, p in stmts + [(None, None)]:
        if run and (st is None or p != pred):
            out += run if pred == 1 else [ir.If(pred, ir.Seq(tuple(run)))]
            run = []
        if st is not None:
            run.append(st)
            pred = p
    return out


__all__ = ["Combine", "combine_of", "components", "program", "fold_elements", "guarded", "COMBINE"]
