"""Pictures of layouts: a ``Layout``'s offsets, a ``Swizzle``'s shared-memory bank map, a
``TVLayout``'s (thread, value) owners, and a shared-memory tile's banks — as text, SVG or PNG.

Every picture is first a :class:`Grid` (a frozen value: cells with a label and a colour, row and
column headings), so the three outputs show the same thing and tests can read a picture's content
without parsing it::

    from firesched import draw
    from firesched.layout import Layout, SW128
    print(draw.text(draw.layout_grid(Layout((4, 8), (8, 1)))))
    open("sw128.svg", "w").write(draw.svg(draw.swizzle_grid(SW128)))
    draw.png(draw.swizzle_grid(SW128), "sw128.png")      # needs matplotlib

This package sits *below* ``firesched.layout`` in the layering (``tests/test_import_graph.py``)
so that ``Layout._repr_svg_`` can hand notebooks a picture; it therefore never imports
``firesched.layout`` and reads layouts through their methods only (``offsets()``, ``size()``,
``[i]``, calling them on numpy arrays).
"""

from .grid import Cell, Grid, bank_colour, palette_colour, png, svg, text
from .layouts import (
    MAX_REPR_CELLS,
    atom_grids,
    bank_conflict_ways,
    layout_grid,
    repr_svg,
    smem_grid,
    swizzle_grid,
    tv_grid,
)

__all__ = [
    "Cell", "Grid", "bank_colour", "palette_colour", "svg", "text", "png",
    "layout_grid", "swizzle_grid", "tv_grid", "smem_grid", "atom_grids", "bank_conflict_ways", "repr_svg",
    "MAX_REPR_CELLS",
]
