"""``firesched tune``: search the GEMM recipe's parameter space for one problem.

Without a GPU it lists the first points of ``recipes.gemm_space`` (both atom families on
sm_90a, the tile model's most promising first), each of which checks for the target.  With a
GPU (and torch) it runs ``firesched.tune``: the points compile in parallel processes, each is
checked against a reference, they are timed interleaved with ``torch.matmul``, and the fastest
is stored, so that ``recipes.gemm(..., tuned=True)`` takes it from then on."""

from __future__ import annotations

import argparse
import sys
import time

from firesched import recipes, tuner

from .gpu import NoGPU, default_arch, require_gpu
from .recipe_args import CLIError, parse_shape, recipe

EXAMPLES = """\
examples:
  firesched tune 2048 2048 2048                    # tune on the GPU present, store the winner
  firesched tune 1000 1000 1000 --dtype bf16 --limit 40
  firesched tune 256 256 256 --arch sm_80 --limit 5 # without a GPU: the candidates that check
"""

#: GemmParams fields shown, in columns
FIELDS = ("atoms", "block_m", "block_n", "block_k", "warps_m", "warps_n", "stages", "split_k_blocks",
          "split_k_fixup", "warp_specialized", "persistent", "cluster", "stream_k_parts")
HEAD = ("atoms", "bm", "bn", "bk", "wm", "wn", "stages", "skb", "fix", "ws", "pers", "clu", "sk")


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``tune`` to the subcommands."""
    p = sub.add_parser("tune", help="search the GEMM recipe's parameters (tunes and stores them with a GPU)",
                       description=__doc__, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", metavar="DIM", nargs="*", help="M N K")
    p.add_argument("--dtype", default="f16", help="f16 (default) or bf16")
    p.add_argument("--arch", default=None, help="target (default: the GPU's, else sm_90a)")
    p.add_argument("--limit", type=int, default=24, help="points of the space to try (default 24)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved timing rounds (default 10)")
    p.add_argument("--force", action="store_true", help="tune again though a result is stored")
    return p


def _row(p) -> str:
    vals = []
    for f in FIELDS:
        v = p[f] if f in p else getattr(p, f)
        vals.append("-" if v is None or f not in p else ("y" if v else "n") if isinstance(v, bool) else v)
    return " ".join(f"{v!s:>6}" for v in vals)


def run(args: argparse.Namespace) -> int:
    """List (no GPU) or tune (GPU) the candidates; print a table and the best one."""
    if args.limit < 1 or args.rounds < 1:
        raise CLIError(f"--limit {args.limit} --rounds {args.rounds}: each must be at least 1")
    M, N, K = parse_shape(recipe("gemm"), args.shape)
    arch = default_arch(args.arch)
    try:
        require_gpu("timing")
        why_not = None
    except NoGPU as e:
        why_not = str(e)
    print(f"# gemm {M}x{N}x{K} {args.dtype} for {arch}: points of recipes.gemm_space, at most {args.limit}")
    print(" ".join(f"{h:>6}" for h in HEAD) + ("      us" if why_not is None else ""))
    if why_not is not None:
        t0 = time.perf_counter()
        found = 0
        for p in recipes.gemm_space(M, N, K, args.dtype, arch, limit=args.limit):
            print(_row(p), flush=True)
            found += 1
        if not found:
            print(f"no point of the space checks for {M}x{N}x{K} on {arch}", file=sys.stderr)
            return 1
        print(f"# {found} candidates in {time.perf_counter() - t0:.1f} s")
        print(f"# not timed: {why_not}")
        return 0
    res = tuner.tune("gemm", M, N, K, dtype=args.dtype, arch=arch, limit=args.limit, rounds=args.rounds,
                     force=args.force)
    for c in res.candidates:
        label = _row(c.params) if c.params is not None else f"{'default':>6}"
        print(label + (f" {c.time_us:7.1f}" if c.time_us is not None else f"  {c.status}"))
    flops = 2 * M * N * K
    where = "stored result" if res.from_cache else f"tuned in {res.seconds:.0f} s"
    print(f"# {where}: {res.time_us:.1f} us, {flops / res.time_us / 1e6:.1f} TFLOP/s"
          + (f"; {res.speedup_default:.2f}x the default" if res.speedup_default else "")
          + (f", {res.ratio_peer:.2f}x torch.matmul" if res.ratio_peer else ""))
    print(f"# parameters: {dict(res.params) if res.params is not None else 'the recipe default'}")
    print(f"# recipes.gemm({M}, {N}, {K}, dtype={args.dtype!r}, arch={arch!r}, tuned=True) takes them")
    for c in res.wrong:
        print(f"# WRONG (a bug, please report): {c.params}: {c.status}", file=sys.stderr)
    return 0
