"""One split-K (or stream-K) program launched on several streams at once: each stream has its own
workspace of partial sums, so every result is right (with one workspace per program, the streams'
partial sums overwrote each other)."""

from __future__ import annotations

import pytest

import firesched as fs
from firesched.recipes.gemm import GemmParams

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _program(M=256, N=256, K=8192, parts=8):
    p = GemmParams(block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2, stages=3, split_k_blocks=parts)
    return fs.compile(fs.recipes.gemm(M, N, K, params=p, arch="sm_80"), "sm_80")


def _on_streams(k, M, N, K, streams=4, rounds=50):
    """Launch ``k`` on ``streams`` streams at once, ``rounds`` times, and check every result."""
    streams = [torch.cuda.Stream() for _ in range(streams)]
    ins = [(torch.randn(M, K, device="cuda", dtype=torch.float16),
            torch.randn(K, N, device="cuda", dtype=torch.float16)) for _ in streams]
    outs = [torch.empty(M, N, device="cuda", dtype=torch.float16) for _ in streams]
    torch.cuda.synchronize()
    for _ in range(rounds):
        for s, (a, b), c in zip(streams, ins, outs):
            with torch.cuda.stream(s):
                k(a, b, C=c)
    torch.cuda.synchronize()
    for (a, b), c in zip(ins, outs):
        ref = a.float() @ b.float()
        assert (c.float() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()


def test_split_k_on_four_streams_at_once():
    k = _program()
    _on_streams(k, 256, 256, 8192)
    assert len({key for key in k._workspace if key[2] != 0}) == 4    # one workspace per stream


def test_stream_k_on_two_streams_at_once():
    """Stream-K's partial tiles and flags are a workspace too: each stream has its own."""
    sched = fs.recipes.gemm(2048, 2048, 2048, dtype="f16", arch="sm_90a", block_m=128, block_n=256,
                            stream_k_parts=3)
    k = fs.compile(sched, arch="sm_90a")
    _on_streams(k, 2048, 2048, 2048, streams=2, rounds=20)
    names = {key[0] for key in k._workspace if key[2] != 0}
    assert {"C_partials", "C_flags"} <= names


def test_prepared_stream_is_captured_in_a_graph():
    k = _program(parts=4)
    a = torch.randn(256, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 256, device="cuda", dtype=torch.float16)
    c = torch.empty(256, 256, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    k.prepare(torch.cuda.current_device(), stream=side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        k(a, b, C=c)
    c.zero_()
    g.replay()
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    assert (c.float() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
