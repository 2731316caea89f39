"""The warp-specialized Hopper GEMM on the CPU: a producer warpgroup issuing TMA into an
mbarrier ring, consumer warpgroups issuing wgmma, the persistent tile scheduler and the
TMA-store epilogue — the interpreter (roles as coroutines) against numpy, NVRTC without spills,
planted hazards, and the schedules it refuses."""

from __future__ import annotations

import functools

import attrs
import numpy as np
import oracles
import pytest

import firesched as fs
from firesched import ir, ops
from firesched import simulate as interp
from firesched.cuda import printer as cuda
from firesched.errors import HazardError, ScheduleError
from firesched.hardware.atoms import sm90a
from firesched.hardware.target import SM90A
from firesched.strategies import pipeline, tile, to_blocks, warp_specialize
from firesched.testing.planting import map_leaves

#: a Hopper with two SMs, so that small problems give each persistent block several tiles
TWO_SMS = attrs.evolve(SM90A, sm_count=2)

WS = dict(atoms="sm90a", warp_specialized=True)
PERSISTENT = dict(WS, persistent=True)


def _ref(A, B, dt, epi=(), extras=()):
    """round(A) @ round(B), then the epilogue, from the formulas written in ``tests/oracles.py``
    (never the ops' own numpy meaning, which the interpreter runs too); ``extras`` in the order
    the bias / residual ops name them."""
    names = [op.name for op in epi if type(op).__name__ in ("Bias", "Residual")]
    return oracles.gemm(A, B, dtype=dt.name, ops=epi, extras=dict(zip(names, extras)))


def _close(C, ref, tol=2e-2):
    return np.abs(C.astype(np.float64) - ref).max() / (np.abs(ref).max() + 1e-6) < tol


CASES = [
    pytest.param(200, 136, 304, dict(WS, block_m=128, block_n=64), id="ws-partial-tiles"),
    pytest.param(200, 136, 304, dict(WS, block_m=128, block_n=64, layout="RC"), id="ws-B-column-major"),
    pytest.param(256, 512, 192, dict(WS, block_m=128, block_n=256, stages=3), id="ws-128x256"),
    pytest.param(64, 64, 64, dict(WS, block_m=64, block_n=64, stages=2), id="ws-one-tile"),
    pytest.param(300, 136, 200, dict(PERSISTENT, block_m=128, block_n=64, stages=3), id="persistent"),
    pytest.param(520, 264, 136, dict(PERSISTENT, block_m=128, block_n=64, group_m=2), id="persistent-grouped"),
    pytest.param(330, 200, 96, dict(PERSISTENT, block_m=192, block_n=64, dtype="bf16"), id="persistent-3-consumers"),
    pytest.param(200, 100, 136, dict(PERSISTENT, block_m=128, block_n=64, layout="RC"),
                 id="persistent-direct-store"),   # 200-byte rows of C: no TMA store, direct stores
    pytest.param(136, 96, 1000, dict(PERSISTENT, block_m=128, block_n=64, out_dtype="f32"), id="long-K-f32-out"),
]


@pytest.mark.parametrize("M, N, K, kw", CASES)
def test_interpreter_matches_numpy(M, N, K, kw):
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", **kw)
    rng = np.random.default_rng(M + N + K)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    C = fs.interpret(sched, A, B, target=TWO_SMS)
    assert _close(C, _ref(A, B, fs.dtypes.dtype(kw.get("dtype", "f16"))))


@pytest.mark.parametrize("name", sorted(fs.recipes.EPILOGUES))
def test_epilogues(name):
    epi = fs.recipes.EPILOGUES[name]
    M, N, K = 200, 192, 128
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", block_m=128, block_n=64, epilogue_ops=epi, **PERSISTENT)
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    extras = [rng.standard_normal((M, N) if e.kind == "matrix" else (N,)) for op in epi for e in op.extras()]
    C = fs.interpret(sched, A, B, *extras, target=TWO_SMS)
    assert _close(C, _ref(A, B, fs.dtypes.f16, epi, extras))


def test_persistent_blocks_walk_every_tile_once():
    """Grid = SMs; tile t goes to block t % grid; every tile of C is written exactly by its block."""
    sched = fs.recipes.gemm(520, 320, 64, arch="sm_90a", block_m=128, block_n=64, group_m=2, **PERSISTENT)
    prog = sched.lower(TWO_SMS)
    (k,) = prog.kernels
    assert k.grid == (2, 1, 1)
    A = np.zeros((520, 64))
    B = np.zeros((64, 320))
    A[:, 0] = np.arange(520)
    B[0, :] = 1
    C = fs.interpret(sched, A, B, target=TWO_SMS)
    assert np.array_equal(C, np.repeat(np.arange(520.0)[:, None], 320, axis=1))


@pytest.mark.parametrize("kw", [
    pytest.param(dict(block_m=128, block_n=256, stages=4), id="128x256-s4"),
    pytest.param(dict(block_m=128, block_n=256, stages=3, epilogue_ops=(ops.bias("bias"), ops.relu())),
                 id="128x256-s3-bias-relu"),
    pytest.param(dict(block_m=128, block_n=128, stages=5, dtype="bf16", out_dtype="f32"), id="128x128-bf16-f32"),
    pytest.param(dict(block_m=192, block_n=128, stages=4), id="192x128"),
])
def test_compiles_without_spills(kw):
    sched = fs.recipes.gemm(4096, 4096, 4096, arch="sm_90a", **PERSISTENT, **kw)
    k = fs.compile(sched, arch="sm_90a")
    assert k.spills == 0
    src = k.source
    assert "setmaxnreg.dec.sync.aligned.u32 40" in src and "setmaxnreg.inc" in src
    assert "role producer" in src and "role consumers" in src
    assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in src      # the TMA store
    assert k.program.kernels[0].grid == (132, 1, 1)


def test_one_block_per_sm():
    """Small tiles still claim more than half an SM's shared memory (the setmaxnreg budget)."""
    sched = fs.recipes.gemm(256, 256, 256, arch="sm_90a", block_m=64, block_n=64, stages=2, **WS)
    (k,) = sched.lower("sm_90a").kernels
    assert k.shared_bytes > SM90A.smem_per_sm // 2
    assert any(b.name == "one_block_per_sm" for b in k.shared)


# --------------------------------------------------------------------------- planted hazards

def _planted(fn, M=256, N=128, K=256, **kw):
    prog, feed = _unplanted(M, N, K, tuple(sorted(kw.items())))
    (k,) = prog.kernels
    bad = attrs.evolve(prog, kernels=(attrs.evolve(k, body=map_leaves(k.body, fn)),))
    return bad, dict(feed)


@functools.lru_cache(maxsize=None)
def _unplanted(M, N, K, kw):
    """The program the hazards are planted in, and its inputs; it runs clean (checked once a
    process: every planted case of one shape shares it)."""
    kw = dict(dict(block_m=128, block_n=64, stages=2), **dict(kw))
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", **PERSISTENT, **kw)
    prog = sched.lower(TWO_SMS)
    rng = np.random.default_rng(0)
    feed = {"A": rng.standard_normal((M, K)), "B": rng.standard_normal((K, N))}
    interp.run_program(prog, dict(feed))        # the unplanted kernel runs clean
    return prog, feed


def _drop_atom(name, n=None):
    def fn(s):
        if isinstance(s, ir.AtomCall) and s.atom.name == name:
            if n is None or fs.hardware.atoms.catalog.immediates_of(s.atom).get("n") == n:
                return None
        return s
    return fn


def _flip_parity(bar_name):
    def fn(s):
        if (isinstance(s, ir.AtomCall) and s.atom.name == sm90a.mbarrier_try_wait.name
                and s.arg("bar").buffer.name == bar_name):
            args = tuple((n, ir.Scalar(1 - v.value) if n == "parity" else v) for n, v in s.args)
            return attrs.evolve(s, args=args)
        return s
    return fn


PLANTED = [
    pytest.param(_drop_atom(sm90a.wgmma_wait.name, n=1), "in-flight async operation|wgmma",
                 id="release-before-wgmma-retires"),
    pytest.param(_drop_atom(sm90a.wgmma_wait.name, n=0), "wait_group|in flight", id="missing-final-wait"),
    pytest.param(_flip_parity("full"), "before mbarrier phase completes|parity", id="consumer-wrong-parity"),
    pytest.param(_flip_parity("empty"), "deadlock|parity|race", id="producer-wrong-parity"),
    pytest.param(_drop_atom(sm90a.mbarrier_arrive.name), "deadlock", id="consumers-never-release"),
    pytest.param(_drop_atom(sm90a.fence_proxy_async.name), "fence.proxy.async", id="missing-proxy-fence"),
    pytest.param(lambda s: None if isinstance(s, ir.Barrier) and s.threads and "is in C_smem" in s.comment else s,
                 "race", id="missing-epilogue-barrier"),
    pytest.param(_drop_atom(sm90a.tma_wait_read.name), "in-flight async|TMA store", id="missing-store-wait"),
]


@pytest.mark.parametrize("fn, words", PLANTED)
def test_planted_hazard(fn, words):
    bad, feed = _planted(fn, N=256)         # 4 tiles per block: the staging buffers are reused
    with pytest.raises(HazardError, match=words):
        interp.run_program(bad, feed)


def test_block_barrier_inside_a_role():
    def fn(s):
        if isinstance(s, ir.Barrier) and s.threads:
            return ir.Barrier("block-wide by mistake")
        return s

    bad, feed = _planted(fn)
    with pytest.raises(HazardError, match="divergent code.*named barrier"):
        interp.run_program(bad, feed)


def test_overlapping_roles():
    t = ir.tid(256)
    body = ir.Roles((ir.Role("a", 0, 160, ir.Seq(())), ir.Role("b", 128, 128, ir.Seq(()))))
    k = ir.Kernel("overlap", (), (1, 1, 1), 256, (), (), ir.Seq((ir.Comment(str(t)), body)))
    with pytest.raises(HazardError, match="overlaps"):
        interp.run_kernel(k, {})


def test_printer_branches_on_roles():
    sched = fs.recipes.gemm(256, 128, 256, arch="sm_90a", block_m=128, block_n=64, **PERSISTENT)
    src = cuda.emit(sched.lower("sm_90a"))
    assert "if (tid < 128) {  // role producer" in src
    assert "} else if (tid >= 128 && tid < 384) {  // role consumers" in src
    assert "const int rtid = tid - 128;" in src
    # one named barrier per consumer warpgroup: id 1 + warpgroup, 128 threads
    assert 'asm volatile("bar.sync %0, %1;"' in src and '"r"(rtid / 128 + 1), "n"(128)' in src


# --------------------------------------------------------------------------- refusals

def test_warp_specialize_needs_a_pipeline():
    spec = fs.MatMul.kernel(256, 256, 256, a="f16", b="f16", c="f16", acc="f32")
    with pytest.raises(ScheduleError, match="no pipelined K loop"):
        spec.schedule(tile(m=128, n=128) >> to_blocks(), tile(k=64), warp_specialize())


def test_warp_specialize_needs_tma():
    spec = fs.MatMul.kernel(256, 256, 256, a="f16", b="f16", c="f16", acc="f32")
    with pytest.raises(ScheduleError, match="TMA"):
        spec.schedule(tile(m=128, n=128) >> to_blocks(), tile(k=64), fs.strategies.move_to_smem("A"),
                      fs.strategies.move_to_smem("B"), pipeline(stages=3), warp_specialize())


@pytest.mark.parametrize("kw", [dict(producer_regs=20), dict(consumer_regs=250), dict(producer_regs=241),
                                dict(producer_regs=True), dict(producer_regs=64, consumer_regs=56)])
def test_warp_specialize_register_counts(kw):
    with pytest.raises(ScheduleError, match="regs"):
        fs.recipes.gemm(256, 256, 256, arch="sm_90a", block_m=128, block_n=128, **WS, **kw)


def test_persistent_without_warp_specialization():
    """One role walking the tiles: the ring's iterations go on across tiles (stages and parities),
    and a barrier at each tile's start keeps the next prologue off stages still being read."""
    M, N, K = 384, 320, 200
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", atoms="sm90a", block_m=128, block_n=64, persistent=True,
                            warp_specialized=False, stages=3)
    assert sched.lower(TWO_SMS).kernels[-1].grid == (2, 1, 1)
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    ref = A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)
    C = fs.interpret(sched, A, B, target=TWO_SMS).astype(np.float64)
    assert np.abs(C - ref).max() <= 2e-2 * np.abs(ref).max()


def test_only_blocks_are_persistent():
    spec = fs.MatMul.kernel(256, 256, 256, a="f16", b="f16", c="f16", acc="f32")
    with pytest.raises(ScheduleError, match="only blocks can be persistent"):
        spec.schedule(tile(m=128, n=128) >> to_blocks(), tile(m=64, n=64) >> fs.strategies.to(fs.WARP, persistent=True))


def test_four_consumer_warpgroups_run_within_the_launch_registers():
    """256-row blocks: four consumer warpgroups at 104 registers (640 threads launched with 96),
    interpreted against numpy on partial tiles; a 64 x 256 accumulator per warpgroup does not fit."""
    M, N, K = 300, 200, 136
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", block_m=256, block_n=128, **WS)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = fs.interpret(sched, a, b)
    np.testing.assert_allclose(c.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), atol=0.05, rtol=0.01)
    with pytest.raises(ScheduleError, match="block_n"):
        fs.recipes.gemm(512, 256, 256, arch="sm_90a", block_m=256, block_n=256, **WS)


def test_accumulators_that_do_not_fit_the_launch_are_refused():
    # 3 consumer warpgroups + the producer: 512 threads, so ptxas compiles to 128 registers a
    # thread, and a 64x256 f32 tile per warpgroup is 128 accumulators alone (ptxas: "Insufficient
    # registers (128) ... register target of 154"); 192 columns fit (and compile without spills)
    with pytest.raises(ScheduleError, match="128 f32 accumulators") as e:
        fs.recipes.gemm(4096, 4096, 4096, arch="sm_90a", block_m=192, block_n=256, **WS)
    assert "block_n = 256" in str(e.value) and "<= 192 with 3 consumer warpgroups" in str(e.value)
    fs.recipes.gemm(4096, 4096, 4096, arch="sm_90a", block_m=192, block_n=192, **WS)


def test_small_m_defaults():
    # M <= 120 (and 128) with a row-major A: Cᵀ = Bᵀ Aᵀ, M on the wgmma's N side
    # (recipes.tiles.params_swapped, recipes.tiles.swaps)
    text = str(fs.recipes.gemm(16, 8192, 8192, arch="sm_90a"))
    assert "wgmma_m64n16k16_f16_f32_ss_tnspa" in text and "split_k" not in text
    assert "wgmma_m64n8k16" in str(fs.recipes.gemm(1, 4096, 4096, arch="sm_90a"))
    # a column-major A keeps the 16-row mma.sync tiles streaming B (recipes.tiles.params_small_m),
    # split over two blocks on a long K where the N tiles alone leave half the SMs idle
    text = str(fs.recipes.gemm(16, 8192, 8192, arch="sm_90a", layout="CR"))
    assert "mma_m16n8k16" in text and "wgmma" not in text and "split_k" not in text
    assert "split_k(2, across=block)" in str(fs.recipes.gemm(8, 4096, 14336, arch="sm_90a", layout="CR"))
    # 121 to 127 rows: 64-row wgmma tiles without the swap
    assert "roles" not in repr(fs.recipes.gemm(121, 4096, 4096, arch="sm_90a").root.spec)
    # a column-major A above 16 rows: mma.sync tiles (the wgmma family reads A K-major), not an error
    for layout in ("CR", "CC"):
        text = str(fs.recipes.gemm(100, 4096, 4096, arch="sm_90a", layout=layout))
        assert "mma_m16n8k16" in text and "wgmma" not in text
    sched = fs.recipes.gemm(40, 72, 48, arch="sm_90a", layout="CR")
    rng = np.random.default_rng(5)
    A, B = rng.standard_normal((40, 48)), rng.standard_normal((48, 72))
    C = fs.interpret(sched, A, B).astype(np.float64)
    ref = A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)
    assert np.abs(C - ref).max() <= 2e-2 * np.abs(ref).max()


@pytest.mark.parametrize("M, N, K, want", [
    (127, 4096, 4096, dict(block_m=64, block_n=64, stages=12, split_k_blocks=1, cluster=2)),   # pairs, deep ring
    (257, 1024, 4096, dict(block_m=64, block_n=256, split_k_blocks=6)),    # parts in L2: split six ways
    (1009, 2048, 2048, dict(block_m=64, block_n=256, split_k_blocks=1)),   # a short K is not split
    (1000, 1000, 1000, dict(block_m=64, block_n=128, cluster=2)),          # partial last K tile: pairs
    (1024, 1024, 256, dict(block_m=64, block_n=128, cluster=1)),           # whole K tiles: no pairs
    (8192, 8192, 8192, dict(block_m=128, block_n=256, persistent=True)),
])
def test_the_tile_models_choices(M, N, K, want):
    """What ``recipes.tiles.params_sm90`` picks on shapes of the suite (each measured on an H100,
    ``bench/README.md``), and the kernel it builds checks."""
    got = fs.recipes.tiles.params_sm90(M, N, K)
    assert {k: got[k] for k in want} == want
    fs.recipes.gemm(M, N, K, arch="sm_90a")


def test_sm80_recipe_refuses_warp_specialization():
    with pytest.raises(ScheduleError, match="Hopper"):
        fs.recipes.gemm(256, 256, 256, arch="sm_90a", atoms="sm80", warp_specialized=True)


def test_strategy_values_print_and_compare():
    ws = warp_specialize(producer_regs=24, consumer_regs=240)
    assert repr(ws) == "warp_specialize(producer_regs=24, consumer_regs=240)"
    assert eval(repr(ws)) == ws and hash(eval(repr(ws))) == hash(ws)
    assert repr(warp_specialize()) == "warp_specialize()"
    tb = to_blocks(group=8, persistent=True)
    assert repr(tb) == "to_blocks(group=8, persistent=True)"
    sched = fs.recipes.gemm(512, 512, 512, arch="sm_90a", block_m=128, block_n=128, group_m=2, **PERSISTENT)
    text = str(sched)
    assert "persistent" in text and "warp-specialized(producer 40 regs" in text


def test_sm90a_default_is_the_warp_specialized_persistent_gemm():
    sched = fs.recipes.gemm(4096, 4096, 1024, arch="sm_90a")
    text = str(sched)
    assert "wgmma" in text and "persistent" in text and "warp-specialized" in text
    assert "mma_m16n8k16" not in text
    # one wave of tiles: no persistent loop to walk
    text = str(fs.recipes.gemm(1024, 1024, 1024, arch="sm_90a"))
    assert "wgmma" in text and "warp-specialized" in text and "persistent" not in text
    # the sm_80 recipe stays available on sm_90a, and is still the default for sm_80
    assert "mma" in str(fs.recipes.gemm(1024, 1024, 1024, arch="sm_90a", atoms="sm80"))
    assert "wgmma" not in str(fs.recipes.gemm(1024, 1024, 1024, arch="sm_80"))


@pytest.mark.parametrize("kw", [dict(warp_k=32), dict(warps_m=4), dict(split_k_warps=2),
                                dict(prologue_ops=(ops.relu(),))])
def test_sm80_parameters_with_hopper_atoms(kw):
    with pytest.raises(ScheduleError, match="sm_80-atom recipe") as e:
        fs.recipes.gemm(1024, 1024, 1024, arch="sm_90a", **kw)
    assert "atoms='sm80'" in str(e.value)


@pytest.mark.parametrize("M, N, K", [(1, 8, 8), (40, 64, 48), (17, 200, 33), (130, 9, 70), (100, 1024, 256)])
def test_problems_smaller_than_a_tile(M, N, K):
    """Block and K tiles overhang small problems (TMA zero-fills the loads, drops the stores)."""
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a")
    rng = np.random.default_rng(M * N + K)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    C = fs.interpret(sched, A, B)
    assert _close(C, _ref(A, B, fs.dtypes.f16))


# --------------------------------------------------------------------------- swizzle modes

def _hopper_chain(bk, sw_a=None, sw_b=None, bn=64, layout="RR"):
    from firesched.strategies import done, move_to_smem, to_warpgroups

    spec = fs.MatMul.kernel(200, 136, 200, a="f16", b="f16", c="f16", acc="f32", layout=layout)
    atom = sm90a.wgmma_atom(bn, fs.dtypes.f16, b_mn_major=layout[1] == "R")
    return spec.schedule(
        tile(m=128, n=bn) >> to_blocks(),
        tile(k=bk),
        move_to_smem("A", swizzle=sw_a, via=(sm90a.tma_load_2d,)),
        move_to_smem("B", swizzle=sw_b, via=(sm90a.tma_load_2d,)),
        pipeline(stages=3), warp_specialize(),
        tile(m=64) >> to_warpgroups(),
        tile(k=16) >> done(atom),
    )


@pytest.mark.parametrize("bk, layout, sw_b, box_cols", [
    pytest.param(64, "RR", None, 64, id="128B-auto"),
    pytest.param(32, "RR", None, 64, id="64B-A-128B-B"),
    pytest.param(16, "RC", None, None, id="32B-both-K-major"),
    pytest.param(64, "RR", fs.Swizzle(2, 3, 3), 32, id="B-override-64B-boxes"),
    pytest.param(32, "RR", fs.Swizzle(1, 3, 3), 16, id="B-override-32B-boxes"),
])
def test_swizzle_modes_follow_the_tiles(bk, layout, sw_b, box_cols):
    """The K tile picks A's swizzle mode (one span per K tile); a row-major B is loaded in boxes
    one span wide, the span chosen by move_to_smem or given by the user."""
    sched = _hopper_chain(bk, sw_b=sw_b, layout=layout)
    prog = sched.lower("sm_90a")
    k = prog.kernels[-1]
    tm = {p.name: p for p in k.params if isinstance(p, ir.TensorMapParam)}
    assert tm["tmap_A"].swizzle == bk * 2 and tm["tmap_A"].box == (128, bk)
    if box_cols:
        assert tm["tmap_B"].box == (bk, box_cols) and tm["tmap_B"].swizzle == box_cols * 2
    rng = np.random.default_rng(bk)
    A, B = rng.standard_normal((200, 200)), rng.standard_normal((200, 136))
    C = fs.interpret(sched, A, B, target="sm_90a")
    assert _close(C, _ref(A, B, fs.dtypes.f16))


def test_swizzle_that_does_not_span_the_k_tile():
    with pytest.raises(ScheduleError, match="spans 128 bytes but its K tile is 64 bytes") as e:
        _hopper_chain(32, sw_a=fs.Swizzle(3, 3, 3)).lower("sm_90a")
    assert "tile(k=64)" in str(e.value)


def test_unswizzled_tile_is_refused():
    with pytest.raises(ScheduleError, match="no wgmma/TMA swizzle mode"):
        _hopper_chain(64, sw_a=fs.Swizzle(0, 0, 0)).lower("sm_90a")


@pytest.mark.parametrize("bk", [16, 32])
def test_recipe_block_k_selects_the_mode(bk):
    sched = fs.recipes.gemm(512, 512, 512, arch="sm_90a", block_k=bk)
    k = fs.compile(sched, arch="sm_90a")
    assert k.spills == 0
    assert f"{bk * 2}B swizzle" in k.source


def test_bias_goes_through_shared_memory():
    """A bias over N is loaded when the tile starts and read by the epilogue from each warpgroup's
    shared copy; without the warpgroup barrier between the copy and the reads, that is a race."""
    epi = (ops.bias("bias"), ops.relu())
    sched = fs.recipes.gemm(256, 256, 256, arch="sm_90a", block_m=128, block_n=64, epilogue_ops=epi, **PERSISTENT)
    prog = sched.lower(TWO_SMS)
    (k,) = prog.kernels
    assert any(b.name == "bias_smem" for b in k.shared)
    rng = np.random.default_rng(3)
    feed = {"A": rng.standard_normal((256, 256)), "B": rng.standard_normal((256, 256)), "bias": rng.standard_normal(256)}
    out = interp.run_program(prog, dict(feed))["C"]
    assert _close(out, _ref(feed["A"], feed["B"], fs.dtypes.f16, epi, [feed["bias"]]))

    def drop_free_barrier(s):
        return None if isinstance(s, ir.Barrier) and "buffer is free" in s.comment else s

    bad = attrs.evolve(prog, kernels=(attrs.evolve(k, body=map_leaves(k.body, drop_free_barrier)),))
    with pytest.raises(HazardError, match="race"):
        interp.run_program(bad, dict(feed))


# --------------------------------------------------------------------------- random Hopper schedules

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

HOPPER_EPILOGUES = [(), (ops.relu(),), (ops.bias("bias"), ops.relu()), (ops.bias("bias"), ops.gelu()),
                    (ops.residual("residual"),), (ops.scale(0.5), ops.bias("bias"))]


@st.composite
def hopper_cases(draw):
    bm = draw(st.sampled_from([64, 128, 192]))
    bn = draw(st.sampled_from([64, 128, 256]))
    bk = draw(st.sampled_from([16, 32, 64]))
    ws = draw(st.booleans())
    return dict(
        M=draw(st.integers(1, 2 * bm)), N=draw(st.integers(1, 2 * bn)), K=draw(st.integers(1, 4 * bk)),
        dtype=draw(st.sampled_from(["f16", "bf16"])), out_dtype=draw(st.sampled_from([None, "f32"])),
        layout=draw(st.sampled_from(["RR", "RC"])), block_m=bm, block_n=bn, block_k=bk,
        stages=draw(st.integers(2, 4)), group_m=draw(st.sampled_from([1, 2, 3])),
        warp_specialized=ws, persistent=ws and draw(st.booleans()),
        epilogue_ops=draw(st.sampled_from(HOPPER_EPILOGUES)), sms=draw(st.sampled_from([1, 2, 3])),
        seed=draw(st.integers(0, 2 ** 16)),
    )


@settings(max_examples=75 if settings().max_examples >= 500 else 8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(hopper_cases())
def test_random_hopper_schedules_match_numpy(case):
    """Random Hopper GEMMs (tile shapes, swizzle modes through block_k, stages, warp
    specialization, persistence over 1-3 SMs, epilogues, odd sizes that need row padding and
    overhanging tiles) run hazard-free in the interpreter and match numpy."""
    case = dict(case)
    M, N, K, seed, sms = (case.pop(k) for k in ("M", "N", "K", "seed", "sms"))
    # a schedule either checks and runs right, or is refused: tiles and stages that exceed the
    # shared memory (192x256 tiles, 4 stages of 64-wide K, f32 staging of C), and warp-specialized
    # 192x256 tiles (128 accumulators a thread under a 128-register launch), are refused by name
    ring = case["stages"] * (case["block_m"] + case["block_n"]) * case["block_k"] * 2
    staging = case["block_m"] * case["block_n"] * (4 if case["out_dtype"] == "f32" else 2) // 2
    try:
        sched = fs.recipes.gemm(M, N, K, arch="sm_90a", atoms="sm90a", **case)
    except ScheduleError as e:
        too_big = "shared memory over the target's limit" in str(e) and ring + staging > 200 * 1024
        no_regs = "f32 accumulators" in str(e) and case["warp_specialized"] and \
            (case["block_m"], case["block_n"]) == (192, 256)
        assert too_big or no_regs, str(e)
        return
    dt = fs.dtypes.dtype(case["dtype"])
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    epi = case["epilogue_ops"]
    extras = [rng.standard_normal((M, N) if e.kind == "matrix" else (N,)) for op in epi for e in op.extras()]
    C = fs.interpret(sched, A, B, *extras, target=attrs.evolve(SM90A, sm_count=sms))
    assert _close(C, _ref(A, B, dt, epi, extras), tol=3e-2)


def test_persistent_sm80_schedule():
    """Persistent blocks are a block order like any other: the sm_80 atoms walk the tiles too."""
    from firesched.hardware import sm80
    from firesched.strategies import done, move_to_regs, move_to_smem, to_warps

    spec = fs.MatMul.kernel(256, 256, 256, a="f16", b="f16", c="f16", acc="f32")
    sched = spec.schedule(tile(m=128, n=128) >> to_blocks(persistent=True), tile(k=32), move_to_smem("A"),
                          move_to_smem("B"), pipeline(stages=3), tile(m=64, n=64) >> to_warps(2, 2), tile(k=16),
                          move_to_regs("A"), move_to_regs("B"),
                          tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32))
    from firesched.hardware import SM80

    three_sms = attrs.evolve(SM80, sm_count=3)
    assert sched.lower(three_sms).kernels[0].grid == (3, 1, 1)
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal((256, 256)), rng.standard_normal((256, 256))
    ref = A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)
    C = fs.interpret(sched, A, B, target=three_sms).astype(np.float64)
    assert np.abs(C - ref).max() <= 2e-2 * np.abs(ref).max()


def test_loop_repr_round_trips():
    from firesched.schedule import Loop

    lp = Loop("k0", 16, (("k", 64),), None, 4, 1, prefetch=True, persistent=True, specialize=(40, 232))
    assert eval(repr(lp), {"Loop": Loop, "None": None}) == lp
    assert "warp-specialized(producer 40 regs, consumers 232)" in str(lp) and "persistent" in str(lp)
