"""``firesched tune``: walk the sm_80-atom GEMM recipe's parameter space (``recipes.gemm_space``:
block tile, warps, K tile, stages, split-K) for one problem and list the candidates whose schedule
passes ``check`` for the target.  With a GPU (and torch) each candidate is also compiled and timed
(as ``firesched bench`` times) and the fastest is reported with the command that reproduces it.
This is a plain search over the recipe's own space, not a model-guided autotuner; the Hopper
(wgmma) recipe's parameters are not searched."""

from __future__ import annotations

import argparse
import sys
import time

from firesched import api, recipes

from .gpu import NoGPU, arrays_for, default_arch, require_gpu, time_ms
from .recipe_args import CLIError, parse_shape, recipe

EXAMPLES = """\
examples:
  firesched tune 2048 2048 2048 --arch sm_80             # candidates that check (timed with a GPU)
  firesched tune 1000 1000 1000 --dtype bf16 --limit 40
"""

#: GemmParams fields shown (the space varies these; the rest keep their defaults).
FIELDS = ("block_m", "block_n", "block_k", "warps_m", "warps_n", "stages", "split_k_blocks", "split_k_warps")
HEAD = ("bm", "bn", "bk", "wm", "wn", "stages", "skb", "skw")


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``tune`` to the subcommands."""
    p = sub.add_parser("tune", help="search the GEMM recipe's parameters (times them with a GPU)",
                       description=__doc__, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", metavar="DIM", nargs="*", help="M N K")
    p.add_argument("--dtype", default="f16", help="f16 (default) or bf16")
    p.add_argument("--arch", default=None, help="target (default: the GPU's, else sm_90a; the sm_80 atoms run on both)")
    p.add_argument("--limit", type=int, default=16, help="stop after this many candidates that check (default 16)")
    p.add_argument("--reps", type=int, default=10, help="launches per timed sample (default 10)")
    p.add_argument("--samples", type=int, default=5, help="timed samples per candidate (default 5)")
    return p


def _row(values) -> str:
    return " ".join(f"{v:>6}" for v in values)


def _time(torch, k, args) -> float:
    """Milliseconds per launch of compiled program ``k`` on random inputs."""
    xs, ys, _ = arrays_for(torch, k)
    return time_ms(torch, lambda: k(*xs, *ys), reps=args.reps, samples=args.samples)


def run(args: argparse.Namespace) -> int:
    """Enumerate (and, with a GPU, time) the candidates; print a table and the best one."""
    if args.limit < 1 or args.reps < 1 or args.samples < 1:
        raise CLIError(f"--limit {args.limit} --reps {args.reps} --samples {args.samples}: each must be at least 1")
    M, N, K = parse_shape(recipe("gemm"), args.shape)
    arch = default_arch(args.arch)
    try:
        torch = require_gpu("timing")
        why_not = None
    except NoGPU as e:
        torch, why_not = None, str(e)
    flops = 2 * M * N * K
    print(f"# gemm {M}x{N}x{K} {args.dtype} for {arch}: candidates of recipes.gemm_space (sm_80 atoms) that "
          f"check, at most {args.limit}")
    print(_row(HEAD) + ("      us  TFLOP/s" if torch is not None else ""))
    t0 = time.perf_counter()
    found = []
    for p in recipes.gemm_space(M, N, K, args.dtype, arch, limit=args.limit):
        vals = [getattr(p, f) for f in FIELDS]
        if torch is None:
            print(_row(vals), flush=True)
            found.append((None, p))
            continue
        # the parameters gemm_space varied and checked, as the reproducing command line gives them
        sched = recipes.gemm(M, N, K, args.dtype, arch, atoms="sm80", **dict(zip(FIELDS, vals)))
        ms = _time(torch, api.compile(sched, arch=arch), args)
        print(_row(vals) + f" {ms * 1e3:7.1f} {flops / ms / 1e9:8.1f}", flush=True)
        found.append((ms, p))
    secs = time.perf_counter() - t0
    if not found:
        print(f"no candidate of the space checks for {M}x{N}x{K} on {arch}", file=sys.stderr)
        return 1
    print(f"# {len(found)} candidates in {secs:.1f} s")
    if torch is None:
        print(f"# not timed: {why_not}")
        return 0
    ms, best = min(found, key=lambda x: x[0])
    ps = " ".join(f"-p {f}={getattr(best, f)}" for f in FIELDS)
    print(f"# fastest: {ms * 1e3:.1f} us, {flops / ms / 1e9:.1f} TFLOP/s; reproduce with:")
    print(f"firesched bench gemm {M} {N} {K} --dtype {args.dtype} --arch {arch} -p atoms=sm80 {ps}")
    return 0
