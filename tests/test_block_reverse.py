"""``to_blocks(reverse=True)``: blocks take the tiles last to first, the same work in another order."""

from __future__ import annotations

import re

import attrs
import numpy as np
import pytest

import firesched as fs
from firesched.hardware.atoms import sm80
from firesched.strategies import done, move_to_regs, move_to_smem, tile, to_blocks, to_warps


def _gemm(reverse: bool, persistent: bool = False, group: int = 1, M: int = 80, N: int = 72, K: int = 32):
    spec = fs.MatMul.kernel(M, N, K)
    return spec.schedule(
        tile(m=32, n=16) >> to_blocks(group=group, persistent=persistent, reverse=reverse),
        tile(k=16), move_to_smem("A"), move_to_smem("B"),
        tile(m=16, n=8) >> to_warps(2, 2), move_to_regs("A"), move_to_regs("B"),
        tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32))


def test_reverse_is_printed_and_round_trips():
    st = to_blocks(reverse=True)
    assert repr(st) == "to_blocks(reverse=True)"
    assert eval(repr(st), {"to_blocks": to_blocks}) == st
    sched = _gemm(True)
    assert "reversed" in str(sched) and "reverse=True" in repr(sched.root.loops[0])


@pytest.mark.parametrize("persistent, group", [(False, 1), (True, 1), (False, 2), (True, 2)])
def test_reversed_blocks_compute_the_same_product(persistent, group):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((80, 32)).astype(np.float16)
    b = rng.standard_normal((32, 72)).astype(np.float16)
    want = fs.interpret(_gemm(False, persistent, group), a, b)
    np.testing.assert_array_equal(fs.interpret(_gemm(True, persistent, group), a, b), want)


def test_the_first_block_takes_the_last_tile():
    src = fs.compile(_gemm(True), arch="sm_90a").source
    assert "-bid_x" in src or "- bid_x" in src


@pytest.mark.parametrize("kw", [dict(reverse=1), dict(reverse=True, cluster=2)])
def test_reverse_is_a_bool_without_clusters(kw):
    with pytest.raises(fs.ScheduleError, match="reverse"):
        fs.MatMul.kernel(256, 256, 64).schedule(tile(m=128, n=128) >> to_blocks(**kw))


def test_causal_attention_starts_its_longest_query_tiles_first():
    """The plan reverses the query tiles of causal attention above head dim 64 (measured faster on
    an H100); a reversed causal kernel interprets to the same output."""
    sched = fs.recipes.fmha(1, 2, 300, 300, 128, arch="sm_90a", causal=True)
    # up to 512 keys the plan takes two blocks an SM (occupancy(2)), longer loops one
    assert re.search(r"q0 in block\(5\) occupancy\(2\) reversed", str(sched))
    assert re.search(r"q0 in block\([35]\) reversed", str(fs.recipes.fmha(1, 2, 300, 1000, 128, arch="sm_90a",
                                                                         causal=True)))
    assert "reversed" not in str(fs.recipes.fmha(1, 2, 300, 300, 128, arch="sm_90a"))
    assert "reversed" not in str(fs.recipes.fmha(1, 2, 300, 300, 64, arch="sm_90a", causal=True))
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 2, 1, 100, 64))
    k, v = rng.standard_normal((1, 2, 100, 64)), rng.standard_normal((1, 2, 100, 64))
    p = fs.recipes.fmha_plan(1, 2, 100, 100, 64, arch="sm_90a", causal=True)
    plain = fs.interpret(fs.recipes.fmha(1, 2, 100, 100, 64, arch="sm_90a", causal=True, params=p), q, k, v)
    rev = fs.recipes.fmha(1, 2, 100, 100, 64, arch="sm_90a", causal=True, params=attrs.evolve(p, reverse=True))
    np.testing.assert_array_equal(fs.interpret(rev, q, k, v), plain)
