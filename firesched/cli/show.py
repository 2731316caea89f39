"""``firesched show``: the decomposition tree of a recipe's schedule."""

from __future__ import annotations

import argparse

from .recipe_args import add_recipe_arguments, build_schedule, recipes_help

EXAMPLES = """\
examples:
  firesched show gemm 1024 1024 1024 --dtype f16 --arch sm_90a
  firesched show gemm 1000 1000 1000 --arch sm_80 -p block_m=64 -p stages=3 --epilogue bias_relu
  firesched show bmm 8 512 512 512
  firesched show rmsnorm 4096 8192
  firesched show cast 4096 4096 --dtype f32:bf16

recipes (RECIPE DIM...):
"""


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``show`` to the subcommands."""
    p = sub.add_parser("show", help="print a recipe's schedule tree", description=__doc__,
                       epilog=EXAMPLES + recipes_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Build the schedule and print its tree."""
    built = build_schedule(args)
    print(f"# {built.describe()}")
    print(built.schedule)
    return 0
