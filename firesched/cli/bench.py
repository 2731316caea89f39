"""``firesched bench``: compile a recipe's schedule and time it on the GPU (CUDA events, the median
of ``--samples`` rounds of ``--reps`` back-to-back launches on random inputs).  Prints one line:
milliseconds, TFLOP/s for a matrix product, and the effective bandwidth (the bytes of every
argument, once, over the time).  It times only; the tests check results.  For careful comparisons
with cuBLAS / torch (inputs rotated past the L2, peers interleaved) use ``bench/`` in the
repository.  Without a GPU (or without torch) it says so and exits with status 1."""

from __future__ import annotations

import argparse
import sys

from firesched import api

from .gpu import NoGPU, arrays_for, default_arch, matmul_flops, require_gpu, time_ms
from .recipe_args import add_recipe_arguments, build_schedule, recipes_help

EXAMPLES = """\
examples:
  firesched bench gemm 4096 4096 4096                 # --arch: the GPU's target by default
  firesched bench gemm 4096 4096 4096 --arch sm_80    # the mma.sync recipe on a Hopper GPU
  firesched bench rmsnorm 16384 8192 --reps 50

recipes (RECIPE DIM...):
"""


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``bench`` to the subcommands."""
    p = sub.add_parser("bench", help="time a recipe on the GPU", description=__doc__,
                       epilog=EXAMPLES + recipes_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_arguments(p, arch_default=None)
    p.add_argument("--reps", type=int, default=20, help="launches per timed sample (default 20)")
    p.add_argument("--samples", type=int, default=10, help="timed samples; the median is reported (default 10)")
    return p


def run(args: argparse.Namespace) -> int:
    """Build, compile, launch and time; one line of results."""
    if args.reps < 1 or args.samples < 1:
        raise ValueError(f"--reps {args.reps} --samples {args.samples}: both must be at least 1")
    args.arch = default_arch(args.arch)
    built = build_schedule(args)        # bad arguments are reported before a missing GPU
    try:
        torch = require_gpu("bench")
    except NoGPU as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    k = api.compile(built.schedule, arch=args.arch)
    xs, ys, nbytes = arrays_for(torch, k)
    ms = time_ms(torch, lambda: k(*xs, *ys), reps=args.reps, samples=args.samples)
    flops = matmul_flops(built.schedule)
    rate = f", {flops / ms / 1e9:.1f} TFLOP/s" if flops else ""
    print(f"{built.describe()} on {torch.cuda.get_device_name()}: {ms * 1e3:.1f} us{rate}, "
          f"{nbytes / ms / 1e9:.3f} TB/s effective (median of {args.samples} x {args.reps} launches)")
    return 0
