"""``recipes.fmha`` on the GPU against torch's float32 attention: odd sequence lengths (1, 17,
1000, 4097), grouped-query heads, causal with seq_q != seq_kv, the row log-sum-exp, every head
dim, large-magnitude inputs (no NaN), and random shapes with random tiles."""

from __future__ import annotations

import math
import random

import pytest

import firesched as fs

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TDT = {"f16": torch.float16, "bf16": torch.bfloat16}


def _reference(q, k, v, causal, scale):
    """float32 attention (torch's is_causal: key j is masked from query i where j > i), and the
    row log-sum-exp."""
    h, hk = q.shape[1], k.shape[1]
    k = k.float().repeat_interleave(h // hk, dim=1)
    v = v.float().repeat_interleave(h // hk, dim=1)
    s = q.float() @ k.transpose(-1, -2) * scale
    if causal:
        sq, skv = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, skv, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def _run(b, h, sq, skv, d, dtype="f16", causal=False, kv_heads=None, magnitude=1.0, params=None, arch="sm_90a"):
    kvh = kv_heads or h
    sched = fs.recipes.fmha(b, h, sq, skv, d, dtype=dtype, causal=causal, kv_heads=kvh, lse=True, params=params,
                            arch=arch)
    k = fs.compile(sched, arch="sm_90a")
    dt = TDT[dtype]
    q = (torch.randn(b, h, sq, d, device="cuda") * magnitude).to(dt)
    kk = (torch.randn(b, kvh, skv, d, device="cuda") * magnitude).to(dt)
    v = torch.randn(b, kvh, skv, d, device="cuda").to(dt)
    o = torch.full((b, h, sq, d), float("nan"), device="cuda", dtype=dt)
    lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
    g = h // kvh
    k(q.view(b, kvh, g, sq, d), kk, v, o.view(b, kvh, g, sq, d), lse.view(b, kvh, g, sq))
    torch.cuda.synchronize()
    ro, rl = _reference(q, kk, v, causal, 1 / math.sqrt(d))
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    tol = 2e-2 if dtype == "f16" else 4e-2
    assert (o.float() - ro).abs().max().item() <= tol * max(1.0, ro.abs().max().item())
    assert (lse - rl).abs().max().item() <= 1e-3 * max(1.0, rl.abs().max().item())


#: the schedule each target gets by default: mma.sync warps on sm_80, wgmma warpgroups on sm_90a
ARCHS = ["sm_80", "sm_90a"]


@pytest.mark.parametrize("sq, skv", [(1, 1), (17, 17), (1000, 1000), (4097, 300), (300, 4097), (17, 1000)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_odd_lengths(sq, skv, causal, arch):
    _run(1, 2, sq, skv, 64, causal=causal, arch=arch)


@pytest.mark.parametrize("d", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_head_dims(d, dtype, arch):
    _run(2, 3, 333, 333, d, dtype=dtype, causal=d % 64 == 0, arch=arch)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_whole_tiles(d, causal, arch):
    # sequences that are multiples of every tile: the kernels without edge guards (the sm_80
    # plan at head dim 128 reads its query fragments 32 columns at a time there)
    _run(2, 2, 512, 512, d, causal=causal, arch=arch)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("arch", ARCHS)
def test_grouped_query_heads(kv_heads, arch):
    _run(2, 8, 257, 513, 128, kv_heads=kv_heads, causal=True, arch=arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_large_magnitudes_make_no_nan(arch):
    _run(1, 2, 512, 512, 64, magnitude=60.0, arch=arch)


@pytest.mark.parametrize("seed", range(8))
def test_random_shapes_and_tiles(seed):
    rnd = random.Random(seed)
    d = rnd.choice([64, 128])
    warps = rnd.choice([2, 4, 8])
    rows = rnd.choice([16, 32]) if d == 64 else 16
    p = fs.recipes.FmhaParams(block_q=warps * rows, block_kv=rnd.choice([32, 64]), warps=warps,
                              stages=rnd.choice([1, 2, 3]), q_slice=rnd.choice([16, 32]))
    _run(rnd.randint(1, 3), rnd.choice([1, 2, 4]), rnd.randint(1, 700), rnd.randint(1, 700), d,
         dtype=rnd.choice(["f16", "bf16"]), causal=rnd.random() < 0.5, params=p)


@pytest.mark.parametrize("seed", range(8))
def test_random_wgmma_shapes_and_tiles(seed):
    rnd = random.Random(100 + seed)
    bq = rnd.choice([64, 128])
    ws = seed % 3 == 2            # a producer warpgroup fills one stage while consumers read another
    p = fs.recipes.FmhaParams(block_q=bq, block_kv=rnd.choice([32, 64, 128]), warps=bq // 16,
                              stages=max(rnd.choice([1, 2, 3]), 2 if ws else 1), mma="wgmma", tma=seed % 3 > 0,
                              warp_specialized=ws)
    _run(rnd.randint(1, 3), rnd.choice([1, 2, 4]), rnd.randint(1, 700), rnd.randint(1, 700), rnd.choice([64, 96, 128]),
         dtype=rnd.choice(["f16", "bf16"]), causal=rnd.random() < 0.5, params=p)


@pytest.mark.parametrize("sq, skv, d, causal, kvh", [(1, 1, 128, False, 2), (17, 1000, 128, True, 1),
                                                     (1000, 1000, 128, True, 2), (4097, 300, 64, False, 2),
                                                     (300, 4097, 96, True, 1), (129, 255, 256, False, 2)])
@pytest.mark.parametrize("stages, overlap, persistent", [(2, True, False), (3, True, False), (2, False, False),
                                                         (2, True, True)])
def test_separate_rings(sq, skv, d, causal, kvh, stages, overlap, persistent):
    """K and V on mbarrier rings of their own (``separate=True``): K's stage released once S = Q Kᵀ
    retired, V's once O += P V did; overlapped or not, in a persistent grid with two query buffers
    (``q_stages=2``) too: odd lengths, causal with seq_q != seq_kv, grouped-query heads, every
    head-dim class."""
    bkv, stages = (64, 2) if d > 128 else (128, stages)       # three 64 x 256 stages of each do not fit
    extra = dict(persistent=True, q_by_producer=True, q_stages=2 if d <= 128 else 1) if persistent else {}
    p = fs.recipes.FmhaParams(block_q=128, block_kv=bkv, warps=8, stages=stages, mma="wgmma", tma=True,
                              warp_specialized=True, pingpong=True, overlap=overlap, separate=True, **extra)
    _run(2, 2, sq, skv, d, dtype="bf16" if d == 96 else "f16", causal=causal, kv_heads=kvh, params=p)


@pytest.mark.parametrize("sq, skv, d, causal, kvh", [(1, 1, 128, False, 2), (17, 1000, 128, True, 1),
                                                     (1000, 1000, 128, True, 2), (4097, 300, 64, False, 2),
                                                     (300, 4097, 96, True, 1), (129, 255, 256, False, 2)])
@pytest.mark.parametrize("pingpong, overlap", [(True, False), (False, True), (True, True)])
def test_pingpong_and_overlap(sq, skv, d, causal, kvh, pingpong, overlap):
    """Two consumer warpgroups taking turns to issue their wgmma (``pingpong=True``), each step's
    S = Q Kᵀ issued with the previous step's O += P V (``overlap=True``), and both: odd lengths,
    causal with seq_q != seq_kv, grouped-query heads, every head-dim class."""
    bkv, stages = (64, 2) if d > 128 else (128, 3)
    p = fs.recipes.FmhaParams(block_q=128, block_kv=bkv, warps=8, stages=stages, mma="wgmma", tma=True,
                              warp_specialized=True, pingpong=pingpong, overlap=overlap)
    _run(2, 2, sq, skv, d, dtype="bf16" if d == 96 else "f16", causal=causal, kv_heads=kvh, params=p)


@pytest.mark.parametrize("b, h, kvh, sq, skv, d, causal", [
    (2, 2, 2, 1, 1, 128, False), (2, 2, 1, 17, 1000, 128, False), (2, 2, 2, 1000, 1000, 128, False),
    (2, 2, 2, 4097, 300, 64, False), (2, 2, 1, 300, 4097, 96, True), (2, 2, 2, 129, 255, 256, False),
    (2, 2, 2, 1000, 1000, 128, True),
    # 8 x 16 x 8 = 1,024 query tiles over the SMs: every persistent block walks several, its Q ring wrapping
    (8, 16, 4, 1000, 1000, 128, False), (4, 16, 16, 2000, 2000, 64, False), (8, 16, 4, 1000, 1000, 128, True),
])
@pytest.mark.parametrize("persistent, q_stages", [(True, 1), (False, 1), (True, 2)])
def test_q_by_producer(b, h, kvh, sq, skv, d, causal, persistent, q_stages):
    """The producer warpgroup loads each query tile by TMA on a ring of its own
    (``q_by_producer=True``), in a persistent grid (causal too: the steps past each tile's diagonal
    pass through the key ring) and in the plain one: odd lengths, grouped-query heads, every
    head-dim class; with two query buffers (``q_stages=2``, beside two key stages) the output
    staged in a buffer of its own."""
    bkv, stages = (64, 2) if d > 128 else (128, 3 if q_stages == 1 else 2)
    p = fs.recipes.FmhaParams(block_q=128, block_kv=bkv, warps=8, stages=stages, mma="wgmma", tma=True,
                              warp_specialized=True, pingpong=True, overlap=True, persistent=persistent,
                              q_by_producer=True, q_stages=q_stages)
    if q_stages == 2 and d > 128:
        # two 128 x 256 query buffers and two key and value stages: 256 KiB, refused at check()
        with pytest.raises(fs.ScheduleError, match="shared memory over the target's limit"):
            fs.recipes.fmha(b, h, sq, skv, d, causal=causal, kv_heads=kvh, params=p, arch="sm_90a").check("sm_90a")
        return
    _run(b, h, sq, skv, d, dtype="bf16" if d == 96 else "f16", causal=causal, kv_heads=kvh, params=p)


@pytest.mark.parametrize("b, h, kvh, sq, skv, d, causal", [
    (2, 2, 2, 1, 1, 128, False), (2, 2, 1, 17, 1000, 128, True), (8, 16, 4, 1000, 1000, 128, False),
    (4, 16, 16, 2000, 2000, 64, True), (2, 2, 2, 300, 4097, 96, False)])
def test_two_blocks_an_sm(b, h, kvh, sq, skv, d, causal):
    """``blocks_per_sm=2``: two warp-specialized blocks of one consumer warpgroup resident on an SM
    at once, each consumer's ``setmaxnreg`` sized for half the register file (a budget that is
    wrong hangs the second block's ``setmaxnreg.inc``)."""
    p = fs.recipes.FmhaParams(block_q=64, block_kv=64, warps=4, stages=3, mma="wgmma", tma=True,
                              warp_specialized=True, overlap=True, blocks_per_sm=2)
    _run(b, h, sq, skv, d, dtype="bf16" if d == 96 else "f16", causal=causal, kv_heads=kvh, params=p)


@pytest.mark.parametrize("b, h, kvh, sq, skv, d, causal", [
    (2, 2, 2, 1, 1, 128, False), (2, 2, 1, 17, 1000, 128, True), (2, 2, 2, 1000, 1000, 128, False),
    (2, 2, 1, 129, 255, 256, True),
    # 8 x 16 x 8 = 1,024 query tiles: every persistent block stages and stores several outputs
    (8, 16, 4, 1000, 1000, 128, False), (8, 16, 4, 1000, 1000, 128, True)])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_output_staged_in_the_query_rows(b, h, kvh, sq, skv, d, causal, persistent, dtype):
    """Two consumer warpgroups stage their output in the query rows each has finished multiplying
    (``lower.rules.borrow``) and store it by TMA, dropping rows past seq_q; persistent blocks wait
    for the stores to read those rows before they reload Q for the next tile."""
    bkv, stages = (64, 2) if d > 128 else (128, 3)
    p = fs.recipes.FmhaParams(block_q=128, block_kv=bkv, warps=8, stages=stages, mma="wgmma", tma=True,
                              warp_specialized=True, pingpong=True, overlap=True, persistent=persistent,
                              reverse=causal and not persistent)
    sched = fs.recipes.fmha(b, h, sq, skv, d, dtype=dtype, causal=causal, kv_heads=kvh, params=p, arch="sm_90a")
    (kern,) = sched.lower("sm_90a").kernels
    assert {s.name: s.alias for s in kern.shared}.get("C_smem") == "Q_smem"
    _run(b, h, sq, skv, d, dtype=dtype, causal=causal, kv_heads=kvh, params=p)


@pytest.mark.parametrize("b, h, kvh, sq, skv", [(2, 4, 4, 300, 300), (1, 2, 1, 17, 512), (3, 16, 8, 512, 512),
                                                (2, 2, 2, 1, 1)])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_short_causal_plan(b, h, kvh, sq, skv, dtype):
    """The plan for causal head dim 128 up to 512 keys: two blocks an SM of one consumer
    warpgroup, the output staged in its query rows."""
    assert fs.recipes.fmha_plan(b, h, sq, skv, 128, arch="sm_90a", causal=True).blocks_per_sm == 2
    _run(b, h, sq, skv, 128, dtype=dtype, causal=True, kv_heads=kvh)


@pytest.mark.parametrize("b, h, kvh, sq, skv, d, causal, dtype", [
    (1, 16, 16, 1100, 300, 256, False, "f16"), (1, 16, 8, 1100, 1100, 256, True, "bf16"),
    (2, 16, 16, 1024, 1024, 256, True, "f16"), (2, 16, 16, 700, 300, 96, False, "bf16"),
    (2, 16, 4, 1024, 2048, 96, False, "f16")])
def test_planned_designs_at_head_dims_96_and_256(b, h, kvh, sq, skv, d, causal, dtype):
    """The plan's designs where 128-query tiles fill the GPU: at head dim 256 K and V on rings of
    their own in a plain grid, at 96 without a mask the persistent grid with two query buffers
    (odd and whole tiles, grouped-query heads, causal with seq_q != seq_kv)."""
    p = fs.recipes.fmha_plan(b, h, sq, skv, d, arch="sm_90a", causal=causal)
    assert p.block_q == 128 and p.separate and p.stages == 2
    assert (p.persistent, p.q_stages) == ((True, 2) if d == 96 else (False, 1))
    _run(b, h, sq, skv, d, dtype=dtype, causal=causal, kv_heads=kvh)
