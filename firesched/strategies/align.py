"""``align(c=8)``: start a block's row at the aligned vector that holds its first element.

A row whose length is not a multiple of a 16-byte vector (4,095 f16 elements, 50,001 bf16) starts
wherever the row before it ended: row ``r`` of a ``rows x 4095`` tensor starts at element
``4095·r``, at every offset modulo 8.  Accessed in place, its elements go one at a time: an
instruction, an address and a predicate for every 2 bytes.  ``align`` moves the block's frame
along the row back to the vector boundary at or before the row's first element and widens the
tile by ``vec - 1``, so that the window still covers the row and every access inside it is a
whole aligned vector::

    row r starts at element 4095·r = 8q + p   (p = 4095·r mod 8, the row's phase)

    memory:  ... | 8q .. 8q+7 | 8q+8 .. 8q+15 | ... | .. 8q+4102-1 | ...
    row r:            |p ----------------------- 4095 elements ------|
    window:  [8q, 8q + 4102): 513 vectors of 8, columns -p .. 4101-p of row r

    Fused<block>[Move(X:GL f16[1x4095] -> Xr:GL f16[1x4095]); ... ]       <- focus
      align(c=8)
      for c0 in seq(1) aligned(8):
        Fused<block>[Move(X:GL f16[1x4102] -> Xr:GL f16[1x4102]); ... ]   <- focus: the window

The global operands over the row (``X``, ``Y``: equally strided, so one phase serves them all) are
read and written in whole 16-byte vectors, but for the window's first and last, which hold
elements of the neighbouring rows and go element by element.  A row placed in shared memory
(``place("Xr", SH)``) is copied into the window by the block in whole 16-byte ``cp.async`` chunks,
the last one reading up to the row's end.  An operand along the row alone (a weight ``W``)
starts at ``-p`` too: a run of 8 16-bit elements comes from the two aligned vectors holding it
(``convert.shift_halves_b16x8``), other runs element by element.  Reductions skip the window's
elements outside the row, and a mean keeps the row's count (it becomes a sum scaled by
``1 / cols``).  The phase is computed at run time from the row's index; ``check()`` proves every
vector aligned and every element outside the row untouched.
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..schedule import Loop, Node
from ..tensor import BLOCK, GL
from .base import Strategy, fresh_var
from .mapping import whole_means


def _cluster_part(sched, d: str) -> bool:
    """Whether the focus's ``d`` is a part of a row that a thread-block cluster splits."""
    return any(lp.dim == d and lp.cluster > 1 for n in sched.focus_path() for lp in n.loops)


@attrs.frozen(repr=False, init=False)
class align(Strategy):
    """``align(c=8)``: the block's tile along ``c`` starts at the ``8``-element vector boundary at
    or before its first element, and is ``8 - 1`` elements wider (module docstring).

    Before and after, a RMSNorm row of 4,095 f16 elements::

        Fused<block>[Move(X:GL f16[1x4095] -> Xr:GL f16[1x4095]); ...; Pointwise(mul: N, W:GL f16[4095] -> Y)]
          align(c=8)
          for c0 in seq(1) aligned(8):
            Fused<block>[Move(X:GL f16[1x4102] -> Xr:GL f16[1x4102]); ...; Pointwise(... -> Y:GL f16[1x4102])]

    * ``**dims``: one dimension, the row's contiguous one, -> the elements of a vector (a power of
      two; 8 for 16-bit types, 4 for f32: 16 bytes).

    Apply it to a block-level focus (after ``tile(...) >> to_blocks()``) that holds one row (its
    other dims of extent 1) whole, or a thread-block cluster's part of one, before ``place``.  A
    part of whole vectors starts at the row's phase too; its window reaches ``vec - 1`` elements
    into the next part, which it leaves to that part's block (``lower.rules.align``)::

        tile(r=1, c=16384) >> to_blocks(cluster=8) >> align(c=8)     # a row of 131,071 bf16
        for r0 in block(R), c0 in block(8) clusters(8):
          for c1 in seq(1) aligned(8):
            Fused<block>[Move(X:GL bf16[1x16391] -> Xr:GL bf16[1x16391]); ...]
    """

    dim: str
    vec: int

    def __init__(self, **dims: int):
        if len(dims) != 1:
            raise ScheduleError("align takes one dimension: the row's contiguous one", strategy=None,
                                field="dims", value=dims, allowed="e.g. align(c=8)")
        ((d, v),) = dims.items()
        self.__attrs_init__(d, v)

    def apply(self, sched):
        focus = sched.focus
        if not focus.is_open and any(t.memory != GL for t in focus.spec.operands):
            raise ScheduleError("align comes before place: the focus's intermediates are already on chip, in the "
                                "frame before the shift", strategy=self, spec=focus.spec,
                                fix="apply align(...) right after to_blocks(), then place(...)")
        node = sched.open_focus(self)
        spec = node.spec
        d, v = self.dim, self.vec
        if isinstance(v, bool) or not isinstance(v, int) or v < 2 or v & (v - 1):
            raise ScheduleError("a vector is a power of two elements", strategy=self, spec=spec, field=d, value=v,
                                allowed="2, 4, 8, 16 (16 bytes: 8 of a 16-bit type, 4 of f32)")
        if spec.level != BLOCK:
            raise ScheduleError("align shifts a block's row", strategy=self, spec=spec, field="level",
                                value=str(spec.level), allowed="block", fix="tile(r=1) >> to_blocks(), then align(...)")
        ext = spec.extents
        if d not in ext:
            raise ScheduleError(f"the focus has no dimension {d!r}", strategy=self, spec=spec, field=d, value=v,
                                allowed=", ".join(spec.dims))
        more = [o for o in ext if o != d and ext[o] != 1 and o not in spec.reduction_dims]
        if more:
            raise ScheduleError(f"align shifts one row a block (each row has its own phase); the block holds "
                                f"{ext[more[0]]} along {more[0]}", strategy=self, spec=spec, field=more[0],
                                value=ext[more[0]], allowed="1", fix=f"tile({more[0]}=1) >> to_blocks(), then align")
        on_chip = [t.name for t in spec.operands if t.memory != GL]
        if on_chip:
            raise ScheduleError(f"align comes before place: {on_chip[0]} is already on chip, in the frame before the "
                                "shift", strategy=self, spec=spec, field="place", value=on_chip[0],
                                fix="apply align(...) right after to_blocks(), then place(...)")
        for t in spec.operands:
            if d not in t.dims:
                continue
            if t.tensor.major != d:
                raise ScheduleError(f"{t.name} is not contiguous along {d} (its major dim is {t.tensor.major}): a "
                                    "vector of the window would not be contiguous in memory", strategy=self,
                                    spec=spec, field=d, value=t.name, fix=f"align the contiguous dim, {t.tensor.major}")
            if t.extent(d) != t.tensor.extent(d) and not _cluster_part(sched, d):
                raise ScheduleError(f"the block holds {t.extent(d)} of {t.name}'s {t.tensor.extent(d)} along {d}: align "
                                    "shifts a whole row, or a thread-block cluster's part of one (blocks of no "
                                    "cluster do not leave each other's elements alone)", strategy=self, spec=spec,
                                    field=d, value=t.extent(d), allowed=str(t.tensor.extent(d)),
                                    fix=f"leave {d} untiled above align, or to_blocks(cluster=...) along {d}")
            if t.extent(d) != t.tensor.extent(d) and t.extent(d) % v:
                raise ScheduleError(f"a cluster's part of {t.extent(d)} elements along {d} is not whole vectors of {v}: "
                                    "the parts after the first would start at other phases than the row's",
                                    strategy=self, spec=spec, field=d, value=t.extent(d),
                                    allowed=f"a multiple of {v}",
                                    fix=f"tile({d}={-(-t.extent(d) // v) * v}) >> to_blocks(cluster=...)")
        window = ext[d] + v - 1
        child = whole_means(spec.with_extents(**{d: window}), spec, d)
        lp = Loop(fresh_var(sched, d), 1, ((d, window),), align=v)
        return sched.replace_focus(attrs.evolve(node, strategy=self, loops=(lp,), body=(Node(child),)))

    def __repr__(self):
        return f"align({self.dim}={self.vec!r})"

    __str__ = __repr__


__all__ = ["align"]
