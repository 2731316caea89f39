"""Kernels of every spec kind run once each, for ``compute-sanitizer`` (memcheck, racecheck,
synccheck): batched GEMMs on both atom families (rank-3 tensor maps, a padded operand), a
broadcasting Pointwise, a cast, a transpose through shared memory (and the transpose recipe through
registers, on eight blocks an SM and on persistent blocks with a ring of tiles), row reductions over a warp
(shuffles), over a block (shuffles and shared memory) and across blocks (partial results in a
workspace, a second launch), and the fused MLP whose hidden tile stays in shared memory.

    compute-sanitizer --tool racecheck python bench/sanitize_kinds.py [case ...]

Each case checks its result against torch; the script exits non-zero when one is wrong.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import firesched as fs  # noqa: E402
from firesched.strategies import done, move_to_smem, tile, to_blocks, to_threads, to_warps  # noqa: E402


def _bmm(torch, batch, M, N, K, **kw):
    k = fs.compile(fs.recipes.bmm(batch, M, N, K, arch="sm_90a", **kw), arch="sm_90a")
    A = torch.randn(batch, M, K, device="cuda", dtype=torch.float16)
    B = torch.randn(batch, K, N, device="cuda", dtype=torch.float16)
    C = torch.empty(batch, M, N, device="cuda", dtype=torch.float16)
    k(A, B, C)
    return C.float(), torch.bmm(A.float(), B.float())


def _pointwise(torch):
    spec = fs.Pointwise.kernel("add", {"r": 37, "c": 100}, inputs=[("r", "c"), ("c",)])
    k = fs.compile(spec.schedule(tile(r=4, c=64) >> to_blocks(), tile(r=1, c=8) >> to_threads(), done()), arch="sm_90a")
    X, Y = torch.randn(37, 100, device="cuda", dtype=torch.float16), torch.randn(100, device="cuda", dtype=torch.float16)
    O = torch.empty(37, 100, device="cuda", dtype=torch.float16)
    k(X, Y, O)
    return O.float(), (X + Y).float()


def _cast(torch):
    spec = fs.Move.kernel({"r": 300, "c": 520}, src="f32", dst="bf16")
    k = fs.compile(spec.schedule(tile(r=8, c=64) >> to_blocks(), tile(r=1, c=4) >> to_threads(), done()), arch="sm_90a")
    X = torch.randn(300, 520, device="cuda")
    Y = torch.empty(300, 520, device="cuda", dtype=torch.bfloat16)
    k(X, Y)
    return Y.float(), X.bfloat16().float()


def _transpose(torch):
    spec = fs.Move.kernel({"r": 70, "c": 90}, src="f16", dst_major="r")
    k = fs.compile(spec.schedule(tile(r=32, c=32) >> to_blocks(), move_to_smem("X"), tile(r=8, c=1) >> to_threads(),
                                 done()), arch="sm_90a")
    X = torch.randn(70, 90, device="cuda", dtype=torch.float16)
    Yt = torch.empty(90, 70, device="cuda", dtype=torch.float16)
    k(X, Yt.t())
    return Yt.float(), X.t().float()


def _transpose_recipe(torch, R, C, dtype="f16", **params):
    k = fs.compile(fs.recipes.transpose(R, C, dtype, "sm_90a", params=params or None), arch="sm_90a")
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    X = torch.randn(R, C, device="cuda", dtype=tdt)
    Yt = torch.empty(C, R, device="cuda", dtype=tdt)
    k(X, Yt.t())
    return Yt.float(), X.t().float()


def _reduce_warp(torch):
    spec = fs.Reduce.kernel("max", {"r": 13, "c": 1000}, "c")
    k = fs.compile(spec.schedule(tile(r=4) >> to_blocks(), tile(r=1) >> to_warps(), tile(c=256),
                                 tile(c=8) >> to_threads(), done()), arch="sm_90a")
    X = torch.randn(13, 1000, device="cuda", dtype=torch.float16)
    Y = torch.empty(13, device="cuda")
    k(X, Y)
    return Y, X.float().max(1).values


def _reduce_block(torch):
    spec = fs.Reduce.kernel("sum", {"r": 5, "c": 3000}, "c")
    k = fs.compile(spec.schedule(tile(r=1) >> to_blocks(), tile(c=1024), tile(c=8) >> to_threads(), done()),
                   arch="sm_90a")
    X = torch.randn(5, 3000, device="cuda", dtype=torch.float16)
    Y = torch.empty(5, device="cuda")
    k(X, Y)
    return Y, X.float().sum(1)


def _reduce_across_blocks(torch):
    spec = fs.Reduce.kernel("mean", {"r": 3, "c": 5000}, "c")
    k = fs.compile(spec.schedule(tile(r=1, c=1024) >> to_blocks(), tile(c=256), tile(c=8) >> to_threads(), done()),
                   arch="sm_90a")
    X = torch.randn(3, 5000, device="cuda", dtype=torch.float16)
    Y = torch.empty(3, device="cuda")
    k(X, Y)
    return Y, X.float().mean(1)


def _fused_mlp(torch):
    from test_fused import mlp_schedule

    k = fs.compile(mlp_schedule(200, 96, 64, 72), arch="sm_90a")
    X = torch.randn(200, 96, device="cuda", dtype=torch.float16)
    W1 = torch.randn(96, 64, device="cuda", dtype=torch.float16) / 8
    W2 = torch.randn(64, 72, device="cuda", dtype=torch.float16) / 8
    Y = torch.empty(200, 72, device="cuda", dtype=torch.float16)
    k(X, W1, W2, Y)
    return Y.float(), torch.relu(X.float() @ W1.float()).half().float() @ W2.float()


CASES = {
    "bmm-sm90a": lambda t: _bmm(t, 3, 100, 72, 40),
    "bmm-sm90a-padded": lambda t: _bmm(t, 2, 33, 64, 30),
    "bmm-sm80": lambda t: _bmm(t, 3, 70, 40, 50, atoms="sm80"),
    "pointwise-broadcast": _pointwise,
    "cast": _cast,
    "transpose": _transpose,
    # the recipe through registers; through shared memory on 128-thread blocks eight an SM; on
    # persistent blocks copying their next tiles while they store one
    "transpose-registers": lambda t: _transpose_recipe(t, 136, 200),
    "transpose-occupancy": lambda t: _transpose_recipe(t, 300, 72, "bf16", block_r=128, occupancy=8, staged=True),
    "transpose-ring": lambda t: _transpose_recipe(t, 1000, 520, block_r=32, persistent=True, stages=3),
    "transpose-ring-f32": lambda t: _transpose_recipe(t, 300, 72, "f32", block_r=32, persistent=True, occupancy=2,
                                                      stages=2),
    "reduce-warp": _reduce_warp,
    "reduce-block": _reduce_block,
    "reduce-across-blocks": _reduce_across_blocks,
    "fused-mlp": _fused_mlp,
}


def main():
    import torch

    ok = True
    for name in sys.argv[1:] or list(CASES):
        got, want = CASES[name](torch)
        torch.cuda.synchronize()
        err = ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-6)).item()
        print(f"{name}: relative error {err:.2e}", flush=True)
        ok &= err < 1e-2
    print("all cases correct" if ok else "SOME CASES WRONG")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
