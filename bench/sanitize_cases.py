"""Representative kernels run once each, for ``compute-sanitizer`` (memcheck, racecheck, synccheck).

    compute-sanitizer --tool memcheck python bench/sanitize_cases.py

Each case compiles a recipe variant, runs it on random inputs and checks the result against torch,
so the sanitizer sees real launches of: a pipelined GEMM with partial tiles, the unaligned
(synchronous copy) path, split-K across warps (shared-memory reduction), split-K across blocks
(workspace + reduction kernel), a fused bias+GELU epilogue with f32 output, and column-major
operands (transposed ldmatrix); and the Hopper path: plain, warp-specialized + persistent with a
fused epilogue and TMA stores, with direct stores (C rows not a multiple of 16 bytes), clusters,
split-K across blocks, rings deeper than eight stages, four consumer warpgroups, the swapped
mid-M default and clusters of four along N.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import firesched as fs  # noqa: E402
from firesched import ops  # noqa: E402

SMALL = dict(atoms="sm80", block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2, stages=3)
CASES = {
    "pipelined-partial": dict(M=200, N=136, K=96, kw=dict(SMALL)),
    "unaligned-rows": dict(M=130, N=67, K=45, kw=dict(SMALL)),
    "splitk-warps": dict(M=128, N=128, K=256, kw=dict(SMALL, split_k_warps=2)),
    "splitk-blocks": dict(M=128, N=96, K=512, kw=dict(SMALL, split_k_blocks=4,
                                                      epilogue_ops=(ops.bias("bias"), ops.relu()))),
    "bias-gelu-f32": dict(M=192, N=160, K=64, kw=dict(SMALL, out_dtype="f32",
                                                      epilogue_ops=(ops.bias("bias"), ops.gelu()))),
    "column-major": dict(M=128, N=128, K=64, kw=dict(SMALL, layout="CC")),
    "big-tile": dict(M=256, N=512, K=128, kw=dict(atoms="sm80", block_m=128, block_n=256, block_k=32, warps_m=2, warps_n=4,
                                                  stages=4)),
    # Hopper: TMA + mbarrier ring + wgmma; warp-specialized and persistent with the TMA-store epilogue
    "hopper-plain": dict(M=200, N=136, K=304, kw=dict(atoms="sm90a", block_m=128, block_n=64)),
    "hopper-ws-persistent-bias-relu": dict(M=1000, N=1032, K=264, kw=dict(
        atoms="sm90a", block_m=128, block_n=64, stages=3, group_m=4, warp_specialized=True, persistent=True,
        epilogue_ops=(ops.bias("bias"), ops.relu()))),
    "hopper-ws-direct-store": dict(M=300, N=100, K=136, kw=dict(
        atoms="sm90a", block_m=128, block_n=64, layout="RC", warp_specialized=True, persistent=True)),
    # clusters of two blocks sharing B by TMA multicast; 5 M tiles, so the last cluster's second
    # block has no tile of its own
    "hopper-cluster-persistent-bias-relu": dict(M=300, N=520, K=200, kw=dict(
        atoms="sm90a", block_m=64, block_n=128, stages=3, group_m=4, warp_specialized=True, persistent=True,
        cluster=2, epilogue_ops=(ops.bias("bias"), ops.relu()))),
    # split-K across blocks on the Hopper path: f32 parts in a workspace, a second kernel adds them
    # in a fixed order and applies the epilogue; K = 1000 leaves the last part a partial K tile
    "hopper-splitk-ws-persistent-bias-relu": dict(M=200, N=136, K=1000, kw=dict(
        atoms="sm90a", block_m=128, block_n=64, stages=4, split_k_blocks=3, warp_specialized=True,
        persistent=True, epilogue_ops=(ops.bias("bias"), ops.relu()))),
    "hopper-splitk-64-rows": dict(M=100, N=192, K=2048, kw=dict(
        atoms="sm90a", block_m=64, block_n=64, stages=6, split_k_blocks=8, warp_specialized=True,
        persistent=False)),
    # a ring deeper than eight stages (mbarrier phases wrap several times per block) and one of
    # cp.async groups twelve deep
    "hopper-deep-ring-cluster": dict(M=128, N=256, K=1000, kw=dict(
        atoms="sm90a", block_m=64, block_n=64, stages=13, warp_specialized=True, cluster=2)),
    "deep-cp-async-ring": dict(M=100, N=72, K=1000, kw=dict(SMALL, stages=12)),
    # stream-K: 12 tiles x 3 chunks over the H100's 132 SMs (every tile shared by three blocks,
    # partial tiles through the workspace and flags), and 1000^3 in 64 x 64 tiles (many steps a
    # block, whole tiles first), the epilogue on the finished tiles
    "hopper-stream-k-bias-relu": dict(M=300, N=520, K=1000, kw=dict(
        atoms="sm90a", block_m=128, block_n=128, stages=4, stream_k_parts=3, warp_specialized=True,
        epilogue_ops=(ops.bias("bias"), ops.relu()))),
    "hopper-stream-k-many-steps": dict(M=1000, N=1000, K=1000, kw=dict(
        atoms="sm90a", block_m=64, block_n=64, stages=6, stream_k_parts=4, warp_specialized=True)),
    "stream-k-sm80-atoms": dict(M=1000, N=1000, K=1000, kw=dict(SMALL, stream_k_parts=3)),
    # Cᵀ = Bᵀ Aᵀ for a small M (B column-major), the bias down the accumulator's rows
    "hopper-swap-ab-bias-relu": dict(M=13, N=1000, K=999, kw=dict(
        atoms="sm90a", swap_ab=True, block_m=16, block_n=128, stages=6, layout="RC",
        epilogue_ops=(ops.bias("bias"), ops.relu()))),
    # four consumer warpgroups and the producer: 640 threads, setmaxnreg to 104 / 40
    # the mid-M default: M = 100 on the wgmma's N side in 104 (rows past A), a 10-deep ring
    "hopper-swap-ab-mid-m": dict(M=100, N=520, K=1000, kw=dict(
        atoms="sm90a", swap_ab=True, block_m=104, block_n=64, stages=10, warp_specialized=True,
        persistent=False)),
    # quads of blocks on consecutive N tiles multicasting A, the last quad partly past N
    "hopper-cluster-along-n": dict(M=100, N=900, K=500, kw=dict(
        atoms="sm90a", block_m=128, block_n=64, stages=4, warp_specialized=True, persistent=True, cluster=4,
        cluster_along="n")),
    "hopper-four-consumers": dict(M=600, N=520, K=264, kw=dict(
        atoms="sm90a", block_m=256, block_n=128, warp_specialized=True, persistent=True)),
}


def run_case(torch, name):
    c = CASES[name]
    M, N, K, kw = c["M"], c["N"], c["K"], c["kw"]
    sched = fs.recipes.gemm(M, N, K, arch="sm_90a", **kw)
    k = fs.compile(sched, arch="sm_90a")
    out_dt = {"f32": torch.float32}.get(kw.get("out_dtype"), torch.float16)
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    B = torch.randn(K, N, device="cuda", dtype=torch.float16)
    extras = []
    ref = A.double() @ B.double()
    for op in kw.get("epilogue_ops", ()):
        if isinstance(op, ops.Bias):
            b = torch.randn(N, device="cuda", dtype=out_dt)
            extras.append(b)
            ref = ref + b.double()
        elif isinstance(op, ops.Unary):
            ref = {"relu": torch.relu, "gelu": torch.nn.functional.gelu}[op.op](ref)
    C = torch.empty(M, N, device="cuda", dtype=out_dt)
    lay = kw.get("layout", "RR")
    Aa = A.t().contiguous().t() if lay[0] == "C" else A
    Ba = B.t().contiguous().t() if lay[1] == "C" else B
    k(Aa, Ba, *extras, C)
    torch.cuda.synchronize()
    err = ((C.double() - ref).norm() / ref.norm()).item()
    print(f"{name}: relative error {err:.2e}", flush=True)
    return err < 1e-2


def main():
    import torch

    names = sys.argv[1:] or list(CASES)
    ok = all([run_case(torch, n) for n in names])
    print("all cases correct" if ok else "SOME CASES WRONG")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
