"""``recipes.gemm_w4a16`` on the GPU against float32 math on the dequantised weights: odd M and
N, every group size, signed and unsigned codes, per-group zero points, f16 and bf16, with split-K,
compiled for sm_80 (mma.sync, which the H100 runs too) and sm_90a; and random tiles drawn with a
seeded RNG."""

from __future__ import annotations

import random

import numpy as np
import pytest

import firesched as fs
from firesched.quant import dequantize_int4, quantize_int4
from firesched.recipes.w4a16 import W4A16Params, W4A16WgmmaParams

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TDT = {"f16": torch.float16, "bf16": torch.bfloat16}


def _run(M, N, K, group_size=128, signed=False, dtype="f16", params=None, arch="sm_90a", seed=0, zero_point=False):
    """Run the recipe (its default tiles unless ``params``) on random weights and compare; the
    default tiles must not spill (drawn ones may: they are still right)."""
    sched = fs.recipes.gemm_w4a16(M, N, K, group_size=group_size, signed=signed, dtype=dtype, arch=arch,
                                  params=params, zero_point=zero_point)
    k = fs.compile(sched, arch=arch)
    assert params is not None or k.spills == 0
    rng = np.random.default_rng(seed)
    q, s, z = quantize_int4(rng.standard_normal((K, N)) * 0.1 + (0.05 if zero_point else 0), group_size,
                            signed=signed, zero_point=zero_point, scale_dtype=dtype)
    w = torch.from_numpy(dequantize_int4(q, s.astype(np.float32), z, group_size)).cuda()
    a = torch.randn(M, K, device="cuda").to(TDT[dtype])
    b = torch.from_numpy(fs.recipes.pack_weights(q, sched)).cuda()
    sc = torch.from_numpy(np.asarray(s).astype(np.float32)).to(TDT[dtype]).cuda()
    c = torch.full((M, N), float("nan"), device="cuda", dtype=TDT[dtype])
    extra = (torch.from_numpy(np.asarray(z).astype(np.float32)).to(TDT[dtype]).cuda(),) if zero_point else ()
    k(a, b, sc, *extra, C=c)
    torch.cuda.synchronize()
    ref = a.float() @ w
    assert not torch.isnan(c).any()
    tol = 1e-2 if dtype == "f16" else 2e-2
    err = (c.float() - ref).abs().max().item()
    assert err <= tol * (1 + ref.abs().max().item()), (M, N, K, group_size, signed, dtype, params, err)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("M", [1, 3, 16, 17, 64, 130])
@pytest.mark.parametrize("N,K", [(8, 32), (72, 96), (256, 1024), (1000, 4096)])
def test_shapes(M, N, K, arch):
    _run(M, N, K, group_size=32 if K < 128 else 128, arch=arch)


@pytest.mark.parametrize("group_size", [32, 64, 128, None])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_groups_signs_dtypes(group_size, signed, dtype):
    _run(16, 520, 2048, group_size=group_size, signed=signed, dtype=dtype)


@pytest.mark.parametrize("group_size", [32, 128, None])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("M", [1, 16, 100])
def test_zero_points(M, signed, group_size):
    _run(M, 520, 2048, group_size=group_size, signed=signed, zero_point=True)


def test_llm_shapes():
    # 20 x 11008 x 4096: the small-M wgmma tile over 128 columns, whose ring once overflowed
    for M, N, K in [(1, 4096, 4096), (16, 8192, 8192), (20, 11008, 4096), (64, 11008, 4096), (4096, 4096, 4096)]:
        _run(M, N, K)


@pytest.mark.parametrize("M,N,K,group_size,signed,dtype,zero_point", [
    (300, 1000, 4096, 32, True, "bf16", False), (999, 1000, 4128, None, False, "f16", False),
    (2000, 4096, 4160, 64, False, "f16", True), (768, 520, 2048, 128, False, "bf16", False),
    (512, 11008, 4096, 64, False, "f16", True),
])
def test_default_plan_above_256_rows(M, N, K, group_size, signed, dtype, zero_point):
    """The default tiles above M = 256 (a TMA producer warpgroup, 128 to 256 rows a block) at odd
    shapes: rows and columns past the tiles, K of 32- and 64-k tiles."""
    _run(M, N, K, group_size=group_size, signed=signed, dtype=dtype, zero_point=zero_point)


@pytest.mark.parametrize("M,N,K,group_size,signed,dtype,zero_point", [
    (1, 8200, 1024, 64, False, "f16", True), (5, 8192, 2048, 32, True, "bf16", False),
    (40, 8200, 1024, 128, True, "bf16", False), (5, 11000, 1024, None, False, "f16", False),
    (13, 8200, 1024, 128, True, "bf16", True),      # bf16 up to M = 16: four, scales on the partials
])
def test_default_plan_with_consumers_sharing_k_tiles(M, N, K, group_size, signed, dtype, zero_point):
    """The default tiles of M up to 64 where K is not split over blocks: consumer warpgroups share
    each K tile (w4a16.SHARED_K_CONSUMERS), at odd shapes, zero points, signed codes, whole-column
    scales."""
    p = fs.recipes.w4a16.plan(M, N, K, wgmma=True, group_size=group_size, zero_point=zero_point, dtype=dtype)
    assert isinstance(p, W4A16WgmmaParams) and p.warpgroups_k > 1, p
    _run(M, N, K, group_size=group_size, signed=signed, dtype=dtype, zero_point=zero_point)


def test_random_tiles():
    rnd = random.Random(7)
    ran = 0
    for i in range(40):
        bm = rnd.choice([16, 32, 64])
        wm = rnd.choice([w for w in (1, 2) if bm % (16 * w) == 0])
        bn = rnd.choice([32, 64, 128, 256])
        wn = rnd.choice([w for w in (2, 4, 8) if bn % (8 * w) == 0])
        bk = rnd.choice([64, 128, 256])
        wk = rnd.choice([w for w in (32, 64, 128) if bk % w == 0])
        kw = rnd.choice([w for w in (1, 1, 2, 4) if bk % (w * wk) == 0])       # warps sharing a K tile
        p = W4A16Params(block_m=bm, block_n=bn, block_k=bk, warps_m=wm, warps_n=wn, warp_k=wk, warps_k=kw,
                        stages=rnd.choice([2, 3, 4, 6]), split_k=rnd.choice([1, 2, 4]))
        M, N, K = rnd.choice([1, 5, 16, 40, 100]), rnd.choice([64, 200, 1024]), rnd.choice([512, 1024, 2048])
        try:
            _run(M, N, K, group_size=rnd.choice([32, 64, 128, None]), signed=rnd.random() < 0.5,
                 dtype=rnd.choice(["f16", "bf16"]), params=p, seed=i)
        except fs.ScheduleError:
            continue
        ran += 1
    assert ran >= 15


def test_direct_random_tiles():
    """``W4A16Params(direct=True)``: the codes straight from global memory on a ring of registers
    (``pipeline`` in registers), random tiles, odd shapes, zero points, both architectures."""
    rnd = random.Random(11)
    ran = 0
    for i in range(24):
        bn = rnd.choice([16, 32, 64, 128])
        wn = rnd.choice([w for w in (1, 2, 4, 8) if bn % (8 * w) == 0 and bn // w <= 32])
        wk = rnd.choice([32, 64, 128])
        split = rnd.choice([1, 2, 4])
        M, N, K = rnd.choice([1, 5, 16]), rnd.choice([64, 200, 1000]), rnd.choice([512, 1024, 2048])
        kw = rnd.choice([w for w in (1, 2, 4) if (K // split) % (w * wk) == 0] or [1])
        bk = rnd.choice([b for b in (K // split, K // split // 2) if b % (kw * wk) == 0] or [K // split])
        p = W4A16Params(block_m=16, block_n=bn, block_k=bk, warps_n=wn, warp_k=wk, warps_k=kw,
                        stages=rnd.choice([2, 3, 4, 8]), split_k=split, direct=True)
        try:
            _run(M, N, K, group_size=rnd.choice([32, 64, 128, None]), signed=rnd.random() < 0.5,
                 dtype=rnd.choice(["f16", "bf16"]), params=p, seed=i, arch=rnd.choice(["sm_80", "sm_90a"]),
                 zero_point=rnd.random() < 0.25)
        except (fs.ScheduleError, ValueError):
            continue
        ran += 1
    assert ran >= 12


# --------------------------------------------------------------------------- the wgmma family

WG = W4A16WgmmaParams


@pytest.mark.parametrize("M", [1, 17, 64, 130, 300])
@pytest.mark.parametrize("N,K", [(64, 64), (200, 1024), (1000, 4096)])
def test_wgmma_shapes(M, N, K):
    """Weight tiles past N, activation tiles past M, and K of one or many tiles."""
    _run(M, N, K, group_size=64, params=WG(block_m=min(256, -(-M // 8) * 8), block_n=128, block_k=64, stages=3))


@pytest.mark.parametrize("group_size", [32, 128, None])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("zero_point", [False, True])
def test_wgmma_groups_signs_dtypes(group_size, signed, dtype, zero_point):
    _run(100, 520, 2048, group_size=group_size, signed=signed, dtype=dtype, zero_point=zero_point,
         params=WG(block_m=104, block_n=192, block_k=128, stages=3))


def _random_wgmma_runs(seed: int, count: int, draw) -> int:
    """Run ``count`` random problems with tiles ``draw(rnd)`` (refused ones skipped); how many ran."""
    rnd = random.Random(seed)
    ran = 0
    for i in range(count):
        p = draw(rnd)
        M, N, K = rnd.choice([1, 9, 64, 100, 257]), rnd.choice([64, 200, 1024]), rnd.choice([512, 1024, 2048])
        try:
            _run(M, N, K, group_size=rnd.choice([32, 64, 128, None]), signed=rnd.random() < 0.5,
                 dtype=rnd.choice(["f16", "bf16"]), params=p, seed=i, zero_point=rnd.random() < 0.3)
        except fs.ScheduleError:
            continue
        ran += 1
    return ran


def test_consumers_sharing_a_k_tile_random_tiles():
    """``W4A16WgmmaParams(warpgroups_k=...)``: 2 or 4 consumer warpgroups sharing each K tile (their
    partial sums added through shared memory behind the consumers' named barrier), with and
    without a producer, alone or with K split over blocks, random shapes."""
    def draw(rnd):
        parts = rnd.choice([2, 2, 4])
        return WG(block_m=rnd.choice([8, 16, 40]), block_n=64 if parts == 4 else rnd.choice([64, 128]),
                  block_k=rnd.choice([128, 256, 512]), stages=rnd.choice([2, 3, 4]), split_k=rnd.choice([1, 1, 2]),
                  producer=rnd.random() < 0.75, warpgroups_k=parts)
    assert _random_wgmma_runs(23, 16, draw) >= 8


def test_wgmma_random_tiles():
    assert _random_wgmma_runs(11, 30, lambda rnd: WG(
        block_m=rnd.choice([8, 16, 40, 64, 128, 192]), block_n=rnd.choice([64, 128, 192]),
        block_k=rnd.choice([32, 64, 128, 256]), stages=rnd.choice([2, 3, 4, 6]),
        split_k=rnd.choice([1, 1, 2]), occupancy=rnd.choice([1, 1, 2]))) >= 15


@pytest.mark.parametrize("group_size", [32, 64, 128, None])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("zero_point", [False, True])
def test_scale_partials_groups_signs_dtypes(group_size, signed, dtype, zero_point):
    """``scale_partials``: the group scales on each group's f32 partial product (2 or 8 register
    copies of it a consumer for groups of 128 / 32 of its 256 k, one for whole columns)."""
    _run(13, 200, 2048, group_size=group_size, signed=signed, dtype=dtype, zero_point=zero_point,
         params=WG(block_m=16, block_n=128, block_k=256, stages=3, producer=True, scale_partials=True))


@pytest.mark.parametrize("group_size", [32, 128, None])
@pytest.mark.parametrize("params", [
    W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=4, split_k=2, scale_partials=True),
    W4A16Params(block_m=32, block_n=32, block_k=256, warps_m=2, warps_n=2, warp_k=128, warps_k=2, stages=3,
                scale_partials=True),
    W4A16Params(block_m=16, block_n=64, block_k=256, warps_n=4, warp_k=64, stages=3, direct=True,
                scale_partials=True)], ids=["split", "warps_k", "direct"])
def test_scale_partials_mma_sync(params, group_size):
    """``scale_partials`` in the mma.sync family (sm_80): a warp's K step's groups in register
    copies zeroed by their Init, scaled and added after the step's MMAs."""
    _run(17, 1000, 2048, group_size=group_size, dtype="bf16" if group_size == 32 else "f16", params=params,
         arch="sm_80", zero_point=group_size == 128)


def test_scale_partials_random_tiles():
    """``scale_partials`` with random tiles: with and without a producer, consumers sharing K
    tiles, K split over blocks, odd shapes, every group size, sign and dtype, zero points."""
    def draw(rnd):
        parts = rnd.choice([1, 1, 2, 4])
        return WG(block_m=rnd.choice([8, 16, 24, 64]), block_n=64 if parts == 4 else rnd.choice([64, 128]),
                  block_k=rnd.choice([b for b in (64, 128, 256, 512) if b >= 32 * parts]), stages=rnd.choice([2, 3, 4]),
                  split_k=rnd.choice([1, 1, 2]), producer=rnd.random() < 0.75, warpgroups_k=parts,
                  scale_partials=True)
    assert _random_wgmma_runs(29, 24, draw) >= 12


def _producer_tiles(rnd):
    bn = rnd.choice([64, 128, 192])
    return WG(block_m=rnd.choice([8, 16, 64, 128, 192, 256]), block_n=bn, block_k=rnd.choice([64, 128]),
              stages=rnd.choice([2, 3, 4]), split_k=rnd.choice([1, 1, 2]), producer=True,
              pingpong=bn > 64 and rnd.random() < 0.5)


def test_wgmma_producer_tiles():
    """A producer warpgroup loading codes (as bytes) and activations by TMA, with and without the
    consumers taking turns: random tiles, shapes past them, every group size and sign."""
    assert _random_wgmma_runs(13, 24, _producer_tiles) >= 12


@pytest.mark.parametrize("M,N,K,parts", [(1, 4096, 4096, 4), (16, 1000, 4096, 6), (5, 8192, 8192, 2)])
def test_stream_k(M, N, K, parts):
    """Stream-K instead of split-K: the partial tiles added in the kernel."""
    _run(M, N, K, params=W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=4,
                                     stream_k=parts))
