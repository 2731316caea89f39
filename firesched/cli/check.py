"""``firesched check``: lower a recipe's schedule for a target (``Schedule.check``) and print ``ok``
or the ``ScheduleError`` (exit status 1), which names the strategy, the field and a fix."""

from __future__ import annotations

import argparse
import sys

from firesched.errors import ScheduleError

from .recipe_args import add_recipe_arguments, build_schedule, recipes_help

EXAMPLES = """\
examples:
  firesched check gemm 1024 1024 1024 --arch sm_90a
  firesched check gemm 1000 1000 1000 --arch sm_80 -p block_m=256 -p block_n=256 -p stages=4
  firesched check softmax 4096 32768

exit status: 0 ok, 1 the schedule does not fit the target, 2 bad arguments.

recipes (RECIPE DIM...):
"""


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``check`` to the subcommands."""
    p = sub.add_parser("check", help="check a recipe's schedule against a target", description=__doc__,
                       epilog=EXAMPLES + recipes_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Build the schedule without the recipe's own check, then check it for ``--arch``."""
    try:
        built = build_schedule(args, check=False)
        built.schedule.check(args.arch)
    except ScheduleError as e:
        # A recipe that checks while it builds (the row kernels) reports here too: either way
        # the schedule does not fit the target, which is this command's answer, not a usage error.
        print(f"check failed: {e}", file=sys.stderr)
        return 1
    print(f"ok: {built.describe()} (every leaf an atom of {args.arch}, resources within it, "
          "fragments consistent)")
    return 0
