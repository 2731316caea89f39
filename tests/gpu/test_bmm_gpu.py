"""``recipes.bmm`` on the GPU against ``torch.bmm`` / ``torch.matmul``: both atom families, odd
shapes, broadcast operands, and random shapes from batch 1 to 512."""

from __future__ import annotations

import random

import pytest

import firesched as fs

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _run(batch, M, N, K, arch, a_b=True, b_b=True, dtype="f16", **kw):
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    sched = fs.recipes.bmm(batch, M, N, K, dtype=dtype, arch=arch, a_batched=a_b, b_batched=b_b, **kw)
    k = fs.compile(sched, arch="sm_90a")
    A = torch.randn(*((batch, M, K) if a_b else (M, K)), device="cuda", dtype=tdt)
    B = torch.randn(*((batch, K, N) if b_b else (K, N)), device="cuda", dtype=tdt)
    C = torch.full((batch, M, N), float("nan"), device="cuda", dtype=tdt)
    k(A, B, C)
    ref = torch.matmul(A.float(), B.float()).expand(batch, M, N)
    err = ((C.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()
    assert err < 1e-2, (batch, M, N, K, arch, kw, err)


@pytest.mark.parametrize("arch, kw", [("sm_90a", {}), ("sm_90a", dict(atoms="sm80"))], ids=["wgmma", "mma.sync"])
@pytest.mark.parametrize("batch, M, N, K, a_b, b_b", [
    (8, 512, 512, 64, True, True), (3, 100, 72, 40, True, True), (2, 64, 128, 64, False, True),
    (3, 70, 136, 96, True, False), (2, 33, 64, 30, True, True), (512, 64, 64, 64, True, True),
    (1, 1, 8, 8, True, True),
])
def test_bmm_matches_torch(arch, kw, batch, M, N, K, a_b, b_b):
    _run(batch, M, N, K, arch, a_b, b_b, **kw)


@pytest.mark.parametrize("seed", range(12))
def test_random_bmm_shapes(seed):
    rnd = random.Random(seed)
    batch = rnd.choice([1, 2, 3, 7, 16, 64, 512])
    M, N, K = (rnd.randint(1, 300) for _ in range(3))
    if batch * M * N > 4_000_000:
        batch = max(1, 4_000_000 // (M * N))
    _run(batch, M, N, K, "sm_90a", rnd.random() < 0.8, rnd.random() < 0.8, dtype=rnd.choice(["f16", "bf16"]),
         **({} if seed % 3 else dict(atoms="sm80")))
