"""Tile sweep of ``recipes.fmha`` on the GPU: each ``FmhaParams`` candidate timed interleaved with
SDPA's cuDNN and flash backends (``bench/fmha.py``'s method), to choose ``recipes.fmha.plan``.

    PYTHONPATH=. python bench/fmha_tiles.py --shapes 4x16x4096x128,8x16x2048x64
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import firesched as fs  # noqa: E402
from bench.fmha import gpu_row, parse_shapes  # noqa: E402
from bench.gemm import write_results  # noqa: E402

P = fs.recipes.FmhaParams
CANDIDATES = {
    64: [P(128, 128, 8, 2), P(128, 64, 8, 2), P(64, 128, 4, 2), P(64, 64, 4, 2), P(128, 128, 8, 3), P(128, 64, 4, 2),
         P(64, 64, 2, 2)],
    128: [P(128, 64, 8, 2), P(128, 64, 8, 3), P(64, 64, 4, 2), P(128, 32, 8, 2), P(128, 128, 8, 2), P(64, 32, 4, 2),
          P(128, 32, 4, 2), P(128, 64, 4, 2), P(64, 32, 2, 2), P(128, 16, 4, 2)],
}


WGMMA = [P(128, 128, 8, 2, "wgmma"), P(128, 64, 8, 2, "wgmma"), P(128, 128, 8, 3, "wgmma"), P(192, 128, 12, 2, "wgmma"),
         P(64, 128, 4, 2, "wgmma"), P(128, 176, 8, 2, "wgmma"), P(64, 64, 4, 2, "wgmma"), P(64, 64, 4, 3, "wgmma"),
         P(64, 96, 4, 2, "wgmma"), P(192, 64, 12, 3, "wgmma"), P(128, 96, 8, 3, "wgmma"),
         P(128, 128, 8, 2, "wgmma", True), P(128, 128, 8, 3, "wgmma", True), P(64, 128, 4, 2, "wgmma", True),
         P(128, 64, 8, 3, "wgmma", True), P(64, 64, 4, 3, "wgmma", True), P(192, 128, 12, 2, "wgmma", True),
         P(128, 128, 8, 2, "wgmma", True, True), P(128, 128, 8, 3, "wgmma", True, True),
         P(64, 128, 4, 2, "wgmma", True, True), P(64, 128, 4, 3, "wgmma", True, True),
         P(128, 64, 8, 4, "wgmma", True, True)]


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4x16x4096x128,8x16x2048x64")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wgmma", action="store_true", help="the sm_90a wgmma candidates instead")
    ap.add_argument("--only-tma", action="store_true", help="with --wgmma: the TMA candidates only")
    ap.add_argument("--only-ws", action="store_true", help="with --wgmma: the warp-specialized candidates only")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "fmha-tiles.json"))
    args = ap.parse_args(argv)
    import torch

    rows = []
    for b, h, s, d in parse_shapes(args.shapes):
        cands = ([p for p in WGMMA if (p.tma or not args.only_tma) and (p.warp_specialized or not args.only_ws)]
                 if args.wgmma else CANDIDATES.get(d, CANDIDATES[128]))
        for p in cands:
            try:
                row = gpu_row(torch, b, h, s, d, "f16", args.causal, args.rounds, params=p)
            except fs.ScheduleError as e:
                print(f"{b}x{h}x{s}x{d} {p}: refused ({str(e).splitlines()[0][:80]})")
                continue
            rows.append(row)
            print(f"{b}x{h}x{s}x{d} {p}: {row['ours_tflops']:.1f} TFLOP/s, {row['ratio_flash']:.2f}x flash, "
                  f"{row['ratio_cudnn']:.2f}x cuDNN, {row['registers']} regs, err {row['max_abs_err']:.1e}", flush=True)
    write_results(args.out, {"command": " ".join(sys.argv)}, rows)
    return rows


if __name__ == "__main__":
    main()
