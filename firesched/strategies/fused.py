"""Strategies of fused specs: ``part(i, ...)`` refines one body spec, ``place(name, memory)`` keeps
an intermediate on chip.

::

    Fused<block>[MatMul(X, W1 -> H:GL); MatMul(H:GL, W2 -> Y)]
      place("H", SH)                 ==>   Fused<block>[MatMul(X, W1 -> H:SH); MatMul(H:SH, W2 -> Y)]
      part(0, tile(k=32), ...)       ==>   the first MatMul refined like any block-level MatMul;
                                           its accumulator's store writes H into shared memory
      part(1, tile(h=32), ...)       ==>   the second reads H from there (move_to_regs("H"))

The parts run in order in the same block; the lowering places a barrier between two parts when
one writes shared memory the other touches.
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..layout import Swizzle
from ..schedule import Node, Schedule
from ..spec import Fused, Reduce
from ..strategy import Strategy
from ..tensor import BLOCK, RF, SH, Memory
from .base import record, with_operand_in_parts
from .moves import auto_swizzle


def _fused_focus(strategy, sched):
    path = sched.focus_path()
    node = path[-1]
    if not isinstance(node.spec, Fused):
        raise ScheduleError("this strategy refines a fused spec; the focus is not one", strategy=strategy,
                            spec=node.spec, fix="build the spec with firesched.Fused.kernel(...)")
    return path, node


@attrs.frozen(repr=False, init=False)
class part(Strategy):
    """``part(i, *strategies)``: refine body spec ``i`` of the fused focus with ``strategies``,
    as if it were the focus on its own (it keeps the tiles and places the fused spec was given).
    The fused node then holds one child per body spec, run in order::

        Fused<block>[Move<block>(X:GL f16[4x256] -> Xr:RF f16[4x256]); ...]
          part(0, tile(r=1) >> to_warps(), tile(c=256), tile(r=1, c=8) >> to_threads(), done())
          Move<block>(X:GL f16[4x256] -> Xr:RF f16[4x256])
            tile(r=1) >> to_warps()
            for r2 in warp(4):
              ...
                  Move<thread>(X:GL f16[1x8] -> Xr:RF f16[1x8])
                    done()

    * ``index``: which body spec, ``0 .. len(body) - 1``.
    * ``*strategies``: the strategies that refine it, applied in order.  Comes after the tiling
      that maps the fused spec onto blocks and after every ``place``."""

    index: int
    strategies: tuple

    def __init__(self, index, *strategies):
        self.__attrs_init__(index, tuple(strategies))

    def apply(self, sched):
        path, node = _fused_focus(self, sched)
        spec: Fused = node.spec
        i = self.index
        if isinstance(i, bool) or not isinstance(i, int) or not -len(spec.body) <= i < len(spec.body):
            raise ScheduleError("no such part of the fused spec", strategy=self, spec=spec, field="index", value=i,
                                allowed=f"0..{len(spec.body) - 1} (or -1 for the last)")
        i %= len(spec.body)
        if node.loops or (node.body and len(node.body) != len(spec.body)):
            raise ScheduleError("the fused focus is already tiled here: give part(...) after the tiling that "
                                "places it (e.g. tile(m=...) >> to_blocks())", strategy=self, spec=spec)
        for st in self.strategies:
            if not isinstance(st, Strategy):
                raise ScheduleError(f"{st!r} is not a strategy", strategy=self, spec=spec, field="strategies",
                                    value=st)
        parts = node.body if node.body else tuple(Node(sp) for sp in spec.body)
        sub = Schedule(parts[i])
        for st in self.strategies:
            sub = st.apply(sub)
        # loop variables name units and registers across the whole kernel: the part's must not
        # repeat those of the rest of the tree (its own strategies only saw the part)
        taken = {lp.var for n in sched.nodes() for lp in n.loops} - {lp.var for n in _nodes(parts[i]) for lp in n.loops}
        parts = parts[:i] + (_rename_loops(sub.root, taken),) + parts[i + 1:]
        new = attrs.evolve(node, strategy=record(node, self), body=parts)
        return sched.replace_path(path, new)

    def __repr__(self):
        inner = "".join(", " + repr(s) for s in self.strategies)
        return f"part({self.index!r}{inner})"

    def __str__(self):
        return f"part({self.index}, ...)"


def _nodes(node: Node):
    yield node
    for c in node.children:
        yield from _nodes(c)


def _rename_loops(root: Node, taken: set) -> Node:
    """``root``'s subtree with every loop variable that is in ``taken`` renamed to a fresh one
    (and the reductions over it, which name it)."""
    names = {lp.var for n in _nodes(root) for lp in n.loops}
    used = set(taken) | names
    ren = {}
    for v in sorted(names & set(taken)):
        stem = v.rstrip("0123456789") or "v"
        i = 0
        while f"{stem}{i}" in used:
            i += 1
        ren[v] = f"{stem}{i}"
        used.add(ren[v])
    if not ren:
        return root

    def go(n: Node) -> Node:
        sp = n.spec
        if isinstance(sp, Reduce) and any(a in ren for a in sp.axes):
            sp = attrs.evolve(sp, axes=tuple(ren.get(a, a) for a in sp.axes))
        return attrs.evolve(n, spec=sp, loops=tuple(attrs.evolve(lp, var=ren.get(lp.var, lp.var)) for lp in n.loops),
                            pre=tuple(go(c) for c in n.pre), body=tuple(go(c) for c in n.body),
                            post=tuple(go(c) for c in n.post))

    return go(root)


@attrs.frozen(repr=False)
class place(Strategy):
    """``place(name, SH)``: keep the fused spec's intermediate ``name`` in shared memory, one tile
    per block (the block tile's extents), swizzled against bank conflicts; it never reaches global
    memory.

    ``place(name, RF)``: keep it in registers, each thread holding the elements its part's leaves
    write; a later part must read them from the same threads (the same mapping of the tile onto
    threads), which ``check()`` verifies.  A normalization keeps its row this way::

        Fused<block>[Move(X:GL -> Xr:GL); Reduce(sum over c: Xr:GL -> S:GL); Pointwise(Xr, S -> Y)]
          place("Xr", RF), place("S", SH)   ==>
        Fused<block>[Move(X:GL -> Xr:RF); Reduce(sum over c: Xr:RF -> S:SH); Pointwise(Xr:RF, S:SH -> Y)]
          part(i, tile(c=8) >> to_threads(), done()) for each part: X is read from memory once

    * ``name``: an intermediate of the fused spec (a tensor a body spec writes that is no result).
    * ``memory``: ``SH`` (the default) or ``RF``.  The fused spec must be at the block level
      (``tile(...) >> to_blocks()`` first), and ``place`` comes before any ``part``.
    * ``pad``: shared memory only — the buffer's extent along the tile's major dim rounded up to a
      multiple of ``pad`` (a part may then walk it in passes of ``pad`` elements, the last one
      partial: reductions stop at the tile's end, stores to global memory are predicated there)::

          place("Xr", SH, pad=2048):   Xr:SH bf16[1x12500] in a buffer of 1 x 14336

    * ``swizzle``: shared memory only — False keeps a tile of several lines unswizzled, each line at
      its own length: for lines that threads walk in consecutive 16-byte chunks (several rows of a
      row kernel), which meet no bank conflict, where the swizzle would round each line up to a
      power of two::

          place("Xr", SH, swizzle=False):   Xr:SH bf16[2x14336] in 2 x 14336, not 2 x 32768
    """

    name: str
    memory: Memory = SH
    pad: int | None = None
    swizzle: bool = True

    def apply(self, sched):
        path, node = _fused_focus(self, sched)
        spec: Fused = node.spec
        if any(self.name in {t.name for t in p.spec.operands} and (p.loops or p.children) for p in node.body):
            raise ScheduleError("place(...) comes before part(...): the parts are refined with the places they read",
                                strategy=self, spec=spec)
        local = {t.name: t for t in spec.locals}
        if self.name not in local:
            raise ScheduleError("only an intermediate of the fused spec can be placed on chip", strategy=self,
                                spec=spec, field="name", value=self.name,
                                allowed=", ".join(map(repr, local)) or "none (this fused spec has no intermediate)")
        if self.memory not in (SH, RF):
            raise ScheduleError("an intermediate is placed in shared memory or in registers", strategy=self,
                                spec=spec, field="memory", value=self.memory, allowed="SH, RF")
        if spec.level != BLOCK:
            raise ScheduleError("an on-chip intermediate belongs to a block: tile the fused spec onto blocks first",
                                strategy=self, spec=spec, field="level", value=str(spec.level), allowed="block",
                                fix="tile(...) >> to_blocks(), then place(...)")
        if self.pad is not None and (self.memory != SH or isinstance(self.pad, bool) or not isinstance(self.pad, int)
                                     or self.pad < 1):
            raise ScheduleError("pad rounds a shared buffer up to a multiple of a positive number of elements",
                                strategy=self, spec=spec, field="pad", value=self.pad,
                                allowed="None, or an int >= 1 with memory=SH", fix="place(name, SH, pad=<pass length>)")
        t = local[self.name]
        keep = tuple(d for d in t.dims)
        if self.memory == RF:
            on = t.on_chip(RF, keep=keep)
        else:
            # a tile of one line along its major dim (a row of a row kernel) has no rows to
            # conflict: each thread's 16-byte chunks are consecutive, and a swizzle over 8 rows
            # would size the buffer for 8
            lines = 1
            for d, e in zip(t.dims, t.shape):
                lines *= 1 if d == t.tensor.major else e
            if not isinstance(self.swizzle, bool) or (not self.swizzle and self.memory != SH):
                raise ScheduleError("swizzle is a bool for a shared tile", strategy=self, spec=spec,
                                    field="swizzle", value=self.swizzle, allowed="True, False")
            sw = auto_swizzle(t.extent(t.tensor.major), t.dtype.bits) if lines > 1 and self.swizzle else \
                Swizzle(0, 0, 0)
            on = t.on_chip(SH, keep=keep, swizzle=sw)
            if self.pad is not None:
                if lines > 1:
                    raise ScheduleError("pad applies to a tile of one line along its major dim (a row)",
                                        strategy=self, spec=spec, field="pad", value=self.pad, allowed="None here",
                                        fix="tile the other dims to 1 first, or leave pad out")
                major = on.tensor.dims.index(on.tensor.major)
                shape = list(on.tensor.shape)
                shape[major] = -(-shape[major] // self.pad) * self.pad
                on = attrs.evolve(on, tensor=attrs.evolve(on.tensor, shape=tuple(shape)))
        new = attrs.evolve(node, spec=spec.with_operand(self.name, on), strategy=record(node, self),
                           body=with_operand_in_parts(node.body, self.name, on))
        return sched.replace_path(path, new)

    def __repr__(self):
        pad = f", pad={self.pad!r}" if self.pad is not None else ""
        sw = "" if self.swizzle is True else f", swizzle={self.swizzle!r}"
        return f"place({self.name!r}, {self.memory!r}{pad}{sw})"

    def __str__(self):
        pad = f", pad={self.pad}" if self.pad is not None else ""
        sw = "" if self.swizzle is True else f", swizzle={self.swizzle}"
        return f"place({self.name}, {self.memory}{pad}{sw})"
