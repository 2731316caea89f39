"""GEMM recipes on the GPU against torch: random (odd) shapes, every epilogue, split-K modes,
bad arguments, compile and launch overheads."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

import firesched as fs
from firesched import ops

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TDT = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def _ref(A, B, epi, extras):
    r = A.double() @ B.double()
    for op in epi:
        if isinstance(op, ops.Bias):
            r = r + extras[op.name].double()
        elif isinstance(op, ops.Residual):
            r = r + extras[op.name].double()
        elif isinstance(op, ops.Unary):
            r = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "sigmoid": torch.sigmoid,
                 "tanh": torch.tanh, "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}[op.op](r)
        elif isinstance(op, ops.Scale):
            r = r * op.alpha
    return r


def _run(M, N, K, dt="f16", out=None, epi=(), layout="RR", **kw):
    kw.setdefault("atoms", "sm80")
    sched = fs.recipes.gemm(M, N, K, dtype=dt, arch="sm_90a", out_dtype=out, epilogue_ops=epi, layout=layout, **kw)
    k = fs.compile(sched, arch="sm_90a")
    assert k.spills == 0
    g = torch.Generator(device="cuda").manual_seed(M * 7 + N * 13 + K)
    A = torch.randn(M, K, device="cuda", dtype=TDT[dt], generator=g)
    B = torch.randn(K, N, device="cuda", dtype=TDT[dt], generator=g)
    extras = {}
    for op in epi:
        for e in op.extras():
            shape = (N,) if e.kind == "vector_n" else (M,) if e.kind == "vector_m" else (M, N)
            extras[e.name] = torch.randn(*shape, device="cuda", dtype=TDT[out or dt], generator=g)
    C = torch.full((M, N), float("nan"), device="cuda", dtype=TDT[out or dt])
    Aarg = A.t().contiguous().t() if layout[0] == "C" else A
    Barg = B.t().contiguous().t() if layout[1] == "C" else B
    k(Aarg, Barg, *extras.values(), C)
    torch.cuda.synchronize()
    ref = _ref(A, B, epi, extras)
    err = ((C.double() - ref).norm() / ref.norm()).item()
    assert not torch.isnan(C).any(), "some outputs were never written"
    assert err < (1e-2 if (out or dt) != "f32" else 2e-3), err
    return k


SMALL = dict(atoms="sm80", block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2, stages=3)


@pytest.mark.parametrize("M, N, K", [
    pytest.param(128, 128, 64, id="aligned"),
    pytest.param(1000, 1000, 1000, id="1000cube"),
    pytest.param(257, 383, 129, id="odd-N-K"),
    pytest.param(4095, 4097, 1023, id="unaligned-ld"),
    pytest.param(33, 47, 40, id="tiny-odd"),
])
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_shapes(M, N, K, dt):
    if min(M, N) < 64:
        kw = dict(SMALL, block_m=32, block_n=32)
    elif min(M, N) < 128:
        kw = dict(SMALL)
    else:
        # rows that are not 16-byte aligned take the synchronous copy path, which needs a smaller K tile
        # to stay within the register file (bench/gemm.py chooses the same)
        aligned = K % 8 == 0 and N % 8 == 0
        kw = dict(block_m=128, block_n=128, block_k=32 if aligned else 16, warps_m=2, warps_n=2, stages=4)
    _run(M, N, K, dt, **kw)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("name", sorted(fs.recipes.EPILOGUES))
@pytest.mark.parametrize("out", [None, "f32"])
def test_epilogues(name, out, dt):
    _run(300, 200, 160, dt, out=out, epi=fs.recipes.EPILOGUES[name], **SMALL)


@pytest.mark.parametrize("layout", ["RR", "RC", "CR", "CC"])
def test_layouts(layout):
    _run(192, 160, 96, "bf16", layout=layout, **SMALL)


@pytest.mark.parametrize("kw", [
    pytest.param(dict(split_k_warps=2), id="splitk-warps"),
    pytest.param(dict(split_k_blocks=4), id="splitk-blocks"),
    pytest.param(dict(split_k_blocks=2, split_k_warps=2), id="splitk-both"),
])
def test_split_k(kw):
    _run(200, 136, 1000, "f16", epi=(ops.bias("bias"), ops.relu()), **{**SMALL, **kw})


def test_prologue_relu_on_A():
    sched = fs.recipes.gemm(128, 128, 64, arch="sm_90a", prologue_ops=(ops.relu(),), **SMALL)
    k = fs.compile(sched, arch="sm_90a")
    A = torch.randn(128, 64, device="cuda", dtype=torch.float16)
    B = torch.randn(64, 128, device="cuda", dtype=torch.float16)
    C = torch.empty(128, 128, device="cuda", dtype=torch.float16)
    k(A, B, C)
    ref = torch.relu(A.double()) @ B.double()
    assert ((C.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_random_shapes():
    rng = np.random.default_rng(11)
    for _ in range(6):
        M, N, K = (int(x) for x in rng.integers(64, 700, size=3))
        _run(M, N, K, str(rng.choice(["f16", "bf16"])), **SMALL)


def _bad_args_kernel():
    sched = fs.recipes.gemm(128, 128, 64, arch="sm_90a", **SMALL)
    return fs.compile(sched, arch="sm_90a")


@pytest.mark.parametrize("case, culprit", [("dtype", "A"), ("shape", "B"), ("noncontig", "A"), ("misaligned", "A"),
                                           ("cpu", "A")])
def test_bad_arguments_raise_before_launch(case, culprit):
    k = _bad_args_kernel()
    A = torch.randn(128, 64, device="cuda", dtype=torch.float16)
    B = torch.randn(64, 128, device="cuda", dtype=torch.float16)
    C = torch.zeros(128, 128, device="cuda", dtype=torch.float16)
    if case == "dtype":
        A = A.float()
    elif case == "shape":
        B = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    elif case == "noncontig":
        A = torch.randn(64, 128, device="cuda", dtype=torch.float16).t()
    elif case == "misaligned":
        A = torch.randn(128 * 64 + 1, device="cuda", dtype=torch.float16)[1:].view(128, 64)
    elif case == "cpu":
        A = A.cpu()
    with pytest.raises(ValueError) as ei:
        k(A, B, C)
    assert re.search(rf"\b{culprit}\b", str(ei.value)), str(ei.value)
    torch.cuda.synchronize()
    assert (C == 0).all(), "a rejected call must not launch"


def test_compile_and_launch_overheads(tmp_path, monkeypatch):
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(tmp_path))
    sched = fs.recipes.gemm(2048, 2048, 2048, arch="sm_90a", atoms="sm80", block_m=128, block_n=256, warps_m=2, warps_n=4,
                            stages=4)
    t0 = time.perf_counter()
    k = fs.compile(sched, arch="sm_90a")
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    fs.compile(sched, arch="sm_90a")                        # remembered in this process
    warm = time.perf_counter() - t0
    fs.api._MEMO.clear()                                     # as a fresh process would: the disk cache
    t0 = time.perf_counter()
    k3 = fs.compile(sched, arch="sm_90a")
    disk = time.perf_counter() - t0
    assert all(m.from_cache for m in k3.modules)
    A = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    B = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    C = torch.empty(2048, 2048, device="cuda", dtype=torch.float16)
    for _ in range(5):
        k(A, B, C)
    torch.cuda.synchronize()
    ts = []
    for _ in range(200):
        t0 = time.perf_counter()
        k(A, B, C)
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    launch_us = float(np.median(ts)) * 1e6
    print(f"cold compile {cold:.2f} s, cached compile {warm * 1e3:.2f} ms in process, {disk * 1e3:.1f} ms from "
          f"disk, launch overhead {launch_us:.1f} us")
    assert cold < 3.0
    assert warm < 0.05 and disk < 0.2
    assert launch_us < 20.0
