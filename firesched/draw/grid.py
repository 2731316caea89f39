"""A picture as a value (:class:`Grid`: rows of labelled, coloured cells) and its three renderings:
aligned text for a terminal, hand-written SVG, and PNG through matplotlib when it is installed.

SVG is written by hand because it is a small format and none of our dependencies writes it; every
cell is a ``<rect class="cell" data-row=".." data-col="..">`` followed by its ``<text>``, so a
picture can be checked with any XML parser.
"""

from __future__ import annotations

import colorsys
import os
from collections.abc import Sequence
from xml.sax.saxutils import escape, quoteattr

import attrs

from firesched.errors import FireschedError

#: Distinct colours in the palette (one per shared-memory bank).
PALETTE_SIZE = 32
# Stepping the hue by 7/32 of the circle (7 is coprime with 32, so all 32 hues are used) puts
# neighbouring indices (banks 0 and 1, threads 0 and 1) far apart on the colour wheel.
_HUE_STEP = 7


def palette_colour(i: int) -> str:
    """The colour ``#rrggbb`` of index ``i`` (a bank, a thread) in a 32-colour palette.

    Light colours, so that black labels stay readable; ``i`` and ``i + 32`` share a colour.
    """
    k = int(i) % PALETTE_SIZE
    hue = (k * _HUE_STEP % PALETTE_SIZE) / PALETTE_SIZE
    light = 0.78 if k % 2 == 0 else 0.86
    r, g, b = colorsys.hls_to_rgb(hue, light, 0.65)
    return "#{:02x}{:02x}{:02x}".format(round(r * 255), round(g * 255), round(b * 255))


def bank_colour(bank: int) -> str:
    """The colour of shared-memory bank ``bank`` (0..31) in every bank map."""
    b = int(bank)
    if not 0 <= b < 32:
        raise FireschedError(f"bank_colour: bank={bank!r} is no shared-memory bank; banks are 0..31")
    return palette_colour(b)


@attrs.frozen
class Cell:
    """One cell of a picture: its ``label`` and its fill colour (``#rrggbb``; None: left blank)."""

    label: str
    fill: str | None = None


@attrs.frozen
class Grid:
    """A titled grid of cells with row and column headings and a one-line ``legend`` (what the
    labels and colours mean).  ``cells[r][c]`` is the cell of row ``r``, column ``c``."""

    title: str
    cells: tuple[tuple[Cell, ...], ...]
    row_labels: tuple[str, ...] = ()
    col_labels: tuple[str, ...] = ()
    legend: str = ""

    def __attrs_post_init__(self):
        widths = {len(r) for r in self.cells}
        if len(widths) > 1:
            raise FireschedError(f"Grid {self.title!r}: rows of different lengths {sorted(widths)}; "
                                 "every row needs one cell per column")
        if self.row_labels and len(self.row_labels) != self.rows:
            raise FireschedError(f"Grid {self.title!r}: {len(self.row_labels)} row labels for {self.rows} rows")
        if self.col_labels and len(self.col_labels) != self.cols:
            raise FireschedError(f"Grid {self.title!r}: {len(self.col_labels)} column labels for "
                                 f"{self.cols} columns")

    @property
    def rows(self) -> int:
        """Number of rows."""
        return len(self.cells)

    @property
    def cols(self) -> int:
        """Number of columns (0 for an empty grid)."""
        return len(self.cells[0]) if self.cells else 0

    def labels(self) -> list[list[str]]:
        """The labels as a list of rows (for tests and for reading a picture back)."""
        return [[c.label for c in row] for row in self.cells]

    def fills(self) -> list[list[str | None]]:
        """The fill colours as a list of rows."""
        return [[c.fill for c in row] for row in self.cells]


def _grids(pictures: Grid | Sequence[Grid]) -> tuple[Grid, ...]:
    if isinstance(pictures, Grid):
        return (pictures,)
    out = tuple(pictures)
    if not all(isinstance(g, Grid) for g in out):
        raise FireschedError("draw: expected a Grid or a sequence of Grids (from layout_grid, swizzle_grid, "
                             "tv_grid, smem_grid or atom_grids)")
    return out


# --------------------------------------------------------------------------- text


def _ansi(fill: str | None, s: str) -> str:
    if fill is None:
        return s
    r, g, b = int(fill[1:3], 16), int(fill[3:5], 16), int(fill[5:7], 16)
    # 24-bit background, black foreground: the palette is light
    return f"\x1b[48;2;{r};{g};{b}m\x1b[38;2;0;0;0m{s}\x1b[0m"


def text(pictures: Grid | Sequence[Grid], *, colour: bool = False) -> str:
    """The pictures as aligned text: title, column headings, one line per row, the legend.

    ``colour=True`` paints each cell's background with ANSI 24-bit escapes (for terminals).
    """
    out = []
    for g in _grids(pictures):
        w = max([len(c.label) for row in g.cells for c in row] + [len(s) for s in g.col_labels] + [1])
        rw = max([len(s) for s in g.row_labels] + [0])
        out.append(g.title)
        if g.col_labels:
            out.append(" " * rw + " " + " ".join(s.rjust(w) for s in g.col_labels))
        for i, row in enumerate(g.cells):
            head = g.row_labels[i].rjust(rw) + " " if g.row_labels else ""
            cells = [c.label.rjust(w) for c in row]
            if colour:
                cells = [_ansi(c.fill, s) for c, s in zip(row, cells)]
            out.append(head + " ".join(cells))
        if g.legend:
            out.append(g.legend)
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- SVG

_FONT = 11          # px; monospace, about 0.62 em per character
_CHAR_W = 0.62 * _FONT
_CELL_H = 20
_PAD = 8


def _cell_width(g: Grid) -> float:
    longest = max([len(c.label) for row in g.cells for c in row] + [len(s) for s in g.col_labels] + [2])
    return max(24.0, longest * _CHAR_W + 8)


def svg(pictures: Grid | Sequence[Grid]) -> str:
    """The pictures as one standalone SVG document, stacked top to bottom.

    Each grid is a ``<g class="grid">``; each cell a ``<rect class="cell" data-row data-col>``
    (filled with the cell's colour, white when it has none) and a ``<text class="label">``.
    """
    grids = _grids(pictures)
    parts = []
    y = _PAD
    width = 0.0
    for g in grids:
        cw = _cell_width(g)
        rw = max([len(s) for s in g.row_labels] + [0]) * _CHAR_W + (8 if g.row_labels else 0)
        x0 = _PAD + rw
        parts.append(f'<g class="grid" data-rows="{g.rows}" data-cols="{g.cols}">')
        parts.append(f'<title>{escape(g.title)}</title>')
        parts.append(f'<text class="title" x="{_PAD}" y="{y + _FONT + 2:.1f}" font-weight="bold">'
                     f'{escape(g.title)}</text>')
        y += _FONT + 8
        if g.col_labels:
            for j, s in enumerate(g.col_labels):
                parts.append(f'<text class="col-label" x="{x0 + (j + 0.5) * cw:.1f}" y="{y + _FONT:.1f}" '
                             f'text-anchor="middle" fill="#555">{escape(s)}</text>')
            y += _FONT + 4
        for i, row in enumerate(g.cells):
            top = y + i * _CELL_H
            if g.row_labels:
                parts.append(f'<text class="row-label" x="{x0 - 4:.1f}" y="{top + _CELL_H / 2 + 4:.1f}" '
                             f'text-anchor="end" fill="#555">{escape(g.row_labels[i])}</text>')
            for j, c in enumerate(row):
                left = x0 + j * cw
                fill = c.fill or "#ffffff"
                parts.append(f'<rect class="cell" data-row="{i}" data-col="{j}" x="{left:.1f}" y="{top:.1f}" '
                             f'width="{cw:.1f}" height="{_CELL_H}" fill={quoteattr(fill)} stroke="#333" '
                             f'stroke-width="0.5"/>')
                if c.label:
                    parts.append(f'<text class="label" x="{left + cw / 2:.1f}" y="{top + _CELL_H / 2 + 4:.1f}" '
                                 f'text-anchor="middle">{escape(c.label)}</text>')
        y += g.rows * _CELL_H + 4
        width = max(width, x0 + g.cols * cw + _PAD, _PAD + len(g.title) * _CHAR_W + _PAD)
        if g.legend:
            parts.append(f'<text class="legend" x="{_PAD}" y="{y + _FONT:.1f}" fill="#333">'
                         f'{escape(g.legend)}</text>')
            width = max(width, _PAD + len(g.legend) * _CHAR_W + _PAD)
            y += _FONT + 6
        parts.append("</g>")
        y += 2 * _PAD
    height = y
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace" font-size="{_FONT}">')
    return "\n".join([head, '<rect width="100%" height="100%" fill="#ffffff"/>', *parts, "</svg>"]) + "\n"


# --------------------------------------------------------------------------- PNG


def png(pictures: Grid | Sequence[Grid], path: str | os.PathLike, *, dpi: int = 100) -> None:
    """Write the pictures to ``path`` as a PNG, through matplotlib (an optional dependency).

    Raises ``FireschedError`` naming the fix when matplotlib is not installed.
    """
    grids = _grids(pictures)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError:
        raise FireschedError("PNG output needs matplotlib, which is not installed: pip install matplotlib "
                             "(or write SVG, which needs nothing)") from None
    # Lay the grids out in cell units, top to bottom; one cell is 0.25 inch tall.
    widths = [max(1.0, _cell_width(g) / _CELL_H) for g in grids]
    # text widths in cell units (0.25 inch): about 0.31 per title character (9 pt monospace) and
    # 0.24 per legend character (7 pt), so that long legends are not cut off at the right edge
    total_w = max(max(w * max(g.cols, 1), 0.31 * len(g.title), 0.24 * len(g.legend))
                  for w, g in zip(widths, grids)) + 2
    total_h = sum(g.rows + 3 + (1 if g.legend else 0) for g in grids)
    fig = Figure(figsize=(max(2.0, total_w * 0.25), max(1.0, total_h * 0.25)))
    FigureCanvasAgg(fig)        # the object-oriented API: no pyplot, no global backend switch
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-2, total_w)
    ax.set_ylim(total_h, 0)
    ax.axis("off")
    y = 0.0
    for g, cw in zip(grids, widths):
        ax.text(-1.8, y + 0.8, g.title, fontsize=9, fontweight="bold", family="monospace", va="center")
        y += 1.3
        for j, s in enumerate(g.col_labels):
            ax.text((j + 0.5) * cw, y + 0.4, s, fontsize=6, ha="center", va="center", family="monospace",
                    color="#555555")
        y += 0.8
        for i, row in enumerate(g.cells):
            if g.row_labels:
                ax.text(-0.2, y + i + 0.5, g.row_labels[i], fontsize=6, ha="right", va="center",
                        family="monospace", color="#555555")
            for j, c in enumerate(row):
                ax.add_patch(Rectangle((j * cw, y + i), cw, 1, facecolor=c.fill or "#ffffff", edgecolor="#333333",
                                       linewidth=0.4))
                if c.label:
                    ax.text((j + 0.5) * cw, y + i + 0.5, c.label, fontsize=6, ha="center", va="center",
                            family="monospace")
        y += g.rows + 0.4
        if g.legend:
            ax.text(-1.8, y + 0.5, g.legend, fontsize=7, va="center", family="monospace", color="#333333")
            y += 1
        y += 0.5
    fig.savefig(os.fspath(path), dpi=dpi, facecolor="white")
