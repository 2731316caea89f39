"""Attention: the ``Attention`` spec, ``online_softmax`` and ``on_fragments()``, and
``recipes.fmha`` — interpreted against numpy on odd sequence lengths, causal masks (also with
seq_q != seq_kv), grouped-query heads and the log-sum-exp; planted hazards found; user errors
refused at ``check()``; every recipe variant compiled by NVRTC without spills; hypothesis over
shapes and tiles."""

from __future__ import annotations

import functools
import math

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ir
from firesched.errors import HazardError, ScheduleError
from firesched.hardware import sm80
from firesched.ir.rewrite import walk as ir_walk
from firesched.lower.fragments import project, table_of
from firesched.simulate.interp import run_program
from firesched.strategies import (
    done,
    move_to_regs,
    move_to_smem,
    on_fragments,
    online_softmax,
    part,
    pipeline,
    place,
    tile,
    to_blocks,
    to_warps,
)
from firesched.strategies.attention import SCORES as SCORES_
from firesched.strategies.attention import VALUES as VALUES_
from firesched.tensor import RF

P = fs.recipes.FmhaParams


def reference(q, k, v, causal=False, scale=None):
    """numpy attention on the rounded f16 inputs: q (b, hk, g, sq, d), k and v (b, hk, skv, d);
    returns O and the row log-sum-exp."""
    r = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    q, k, v = r(q), r(k), r(v)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhgqd,bhkd->bhgqk", q, k) * scale
    if causal:
        sq, skv = s.shape[-2:]
        s = np.where(np.arange(skv)[None, :] > np.arange(sq)[:, None], -np.inf, s)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lsum = p.sum(-1, keepdims=True)
    return np.einsum("bhgqk,bhkd->bhgqd", p / lsum, v), (np.log(lsum) + m)[..., 0]


def inputs(b, h, kvh, sq, skv, d, seed=0, magnitude=1.0):
    rng = np.random.default_rng(seed)
    g = h // kvh
    return (rng.standard_normal((b, kvh, g, sq, d)) * magnitude, rng.standard_normal((b, kvh, skv, d)) * magnitude,
            rng.standard_normal((b, kvh, skv, d)))


def check(b, h, sq, skv, d, *, kvh=None, causal=False, params=None, seed=0, magnitude=1.0):
    kvh = kvh or h
    sched = fs.recipes.fmha(b, h, sq, skv, d, kv_heads=kvh, causal=causal, lse=True, params=params)
    q, k, v = inputs(b, h, kvh, sq, skv, d, seed, magnitude)
    o, lse = fs.interpret(sched, q, k, v)
    ro, rl = reference(q, k, v, causal)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    assert np.abs(o - ro).max() <= 2e-2 * max(1.0, np.abs(ro).max())
    assert np.abs(lse - rl).max() <= 1e-4 * max(1.0, np.abs(rl).max())


#: the two designs: mma.sync warps (FlashAttention-2, sm_80 on) and wgmma warpgroups (sm_90a)
DESIGNS = [pytest.param("mma_sync", id="mma_sync"), pytest.param("wgmma", id="wgmma"),
           pytest.param("wgmma+tma", id="wgmma+tma"), pytest.param("wgmma+tma+ws", id="wgmma+tma+ws")]


def tiles(mma, block_kv=32, block_q=None, warps=None):
    """Small tiles of each design: 64 queries on 4 warps (one warpgroup), or what is given;
    ``"wgmma+tma"`` loads K and V by TMA."""
    if mma.startswith("wgmma"):
        return P(block_q=64, block_kv=block_kv, warps=4, mma="wgmma", tma="tma" in mma, warp_specialized="ws" in mma)
    return P(block_q=block_q or 64, block_kv=block_kv, warps=warps or 4)


@pytest.mark.parametrize("sq, skv", [(1, 1), (17, 17), (100, 90), (1, 37), (37, 1), (130, 200)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mma", DESIGNS)
def test_odd_lengths_match_numpy(sq, skv, causal, mma):
    check(1, 2, sq, skv, 64, causal=causal, params=tiles(mma))


@pytest.mark.parametrize("kvh", [1, 2])
@pytest.mark.parametrize("mma", DESIGNS)
def test_grouped_query_heads(kvh, mma):
    check(2, 4, 33, 70, 64, kvh=kvh, causal=True, params=tiles(mma, block_q=32, warps=2))


@pytest.mark.parametrize("d", [32, 96, 128, 256])
@pytest.mark.parametrize("mma", DESIGNS)
def test_head_dims(d, mma):
    check(1, 1, 40, 50, d, causal=True, params=tiles(mma, 16 if d == 256 else 32, block_q=32, warps=2))


@pytest.mark.parametrize("mma", DESIGNS)
def test_large_magnitudes_stay_finite(mma):
    check(1, 1, 64, 64, 64, magnitude=40.0, params=tiles(mma))


def test_default_plan_interprets():
    check(1, 2, 130, 70, 64, causal=True)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_p_stays_in_registers(arch):
    """Neither S nor P has a buffer in memory: the kernel's only shared tiles are Q, K and V."""
    prog = fs.recipes.fmha(1, 2, 100, 90, 64, arch=arch).lower(arch)
    k = prog.kernels[0]
    assert [b.name for b in k.shared if not isinstance(b, ir.MBarrier)] == ["Q_smem", "K_smem", "V_smem"]
    assert [b.name for b in prog.inputs] == ["Q", "K", "V"]
    assert {"S_acc", "P_frag", "O_acc"} <= {r.name for r in k.regs}


def test_the_accumulator_is_the_next_a_operand_lane_by_lane():
    """The m16n8k16 accumulator and A operand hold the same elements per lane: projecting the
    scores' rows gives two rows a lane, replicated over the lanes of a quad."""
    sched = fs.recipes.fmha(1, 1, 64, 64, 64, params=P(block_q=64, block_kv=32, warps=4))
    from firesched.lower.layouts import register_layouts
    block = next(n for n in sched.nodes() if n.spec.level == fs.BLOCK)
    lays = register_layouts(block)
    s = next(v for k, v in lays.items() if k.name == "S")
    t = project(table_of(s), attrs.evolve(s.key, name="mx", dims=("q",), shape=(64,), major="q"), ("q",), block)
    assert t.masks == (1, 2) and t.size == 2


def _planted(pred, mma="mma_sync"):
    sched = fs.recipes.fmha(1, 1, 40, 100, 64, params=tiles(mma, block_q=32, warps=2))
    prog = sched.lower("sm_90a")
    k = prog.kernels[0]

    def drop(s):
        if isinstance(s, ir.Seq):
            return ir.Seq(tuple(drop(c) for c in s.body if not pred(c)))
        if isinstance(s, (ir.For,)):
            return attrs.evolve(s, body=drop(s.body))
        if isinstance(s, ir.If):
            return attrs.evolve(s, then=drop(s.then))
        if isinstance(s, ir.Roles):
            return ir.Roles(tuple(attrs.evolve(r, body=drop(r.body)) for r in s.roles))
        return s

    q, kk, v = inputs(1, 1, 1, 40, 100, 64)
    feed = {"Q": q, "K": kk, "V": v}
    return prog, attrs.evolve(prog, kernels=(attrs.evolve(k, body=drop(k.body)),)), feed


def _atom(name):
    return lambda s: isinstance(s, ir.AtomCall) and s.atom.name == name


@pytest.mark.parametrize("what, pred, mma", [
    ("barrier", lambda s: isinstance(s, ir.Barrier), "mma_sync"),
    ("cp.async wait", lambda s: isinstance(s, ir.AsyncWait), "mma_sync"),
    ("barrier", lambda s: isinstance(s, ir.Barrier), "wgmma"),
    ("cp.async wait", lambda s: isinstance(s, ir.AsyncWait), "wgmma"),
    # the copies reach wgmma (the async proxy) only through the writers' proxy fence
    ("proxy fence", _atom("fence_proxy_async"), "wgmma"),
    # the softmax reads S before the first wgmma group is retired
    ("wgmma wait", _atom("wgmma_wait"), "wgmma"),
    ("wgmma fence", _atom("wgmma_fence"), "wgmma"),
    # K and V by TMA: the consumers wait on the stage's mbarrier before reading it
    ("mbarrier wait", _atom("mbarrier_try_wait"), "wgmma+tma"),
    # warp-specialized: the consumers wait for a full stage, the producer for an empty one
    ("mbarrier wait", _atom("mbarrier_try_wait"), "wgmma+tma+ws"),
    # the consumers' named barrier around staging Q (a block barrier would wait for the producer)
    ("named barrier", lambda s: isinstance(s, ir.Barrier) and s.threads, "wgmma+tma+ws"),
])
def test_planted_hazards_are_found(what, pred, mma):
    good, bad, feed = _planted(pred, mma)
    assert bad != good, f"no {what} to drop"
    run_program(good, feed)
    with pytest.raises(HazardError):
        run_program(bad, feed)


def _user(**kw):
    spec = fs.Attention.kernel(1, 1, 64, 64, 64)
    return spec.schedule(tile(b=1, hk=1, g=1, q=64) >> to_blocks(), move_to_smem("Q"), online_softmax(**kw))


def test_refusals():
    with pytest.raises(ScheduleError, match="multiple of 16"):
        _user(kv=24)
    with pytest.raises(ScheduleError, match="decomposes an Attention"):
        fs.Reduce.kernel("sum", {"r": 4, "c": 8}, "c").schedule(online_softmax())
    with pytest.raises(ScheduleError, match="map the queries onto blocks"):
        fs.Attention.kernel(1, 1, 64, 64, 64).schedule(online_softmax())
    with pytest.raises(ScheduleError, match="needs an operand in registers"):
        fs.Pointwise.kernel("add", {"r": 4}).schedule(tile(r=4) >> to_blocks(), on_fragments())
    with pytest.raises(ValueError, match="must divide heads"):
        fs.Attention.kernel(1, 6, 8, 8, 64, kv_heads=4)
    with pytest.raises(ValueError, match="head_dim"):
        fs.recipes.fmha(1, 1, 8, 8, 80)


def test_scores_mapped_on_other_warps_than_the_output_are_refused():
    mma = sm80.mma_m16n8k16_f16_f32
    sched = _user(kv=32).apply(
        move_to_smem("K"), move_to_smem("V"), pipeline(stages=2, prefetch=False), place("S", RF), place("P", RF),
        part(1, tile(q=16) >> to_warps(), tile(d=16), move_to_regs("Q"), move_to_regs("K"),
             tile(q=16, kv=8, d=16) >> done(mma)),
        part(-1, tile(q=32) >> to_warps(), tile(kv=16), move_to_regs("V"), tile(q=16, d=8, kv=16) >> done(mma)))
    with pytest.raises(ScheduleError):
        sched.check("sm_80")


#: every head dim with and without the mask; the dtype alternates (it changes the MMA and the
#: conversions, not the registers), both at head dims 64 and 128 (the bench's)
VARIANTS = [(d, dt, causal) for i, d in enumerate([32, 64, 96, 128, 256]) for causal in (False, True)
            for dt in (["f16", "bf16"] if d in (64, 128) else [("f16", "bf16")[(i + causal) % 2]])]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("d, dtype, causal", VARIANTS)
def test_every_variant_compiles_without_spills(d, dtype, causal, arch):
    sched = fs.recipes.fmha(2, 8, 1000, 1000, d, dtype=dtype, causal=causal, lse=causal, arch=arch)
    assert fs.compile(sched, arch=arch).spills == 0


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("shape", [(4, 16, 4096, 128), (16, 16, 1024, 128), (32, 16, 384, 64), (8, 16, 2048, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_the_planned_kernels_of_the_bench_shapes_do_not_spill(shape, causal, arch):
    # the sequences are multiples of the tiles: no edge guards, a different register allocation
    # from the 1000-key variants above (the sm_80 plan at head dim 128 spilled only here)
    b, h, s, d = shape
    k = fs.compile(fs.recipes.fmha(b, h, s, s, d, causal=causal, arch=arch), arch=arch)
    assert k.spills == 0


@pytest.mark.parametrize("shape, causal, dtype", [
    ((4, 16, 4096, 256), True, "bf16"), ((4, 16, 4096, 256), False, "f16"), ((1, 16, 1100, 256), True, "f16"),
    ((16, 16, 1024, 96), False, "bf16")])
def test_the_planned_128_query_kernels_at_head_dims_96_and_256_do_not_spill(shape, causal, dtype):
    # the 128-query designs, which the 1000-key variants above (64-query tiles) do not reach: at
    # head dim 256 with a causal mask the consumers need 240 registers (producer_regs=24)
    b, h, s, d = shape
    p = fs.recipes.fmha_plan(b, h, s, s, d, arch="sm_90a", causal=causal)
    assert p.block_q == 128 and p.separate and p.producer_regs == (24 if causal and d == 256 else 40)
    k = fs.compile(fs.recipes.fmha(b, h, s, s, d, causal=causal, dtype=dtype, lse=dtype == "bf16", arch="sm_90a"),
                   arch="sm_90a")
    assert k.spills == 0


def test_producer_regs_are_a_setmaxnreg_count():
    with pytest.raises(ValueError, match="producer_regs=20; setmaxnreg takes a multiple of 8 from 24 to 256"):
        P(block_q=128, block_kv=128, warps=8, mma="wgmma", tma=True, warp_specialized=True, producer_regs=20)
    from firesched.recipes.fmha import consumer_regs

    assert (consumer_regs(2), consumer_regs(2, producer_regs=24)) == (232, 240)


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (2, 2)]), st.integers(1, 80), st.integers(1, 80),
       st.sampled_from([32, 64]), st.sampled_from([(1, 16), (2, 16), (2, 32), (4, 16)]), st.sampled_from([16, 32, 64]),
       st.integers(1, 3), st.booleans(), st.sampled_from([16, 32, 48]))
def test_hypothesis_shapes_and_tiles(b, heads, sq, skv, d, warps_rows, bkv, stages, causal, q_slice):
    warps, rows = warps_rows
    _refused_or_right(b, heads, sq, skv, d, causal, "sm_80",
                      lambda: P(block_q=warps * rows, block_kv=bkv, warps=warps, stages=stages, q_slice=q_slice))


def _refused_or_right(b, heads, sq, skv, d, causal, arch, params):
    """A drawn schedule is refused at ``check()`` or interprets to numpy's attention."""
    h, kvh = heads
    try:
        sched = fs.recipes.fmha(b, h, sq, skv, d, kv_heads=kvh, causal=causal, params=params(), arch=arch)
        sched.check(arch)
    except ScheduleError:
        return
    q, k, v = inputs(b, h, kvh, sq, skv, d)
    o = fs.interpret(sched, q, k, v)
    ro, _ = reference(q, k, v, causal)
    assert np.abs(o - ro).max() <= 2e-2 * max(1.0, np.abs(ro).max())


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (2, 2)]), st.integers(1, 80), st.integers(1, 80),
       st.sampled_from([32, 64, 96]), st.sampled_from([64, 128]), st.sampled_from([16, 32, 48, 64]),
       st.integers(1, 3), st.booleans(), st.sampled_from([(False, False), (True, False), (True, True)]))
def test_hypothesis_wgmma_shapes_and_tiles(b, heads, sq, skv, d, bq, bkv, stages, causal, loads):
    tma, ws = loads
    stages = max(stages, 2) if ws else stages
    _refused_or_right(b, heads, sq, skv, d, causal, "sm_90a",
                      lambda: P(block_q=bq, block_kv=bkv, warps=bq // 16, stages=stages, mma="wgmma", tma=tma,
                                warp_specialized=ws))


def test_q_slice_is_whole_ldmatrix_columns():
    with pytest.raises(ValueError, match="q_slice=8 must be a multiple of 16"):
        P(block_q=64, block_kv=32, warps=2, q_slice=8)
    with pytest.raises(ValueError, match="q_slice=32 slices the query fragments mma.sync loads"):
        P(block_q=128, block_kv=128, warps=8, mma="wgmma", tma=True, q_slice=32)
    assert "tile(d=32)" in repr(fs.recipes.fmha(1, 1, 64, 64, 128, arch="sm_80", params=P(block_q=64, block_kv=32,
                                                                                           warps=2, q_slice=32)))


def test_wgmma_needs_sm90a():
    with pytest.raises(ScheduleError, match="wgmma needs sm_90a"):
        fs.recipes.fmha(1, 1, 64, 64, 64, arch="sm_80", params=tiles("wgmma"))
    with pytest.raises(ValueError, match="a warpgroup holds 64 query rows"):
        P(block_q=96, block_kv=64, warps=6, mma="wgmma")
    with pytest.raises(ValueError, match="stages >= 2"):
        P(block_q=128, block_kv=64, warps=8, stages=1, mma="wgmma", tma=True, warp_specialized=True)
    with pytest.raises(ValueError, match="needs tma=True"):
        P(block_q=128, block_kv=64, warps=8, mma="wgmma", warp_specialized=True)


def test_bench_smoke():
    from bench import fmha

    assert fmha.main(["--smoke"])[0]["max_abs_err"] < 2e-2


def _turns(pingpong=True, overlap=True, persistent=False, block_kv=32):
    """Two consumer warpgroups (128 queries) behind a producer, taking turns and/or overlapping."""
    return P(block_q=128, block_kv=block_kv, warps=8, stages=2, mma="wgmma", tma=True, warp_specialized=True,
             pingpong=pingpong, overlap=overlap, persistent=persistent)


@pytest.mark.parametrize("sq, skv, causal, pingpong, overlap", [
    (1, 1, False, True, True), (200, 77, False, True, False), (130, 260, True, False, True),
    (300, 100, True, True, True)])
def test_pingpong_and_overlap_match_numpy(sq, skv, causal, pingpong, overlap):
    """Consumers taking turns to issue wgmma and the rotated key loop: odd lengths (a single key
    step, a partial last one), causal with seq_q != seq_kv; the interpreter runs each consumer
    warpgroup on its own, so their turns and every register in flight are checked."""
    check(1, 2, sq, skv, 64, causal=causal, params=_turns(pingpong, overlap))


def test_pingpong_and_overlap_with_grouped_heads_and_head_dim_128():
    check(1, 4, 40, 100, 128, kvh=2, causal=True, params=_turns(block_kv=64))


def test_persistent_blocks_walk_several_tiles():
    """A persistent grid on a 2-SM target: each block walks several query tiles, the producer
    filling the next tile's ring while the consumers finish the last."""
    from firesched.hardware.target import target

    tg = attrs.evolve(target("sm_90a"), sm_count=2)
    sched = fs.recipes.fmha(1, 3, 300, 77, 64, params=_turns(persistent=True))
    q, k, v = inputs(1, 3, 3, 300, 77, 64)
    o = fs.interpret(sched, q, k, v, target=tg)
    ro, _ = reference(q, k, v)
    assert np.abs(o - ro).max() <= 2e-2 * max(1.0, np.abs(ro).max())


def _drop_in_consumers(prog, pred, nth=0):
    """``prog`` without the ``nth`` statement of its consumer role that ``pred`` selects."""
    seen = [0]

    def drop(s):
        if isinstance(s, ir.Seq):
            out = []
            for c in s.body:
                if pred(c):
                    seen[0] += 1
                    if seen[0] - 1 == nth:
                        continue
                out.append(drop(c))
            return ir.Seq(tuple(out))
        if isinstance(s, ir.For):
            return attrs.evolve(s, body=drop(s.body))
        if isinstance(s, ir.If):
            return attrs.evolve(s, then=drop(s.then))
        if isinstance(s, ir.Roles):
            return ir.Roles(tuple(attrs.evolve(r, body=drop(r.body)) if r.name == "consumers" else r
                                  for r in s.roles))
        return s

    (k,) = prog.kernels
    return attrs.evolve(prog, kernels=(attrs.evolve(k, body=drop(k.body)),))


@functools.cache
def _turns_program():
    """The ping-pong, overlapped kernel the planted hazards are taken from, run once as is."""
    good = fs.recipes.fmha(1, 1, 200, 150, 64, params=_turns()).lower("sm_90a")
    q, kk, v = inputs(1, 1, 1, 200, 150, 64)
    feed = {"Q": q, "K": kk, "V": v}
    run_program(good, feed)
    return good, feed


def _wait(n):
    return lambda s: isinstance(s, ir.AtomCall) and s.atom.name == "wgmma_wait" and f"{n}" in s.atom.ptx


@pytest.mark.parametrize("what, pred, nth, match", [
    # the first turn is warpgroup 0's: without it every consumer waits for a turn nobody passes
    ("first turn", lambda s: isinstance(s, ir.If) and isinstance(s.then, ir.Barrier) and s.then.arrive, 0,
     "deadlock"),
    # a turn not passed on: the other warpgroup waits for ever
    ("pass the turn", lambda s: isinstance(s, ir.Barrier) and s.arrive, 1, "deadlock"),
    # the rotated loop reads S before this step's first group is retired
    ("wait 1", _wait(1), 0, "wgmma"),
    # ... or rescales O while the previous step's O += P V still runs
    ("wait 0 in the loop", _wait(0), 1, "wgmma"),
])
def test_planted_turn_and_overlap_hazards_are_found(what, pred, nth, match):
    good, feed = _turns_program()
    bad = _drop_in_consumers(good, pred, nth)
    assert bad != good, f"no {what} to drop"
    with pytest.raises(HazardError, match=match):
        run_program(bad, feed)


def test_turns_and_overlap_are_refused_where_they_cannot_work():
    with pytest.raises(ValueError, match="pingpong=True"):
        P(block_q=64, block_kv=64, warps=4, mma="wgmma", tma=True, warp_specialized=True, pingpong=True)
    with pytest.raises(ValueError, match="overlap=True"):
        P(block_q=64, block_kv=64, warps=4, mma="wgmma", tma=True, overlap=True)
    spec = fs.Attention.kernel(1, 1, 64, 64, 64)
    from firesched.hardware.atoms import sm90a
    from firesched.strategies import to_warpgroups, warp_specialize
    via = (sm90a.tma_load_2d,)

    def user(block_q, ws, overlap):
        return spec.schedule(
            tile(b=1, hk=1, g=1, q=block_q) >> to_blocks(), move_to_smem("Q"), online_softmax(kv=64),
            move_to_smem("K", via=via), move_to_smem("V", via=via), pipeline(stages=2, overlap=overlap),
            *([ws] if ws else []), place("S", RF), place("P", RF),
            part(SCORES_, tile(q=64) >> to_warpgroups(), tile(d=16) >> done(sm90a.wgmma_atom(64, "f16"))),
            part(VALUES_, tile(q=64) >> to_warpgroups(),
                 tile(kv=16) >> done(sm90a.wgmma_atom(64, "f16", a_in_registers=True, b_mn_major=True))))

    with pytest.raises(ScheduleError, match="pingpong"):
        user(64, warp_specialize(pingpong=True), False).check("sm_90a")
    with pytest.raises(ScheduleError, match="overlap"):
        user(64, None, True).check("sm_90a")
    user(128, warp_specialize(consumer_regs=216, pingpong=True), True).check("sm_90a")
    assert "ping-pong" in str(user(128, warp_specialize(pingpong=True), True))
    assert "overlapped" in str(user(128, warp_specialize(pingpong=True), True))


def _masks_per_loop(sched):
    """The number of causal-mask fills (``RegFill -inf`` under an ``If``) in each key loop of the
    kernel's consumers, in order."""
    (k,) = sched.lower("sm_90a").kernels
    counts = []

    def fills(s):
        return sum(1 for x in ir_walk([s]) if isinstance(x, ir.If) and isinstance(x.then, ir.RegFill)
                   and x.then.value == float("-inf"))

    for s in ir_walk([k.body]):
        if isinstance(s, ir.For) and s.stop is not None:
            counts.append(fills(s.body))
    return counts


@pytest.mark.parametrize("sq, skv, params", [
    (96, 96, P(block_q=64, block_kv=16, warps=4, mma="wgmma", tma=True)),
    (40, 192, P(block_q=64, block_kv=32, warps=4, mma="wgmma")),
    (33, 160, _turns(block_kv=16)),
])
def test_causal_steps_left_of_the_diagonal_skip_the_mask(sq, skv, params):
    """A causal key loop runs the steps wholly left of each tile's diagonal without the mask (a
    loop of their own), then the steps the diagonal crosses with it; interpreted against numpy on
    tiles whose visible steps are many, none, or all but one (key lengths that the tiles divide:
    no edge mask to count)."""
    sched = fs.recipes.fmha(1, 2, sq, skv, 64, causal=True, params=params)
    first, second = _masks_per_loop(sched)[-2:]
    assert first == 0 < second
    check(1, 2, sq, skv, 64, causal=True, params=params)


@pytest.mark.parametrize("scale", [0.07, -0.05])
def test_the_scale_is_folded_into_the_exponentials_when_positive(scale):
    """A positive scale enters each exponential as an fma on unscaled scores (``exp2_sub_scaled``);
    a negative one, whose max would be another key's, multiplies the scores first.  Both, and the
    log-sum-exp, match numpy."""
    sched = fs.recipes.fmha(1, 2, 70, 90, 64, causal=True, scale=scale, lse=True, params=tiles("wgmma"))
    assert ("exp2_sub_scaled" in str(sched)) == (scale > 0)
    q, k, v = inputs(1, 2, 2, 70, 90, 64)
    o, lse = fs.interpret(sched, q, k, v)
    ro, rl = reference(q, k, v, True, scale)
    assert np.abs(o - ro).max() <= 2e-2 * max(1.0, np.abs(ro).max())
    assert np.abs(lse - rl).max() <= 1e-4 * max(1.0, np.abs(rl).max())


def test_persistent_needs_the_wgmma_design():
    with pytest.raises(ValueError, match="persistent=True"):
        P(block_q=64, block_kv=32, warps=4, persistent=True)


def test_two_blocks_an_sm_match_numpy_and_size_their_registers():
    """``blocks_per_sm=2``: a warp-specialized block of one consumer warpgroup, launched for two
    blocks an SM (``__launch_bounds__(256, 2)``), its consumers' ``setmaxnreg`` sized for half the
    register file and no shared-memory pad keeping the second block off."""
    p = P(block_q=64, block_kv=64, warps=4, stages=3, mma="wgmma", tma=True, warp_specialized=True, overlap=True,
          blocks_per_sm=2)
    check(1, 2, 150, 150, 64, causal=True, params=p)
    sched = fs.recipes.fmha(16, 16, 1024, 1024, 128, dtype="f16", arch="sm_90a", params=p)
    k = fs.compile(sched, arch="sm_90a")
    kern = k.program.kernels[0]
    assert "__launch_bounds__(256, 2)" in k.source and "setmaxnreg.inc.sync.aligned.u32 216;" in k.source
    assert 2 * (kern.shared_bytes + 1024) <= 233472 and k.spills == 0
    assert "one_block_per_sm" not in k.source          # 112 KiB of stages: a third block cannot fit anyway
    # one block an SM (the default) keeps the whole register file for its consumers
    one = fs.compile(fs.recipes.fmha(16, 16, 1024, 1024, 128, dtype="f16", arch="sm_90a",
                                     params=attrs.evolve(p, blocks_per_sm=1)), arch="sm_90a")
    assert "__launch_bounds__(256, 1)" in one.source and "setmaxnreg.inc.sync.aligned.u32 240;" in one.source
    assert "keeps a second block off the SM" in one.source


def test_two_blocks_an_sm_refuse_what_does_not_fit():
    # two consumer warpgroups, two blocks an SM: 384 threads are compiled to 80 registers, fewer
    # than a 64 x 128 accumulator tile a warpgroup needs
    with pytest.raises(ScheduleError, match="accumulators"):
        fs.recipes.fmha(4, 4, 512, 512, 128, arch="sm_90a", params=P(
            block_q=128, block_kv=64, warps=8, stages=2, mma="wgmma", tma=True, warp_specialized=True,
            blocks_per_sm=2)).check("sm_90a")
    # 128-key stages of head dim 128: two blocks' shared memory is more than the SM's
    with pytest.raises(ScheduleError, match="occupancy=2"):
        fs.recipes.fmha(4, 4, 512, 512, 128, arch="sm_90a", params=P(
            block_q=64, block_kv=128, warps=4, stages=2, mma="wgmma", tma=True, warp_specialized=True,
            blocks_per_sm=2)).check("sm_90a")
    with pytest.raises(ValueError, match="blocks_per_sm"):
        P(blocks_per_sm=0)


def test_the_mma_sync_design_takes_two_blocks_an_sm_too():
    p = P(block_q=64, block_kv=64, warps=2, stages=2, blocks_per_sm=2)
    check(1, 2, 100, 100, 64, causal=True, params=p)
    k = fs.compile(fs.recipes.fmha(1, 2, 100, 100, 64, dtype="f16", arch="sm_80", params=p), arch="sm_80")
    assert "__launch_bounds__(64, 2)" in k.source


# ------------------------------------------------------------------ the output's TMA-store epilogue

def _staged(persistent=False, q_by_producer=False):
    """Head dim 128, two consumer warpgroups: the output goes through shared memory and TMA."""
    return attrs.evolve(_turns(persistent=persistent, block_kv=64), q_by_producer=q_by_producer)


@pytest.mark.parametrize("persistent", [False, True], ids=["a block a tile", "persistent"])
def test_the_output_is_staged_in_the_query_rows_its_warpgroup_has_read(persistent):
    """The TMA-store epilogue's staging borrows Q's bytes (``lower.rules.borrow``): each consumer
    warpgroup writes its output tile into the 64 query rows it alone multiplied, so the kernel
    takes no more shared memory than without it; odd lengths (the store drops rows past seq_q),
    several tiles a block when persistent, against numpy."""
    from firesched.hardware.target import target

    tg = attrs.evolve(target("sm_90a"), sm_count=2)
    sched = fs.recipes.fmha(1, 3, 300, 77, 128, params=_staged(persistent))
    (k,) = sched.lower(tg).kernels
    alias = {b.name: b.alias for b in k.shared}
    assert alias["C_smem"] == "Q_smem"
    assert k.shared_bytes == ir.shared_bytes([b for b in k.shared if b.name != "C_smem"])
    assert any(isinstance(s, ir.AtomCall) and s.atom.name == "tma_store_5d" for s in ir_walk([k.body]))
    q, kk, v = inputs(1, 3, 3, 300, 77, 128)
    o = fs.interpret(sched, q, kk, v, target=tg)
    ro, _ = reference(q, kk, v)
    assert np.abs(o - ro).max() <= 2e-2 * max(1.0, np.abs(ro).max())


def test_the_plan_stages_its_output_in_the_query_tile():
    # a block per query tile (4,096 keys) on one three-stage ring: no room beside it but Q's rows
    (k,) = fs.recipes.fmha(4, 16, 4096, 4096, 128, arch="sm_90a").lower("sm_90a").kernels
    assert {b.name: b.alias for b in k.shared}.get("C_smem") == "Q_smem"


@pytest.mark.parametrize("block_kv, stages, staged", [(128, 3, False), (64, 2, True)])
def test_a_query_tile_the_producer_refills_is_not_borrowed(block_kv, stages, staged):
    """With Q on the producer's tile ring the next tile's Q may land while the epilogue stores:
    nothing is borrowed.  The staging takes bytes of its own where they fit beside the ring (64-key
    stages); beside the plan's ring of three 128-key stages they do not, and the output is stored
    from registers."""
    p = attrs.evolve(_staged(persistent=True, q_by_producer=True), block_kv=block_kv, stages=stages)
    (k,) = fs.recipes.fmha(1, 2, 200, 77, 128, params=p).lower("sm_90a").kernels
    alias = {b.name: b.alias for b in k.shared}
    assert alias.get("C_smem", None) == ("" if staged else None)
    stores = {s.atom.name for s in ir_walk([k.body]) if isinstance(s, ir.AtomCall) and s.atom.kind == "Move"}
    assert ("tma_store_5d" in stores) == staged
    check(1, 2, 200, 77, 128, params=p)


def _swap_warpgroup_rows(prog):
    """``prog`` with each warpgroup's staging writes landing in the other's 64 query rows (its
    TMA stores still read its own)."""
    from firesched.ir.rewrite import replace_leaves

    def swap(s):
        if isinstance(s, ir.AtomCall) and any(n == "dst" and isinstance(a, ir.MemRef) and a.buffer.name == "C_smem"
                                              for n, a in s.args):
            return attrs.evolve(s, args=tuple(
                (n, attrs.evolve(a, offset=a.offset + 4096 - (a.offset // 4096 % 2) * 8192) if n == "dst" else a)
                for n, a in s.args))
        return s

    (k,) = prog.kernels
    return attrs.evolve(prog, kernels=(attrs.evolve(k, body=replace_leaves(k.body, swap)),))


@pytest.mark.parametrize("what", ["the refill waits for the stores", "each warpgroup its own rows"])
def test_planted_staging_hazards_are_found(what):
    from firesched.hardware.target import target

    tg = attrs.evolve(target("sm_90a"), sm_count=2)
    good = fs.recipes.fmha(1, 2, 200, 77, 128, params=_staged(persistent=True)).lower(tg)
    q, kk, v = inputs(1, 2, 2, 200, 77, 128)
    feed = {"Q": q, "K": kk, "V": v}
    run_program(good, feed)
    if what == "the refill waits for the stores":
        bad = _drop_in_consumers(good, lambda s: isinstance(s, ir.If) and isinstance(s.then, ir.AtomCall)
                                 and "next tile may refill" in s.then.comment)
    else:
        bad = _swap_warpgroup_rows(good)
    assert bad != good
    with pytest.raises(HazardError):
        run_program(bad, feed)


def test_short_causal_loops_plan_two_blocks_an_sm():
    """Causal at head dim 128 with up to 512 keys: the plan takes two blocks of one 64-query
    consumer warpgroup an SM (their output staged in their own query rows); longer loops, and
    no mask, keep 128-query blocks.  The planned kernel matches numpy and compiles without spills."""
    plan = fs.recipes.fmha_plan
    short = plan(32, 16, 512, 512, 128, arch="sm_90a", causal=True)
    assert (short.blocks_per_sm, short.block_q, short.reverse) == (2, 64, True)
    assert plan(16, 16, 1024, 1024, 128, arch="sm_90a", causal=True).blocks_per_sm == 1
    assert plan(32, 16, 512, 512, 128, arch="sm_90a").blocks_per_sm == 1
    check(1, 2, 300, 300, 128, causal=True)
    sched = fs.recipes.fmha(32, 16, 512, 512, 128, causal=True, arch="sm_90a")
    (k,) = sched.lower("sm_90a").kernels
    assert {b.name: b.alias for b in k.shared}.get("C_smem") == "Q_smem"
    assert fs.compile(sched, arch="sm_90a").spills == 0


@settings(max_examples=6, deadline=None)
@given(st.sampled_from([(1, 1), (2, 1)]), st.integers(1, 150), st.integers(1, 150), st.sampled_from([64, 128]),
       st.sampled_from([32, 64]), st.integers(2, 3), st.booleans(),
       st.sampled_from([(True, True, False), (True, False, False), (False, True, False), (True, True, True)]))
def test_hypothesis_staged_outputs(heads, sq, skv, bq, bkv, stages, causal, turns):
    """Hand-written warp-specialized tiles at head dim 128 (one or two consumer warpgroups,
    ping-pong, overlap, a persistent grid on a 2-SM target): the output staged in the query rows
    where the rule can prove it safe, in bytes of its own or from registers otherwise; refused
    at check() or right against numpy, without hazards."""
    from firesched.hardware.target import target

    pingpong, overlap, persistent = turns
    pingpong = pingpong and bq == 128
    tg = attrs.evolve(target("sm_90a"), sm_count=2)
    h, kvh = heads
    try:
        p = P(block_q=bq, block_kv=bkv, warps=bq // 16, stages=stages, mma="wgmma", tma=True, warp_specialized=True,
              pingpong=pingpong, overlap=overlap, persistent=persistent, reverse=causal and not persistent)
        sched = fs.recipes.fmha(1, h, sq, skv, 128, kv_heads=kvh, causal=causal, params=p)
        sched.check(tg)
    except (ValueError, ScheduleError):
        return
    q, k, v = inputs(1, h, kvh, sq, skv, 128)
    o = fs.interpret(sched, q, k, v, target=tg)
    ro, _ = reference(q, k, v, causal)
    assert np.abs(o - ro).max() <= 2e-2 * max(1.0, np.abs(ro).max())
