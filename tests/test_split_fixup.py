"""Split-K added in the launch.  ``split_k(parts, across=BLOCK, combine="fixup")``: the K parts of
a tile on blocks of one launch, the block of the last part adding the others' partial sums (a
workspace slot per block, a counter per tile: ``flag_add`` / ``flag_wait_count``).
``combine="cluster"``: the parts on the blocks of one thread-block cluster, the lower parts
pushing their partial sums into the top part's shared memory (``st.async`` completing on its
mbarrier).  Hand-written chains in both atom families and the W4A16 recipe against numpy, the two
bitwise against each other; each protocol's planted hazards; the errors; NVRTC."""

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
from firesched.quant import quantize_int4
from firesched.recipes.w4a16 import W4A16Params, W4A16WgmmaParams, gemm_w4a16
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
from firesched.testing import assert_schedule_correct
from firesched.testing.planting import planted
from firesched.testing.reference import w4a16_reference

BLOCK = fs.BLOCK


def _sm80_chain(parts, bm=64, bn=64, bk=32, stages=3, combine="fixup", **blocks):
    """The mma.sync family (cp.async ring, no warp specialization); on sm_90a too."""
    return [split_k(parts, across=BLOCK, combine=combine), tile(m=bm, n=bn) >> to_blocks(**blocks), tile(k=bk),
            move_to_smem("A"), move_to_smem("B"), pipeline(stages=stages),
            tile(m=bm // 2, n=bn // 2) >> to_warps(2, 2), move_to_regs("A"), move_to_regs("B"),
            tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32)]


def _sm90_chain(parts, bm=128, bn=128, ws=True, stages=3, combine="fixup", bk=64):
    chain = [split_k(parts, across=BLOCK, combine=combine), tile(m=bm, n=bn) >> to_blocks(), tile(k=bk),
             move_to_smem("A", via=(sm90a.tma_load_2d,)), move_to_smem("B", via=(sm90a.tma_load_2d,)),
             pipeline(stages=stages)]
    if ws:
        chain.append(warp_specialize(producer_regs=40, consumer_regs=232 if bm <= 128 else 160))
    return chain + [tile(m=64) >> to_warpgroups(),
                    tile(k=16) >> done(sm90a.wgmma_atom(bn, fs.dtypes.f16, b_mn_major=True))]


def _chain(fam, parts, combine="fixup", bm=64, bk=None):
    if fam == "sm80":
        return _sm80_chain(parts, bm=bm, combine=combine, **({} if bk is None else {"bk": bk}))
    return _sm90_chain(parts, bm=bm, ws=fam == "sm90a", combine=combine, bk=bk or 64)


def _inputs(M, N, K, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K)), rng.standard_normal((K, N))


def _check(sched, M, N, K, target, seed=0):
    A, B = _inputs(M, N, K, seed)
    C = fs.interpret(sched, A, B, target=target).astype(np.float64)
    ref = A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)
    assert np.abs(C - ref).max() <= 2e-2 * max(np.abs(ref).max(), 1.0)


def _spec(M, N, K):
    return fs.MatMul.kernel(M, N, K, a="f16", b="f16", c="f16", acc="f32")


def test_tree_repr_and_one_launch():
    sched = _spec(256, 256, 1000).schedule(*_sm80_chain(4))
    text = str(sched)
    assert "split_k(4, across=block, combine='fixup')" in text and "block(4) fixup" in text
    assert "Reduce" not in text                     # no second launch's reduction in the tree
    s = split_k(3, across=BLOCK, combine="fixup")
    assert eval(repr(s), {"split_k": split_k, "Level": fs.Level}) == s and hash(s) == hash(eval(repr(s), {
        "split_k": split_k, "Level": fs.Level}))
    lp = Loop("kp0", 3, (("k", 256),), BLOCK, fixup=True)
    assert eval(repr(lp), {"Loop": Loop, "Level": fs.Level}) == lp
    prog = sched.lower(SM80)
    assert [k.name for k in prog.kernels] == ["firesched_matmul"]
    assert {w.name for w in prog.workspaces} == {"C_partials", "C_flags"}
    # one counter a tile (16 tiles of 64 x 64), one slot of partial sums a block (4 parts a tile)
    flags = next(w for w in prog.workspaces if w.name == "C_flags")
    parts = next(w for w in prog.workspaces if w.name == "C_partials")
    assert flags.shape == (16,) and parts.shape[0] == 64 and flags.zeroed


@pytest.mark.parametrize("M, N, K, parts, fam", [
    (100, 136, 1000, 3, "sm80"), (64, 64, 512, 4, "sm80"), (1, 8, 130, 2, "sm80"),
    (130, 128, 700, 2, "sm90a"), (200, 136, 450, 3, "sm90a-one-role"), (17, 256, 2048, 8, "sm90a"),
])
def test_against_numpy(M, N, K, parts, fam):
    chain = _sm80_chain(parts) if fam == "sm80" else _sm90_chain(parts, ws=fam == "sm90a")
    target = SM80 if fam == "sm80" else SM90A
    sched = _spec(M, N, K).schedule(*chain)
    sched.check(target)
    _check(sched, M, N, K, target)


def test_grouped_block_order():
    """The fix-up's tile index follows the grouped walk: the slots stay one per block."""
    M, N, K = 200, 136, 300
    sched = _spec(M, N, K).schedule(*_sm80_chain(3, group=2))
    _check(sched, M, N, K, SM80)


cases = st.fixed_dictionaries(dict(
    M=st.integers(1, 200), N=st.integers(1, 24).map(lambda n: 8 * n), K=st.integers(1, 1200),
    parts=st.integers(2, 8), family=st.sampled_from(["sm80", "sm90a", "sm90a-one-role"]),
    combine=st.sampled_from(["fixup", "cluster", "launch"]), bm=st.sampled_from([64, 128]),
    bk=st.sampled_from([32, 64, 128]), seed=st.integers(0, 2 ** 16)))


@settings(max_examples=60 if settings().max_examples >= 500 else 6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_random_chains(case):
    """Hand-written fix-up and cluster chains over odd sizes: refused at check() with a
    ScheduleError, or hazard-free in the interpreter and equal to numpy."""
    M, N, K, parts, fam, bm, combine, bk = (case[k] for k in ("M", "N", "K", "parts", "family", "bm", "combine",
                                                              "bk"))
    # the mma.sync family runs on sm_90a too, where clusters are
    target = SM80 if fam == "sm80" and combine != "cluster" else SM90A
    try:
        sched = _spec(M, N, K).schedule(*_chain(fam, parts, combine, bm, bk))
        sched.check(target)
    except ScheduleError as e:
        # the refusals: more parts than K has 64-element pieces for, a cluster's pushed tiles
        # beside the ring overflowing shared memory, a K tile of 128 over a 128-row tile past the
        # register budget, or a TMA box reaching into the next part
        assert any(w in str(e) for w in ("parts", "shared memory", "registers", "another block's part")), str(e)
        return
    _check(sched, M, N, K, target, case["seed"])


@pytest.mark.parametrize("combine", ["launch", "fixup", "cluster"])
def test_tma_tiles_do_not_reach_into_the_next_part(combine):
    """K = 1344 in 3 parts of 448 with K tiles of 128: a part's last TMA box (384..511) would read
    the next part's elements (TMA zero-fills only past the tensor's end), so check() refuses it;
    K tiles of 64 divide the parts, and cp.async copies predicate at the part's end."""
    M, N, K = 128, 128, 1344
    spec = _spec(M, N, K)
    bm = 64 if combine == "cluster" else 128          # a cluster's pushed tiles take shared memory too
    with pytest.raises(ScheduleError, match="another block's part") as e:
        spec.schedule(*_sm90_chain(3, bm=bm, combine=combine, bk=128)).check(SM90A)
    assert e.value.field == "via" and "whole K tiles" in e.value.fix
    _check(spec.schedule(*_sm90_chain(3, bm=bm, combine=combine, bk=64)).check(SM90A), M, N, K, SM90A)
    if combine != "cluster":
        _check(spec.schedule(*_sm80_chain(3, combine=combine, bk=128)).check(SM80), M, N, K, SM80)
    # the last part may end inside a tile: past the tensor's end TMA fills zeros
    _check(_spec(M, N, 1000).schedule(*_sm90_chain(2, bm=bm, combine=combine, bk=128)).check(SM90A), M, N, 1000, SM90A)


def test_w4a16_producer_parts_are_whole_k_tiles():
    """The same for the W4A16 codes: 512 k tiles over parts of 256 are refused, parts of 1024 run."""
    p = W4A16WgmmaParams(block_m=16, block_n=64, block_k=512, stages=2, split_k=2, producer=True)
    with pytest.raises(ScheduleError, match="another block's part"):
        gemm_w4a16(1, 200, 512, group_size=128, arch="sm_90a", params=p)
    sched = gemm_w4a16(1, 200, 2048, group_size=128, arch="sm_90a", params=p)
    q, s, _ = quantize_int4(np.random.default_rng(0).standard_normal((2048, 200)) * 0.1, 128, signed=False,
                            scale_dtype="f16")
    a = np.random.default_rng(1).standard_normal((1, 2048)).astype(np.float16).astype(np.float32)
    got = fs.interpret(sched, a, q.astype(np.float64), s.astype(np.float32), target="sm_90a")
    want = w4a16_reference(a, q, s, None, 128)
    assert np.abs(got.astype(np.float64) - want).max() <= 1e-2 * (1 + np.abs(want).max())


@pytest.mark.parametrize("params, arch, M, N, K, gs", [
    (W4A16Params(block_m=16, block_n=64, block_k=64, warps_n=4, warp_k=32, stages=3, split_k=3, fixup=True),
     "sm_80", 5, 72, 512, 32),
    (W4A16WgmmaParams(block_m=16, block_n=64, block_k=128, stages=2, split_k=2, fixup=True), "sm_90a", 9, 100, 1024,
     128),
    (W4A16WgmmaParams(block_m=40, block_n=128, block_k=64, stages=3, split_k=4, fixup=True, producer=True),
     "sm_90a", 40, 128, 1024, 64),
])
def test_w4a16_recipe(params, arch, M, N, K, gs):
    sched = gemm_w4a16(M, N, K, group_size=gs, arch=arch, params=params)
    assert "combine='fixup'" in str(sched)
    assert_schedule_correct(sched, examples=1, arch=arch)


# --------------------------------------------------------------------------- planted hazards

def _atom(name):
    return lambda s: isinstance(s, ir.AtomCall) and s.atom.name == name


def _drop(pred):
    return lambda s: None if pred(s) else s


def _barrier(words):
    return lambda s: isinstance(s, ir.Barrier) and words in s.comment


def _wait_for(count):
    return lambda s: (attrs.evolve(s, args=(("flag", s.arg("flag")), ("value", ir.Scalar(count))))
                      if _atom("flag_wait_count")(s) else s)


PLANTED = [
    pytest.param(_drop(_barrier("partial tile is written")), "before the exchange writes", id="release-before-writes"),
    pytest.param(_drop(_atom("flag_wait_count")), "without having acquired", id="read-without-acquire"),
    pytest.param(_wait_for(1), "without having acquired", id="wait-for-too-few"),
    pytest.param(_wait_for(3), "no earlier block has brought", id="wait-for-too-many"),
    pytest.param(_drop(_atom("flag_store")), "still set when the launch ends", id="counter-never-reset"),
    pytest.param(_drop(_barrier("past its wait")), "could spin forever", id="reset-before-the-waits"),
    pytest.param(_drop(_atom("flag_add")), "no earlier block has brought", id="never-released"),
]


def _planted_case(combine, fn, words, ws):
    """One tile of 100 x 128 (fix-up) or 60 x 128 (cluster: 64-row tiles, whose pushed partial
    sums fit beside the ring), K in three parts; the unplanted program runs clean, the planted
    one raises."""
    prog, (A, B) = _unplanted(combine, ws)
    bad = planted(prog, fn)
    assert bad != prog
    with pytest.raises(HazardError, match=words):
        interp.run_program(bad, {"A": A, "B": B})


@functools.lru_cache(maxsize=None)
def _unplanted(combine, ws):
    """The program of ``_planted_case`` and its inputs; it runs clean (checked once a process for
    each combine and family: their planted cases share it)."""
    M, N, K = (100, 128, 450) if combine == "fixup" else (60, 128, 384)
    sched = _spec(M, N, K).schedule(*_sm90_chain(3, bm=128 if combine == "fixup" else 64, ws=ws, combine=combine))
    prog = sched.lower(SM90A)
    A, B = _inputs(M, N, K)
    interp.run_program(prog, {"A": A, "B": B})
    return prog, (A, B)


@pytest.mark.parametrize("ws", [True, False], ids=["specialized", "one-role"])
@pytest.mark.parametrize("fn, words", [p.values for p in PLANTED], ids=[p.id for p in PLANTED])
def test_planted_hazard(fn, words, ws):
    _planted_case("fixup", fn, words, ws)


# --------------------------------------------------------------------------- errors

def test_errors_name_the_field_and_the_fix():
    spec = _spec(256, 256, 1024)
    with pytest.raises(ScheduleError, match="combine") as e:
        spec.schedule(split_k(2, across=BLOCK, combine="atomic"))
    assert "'launch', 'fixup'" in str(e.value)
    with pytest.raises(ScheduleError, match="across=Level.BLOCK"):
        spec.schedule(split_k(2, across=fs.WARP, combine="fixup"))
    for blocks, what in ((dict(persistent=True), "persistent=True"), (dict(reverse=True), "reverse=True")):
        sched = spec.schedule(*_sm80_chain(2, **blocks))
        with pytest.raises(ScheduleError, match=what) as e:
            sched.check(SM80)
        assert "combine='launch'" in str(e.value)


def test_not_with_stream_k():
    spec = _spec(256, 256, 1024)
    chain = _sm80_chain(2)
    sched = spec.schedule(chain[0], stream_k(2), *chain[1:])
    with pytest.raises(ScheduleError, match="stream_k"):
        sched.check(SM80)


# --------------------------------------------------------------------------- NVRTC

@pytest.mark.parametrize("fam", ["sm80", "sm90a"])
def test_compiles_without_spills(fam):
    chain = _sm80_chain(4) if fam == "sm80" else _sm90_chain(3)
    arch = "sm_80" if fam == "sm80" else "sm_90a"
    k = fs.compile(_spec(1000, 1024, 4096).schedule(*chain), arch=arch)
    assert k.spills == 0
    assert "red.release.gpu.global.add.u32" in k.source and "ld.acquire.gpu.global.b32" in k.source
    assert len(k.program.kernels) == 1


# --------------------------------------------------------------------------- the GEMM recipe

@pytest.mark.parametrize("kw", [
    dict(arch="sm_80", atoms="sm80"),
    dict(arch="sm_90a", block_m=64, block_n=64),
    dict(arch="sm_90a", swap_ab=True, block_m=8, block_n=64, layout="RC"),
    dict(arch="sm_90a", swap_ab=True, block_m=8, block_n=128, layout="RR"),
], ids=["sm80", "sm90a", "swapped-rc", "swapped-rr"])
def test_gemm_recipe(kw):
    """``recipes.gemm(..., split_k_blocks=p, split_k_fixup=True)``: one launch, a swapped
    schedule too (whose parts a second launch could not add), a GemmParams point as well."""
    M, N, K = 5 if kw.get("swap_ab") else 100, 136, 1000
    sched = fs.recipes.gemm(M, N, K, "f16", split_k_blocks=3, split_k_fixup=True, **kw)
    assert "combine='fixup'" in str(sched) and "persistent" not in str(sched)
    assert [k.name for k in sched.lower(kw["arch"]).kernels if "reduce" in k.name] == []
    assert_schedule_correct(sched, examples=1, arch=kw["arch"])
    fields = {k: v for k, v in kw.items() if k not in ("arch", "layout")}
    fields.setdefault("atoms", "sm90a")
    p = fs.recipes.GemmParams(**fields, split_k_blocks=3, split_k_fixup=True)
    assert p["split_k_fixup"] is True
    again = fs.recipes.gemm(M, N, K, "f16", kw["arch"], params=p, layout=kw.get("layout", "RR"))
    assert str(again) == str(sched)


def test_gemm_recipe_errors():
    with pytest.raises(ScheduleError, match="split_k_fixup is a bool"):
        fs.recipes.gemm(100, 136, 1000, "f16", "sm_90a", split_k_blocks=2, split_k_fixup="yes")
    with pytest.raises(ScheduleError, match="split_k_fixup=True") as e:
        fs.recipes.gemm(5, 136, 1000, "f16", "sm_90a", swap_ab=True, split_k_blocks=2)
    assert e.value.field == "split_k_blocks"


# --------------------------------------------------------------------------- combine="cluster"

def test_tree_repr_and_one_clustered_launch():
    sched = _spec(256, 256, 1000).schedule(*_sm80_chain(4, combine="cluster"))
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
    (64, 136, 1000, 3, "sm80"), (1, 8, 130, 2, "sm80"), (33, 72, 1024, 8, "sm80"),
    (130, 128, 700, 2, "sm90a"), (70, 136, 450, 3, "sm90a-one-role"),
])
def test_cluster_against_numpy(M, N, K, parts, fam):
    sched = _spec(M, N, K).schedule(*_chain(fam, parts, "cluster"))
    sched.check(SM90A)
    _check(sched, M, N, K, SM90A)


@pytest.mark.parametrize("fam", ["sm80", "sm90a"])
def test_the_same_bits_as_the_fixup(fam):
    """The cluster adds the parts in the fix-up's order (the top part, then part top-1 down to 0),
    so the two give the same bits."""
    M, N, K, parts = 70, 72, 640, 3
    A, B = _inputs(M, N, K, 3)
    got = {c: fs.interpret(_spec(M, N, K).schedule(*_chain(fam, parts, c)), A, B, target=SM90A)
           for c in ("cluster", "fixup")}
    assert np.array_equal(got["cluster"], got["fixup"])


@pytest.mark.parametrize("params, M, N, K, gs", [
    (W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=2, split_k=4,
                 cluster_combine=True), 3, 72, 1024, 64),
    (W4A16WgmmaParams(block_m=8, block_n=64, block_k=256, stages=2, split_k=2, producer=True,
                      cluster_combine=True), 5, 100, 1024, 128),
    (W4A16WgmmaParams(block_m=40, block_n=128, block_k=64, stages=3, split_k=4, producer=True,
                      cluster_combine=True), 40, 128, 1024, 32),
], ids=["sm80", "sm90a-64", "sm90a-128"])
def test_cluster_w4a16_recipe(params, M, N, K, gs):
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


def _expect(nbytes):
    return lambda s: (attrs.evolve(s, args=(("bar", s.arg("bar")), ("bytes", ir.Scalar(nbytes))))
                      if _atom("mbarrier_arrive_expect_tx")(s) and "lower parts" in s.comment else s)


def _last_push(s):
    return _atom("st_async_cluster_4")(s) and s.comment.startswith("partial sum") and \
        s.comment.split()[2] == str(int(s.comment.split()[4]) - 1)


CLUSTER_PLANTED = [
    pytest.param(_drop(_atom("mbarrier_try_wait_cluster")), id="read-before-the-wait"),
    pytest.param(_expect(4), id="expect-too-few-bytes"),
    pytest.param(_drop(_last_push), id="one-push-missing"),
]


@pytest.mark.parametrize("fn", [p.values[0] for p in CLUSTER_PLANTED], ids=[p.id for p in CLUSTER_PLANTED])
def test_cluster_planted_hazard(fn):
    """In the warp-specialized kernel (the one-role kernel's exchange is the same statements; where
    its setup sits is checked by ``test_the_cluster_meets_after_the_mbarrier_is_set_up``)."""
    _planted_case("cluster", fn, "", True)


@pytest.mark.parametrize("ws", [True, False], ids=["specialized", "one-role"])
def test_the_cluster_meets_after_the_mbarrier_is_set_up(ws):
    """A push may only target an initialised mbarrier: every block initialises its own, then the
    cluster meets once, before any statement that pushes.  (The interpreter runs a cluster's
    blocks in lockstep, so it cannot see a push overtake another block's initialisation; the
    order is checked here instead.)"""
    from firesched.ir.rewrite import walk

    prog = _spec(100, 128, 450).schedule(*_sm90_chain(3, bm=64, ws=ws, combine="cluster")).lower(SM90A)
    names = [(s.atom.name, s.comment) for s in walk([prog.kernels[-1].body]) if isinstance(s, ir.AtomCall)]
    init = next(i for i, (a, c) in enumerate(names) if a == "mbarrier_arrive_expect_tx" and "lower parts" in c)
    meet = next(i for i, (a, c) in enumerate(names) if a == "barrier_cluster" and "push into the top" in c)
    fence = next(i for i, (a, _) in enumerate(names) if a == "fence_mbarrier_init" and i > init)
    push = next(i for i, (a, _) in enumerate(names) if a == "st_async_cluster_4")
    assert init < fence < meet < push


def test_cluster_errors_name_the_field_and_the_fix():
    spec = _spec(256, 256, 4096)
    with pytest.raises(ScheduleError, match="parts") as e:
        spec.schedule(split_k(9, across=BLOCK, combine="cluster"))
    assert "2..8" in str(e.value)
    with pytest.raises(ScheduleError, match="across=Level.BLOCK"):
        spec.schedule(split_k(2, across=fs.WARP, combine="cluster"))
    with pytest.raises(ScheduleError, match="sm_90a") as e:
        spec.schedule(*_sm80_chain(2, combine="cluster")).check(SM80)
    assert "combine='fixup'" in str(e.value)
    chain = _sm80_chain(2, combine="cluster")
    with pytest.raises(ScheduleError, match="another split of K") as e:
        spec.schedule(chain[0], stream_k(2), *chain[1:]).check(SM90A)
    assert e.value.field == "combine"
    with pytest.raises(ScheduleError, match="persistent=True") as e:
        spec.schedule(*_sm80_chain(2, combine="cluster", persistent=True)).check(SM90A)
    assert "combine='launch'" in str(e.value)
    with pytest.raises(ScheduleError, match="clustered") as e:
        spec.schedule(*_sm90_chain(2, combine="cluster")[:1], tile(m=128, n=128) >> to_blocks(cluster=2),
                      *_sm90_chain(2, combine="cluster")[2:]).check(SM90A)
    assert e.value.field == "cluster"


@pytest.mark.parametrize("fam", ["sm80", "sm90a"])
def test_cluster_compiles_without_spills(fam):
    k = fs.compile(_spec(1000, 1024, 4096).schedule(*_chain(fam, 4, "cluster")), arch="sm_90a")
    assert k.spills == 0 and len(k.program.kernels) == 1 and k.program.kernels[0].cluster == 4
    assert "st.async.shared::cluster.mbarrier::complete_tx::bytes" in k.source
    assert "mbarrier.try_wait.parity.acquire.cluster" in k.source and "red.release.gpu" not in k.source
