"""dtypes: every element type round-trips through numpy; sub-byte types pack two per byte."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from firesched import dtypes

ALL = [pytest.param(d, id=d.name) for d in dtypes.ALL]


@pytest.mark.parametrize("d", ALL)
def test_record(d):
    assert dtypes.dtype(d.name) is d
    assert eval(repr(d), {"dtypes": dtypes}) is d
    assert str(d) == d.name
    assert d.np.itemsize * 8 >= d.bits
    assert hash(d) == hash(dtypes.dtype(d.name))


@pytest.mark.parametrize("d", ALL)
def test_pack_unpack_round_trip(d):
    rng = np.random.default_rng(0)
    if d.kind == "float":
        x = rng.standard_normal((3, 8)).astype(d.np)
    else:
        info = np.iinfo(np.int8 if d.name == "i4" else np.uint8) if d.is_subbyte else np.iinfo(d.np)
        lo, hi = (-8, 7) if d.name == "i4" else (0, 15) if d.name == "u4" else (info.min, info.max)
        x = rng.integers(lo, hi + 1, size=(3, 8)).astype(d.np)
    raw = dtypes.pack(d, x)
    assert raw.dtype == np.uint8
    assert raw.size * 8 == x.size * d.bits
    back = dtypes.unpack(d, raw).reshape(x.shape)
    np.testing.assert_array_equal(back.astype(np.float64), x.astype(np.float64))


@given(st.lists(st.integers(-8, 7), min_size=2, max_size=64).filter(lambda v: len(v) % 2 == 0))
def test_i4_packs_low_nibble_first(vals):
    x = np.array(vals, dtype=dtypes.i4.np)
    raw = dtypes.pack(dtypes.i4, x)
    for i, b in enumerate(raw):
        lo, hi = int(b) & 0xF, int(b) >> 4
        assert (lo ^ 8) - 8 == vals[2 * i] and (hi ^ 8) - 8 == vals[2 * i + 1]
    np.testing.assert_array_equal(dtypes.unpack(dtypes.i4, raw).astype(int), vals)


@given(st.lists(st.integers(0, 15), min_size=2, max_size=64).filter(lambda v: len(v) % 2 == 0))
def test_u4_round_trip(vals):
    raw = dtypes.pack(dtypes.u4, np.array(vals, dtype=dtypes.u4.np))
    np.testing.assert_array_equal(dtypes.unpack(dtypes.u4, raw).astype(int), vals)


def test_odd_sub_byte_length_is_rejected():
    with pytest.raises(ValueError, match="pairs"):
        dtypes.pack(dtypes.i4, np.zeros(3, dtype=dtypes.i4.np))


def test_unknown_name():
    with pytest.raises(ValueError, match="allowed"):
        dtypes.dtype("f17")


@given(st.floats(-1e30, 1e30, allow_nan=False))
def test_tf32_keeps_ten_mantissa_bits(x):
    r = float(dtypes.round_to(dtypes.tf32, np.array([x], dtype=np.float32))[0])
    bits = np.array([r], dtype=np.float32).view(np.uint32)[0]
    assert bits & 0x1FFF == 0                       # the 13 low mantissa bits are gone
    assert abs(r - np.float32(x)) <= abs(np.float32(x)) * 2 ** -10 + 1e-38


@pytest.mark.parametrize("d", [dtypes.f16, dtypes.bf16, dtypes.f8e4m3, dtypes.f8e5m2])
def test_round_to_is_idempotent(d):
    x = np.linspace(-3, 3, 101)
    once = dtypes.round_to(d, x)
    np.testing.assert_array_equal(dtypes.round_to(d, once), once)
