"""Run ``recipes.gemm_w4a16`` kernels once each (odd M and N, every group size, signed and
unsigned codes, per-group zero points, f16 and bf16, split-K, the 16-byte and the 4-byte word
loads, a prefetched multi-step K tile, the sm_90a wgmma family with the weights dequantised into
its A fragment, with and without a TMA producer warpgroup (whose ring stages the scales), stream-K,
split-K added in the kernel (``fixup``), the small-M plan's 64-column tiles with 256 and 512 k a
stage, split-K in a thread-block cluster, warps sharing a K tile, consumer warpgroups sharing one,
group scales on the partial products, the default plans' K parts added in a cluster), for
compute-sanitizer:

    compute-sanitizer --tool memcheck  python bench/sanitize_w4a16.py
    compute-sanitizer --tool racecheck python bench/sanitize_w4a16.py
    compute-sanitizer --tool synccheck python bench/sanitize_w4a16.py
    compute-sanitizer --tool memcheck  python bench/sanitize_w4a16.py -2 -1   # some cases (indices of CASES)
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import firesched as fs  # noqa: E402
from firesched.quant import quantize_int4  # noqa: E402
from firesched.recipes.w4a16 import W4A16Params, W4A16WgmmaParams  # noqa: E402

CASES = [  # M, N, K, group_size, signed, dtype, params
    (1, 1000, 4096, 128, False, "f16", None), (17, 72, 96, 32, True, "bf16", None),
    (64, 520, 2048, 64, False, "f16", None), (130, 256, 1024, None, True, "f16", None),
    (20, 40, 640, 64, False, "f16", W4A16Params(block_m=32, block_n=32, block_k=64, warps_m=2, warps_n=2,
                                                warp_k=32, stages=3)),
    (9, 264, 1024, 32, False, "f16", "zero_point"), (3, 72, 512, 128, True, "bf16", "zero_point"),
    (100, 200, 1024, 64, False, "f16", W4A16WgmmaParams(block_m=104, block_n=128, block_k=64, stages=3)),
    (300, 520, 2048, 128, True, "bf16", W4A16WgmmaParams(block_m=128, block_n=192, block_k=128, stages=4)),
    (9, 264, 1024, None, False, "f16", W4A16WgmmaParams(block_m=16, block_n=64, block_k=128, stages=2, split_k=2)),
    (300, 520, 2048, 64, False, "f16", W4A16WgmmaParams(block_m=128, block_n=128, block_k=128, stages=3,
                                                        producer=True, pingpong=True)),
    (17, 200, 1024, 32, True, "bf16", W4A16WgmmaParams(block_m=24, block_n=64, block_k=64, stages=4, producer=True)),
    (600, 264, 1024, 32, False, "f16", None),
    (5, 1000, 4096, 128, False, "f16", W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=4,
                                                   stream_k=6)),
    # split-K added in the kernel by the last part's block (a counter a tile), both families
    (3, 1000, 4096, 128, False, "f16", W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=4,
                                                   split_k=4, fixup=True)),
    (40, 520, 2048, 64, True, "bf16", W4A16WgmmaParams(block_m=40, block_n=128, block_k=128, stages=4, split_k=4,
                                                       fixup=True, producer=True)),
    # the small-M plan's wgmma tiles: 64 columns, 512 or 256 k a stage, a ring refilled after release
    (16, 520, 4096, 32, False, "f16", W4A16WgmmaParams(block_m=16, block_n=64, block_k=512, stages=2, producer=True)),
    (33, 1000, 2048, 128, True, "bf16", W4A16WgmmaParams(block_m=40, block_n=64, block_k=256, stages=2, split_k=2,
                                                         producer=True)),
    # split-K in a thread-block cluster (the lower parts push into the top part's shared memory)
    (5, 1000, 4096, 128, False, "f16", W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=4,
                                                   split_k=4, cluster_combine=True)),
    (16, 520, 2048, 64, False, "bf16", W4A16WgmmaParams(block_m=16, block_n=64, block_k=256, stages=2, split_k=2,
                                                        producer=True, cluster_combine=True)),
    # warps sharing a K tile (their partial sums added through shared memory), alone and split
    (7, 1000, 4096, 128, False, "f16", W4A16Params(block_m=16, block_n=32, block_k=512, warps_n=2, warp_k=128,
                                                   warps_k=4, stages=4)),
    (16, 264, 2048, 64, True, "bf16", W4A16Params(block_m=16, block_n=16, block_k=256, warps_n=1, warp_k=64,
                                                  warps_k=4, stages=3, split_k=2)),
    # the codes straight from global memory on a ring of registers (an odd N: the last columns'
    # words are not read), split over blocks, and with warps sharing the K part
    (5, 1000, 4096, 128, False, "f16", W4A16Params(block_m=16, block_n=64, block_k=1024, warps_n=4, warp_k=128,
                                                   stages=8, split_k=4, direct=True)),
    (16, 264, 2048, 32, True, "bf16", W4A16Params(block_m=16, block_n=32, block_k=2048, warps_n=2, warp_k=128,
                                                  warps_k=4, stages=3, direct=True)),
    # consumer warpgroups sharing each K tile (split_k across warpgroups), with a producer: two
    # parts on two column groups, and four parts with K split over blocks too
    (5, 1000, 4096, 128, False, "f16", W4A16WgmmaParams(block_m=8, block_n=128, block_k=512, stages=3,
                                                        producer=True, warpgroups_k=2)),
    (16, 264, 2048, 64, True, "bf16", W4A16WgmmaParams(block_m=16, block_n=64, block_k=256, stages=2, split_k=2,
                                                       producer=True, warpgroups_k=4)),
    # the small-M plans of wide weights (w4a16.WIDE_WGMMA_K, WIDE_COLUMN_WAVES, SHORT_K_STAGES): 128
    # columns of the wgmma family in one wave, 128 columns on 8 warps, K tiles of 64 split in four
    (1, 11008, 1024, 128, False, "f16", None), (16, 17024, 256, 128, False, "f16", None),
    (1, 4096, 2176, 128, False, "f16", None),
    # consumer warpgroups sharing each K tile where K is not split (w4a16.SHARED_K_CONSUMERS): four
    # with zero points, two of 40 rows with signed codes
    (16, 8200, 1024, 64, False, "f16", "zero_point"), (40, 8200, 1024, 128, True, "bf16", None),
    # group scales on the partial products (scale_partials): one copy a consumer of four sharing K,
    # and eight copies (groups of 32 in a 256-k tile) with K split over blocks
    (1, 8200, 1024, 128, False, "f16", W4A16WgmmaParams(block_m=8, block_n=64, block_k=512, stages=4, producer=True,
                                                        warpgroups_k=4, scale_partials=True)),
    (13, 1000, 2048, 32, True, "bf16", W4A16WgmmaParams(block_m=16, block_n=128, block_k=256, stages=3, split_k=2,
                                                        producer=True, scale_partials=True)),
    (16, 8200, 1024, 128, True, "bf16", None),     # the bf16 plan up to M = 16: four consumers, partials
    # the default plans that add two K parts in a cluster, their scales staged by the ring
    # (w4a16.CLUSTER_SPLITS), one with zero points; a stream-K tile whose ring stages its scales
    (64, 4096, 4096, 128, False, "f16", None), (24, 4096, 2048, 64, True, "bf16", "zero_point"),
    (1, 4096, 11008, 128, False, "f16", None), (13, 4096, 4096, 32, True, "bf16", "zero_point"),
    (16, 1000, 4096, 128, False, "f16", W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64,
                                                    stages=4, stream_k=4)),
]


def main(argv=None) -> None:
    import torch

    picked = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}
    for M, N, K, gs, signed, dt, p in ([CASES[i] for i in picked] if picked else CASES):
        zp = p == "zero_point"
        sched = fs.recipes.gemm_w4a16(M, N, K, group_size=gs, signed=signed, dtype=dt, arch="sm_90a",
                                      params=None if zp else p, zero_point=zp)
        k = fs.compile(sched, arch="sm_90a")
        q, s, z = quantize_int4(np.random.default_rng(0).standard_normal((K, N)), gs, signed=signed, zero_point=zp,
                                scale_dtype=dt)
        b = torch.from_numpy(fs.recipes.pack_weights(q, sched)).cuda()
        sc = torch.from_numpy(np.asarray(s).astype(np.float32)).to(tdt[dt]).cuda()
        zs = (torch.from_numpy(np.asarray(z).astype(np.float32)).to(tdt[dt]).cuda(),) if zp else ()
        c = k(torch.randn(M, K, device="cuda", dtype=tdt[dt]), b, sc, *zs)
        torch.cuda.synchronize()
        print(f"{M}x{N}x{K} group {gs} signed={signed} {dt}: ok, finite={bool(torch.isfinite(c).all())}")


if __name__ == "__main__":
    main()
