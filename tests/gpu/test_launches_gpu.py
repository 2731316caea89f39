"""Programmatic launches on the GPU (``lower.transforms.launches``): on sm_90a every program's first
kernel overlaps the launch before it and waits for it before touching memory, and its last kernel
lets the next launch start early.  Each case chains launches that read what the one before wrote,
without a synchronization between them, eagerly and in a CUDA graph, and compares with torch:
ours after ours (both programmatic), ours after a torch kernel (which never lets the next start),
a torch kernel after ours, and a split-K product (two kernels, chained on request) after a copy
into its input."""

from __future__ import annotations

import pytest

import firesched as fs

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

R, C = 2048, 4096


def _kernels():
    cast = fs.compile(fs.recipes.cast((R, C), src="f32", dst="bf16", arch="sm_90a"), arch="sm_90a")
    norm = fs.compile(fs.recipes.layernorm(R, C, dtype="bf16", arch="sm_90a"), arch="sm_90a")
    assert cast.program.kernels[0].programmatic and norm.program.kernels[0].programmatic
    return cast, norm


def _ref(x, w, b):
    return torch.nn.functional.layer_norm(x.to(torch.bfloat16).float(), (C,), w.float(), b.float(), 1e-5)


def _check(y, ref):
    err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
    assert err < 3e-2, err


@pytest.mark.parametrize("graph", [False, True])
def test_ours_after_ours(graph):
    """cast (f32 -> bf16) then LayerNorm of its output, rounds of new inputs, no sync between."""
    cast, norm = _kernels()
    w, b = torch.randn(C, device="cuda", dtype=torch.bfloat16), torch.randn(C, device="cuda", dtype=torch.bfloat16)
    xs = [torch.randn(R, C, device="cuda") * (i + 1) for i in range(4)]
    h = torch.empty(R, C, device="cuda", dtype=torch.bfloat16)
    ys = [torch.full((R, C), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in xs]

    def step():
        for x, y in zip(xs, ys):
            cast(x, h)
            norm(h, w, b, y)

    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        for y in ys:
            y.fill_(float("nan"))
        g.replay()
    else:
        step()
    torch.cuda.synchronize()
    for x, y in zip(xs, ys):
        _check(y, _ref(x, w, b))


def test_ours_after_torch_and_torch_after_ours():
    _, norm = _kernels()
    w, b = torch.randn(C, device="cuda", dtype=torch.bfloat16), torch.randn(C, device="cuda", dtype=torch.bfloat16)
    h = torch.empty(R, C, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(R, C, device="cuda", dtype=torch.bfloat16)
    outs = []
    xs = [torch.randn(R, C, device="cuda") for _ in range(6)]
    for x in xs:
        h.copy_(x)                     # a torch kernel writes the input ...
        norm(h, w, b, y)               # ... ours reads it at once
        outs.append(y * 1)             # a torch kernel reads our output at once
    torch.cuda.synchronize()
    for x, o in zip(xs, outs):
        _check(o, _ref(x, w, b))


def test_split_k_after_a_copy_into_its_input():
    """A two-kernel program (split-K product, then its reduction) chained after a copy into A."""
    M, N, K = 256, 384, 4096
    k = fs.compile(fs.recipes.gemm(M, N, K, "f16", "sm_90a", split_k_blocks=4, block_m=64, block_n=64),
                   arch="sm_90a", programmatic=True)      # a persistent grid: chained only when asked
    assert len(k.program.kernels) == 2 and all(kk.programmatic for kk in k.program.kernels)
    a = torch.empty(M, K, device="cuda", dtype=torch.float16)
    bm = torch.randn(K, N, device="cuda", dtype=torch.float16)
    srcs = [torch.randn(M, K, device="cuda", dtype=torch.float16) for _ in range(4)]
    cs = [torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16) for _ in srcs]
    for s, c in zip(srcs, cs):
        a.copy_(s)
        k(a, bm, c)
    torch.cuda.synchronize()
    for s, c in zip(srcs, cs):
        ref = s.float() @ bm.float()
        assert ((c.float() - ref).abs().max() / ref.abs().max()).item() < 1e-2
