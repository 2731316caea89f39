"""Stream-K GEMMs (``stream_k_parts``, ``strategies.stream_k``) on the GPU against torch: partial
tiles handed between blocks through a workspace and flags, in both atom families, with the
epilogue; relaunched (the flags must be left cleared) and bitwise the same each time.  Launches on
several streams at once: ``test_splitk_streams_gpu.py``."""

from __future__ import annotations

import random

import pytest

import firesched as fs
from firesched import ops

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _run(M, N, K, parts, *, dtype="f16", epilogue=False, **kw):
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    epi = (ops.bias("bias"), ops.relu()) if epilogue else ()
    sched = fs.recipes.gemm(M, N, K, dtype=dtype, arch="sm_90a", stream_k_parts=parts, epilogue_ops=epi, **kw)
    assert any(lp.stream for n in sched.nodes() for lp in n.loops)
    k = fs.compile(sched, arch="sm_90a")
    assert k.spills == 0
    out = {"f32": torch.float32}.get(kw.get("out_dtype"), tdt)
    A = torch.randn(M, K, device="cuda", dtype=tdt)
    B = torch.randn(K, N, device="cuda", dtype=tdt)
    extra = (torch.randn(N, device="cuda", dtype=tdt),) if epilogue else ()
    ref = A.float() @ B.float()
    if epilogue:
        ref = torch.relu(ref + extra[0].float())
    results = []
    for _ in range(3):
        C = torch.full((M, N), float("nan"), device="cuda", dtype=out)
        k(A, B, *extra, C)
        torch.cuda.synchronize()
        results.append(C)
    tol = 2e-2 * K ** 0.5 if out != torch.float32 else 1e-2 * K ** 0.5 / 8
    err = (results[0].float() - ref).abs().max().item()
    assert err <= tol, (M, N, K, parts, kw, err)
    for r in results[1:]:
        # the same partial sums added in the same order each launch: the same bits
        assert torch.equal(r, results[0]), "stream-K results differ between launches"


@pytest.mark.parametrize("M, N, K, parts, kw", [
    pytest.param(2048, 2048, 2048, 3, dict(block_m=128, block_n=256), id="2048cube-3"),
    pytest.param(3072, 3072, 3072, 2, dict(block_m=128, block_n=256), id="3072cube-2"),
    pytest.param(1000, 1000, 1000, 4, dict(block_m=128, block_n=128), id="1000cube-4"),
    pytest.param(200, 136, 450, 3, dict(block_m=128, block_n=64), id="partial-tiles"),
    pytest.param(127, 4096, 4096, 4, dict(block_m=64, block_n=64), id="127x4096x4096"),
    pytest.param(1024, 1024, 8192, 16, dict(block_m=128, block_n=128), id="long-k-16"),
    pytest.param(384, 512, 640, 2, dict(block_m=192, block_n=128, dtype="bf16", out_dtype="f32"), id="bf16-f32"),
    pytest.param(512, 384, 1024, 3, dict(block_m=128, block_n=128, warp_specialized=False), id="one-role"),
    pytest.param(1000, 1000, 1000, 3, dict(atoms="sm80"), id="sm80-family"),
])
def test_against_torch(M, N, K, parts, kw):
    _run(M, N, K, parts, **kw)


def test_epilogue():
    _run(1000, 1024, 1536, 3, epilogue=True, block_m=128, block_n=128)


def _chunks(K: int, parts: int) -> int:
    """How many chunks stream_k(parts) cuts K into (chunks of ceil(K / parts) rounded up to 64)."""
    chunk = (K + parts - 1) // parts
    chunk = (chunk + 63) // 64 * 64
    return (K + chunk - 1) // chunk


def test_random_schedules():
    rng = random.Random(7)
    for _ in range(10):
        M, N, K = rng.randint(1, 1500), 8 * rng.randint(1, 160), rng.randint(64, 3000)
        chunks = -(-K // 64)
        parts = rng.randint(2, min(8, chunks)) if chunks > 1 else 1
        # parts whose 64-aligned chunks leave none empty
        while parts > 1 and _chunks(K, parts) != parts:
            parts -= 1
        if parts == 1:
            continue
        kw = dict(block_m=rng.choice([64, 128]), block_n=rng.choice([64, 128, 256]),
                  warp_specialized=rng.random() < 0.8)
        _run(M, N, K, parts, **kw)


def test_graph_replays():
    """A captured stream-K launch replays right each time: every launch leaves its flags cleared."""
    M, N, K = 1000, 1000, 1000
    k = fs.compile(fs.recipes.gemm(M, N, K, dtype="f16", arch="sm_90a", block_m=128, block_n=128,
                                   stream_k_parts=4), arch="sm_90a")
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    k.prepare(torch.cuda.current_device(), stream=side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        k(a, b, C=c)
    ref = a.float() @ b.float()
    for _ in range(3):
        c.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert (c.float() - ref).abs().max().item() < 2e-2 * K ** 0.5
