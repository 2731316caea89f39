"""``swizzle_split``: a swizzled shared-memory offset written as the per-thread part's swizzle
XOR the rest's, where the two parts set disjoint bits — the same value, proven on every thread
and every unrolled index."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from firesched import ir
from firesched.ir.expr import BinOp, Var, evaluate
from firesched.layout import Swizzle
from firesched.lower.layouts import swizzle_split

TID = ir.tid(128)


def _values(expr, **env):
    tid = np.arange(128)
    return np.array([evaluate(expr, {"tid": t, **env}) for t in tid])


def test_disjoint_bits_split_into_two_swizzles():
    sw = Swizzle(3, 3, 4)
    d0 = Var("d0", 8)
    x = TID % 16 * 128 + TID % 32 // 16 * 8 + d0 * 16 + 2048
    split = swizzle_split(sw, x)
    assert isinstance(split, BinOp) and split.op == "^"
    for d in range(8):
        np.testing.assert_array_equal(_values(split, d0=d), _values(sw(x), d0=d))


def test_overlapping_bits_are_swizzled_whole():
    sw = Swizzle(3, 3, 4)
    d0 = Var("d0", 8)
    x = TID * 8 + d0 * 16          # tid * 8 reaches bit 4: a carry can cross
    assert swizzle_split(sw, x) == sw(x)


@settings(max_examples=200, deadline=None)
@given(bits=st.integers(1, 3), base=st.integers(0, 3), extra=st.integers(0, 2),
       mt=st.sampled_from([1, 2, 4, 8, 16, 64, 128, 256]), mod=st.sampled_from([2, 4, 8, 16, 32]),
       mk=st.sampled_from([1, 8, 16, 32, 512, 1024]), kext=st.integers(1, 8), const=st.integers(0, 4096))
def test_split_equals_the_whole_swizzle(bits, base, extra, mt, mod, mk, kext, const):
    sw = Swizzle(bits, base, bits + extra)
    k = Var("k", kext)
    x = TID % mod * mt + TID // mod * (mt * mod * 2) + k * mk + const
    split = swizzle_split(sw, x)
    for kv in range(kext):
        np.testing.assert_array_equal(_values(split, k=kv), _values(sw(x), k=kv))
