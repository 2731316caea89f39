"""Thread-block clusters on the CPU: ``to_blocks(cluster=2)`` pairs blocks on consecutive M tiles
that share each B tile through TMA multicast (``cluster=4``: quads; ``cluster_along="n"``: N tiles
sharing A).  The interpreter runs both blocks of a cluster
together (their roles as coroutines, shared memory and mbarriers per block, vector clocks
across the cluster) and must match numpy; planted protocol errors must be reported; NVRTC
compiles the kernels without spills; and the schedules the lowering cannot build are refused."""

from __future__ import annotations

import functools

import attrs
import numpy as np
import oracles
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ir, ops
from firesched import simulate as interp
from firesched.cuda import printer as cuda
from firesched.errors import HazardError, ScheduleError
from firesched.hardware.atoms import sm90a
from firesched.hardware.target import SM90A
from firesched.strategies import to_blocks
from firesched.testing.planting import map_leaves

CLUSTER = dict(atoms="sm90a", warp_specialized=True, cluster=2)


def _sms(n):
    return attrs.evolve(SM90A, sm_count=n)


def _ref(A, B, dt, epi=(), extras=()):
    """round(A) @ round(B), then the epilogue, from the formulas written in ``tests/oracles.py``
    (never the ops' own numpy meaning, which the interpreter runs too); ``extras`` in the order
    the bias / residual ops name them."""
    names = [op.name for op in epi if type(op).__name__ in ("Bias", "Residual")]
    return oracles.gemm(A, B, dtype=dt.name, ops=epi, extras=dict(zip(names, extras)))


def _close(C, ref, tol=2e-2):
    return np.abs(C.astype(np.float64) - ref).max() / (np.abs(ref).max() + 1e-6) < tol


CASES = [
    pytest.param(256, 256, 192, dict(block_m=128, block_n=128), id="one-cluster-per-N-tile"),
    pytest.param(200, 136, 200, dict(block_m=64, block_n=128, persistent=True), id="odd-M-tiles-persistent"),
    pytest.param(320, 256, 96, dict(block_m=64, block_n=128, persistent=True, group_m=4), id="grouped"),
    pytest.param(130, 256, 64, dict(block_m=64, block_n=256, layout="RC"), id="B-column-major"),
    pytest.param(260, 128, 80, dict(block_m=128, block_n=128, block_k=32, dtype="bf16", out_dtype="f32"),
                 id="64B-swizzle-bf16-f32"),
    pytest.param(200, 100, 136, dict(block_m=128, block_n=128, layout="RC", persistent=True),
                 id="direct-store"),        # 200-byte rows of C: register stores, no TMA store
    pytest.param(330, 128, 64, dict(block_m=192, block_n=128, persistent=True), id="3-consumer-warpgroups"),
    pytest.param(520, 256, 96, dict(block_m=64, block_n=128, layout="RC", cluster=4), id="quads-along-m"),
    pytest.param(100, 300, 128, dict(block_m=128, block_n=32, cluster=4, cluster_along="n"), id="quads-along-n"),
    pytest.param(130, 200, 96, dict(block_m=64, block_n=64, layout="RC", cluster_along="n", persistent=True),
                 id="pairs-along-n-persistent"),
]


@pytest.mark.parametrize("M, N, K, kw", CASES)
def test_interpreter_matches_numpy(M, N, K, kw):
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", **dict(CLUSTER, stages=2, **kw))
    rng = np.random.default_rng(M + N + K)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    C = fs.interpret(sched, A, B, target=_sms(4))
    assert _close(C, _ref(A, B, fs.dtypes.dtype(kw.get("dtype", "f16"))))


@pytest.mark.parametrize("epi", [pytest.param((ops.bias("bias"), ops.relu()), id="bias-relu"),
                                 pytest.param((ops.residual("residual"),), id="residual")])
def test_epilogues(epi):
    M, N, K = 200, 256, 64
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", **CLUSTER, block_m=64, block_n=128, stages=2,
                            persistent=True, epilogue_ops=epi)
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    extras = [rng.standard_normal((M, N) if e.kind == "matrix" else (N,)) for op in epi for e in op.extras()]
    C = fs.interpret(sched, A, B, *extras, target=_sms(2))
    assert _close(C, _ref(A, B, fs.dtypes.f16, epi, extras))


def test_the_kernel_is_a_cluster_kernel():
    sched = fs.recipes.gemm(4096, 4096, 256, arch="sm_90a", **CLUSTER, block_m=128, block_n=256, persistent=True)
    (k,) = sched.lower(SM90A).kernels
    assert k.cluster == 2 and k.grid[0] == 132          # 66 clusters, one block per SM
    src = cuda.emit(sched.lower(SM90A))
    assert "__cluster_dims__(2, 1, 1) firesched_matmul(" in src
    assert src.count("multicast::cluster") == 2         # two 64-column B boxes of four per block
    assert "mapa.shared::cluster" in src and src.count("barrier.cluster.arrive") == 2
    assert "clusters(2)" in str(sched)


@pytest.mark.parametrize("kw", [
    pytest.param(dict(block_m=128, block_n=256, stages=4, persistent=True), id="128x256-persistent"),
    pytest.param(dict(block_m=128, block_n=256, stages=4, epilogue_ops=(ops.bias("bias"), ops.relu())),
                 id="128x256-bias-relu"),
    pytest.param(dict(block_m=128, block_n=128, stages=5, layout="RC", persistent=True), id="128x128-B-K-major"),
])
def test_compiles_without_spills(kw):
    sched = fs.recipes.gemm(4096, 4096, 4096, arch="sm_90a", **CLUSTER, **kw)
    prog = fs.compile(sched, arch="sm_90a")
    assert prog.spills == 0, prog.resources


# --------------------------------------------------------------------------- planted protocol errors

def _planted(fn, M=256, N=256, K=192):
    prog, feed = _unplanted(M, N, K)
    (k,) = prog.kernels
    bad = attrs.evolve(prog, kernels=(attrs.evolve(k, body=map_leaves(k.body, fn)),))
    return bad, dict(feed)


@functools.lru_cache(maxsize=None)
def _unplanted(M, N, K):
    """The program the hazards are planted in, and its inputs; it runs clean (checked once a
    process: every planted case shares it)."""
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", **CLUSTER, block_m=64, block_n=128, stages=2, persistent=True)
    prog = sched.lower(_sms(2))
    rng = np.random.default_rng(0)
    feed = {"A": rng.standard_normal((M, K)), "B": rng.standard_normal((K, N))}
    interp.run_program(prog, dict(feed))        # the unplanted kernel runs clean
    return prog, feed


def _is(s, atom, **args):
    return isinstance(s, ir.AtomCall) and s.atom is atom and all(
        getattr(s.arg(k), "value", None) == v for k, v in args.items())


def _drop(atom, **args):
    return lambda s: None if _is(s, atom, **args) else s


def _local_empty_count(s):
    # the empty barriers count only this block's consumers: the other block's arrivals overflow
    if _is(s, sm90a.mbarrier_init) and s.arg("bar").buffer.name == "empty":
        return attrs.evolve(s, args=tuple((n, ir.Scalar(v.value // 2) if n == "count" else v) for n, v in s.args))
    return s


def _multicast_to_self(s):
    if _is(s, sm90a.tma_load_2d_multicast):
        rank = fs.ir.expr.mod(ir.bid(0, 4), 2)
        mask = ir.Scalar(fs.ir.expr.binop("<<", 1, rank))
        return attrs.evolve(s, args=tuple((n, mask if n == "mask" else v) for n, v in s.args))
    return s


PLANTED = [
    pytest.param(_drop(sm90a.mbarrier_arrive_cluster, cta=1), "deadlock", id="never-release-the-peer-block"),
    pytest.param(_local_empty_count, "before mbarrier phase completes|arrives on phase|race", id="empty-counts-one-block"),
    pytest.param(_drop(sm90a.barrier_cluster), "mbarrier.init|init is not visible", id="no-cluster-barrier"),
    pytest.param(lambda s: s if not (_is(s, sm90a.barrier_cluster) and "leaves" in s.comment) else None,
                 "remote mbarrier arrival after the target block may have exited", id="no-final-cluster-barrier"),
    pytest.param(_multicast_to_self, "deadlock", id="multicast-to-self-only"),
]


@pytest.mark.parametrize("fn, words", PLANTED)
def test_planted_hazard(fn, words):
    bad, feed = _planted(fn)
    with pytest.raises(HazardError, match=words):
        interp.run_program(bad, feed)


# --------------------------------------------------------------------------- refusals

def test_clusters_need_warp_specialization():
    with pytest.raises(ScheduleError, match="clusters without warp specialization"):
        fs.recipes.gemm(512, 512, 256, arch="sm_90a", atoms="sm90a", warp_specialized=False, cluster=2)


def test_clusters_split_a_single_b_box_by_rows():
    """One 64-column box of a row-major B cannot be split by boxes: each block of the pair
    multicasts half of its k rows instead."""
    sched = fs.recipes.gemm(512, 64, 256, arch="sm_90a", **CLUSTER, block_n=64)
    assert "rows rank * 32" in fs.cuda.emit(sched.lower())
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((512, 256)), rng.standard_normal((256, 64))
    ref = A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)
    C = fs.interpret(sched, A, B).astype(np.float64)
    assert np.abs(C - ref).max() <= 2e-2 * np.abs(ref).max()


def test_clusters_need_rows_for_both_blocks():
    with pytest.raises(ScheduleError, match="cluster of 2 sharing a 8-row tile"):
        fs.recipes.gemm(512, 8, 256, arch="sm_90a", **CLUSTER, block_n=8, layout="RC")


@pytest.mark.parametrize("cluster", [0, 3, 8, True, "2"])
def test_cluster_sizes(cluster):
    with pytest.raises(ScheduleError, match="cluster"):
        fs.MatMul.kernel(512, 256, 64).schedule(fs.strategies.tile(m=64, n=64) >> to_blocks(cluster=cluster))


def test_clusters_along_n_share_a():
    """``cluster_along="n"``: the blocks of a cluster take consecutive N tiles of one M tile and
    multicast A, each block loading 1/C of its rows; B is every block's own."""
    sched = fs.recipes.gemm(128, 1024, 256, arch="sm_90a", **dict(CLUSTER, cluster=4), block_m=128, block_n=64,
                            cluster_along="n")
    src = fs.cuda.emit(sched.lower(SM90A))
    assert "__cluster_dims__(4, 1, 1)" in src and "A rows rank * 32..+32, to every block" in src
    assert "B rows rank" not in src and "B columns (" not in src
    assert "n0 in block(16) persistent clusters(4)" in str(sched)


@pytest.mark.parametrize("kw, words", [
    (dict(cluster=2, cluster_along="k"), "along its m dim .* or its n dim"),
    (dict(cluster=1, cluster_along="n"), "it needs cluster > 1"),
])
def test_cluster_along_errors(kw, words):
    with pytest.raises(ScheduleError, match=words):
        fs.MatMul.kernel(512, 256, 64).schedule(fs.strategies.tile(m=64, n=64) >> to_blocks(**kw))


def test_cluster_along_is_for_a_matmul():
    spec = fs.Reduce.kernel("sum", {"r": 4, "c": 4096}, "c")
    with pytest.raises(ScheduleError, match="cluster_along names a MatMul's clustered dim"):
        spec.schedule(fs.strategies.tile(r=1, c=2048) >> to_blocks(cluster=2, cluster_along="c"))


def test_sm80_recipe_refuses_clusters():
    with pytest.raises(ScheduleError, match="clusters belong to the sm_90a recipe"):
        fs.recipes.gemm(256, 256, 256, arch="sm_90a", atoms="sm80", cluster=2)


def test_sm80_lowering_refuses_a_clustered_schedule():
    """Written by hand with mma.sync atoms, cluster=2 is an error, not a silent no-op."""
    from firesched.hardware import sm80
    from firesched.strategies import done, move_to_regs, move_to_smem, pipeline, tile, to_warps

    spec = fs.MatMul.kernel(256, 256, 256, a="f16", b="f16", c="f16", acc="f32")
    sched = spec.schedule(tile(m=128, n=128) >> to_blocks(cluster=2), tile(k=32), move_to_smem("A"),
                          move_to_smem("B"), pipeline(stages=3), tile(m=64, n=64) >> to_warps(2, 2), tile(k=16),
                          move_to_regs("A"), move_to_regs("B"),
                          tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32))
    with pytest.raises(ScheduleError, match="thread-block clusters need sm_90a"):
        sched.check("sm_80")
    with pytest.raises(ScheduleError, match="clusters without warp specialization"):
        sched.check("sm_90a")


def test_strategy_prints_and_round_trips():
    s = to_blocks(group=8, persistent=True, cluster=2)
    assert repr(s) == "to_blocks(group=8, persistent=True, cluster=2)"
    assert eval(repr(s), {"to_blocks": to_blocks}) == s
    s = to_blocks(cluster=4, cluster_along="n")
    assert repr(s) == "to_blocks(cluster=4, cluster_along='n')"
    assert eval(repr(s), {"to_blocks": to_blocks}) == s
    from firesched.schedule import Loop

    lp = Loop("m0", 4, (("m", 128),), fs.BLOCK, 1, 8, persistent=True, cluster=2)
    assert eval(repr(lp), {"Loop": Loop, "Level": fs.Level}) == lp and "clusters(2)" in str(lp)


# --------------------------------------------------------------------------- random cluster schedules

EPILOGUES = [(), (ops.relu(),), (ops.bias("bias"), ops.relu()), (ops.residual("residual"),)]


@st.composite
def cluster_cases(draw):
    bm = draw(st.sampled_from([64, 128]))
    bn = draw(st.sampled_from([128, 256]))
    bk = draw(st.sampled_from([16, 32, 64]))
    # along m the pair shares B; along n, pairs or quads share A (rows of a 64-row tile in four)
    along = draw(st.sampled_from([None, "n"]))
    return dict(cluster=2 if along is None else draw(st.sampled_from([2, 4])), cluster_along=along,
        M=draw(st.integers(1, 4 * bm)), N=draw(st.integers(1, 2 * bn)), K=draw(st.integers(1, 3 * bk)),
        dtype=draw(st.sampled_from(["f16", "bf16"])), layout=draw(st.sampled_from(["RR", "RC"])),
        block_m=bm, block_n=bn, block_k=bk, stages=draw(st.integers(2, 3)), group_m=draw(st.sampled_from([1, 2, 4])),
        persistent=draw(st.booleans()), epilogue_ops=draw(st.sampled_from(EPILOGUES)),
        sms=draw(st.sampled_from([2, 4])), seed=draw(st.integers(0, 2 ** 16)),
    )


@settings(max_examples=20 if settings().max_examples >= 500 else 5, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cluster_cases())
def test_random_cluster_schedules_match_numpy(case):
    case = dict(case)
    M, N, K, seed, sms = (case.pop(k) for k in ("M", "N", "K", "seed", "sms"))
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", **dict(CLUSTER, **case))
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    epi = case["epilogue_ops"]
    extras = [rng.standard_normal((M, N) if e.kind == "matrix" else (N,)) for op in epi for e in op.extras()]
    C = fs.interpret(sched, A, B, *extras, target=_sms(sms))
    assert _close(C, _ref(A, B, fs.dtypes.dtype(case["dtype"]), epi, extras), tol=3e-2)
