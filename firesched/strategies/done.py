"""``done(atom)``: declare the focus atomic.

The focus must match the atom's pattern exactly — kind, level, shape, dtypes and memories; the
error lists every field that differs::

    MatMul<warp>(A:RF f16[16x16], B:RF f16[16x8], C:RF f32[16x8]) acc f32
      done(sm80.mma_m16n8k16_f16_f32)
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..hardware.atoms.base import GROUP_THREADS, Atom
from ..ir.nodes import GUARDS
from ..spec import MatMul, Move, Pointwise, Reduce
from ..tensor import BLOCK, RF, SH, THREAD, WARP, WARPGROUP
from .base import Strategy

_GROUP_LEVEL = {"warp": WARP, "quadpair": WARP, "warpgroup": WARPGROUP}
#: the most elements a thread's element-wise leaf may hold per operand (registers)
THREAD_ELEMENTS = 64


def _memories(atom: Atom) -> dict:
    """Where the atom reads A, B and C: wgmma takes A and B through shared-memory descriptors
    (A from registers in the ``rs`` variants); mma.sync takes everything from registers."""
    if atom.family == "wgmma":
        names = {o.name for o in atom.operands}
        return {"a": RF if "a" in names else SH, "b": SH, "c": RF}
    return {"a": RF, "b": RF, "c": RF}


def pattern_mismatch(spec: MatMul, atom: Atom) -> list[str]:
    """One line per field in which ``spec`` differs from ``atom``'s pattern."""
    diffs = []
    if atom.kind != "MatMul" or not isinstance(spec, MatMul):
        return [f"kind: the atom implements {atom.kind}, the focus is a {type(spec).__name__}"]
    want_level = _GROUP_LEVEL.get(atom.group)
    if want_level is None or spec.level != want_level:
        diffs.append(f"level: focus is {spec.level}, atom runs per {atom.group}")
    if atom.group == "quadpair":
        diffs.append("thread group: quad-pair atoms need a quad-pair thread mapping, which the "
                     "strategies do not build yet")
    m, n, k = atom.shape
    for d, want in ((spec.m_dim, m), (spec.n_dim, n), (spec.k_dim, k)):
        have = spec.extents[d]
        if have != want:
            diffs.append(f"{d}: focus has {have}, atom has {want}")
    for t in spec.operands:
        extra = [d for d, s in zip(t.dims, t.shape) if d not in spec.roles and s != 1]
        if extra:
            diffs.append(f"{t.name}: dimension(s) {extra} beyond the atom's m, n, k (tile them to 1)")
    mems = _memories(atom)
    for opname, tile in (("a", spec.a), ("b", spec.b), ("c", spec.c)):
        want = atom.dtype_of("d" if opname == "c" and atom.family == "wgmma" else opname)
        have = spec.acc if opname == "c" else tile.dtype
        if have != want:
            diffs.append(f"{opname} dtype: focus has {have}, atom takes {want}")
        if tile.memory != mems[opname]:
            hint = ""
            if mems[opname] == RF and opname != "c":
                hint = f" (add move_to_regs({tile.name!r}))"
            elif mems[opname] == RF:
                hint = " (tile(k=...) creates the register accumulator)"
            elif mems[opname] == SH:
                hint = f" (wgmma reads it from shared memory: move_to_smem({tile.name!r}), no move_to_regs)"
            diffs.append(f"{opname} memory: {tile.name} is in {tile.memory}, atom takes {mems[opname]}{hint}")
    return diffs


@attrs.frozen(repr=False)
class done(Strategy):
    """Declare the focus atomic.

    ``done(atom)``: the focus is one issue of ``atom`` and must match its pattern.  ``done()``:
    the focus is a thread's element-wise work (a ``Pointwise``, ``Move`` or ``Reduce`` at the
    thread level, at most ``THREAD_ELEMENTS`` elements), which the lowering turns into vector
    loads and stores and scalar ops::

        Pointwise<thread>(add: X:GL f16[1x8], Y:GL f16[1x8] -> O:GL f16[1x8])
          done()          # ld.global.v4 x2, 8 x (cvt, add, cvt), st.global.v4

    With an atom, the focus must have the atom's kind, level (the atom's thread group: warp for
    ``mma.sync``, warpgroup for ``wgmma``), shape, dtypes and operand memories::

        MatMul<warp>(A:RF f16[32x32], B:RF f16[32x32], C:RF f32[32x32]) acc f32
          tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32)
          for m2 in seq(2), n2 in seq(4), k1 in seq(2):
            MatMul<warp>(A:RF f16[16x16], B:RF f16[16x8], C:RF f32[16x8]) acc f32
              done(sm80.mma_m16n8k16_f16_f32)

    After ``done`` the focus is atomic: only strategies that search the tree (``pipeline``,
    ``warp_specialize``, ``epilogue``, ``prologue``) may follow.

    * ``atom``: an ``Atom`` record of ``firesched.hardware.sm70`` / ``sm80`` / ``sm90a``, or None for
      a thread's element-wise work.
    * ``guard`` (element-wise work only): how a load the row's end (or a mask) guards is written
      — ``"branch"`` (the default: ``if (in) load; else zeros``) or ``"predicate"`` (the zeros and
      the load in one PTX statement under a predicate, no branch: ptxas then issues it with the
      unguarded loads instead of, at times, after their arithmetic).  The same result either way;
      which is faster differs by kernel (``recipes.rows.PREDICATED_LOADS`` holds the measured
      choices)::

          Move<thread>(copy: X:GL bf16[1x8] -> x:RF bf16[1x8])    # the last pass, c < cols
            done(guard="predicate")   # { setp p; mov x, 0; @p ld.global.v4.b32 x, [X] }
    """

    atom: Atom | None = None
    guard: str = "branch"

    def apply(self, sched):
        node = sched.open_focus(self)
        spec = node.spec
        if self.guard not in GUARDS:
            raise ScheduleError("done's guard is how a thread's guarded loads are written", strategy=self, spec=spec,
                                field="guard", value=self.guard, allowed=", ".join(map(repr, GUARDS)))
        if self.guard != "branch" and self.atom is not None:
            raise ScheduleError("guard= chooses how a thread's element-wise loads are written; an atom's operands "
                                "are not guarded that way", strategy=self, spec=spec, field="guard",
                                value=self.guard, allowed="'branch' with an atom", fix=f"done({self.atom!r})")
        if self.atom is None:
            return self._thread_code(sched, node, spec)
        if not isinstance(self.atom, Atom):
            raise ScheduleError("done takes an atom record", strategy=self, spec=spec, field="atom",
                                value=self.atom, allowed="an entry of firesched.hardware.sm80 (or sm70)")
        diffs = pattern_mismatch(spec, self.atom)
        if diffs:
            raise ScheduleError("the focus does not match the atom's pattern:\n    " + "\n    ".join(diffs),
                                strategy=self, spec=spec, field="atom", value=self.atom,
                                fix=_hint(spec, self.atom))
        return sched.replace_focus(attrs.evolve(node, atom=self.atom))

    def _thread_code(self, sched, node, spec):
        if not isinstance(spec, (Pointwise, Move, Reduce)):
            raise ScheduleError("done() without an atom declares a thread's element-wise work; this focus needs "
                                "an atom", strategy=self, spec=spec, field="atom", value=None,
                                allowed="done(<atom>) for a MatMul (e.g. sm80.mma_m16n8k16_f16_f32)")
        if spec.level != THREAD:
            raise ScheduleError("done() is a thread's element-wise work: map the focus onto threads first",
                                strategy=self, spec=spec, field="level", value=str(spec.level), allowed="thread",
                                fix="tile(<dim>=<elements per thread>) >> to_threads(), then done()")
        for t in spec.operands:
            n = 1
            for s in t.shape:
                n *= s
            if n > THREAD_ELEMENTS:
                raise ScheduleError(f"{t.name}'s tile holds {n} elements per thread", strategy=self, spec=spec,
                                    field=t.name, value=t.shape, allowed=f"<= {THREAD_ELEMENTS} elements",
                                    fix="tile the thread's work smaller (tile(...) before to_threads())")
        return sched.replace_focus(attrs.evolve(node, strategy=self))

    def __repr__(self):
        args = [] if self.atom is None else [repr(self.atom)]
        if self.guard != "branch":
            args.append(f"guard={self.guard!r}")
        return f"done({', '.join(args)})"

    __str__ = __repr__


@attrs.frozen(repr=False)
class on_fragments(Strategy):
    """Declare a ``Pointwise``, ``Move`` or ``Reduce`` over register fragments atomic: every
    thread applies it to the elements it holds, where the MMA that produces or consumes the
    fragments put them (no loads, no stores between registers)::

        Pointwise<block>(mul: O:RF f32[128x128], alpha:RF f32[128] -> O:RF f32[128x128])
          on_fragments()      # lane l scales its rows l/4 and l/4 + 8 of each m16n8 tile

        Reduce<block>(max over kv: S:RF f32[128x64] -> mx:RF f32[128])
          on_fragments()      # fold the thread's values of a row, then shfl.bfly 1 and 2

    The spec may be at the block or warp level and must cover its register tensors whole.  Its
    operands' layouts come from the MMA atoms that read or write them (a row vector takes the
    rows of the fragment it is combined with); a reduction over a dim whose fragment spans
    lanes is finished with butterfly shuffles among those lanes.  Positional ops (``ops.causal``,
    ``ops.edge``) read each element's coordinates in the kernel's tensors.
    """

    fragments = True

    def apply(self, sched):
        node = sched.open_focus(self)
        spec = node.spec
        if not isinstance(spec, (Pointwise, Move, Reduce)):
            raise ScheduleError("on_fragments() applies an element-wise op or a reduction to register fragments",
                                strategy=self, spec=spec, allowed="Pointwise, Move, Reduce",
                                fix="refine a MatMul down to an MMA atom with done(<atom>)")
        if spec.level not in (BLOCK, WARP, WARPGROUP):
            raise ScheduleError("fragments belong to warps: apply on_fragments() at the block, warpgroup or warp "
                                "level", strategy=self, spec=spec, field="level", value=str(spec.level),
                                allowed="block, warpgroup, warp")
        if not any(t.memory == RF for t in spec.operands):
            raise ScheduleError("on_fragments() needs an operand in registers", strategy=self, spec=spec,
                                fix="for tensors in memory, tile(...) >> to_threads() and done()")
        return sched.replace_focus(attrs.evolve(node, strategy=self))

    def __repr__(self):
        return "on_fragments()"

    __str__ = __repr__


def _hint(spec, atom) -> str:
    if atom.kind == "MatMul" and isinstance(spec, MatMul) and (spec.m, spec.n, spec.k) != tuple(atom.shape):
        m, n, k = atom.shape
        return f"tile the focus to the atom's shape first: tile({spec.m_dim}={m}, {spec.n_dim}={n}, {spec.k_dim}={k})"
    return f"pick an atom for these dtypes/memories ({GROUP_THREADS.get(atom.group, 1)} threads per issue)"
