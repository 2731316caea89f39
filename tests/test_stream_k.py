"""``stream_k(parts)``: the K chunks of all tiles over a persistent grid, data-parallel whole tiles
first and contiguous ranges of chunks for the last waves, partial tiles handed between blocks
through a workspace and flags.  Hand-written chains in both atom families and the recipe, on
targets of a few SMs (so that blocks share tiles), against numpy; the flag protocol's planted
hazards; the errors; NVRTC."""

from __future__ import annotations

import functools

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ir
from firesched import simulate as interp
from firesched.errors import HazardError, ScheduleError
from firesched.hardware.atoms import sm80, sm90a
from firesched.hardware.target import SM80, SM90A
from firesched.schedule import Loop
from firesched.strategies import (
    done,
    move_to_regs,
    move_to_smem,
    pipeline,
    split_k,
    stream_k,
    tile,
    to_blocks,
    to_warpgroups,
    to_warps,
    warp_specialize,
)
from firesched.testing.planting import planted


def _sms(target, n):
    return attrs.evolve(target, sm_count=n)


def _ref(A, B):
    return A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)


def _check(sched, M, N, K, target, seed=0):
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    C = fs.interpret(sched, A, B, target=target).astype(np.float64)
    ref = _ref(A, B)
    assert np.abs(C - ref).max() <= 2e-2 * max(np.abs(ref).max(), 1.0)


def _sm80_chain(parts, bm=64, bn=64, bk=32, stages=3):
    return [stream_k(parts), tile(m=bm, n=bn) >> to_blocks(), tile(k=bk), move_to_smem("A"), move_to_smem("B"),
            pipeline(stages=stages), tile(m=bm // 2, n=bn // 2) >> to_warps(2, 2), move_to_regs("A"),
            move_to_regs("B"), tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32)]


def _sm90_chain(parts, bm=128, bn=128, ws=True, stages=3, dt=fs.dtypes.f16):
    chain = [stream_k(parts), tile(m=bm, n=bn) >> to_blocks(), tile(k=64),
             move_to_smem("A", via=(sm90a.tma_load_2d,)), move_to_smem("B", via=(sm90a.tma_load_2d,)),
             pipeline(stages=stages)]
    if ws:
        chain.append(warp_specialize(producer_regs=40, consumer_regs=232 if bm <= 128 else 160))
    return chain + [tile(m=64) >> to_warpgroups(), tile(k=16) >> done(sm90a.wgmma_atom(bn, dt, b_mn_major=True))]


def test_tree_and_repr():
    spec = fs.MatMul.kernel(256, 256, 1000, a="f16", b="f16", c="f16", acc="f32")
    sched = spec.schedule(*_sm80_chain(4))
    text = str(sched)
    assert "stream_k(4)" in text and "block(4) stream-K" in text
    assert "MatMul<kernel>(A:GL f16[256x256], B:GL f16[256x256]" in text     # chunks of 256 of K = 1000
    assert eval(repr(stream_k(3)), {"stream_k": stream_k}) == stream_k(3)
    lp = Loop("kc0", 3, (("k", 256),), fs.BLOCK, stream=True)
    assert eval(repr(lp), {"Loop": Loop, "Level": fs.Level, "BLOCK": fs.BLOCK}) == lp
    assert hash(stream_k(2)) == hash(stream_k(2))


@pytest.mark.parametrize("sms", [1, 3, 132])
def test_sm80_family(sms):
    """Chunks of 64 x 64 tiles over 1 to 132 SMs: whole tiles first where there are several waves,
    then ranges of chunks that start and end inside tiles."""
    M, N, K = 200, 136, 450
    sched = fs.MatMul.kernel(M, N, K, a="f16", b="f16", c="f16", acc="f32").schedule(*_sm80_chain(3))
    _check(sched, M, N, K, _sms(SM80, sms))


@pytest.mark.parametrize("ws, sms", [(True, 2), (False, 5), (True, 7)],
                         ids=["warp-specialized-2", "one-role-5", "warp-specialized-7"])
def test_sm90_family(ws, sms):
    M, N, K = 300, 264, 700
    sched = fs.MatMul.kernel(M, N, K, a="f16", b="f16", c="f16", acc="f32").schedule(*_sm90_chain(4, ws=ws))
    _check(sched, M, N, K, _sms(SM90A, sms))


def test_walk_covers_every_chunk_once():
    """The block order's walk: every (tile, chunk) exactly once, the data-parallel steps whole
    tiles of one block, the stream-K ranges contiguous and each tile stored by one block."""
    from firesched.ir.expr import evaluate as ev
    from firesched.lower.transforms.blocks import block_order

    def evaluate(x, env):
        return int(ev(x, env))

    for sms, parts, mt, nt in ((3, 4, 5, 4), (7, 3, 3, 3), (2, 2, 4, 4), (132, 5, 2, 3)):
        loops = [(Loop("kc0", parts, (("k", 64),), fs.BLOCK, stream=True), None),
                 (Loop("m0", mt, (("m", 64),), fs.BLOCK), None), (Loop("n0", nt, (("n", 64),), fs.BLOCK), None)]
        order = block_order(loops, None, _sms(SM90A, sms))
        sk = order.stream
        seen, stored = {}, {}
        for b in range(order.grid[0]):
            for u in range(order.tile_var.extent):
                env = {"bid_x": b, "unit": u}
                if not evaluate(order.tile_valid, env):
                    continue
                t = (evaluate(order.bindings["m0"], env), evaluate(order.bindings["n0"], env))
                kc = evaluate(order.bindings["kc0"], env)
                assert (t, kc) not in seen
                seen[t, kc] = b
                if evaluate(sk.last, env) and evaluate(sk.top, env):
                    assert t not in stored
                    stored[t] = b
                    partners = evaluate(sk.partners, env)
                    assert partners <= sk.max_partners
                    # the partners are the lower blocks that hold chunks of this tile
                    holders = {seen.get((t, c)) for c in range(parts)} - {b, None}
                    assert holders == set(range(b - partners, b))
        assert len(seen) == mt * nt * parts and len(stored) == mt * nt


cases = st.fixed_dictionaries(dict(
    M=st.integers(1, 300), N=st.integers(1, 40).map(lambda n: 8 * n), K=st.integers(1, 1200),
    parts=st.integers(2, 6), sms=st.integers(1, 9), family=st.sampled_from(["sm80", "sm90a", "sm90a-one-role"]),
    bm=st.sampled_from([64, 128]), seed=st.integers(0, 2 ** 16)))


@settings(max_examples=20 if settings().max_examples >= 500 else 6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_random_chains(case):
    """Hand-written stream-K chains over odd sizes and few SMs: refused at check() with a
    ScheduleError, or hazard-free in the interpreter and equal to numpy."""
    M, N, K, parts, sms, fam, bm = (case[k] for k in ("M", "N", "K", "parts", "sms", "family", "bm"))
    spec = fs.MatMul.kernel(M, N, K, a="f16", b="f16", c="f16", acc="f32")
    chain = _sm80_chain(parts, bm=bm) if fam == "sm80" else _sm90_chain(parts, bm=bm, ws=fam == "sm90a")
    target = _sms(SM80 if fam == "sm80" else SM90A, sms)
    try:
        sched = spec.schedule(*chain)
        sched.check(target)
    except ScheduleError as e:
        # the only refusal: more chunks than K has 64-element pieces for, or a K so short the
        # chunks leave one empty
        assert "chunks" in str(e), str(e)
        return
    _check(sched, M, N, K, target, case["seed"])


def test_recipe():
    """``recipes.gemm(..., stream_k_parts=p)`` in both families, through ``GemmParams`` too."""
    M, N, K = 200, 136, 450
    tgt = _sms(SM90A, 5)
    for kw in (dict(block_m=128, block_n=128), dict(atoms="sm80", block_m=64, block_n=64),
               dict(block_m=64, block_n=128, warp_specialized=False)):
        sched = fs.recipes.gemm(M, N, K, "f16", "sm_90a", stream_k_parts=3, **kw)
        assert any(lp.stream for n in sched.nodes() for lp in n.loops)
        _check(sched, M, N, K, tgt)
    p = fs.recipes.GemmParams(atoms="sm90a", block_m=128, block_n=128, stream_k_parts=2)
    assert p["stream_k_parts"] == 2
    assert "stream_k(2)" in str(fs.recipes.gemm(M, N, K, "f16", "sm_90a", params=p))


def test_errors():
    spec = fs.MatMul.kernel(64, 64, 100, a="f16", b="f16", c="f16", acc="f32")
    with pytest.raises(ScheduleError, match="gives 2 chunks, not 3") as e:
        spec.schedule(stream_k(3))
    assert "stream_k(2)" in str(e.value)
    with pytest.raises(ScheduleError, match="parts must be"):
        spec.schedule(stream_k(0))
    with pytest.raises(ScheduleError, match="kernel-level MatMul"):
        spec.schedule(tile(m=64, n=64) >> to_blocks(), stream_k(2))
    big = fs.MatMul.kernel(256, 256, 512, a="f16", b="f16", c="f16", acc="f32")
    with pytest.raises(ScheduleError, match="cluster"):
        fs.recipes.gemm(256, 256, 512, "f16", "sm_90a", block_m=128, block_n=128, cluster=2, stream_k_parts=2)
    with pytest.raises(ScheduleError, match="split_k_blocks"):
        fs.recipes.gemm(256, 256, 512, "f16", "sm_90a", atoms="sm80", split_k_blocks=2, stream_k_parts=2)
    with pytest.raises(ScheduleError, match="reverse"):
        big.schedule(stream_k(2), tile(m=128, n=128) >> to_blocks(reverse=True), *_sm90_chain(2)[2:]).check(SM90A)
    with pytest.raises(ScheduleError, match="split_k"):
        big.schedule(*_sm80_chain(2)[:6], split_k(2, across=fs.WARP), *_sm80_chain(2)[6:]).check(SM80)


# --------------------------------------------------------------------------- the flag protocol

def _flag_store(value):
    return lambda s: None if (isinstance(s, ir.AtomCall) and s.atom.name == "flag_store"
                              and s.arg("value").value == value) else s


PLANTED = [
    pytest.param(lambda s: None if isinstance(s, ir.Barrier) and "partial tile is written" in s.comment else s,
                 "before the exchange writes", id="release-before-the-writes"),
    pytest.param(lambda s: None if isinstance(s, ir.AtomCall) and s.atom.name == "flag_wait" else s,
                 "without having acquired", id="read-without-acquire"),
    pytest.param(_flag_store(0), "still set when the launch ends", id="flag-never-reset"),
    pytest.param(lambda s: None if isinstance(s, ir.Barrier) and "past its waits" in s.comment else s,
                 "could spin forever", id="reset-before-the-waits"),
    pytest.param(_flag_store(1), "no earlier block has set", id="flag-never-set"),
]


@pytest.mark.parametrize("fn, words, ws", [pytest.param(*p.values, True, id=p.id) for p in PLANTED] + [
    pytest.param(*PLANTED[0].values, False, id="one-role-release-before-the-writes"),
    pytest.param(*PLANTED[3].values, False, id="one-role-reset-before-the-waits")])
def test_planted_hazard(fn, words, ws):
    prog, feed = _unplanted(ws)
    with pytest.raises(HazardError, match=words):
        interp.run_program(planted(prog, fn), dict(feed))


@functools.lru_cache(maxsize=None)
def _unplanted(ws):
    """The program the hazards are planted in, and its inputs; it runs clean (checked once a
    process for each of the two families: their planted cases share it)."""
    M, N, K = 200, 136, 450
    target = _sms(SM90A, 5)
    sched = fs.MatMul.kernel(M, N, K, a="f16", b="f16", c="f16", acc="f32").schedule(*_sm90_chain(3, ws=ws))
    prog = sched.lower(target)
    rng = np.random.default_rng(0)
    feed = {"A": rng.standard_normal((M, K)), "B": rng.standard_normal((K, N))}
    interp.run_program(prog, dict(feed))            # the unplanted program runs clean
    return prog, feed


def test_compiles_without_spills():
    sched = fs.recipes.gemm(3072, 3072, 3072, "f16", "sm_90a", block_m=128, block_n=256, cluster=1,
                            stream_k_parts=3)
    k = fs.compile(sched, arch="sm_90a")
    assert k.spills == 0
    assert "ld.acquire.gpu.global.b32" in k.source and "st.release.gpu.global.b32" in k.source
