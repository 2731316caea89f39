"""The firesched command line (also python -m firesched): schedules of the stock recipes, their
CUDA, checks, pictures of layouts and timings.  One module per subcommand.

examples:
  firesched show gemm 1024 1024 1024 --arch sm_90a    # the schedule tree of a recipe
  firesched emit rmsnorm 4096 8192 -o rmsnorm.cu      # its CUDA C++ (--ptx: PTX)
  firesched check gemm 1000 1000 1000 --arch sm_80    # ok, or the ScheduleError
  firesched layout "(4,8):(8,1)"                      # layouts, swizzles, atoms, shared tiles
  firesched tune 2048 2048 2048 --arch sm_80          # the GEMM recipe's parameter space
  firesched bench gemm 4096 4096 4096                 # time a recipe on the GPU
  firesched demo                                      # schedule, check, interpret, compile a GEMM

Each command has its own --help with examples.  Bad arguments are one line on stderr and exit
status 2; a schedule that fails check exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys

from firesched.errors import FireschedError

from . import bench, check, demo, emit, layout, show, tune

PROG = "firesched"
COMMANDS = (show, emit, check, layout, tune, bench, demo)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``firesched show: error: ...``), exit code 2."""

    def error(self, message: str):
        """Print ``message`` on one line, with where to find help, and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> Parser:
    """The parser of every subcommand (each module's ``add_parser`` adds its own)."""
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0],
               epilog="\n\n".join(__doc__.split("\n\n")[1:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=Parser)
    for mod in COMMANDS:
        sp = mod.add_parser(sub)
        sp.set_defaults(run=mod.run)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (``sys.argv[1:]`` by default) and return the exit status.

    Errors firesched raises on purpose (``FireschedError``, ``ValueError``: bad sizes, parameters
    a recipe refuses, a schedule that does not fit the target) are printed as ``error: ...``
    with exit status 2, never as a traceback.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:         # --help, or a usage error already printed
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    if args.cmd is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (``firesched emit ... | head``): not an error; keep Python from
        # complaining again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (FireschedError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:            # an output file that cannot be written
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2


__all__ = ["main", "build_parser", "Parser"]
