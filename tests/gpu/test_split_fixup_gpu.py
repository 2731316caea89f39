"""``split_k(parts, across=BLOCK, combine="fixup")`` on the GPU against torch: the K parts of a
tile on blocks of one launch, the last part's block adding the others' partial sums through a
workspace and a counter a tile; and ``combine="cluster"``, the parts on one thread-block cluster
pushing their partial sums into the top part's shared memory.  Hand-written chains in both atom families and the W4A16 recipe,
random shapes; relaunched and replayed from a CUDA graph (each launch must leave its counters
cleared), bitwise the same each time."""

from __future__ import annotations

import random

import numpy as np
import pytest

import firesched as fs
from firesched.hardware.atoms import sm80, sm90a
from firesched.quant import dequantize_int4, quantize_int4
from firesched.recipes.w4a16 import W4A16Params, W4A16WgmmaParams
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

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _chain(fam, parts, bm, bn, combine="fixup"):
    head = [split_k(parts, across=fs.BLOCK, combine=combine), tile(m=bm, n=bn) >> to_blocks()]
    if fam == "sm80":
        return head + [tile(k=32), move_to_smem("A"), move_to_smem("B"), pipeline(stages=3),
                       tile(m=bm // 2, n=bn // 2) >> to_warps(2, 2), move_to_regs("A"), move_to_regs("B"),
                       tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32)]
    tma = (sm90a.tma_load_2d,)
    chain = head + [tile(k=64), move_to_smem("A", via=tma), move_to_smem("B", via=tma), pipeline(stages=4)]
    if fam == "sm90a":
        chain.append(warp_specialize(producer_regs=40, consumer_regs=232))
    return chain + [tile(m=64) >> to_warpgroups(),
                    tile(k=16) >> done(sm90a.wgmma_atom(bn, fs.dtypes.f16, b_mn_major=True))]


def _run(M, N, K, parts, fam, bm, bn, combine="fixup"):
    spec = fs.MatMul.kernel(M, N, K, a="f16", b="f16", c="f16", acc="f32")
    sched = spec.schedule(*_chain(fam, parts, bm, bn, combine))
    k = fs.compile(sched, arch="sm_90a")
    # one launch of the product (no reduction kernel after it; a K not a multiple of 8 pads A first)
    assert k.spills == 0 and not any("reduce" in kern.name for kern in k.program.kernels)
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    B = torch.randn(K, N, device="cuda", dtype=torch.float16)
    ref = A.float() @ B.float()
    results = []
    for _ in range(3):
        C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
        k(A, B, C)
        torch.cuda.synchronize()
        results.append(C)
    err = (results[0].float() - ref).abs().max().item()
    assert err <= 2e-2 * K ** 0.5, (M, N, K, parts, fam, err)
    for r in results[1:]:
        # the same partial sums added in the same order each launch: the same bits
        assert torch.equal(r, results[0]), "split-K fix-up results differ between launches"


@pytest.mark.parametrize("M, N, K, parts, fam, bm, bn", [
    (1000, 1000, 1000, 3, "sm90a", 128, 128), (127, 4096, 4096, 4, "sm90a", 64, 64),
    (200, 136, 450, 3, "sm90a-one-role", 128, 64), (1, 8192, 8192, 8, "sm90a", 64, 128),
    (1000, 1000, 1000, 3, "sm80", 64, 64), (77, 520, 3000, 6, "sm80", 64, 128),
])
def test_against_torch(M, N, K, parts, fam, bm, bn):
    _run(M, N, K, parts, fam, bm, bn)


def test_random_schedules():
    rng = random.Random(11)
    for _ in range(8):
        M, N, K = rng.randint(1, 1200), 8 * rng.randint(1, 160), rng.randint(64, 4000)
        parts = rng.randint(2, min(8, -(-K // 64)))
        per = (K + parts - 1) // parts
        per = (per + 63) // 64 * 64
        parts = (K + per - 1) // per               # the parts split_k's 64-aligned cut gives
        if parts < 2:
            continue
        fam = rng.choice(["sm80", "sm90a", "sm90a-one-role"])
        _run(M, N, K, parts, fam, rng.choice([64, 128]), rng.choice([64, 128]))


@pytest.mark.parametrize("M, N, K, parts, fam, bm, bn", [
    (1000, 1000, 1000, 3, "sm90a", 128, 64), (127, 4096, 4096, 4, "sm90a", 64, 64),
    (200, 136, 450, 3, "sm90a-one-role", 64, 64), (1, 8192, 8192, 8, "sm90a", 64, 64),
    (1000, 1000, 1000, 3, "sm80", 64, 64), (77, 520, 3000, 6, "sm80", 64, 128),
])
def test_cluster_against_torch(M, N, K, parts, fam, bm, bn):
    _run(M, N, K, parts, fam, bm, bn, combine="cluster")


def test_cluster_random_schedules():
    rng = random.Random(12)
    for _ in range(8):
        M, N, K = rng.randint(1, 1200), 8 * rng.randint(1, 160), rng.randint(128, 4000)
        per = ((K + rng.randint(2, 8) - 1) // rng.randint(2, 8) + 63) // 64 * 64
        parts = min(8, (K + per - 1) // per)
        if parts < 2:
            continue
        _run(M, N, K, parts, rng.choice(["sm80", "sm90a", "sm90a-one-role"]), 64, rng.choice([64, 128]),
             combine="cluster")


@pytest.mark.parametrize("M, N, K, params", [
    (1, 4096, 4096, W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=4, split_k=4,
                                cluster_combine=True)),
    (16, 4096, 4096, W4A16WgmmaParams(block_m=16, block_n=64, block_k=512, stages=4, split_k=2, producer=True,
                                      cluster_combine=True)),
    (1, 4096, 4096, W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=4, split_k=4,
                                fixup=True)),
    (16, 1000, 8192, W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=6, split_k=2,
                                 fixup=True)),
    (64, 4096, 4096, W4A16WgmmaParams(block_m=64, block_n=128, block_k=128, stages=4, split_k=4, fixup=True,
                                      producer=True)),
    (33, 520, 2048, W4A16WgmmaParams(block_m=40, block_n=128, block_k=64, stages=4, split_k=8, fixup=True)),
])
def test_w4a16(M, N, K, params):
    q, s, _ = quantize_int4(np.random.default_rng(N).standard_normal((K, N)) * 0.05, 128, signed=False,
                            scale_dtype="f16")
    deq = torch.from_numpy(dequantize_int4(q, s.astype(np.float32), None, 128)).cuda()
    sched = fs.recipes.gemm_w4a16(M, N, K, group_size=128, arch="sm_90a", params=params)
    k = fs.compile(sched, arch="sm_90a")
    assert k.spills == 0 and not any("reduce" in kern.name for kern in k.program.kernels)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    packed = torch.from_numpy(fs.recipes.pack_weights(q, sched)).cuda()
    S = torch.from_numpy(np.asarray(s).astype(np.float32)).half().cuda()
    ref = a.float() @ deq.float()
    outs = []
    for _ in range(3):
        c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
        k(a, packed, S, C=c)
        torch.cuda.synchronize()
        outs.append(c)
    assert (outs[0].float() - ref).abs().max().item() <= 2e-2 * (1 + ref.abs().max().item())
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


def test_graph_replays():
    """A captured fix-up launch replays right each time: every launch leaves its counters cleared."""
    M, N, K = 300, 1000, 3000
    spec = fs.MatMul.kernel(M, N, K, a="f16", b="f16", c="f16", acc="f32")
    k = fs.compile(spec.schedule(*_chain("sm90a", 5, 128, 128)), arch="sm_90a")
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    k.prepare(torch.cuda.current_device(), stream=side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        k(a, b, C=c)
    ref = a.float() @ b.float()
    first = None
    for _ in range(3):
        c.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert (c.float() - ref).abs().max().item() < 2e-2 * K ** 0.5
        first = c.clone() if first is None else first
        assert torch.equal(c, first)
