"""CuTe-style hierarchical layouts, swizzles, thread tensors and thread-value (TV) layouts.

A *layout* is a function from coordinates to offsets, written ``shape:stride``.  Shapes and
strides are *IntTuples* (an int or a nested tuple of IntTuples) with the same nesting.  Keeping
the whole description of "which thread touches which element, at which address" in one small
algebra lets the strategies build tilings by composing functions, lets the CPU interpreter
evaluate them on plain ints, and lets the code generator evaluate the very same functions on
symbolic index expressions.  That last use is why every evaluation path below uses only ``+``,
``*``, ``//`` and ``%`` on coordinates (and ``&``, ``>>``, ``^`` in swizzles): decisions are made
on the static shapes and strides, never on the coordinate values.

The conventions and the algebra (coalesce, composition, complement, inverses, divides and
products) follow CuTe, so layouts printed by CuTe or written in its documentation can be used
verbatim:

* an integer index becomes a coordinate colexicographically (the first mode varies fastest);
* when an integer is given to a hierarchical mode, the last sub-mode is not reduced modulo its
  size, exactly like CuTe's ``crd2idx``; composition reads the last mode of ``A`` the same
  way, so ``composition(A, B)`` stays meaningful where ``B`` reaches past ``size(A)`` (tiles
  that overhang the data, to be predicated);
* the default stride is the compact column-major one.

Every function that rejects its input raises :class:`LayoutError`, a ``ValueError`` whose message
names the function, the argument, the offending value and what would be valid.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from typing import Any, Union

import attrs
import numpy as np

from firesched.draw import repr_svg as _repr_svg
from firesched.errors import FireschedError

#: An int or a (nested) tuple of ints, e.g. ``8`` or ``(4, (2, 2))``.
IntTuple = Union[int, tuple]

__all__ = [
    "IntTuple", "LayoutError", "LayoutIndexError",
    "Layout", "Swizzle", "ComposedLayout", "TVLayout",
    "size", "cosize", "rank", "depth", "flatten", "coalesce", "filter", "make_layout",
    "composition", "complement", "right_inverse", "left_inverse",
    "logical_divide", "zipped_divide", "tiled_divide", "flat_divide",
    "logical_product", "zipped_product", "tiled_product", "blocked_product", "raked_product",
    "idx2crd", "crd2idx", "swizzle_for_elements",
    "NO_SWIZZLE", "SW32", "SW64", "SW128", "WARP", "QUAD_PAIR", "WARPGROUP",
]


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class LayoutError(FireschedError, ValueError):
    """A layout function was given something outside its domain.

    It is a ``ValueError`` so that callers who only know "bad value" can catch it, and a
    ``FireschedError`` so that it is never confused with a bug inside firesched.
    """


class LayoutIndexError(LayoutError, IndexError):
    """A mode index out of range; also an ``IndexError`` so that Python's protocols work."""


def _err(func: str, arg: str, value: Any, problem: str, valid: str,
         cls: type[LayoutError] = LayoutError) -> LayoutError:
    return cls(f"{func}: {arg}={value!r} {problem}; {valid}")


# ---------------------------------------------------------------------------------------------
# IntTuple helpers (these work on static shapes and strides only)
# ---------------------------------------------------------------------------------------------


def _as_inttuple(x: Any, func: str, arg: str, *, positive: bool) -> IntTuple:
    """Normalise ``x`` (lists become tuples, numpy ints become ints) and validate its leaves."""

    def rec(v: Any) -> IntTuple:
        if isinstance(v, (tuple, list)):
            if len(v) == 0:
                raise _err(func, arg, x, "contains an empty tuple",
                           "every tuple of an IntTuple needs at least one entry")
            return tuple(rec(e) for e in v)
        if isinstance(v, (bool, np.bool_)):
            raise _err(func, arg, x, f"has a boolean entry {v!r}", "use ints or nested tuples of ints")
        try:
            i = operator.index(v)
        except TypeError:
            raise _err(func, arg, x, f"has a non-integer entry {v!r}",
                       "use ints or nested tuples of ints") from None
        if positive and i < 1:
            raise _err(func, arg, x, f"has the entry {i}", "shape entries must be positive (>= 1)")
        return int(i)

    return rec(x)


def _product(t: IntTuple) -> int:
    if isinstance(t, tuple):
        return math.prod(_product(e) for e in t)
    return t


def _flat(t: IntTuple) -> list[int]:
    if isinstance(t, tuple):
        return [leaf for e in t for leaf in _flat(e)]
    return [t]


def _congruent(a: IntTuple, b: IntTuple) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_congruent(x, y) for x, y in zip(a, b))
    return not isinstance(a, tuple) and not isinstance(b, tuple)


def _all_zero(t: IntTuple) -> bool:
    return all(d == 0 for d in _flat(t))


def _compact_colmajor(shape: IntTuple, current: int = 1) -> tuple[IntTuple, int]:
    """The compact column-major stride of ``shape`` starting at ``current``, and the next one."""
    if isinstance(shape, tuple):
        out = []
        for s in shape:
            d, current = _compact_colmajor(s, current)
            out.append(d)
        return tuple(out), current
    return current, current * shape


def _fmt(t: IntTuple) -> str:
    if isinstance(t, tuple):
        return "(" + ",".join(_fmt(e) for e in t) + ")"
    return str(t)


def _depth(t: IntTuple) -> int:
    if isinstance(t, tuple):
        return 1 + max(_depth(e) for e in t)
    return 0


def _is_plain_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


_NOT_AN_INDEX = (str, bytes, float, complex, type(None))


def _norm_coord(c: Any) -> Any:
    """Lists become tuples.  Leaves are left alone (they may be symbolic) unless they are values
    that can never be an index, which would otherwise slip through ``*`` and ``%`` silently."""
    if isinstance(c, (tuple, list)):
        return tuple(_norm_coord(e) for e in c)
    if isinstance(c, _NOT_AN_INDEX):
        raise TypeError(f"{type(c).__name__} is not an index")
    return c


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------------
# Coordinate <-> index.  Only + * // % touch coordinate values (they may be symbolic).
# ---------------------------------------------------------------------------------------------


def _add(terms: list[Any]) -> Any:
    """Sum the terms that are not statically zero (``None``); ``None`` when all are."""
    acc = None
    for t in terms:
        if t is None:
            continue
        acc = t if acc is None else acc + t
    return acc


class _CoordMismatch(Exception):
    """Internal: a coordinate that does not fit the shape; turned into a LayoutError by callers."""


def _c2i(crd: Any, shape: IntTuple, stride: IntTuple) -> Any:
    """Offset of ``crd`` in ``shape:stride``, or ``None`` where it is statically zero."""
    if isinstance(crd, tuple):
        if not isinstance(shape, tuple) or len(crd) != len(shape):
            raise _CoordMismatch
        return _add([_c2i(c, s, d) for c, s, d in zip(crd, shape, stride)])
    if _all_zero(stride):
        return None
    if not isinstance(shape, tuple):
        return crd if stride == 1 else crd * stride
    # A scalar for a hierarchical mode: split it colexicographically; the last sub-mode takes
    # whatever is left, unreduced (CuTe's crd2idx), so the layout extends past its size.
    terms = []
    rest = crd
    last = len(shape) - 1
    for i, (s, d) in enumerate(zip(shape, stride)):
        if i == last:
            terms.append(_c2i(rest, s, d))
            break
        n = _product(s)
        if n == 1:
            continue
        if not _all_zero(d):
            terms.append(_c2i(rest % n, s, d))
        rest = rest // n
    return _add(terms)


def _crd2idx(func: str, crd: Any, shape: IntTuple, stride: IntTuple) -> Any:
    try:
        crd = _norm_coord(crd)
        out = _c2i(crd, shape, stride)
    except _CoordMismatch:
        raise _err(func, "coord", crd, f"does not fit shape {_fmt(shape)}",
                   "pass a linear index, a coordinate with the nesting of the shape (an int may "
                   "stand for a whole sub-tuple), or one coordinate per top-level mode") from None
    except TypeError as e:
        raise _err(func, "coord", crd, f"cannot be used as a coordinate ({e})",
                   "coordinates are ints, index expressions supporting + * // %, or tuples of them"
                   ) from e
    return 0 if out is None else out


def crd2idx(crd: Any, shape: IntTuple, stride: IntTuple | None = None) -> Any:
    """Offset of the coordinate ``crd`` in ``shape:stride`` (compact column-major by default).

    ``crd`` may be an int (a linear index), a coordinate congruent with ``shape``, or anything in
    between (an int stands for a whole sub-tuple).  Works on symbolic index expressions.
    """
    shape = _as_inttuple(shape, "crd2idx", "shape", positive=True)
    if stride is None:
        stride = _compact_colmajor(shape)[0]
    else:
        stride = _as_inttuple(stride, "crd2idx", "stride", positive=False)
        if not _congruent(shape, stride):
            raise _err("crd2idx", "stride", stride, f"is not congruent with shape {_fmt(shape)}",
                       "give the stride the same nesting as the shape")
    return _crd2idx("crd2idx", crd, shape, stride)


def idx2crd(idx: Any, shape: IntTuple, stride: IntTuple | None = None) -> Any:
    """The coordinate of the linear index ``idx`` in ``shape`` (colexicographic, first mode fastest).

    ``stride`` is the stride used to decompose the index (compact column-major by default).
    Every mode, the last included, is reduced modulo its size, as in CuTe.  When ``idx`` is
    already (partly) a tuple, each entry is an index into its own mode: ``idx2crd((1, 3),
    ((2, 2), 4)) == ((1, 0), 3)``.  Works on symbolic index expressions.
    """
    shape = _as_inttuple(shape, "idx2crd", "shape", positive=True)
    if stride is not None:
        stride = _as_inttuple(stride, "idx2crd", "stride", positive=True)
        if not _congruent(shape, stride):
            raise _err("idx2crd", "stride", stride, f"is not congruent with shape {_fmt(shape)}",
                       "give the stride the same nesting as the shape")

    def rec(i: Any, s: IntTuple, d: IntTuple | None) -> Any:
        if isinstance(i, tuple):
            if not isinstance(s, tuple) or len(i) != len(s):
                raise _err("idx2crd", "idx", idx, f"does not fit shape {_fmt(shape)}",
                           "pass an int or a tuple with the nesting of the shape")
            subs = d if d is not None else (None,) * len(s)
            return tuple(rec(a, b, c) for a, b, c in zip(i, s, subs))
        if d is None:
            d = _compact_colmajor(s)[0]
        if isinstance(s, tuple):
            return tuple(rec(i, b, c) for b, c in zip(s, d))
        if s == 1:
            return 0
        return (i if d == 1 else i // d) % s

    try:
        return rec(_norm_coord(idx), shape, stride)
    except TypeError as e:
        raise _err("idx2crd", "idx", idx, f"cannot be used as an index ({e})",
                   "indices are ints or expressions supporting // and %") from e


# ---------------------------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------------------------


@attrs.frozen(init=False, repr=False)
class Layout:
    """A function from coordinates to offsets: ``shape:stride``, e.g. ``(4,8):(8,1)``.

    ``stride`` defaults to the compact column-major stride.  Lists are accepted and stored as
    tuples, so equal layouts compare and hash equal however they were written.
    """

    shape: IntTuple
    stride: IntTuple

    def __init__(self, shape: IntTuple, stride: IntTuple | None = None):
        shape = _as_inttuple(shape, "Layout", "shape", positive=True)
        if stride is None:
            stride = _compact_colmajor(shape)[0]
        else:
            stride = _as_inttuple(stride, "Layout", "stride", positive=False)
            if not _congruent(shape, stride):
                raise _err("Layout", "stride", stride, f"is not congruent with shape {_fmt(shape)}",
                           "give the stride exactly the nesting of the shape, e.g. "
                           "Layout((4, (2, 2)), (1, (4, 8)))")
        self.__attrs_init__(shape, stride)

    @classmethod
    def _raw(cls, shape: IntTuple, stride: IntTuple) -> Layout:
        """Build from already normalised, congruent data (the algebra's results)."""
        obj = object.__new__(cls)
        obj.__attrs_init__(shape, stride)
        return obj

    # -- evaluation ------------------------------------------------------------------------

    def __call__(self, *coord: Any) -> Any:
        """The offset of a coordinate.

        Accepts one linear index, one (nested) coordinate, or one coordinate per top-level mode.
        Only ``+ * // %`` are applied to the coordinate values, so index expressions (and numpy
        arrays, which evaluate many coordinates at once) work as well as ints.
        """
        if not coord:
            raise _err("Layout.__call__", "coord", (), "is empty",
                       f"pass a linear index or a coordinate for shape {_fmt(self.shape)}")
        return _crd2idx("Layout.__call__", coord[0] if len(coord) == 1 else coord,
                        self.shape, self.stride)

    def offsets(self) -> np.ndarray:
        """``[self(i) for i in range(self.size())]`` as an int64 array (evaluated vectorised)."""
        n = self.size()
        out = self(np.arange(n, dtype=np.int64))
        return np.broadcast_to(np.asarray(out, dtype=np.int64), (n,)).copy()

    # -- structure -------------------------------------------------------------------------

    def size(self) -> int:
        """Number of coordinates in the domain."""
        return _product(self.shape)

    def cosize(self) -> int:
        """One past the largest offset, ``self(size - 1) + 1``."""
        return 1 + sum((s - 1) * d for s, d in zip(_flat(self.shape), _flat(self.stride)))

    @property
    def rank(self) -> int:
        """Number of top-level modes (1 for an integral shape)."""
        return len(self.shape) if isinstance(self.shape, tuple) else 1

    @property
    def depth(self) -> int:
        """Nesting depth of the shape: 0 for an int, 1 for a flat tuple, ..."""
        return _depth(self.shape)

    def __len__(self) -> int:
        return self.rank

    def __getitem__(self, i: int) -> Layout:
        """The sub-layout of top-level mode ``i`` (a layout of integral shape is its own mode 0)."""
        try:
            j = operator.index(i)
        except TypeError:
            raise _err("Layout.__getitem__", "i", i, "is not an int",
                       f"index a mode with 0 <= i < {self.rank}", cls=LayoutIndexError) from None
        r = self.rank
        if not -r <= j < r:
            raise _err("Layout.__getitem__", "i", i, f"is out of range for {self} (rank {r})",
                       f"use -{r} <= i < {r}", cls=LayoutIndexError)
        if not isinstance(self.shape, tuple):
            return self
        return Layout._raw(self.shape[j], self.stride[j])

    def __iter__(self):
        for i in range(self.rank):
            yield self[i]

    def __str__(self) -> str:
        return f"{_fmt(self.shape)}:{_fmt(self.stride)}"

    def __repr__(self) -> str:
        return f"Layout({self.shape!r}, {self.stride!r})"

    def _repr_svg_(self) -> str | None:
        """A picture for notebooks (``firesched.draw``); None for pictures too large to show."""
        return _repr_svg(self)


def _expect_layout(x: Any, func: str, arg: str) -> Layout:
    if isinstance(x, Layout):
        return x
    raise _err(func, arg, x, "is not a Layout", "pass a Layout, e.g. Layout((4, 8), (8, 1))")


def _layout_or_shape(x: Any, func: str, arg: str) -> Layout:
    """A Layout as given, or a shape meaning its compact column-major layout."""
    if isinstance(x, Layout):
        return x
    if isinstance(x, (ComposedLayout, TVLayout)):
        raise _err(func, arg, x, "is not a plain Layout", "pass a Layout or a shape")
    shape = _as_inttuple(x, func, arg, positive=True)
    return Layout._raw(shape, _compact_colmajor(shape)[0])


# ---------------------------------------------------------------------------------------------
# Free functions on layouts and IntTuples
# ---------------------------------------------------------------------------------------------


def size(x: Any) -> int:
    """Size of a layout (or composed / TV layout), or the product of an IntTuple shape."""
    if isinstance(x, (Layout, ComposedLayout, TVLayout)):
        return x.size()
    return _product(_as_inttuple(x, "size", "x", positive=True))


def cosize(layout: Any) -> int:
    """One past the largest offset of a layout or composed layout."""
    if isinstance(layout, (Layout, ComposedLayout)):
        return layout.cosize()
    raise _err("cosize", "layout", layout, "is not a Layout", "pass a Layout or ComposedLayout")


def rank(x: Any) -> int:
    """Number of top-level modes of a layout or IntTuple."""
    if isinstance(x, Layout):
        return x.rank
    t = _as_inttuple(x, "rank", "x", positive=False)
    return len(t) if isinstance(t, tuple) else 1


def depth(x: Any) -> int:
    """Nesting depth of a layout's shape or of an IntTuple (0 for an int)."""
    if isinstance(x, Layout):
        return x.depth
    return _depth(_as_inttuple(x, "depth", "x", positive=False))


def flatten(x: Any) -> Any:
    """Remove the hierarchy: a layout with flat shape and stride, or a flat tuple of an IntTuple."""
    if isinstance(x, Layout):
        if not isinstance(x.shape, tuple):
            return x
        return Layout._raw(tuple(_flat(x.shape)), tuple(_flat(x.stride)))
    t = _as_inttuple(x, "flatten", "x", positive=False)
    return tuple(_flat(t)) if isinstance(t, tuple) else t


def make_layout(*layouts: Any) -> Layout:
    """Concatenate layouts as the modes of a new layout: ``make_layout(A, B) = (A,B)``.

    A single iterable of layouts is accepted too.  Even one layout is wrapped as a rank-1
    tuple, as in CuTe, so ``make_layout(A)[0] == A``.
    """
    if len(layouts) == 1 and not isinstance(layouts[0], Layout) \
            and isinstance(layouts[0], Iterable) and not isinstance(layouts[0], (str, bytes)):
        layouts = tuple(layouts[0])
    if not layouts:
        raise _err("make_layout", "layouts", layouts, "is empty", "pass at least one Layout")
    for i, a in enumerate(layouts):
        _expect_layout(a, "make_layout", f"layouts[{i}]")
    return Layout._raw(tuple(a.shape for a in layouts), tuple(a.stride for a in layouts))


def _by_mode_profile(func: str, layout: Layout, profile: Any, leaf) -> Layout:
    if isinstance(profile, (tuple, list)):
        if not profile or len(profile) > layout.rank:
            raise _err(func, "profile", profile, f"does not fit {layout} (rank {layout.rank})",
                       f"use None, an int, or a tuple of 1..{layout.rank} entries")
        modes = [_by_mode_profile(func, layout[i], p, leaf) for i, p in enumerate(profile)]
        modes += [layout[i] for i in range(len(profile), layout.rank)]
        return make_layout(modes)
    if profile is not None:
        _as_inttuple(profile, func, "profile", positive=False)
    return leaf(layout)


def _coalesce_flat(layout: Layout) -> Layout:
    shapes, strides = [1], [0]
    for s, d in zip(_flat(layout.shape), _flat(layout.stride)):
        if s == 1:
            continue
        if shapes[-1] == 1:
            shapes[-1], strides[-1] = s, d
        elif shapes[-1] * strides[-1] == d:
            shapes[-1] *= s
        else:
            shapes.append(s)
            strides.append(d)
    if len(shapes) == 1:
        return Layout._raw(shapes[0], strides[0])
    return Layout._raw(tuple(shapes), tuple(strides))


def coalesce(layout: Layout, profile: Any = None) -> Layout:
    """Simplify ``layout`` as a function of a linear index: same size, same values, depth <= 1.

    Size-1 modes are dropped and neighbours ``s0:d0, s1:s0*d0`` merge into ``s0*s1:d0``.  With a
    tuple ``profile`` each mode named by the profile is coalesced on its own (the values of the
    profile do not matter), so a 2-D layout stays 2-D.
    """
    layout = _expect_layout(layout, "coalesce", "layout")
    return _by_mode_profile("coalesce", layout, profile, _coalesce_flat)


def _filter_flat(layout: Layout) -> Layout:
    kept = [(s, d) for s, d in zip(_flat(layout.shape), _flat(layout.stride)) if s != 1 and d != 0]
    if not kept:
        return Layout._raw(1, 0)
    return _coalesce_flat(Layout._raw(tuple(s for s, _ in kept), tuple(d for _, d in kept)))


def filter(layout: Layout, profile: Any = None) -> Layout:
    """Drop stride-0 (broadcast) and size-1 modes, then coalesce: the distinct offsets only."""
    layout = _expect_layout(layout, "filter", "layout")
    return _by_mode_profile("filter", layout, profile, _filter_flat)


def _by_mode_tiler(func: str, a: Layout, tiler: Any, leaf) -> Layout:
    """Apply ``leaf(a, tiler_layout)``; tuples of tilers apply mode by mode, ``None`` keeps a mode."""
    if tiler is None:
        return a
    if isinstance(tiler, Layout):
        return leaf(a, tiler)
    if isinstance(tiler, (tuple, list)):
        if not tiler or len(tiler) > a.rank:
            raise _err(func, "tiler", tiler, f"has {len(tiler)} modes but the layout {a} has rank {a.rank}",
                       f"a by-mode tiler needs 1..{a.rank} entries (Layout, int, None or a tuple)")
        modes = [_by_mode_tiler(func, a[i], t, leaf) for i, t in enumerate(tiler)]
        modes += [a[i] for i in range(len(tiler), a.rank)]
        return make_layout(modes)
    if isinstance(tiler, (ComposedLayout, TVLayout, Swizzle)):
        raise _err(func, "tiler", tiler, "cannot be used as a tiler",
                   "a tiler is a Layout, an int, None, or a tuple of those")
    n = _as_inttuple(tiler, func, "tiler", positive=True)
    return leaf(a, Layout._raw(n, 1))


def _compose_1d(func: str, a: Layout, s: int, d: int) -> Layout:
    """``a o s:d`` for an integral mode ``s:d`` (a is treated as coalesced, last mode unbounded)."""
    if s == 1 or d == 0:
        return Layout._raw(s, 0)
    flat = _coalesce_flat(a)
    fs, fd = _flat(flat.shape), _flat(flat.stride)
    sign = 1 if d > 0 else -1
    rest_shape, rest_stride = s, abs(d)
    shapes, strides = [], []
    for cs, cd in zip(fs[:-1], fd[:-1]):
        if rest_shape == 1:
            break
        if cs % rest_stride and rest_stride % cs:
            raise _err(func, "B", Layout._raw(s, d),
                       f"breaks the stride divisibility condition on {a} (mode size {cs} and "
                       f"remaining stride {rest_stride} divide neither way)",
                       "use strides that divide or are multiples of the layout's mode sizes")
        next_shape = _ceil_div(cs, rest_stride)
        if next_shape != 1:
            new = min(next_shape, rest_shape)
            if rest_shape % new:
                raise _err(func, "B", Layout._raw(s, d),
                           f"breaks the shape divisibility condition on {a} ({rest_shape} remaining "
                           f"elements cannot be split by a mode of {new})",
                           "use tile sizes that divide or are multiples of the layout's mode sizes")
            shapes.append(new)
            strides.append(sign * rest_stride * cd)
            rest_shape //= new
        rest_stride = _ceil_div(rest_stride, cs)
    if rest_shape != 1 or not shapes:
        shapes.append(rest_shape)
        strides.append(sign * rest_stride * fd[-1])
    if len(shapes) == 1:
        return Layout._raw(shapes[0], strides[0])
    return _coalesce_flat(Layout._raw(tuple(shapes), tuple(strides)))


def _compose(func: str, a: Layout, b: Layout) -> Layout:
    if isinstance(b.shape, tuple):
        return make_layout([_compose(func, a, bi) for bi in b])
    return _compose_1d(func, a, b.shape, b.stride)


def composition(A: Any, B: Any) -> Any:
    """The layout ``R`` with ``R(i) == A(B(i))`` for every ``i < size(B)``, shaped like ``B``.

    The law needs the modes of ``B`` not to interfere (``B`` injective, or with broadcast
    modes), since ``B``'s modes are composed one at a time.

    ``B`` is a Layout; an int ``n`` means ``n:1``; a tuple applies its entries (Layouts, ints,
    ``None`` for "leave this mode", or nested tuples) to the modes of ``A`` one by one, so the
    shape ``(m, n)`` picks the top-left m x n block.  ``A`` may be a ComposedLayout, whose swizzle
    and offset are kept.  Raises when the divisibility conditions fail, i.e. when the result is
    not a layout.
    """
    if isinstance(A, ComposedLayout):
        return ComposedLayout(A.swizzle, A.offset, composition(A.layout, B))
    A = _expect_layout(A, "composition", "A")
    return _by_mode_tiler("composition", A, B, lambda a, b: _compose("composition", a, b))


def complement(layout: Layout, cotarget: Any = None) -> Layout:
    """The ordered layout of the offsets ``layout`` does not reach, up to ``cotarget``.

    ``make_layout(layout, complement(layout, N))`` is a bijection onto ``range(N)`` when
    ``layout`` is injective and ``N`` is a multiple of its extent; otherwise the last mode is
    rounded up (``ceil``), as in CuTe, so that the pair covers at least ``N`` offsets.  The
    images of ``layout`` and its complement only share the offset 0.  ``cotarget`` (an int or
    a shape) defaults to ``cosize(layout)``.
    """
    layout = _expect_layout(layout, "complement", "layout")
    if cotarget is None:
        n = layout.cosize()
    else:
        n = _product(_as_inttuple(cotarget, "complement", "cotarget", positive=True))
    modes = sorted((d, s) for s, d in zip(_flat(layout.shape), _flat(layout.stride)) if s != 1 and d != 0)
    if modes and modes[0][0] < 0:
        raise _err("complement", "layout", layout, "has a negative stride",
                   "complement is defined for non-negative strides")
    shapes, strides = [], []
    current = 1
    for d, s in modes:
        if d % current:
            problem = ("is not injective: its modes overlap" if d < current else
                       f"has stride {d}, not a multiple of the extent {current} of the modes below it")
            raise _err("complement", "layout", layout, problem,
                       "complement needs an injective layout whose sorted strides divide each other's extents")
        shapes.append(d // current)
        strides.append(current)
        current = s * d
    shapes.append(_ceil_div(n, current))
    strides.append(current)
    return _coalesce_flat(Layout._raw(tuple(shapes), tuple(strides)))


def right_inverse(layout: Layout) -> Layout:
    """The largest compact ``R`` with ``layout(R(i)) == i`` for all ``i < size(R)``.

    It follows the strides 1, s0*d0, ... through the coalesced layout: for a bijection onto
    ``range(n)`` it is the full inverse.
    """
    layout = _expect_layout(layout, "right_inverse", "layout")
    flat = _coalesce_flat(layout)
    fs, fd = _flat(flat.shape), _flat(flat.stride)
    if any(d < 0 for d in fd):
        raise _err("right_inverse", "layout", layout, "has a negative stride",
                   "inverses are defined for non-negative strides")
    rstride = _flat(_compact_colmajor(tuple(fs))[0])
    shapes, strides = [], []
    current = 1
    while True:
        j = next((k for k, (s, d) in enumerate(zip(fs, fd)) if d == current and s != 1), None)
        if j is None:
            break
        shapes.append(fs[j])
        strides.append(rstride[j])
        current = fs[j] * fd[j]
    if not shapes:
        return Layout._raw(1, 0)
    return _coalesce_flat(Layout._raw(tuple(shapes), tuple(strides)))


def left_inverse(layout: Layout) -> Layout:
    """A layout ``Li`` with ``Li(layout(i)) == i`` for all ``i < size(layout)``.

    Defined for injective layouts that have a complement (CuTe builds it as the right inverse of
    the layout completed by its complement).
    """
    layout = _expect_layout(layout, "left_inverse", "layout")
    if any(s != 1 and d == 0 for s, d in zip(_flat(layout.shape), _flat(layout.stride))):
        raise _err("left_inverse", "layout", layout, "is not injective (it has a stride-0 mode)",
                   "left_inverse needs an injective layout")
    try:
        comp = complement(layout)
    except LayoutError as e:
        raise _err("left_inverse", "layout", layout, "has no complement, so no left inverse",
                   "pass an injective layout whose sorted strides divide each other's extents") from e
    return right_inverse(make_layout(layout, comp))


def _divide(func: str, a: Layout, b: Layout) -> Layout:
    return _compose(func, a, make_layout(b, complement(b, a.size())))


def logical_divide(A: Any, tiler: Any) -> Any:
    """Split ``A`` into (tile, rest): ``composition(A, make_layout(B, complement(B, size(A))))``.

    A tuple tiler divides mode by mode, giving ``((TileM,RestM), (TileN,RestN), ...)``.
    """
    if isinstance(A, ComposedLayout):
        return ComposedLayout(A.swizzle, A.offset, logical_divide(A.layout, tiler))
    A = _expect_layout(A, "logical_divide", "A")
    return _by_mode_tiler("logical_divide", A, tiler, lambda a, b: _divide("logical_divide", a, b))


def _hier_unzip(func: str, a: Layout, tiler: Any, split) -> Layout:
    """Regroup a by-mode split ``((t0,r0),(t1,r1),x)`` into ``((t0,t1),(r0,r1,x))``."""
    if tiler is None:
        return make_layout(Layout._raw(1, 0), a)
    if isinstance(tiler, (tuple, list)):
        if not tiler or len(tiler) > a.rank:
            raise _err(func, "tiler", tiler, f"has {len(tiler)} modes but the layout {a} has rank {a.rank}",
                       f"a by-mode tiler needs 1..{a.rank} entries (Layout, int, None or a tuple)")
        parts = [_hier_unzip(func, a[i], t, split) for i, t in enumerate(tiler)]
        tiles = make_layout([p[0] for p in parts])
        rests = make_layout([p[1] for p in parts] + [a[i] for i in range(len(tiler), a.rank)])
        return make_layout(tiles, rests)
    return _by_mode_tiler(func, a, tiler, split)


def zipped_divide(A: Layout, tiler: Any) -> Layout:
    """``((TileM,TileN,...), (RestM,RestN,...,L,...))``: mode 0 is the tile, mode 1 the tiles."""
    A = _expect_layout(A, "zipped_divide", "A")
    return _hier_unzip("zipped_divide", A, tiler, lambda a, b: _divide("zipped_divide", a, b))


def tiled_divide(A: Layout, tiler: Any) -> Layout:
    """``((TileM,TileN,...), RestM, RestN, ..., L, ...)``."""
    A = _expect_layout(A, "tiled_divide", "A")
    z = _hier_unzip("tiled_divide", A, tiler, lambda a, b: _divide("tiled_divide", a, b))
    return make_layout([z[0], *z[1]])


def flat_divide(A: Layout, tiler: Any) -> Layout:
    """``(TileM, TileN, ..., RestM, RestN, ..., L, ...)``."""
    A = _expect_layout(A, "flat_divide", "A")
    z = _hier_unzip("flat_divide", A, tiler, lambda a, b: _divide("flat_divide", a, b))
    return make_layout([*z[0], *z[1]])


def _product_2(func: str, a: Layout, b: Layout) -> Layout:
    cob = b.cosize()
    if cob < 1:
        raise _err(func, "B", b, f"has cosize {cob}", "use a layout with non-negative strides")
    try:
        comp = complement(a, a.size() * cob)
    except LayoutError as e:
        raise _err(func, "A", a, "has no complement, so it cannot be repeated",
                   "use an injective layout whose sorted strides divide each other's extents") from e
    return make_layout(a, _compose(func, comp, b))


def logical_product(A: Layout, B: Any) -> Layout:
    """Repeat ``A`` as laid out by ``B``: ``(A, complement(A, size(A)*cosize(B)) o B)``.

    A tuple ``B`` multiplies mode by mode.
    """
    A = _expect_layout(A, "logical_product", "A")
    return _by_mode_tiler("logical_product", A, B, lambda a, b: _product_2("logical_product", a, b))


def zipped_product(A: Layout, B: Any) -> Layout:
    """``((M,N,...), (TileM,TileN,...,L,...))`` from a by-mode logical product."""
    A = _expect_layout(A, "zipped_product", "A")
    return _hier_unzip("zipped_product", A, B, lambda a, b: _product_2("zipped_product", a, b))


def tiled_product(A: Layout, B: Any) -> Layout:
    """``((M,N,...), TileM, TileN, ..., L, ...)``."""
    A = _expect_layout(A, "tiled_product", "A")
    z = _hier_unzip("tiled_product", A, B, lambda a, b: _product_2("tiled_product", a, b))
    return make_layout([z[0], *z[1]])


def _rank_sensitive_product(func: str, A: Any, B: Any, raked: bool) -> Layout:
    A = _expect_layout(A, func, "A")
    B = _layout_or_shape(B, func, "B")
    r = max(A.rank, B.rank)

    def padded(x: Layout) -> Layout:
        if r == 1:
            return x
        return make_layout(list(x) + [Layout._raw(1, 0)] * (r - x.rank))

    a, b = padded(A), padded(B)
    prod = _product_2(func, a, b)
    pairs = [(prod[0], prod[1])] if r == 1 else [(prod[0][i], prod[1][i]) for i in range(r)]
    modes = [_coalesce_flat(make_layout(y, x) if raked else make_layout(x, y)) for x, y in pairs]
    return make_layout(modes)


def blocked_product(A: Layout, B: Any) -> Layout:
    """Tile ``A`` as a block repeated across ``B``, mode by mode: mode i is ``(A_i, B_i)``.

    ``blocked_product((2,5):(5,1), (3,4):(1,3)) == (6,(5,4)):(5,(1,30))``: a 2x5 row-major
    block repeated over a 3x4 column-major grid (each mode coalesced).
    """
    return _rank_sensitive_product("blocked_product", A, B, raked=False)


def raked_product(A: Layout, B: Any) -> Layout:
    """Like :func:`blocked_product` but interleaved ("cyclic"): mode i is ``(B_i, A_i)``."""
    return _rank_sensitive_product("raked_product", A, B, raked=True)


# ---------------------------------------------------------------------------------------------
# Swizzles
# ---------------------------------------------------------------------------------------------
#
# Swizzle(B, M, S) XORs B "row" bits into B "column" bits of an offset so that the rows of a
# shared-memory tile land in different banks.  With M = 4 and byte offsets (SW128 below) a
# 16-byte chunk is the unit that moves:
#
#     byte offset  ... 9 8 7 | 6 5 4 | 3 2 1 0
#                      y y y   z z z   (unit: 16 bytes, untouched)
#     Sw<3,4,3>:  zzz ^= yyy          (S = 3 is the distance from z up to y)
#
#     128-byte row r:  chunk c is stored at chunk position c ^ (r % 8)
#       row 0:  0 1 2 3 4 5 6 7
#       row 1:  1 0 3 2 5 4 7 6
#       row 2:  2 3 0 1 6 7 4 5
#       row 3:  3 2 1 0 7 6 5 4
#        ...
#       row 7:  7 6 5 4 3 2 1 0
#
# A column of 8 chunks (same c, rows 0..7) thus hits 8 different 16-byte bank groups.


@attrs.frozen(repr=False)
class Swizzle:
    """CuTe's ``Swizzle<B,M,S>``: ``f(o) = o ^ ((o & y_mask) >> S)``, ``y_mask = (2**B-1) << (M+S)``.

    ``bits`` (B) is how many bits move, ``base`` (M) how many low bits are left alone (the unit
    that moves is ``2**M`` offsets) and ``shift`` (S) the distance between the source (y) and
    destination (z) bits.  A negative ``shift`` moves low bits into high ones.  ``bits == 0`` is
    the identity.  Since the y bits are never changed, ``f`` is an involution, hence a bijection
    on every aligned block of ``size()`` offsets.
    """

    bits: int
    base: int
    shift: int

    def __attrs_post_init__(self):
        for name in ("bits", "base", "shift"):
            v = getattr(self, name)
            if not _is_plain_int(v):
                raise _err("Swizzle", name, v, "is not an int", "Swizzle(bits, base, shift) takes ints")
            object.__setattr__(self, name, int(v))
        if self.bits < 0:
            raise _err("Swizzle", "bits", self.bits, "is negative", "use bits >= 0 (0 is the identity)")
        if self.base < 0:
            raise _err("Swizzle", "base", self.base, "is negative", "use base >= 0")
        if self.bits > 0 and abs(self.shift) < self.bits:
            raise _err("Swizzle", "shift", self.shift,
                       f"is smaller in magnitude than bits={self.bits} (source and destination bits overlap)",
                       f"use abs(shift) >= {self.bits}")

    @property
    def y_mask(self) -> int:
        """The source bits: ``(2**bits - 1) << (base + max(shift, 0))``."""
        return ((1 << self.bits) - 1) << (self.base + max(self.shift, 0))

    @property
    def z_mask(self) -> int:
        """The destination bits: ``(2**bits - 1) << (base - min(shift, 0))``."""
        return ((1 << self.bits) - 1) << (self.base - min(self.shift, 0))

    @property
    def is_identity(self) -> bool:
        return self.bits == 0

    def size(self) -> int:
        """Length of the aligned blocks that the swizzle permutes (1 for the identity)."""
        if self.bits == 0:
            return 1
        return 1 << (self.base + self.bits + abs(self.shift))

    def __call__(self, offset: Any) -> Any:
        """Swizzle an offset using only ``&``, ``>>`` and ``^`` (``*`` for a negative shift)."""
        if self.bits == 0:
            return offset
        if self.shift >= 0:
            return offset ^ ((offset & self.y_mask) >> self.shift)
        return offset ^ ((offset & self.y_mask) * (1 << -self.shift))

    def __str__(self) -> str:
        return f"Sw<{self.bits},{self.base},{self.shift}>"

    def __repr__(self) -> str:
        return f"Swizzle({self.bits}, {self.base}, {self.shift})"

    def _repr_svg_(self) -> str | None:
        """A picture for notebooks (``firesched.draw``); None for pictures too large to show."""
        return _repr_svg(self)


#: No swizzle.
NO_SWIZZLE = Swizzle(0, 0, 0)
#: The TMA / wgmma swizzle modes on *byte* offsets: 16-byte chunks XORed with the row index
#: within a 256-, 512- or 1024-byte period.  For element offsets divide the unit by the element
#: size: with 16-bit elements they are Swizzle(1,3,3), Swizzle(2,3,3), Swizzle(3,3,3); see
#: :func:`swizzle_for_elements`.
SW32 = Swizzle(1, 4, 3)
SW64 = Swizzle(2, 4, 3)
SW128 = Swizzle(3, 4, 3)

_MODE_BITS = {32: 1, 64: 2, 128: 3}


def swizzle_for_elements(mode_bytes: int, elem_bytes: int) -> Swizzle:
    """The element-offset version of the 32/64/128-byte swizzle mode for ``elem_bytes`` elements.

    The byte swizzle moves 16-byte units (base 4); measured in elements of ``2**k`` bytes the
    unit is ``2**(4-k)`` elements, so only the base changes: 2-byte elements give
    ``swizzle_for_elements(128, 2) == Swizzle(3, 3, 3)``.
    """
    if not _is_plain_int(mode_bytes) or int(mode_bytes) not in _MODE_BITS:
        raise _err("swizzle_for_elements", "mode_bytes", mode_bytes, "is not a swizzle mode",
                   "use 32, 64 or 128")
    if not _is_plain_int(elem_bytes) or int(elem_bytes) not in (1, 2, 4, 8, 16):
        raise _err("swizzle_for_elements", "elem_bytes", elem_bytes, "is not a supported element size",
                   "use 1, 2, 4, 8 or 16 bytes")
    log2_elem = int(elem_bytes).bit_length() - 1
    return Swizzle(_MODE_BITS[int(mode_bytes)], 4 - log2_elem, 3)


@attrs.frozen(repr=False)
class ComposedLayout:
    """``swizzle o offset o layout``: ``c -> swizzle(offset + layout(c))``.

    This is how a swizzled shared-memory tile is described: ``layout`` gives the plain offset of
    an element and the swizzle permutes it within its aligned block.
    """

    swizzle: Swizzle
    offset: int
    layout: Layout

    def __attrs_post_init__(self):
        if not isinstance(self.swizzle, Swizzle):
            raise _err("ComposedLayout", "swizzle", self.swizzle, "is not a Swizzle",
                       "pass e.g. Swizzle(3, 3, 3)")
        if not _is_plain_int(self.offset):
            raise _err("ComposedLayout", "offset", self.offset, "is not an int", "pass an int offset")
        object.__setattr__(self, "offset", int(self.offset))
        if not isinstance(self.layout, Layout):
            raise _err("ComposedLayout", "layout", self.layout, "is not a Layout",
                       "pass e.g. Layout((8, 64), (64, 1))")

    def __call__(self, *coord: Any) -> Any:
        o = self.layout(*coord)
        return self.swizzle(o if self.offset == 0 else o + self.offset)

    def size(self) -> int:
        return self.layout.size()

    def cosize(self) -> int:
        """One past the largest swizzled offset (evaluated over the whole domain)."""
        return int(np.max(self.offsets())) + 1

    def offsets(self) -> np.ndarray:
        """All swizzled offsets in index order, as an int64 array."""
        return np.asarray(self.swizzle(self.layout.offsets() + self.offset), dtype=np.int64)

    def __str__(self) -> str:
        return f"{self.swizzle} o {self.offset} o {self.layout}"

    def __repr__(self) -> str:
        return f"ComposedLayout({self.swizzle!r}, {self.offset!r}, {self.layout!r})"

    def _repr_svg_(self) -> str | None:
        """A picture for notebooks (``firesched.draw``); None for pictures too large to show."""
        return _repr_svg(self)


# ---------------------------------------------------------------------------------------------
# Thread tensors
# ---------------------------------------------------------------------------------------------

#: The 32 lanes of a warp.
WARP = Layout(32, 1)
#: Volta's quad-pair: the 8 lanes that share an HMMA (lanes 0-3 and 16-19 for quad-pair 0).
QUAD_PAIR = Layout((4, 2), (1, 16))
#: The 128 threads of a Hopper warpgroup (four consecutive warps).
WARPGROUP = Layout(128, 1)


# ---------------------------------------------------------------------------------------------
# Thread-value layouts
# ---------------------------------------------------------------------------------------------
#
# A TV layout says which element of a fragment tile each (thread, value) pair holds.  Its
# codomain is the column-major index of the tile, index = row + rows * col, as in CuTe.  For
# the A operand of mma.sync m16n8k16, TV((4,8),(2,2,2)):((32,1),(16,8,128)) on 16x16:
#
#     col:      0     1     2     3    ...    7     8     9   ...   15
#     row  0   T0V0  T0V1  T1V0  T1V1  ...  T3V1  T0V4  T0V5  ...  T3V5
#     row  1   T4V0  T4V1  T5V0  T5V1  ...  T7V1  T4V4  T4V5  ...  T7V5
#     ...
#     row  7  T28V0 T28V1 T29V0 T29V1  ... T31V1 T28V4 T28V5  ... T31V5
#     row  8   T0V2  T0V3  T1V2  T1V3  ...  T3V3  T0V6  T0V7  ...  T3V7
#     ...
#     row 15  T28V2 T28V3 T29V2 T29V3  ... T31V3 T28V6 T28V7  ... T31V7
#
# Thread t = t0 + 4*t1 (t0 < 4, t1 < 8) owns rows t1 and t1+8 and columns 2*t0, 2*t0+1 and
# those plus 8: the thread mode (4,8):(32,1) steps 2 columns (32 = 2*16) for t0 and one row
# for t1; the value mode (2,2,2):(16,8,128) steps one column, eight rows, eight columns.


@attrs.frozen(init=False, repr=False)
class TVLayout:
    """Map (thread, value) to a (row, col) of a 2-D tile through a rank-2 ``layout``.

    ``layout``'s mode 0 is the thread mode and mode 1 the value mode (either may be
    hierarchical); its offsets are column-major tile indices ``row + rows*col``.
    """

    layout: Layout
    tile: tuple[int, int]

    def __init__(self, layout: Layout, tile: Any):
        layout = _expect_layout(layout, "TVLayout", "layout")
        if layout.rank != 2:
            raise _err("TVLayout", "layout", layout, f"has rank {layout.rank}",
                       "a TV layout has exactly two modes, (thread, value)")
        t = _as_inttuple(tile, "TVLayout", "tile", positive=True)
        if not isinstance(t, tuple) or len(t) != 2 or any(isinstance(e, tuple) for e in t):
            raise _err("TVLayout", "tile", tile, "is not a (rows, cols) pair", "pass two positive ints")
        lo = sum(min(0, (s - 1) * d) for s, d in zip(_flat(layout.shape), _flat(layout.stride)))
        hi = sum(max(0, (s - 1) * d) for s, d in zip(_flat(layout.shape), _flat(layout.stride)))
        if lo < 0 or hi >= t[0] * t[1]:
            raise _err("TVLayout", "layout", layout,
                       f"reaches tile indices {lo}..{hi}, outside the {t[0]}x{t[1]} tile",
                       f"offsets must lie in 0..{t[0] * t[1] - 1} (index = row + {t[0]}*col)")
        self.__attrs_init__(layout, t)

    @property
    def num_threads(self) -> int:
        return self.layout[0].size()

    @property
    def num_values(self) -> int:
        return self.layout[1].size()

    @property
    def thread_layout(self) -> Layout:
        return self.layout[0]

    @property
    def value_layout(self) -> Layout:
        return self.layout[1]

    def size(self) -> int:
        return self.layout.size()

    def index(self, t: Any, v: Any) -> Any:
        """Column-major tile index of value ``v`` of thread ``t`` (symbolic-safe)."""
        return self.layout(t, v)

    def coord(self, t: Any, v: Any) -> tuple[Any, Any]:
        """(row, col) of value ``v`` of thread ``t``; only ``+ * // %`` touch ``t`` and ``v``."""
        idx = self.layout(t, v)
        rows = self.tile[0]
        if rows == 1:
            return 0, idx
        return idx % rows, idx // rows

    def _table(self) -> np.ndarray:
        """Tile index of every (thread, value), shape [num_threads, num_values]."""
        nt, nv = self.num_threads, self.num_values
        t = np.arange(nt, dtype=np.int64)[:, None]
        v = np.arange(nv, dtype=np.int64)[None, :]
        return np.broadcast_to(np.asarray(self.layout(t, v), dtype=np.int64), (nt, nv))

    def is_injective(self) -> bool:
        """No two (thread, value) pairs hold the same element."""
        tab = self._table()
        return np.unique(tab).size == tab.size

    def is_bijective(self) -> bool:
        """Every element of the tile is held by exactly one (thread, value) pair."""
        return self.size() == self.tile[0] * self.tile[1] and self.is_injective()

    def inverse(self) -> np.ndarray:
        """``inv[row, col] = (t, v)``, int64 of shape [rows, cols, 2]; -1 where nothing lands."""
        if not self.is_injective():
            raise _err("TVLayout.inverse", "self", self, "is not injective (values are replicated)",
                       "inverse() needs every tile element held by at most one (thread, value)")
        rows, cols = self.tile
        flat = np.full((rows * cols, 2), -1, dtype=np.int64)
        tab = self._table()
        tt, vv = np.meshgrid(np.arange(self.num_threads), np.arange(self.num_values), indexing="ij")
        flat[tab.ravel(), 0] = tt.ravel()
        flat[tab.ravel(), 1] = vv.ravel()
        return flat.reshape(cols, rows, 2).transpose(1, 0, 2).copy()

    def gather(self, values: Any, fill: Any = 0) -> np.ndarray:
        """Assemble per-thread fragments ``values[t, v]`` into the [rows, cols] tile.

        Elements no pair holds get ``fill``; the dtype of ``values`` is kept.
        """
        vals = np.asarray(values)
        want = (self.num_threads, self.num_values)
        if vals.shape != want:
            raise _err("TVLayout.gather", "values.shape", vals.shape, f"does not match {self}",
                       f"pass an array of shape {want} (num_threads, num_values)")
        if not self.is_injective():
            raise _err("TVLayout.gather", "self", self, "is not injective (values are replicated)",
                       "gather needs every tile element held by at most one (thread, value)")
        rows, cols = self.tile
        flat = np.full(rows * cols, fill, dtype=vals.dtype)
        flat[self._table().ravel()] = vals.ravel()
        return np.ascontiguousarray(flat.reshape(cols, rows).T)

    def scatter(self, tile: Any) -> np.ndarray:
        """Split a [rows, cols] tile into per-thread fragments ``out[t, v]`` (dtype kept)."""
        arr = np.asarray(tile)
        if arr.shape != self.tile:
            raise _err("TVLayout.scatter", "tile.shape", arr.shape, f"does not match {self}",
                       f"pass an array of shape {self.tile} (rows, cols)")
        flat = arr.T.reshape(-1)
        return flat[self._table()]

    def __str__(self) -> str:
        return f"TV{self.layout} on {self.tile[0]}x{self.tile[1]}"

    def __repr__(self) -> str:
        return f"TVLayout({self.layout!r}, {self.tile!r})"

    def _repr_svg_(self) -> str | None:
        """A picture for notebooks (``firesched.draw``); None for pictures too large to show."""
        return _repr_svg(self)
