"""The fused MLP ``relu(X W1) W2`` (hidden tile in shared memory) on the GPU against torch."""

from __future__ import annotations

import os
import sys

import pytest

import firesched as fs

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from test_fused import mlp_schedule  # noqa: E402


@pytest.mark.parametrize("M, K, Hd, N", [(200, 96, 64, 72), (4096, 512, 64, 128), (130, 48, 64, 40)])
def test_fused_mlp_matches_torch(M, K, Hd, N):
    k = fs.compile(mlp_schedule(M, K, Hd, N), arch="sm_90a")
    X = torch.randn(M, K, device="cuda", dtype=torch.float16)
    W1 = torch.randn(K, Hd, device="cuda", dtype=torch.float16) / 8
    W2 = torch.randn(Hd, N, device="cuda", dtype=torch.float16) / 8
    Y = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    k(X, W1, W2, Y)
    ref = torch.relu(X.float() @ W1.float()).half().float() @ W2.float()
    assert ((Y.float() - ref).norm() / ref.norm()).item() < 1e-2
