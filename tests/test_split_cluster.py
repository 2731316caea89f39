"""``split_k(parts, across=BLOCK, combine="cluster")``: the K parts of a tile on the blocks of one
thread-block cluster, the lower parts pushing their partial sums into the top part's shared memory
(``st.async`` completing on its mbarrier), which adds them and stores C.  Hand-written chains in
both atom families and the W4A16 recipe against numpy, bitwise against the global-memory fix-up;
the push protocol's planted hazards; the errors; NVRTC."""

from __future__ import annotations

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
from firesched.quant import quantize_int4
from firesched.recipes.w4a16 import W4A16Params, W4A16WgmmaParams, gemm_w4a16
from firesched.schedule import Loop
from firesched.strategies import (
    done,
    move_to_regs,
    move_to_smem,
    pipeline,
    split_k,
    tile,
    to_blocks,
    to_warpgroups,
    to_warps,
    warp_specialize,
)
from firesched.testing.planting import planted
from firesched.testing.reference import w4a16_reference

BLOCK = fs.BLOCK


def _mma_chain(parts, combine="cluster", bm=64, bn=64, bk=32, stages=3, **blocks):
    """The mma.sync family (cp.async ring, no warp specialization), which runs on sm_90a too."""
    return [split_k(parts, across=BLOCK, combine=combine), tile(m=bm, n=bn) >> to_blocks(**blocks), tile(k=bk),
            move_to_smem("A"), move_to_smem("B"), pipeline(stages=stages),
            tile(m=bm // 2, n=bn // 2) >> to_warps(2, 2), move_to_regs("A"), move_to_regs("B"),
            tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32)]


def _wgmma_chain(parts, combine="cluster", bm=128, bn=128, ws=True, stages=3):
    chain = [split_k(parts, across=BLOCK, combine=combine), tile(m=bm, n=bn) >> to_blocks(), tile(k=64),
             move_to_smem("A", via=(sm90a.tma_load_2d,)), move_to_smem("B", via=(sm90a.tma_load_2d,)),
             pipeline(stages=stages)]
    if ws:
        chain.append(warp_specialize(producer_regs=40, consumer_regs=232 if bm <= 128 else 160))
    return chain + [tile(m=64) >> to_warpgroups(),
                    tile(k=16) >> done(sm90a.wgmma_atom(bn, fs.dtypes.f16, b_mn_major=True))]


def _chain(fam, parts, combine="cluster", bm=64):
    if fam == "mma":
        return _mma_chain(parts, combine, bm=bm)
    return _wgmma_chain(parts, combine, bm=max(bm, 64), ws=fam == "wgmma")


def _spec(M, N, K):
    return fs.MatMul.kernel(M, N, K, a="f16", b="f16", c="f16", acc="f32")


def _inputs(M, N, K, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K)), rng.standard_normal((K, N))


def _check(sched, M, N, K, seed=0):
    A, B = _inputs(M, N, K, seed)
    C = fs.interpret(sched, A, B, target=SM90A).astype(np.float64)
    ref = A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)
    assert np.abs(C - ref).max() <= 2e-2 * max(np.abs(ref).max(), 1.0)
    return C


def test_tree_repr_and_one_clustered_launch():
    sched = _spec(256, 256, 1000).schedule(*_mma_chain(4))
    text = str(sched)
    assert "split_k(4, across=block, combine='cluster')" in text and "block(4) clusters(4) fixup" in text
    assert "Reduce" not in text
    s = split_k(3, across=BLOCK, combine="cluster")
    names = {"split_k": split_k, "Level": fs.Level}
    assert eval(repr(s), names) == s and hash(eval(repr(s), names)) == hash(s)
    lp = Loop("kp0", 3, (("k", 320),), BLOCK, cluster=3, fixup=True)
    assert eval(repr(lp), {"Loop": Loop, "Level": fs.Level}) == lp
    prog = sched.lower(SM90A)
    (k,) = prog.kernels
    # 16 tiles of 64 x 64, 4 parts each: one cluster a tile, part = rank; nothing in global memory
    assert k.grid == (64, 1, 1) and k.cluster == 4 and not prog.workspaces
    assert "C_parts" in {b.name for b in k.shared}


@pytest.mark.parametrize("M, N, K, parts, fam", [
    (100, 136, 1000, 3, "mma"), (64, 64, 512, 4, "mma"), (1, 8, 130, 2, "mma"), (33, 72, 4096, 8, "mma"),
    (130, 128, 700, 2, "wgmma"), (70, 136, 450, 3, "wgmma-one-role"), (17, 128, 1500, 5, "wgmma"),
])
def test_against_numpy(M, N, K, parts, fam):
    sched = _spec(M, N, K).schedule(*_chain(fam, parts))
    sched.check(SM90A)
    _check(sched, M, N, K)


@pytest.mark.parametrize("fam", ["mma", "wgmma"])
def test_the_same_bits_as_the_fixup(fam):
    """The cluster adds the parts in the fix-up's order (the top part, then part top-1 down to 0),
    so the two give the same bits."""
    M, N, K, parts = 70, 72, 640, 3
    A, B = _inputs(M, N, K, 3)
    got = {c: fs.interpret(_spec(M, N, K).schedule(*_chain(fam, parts, c)), A, B, target=SM90A)
           for c in ("cluster", "fixup")}
    assert np.array_equal(got["cluster"], got["fixup"])


cases = st.fixed_dictionaries(dict(
    M=st.integers(1, 300), N=st.integers(1, 40).map(lambda n: 8 * n), K=st.integers(1, 1500),
    parts=st.integers(2, 8), family=st.sampled_from(["mma", "wgmma", "wgmma-one-role"]),
    bm=st.sampled_from([64, 128]), seed=st.integers(0, 2 ** 16)))


@settings(max_examples=60 if settings().max_examples >= 500 else 6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_random_chains(case):
    """Hand-written cluster chains over odd sizes: refused at check() with a ScheduleError, or
    hazard-free in the interpreter and equal to numpy."""
    M, N, K, parts, fam, bm = (case[k] for k in ("M", "N", "K", "parts", "family", "bm"))
    try:
        sched = _spec(M, N, K).schedule(*_chain(fam, parts, bm=bm))
        sched.check(SM90A)
    except ScheduleError as e:
        # the refusals: more parts than K has 64-element pieces for, or the pushed tiles beside
        # the ring overflowing shared memory
        assert "parts" in str(e) or "shared memory" in str(e), str(e)
        return
    _check(sched, M, N, K, case["seed"])


@pytest.mark.parametrize("params, M, N, K, gs", [
    (W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=2, split_k=4,
                 cluster_combine=True), 3, 72, 1024, 64),
    (W4A16WgmmaParams(block_m=8, block_n=64, block_k=256, stages=2, split_k=2, producer=True,
                      cluster_combine=True), 5, 100, 1024, 128),
    (W4A16WgmmaParams(block_m=40, block_n=128, block_k=64, stages=3, split_k=4, producer=True,
                      cluster_combine=True), 40, 128, 1024, 32),
], ids=["mma", "wgmma-64", "wgmma-128"])
def test_w4a16_recipe(params, M, N, K, gs):
    sched = gemm_w4a16(M, N, K, group_size=gs, arch="sm_90a", params=params)
    assert "combine='cluster'" in str(sched)
    q, s, _ = quantize_int4(np.random.default_rng(M).standard_normal((K, N)) * 0.1, gs, signed=False,
                            scale_dtype="f16")
    a = np.random.default_rng(K).standard_normal((M, K)).astype(np.float16).astype(np.float32)
    got = fs.interpret(sched, a, q.astype(np.float64), s.astype(np.float32), target="sm_90a")
    want = w4a16_reference(a, q, s, None, gs)
    assert np.abs(got.astype(np.float64) - want).max() <= 1e-2 * (1 + np.abs(want).max())
    k = fs.compile(sched, "sm_90a")
    assert k.spills == 0 and len(k.program.kernels) == 1


def test_w4a16_params_take_one_combine():
    with pytest.raises(ValueError, match="choose one"):
        W4A16WgmmaParams(split_k=2, fixup=True, cluster_combine=True)
    with pytest.raises(ValueError, match="cluster_combine must be True or False"):
        W4A16Params(split_k=2, cluster_combine=1)


# --------------------------------------------------------------------------- planted hazards

def _atom(name):
    return lambda s: isinstance(s, ir.AtomCall) and s.atom.name == name


def _drop(pred):
    return lambda s: None if pred(s) else s


def _expect(nbytes):
    return lambda s: (attrs.evolve(s, args=(("bar", s.arg("bar")), ("bytes", ir.Scalar(nbytes))))
                      if _atom("mbarrier_arrive_expect_tx")(s) and "lower parts" in s.comment else s)


def _last_push(s):
    return _atom("st_async_cluster_4")(s) and s.comment.startswith("partial sum") and \
        s.comment.split()[2] == str(int(s.comment.split()[4]) - 1)


PLANTED = [
    pytest.param(_drop(_atom("mbarrier_try_wait_cluster")), id="read-before-the-wait"),
    pytest.param(_expect(4), id="expect-too-few-bytes"),
    pytest.param(_drop(_last_push), id="one-push-missing"),
]


@pytest.mark.parametrize("ws", [True, False], ids=["specialized", "one-role"])
@pytest.mark.parametrize("fn", [p.values[0] for p in PLANTED], ids=[p.id for p in PLANTED])
def test_planted_hazard(fn, ws):
    M, N, K = 60, 128, 384
    sched = _spec(M, N, K).schedule(*_wgmma_chain(3, bm=64, ws=ws))     # one tile, 2 lower parts
    prog = sched.lower(SM90A)
    A, B = _inputs(M, N, K)
    interp.run_program(prog, {"A": A, "B": B})          # the unplanted program runs clean
    bad = planted(prog, fn)
    assert bad != prog
    with pytest.raises(HazardError):
        interp.run_program(bad, {"A": A, "B": B})


@pytest.mark.parametrize("ws", [True, False], ids=["specialized", "one-role"])
def test_the_cluster_meets_after_the_mbarrier_is_set_up(ws):
    """A push may only target an initialised mbarrier: every block initialises its own, then the
    cluster meets once, before any statement that pushes.  (The interpreter runs a cluster's
    blocks in lockstep, so it cannot see a push overtake another block's initialisation; the
    order is checked here instead.)"""
    from firesched.ir.rewrite import walk

    prog = _spec(100, 128, 450).schedule(*_wgmma_chain(3, bm=64, ws=ws)).lower(SM90A)
    names = [(s.atom.name, s.comment) for s in walk([prog.kernels[-1].body]) if isinstance(s, ir.AtomCall)]
    init = next(i for i, (a, c) in enumerate(names) if a == "mbarrier_arrive_expect_tx" and "lower parts" in c)
    meet = next(i for i, (a, c) in enumerate(names) if a == "barrier_cluster" and "push into the top" in c)
    fence = next(i for i, (a, _) in enumerate(names) if a == "fence_mbarrier_init" and i > init)
    push = next(i for i, (a, _) in enumerate(names) if a == "st_async_cluster_4")
    assert init < fence < meet < push


# --------------------------------------------------------------------------- errors

def test_errors_name_the_field_and_the_fix():
    spec = _spec(256, 256, 4096)
    with pytest.raises(ScheduleError, match="parts") as e:
        spec.schedule(split_k(9, across=BLOCK, combine="cluster"))
    assert "2..8" in str(e.value)
    with pytest.raises(ScheduleError, match="across=Level.BLOCK"):
        spec.schedule(split_k(2, across=fs.WARP, combine="cluster"))
    with pytest.raises(ScheduleError, match="sm_90a"):
        spec.schedule(*_mma_chain(2)).check(SM80)
    with pytest.raises(ScheduleError, match="persistent=True") as e:
        spec.schedule(*_mma_chain(2, persistent=True)).check(SM90A)
    assert "combine='launch'" in str(e.value)
    with pytest.raises(ScheduleError, match="clustered") as e:
        spec.schedule(*_wgmma_chain(2)[:1], tile(m=128, n=128) >> to_blocks(cluster=2),
                      *_wgmma_chain(2)[2:]).check(SM90A)
    assert e.value.field == "cluster"


# --------------------------------------------------------------------------- NVRTC

@pytest.mark.parametrize("fam", ["mma", "wgmma"])
def test_compiles_without_spills(fam):
    k = fs.compile(_spec(1000, 1024, 4096).schedule(*_chain(fam, 4)), arch="sm_90a")
    assert k.spills == 0 and len(k.program.kernels) == 1 and k.program.kernels[0].cluster == 4
    assert "st.async.shared::cluster.mbarrier::complete_tx::bytes" in k.source
    assert "mbarrier.try_wait.parity.acquire.cluster" in k.source and "red.release.gpu" not in k.source
