"""Attention with the query tile loaded by the producer warpgroup (``FmhaParams(q_by_producer=True)``:
a TMA move above the key loop, ``lower.transforms.tile_moves``), persistent or not: interpreted
against numpy on odd lengths, grouped-query heads, causal masks and persistent blocks that walk
several query tiles (the tile ring wraps; with a causal mask the steps past each tile's diagonal
pass through the key ring); the consumers' wait on Q, their release of it, the producer's wait
for that release and both sides of a passed step each shown necessary by a planted hazard;
schedule errors; the sm_90a kernels compiled by NVRTC without spills."""

from __future__ import annotations

import functools

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fmha import inputs, reference

import firesched as fs
from firesched import ir
from firesched.errors import HazardError, ScheduleError
from firesched.hardware.target import target
from firesched.ir.rewrite import replace_leaves
from firesched.ir.rewrite import walk as ir_walk
from firesched.simulate.interp import run_program

P = fs.recipes.FmhaParams

#: two SMs: a persistent grid of at most two blocks, each walking several query tiles
TWO_SMS = attrs.evolve(target("sm_90a"), sm_count=2)


def params(block_q=128, block_kv=32, stages=2, pingpong=None, overlap=True, persistent=True, q_stages=1):
    return P(block_q=block_q, block_kv=block_kv, warps=block_q // 16, stages=stages, mma="wgmma", tma=True,
             warp_specialized=True, pingpong=block_q >= 128 if pingpong is None else pingpong, overlap=overlap,
             persistent=persistent, q_by_producer=True, q_stages=q_stages)


def check(b, h, sq, skv, d, p, *, kvh=None, causal=False):
    kvh = kvh or h
    sched = fs.recipes.fmha(b, h, sq, skv, d, kv_heads=kvh, causal=causal, lse=True, params=p)
    q, k, v = inputs(b, h, kvh, sq, skv, d)
    o, lse = fs.interpret(sched, q, k, v, target=TWO_SMS)
    ro, rl = reference(q, k, v, causal)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    assert np.abs(o - ro).max() <= 2e-2 * max(1.0, np.abs(ro).max())
    assert np.abs(lse - rl).max() <= 1e-4 * max(1.0, np.abs(rl).max())


@pytest.mark.parametrize("b, h, kvh, sq, skv, d, p", [
    # one query, one key: a single tile, a single key step
    (1, 2, 2, 1, 1, 64, params()),
    # 17 queries, 100 keys in steps of 32 (a partial last step), grouped-query heads
    (1, 4, 2, 17, 100, 64, params()),
    # 300 queries in 3 tiles of 128 x 3 heads over 2 blocks: each walks 4-5 tiles, the tile ring's
    # phase flips every tile
    (1, 3, 3, 300, 77, 64, params()),
    # 100 keys, 17 queries per batch, neither turns nor overlap (the plain consumer loop)
    (2, 2, 1, 100, 17, 64, params(pingpong=False, overlap=False)),
    # one consumer warpgroup, head dim 128, 64-key steps
    (1, 3, 3, 100, 100, 128, params(block_q=64, block_kv=64)),
    # three stages, grouped heads, a ring whose stage count does not divide the key steps
    (1, 4, 1, 200, 150, 64, params(stages=3)),
    # two query buffers: each block's 4-5 tiles alternate between them (and the output is
    # staged in a buffer of its own)
    (1, 3, 3, 300, 77, 64, params(q_stages=2)),
    (1, 4, 2, 260, 100, 128, params(q_stages=2, block_kv=64)),
    (2, 2, 1, 100, 17, 64, params(q_stages=2, pingpong=False, overlap=False)),
])
def test_persistent_blocks_match_numpy(b, h, kvh, sq, skv, d, p):
    check(b, h, sq, skv, d, p, kvh=kvh)


@pytest.mark.parametrize("sq, skv", [(1, 37), (130, 200), (100, 17)])
def test_causal_grid_matches_numpy(sq, skv):
    """Causal (a key loop per tile that stops at its diagonal) with Q by the producer on the plain
    grid: the tile ring runs one round per block."""
    check(1, 2, sq, skv, 64, params(persistent=False), causal=True)


@pytest.mark.parametrize("h, kvh, sq, skv, p", [
    # 3 x 3 query tiles over 2 blocks, key loops of 4 to 10 steps of 32: the steps past each
    # tile's diagonal pass through the ring without data
    (3, 3, 300, 300, params()),
    (2, 1, 300, 77, params()),
    (3, 3, 100, 300, params(pingpong=False, overlap=False)),
    (3, 3, 260, 130, params(stages=3)),
    (2, 2, 200, 200, params(block_q=64)),
    # the longest tiles first, and Q loaded by the consumers (no tile ring)
    (3, 3, 300, 300, attrs.evolve(params(), reverse=True)),
    (3, 3, 300, 300, attrs.evolve(params(), q_by_producer=False)),
    (3, 3, 300, 300, params(q_stages=2)),
])
def test_causal_persistent_blocks_match_numpy(h, kvh, sq, skv, p):
    """A persistent grid with a causal mask: each tile's key loop stops at its diagonal, and the
    ring's phases stay those of the full loop in every block."""
    check(1, h, sq, skv, 64, p, kvh=kvh, causal=True)


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (3, 3)]), st.integers(1, 200), st.integers(1, 100),
       st.sampled_from([32, 64, 96]), st.sampled_from([64, 128]), st.sampled_from([16, 32, 64]), st.integers(2, 3),
       st.booleans(), st.booleans(), st.booleans(), st.integers(1, 2))
def test_hypothesis_shapes_and_tiles(b, heads, sq, skv, d, bq, bkv, stages, causal, persistent, overlap, q_stages):
    """A drawn schedule with Q by the producer checks and interprets, on two SMs, to numpy's
    attention (a persistent causal one too: nothing drawn here is refused)."""
    h, kvh = heads
    p = params(block_q=bq, block_kv=bkv, stages=stages, overlap=overlap, persistent=persistent, q_stages=q_stages)
    sched = fs.recipes.fmha(b, h, sq, skv, d, kv_heads=kvh, causal=causal, params=p)
    sched.check(TWO_SMS)
    q, k, v = inputs(b, h, kvh, sq, skv, d)
    o = fs.interpret(sched, q, k, v, target=TWO_SMS)
    ro, _ = reference(q, k, v, causal)
    assert np.abs(o - ro).max() <= 2e-2 * max(1.0, np.abs(ro).max())


def _bar(s):
    for name, a in s.args:
        if name == "bar" and isinstance(a, ir.MemRef):
            return a.buffer.name
    return None


def _on(atom: str, bar: str):
    """Selects the statement that issues ``atom`` on mbarrier ``bar``."""
    def pred(s):
        return isinstance(s, ir.AtomCall) and s.atom.name == atom and _bar(s) == bar
    return pred


def _drop(prog, pred):
    """``prog`` without every statement ``pred`` selects, in both roles."""
    (k,) = prog.kernels
    body = replace_leaves(k.body, lambda s: None if pred(s) else s)
    return attrs.evolve(prog, kernels=(attrs.evolve(k, body=body),))


@functools.cache
def _program():
    """The persistent, ping-pong, overlapped kernel the hazards are planted in (3 x 3 query tiles
    over 2 blocks, 3 key steps), run once as is.  Three stages: the producer issues the next
    tile's Q after that tile's first step, whose stage the consumers released after their first
    step of this tile, so the Q reads of the later steps are ordered before the copy only by Q's
    own empty barrier (with two stages the ring's release after the last S = Q Kᵀ would order
    them as well)."""
    return run_once(1, 3, 300, 77, 64, params(stages=3))


def planted_is_found(program, pred, match: str, what: str) -> None:
    """``program`` (a program and its inputs, ``run_once``) without the statements ``pred``
    selects raises a ``HazardError`` matching ``match`` in the interpreter."""
    good, feed = program
    bad = _drop(good, pred)
    assert bad != good, f"no {what} to drop"
    with pytest.raises(HazardError, match=match):
        run_program(bad, feed)


def run_once(b, h, sq, skv, d, p, causal=False):
    """The lowered program of ``fmha(b, h, sq, skv, d, causal=causal, params=p)`` on two SMs and
    its inputs, run once by the interpreter as is (no hazard)."""
    good = fs.recipes.fmha(b, h, sq, skv, d, causal=causal, params=p).lower(TWO_SMS)
    q, k, v = inputs(b, h, h, sq, skv, d)
    feed = {"Q": q, "K": k, "V": v}
    run_program(good, feed)
    return good, feed


@pytest.mark.parametrize("what, pred, match", [
    # the consumers read Q (their first S = Q Kᵀ) before its copy has landed
    ("the consumers' wait on Q", _on("mbarrier_try_wait", "tile_full"), "mbarrier"),
    # Q never released: the producer waits for ever before the block's second tile
    ("the consumers' release of Q", _on("mbarrier_arrive", "tile_empty"), "deadlock"),
    # the producer overwrites Q with the next tile's while the consumers still read it
    ("the producer's wait for the release", _on("mbarrier_try_wait", "tile_empty"), "mbarrier"),
])
def test_planted_hazards_are_found(what, pred, match):
    planted_is_found(_program(), pred, match, what)


@functools.cache
def _causal_program():
    """A persistent causal kernel (3 x 3 query tiles over 2 blocks, 10 key steps of 32) whose
    tiles pass the steps past their diagonal through the ring, run once as is."""
    return run_once(1, 3, 300, 300, 64, params(), causal=True)


def _past_diagonal(s):
    """The consumers' release of a step past the diagonal."""
    return isinstance(s, ir.AtomCall) and "release a step past the diagonal" in s.comment


@pytest.mark.parametrize("what, pred", [
    # the producer does not complete a skipped step's phase: the consumers wait for ever
    ("the producer's arrival without data", _on("mbarrier_arrive", "full")),
    # the consumers do not release a skipped step: the producer waits for ever
    ("the consumers' release of a skipped step", _past_diagonal),
])
def test_planted_pass_through_errors_are_found(what, pred):
    planted_is_found(_causal_program(), pred, "deadlock", what)


def test_a_persistent_causal_grid_needs_warp_specialization():
    """One role has no producer to pass the skipped steps through its ring."""
    p = P(block_q=64, block_kv=32, warps=4, mma="wgmma", tma=True, persistent=True)
    with pytest.raises(ScheduleError, match="warp_specialize"):
        fs.recipes.fmha(1, 3, 300, 300, 64, causal=True, params=p).check(TWO_SMS)


def test_the_producer_issues_q_and_the_consumers_do_not_copy():
    """The consumer role holds no copy into shared memory (Q came by cp.async from every consumer
    thread before); the producer's thread issues Q's TMA box once per tile: in a persistent block
    after the first key step's K and V (FlashAttention-3's order, ``tile_moves.AFTER_FIRST_STEP``),
    in a block of one tile first."""
    walking, _ = _program()
    single = fs.recipes.fmha(1, 3, 300, 77, 64, params=params(persistent=False)).lower(TWO_SMS)
    for prog, q_at in ((walking, 2), (single, 0)):
        roles = next(s for s in ir_walk([prog.kernels[0].body]) if isinstance(s, ir.Roles))
        prod, cons = roles.roles
        copies = [s for s in ir_walk([cons.body]) if isinstance(s, ir.AtomCall) and s.atom.family in ("cp_async", "tma")
                  and s.atom.dst_memory == "SH"]
        assert copies == []
        issued = [s for s in ir_walk([prod.body]) if isinstance(s, ir.AtomCall) and s.atom.family == "tma"]
        bars = [_bar_of_tma(s) for s in issued]
        # K and V of the first step (one box each at head dim 64), or none, before Q's one box
        assert bars.count("tile_full") == 1 and bars.index("tile_full") == q_at


def _bar_of_tma(s):
    for name, a in s.args:
        if name == "mbar" and isinstance(a, ir.MemRef):
            return a.buffer.name
    return None


def test_q_by_producer_is_refused_without_a_producer():
    with pytest.raises(ValueError, match="q_by_producer=True"):
        P(block_q=128, block_kv=64, warps=8, mma="wgmma", tma=True, q_by_producer=True)
    with pytest.raises(ValueError, match="q_stages=2 .* needs q_by_producer=True"):
        P(block_q=128, block_kv=64, warps=8, mma="wgmma", tma=True, warp_specialized=True, q_stages=2)


@functools.cache
def _two_buffer_program():
    """The persistent kernel with two query buffers (3 x 3 query tiles over 2 blocks), one key
    step a tile on a ring of four stages: the producer may run up to three tiles ahead, so only
    the release of a query buffer keeps the copy of the tile after next out of it (with more key
    steps than stages, the key ring's own releases order them as well)."""
    return run_once(1, 3, 300, 17, 64, params(stages=4, q_stages=2))


@pytest.mark.parametrize("what, pred, match", [
    ("the consumers' wait on Q", _on("mbarrier_try_wait", "tile_full"), "mbarrier"),
    # with two buffers the copy of the tile after next overwrites the buffer still read
    ("the producer's wait for the release", _on("mbarrier_try_wait", "tile_empty"), "mbarrier"),
])
def test_planted_hazards_in_two_query_buffers_are_found(what, pred, match):
    program = _two_buffer_program()
    assert {b.name: b.nbytes for b in program[0].kernels[0].shared}["Q_smem"] == 2 * 128 * 64 * 2
    planted_is_found(program, pred, match, what)


def test_query_buffers_are_a_tile_moves():
    """``move_to_smem(stages=)`` gives a TMA tile move a ring of its own; elsewhere it is refused."""
    from firesched.hardware.atoms import sm90a
    from firesched.strategies import move_to_smem

    m = move_to_smem("Q", via=(sm90a.tma_load_2d,), stages=2)
    assert "stages=2" in repr(m) and "stages" not in repr(move_to_smem("Q"))
    base = fs.recipes.fmha(1, 1, 64, 64, 64, params=params(persistent=False))
    for bad, match in ((move_to_smem("Q", stages=2), "not a TMA copy"),
                       (move_to_smem("Q", via=(sm90a.tma_load_2d,), stages=0), "1..4")):
        with pytest.raises(ScheduleError, match=match):
            fs.Attention.kernel(1, 1, 64, 64, 64).schedule(base.strategies[0], bad)


def test_a_staged_move_inside_the_pipelined_loop_takes_pipelines_count():
    """A move inside the K loop is as deep as ``pipeline(stages=)`` makes it: another count given
    to its ``move_to_smem(stages=)`` is refused, naming both, instead of silently replaced."""
    from firesched.hardware.atoms import sm90a
    from firesched.strategies import move_to_smem, online_softmax, pipeline, tile, to_blocks

    via = (sm90a.tma_load_2d,)

    def chain(k_stages, stages):
        return (tile(b=1, hk=1, g=1, q=64) >> to_blocks(), move_to_smem("Q", via=via), online_softmax(kv=64),
                move_to_smem("K", via=via, stages=k_stages), move_to_smem("V", via=via), pipeline(stages=stages))

    with pytest.raises(ScheduleError, match=r"K is staged inside the K loop.*already 3 stages deep") as e:
        fs.Attention.kernel(1, 1, 64, 64, 64).schedule(*chain(3, 2))
    assert "pipeline(stages=3)" in str(e.value)
    sched = fs.Attention.kernel(1, 1, 64, 64, 64).schedule(*chain(2, 2))
    assert "K:SH f16[64x64] Sw<3,3,3> x2 stages" in str(sched)


def test_a_tile_move_without_warp_specialization_is_refused():
    """A TMA move above a key loop that no producer issues has no ring to complete on."""
    from firesched.hardware.atoms import sm90a
    from firesched.layout import Swizzle
    from firesched.strategies import (
        done,
        move_to_smem,
        online_softmax,
        part,
        pipeline,
        place,
        tile,
        to_blocks,
        to_warpgroups,
    )
    from firesched.strategies.attention import SCORES, VALUES
    from firesched.tensor import RF

    via, sw = (sm90a.tma_load_2d,), Swizzle(3, 3, 3)
    sched = fs.Attention.kernel(1, 1, 64, 64, 64).schedule(
        tile(b=1, hk=1, g=1, q=64) >> to_blocks(), move_to_smem("Q", swizzle=sw, via=via), online_softmax(kv=64),
        move_to_smem("K", swizzle=sw, via=via), move_to_smem("V", swizzle=sw, via=via), pipeline(stages=2),
        place("S", RF), place("P", RF),
        part(SCORES, tile(q=64) >> to_warpgroups(), tile(d=16) >> done(sm90a.wgmma_atom(64, "f16"))),
        part(VALUES, tile(q=64) >> to_warpgroups(),
             tile(kv=16) >> done(sm90a.wgmma_atom(64, "f16", a_in_registers=True, b_mn_major=True))))
    with pytest.raises(ScheduleError, match="warp-specialized producer"):
        sched.check("sm_90a")


def test_the_plan_walks_short_key_loops_in_persistent_blocks():
    """Without a mask and up to 2,048 keys at head dim 128 the plan is FlashAttention-3's design
    (bench/README.md, "K and V on rings of their own"): K and V on rings of their own, persistent
    blocks, two query buffers loaded by the producer, the output staged in its own buffer.  Longer
    key loops and causal masks keep a block per query tile (measured slower persistent)."""
    plan = fs.recipes.fmha_plan
    p = plan(16, 16, 1024, 1024, 128, arch="sm_90a")
    assert p.persistent and p.q_by_producer and p.q_stages == 2 and p.separate and p.stages == 2
    (k,) = fs.recipes.fmha(16, 16, 1024, 1024, 128, arch="sm_90a").lower("sm_90a").kernels
    shared = {b.name: (b.nbytes, b.alias) for b in k.shared}
    assert shared["Q_smem"] == (2 * 128 * 128 * 2, "") and shared["C_smem"][1] == ""
    assert {"K_full", "K_empty", "V_full", "V_empty"} <= set(shared)
    for args, causal in [((16, 16, 1024, 1024, 128), True), ((4, 16, 4096, 4096, 128), False),
                         ((4, 16, 4096, 4096, 128), True)]:
        p = plan(*args, arch="sm_90a", causal=causal)
        assert not p.persistent and not p.q_by_producer and not p.separate and p.warp_specialized
    assert not plan(16, 16, 1024, 1024, 128, arch="sm_80").q_by_producer


#: head dims 64, 128 (both dtypes: the bench's) and 256, with the plan's tiles for 128 queries;
#: and causal at 64 and 128 (at 256 the persistent causal kernel with the log-sum-exp spills 32
#: bytes, so no plan asks for it)
COMPILED = [(64, "f16", False), (128, "f16", False), (128, "bf16", False), (256, "bf16", False),
            (64, "bf16", True), (128, "f16", True)]


@pytest.mark.parametrize("d, dtype, causal", COMPILED)
def test_sm90a_kernels_compile_without_spills(d, dtype, causal):
    bkv, stages = (64, 2) if d > 128 else (128, 3)
    p = params(block_kv=bkv, stages=stages)
    k = fs.compile(fs.recipes.fmha(16, 16, 1024, 1024, d, dtype=dtype, causal=causal, lse=causal, params=p),
                   arch="sm_90a")
    assert k.spills == 0
    (r,) = k.resources.values()
    assert r.stack_frame_bytes == 0
