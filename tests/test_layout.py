"""Tests of firesched.layout: known values from the CuTe documentation, and algebraic laws."""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import firesched.layout as fl
from firesched.layout import (
    NO_SWIZZLE,
    QUAD_PAIR,
    SW32,
    SW64,
    SW128,
    WARP,
    WARPGROUP,
    ComposedLayout,
    Layout,
    LayoutError,
    Swizzle,
    TVLayout,
    blocked_product,
    coalesce,
    complement,
    composition,
    cosize,
    crd2idx,
    depth,
    flat_divide,
    flatten,
    idx2crd,
    left_inverse,
    logical_divide,
    logical_product,
    make_layout,
    raked_product,
    rank,
    right_inverse,
    size,
    swizzle_for_elements,
    tiled_divide,
    tiled_product,
    zipped_divide,
    zipped_product,
)

MMA_A = Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128)))
NAMESPACE = {"Layout": Layout, "Swizzle": Swizzle, "ComposedLayout": ComposedLayout, "TVLayout": TVLayout}


# ---------------------------------------------------------------------------------------------
# A minimal symbolic index: it supports exactly the operators layout code may use on indices.
# ---------------------------------------------------------------------------------------------


class Sym:
    """An index expression that remembers how to evaluate itself and refuses everything else."""

    __slots__ = ("text", "fn")

    def __init__(self, text, fn):
        self.text = text
        self.fn = fn

    @staticmethod
    def var(name):
        return Sym(name, lambda env: env[name])

    def _bin(self, other, op, sign):
        if isinstance(other, Sym):
            return Sym(f"({self.text} {sign} {other.text})", lambda env: op(self.fn(env), other.fn(env)))
        assert type(other) is int, f"layout code combined a symbol with {other!r}"
        return Sym(f"({self.text} {sign} {other})", lambda env: op(self.fn(env), other))

    def __add__(self, o):
        return self._bin(o, operator.add, "+")

    def __mul__(self, o):
        return self._bin(o, operator.mul, "*")

    def __floordiv__(self, o):
        return self._bin(o, operator.floordiv, "//")

    def __mod__(self, o):
        return self._bin(o, operator.mod, "%")

    def __and__(self, o):
        return self._bin(o, operator.and_, "&")

    def __rshift__(self, o):
        return self._bin(o, operator.rshift, ">>")

    def __xor__(self, o):
        return self._bin(o, operator.xor, "^")

    def _refuse(self, *_):
        raise AssertionError("layout code used a symbolic index in a forbidden way")

    __bool__ = __index__ = __int__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __eq__ = __ne__ = _refuse
    __hash__ = None

    def __call__(self, **env):
        return self.fn(env)


def _evaluate(expr, **env):
    return expr(**env) if isinstance(expr, Sym) else expr


def _leaves(x):
    if isinstance(x, tuple):
        return [leaf for e in x for leaf in _leaves(e)]
    return [x]


def at(f, *args):
    """Evaluate ``f`` on index arrays; a layout that is statically zero returns a plain 0."""
    shape = np.broadcast_shapes(*(np.shape(a) for a in _leaves(args)))
    return np.broadcast_to(np.asarray(f(*args)), shape)


# ---------------------------------------------------------------------------------------------
# Unit cases
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("obj, text", [
    pytest.param(Layout((4, 8), (8, 1)), "(4,8):(8,1)", id="row-major"),
    pytest.param(Layout(8), "8:1", id="int-default-stride"),
    pytest.param(Layout((4, 8)), "(4,8):(1,4)", id="col-major-default"),
    pytest.param(Layout(((2, 4), 8), ((1, 16), 2)), "((2,4),8):((1,16),2)", id="nested"),
    pytest.param(Layout((3,), (2,)), "(3):(2)", id="rank1-tuple"),
    pytest.param(Layout((2, 2), (-1, 0)), "(2,2):(-1,0)", id="negative-and-zero-stride"),
    pytest.param(Swizzle(3, 3, 3), "Sw<3,3,3>", id="swizzle"),
    pytest.param(Swizzle(2, 1, -3), "Sw<2,1,-3>", id="swizzle-negative-shift"),
    pytest.param(ComposedLayout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1))),
                 "Sw<3,3,3> o 0 o (8,64):(64,1)", id="composed"),
    pytest.param(TVLayout(MMA_A, (16, 16)), "TV((4,8),(2,2,2)):((32,1),(16,8,128)) on 16x16", id="tv"),
])
def test_str_and_repr_round_trip(obj, text):
    assert str(obj) == text
    again = eval(repr(obj), dict(NAMESPACE))
    assert again == obj
    assert hash(again) == hash(obj)


def test_repr_looks_like_a_constructor_call():
    assert repr(Layout((4, 8), (8, 1))) == "Layout((4, 8), (8, 1))"
    assert repr(Swizzle(3, 3, 3)) == "Swizzle(3, 3, 3)"
    assert Layout([4, [2, 2]], [1, [4, 8]]) == Layout((4, (2, 2)), (1, (4, 8)))
    assert Layout(np.int64(4), np.int32(2)) == Layout(4, 2)
    assert {Layout(4, 1), Layout(4, 1), Layout(4, 2)} == {Layout(4, 1), Layout(4, 2)}


@pytest.mark.parametrize("layout, expected", [
    pytest.param(Layout((2, (2, 2)), (4, (2, 1))), [0, 4, 2, 6, 1, 5, 3, 7], id="cute-doc-(2,(2,2)):(4,(2,1))"),
    pytest.param(Layout((4, 2)), [0, 1, 2, 3, 4, 5, 6, 7], id="compact-col-major"),
    pytest.param(Layout((2, 4), (4, 1)), [0, 4, 1, 5, 2, 6, 3, 7], id="row-major"),
    pytest.param(Layout((2, 3), (0, 1)), [0, 0, 1, 1, 2, 2], id="broadcast"),
    pytest.param(QUAD_PAIR, [0, 1, 2, 3, 16, 17, 18, 19], id="quad-pair"),
])
def test_known_offsets(layout, expected):
    assert [layout(i) for i in range(layout.size())] == expected
    assert layout.offsets().tolist() == expected


def test_call_forms():
    L = Layout((2, (2, 2)), (4, (2, 1)))
    # linear index, natural coordinate, per-mode arguments, int for a hierarchical mode
    assert L(5) == L((1, (0, 1))) == L(1, (0, 1)) == L(1, 2) == L([1, [0, 1]]) == 5
    assert L.rank == len(L) == 2 and L.depth == 2
    assert list(L) == [Layout(2, 4), Layout((2, 2), (2, 1))]
    assert L[-1] == L[1]
    assert Layout(8, 3)[0] == Layout(8, 3)
    # past the size, the last mode keeps counting (CuTe's crd2idx)
    assert Layout((2, 4), (1, 10))(9) == 1 + 4 * 10


def test_size_cosize_rank_depth_flatten():
    L = Layout(((2, 4), 8), ((1, 16), 2))
    assert size(L) == L.size() == 64
    assert cosize(L) == L.cosize() == 1 + 1 + 3 * 16 + 7 * 2
    assert rank(L) == 2 and depth(L) == 2
    assert size((2, (3, 4))) == 24 and rank((2, (3, 4))) == 2 and depth((2, (3, 4))) == 2
    assert rank(7) == 1 and depth(7) == 0
    assert flatten(L) == Layout((2, 4, 8), (1, 16, 2))
    assert flatten((1, (2, (3,)))) == (1, 2, 3)
    assert flatten(5) == 5


def test_idx2crd_crd2idx():
    assert idx2crd(5, (2, (2, 2))) == (1, (0, 1))
    assert idx2crd(11, (3, 4)) == (2, 3)
    assert idx2crd((1, 3), ((2, 2), 4)) == ((1, 0), 3)
    assert crd2idx((1, (0, 1)), (2, (2, 2))) == 5
    assert crd2idx((1, 2), (4, 8), (8, 1)) == 10
    assert crd2idx(7, (4, 8), (8, 1)) == 3 * 8 + 1


@pytest.mark.parametrize("layout, profile, expected", [
    pytest.param(Layout((2, (1, 6)), (1, (6, 2))), None, Layout(12, 1), id="cute-doc-12:1"),
    pytest.param(Layout((2, (1, 6)), (1, (6, 2))), (1, 1), Layout((2, 6), (1, 2)), id="cute-doc-by-mode"),
    pytest.param(Layout((2, 4), (4, 1)), None, Layout((2, 4), (4, 1)), id="row-major-stays"),
    pytest.param(Layout((1, 1), (3, 5)), None, Layout(1, 0), id="all-size-one"),
    pytest.param(Layout((4, 1, 2), (1, 7, 4)), None, Layout(8, 1), id="skip-size-one"),
])
def test_coalesce_examples(layout, profile, expected):
    assert coalesce(layout, profile) == expected


def test_filter_example():
    assert fl.filter(Layout((2, (3, 4)), (0, (1, 3)))) == Layout(12, 1)
    assert fl.filter(Layout((2, 2), (0, 0))) == Layout(1, 0)


@pytest.mark.parametrize("a, b, expected", [
    pytest.param(Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1)), "((2,2),3):((24,2),8)", id="cute-doc-example-1"),
    pytest.param(Layout(20, 2), Layout((5, 4), (4, 1)), "(5,4):(8,2)", id="cute-doc-example-2"),
    pytest.param(Layout((10, 2), (16, 4)), Layout((5, 4), (1, 5)), "(5,(2,2)):(16,(80,4))", id="cute-doc-example-3"),
    pytest.param(Layout((12, (4, 8)), (59, (13, 1))), (Layout(3, 4), Layout(8, 2)), "(3,(2,4)):(236,(26,1))",
                 id="cute-doc-by-mode-tiler"),
    pytest.param(Layout((12, (4, 8)), (59, (13, 1))), (3, 8), "(3,(4,2)):(59,(13,1))", id="cute-doc-shape-tiler"),
    pytest.param(Layout((4, 8), (8, 1)), (None, 2), "(4,2):(8,1)", id="none-keeps-mode"),
    pytest.param(Layout((4, 8), (8, 1)), 4, "4:8", id="int-tiler"),
])
def test_composition_examples(a, b, expected):
    assert str(composition(a, b)) == expected


@pytest.mark.parametrize("layout, cotarget, expected", [
    pytest.param(Layout(4, 1), 24, Layout(6, 4), id="4:1"),
    pytest.param(Layout(6, 4), 24, Layout(4, 1), id="6:4"),
    pytest.param(Layout((4, 6), (1, 4)), 24, Layout(1, 0), id="(4,6):(1,4)"),
    pytest.param(Layout(4, 2), 24, Layout((2, 3), (1, 8)), id="4:2"),
    pytest.param(Layout((2, 4), (1, 6)), 24, Layout(3, 2), id="(2,4):(1,6)"),
    pytest.param(Layout((2, 2), (1, 6)), 24, Layout((3, 2), (2, 12)), id="(2,2):(1,6)"),
    pytest.param(Layout(4, 2), (4, 6), Layout((2, 3), (1, 8)), id="shape-cotarget"),
])
def test_complement_examples(layout, cotarget, expected):
    assert complement(layout, cotarget) == expected


def test_divide_examples():
    assert str(logical_divide(Layout((4, 2, 3), (2, 1, 8)), Layout(4, 2))) == "((2,2),(2,3)):((4,1),(2,8))"
    a = Layout((9, (4, 8)), (59, (13, 1)))
    tiler = (Layout(3, 3), Layout((2, 4), (1, 8)))
    assert str(logical_divide(a, tiler)) == "((3,3),((2,4),(2,2))):((177,59),((13,2),(26,1)))"
    z = zipped_divide(a, tiler)
    assert str(z) == "((3,(2,4)),(3,(2,2))):((177,(13,2)),(59,(26,1)))"
    assert z[0] == composition(a, tiler)
    assert str(tiled_divide(a, tiler)) == "((3,(2,4)),3,(2,2)):((177,(13,2)),59,(26,1))"
    assert str(flat_divide(a, tiler)) == "(3,(2,4),3,(2,2)):(177,(13,2),59,(26,1))"
    # dividing 6 elements into tiles of 4 rounds the number of tiles up, as CuTe does
    assert logical_divide(Layout(6), 4) == Layout((4, 2), (1, 4))


def test_product_examples():
    a = Layout((2, 2), (4, 1))
    assert str(logical_product(a, Layout(6, 1))) == "((2,2),(2,3)):((4,1),(2,8))"
    assert str(logical_product(a, Layout((4, 2), (2, 1)))) == "((2,2),(4,2)):((4,1),(8,2))"
    block, grid = Layout((2, 5), (5, 1)), Layout((3, 4), (1, 3))
    assert str(blocked_product(block, grid)) == "(6,(5,4)):(5,(1,30))"
    assert str(raked_product(block, grid)) == "((3,2),(4,5)):((10,5),(30,1))"
    # by-mode products repeat each mode within its own codomain
    assert str(zipped_product(Layout((2, 2)), (3, 4))) == "((2,2),(3,(2,2))):((1,2),(2,(1,4)))"
    assert str(tiled_product(Layout((2, 2)), (3, 4))) == "((2,2),3,(2,2)):((1,2),2,(1,4))"
    assert blocked_product(Layout(4), 3) == make_layout(Layout(12, 1))


def test_inverse_examples():
    assert right_inverse(Layout((4, 8), (8, 1))) == Layout((8, 4), (4, 1))
    assert left_inverse(Layout((4, 8), (8, 1))) == Layout((8, 4), (4, 1))
    assert right_inverse(Layout(4, 2)) == Layout(1, 0)
    assert [left_inverse(Layout(4, 2))(2 * i) for i in range(4)] == [0, 1, 2, 3]


def test_mma_a_tv_layout():
    tv = TVLayout(MMA_A, (16, 16))
    assert tv.num_threads == 32 and tv.num_values == 8
    assert tv.is_bijective()
    assert tv.coord(0, 0) == (0, 0)
    assert tv.coord(1, 0) == (0, 2)
    assert tv.coord(4, 0) == (1, 0)
    assert tv.coord(0, 2) == (8, 0)
    assert tv.coord(0, 4) == (0, 8)
    assert tv.index(1, 0) == 32
    inv = tv.inverse()
    assert inv.shape == (16, 16, 2)
    assert tuple(inv[0, 2]) == (1, 0) and tuple(inv[15, 15]) == (31, 7)


def test_tv_gather_scatter_keep_dtype():
    tv = TVLayout(MMA_A, (16, 16))
    vals = np.arange(256, dtype=np.float16).reshape(32, 8)
    tile = tv.gather(vals)
    assert tile.dtype == np.float16 and tile.shape == (16, 16)
    assert tile[0, 2] == vals[1, 0] and tile[8, 0] == vals[0, 2]
    back = tv.scatter(tile)
    assert back.dtype == np.float16 and np.array_equal(back, vals)


def test_tv_with_replication():
    # every thread of a quad holds the same 4 values: scatter works, gather/inverse refuse
    tv = TVLayout(Layout((4, 4), (0, 1)), (2, 2))
    assert not tv.is_bijective()
    assert tv.scatter(np.array([[1, 3], [2, 4]])).tolist() == [[1, 2, 3, 4]] * 4
    with pytest.raises(ValueError, match="TVLayout.gather"):
        tv.gather(np.zeros((4, 4)))
    with pytest.raises(ValueError, match="TVLayout.inverse"):
        tv.inverse()
    partial = TVLayout(Layout((2, 1), (1, 0)), (2, 2))
    assert partial.gather(np.array([[7], [8]]), fill=-1).tolist() == [[7, -1], [8, -1]]
    assert partial.inverse()[:, :, 0].tolist() == [[0, -1], [1, -1]]


def test_thread_tensors():
    assert WARP == Layout(32, 1) and WARPGROUP == Layout(128, 1)
    assert QUAD_PAIR == Layout((4, 2), (1, 16))


@pytest.mark.parametrize("swizzle, expected", [
    pytest.param(SW32, Swizzle(1, 4, 3), id="SW32"),
    pytest.param(SW64, Swizzle(2, 4, 3), id="SW64"),
    pytest.param(SW128, Swizzle(3, 4, 3), id="SW128"),
    pytest.param(swizzle_for_elements(32, 2), Swizzle(1, 3, 3), id="32B-fp16"),
    pytest.param(swizzle_for_elements(64, 2), Swizzle(2, 3, 3), id="64B-fp16"),
    pytest.param(swizzle_for_elements(128, 2), Swizzle(3, 3, 3), id="128B-fp16"),
    pytest.param(swizzle_for_elements(128, 4), Swizzle(3, 2, 3), id="128B-fp32"),
    pytest.param(swizzle_for_elements(128, 1), Swizzle(3, 4, 3), id="128B-fp8"),
])
def test_swizzle_constants(swizzle, expected):
    assert swizzle == expected


def test_swizzle_values():
    sw = Swizzle(3, 4, 3)
    # 16-byte chunk c of 128-byte row r moves to chunk c ^ (r % 8)
    for r in range(8):
        for c in range(8):
            assert sw(r * 128 + c * 16 + 5) == r * 128 + (c ^ r) * 16 + 5
    assert SW128.y_mask == 0b1110000000 and SW128.z_mask == 0b1110000
    assert SW128.size() == 1024 and NO_SWIZZLE.size() == 1 and NO_SWIZZLE.is_identity
    assert all(Swizzle(0, 2, 5)(i) == i for i in range(64))
    # element-offset swizzle == byte swizzle seen through 2-byte elements
    fp16 = swizzle_for_elements(128, 2)
    assert all(2 * fp16(i) == SW128(2 * i) for i in range(2048))


def test_symbolic_indices_use_only_plain_operators():
    t, v = Sym.var("t"), Sym.var("v")
    layouts = [Layout((2, (2, 2)), (4, (2, 1))), Layout(((4, 8), 3), ((0, 5), 1)), Layout((2, 3), (7, 1)), MMA_A]
    for L in layouts:
        expr = L(t)
        assert [_evaluate(expr, t=i) for i in range(L.size() + 3)] == [L(i) for i in range(L.size() + 3)]
    tv = TVLayout(MMA_A, (16, 16))
    row, col = tv.coord(t, v)
    for ti in range(32):
        for vi in range(8):
            assert (row(t=ti, v=vi), col(t=ti, v=vi)) == tv.coord(ti, vi)
    for sw in (Swizzle(3, 3, 3), Swizzle(2, 1, -3)):
        expr = sw(t)
        assert [expr(t=i) for i in range(512)] == [sw(i) for i in range(512)]
    cl = ComposedLayout(Swizzle(3, 3, 3), 64, Layout((8, 64), (64, 1)))
    expr = cl(t, v)
    assert all(expr(t=i, v=j) == cl(i, j) for i in range(8) for j in range(0, 64, 7))
    crd = idx2crd(t, (4, (2, 3)))
    assert [(crd[0](t=i), (crd[1][0](t=i), crd[1][1](t=i))) for i in range(24)] == \
        [idx2crd(i, (4, (2, 3))) for i in range(24)]


@pytest.mark.parametrize("call, where", [
    pytest.param(lambda: Layout((4, 8), (1,)), "Layout: stride", id="stride-not-congruent"),
    pytest.param(lambda: Layout((4, 0)), "Layout: shape", id="zero-shape"),
    pytest.param(lambda: Layout(()), "Layout: shape", id="empty-shape"),
    pytest.param(lambda: Layout(4.0), "Layout: shape", id="float-shape"),
    pytest.param(lambda: Layout((4, 8))(1, 2, 3), "Layout.__call__", id="coord-rank"),
    pytest.param(lambda: Layout(4)((1, 2)), "Layout.__call__", id="tuple-for-int-mode"),
    pytest.param(lambda: Layout(4)("x"), "Layout.__call__", id="string-coord"),
    pytest.param(lambda: Layout((4, 8))[2], "Layout.__getitem__", id="mode-out-of-range"),
    pytest.param(lambda: composition(Layout((3, 4), (1, 10)), 4), "composition", id="shape-divisibility"),
    pytest.param(lambda: composition(Layout((3, 4), (1, 10)), Layout(2, 2)), "composition", id="stride-divisibility"),
    pytest.param(lambda: composition(Layout(4), (2, 2)), "composition: tiler", id="tiler-rank"),
    pytest.param(lambda: composition((4, 8), 2), "composition: A", id="not-a-layout"),
    pytest.param(lambda: complement(Layout((2, 2), (1, 1)), 8), "complement", id="not-injective"),
    pytest.param(lambda: complement(Layout((2, 2), (1, 3)), 12), "complement", id="not-divisible"),
    pytest.param(lambda: complement(Layout(4, 1), 0), "complement: cotarget", id="zero-cotarget"),
    pytest.param(lambda: complement(Layout(4, -1), 8), "complement", id="negative-stride"),
    pytest.param(lambda: left_inverse(Layout((2, 2), (0, 1))), "left_inverse", id="left-inverse-broadcast"),
    pytest.param(lambda: right_inverse(Layout(4, -1)), "right_inverse", id="right-inverse-negative"),
    pytest.param(lambda: logical_divide(Layout(8), -2), "logical_divide: tiler", id="negative-tiler"),
    pytest.param(lambda: logical_product(Layout((2, 2), (1, 1)), Layout(2)), "logical_product: A",
                 id="product-non-injective"),
    pytest.param(lambda: coalesce(Layout(4), (1, 1)), "coalesce: profile", id="profile-rank"),
    pytest.param(lambda: make_layout(), "make_layout", id="make-layout-empty"),
    pytest.param(lambda: make_layout(Layout(2), 3), "make_layout", id="make-layout-int"),
    pytest.param(lambda: Swizzle(3, 3, 2), "Swizzle: shift", id="swizzle-overlap"),
    pytest.param(lambda: Swizzle(-1, 3, 3), "Swizzle: bits", id="swizzle-negative-bits"),
    pytest.param(lambda: Swizzle(1, -3, 3), "Swizzle: base", id="swizzle-negative-base"),
    pytest.param(lambda: Swizzle(1.0, 3, 3), "Swizzle: bits", id="swizzle-float"),
    pytest.param(lambda: swizzle_for_elements(48, 2), "swizzle_for_elements: mode_bytes", id="bad-mode"),
    pytest.param(lambda: swizzle_for_elements(128, 3), "swizzle_for_elements: elem_bytes", id="bad-elem"),
    pytest.param(lambda: ComposedLayout(Layout(4), 0, Layout(4)), "ComposedLayout: swizzle", id="composed-swizzle"),
    pytest.param(lambda: TVLayout(Layout(32), (4, 8)), "TVLayout: layout", id="tv-rank"),
    pytest.param(lambda: TVLayout(Layout((32, 8)), (16, 8)), "TVLayout: layout", id="tv-out-of-tile"),
    pytest.param(lambda: TVLayout(Layout((32, 8)), (16, 16, 1)), "TVLayout: tile", id="tv-tile-rank"),
    pytest.param(lambda: TVLayout(MMA_A, (16, 16)).gather(np.zeros((32, 4))), "TVLayout.gather", id="gather-shape"),
    pytest.param(lambda: TVLayout(MMA_A, (16, 16)).scatter(np.zeros((16, 8))), "TVLayout.scatter", id="scatter-shape"),
    pytest.param(lambda: idx2crd((1, 2), 4), "idx2crd", id="idx2crd-mismatch"),
])
def test_invalid_input_raises_value_error(call, where):
    with pytest.raises(ValueError, match=where) as info:
        call()
    assert isinstance(info.value, LayoutError)


def test_getitem_error_is_also_an_index_error():
    with pytest.raises(IndexError):
        Layout((4, 8))[5]


# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

POW2 = st.sampled_from([1, 2, 4, 8])
SMALL = st.integers(1, 5)
STRIDES = st.integers(0, 24)
GAPS = st.integers(1, 3)


def _nest(draw, items, depth=0):
    """Group ``items`` (kept in order) into a random nested tuple; lone items may stay bare."""
    if len(items) == 1 and (depth > 0 or draw(st.booleans())):
        return items[0]
    if depth >= 2 or len(items) == 1:
        return tuple(items)
    cuts = sorted(draw(st.sets(st.integers(1, len(items) - 1), max_size=len(items) - 1)))
    bounds = [0, *cuts, len(items)]
    return tuple(_nest(draw, items[a:b], depth + 1) for a, b in zip(bounds, bounds[1:]))


def _build(tree, values):
    if isinstance(tree, tuple):
        return tuple(_build(t, values) for t in tree)
    return values[tree]


def _layout_from(draw, shapes, strides):
    tree = _nest(draw, list(range(len(shapes))))
    return Layout(_build(tree, shapes), _build(tree, strides))


@st.composite
def layouts(draw, shapes=SMALL, strides=STRIDES, max_modes=4):
    """Random hierarchical layouts."""
    n = draw(st.integers(1, max_modes))
    ss = draw(st.lists(shapes, min_size=n, max_size=n))
    ds = draw(st.lists(strides, min_size=n, max_size=n))
    return _layout_from(draw, ss, ds)


def _ordered_strides(draw, shapes, gaps):
    """Strides that visit the modes in a random order, each one starting past the previous."""
    strides = [0] * len(shapes)
    current = 1
    for k in draw(st.permutations(range(len(shapes)))):
        current *= draw(gaps)
        strides[k] = current
        current *= shapes[k]
    return strides


@st.composite
def injective_layouts(draw, shapes=SMALL, gaps=GAPS, max_modes=4):
    """Injective layouts with a complement (``gaps=st.just(1)``: bijections onto a range)."""
    n = draw(st.integers(1, max_modes))
    ss = draw(st.lists(shapes, min_size=n, max_size=n))
    return _layout_from(draw, ss, _ordered_strides(draw, ss, gaps))


def bijective_layouts(shapes=SMALL, max_modes=4):
    return injective_layouts(shapes=shapes, gaps=st.just(1), max_modes=max_modes)


@st.composite
def pow2_tilers(draw, max_modes=3):
    """Layouts with power-of-two shapes whose modes occupy disjoint bit ranges of the offset, some
    of them broadcast (stride 0): the layouts B for which ``A o B`` is defined for every A."""
    n = draw(st.integers(1, max_modes))
    ss = draw(st.lists(POW2, min_size=n, max_size=n))
    ds = _ordered_strides(draw, ss, st.sampled_from([1, 2, 4]))
    ds = [0 if draw(st.integers(0, 4)) == 0 else d for d in ds]
    return _layout_from(draw, ss, ds)


@st.composite
def bijective_rank2(draw, max_modes=4):
    """A rank-2 layout that is a bijection onto range(size), its modes split from one order."""
    n = draw(st.integers(2, max_modes))
    ss = draw(st.lists(POW2, min_size=n, max_size=n))
    ds = _ordered_strides(draw, ss, st.just(1))
    k = draw(st.integers(1, n - 1))
    return make_layout(_layout_from(draw, ss[:k], ds[:k]), _layout_from(draw, ss[k:], ds[k:]))


@st.composite
def swizzles(draw):
    bits = draw(st.integers(0, 3))
    base = draw(st.integers(0, 3))
    if bits == 0:
        shift = draw(st.integers(-3, 3))
    else:
        shift = draw(st.sampled_from([-1, 1])) * (bits + draw(st.integers(0, 2)))
    return Swizzle(bits, base, shift)


@st.composite
def bijective_tv_layouts(draw):
    n = draw(st.integers(2, 5))
    ss = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    ds = _ordered_strides(draw, ss, st.just(1))
    k = draw(st.integers(1, n - 1))
    thr = _layout_from(draw, ss[:k], ds[:k])
    val = _layout_from(draw, ss[k:], ds[k:])
    total = math.prod(ss)
    rows = draw(st.sampled_from([d for d in range(1, total + 1) if total % d == 0]))
    return TVLayout(make_layout(thr, val), (rows, total // rows))


def _extent(layout):
    """One past the highest offset reached by the modes of an injective, ordered layout."""
    return max([s * d for s, d in zip(fl._flat(layout.shape), fl._flat(layout.stride)) if s > 1] or [1])


# ---------------------------------------------------------------------------------------------
# Laws
# ---------------------------------------------------------------------------------------------


@given(layouts(strides=st.integers(-6, 24)))
def test_call_forms_agree(L):
    offs = L.offsets()
    for i in range(min(L.size(), 40)):
        crd = idx2crd(i, L.shape)
        assert L(i) == offs[i] == L(crd) == crd2idx(crd, L.shape, L.stride)
        if L.rank > 1:
            assert L(*crd) == offs[i]
    assert L.cosize() == offs[-1] + 1


@given(layouts(strides=st.integers(-6, 24)))
def test_coalesce_preserves_the_function(L):
    c = coalesce(L)
    assert c.size() == L.size() and c.depth <= 1
    assert np.array_equal(c.offsets(), L.offsets())
    by_mode = coalesce(L, (1,) * L.rank)
    assert by_mode.rank == L.rank
    for mode, orig in zip(by_mode, L):
        assert mode.depth <= 1 and np.array_equal(mode.offsets(), orig.offsets())
    assert np.array_equal(by_mode.offsets(), L.offsets())


@given(layouts())
def test_filter_keeps_the_set_of_offsets(L):
    f = fl.filter(L)
    assert set(f.offsets().tolist()) == set(L.offsets().tolist())
    if f != Layout(1, 0):
        assert all(s != 1 and d != 0 for s, d in zip(fl._flat(f.shape), fl._flat(f.stride)))


@given(layouts(shapes=POW2, strides=st.integers(0, 20)), pow2_tilers(), st.integers(0, 9))
def test_composition_is_application_in_turn(A, B, pad_stride):
    if A.size() < B.cosize():  # make every B(i) a coordinate of A
        A = make_layout(A, Layout(1 << (B.cosize() - 1).bit_length(), pad_stride))
    R = composition(A, B)
    assert R.size() == B.size()
    assert np.array_equal(R.offsets(), at(A, B.offsets()))
    if isinstance(B.shape, tuple):
        assert R.rank == B.rank


@given(layouts(shapes=st.integers(1, 6), strides=st.integers(0, 20), max_modes=3),
       injective_layouts(shapes=st.integers(1, 6), gaps=st.integers(1, 4), max_modes=3), st.integers(0, 9))
def test_composition_is_application_or_a_value_error(A, B, pad_stride):
    """Any shapes: either the divisibility conditions fail (ValueError) or the law holds."""
    if A.size() < B.cosize():
        A = make_layout(A, Layout(-(-B.cosize() // A.size()), pad_stride))
    try:
        R = composition(A, B)
    except ValueError as e:
        assert "divisibility" in str(e)
        return
    assert R.size() == B.size()
    assert np.array_equal(R.offsets(), at(A, B.offsets()))


@given(bijective_rank2(), st.data())
def test_by_mode_composition_picks_a_block(A, data):
    A0, A1 = A
    m = data.draw(st.sampled_from([d for d in (1, 2, 4, 8, 16) if d <= A0.size()]))
    n = data.draw(st.sampled_from([d for d in (1, 2, 4, 8, 16) if d <= A1.size()]))
    R = composition(A, (m, n))
    i, j = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
    assert np.array_equal(at(R, i, j), at(A, i, j))


@given(injective_layouts(), st.integers(1, 3))
def test_complement_completes_the_cotarget(L, k):
    N = _extent(L) * k
    C = complement(L, N)
    offs_c = C.offsets()
    assert np.intersect1d(offs_c[1:], L.offsets()).size == 0
    assert np.all(np.diff(offs_c) > 0)  # ordered
    both = make_layout(L, C)
    assert np.array_equal(np.sort(both.offsets()), np.arange(N))


@given(injective_layouts(), st.integers(1, 200))
def test_complement_covers_any_cotarget(L, N):
    both = make_layout(L, complement(L, N))
    offs = both.offsets()
    assert np.unique(offs).size == offs.size and both.cosize() >= N


@given(layouts())
def test_right_inverse(L):
    R = right_inverse(L)
    assert np.array_equal(at(L, R.offsets()), np.arange(R.size()))


@given(bijective_layouts())
def test_right_inverse_of_a_bijection_is_total(L):
    R = right_inverse(L)
    assert R.size() == L.size()
    assert np.array_equal(at(R, L.offsets()), np.arange(L.size()))


@given(injective_layouts())
def test_left_inverse(L):
    Li = left_inverse(L)
    assert np.array_equal(at(Li, L.offsets()), np.arange(L.size()))


@given(layouts(shapes=POW2, strides=st.integers(0, 20), max_modes=3),
       injective_layouts(shapes=POW2, gaps=st.sampled_from([1, 2]), max_modes=3), st.integers(0, 9))
def test_divides_rearrange_the_layout(A, B, pad_stride):
    extent = _extent(B)
    if A.size() % extent:
        A = make_layout(A, Layout(extent // math.gcd(A.size(), extent), pad_stride))
    expected = np.sort(A.offsets())
    D = logical_divide(A, B)
    assert D.rank == 2 and D.size() == A.size() and D[0].size() == B.size()
    assert np.array_equal(np.sort(D.offsets()), expected)
    assert np.array_equal(D[0].offsets(), composition(A, B).offsets())
    assert zipped_divide(A, B) == D
    for other in (tiled_divide(A, B), flat_divide(A, B)):
        assert np.array_equal(np.sort(other.offsets()), expected)


@given(bijective_rank2(), st.data())
def test_zipped_divide_by_mode_indexes_tiles(A, data):
    A0, A1 = A
    m = data.draw(st.sampled_from([d for d in (1, 2, 4, 8) if A0.size() % d == 0]))
    n = data.draw(st.sampled_from([d for d in (1, 2, 4, 8) if A1.size() % d == 0]))
    Z = zipped_divide(A, (m, n))
    assert Z[0].size() == m * n and Z.size() == A.size()
    a, b, p, q = np.meshgrid(np.arange(m), np.arange(n), np.arange(A0.size() // m), np.arange(A1.size() // n),
                             indexing="ij")
    assert np.array_equal(at(Z, (a, b), (p, q)), at(A, p * m + a, q * n + b))
    L = logical_divide(A, (m, n))
    assert np.array_equal(np.sort(L.offsets()), np.arange(A.size()))
    assert np.array_equal(np.sort(tiled_divide(A, (m, n)).offsets()), np.arange(A.size()))


@given(injective_layouts(shapes=POW2, gaps=st.sampled_from([1, 2]), max_modes=3),
       injective_layouts(shapes=POW2, gaps=st.sampled_from([1, 2]), max_modes=3))
def test_products_of_injective_layouts_are_injective(A, B):
    P = logical_product(A, B)
    assert P.rank == 2 and P[0] == A and P.size() == A.size() * B.size()
    offs = np.sort(P.offsets())
    assert np.unique(offs).size == offs.size
    r = max(A.rank, B.rank)
    for prod in (blocked_product(A, B), raked_product(A, B)):
        assert prod.rank == r
        assert np.array_equal(np.sort(prod.offsets()), offs)


@given(bijective_layouts(shapes=POW2, max_modes=3), bijective_layouts(shapes=POW2, max_modes=3))
def test_products_of_bijections_are_bijections(A, B):
    n = A.size() * B.size()
    for prod in (logical_product(A, B), blocked_product(A, B), raked_product(A, B),
                 zipped_product(A, B), tiled_product(A, B)):
        assert np.array_equal(np.sort(prod.offsets()), np.arange(n))
    blocked = blocked_product(A, B)
    if min(A.rank, B.rank) > 1 and A.rank == B.rank:
        assert [m.size() for m in blocked] == [a.size() * b.size() for a, b in zip(A, B)]


@given(swizzles())
def test_swizzle_is_a_bijection_on_its_blocks(sw):
    n = sw.size()
    x = np.arange(3 * n)
    y = sw(x)
    for blk in range(3):
        assert np.array_equal(np.sort(y[blk * n:(blk + 1) * n]), x[blk * n:(blk + 1) * n])
    assert np.array_equal(sw(y), x)  # an involution
    assert [sw(int(i)) for i in x[:16]] == y[:16].tolist()


@given(swizzles(), bijective_layouts(shapes=POW2, max_modes=3), st.integers(0, 3))
def test_swizzled_tile_is_a_bijection(sw, L, blocks):
    reps = max(1, sw.size() // L.size())
    tile = make_layout(L, Layout(reps, L.size())) if reps > 1 else L
    cl = ComposedLayout(sw, blocks * max(sw.size(), tile.size()), tile)
    base = cl.offset
    assert np.array_equal(np.sort(cl.offsets()), base + np.arange(tile.size()))
    assert cl.cosize() == base + tile.size()


@given(bijective_tv_layouts(), st.sampled_from([np.int32, np.float32, np.float16]))
def test_tv_gather_scatter_round_trip(tv, dtype):
    rows, cols = tv.tile
    assert tv.is_bijective()
    values = np.arange(tv.num_threads * tv.num_values).astype(dtype).reshape(tv.num_threads, tv.num_values)
    tile = tv.gather(values)
    assert tile.dtype == dtype and tile.shape == (rows, cols)
    assert np.array_equal(tv.scatter(tile), values)
    assert np.array_equal(tv.gather(tv.scatter(tile)), tile)
    t, v = np.meshgrid(np.arange(tv.num_threads), np.arange(tv.num_values), indexing="ij")
    r, c = (np.broadcast_to(x, t.shape) for x in tv.coord(t, v))
    assert np.array_equal(tile[r, c], values)
    inv = tv.inverse()
    assert np.array_equal(inv[r, c, 0], t) and np.array_equal(inv[r, c, 1], v)


JUNK = st.recursive(
    st.one_of(st.integers(-3, 6), st.none(), st.floats(-4, 4), st.text(max_size=2), st.booleans()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple)),
    max_leaves=6,
)

JUNK_CALLS = {
    "Layout": lambda a, b: Layout(a, b),
    "Layout-default-stride": lambda a, b: Layout(a),
    "call": lambda a, b: Layout((2, (3, 2)), (1, (5, 2)))(a),
    "call-two": lambda a, b: Layout((2, (3, 2)), (1, (5, 2)))(a, b),
    "getitem": lambda a, b: Layout((2, 3))[a],
    "size": lambda a, b: size(a),
    "rank-depth-flatten": lambda a, b: (rank(a), depth(a), flatten(a)),
    "cosize": lambda a, b: cosize(Layout(a, b)),
    "make_layout": lambda a, b: make_layout(a),
    "coalesce": lambda a, b: coalesce(Layout(a, b)),
    "coalesce-profile": lambda a, b: coalesce(Layout((2, (3, 2)), (1, (5, 2))), a),
    "filter": lambda a, b: fl.filter(Layout(a, b)),
    "composition-tiler": lambda a, b: composition(Layout((4, 8), (8, 1)), a),
    "composition-layouts": lambda a, b: composition(Layout(a, b), Layout((2, 2), (3, 1))),
    "composition-B": lambda a, b: composition(Layout((6, 4), (1, 6)), Layout(a, b)),
    "complement": lambda a, b: complement(Layout(a, b), 24),
    "complement-cotarget": lambda a, b: complement(Layout(4, 2), a),
    "right_inverse": lambda a, b: right_inverse(Layout(a, b)),
    "left_inverse": lambda a, b: left_inverse(Layout(a, b)),
    "logical_divide": lambda a, b: logical_divide(Layout((8, 6)), a),
    "logical_divide-layout": lambda a, b: logical_divide(Layout((8, 6)), Layout(a, b)),
    "zipped_divide": lambda a, b: zipped_divide(Layout((8, 6)), a),
    "tiled_divide": lambda a, b: tiled_divide(Layout(a, b), (2, None)),
    "logical_product": lambda a, b: logical_product(Layout(a, b), Layout((2, 2))),
    "logical_product-B": lambda a, b: logical_product(Layout((2, 2)), a),
    "blocked_product": lambda a, b: blocked_product(Layout((2, 2)), a),
    "raked_product": lambda a, b: raked_product(Layout(a, b), Layout((2, 3), (3, 1))),
    "idx2crd": lambda a, b: idx2crd(a, b),
    "crd2idx": lambda a, b: crd2idx(a, b),
    "Swizzle": lambda a, b: Swizzle(a, b, 3),
    "swizzle_for_elements": lambda a, b: swizzle_for_elements(a, b),
    "ComposedLayout": lambda a, b: ComposedLayout(Swizzle(1, 1, 1), a, Layout(b)),
    "TVLayout": lambda a, b: TVLayout(Layout(a, b), (4, 4)),
    "TVLayout-tile": lambda a, b: TVLayout(Layout((4, 4)), a),
}


@given(st.sampled_from(sorted(JUNK_CALLS)), JUNK, JUNK)
def test_junk_raises_only_value_error(name, a, b):
    try:
        JUNK_CALLS[name](a, b)
    except ValueError:
        pass
