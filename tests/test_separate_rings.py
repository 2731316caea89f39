"""K and V on mbarrier rings of their own (``pipeline(separate=True)``, ``FmhaParams(separate=True)``,
``lower.transforms.pipeline.OperandRings``): interpreted against numpy in plain and persistent grids,
causal or not, overlapped or not; the overlapped loop waits for each operand with the group that
reads it first and releases it after the group that reads it last, each wait and release shown
necessary by a planted hazard; the producer issues each operand on its own ring; schedule errors."""

from __future__ import annotations

import functools

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fmha_q_producer import _bar, _bar_of_tma, check, planted_is_found, run_once

import firesched as fs
from firesched import ir
from firesched.errors import ScheduleError
from firesched.ir.rewrite import walk as ir_walk

P = fs.recipes.FmhaParams


def params(block_q=128, stages=2, overlap=True, persistent=False, q_stages=1, block_kv=32):
    return P(block_q=block_q, block_kv=block_kv, warps=block_q // 16, stages=stages, mma="wgmma", tma=True,
             warp_specialized=True, pingpong=block_q >= 128, overlap=overlap, persistent=persistent,
             q_by_producer=persistent, q_stages=q_stages, separate=True)


@pytest.mark.parametrize("b, h, kvh, sq, skv, d, causal, p", [
    (1, 2, 2, 1, 1, 64, False, params()),
    (1, 4, 2, 130, 200, 64, False, params(block_q=64)),
    (1, 2, 1, 100, 77, 128, False, params()),
    (1, 2, 2, 200, 130, 64, True, params(block_q=64)),
    (2, 2, 1, 130, 100, 64, False, params(overlap=False)),
    (1, 2, 2, 100, 300, 64, True, params(overlap=False, stages=3)),
    # persistent blocks on two SMs walking 4-5 tiles, two query buffers, causal steps passed through
    (1, 3, 3, 300, 77, 64, False, params(persistent=True, q_stages=2)),
    (1, 3, 3, 300, 300, 64, True, params(persistent=True, q_stages=2)),
    (1, 3, 3, 260, 130, 64, True, params(persistent=True, stages=3)),
])
def test_separate_rings_match_numpy(b, h, kvh, sq, skv, d, causal, p):
    check(b, h, sq, skv, d, p, kvh=kvh, causal=causal)


@pytest.mark.parametrize("b, h, kvh, sq, skv, d, causal", [
    (1, 2, 1, 130, 77, 256, True), (1, 2, 2, 129, 200, 256, False), (1, 2, 2, 200, 130, 96, False)])
def test_the_planned_128_query_designs_at_head_dims_96_and_256_match_numpy(b, h, kvh, sq, skv, d, causal):
    """The plan's designs where 128-query tiles fill the GPU (taken at 8 x 16 heads of 2,048
    keys), run on small odd shapes: at head dim 256 separate rings of two 64-key stages (causal:
    the producer keeping 24 registers), at 96 the persistent grid with two query buffers."""
    p = fs.recipes.fmha_plan(8, 16, 2048, 2048, d, arch="sm_90a", causal=causal)
    assert p.block_q == 128 and p.separate and p.persistent == (d == 96)
    assert p.producer_regs == (24 if causal else 40)
    check(b, h, sq, skv, d, p, kvh=kvh, causal=causal)


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (3, 3)]), st.integers(1, 200), st.integers(1, 130),
       st.sampled_from([32, 64]), st.sampled_from([64, 128]), st.sampled_from([16, 32, 64]), st.integers(2, 3),
       st.booleans(), st.booleans(), st.booleans())
def test_hypothesis_separate_rings(b, heads, sq, skv, d, bq, bkv, stages, causal, persistent, overlap):
    """A drawn schedule with K and V on rings of their own checks and interprets to numpy's."""
    h, kvh = heads
    p = params(block_q=bq, block_kv=bkv, stages=stages, overlap=overlap, persistent=persistent)
    check(b, h, sq, skv, d, p, kvh=kvh, causal=causal)


@functools.cache
def _program():
    """An overlapped kernel on two rings of two stages (2 x 2 query tiles over 2 blocks, 5 key
    steps), run once as is."""
    return run_once(1, 2, 200, 150, 64, params(block_q=128))


def _consumer(atom: str, bar: str, why: str = ""):
    """Selects the consumers' statement issuing ``atom`` on ``bar`` (whose comment holds ``why``)."""
    def pred(s):
        return (isinstance(s, ir.AtomCall) and s.atom.name == atom and _bar(s) == bar and why in s.comment
                and "consumers released" not in s.comment)
    return pred


@pytest.mark.parametrize("what, pred, match", [
    # S = Q Kᵀ reads a K stage whose copy has not landed
    ("the wait for K", _consumer("mbarrier_try_wait", "K_full"), "mbarrier"),
    # O += P V reads a V stage whose copy has not landed
    ("the wait for V", _consumer("mbarrier_try_wait", "V_full"), "mbarrier"),
    # K's stage released once S retired: without it the producer waits for ever
    ("the release of K after S = Q Kᵀ", _consumer("mbarrier_arrive", "K_empty", "first group"), "deadlock"),
    # V's stage released once O += P V retired
    ("the release of V after O += P V", _consumer("mbarrier_arrive", "V_empty", "previous step"), "deadlock"),
    # the producer refills a K stage the consumers still read
    ("the producer's wait for K's release", lambda s: isinstance(s, ir.AtomCall) and s.atom.name == "mbarrier_try_wait"
     and _bar(s) == "K_empty", "mbarrier"),
])
def test_planted_hazards_are_found(what, pred, match):
    planted_is_found(_program(), pred, match, what)


def test_each_operand_is_issued_and_released_on_its_own_ring():
    """The producer acquires, announces and issues K then V, each on its own barriers; the
    overlapped consumers release K in the step it is read and V a step later."""
    good, _ = _program()
    roles = next(s for s in ir_walk([good.kernels[0].body]) if isinstance(s, ir.Roles))
    prod, cons = roles.roles
    bars = [_bar(s) or _bar_of_tma(s) for s in ir_walk([prod.body]) if isinstance(s, ir.AtomCall)
            and (s.atom.name in ("mbarrier_try_wait", "mbarrier_arrive_expect_tx") or s.atom.family == "tma")]
    # a step: wait for K's stage, announce its bytes, TMA K; then the same for V
    assert bars[:6] == ["K_empty", "K_full", "K_full", "V_empty", "V_full", "V_full"], bars[:6]
    releases = [s.comment for s in ir_walk([cons.body]) if isinstance(s, ir.AtomCall) and s.atom.name == "mbarrier_arrive"]
    assert any("(K)" in c and "first group" in c for c in releases)
    assert any("(V)" in c and "previous step" in c for c in releases)
    assert "separate rings" in str(fs.recipes.fmha(1, 2, 200, 150, 64, params=params(block_q=128)))


def test_separate_rings_need_a_producer():
    with pytest.raises(ValueError, match="separate=True .* needs warp_specialized=True"):
        P(block_q=64, block_kv=64, warps=4, mma="wgmma", tma=True, separate=True)
    one_role = attrs.evolve(params(block_q=64), warp_specialized=False, overlap=False, pingpong=False,
                            separate=False)
    sched = fs.recipes.fmha(1, 1, 64, 64, 64, params=one_role)
    from firesched.strategies import pipeline
    bad = sched.apply(pipeline(stages=2, separate=True))
    with pytest.raises(ScheduleError, match="separate=True"):
        bad.check("sm_90a")
    assert repr(pipeline(stages=2, separate=True)) == "pipeline(stages=2, separate=True)"
    with pytest.raises(ScheduleError, match="separate is a bool"):
        sched.apply(pipeline(stages=2, separate=1))


def _separate(sched):
    """``sched``'s strategies again, with ``pipeline(..., separate=True)``."""
    from firesched.strategies import pipeline

    return sched.spec.schedule(*(attrs.evolve(s, separate=True) if isinstance(s, pipeline) else s
                                 for s in sched.strategies))


@pytest.mark.parametrize("M, cluster", [(128, None), (256, 2)])
def test_a_gemm_ring_split_per_operand_acts_as_one(M, cluster):
    """A warp-specialized GEMM's loop body is one wgmma group: its A and B rings wait and release
    together (in a cluster, in every block whose producer multicasts into this one), and the
    result is the same."""
    from firesched.testing.check import assert_schedule_correct

    kw = {"cluster": cluster} if cluster else {}
    sched = _separate(fs.recipes.gemm(M, 256, 256, arch="sm_90a", **kw))
    assert "separate rings" in str(sched)
    (k,) = sched.lower("sm_90a").kernels
    assert {"A_full", "A_empty", "B_full", "B_empty"} <= {b.name for b in k.shared}
    assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_staged_group_scales_refuse_separate_rings():
    """W4A16's group scales ride on the stage of one ring (one TMA box each): with rings per operand
    the schedule is refused, naming the option."""
    sched = _separate(fs.recipes.gemm_w4a16(64, 4096, 4096, group_size=128, arch="sm_90a"))
    with pytest.raises(ScheduleError, match="staged group scales ride on one ring"):
        sched.check("sm_90a")
