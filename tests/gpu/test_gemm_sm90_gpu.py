"""The Hopper GEMM recipe (TMA + mbarrier + wgmma) on the GPU against torch."""

from __future__ import annotations

import pytest

import firesched as fs

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


MODES = [
    pytest.param(dict(warp_specialized=False), id="plain"),
    pytest.param(dict(warp_specialized=True), id="ws"),
    pytest.param(dict(warp_specialized=True, persistent=True), id="ws-persistent"),
    pytest.param(dict(warp_specialized=True, cluster=2), id="cluster"),
    pytest.param(dict(warp_specialized=True, persistent=True, cluster=2), id="cluster-persistent"),
]


def _fit(kw):
    """A cluster of two blocks shares row-major B tiles in boxes one swizzle span wide, one or
    more per block: 64-wide block tiles become 128 wide there."""
    if kw.get("cluster", 1) > 1 and kw.get("layout", "RR") == "RR" and kw.get("block_n") == 64:
        kw = dict(kw, block_n=128)
    return kw


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("M, N, K, kw", [
    pytest.param(512, 512, 512, dict(block_m=128, block_n=256), id="aligned"),
    pytest.param(1000, 1000, 1000, dict(block_m=128, block_n=128), id="1000cube"),
    pytest.param(200, 136, 304, dict(block_m=128, block_n=64), id="partial-tiles"),
    pytest.param(256, 192, 320, dict(block_m=64, block_n=64, layout="RC"), id="B-column-major"),
    pytest.param(384, 512, 256, dict(block_m=192, block_n=128, dtype="bf16", out_dtype="f32"), id="bf16-f32-out"),
    pytest.param(301, 259, 333, dict(block_m=128, block_n=128), id="unaligned-rows-padded"),
    pytest.param(4095, 4097, 1023, dict(block_m=128, block_n=256), id="4095x4097x1023"),
    pytest.param(1, 8, 8, dict(block_m=64, block_n=64), id="1x8x8"),
    pytest.param(40, 72, 48, dict(block_m=64, block_n=64), id="smaller-than-a-tile"),
    pytest.param(17, 200, 33, dict(), id="17x200x33-defaults"),
    # four consumer warpgroups (640 threads) under warp specialization: setmaxnreg within the
    # registers the launch gave the block (more hung before)
    pytest.param(600, 520, 264, dict(block_m=256, block_n=128), id="256-rows"),
    pytest.param(300, 264, 200, dict(block_m=128, block_n=128, block_k=32), id="64B-swizzle"),
    pytest.param(300, 264, 200, dict(block_m=128, block_n=64, block_k=16, layout="RC"), id="32B-swizzle-RC"),
])
def test_against_torch(M, N, K, kw, mode):
    kw = _fit(dict(kw, **mode))
    dt = kw.pop("dtype", "f16")
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt]
    out = {"f32": torch.float32}.get(kw.get("out_dtype"), tdt)
    sched = fs.recipes.gemm(M, N, K, dtype=dt, arch="sm_90a", atoms="sm90a", **kw)
    k = fs.compile(sched, arch="sm_90a")
    assert k.spills == 0
    A = torch.randn(M, K, device="cuda", dtype=tdt)
    B = torch.randn(K, N, device="cuda", dtype=tdt)
    Barg = B.t().contiguous().t() if kw.get("layout", "RR")[1] == "C" else B
    C = torch.full((M, N), float("nan"), device="cuda", dtype=out)
    k(A, Barg, C)
    torch.cuda.synchronize()
    ref = A.double() @ B.double()
    assert not torch.isnan(C).any()
    assert ((C.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["bias_relu", "bias_gelu", "residual"])
def test_epilogues(name, mode, dt):
    # (bf16: the bias and the residual are read from their 32-bit words, fs_bf16_at)
    epi = fs.recipes.EPILOGUES[name]
    M, N, K = 384, 256, 192
    tdt = torch.float16 if dt == "f16" else torch.bfloat16
    sched = fs.recipes.gemm(M, N, K, dtype=dt, arch="sm_90a", atoms="sm90a", block_m=128, block_n=128,
                            epilogue_ops=epi, **mode)
    k = fs.compile(sched, arch="sm_90a")
    A = torch.randn(M, K, device="cuda", dtype=tdt)
    B = torch.randn(K, N, device="cuda", dtype=tdt)
    extras, ref = [], A.double() @ B.double()
    for op in epi:
        for e in op.extras():
            x = torch.randn(*((M, N) if e.kind == "matrix" else (N,)), device="cuda", dtype=tdt)
            extras.append(x)
            ref = ref + x.double()
        if isinstance(op, fs.ops.Unary):
            ref = {"relu": torch.relu, "gelu": torch.nn.functional.gelu}[op.op](ref)
    C = torch.empty(M, N, device="cuda", dtype=tdt)
    k(A, B, *extras, C)
    torch.cuda.synchronize()
    assert ((C.double() - ref).norm() / ref.norm()).item() < 1e-2


def _check_against_torch(sched, M, N, K, layout):
    """Compile ``sched``, run it on random fp16 A and B (B column-major for ``layout="RC"``) into
    a NaN-filled C, and compare with torch in float64."""
    k = fs.compile(sched, arch="sm_90a")
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    B = torch.randn(K, N, device="cuda", dtype=torch.float16)
    Barg = B.t().contiguous().t() if layout == "RC" else B
    C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    k(A, Barg, C)
    torch.cuda.synchronize()
    ref = A.double() @ B.double()
    assert not torch.isnan(C).any(), (M, N, K, layout)
    assert ((C.double() - ref).norm() / ref.norm()).item() < 1e-2, (M, N, K, layout)


@pytest.mark.parametrize("seed", range(10))
def test_random_shapes_clusters(seed):
    """Random shapes on clusters of two blocks (odd M-tile counts leave a block of the last
    cluster without a tile of its own), persistent or not."""
    import random

    rnd = random.Random(100 + seed)
    M, N, K = rnd.randint(1, 1500), rnd.randint(1, 1600), rnd.randint(1, 1200)
    layout = rnd.choice(["RR", "RC"])
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", atoms="sm90a", block_m=rnd.choice([64, 128]),
                            block_n=rnd.choice([128, 256]), stages=rnd.choice([2, 3, 4]),
                            group_m=rnd.choice([1, 4, 8]), layout=layout, warp_specialized=True,
                            persistent=rnd.choice([False, True]), cluster=2)
    _check_against_torch(sched, M, N, K, layout)


@pytest.mark.parametrize("seed", range(10))
def test_random_shapes_persistent(seed):
    """Random shapes, many tiles per block on the persistent path."""
    import random

    rnd = random.Random(seed)
    bn = rnd.choice([64, 128, 256])
    # odd N and K take the row-padding kernels; block tiles may overhang small problems
    M, N, K = rnd.randint(1, 1500), rnd.randint(1, 1600), rnd.randint(1, 1200)
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", atoms="sm90a", block_m=128, block_n=bn,
                            stages=rnd.choice([2, 3, 4]), group_m=rnd.choice([1, 4, 8]),
                            warp_specialized=True, persistent=True)
    k = fs.compile(sched, arch="sm_90a")
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    B = torch.randn(K, N, device="cuda", dtype=torch.float16)
    C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    k(A, B, C)
    torch.cuda.synchronize()
    ref = A.double() @ B.double()
    assert not torch.isnan(C).any(), (M, N, K, bn)
    assert ((C.double() - ref).norm() / ref.norm()).item() < 1e-2, (M, N, K, bn)


@pytest.mark.parametrize("seed", range(6))
def test_random_shapes_clusters_along_n(seed):
    """Clusters of 2 or 4 blocks on consecutive N tiles sharing their A tile
    (``cluster_along="n"``), random shapes (a last cluster part past N), persistent or not."""
    import random

    rnd = random.Random(300 + seed)
    M, N, K = rnd.randint(1, 700), rnd.randint(1, 1600), rnd.randint(1, 1200)
    layout = rnd.choice(["RR", "RC"])
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", atoms="sm90a", block_m=rnd.choice([64, 128]),
                            block_n=rnd.choice([32, 64, 128]), stages=rnd.choice([2, 4, 6]), layout=layout,
                            warp_specialized=True, persistent=rnd.choice([False, True]),
                            cluster=rnd.choice([2, 4]), cluster_along="n")
    _check_against_torch(sched, M, N, K, layout)


def test_persistent_cluster_grid_is_resident_at_once():
    """The persistent cluster kernel launches sm_count / 2 clusters of two blocks: all of them
    must fit on the GPU at once, or the last ones would run as a second wave."""
    from firesched import runtime

    sched = fs.recipes.gemm(4096, 4096, 4096, arch="sm_90a", atoms="sm90a", block_m=128, block_n=256,
                            warp_specialized=True, persistent=True, cluster=2)
    prog = fs.compile(sched, arch="sm_90a")
    (kern,) = prog.program.kernels
    k = runtime.load_module(prog.modules[0], 0).kernel(kern.name)
    n = k.max_active_clusters(kern.grid, (kern.threads, 1, 1), kern.shared_bytes)
    print(f"max active clusters of 2: {n}; the grid has {kern.grid[0] // 2}")
    assert kern.grid[0] // 2 <= n


@pytest.mark.parametrize("M, N, K, kw", [
    pytest.param(1, 4096, 4096, dict(), id="1x4096x4096-default"),
    pytest.param(16, 8192, 8192, dict(), id="16x8192x8192-default"),
    pytest.param(64, 4096, 4096, dict(), id="64x4096x4096-default"),
    pytest.param(100, 4096, 4096, dict(), id="100x4096x4096-default"),
    pytest.param(128, 2048, 1024, dict(), id="128x2048x1024-default"),
    pytest.param(71, 1000, 777, dict(swap_ab=True, block_m=72, block_n=64, stages=12), id="71-one-row-past-A"),
    pytest.param(13, 1000, 999, dict(swap_ab=True, block_m=16, block_n=128, stages=6), id="odd-two-warpgroups"),
    pytest.param(40, 520, 264, dict(swap_ab=True, block_m=40, block_n=64, persistent=True), id="persistent"),
    pytest.param(33, 300, 700, dict(swap_ab=True, block_m=40, block_n=64, stream_k_parts=3), id="stream-k-odd"),
    pytest.param(64, 2048, 2048, dict(swap_ab=True, block_m=64, block_n=64, stream_k_parts=2), id="stream-k"),
])
@pytest.mark.parametrize("layout", ["RC", "RR"])
def test_swapped_against_torch(M, N, K, kw, layout):
    """Cᵀ = Bᵀ Aᵀ (swap_ab, the default for M <= 120 and 128) against torch, with a bias over C's columns
    (the recipe turns it down the accumulator's rows); a row-major B is the MN-major A of the
    swapped product (the _ss_tnspa records)."""
    from firesched import ops

    if layout == "RR" and not kw:
        kw = fs.recipes.tiles.params_swapped(M, N, K)
    sched = fs.recipes.gemm(M, N, K, dtype="f16", arch="sm_90a", layout=layout,
                            epilogue_ops=(ops.bias("bias"), ops.relu()), **kw)
    assert "roles=('n', 'm', 'k')" in repr(sched.root.spec)
    k = fs.compile(sched, arch="sm_90a")
    assert k.spills == 0
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    W = torch.randn(N, K, device="cuda", dtype=torch.float16)          # nn.Linear's weight
    bias = torch.randn(N, device="cuda", dtype=torch.float16)
    C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    k(A, W.t() if layout == "RC" else W.t().contiguous(), bias, C)
    ref = torch.relu(A.float() @ W.float().t() + bias.float())
    assert (C.float() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
