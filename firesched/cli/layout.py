"""``firesched layout``: draw a layout, a swizzle's bank map, an atom's thread-value layouts, or the
shared-memory tiles of a recipe's schedule — as text (default), SVG (``--svg``) or PNG (``--png``,
needs matplotlib).  What is drawn follows from the first argument:

  (4,8):(8,1)            a Layout in CuTe notation (shape:stride; a shape alone is column-major);
                         with --tile RxC, the TVLayout (thread, value) -> tile of that layout
  Sw<3,4,3>, SW128       a Swizzle (SW32, SW64, SW128: the byte modes of TMA and wgmma)
  mma_m16n8k16_f16_f32   an atom of the catalog (sm80.NAME works too): its operands' TV layouts
  gemm 256 256 256       a recipe and its shape: the shared-memory tiles its schedule lays out
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys

from firesched import draw
from firesched.hardware.atoms import catalog
from firesched.layout import Layout, TVLayout
from firesched.lower.driver import shared_layouts
from firesched.tensor import BLOCK, SH

from .recipe_args import RECIPES, CLIError, add_schedule_options, build_schedule, parse_swizzle

EXAMPLES = """\
examples:
  firesched layout "(4,8):(8,1)"
  firesched layout "((4,8),(2,2)):((32,1),(16,8))" --tile 16x8      # a TV layout
  firesched layout SW128                                            # bank map on bytes
  firesched layout "Sw<3,3,3>" --elem-bytes 2 --svg sw.svg
  firesched layout mma_m16n8k16_f16_f32 --svg mma.svg               # A, B, C, D fragments
  firesched layout gemm 256 256 256 --arch sm_80                     # shared tiles, bank map
  firesched layout gemm 4096 4096 4096 --arch sm_90a --png tiles.png
"""



def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``layout`` to the subcommands."""
    p = sub.add_parser("layout", help="draw a layout, swizzle, atom TV layout or a schedule's shared tiles",
                       description=__doc__, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", metavar="WHAT", help="a layout, a swizzle, an atom name or a recipe name")
    p.add_argument("shape", metavar="DIM", nargs="*", help="the recipe's shape (for a recipe)")
    p.add_argument("--tile", metavar="RxC", help="draw the layout as a TV layout on a rows x cols tile")
    p.add_argument("--elem-bytes", type=int, default=None, metavar="N",
                   help="bytes per offset of a swizzle (default: what makes its unit 16 bytes)")
    p.add_argument("--svg", metavar="FILE", help="write an SVG picture")
    p.add_argument("--png", metavar="FILE", help="write a PNG picture (needs matplotlib)")
    colour = p.add_mutually_exclusive_group()
    colour.add_argument("--color", dest="colour", action="store_true", default=None,
                        help="colour the text cells (default: when stdout is a terminal and NO_COLOR is unset)")
    colour.add_argument("--no-color", dest="colour", action="store_false")
    add_schedule_options(p)
    return p


def _literal(text: str, what: str):
    try:
        v = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        raise CLIError(f"cannot read {what} {text!r}: write an int or a (nested) tuple of ints, e.g. (4,(2,2))"
                       ) from None
    if isinstance(v, list):
        v = tuple(v)
    return v


def parse_layout(text: str) -> Layout:
    """A ``Layout`` from CuTe notation: ``(4,8):(8,1)``, ``8:1``, or a shape alone (column-major)."""
    shape_text, colon, stride_text = text.partition(":")
    shape = _literal(shape_text, "the shape of")
    stride = _literal(stride_text, "the stride of") if colon else None
    return Layout(shape, stride)


def parse_tile(text: str) -> tuple[int, int]:
    """``16x8`` -> (16, 8)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX,]\s*(\d+)\s*", text)
    if m is None:
        raise CLIError(f"--tile {text!r}: write ROWSxCOLS, e.g. --tile 16x8")
    return int(m.group(1)), int(m.group(2))


def _atom(name: str):
    short = name.rsplit(".", 1)[-1]
    return catalog.BY_NAME.get(short)


def schedule_grids(schedule, *, stage: int = 0) -> list[draw.Grid]:
    """Bank maps of every shared-memory tile of ``schedule``, laid out as lowering lays them out
    (``firesched.lower.driver.shared_layouts``: TMA boxes, swizzles), one per tensor."""
    tensors = {}
    for n in schedule.nodes():
        for t in n.spec.operands:
            if t.memory == SH:
                tensors.setdefault(t.name, t.tensor)
    layouts: dict = {}

    def go(n):
        if getattr(n.spec, "level", None) == BLOCK:
            found, _ = shared_layouts(n)
            for k, v in found.items():
                layouts.setdefault(k, v)
            return
        for c in n.children:
            go(c)

    go(schedule.root)
    return [draw.smem_grid(sl, tensors[name].dtype.bits // 8, name=name, stage=stage)
            for name, sl in layouts.items() if name in tensors]


def _grids(args: argparse.Namespace) -> list[draw.Grid]:
    what = args.what
    if what in RECIPES:
        args.recipe = what
        built = build_schedule(args)
        grids = schedule_grids(built.schedule)
        if not grids:
            raise CLIError(f"{built.describe()}: the schedule keeps nothing in shared memory; nothing to draw")
        return grids
    if args.shape:
        raise CLIError(f"layout {what!r}: sizes ({' '.join(args.shape)}) go with a recipe name "
                       f"({', '.join(RECIPES)})")
    sw = parse_swizzle(what)
    if sw is not None:
        return [draw.swizzle_grid(sw, args.elem_bytes)]
    atom = _atom(what)
    if atom is not None:
        return draw.atom_grids(atom)
    if not (what[:1].isdigit() or what[:1] in "([") or what.strip().isalpha():
        raise CLIError(f"layout {what!r}: not a layout, a swizzle, an atom or a recipe; write a layout as "
                       f"(4,8):(8,1), a swizzle as Sw<3,4,3> or SW128, an atom name (e.g. mma_m16n8k16_f16_f32) "
                       f"or a recipe ({', '.join(RECIPES)}) and its sizes")
    lay = parse_layout(what)
    if args.tile:
        return [draw.tv_grid(TVLayout(lay, parse_tile(args.tile)))]
    return [draw.layout_grid(lay)]


def run(args: argparse.Namespace) -> int:
    """Draw what ``args.what`` names: text to stdout, or the pictures ``--svg`` / ``--png`` ask for."""
    grids = _grids(args)
    wrote = []
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(draw.svg(grids))
        wrote.append(args.svg)
    if args.png:
        draw.png(grids, args.png)
        wrote.append(args.png)
    if wrote:
        print(f"wrote {', '.join(wrote)} ({len(grids)} picture{'s' if len(grids) > 1 else ''}: "
              f"{'; '.join(g.title for g in grids)})")
        return 0
    colour = args.colour
    if colour is None:
        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    sys.stdout.write(draw.text(grids, colour=colour))
    return 0
