"""``firesched emit``: the CUDA C++ of a recipe's schedule (lowered and printed; no compiler needed),
or with ``--ptx`` the PTX that NVRTC makes of it."""

from __future__ import annotations

import argparse
import sys

from firesched import api
from firesched.cuda import printer
from firesched.errors import FireschedError

from .recipe_args import add_recipe_arguments, build_schedule, recipes_help

EXAMPLES = """\
examples:
  firesched emit gemm 4096 4096 4096 --arch sm_90a > gemm.cu
  firesched emit gemm 1024 1024 1024 --arch sm_80 --epilogue bias_relu -o gemm_relu.cu
  firesched emit layernorm 4096 4096 --ptx -o layernorm.ptx

recipes (RECIPE DIM...):
"""


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``emit`` to the subcommands."""
    p = sub.add_parser("emit", help="print a recipe's CUDA C++ (or PTX)", description=__doc__,
                       epilog=EXAMPLES + recipes_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_arguments(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--ptx", action="store_true", help="PTX (compiled by NVRTC for --arch) instead of CUDA C++")
    return p


def cuda_source(schedule, arch: str) -> str:
    """The CUDA C++ of every kernel of ``schedule`` lowered for ``arch``, as ``fs.compile`` prints it."""
    prog = schedule.lower(arch)
    return "\n".join(printer.emit_kernel(k) for k in prog.kernels)


def ptx_text(schedule, arch: str) -> str:
    """The PTX of ``schedule`` for ``arch``, from ``fs.compile(...).ptx``; a FireschedError says so
    when this version of firesched does not keep the PTX."""
    k = api.compile(schedule, arch=arch)
    if not hasattr(k, "ptx"):
        raise FireschedError("PTX output is not available in this version of firesched (the compiled program "
                             "keeps no PTX); run without --ptx for the CUDA C++")
    ptx = k.ptx
    if isinstance(ptx, dict):           # one PTX module per kernel
        ptx = "\n".join(str(v.decode() if isinstance(v, bytes) else v) for v in ptx.values())
    elif isinstance(ptx, (list, tuple)):
        ptx = "\n".join(str(v.decode() if isinstance(v, bytes) else v) for v in ptx)
    elif isinstance(ptx, bytes):
        ptx = ptx.decode()
    return str(ptx)


def run(args: argparse.Namespace) -> int:
    """Build, lower and print (or compile to PTX); write to ``-o`` or stdout."""
    built = build_schedule(args)
    text = ptx_text(built.schedule, args.arch) if args.ptx else cuda_source(built.schedule, args.arch)
    if not text.endswith("\n"):
        text += "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output} ({len(text.splitlines())} lines of {'PTX' if args.ptx else 'CUDA C++'}: "
              f"{built.describe()})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
