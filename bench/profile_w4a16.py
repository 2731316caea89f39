"""Run one W4A16 kernel a few times on weights from memory, for a profiler to pick a launch:

    ncu --clock-control none --launch-skip 6 --launch-count 2 -k regex:firesched \\
        --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \\
        --section MemoryWorkloadAnalysis --section SchedulerStats \\
        python bench/profile_w4a16.py 1 4096

Arguments: ``M NK [PARAMS]`` (``N = K = NK``; ``PARAMS`` a ``W4A16Params(...)`` or
``W4A16WgmmaParams(...)`` repr, as ``bench/gemm_w4a16.py --params`` takes; the recipe's plan
without it), f16, group size 128.  The program runs eight times, each launch on another of twelve
copies of the packed weights, so every launch reads them from DRAM.  ``--smoke`` compiles it
without a GPU (what the tests run)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import firesched as fs  # noqa: E402

GROUP = 128
COPIES = 12


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    smoke = "--smoke" in args
    args = [a for a in args if a != "--smoke"]
    if len(args) not in (2, 3):
        raise SystemExit("profile_w4a16: M NK [PARAMS]")
    M, nk = int(args[0]), int(args[1])
    from bench.gemm_w4a16 import parse_params

    params = parse_params(args[2])[0] if len(args) == 3 else None
    sched = fs.recipes.gemm_w4a16(M, nk, nk, group_size=GROUP, arch="sm_90a", params=params)
    k = fs.compile(sched, arch="sm_90a")
    if smoke:
        return k
    import torch

    from firesched.quant import quantize_int4

    q, s, _ = quantize_int4(np.random.default_rng(0).standard_normal((nk, nk)).astype(np.float32), GROUP,
                            signed=False, scale_dtype="f16")
    packs = [torch.from_numpy(fs.recipes.pack_weights(q, sched)).cuda() for _ in range(COPIES)]
    S = torch.from_numpy(np.asarray(s).astype(np.float32)).half().cuda()
    a = torch.randn(M, nk, device="cuda", dtype=torch.float16)
    c = torch.empty(M, nk, device="cuda", dtype=torch.float16)
    k.prepare(0)
    for i in range(8):
        k(a, packs[i % COPIES], S, C=c)
    torch.cuda.synchronize()
    print(f"ran {M}x{nk}x{nk}: {len(k.program.kernels)} kernel(s), {k.spills} bytes of spills", flush=True)
    return k


if __name__ == "__main__":
    main()
