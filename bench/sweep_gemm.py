"""Time several GEMM recipe configurations next to cuBLAS on one shape (same process).

    PYTHONPATH=. python bench/sweep_gemm.py 4096 4096 4096 [--dtype f16]

Prints one line per configuration: TFLOP/s, ratio to ``torch.matmul``, registers, shared memory.
Used to choose ``bench/gemm.py``'s per-shape parameters; the configurations are listed below.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import firesched as fs  # noqa: E402
from bench.gemm import time_ms  # noqa: E402

CONFIGS = [
    dict(atoms="sm80", block_m=128, block_n=128, block_k=64, warps_m=2, warps_n=2, stages=3, group_m=8, prefetch=False),
    dict(atoms="sm80", block_m=128, block_n=256, block_k=32, warps_m=2, warps_n=4, stages=4, group_m=8),
    dict(atoms="sm80", block_m=128, block_n=256, block_k=32, warps_m=2, warps_n=4, stages=5, group_m=8),
    dict(atoms="sm80", block_m=128, block_n=256, block_k=32, warps_m=2, warps_n=4, stages=6, group_m=4),
    dict(atoms="sm80", block_m=256, block_n=128, block_k=32, warps_m=4, warps_n=2, stages=4, group_m=8),
    dict(atoms="sm80", block_m=256, block_n=128, block_k=32, warps_m=4, warps_n=2, stages=5, group_m=4),
    dict(atoms="sm80", block_m=256, block_n=128, block_k=32, warps_m=4, warps_n=2, stages=6, group_m=8),
    dict(atoms="sm80", block_m=256, block_n=128, block_k=32, warps_m=4, warps_n=2, stages=5, group_m=16),
    dict(atoms="sm80", block_m=256, block_n=128, block_k=32, warps_m=4, warps_n=2, stages=4, group_m=16),
    dict(atoms="sm80", block_m=256, block_n=128, block_k=64, warps_m=4, warps_n=2, stages=3, group_m=16),
    dict(atoms="sm80", block_m=256, block_n=128, block_k=64, warps_m=4, warps_n=2, stages=4, group_m=16),
    dict(atoms="sm80", block_m=128, block_n=256, block_k=64, warps_m=2, warps_n=4, stages=3, group_m=16),
    dict(atoms="sm80", block_m=128, block_n=256, block_k=32, warps_m=2, warps_n=4, stages=5, group_m=16),
    # four warps of 64x64 and at most 64 KiB of shared memory: two blocks per SM hide each other's
    # barriers and epilogues
    dict(atoms="sm80", block_m=128, block_n=128, block_k=32, warps_m=2, warps_n=2, stages=4, group_m=16),
    dict(atoms="sm80", block_m=128, block_n=128, block_k=32, warps_m=2, warps_n=2, stages=3, group_m=16),
    dict(atoms="sm80", block_m=128, block_n=128, block_k=64, warps_m=2, warps_n=2, stages=2, group_m=16),
]

#: Hopper (``--atoms sm90a``): TMA + wgmma, with and without warp specialization / persistence /
#: clusters (``cluster=1`` explicit: the recipe's default pairs blocks on large problems)
CONFIGS_SM90 = [
    dict(atoms="sm90a", block_m=128, block_n=256, stages=4, group_m=8, warp_specialized=False, cluster=1),
    dict(atoms="sm90a", block_m=128, block_n=256, stages=4, group_m=8, warp_specialized=True, persistent=False, cluster=1),
    dict(atoms="sm90a", block_m=128, block_n=256, stages=3, group_m=8, warp_specialized=True, persistent=True, cluster=1),
    dict(atoms="sm90a", block_m=128, block_n=256, stages=4, group_m=8, warp_specialized=True, persistent=True, cluster=1),
    dict(atoms="sm90a", block_m=128, block_n=256, stages=4, group_m=16, warp_specialized=True, persistent=True, cluster=1),
    dict(atoms="sm90a", block_m=128, block_n=128, stages=6, group_m=8, warp_specialized=True, persistent=True, cluster=1),
    dict(atoms="sm90a", block_m=192, block_n=128, stages=4, group_m=8, warp_specialized=True, persistent=True, cluster=1),
    dict(atoms="sm90a", block_m=128, block_n=192, stages=4, group_m=8, warp_specialized=True, persistent=True, cluster=1),
    dict(atoms="sm90a", block_m=128, block_n=128, stages=4, group_m=8, warp_specialized=True, persistent=True, cluster=1),
    # clusters of two blocks on consecutive M tiles, sharing B through TMA multicast
    dict(atoms="sm90a", block_m=128, block_n=256, stages=4, group_m=8, warp_specialized=True, persistent=True,
         cluster=2),
    dict(atoms="sm90a", block_m=128, block_n=256, stages=4, group_m=16, warp_specialized=True, persistent=True,
         cluster=2),
    dict(atoms="sm90a", block_m=128, block_n=256, stages=4, group_m=8, warp_specialized=True, persistent=False,
         cluster=2),
    dict(atoms="sm90a", block_m=128, block_n=128, stages=6, group_m=8, warp_specialized=True, persistent=True,
         cluster=2),
]

#: Small M (``--atoms small``): the default recipe, then mma.sync tiles of 16 to 64 rows that
#: stream B, the K loop split over blocks so that enough blocks read B at once
CONFIGS_SMALL = [dict()] + [
    dict(atoms="sm80", block_m=bm, block_n=bn, warps_m=wm, warps_n=wn, block_k=bk, stages=st, split_k_blocks=sk)
    for bm, bn, wm, wn, bk, st, sk in (
        (16, 64, 1, 2, 128, 4, 1), (16, 64, 1, 2, 128, 4, 2), (16, 64, 1, 2, 128, 4, 4),
        (16, 128, 1, 4, 128, 4, 2), (16, 128, 1, 4, 128, 4, 4), (16, 128, 1, 4, 128, 4, 8),
        (16, 128, 1, 4, 64, 6, 4), (16, 256, 1, 4, 64, 4, 4), (16, 256, 1, 4, 64, 4, 8),
        (32, 128, 2, 2, 64, 4, 4), (64, 128, 2, 2, 64, 4, 2), (64, 128, 2, 2, 64, 4, 4))]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("M", type=int)
    p.add_argument("N", type=int)
    p.add_argument("K", type=int)
    p.add_argument("--dtype", default="f16")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--samples", type=int, default=7)
    p.add_argument("--atoms", default="sm80", choices=("sm80", "sm90a", "small"), help="which configuration list")
    p.add_argument("--only", default="", help="comma-separated indices into the configuration list")
    p.add_argument("--rounds", type=int, default=1,
                   help="interleave: time every configuration (and the peer) once per round, report the "
                        "median over rounds (drifting clocks then affect all configurations alike)")
    p.add_argument("--fused", action="store_true",
                   help="GEMM + bias + ReLU, against cuBLASLt's fused epilogue (torch._addmm_activation)")
    args = p.parse_args(argv)
    import torch

    M, N, K = args.M, args.N, args.K
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    A = torch.randn(M, K, device="cuda", dtype=tdt)
    B = torch.randn(K, N, device="cuda", dtype=tdt)
    C = torch.empty(M, N, device="cuda", dtype=tdt)
    bias = torch.randn(N, device="cuda", dtype=tdt)
    flops = 2.0 * M * N * K
    if args.fused:
        peer, name = (lambda i: torch._addmm_activation(bias, A, B, use_gelu=False)), "cuBLASLt bias+relu"
        ref = torch.relu(A.float() @ B.float() + bias.float())
        epi, extra = (fs.ops.bias("bias"), fs.ops.relu()), (bias,)
    else:
        peer, name = (lambda i: torch.matmul(A, B)), "cuBLAS"
        ref = A.float() @ B.float()
        epi, extra = (), ()
    configs = {"sm90a": CONFIGS_SM90, "small": CONFIGS_SMALL}.get(args.atoms, CONFIGS)
    if args.only:
        configs = [configs[int(i)] for i in args.only.split(",")]
    kernels = []
    for cfg in configs:
        try:
            sched = fs.recipes.gemm(M, N, K, dtype=args.dtype, arch="sm_90a", epilogue_ops=epi, **cfg)
            k = fs.compile(sched, arch="sm_90a")
        except fs.FireschedError as e:
            print(f"  {cfg}: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        k(A, B, *extra, C)
        kernels.append((cfg, k, ((C.float() - ref).norm() / ref.norm()).item()))
    t_peer, times = [], [[] for _ in kernels]
    for _ in range(max(1, args.rounds)):
        t_peer.append(time_ms(torch, peer, args.reps, args.samples))
        for j, (_, k, _) in enumerate(kernels):
            times[j].append(time_ms(torch, lambda i, k=k: k(A, B, *extra, C), args.reps, args.samples))
    t_cb = sorted(t_peer)[len(t_peer) // 2]
    rounds = f", median of {len(t_peer)} interleaved rounds" if len(t_peer) > 1 else ""
    print(f"{M}x{N}x{K} {args.dtype}: {name} {flops / t_cb / 1e9:.0f} TFLOP/s{rounds}", flush=True)
    for (cfg, k, err), ts in zip(kernels, times):
        t = sorted(ts)[len(ts) // 2]
        regs = max(r.registers for r in k.resources.values())
        print(f"  {flops / t / 1e9:6.1f} TFLOP/s  ratio {t_cb / t:.2f}  regs {regs}  smem "
              f"{k.program.kernels[0].shared_bytes // 1024} KiB  err {err:.1e}  {cfg}", flush=True)


if __name__ == "__main__":
    main()
