"""Layouts, swizzles, TV layouts and shared-memory tiles as :class:`~firesched.draw.grid.Grid` values.

The functions read their argument through its methods (``offsets()``, ``size()``, ``rank``,
``[i]``; a swizzle is called on a numpy array of offsets), never through ``firesched.layout``,
which sits above this package (see the package docstring).  Shared memory is 32 banks of 4
bytes: the bank of a byte address ``a`` is ``(a // 4) % 32``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from firesched.errors import FireschedError

from .grid import Cell, Grid, bank_colour, palette_colour, svg

#: ``_repr_svg_`` draws pictures of at most this many cells (a notebook would stall on more;
#: the draw functions themselves have no limit).
MAX_REPR_CELLS = 4096

BANKS = 32
BANK_BYTES = 4
#: The unit of ldmatrix rows, cp.async / TMA vectors and the hardware swizzle modes.
CHUNK_BYTES = 16


def _bank(byte_addr: np.ndarray) -> np.ndarray:
    return (byte_addr // BANK_BYTES) % BANKS


def _is_composed(x: Any) -> bool:
    return hasattr(x, "swizzle") and hasattr(x, "layout") and hasattr(x, "offsets")


def _grid_shape(base: Any) -> tuple[int, int]:
    """(rows, cols): mode 0 down, the other modes (colexicographically) across; a rank-1 layout
    is one row."""
    n = int(base.size())
    if base.rank == 1:
        return 1, n
    rows = int(base[0].size())
    return rows, n // rows


def layout_grid(layout: Any, *, title: str | None = None) -> Grid:
    """The offsets of a ``Layout`` (or ``ComposedLayout``): cell (i, j) holds the offset of
    coordinate (i, j) — mode 0 down the rows, the remaining modes across the columns (their
    colexicographic index), a rank-1 layout as one row, as CuTe's ``print_layout`` does.

    Cells are coloured by offset modulo 8, so repeats of a stride pattern show.
    """
    base = layout.layout if _is_composed(layout) else layout
    rows, cols = _grid_shape(base)
    offs = np.asarray(layout.offsets(), dtype=np.int64).reshape(cols, rows).T
    cells = tuple(tuple(Cell(str(int(o)), palette_colour(int(o) % 8)) for o in row) for row in offs)
    across = "mode 1" if base.rank == 2 else "modes 1.. (colexicographic index)"
    legend = (f"cell (i, j): offset of index j along the row (size {cols})" if base.rank == 1 else
              f"cell (i, j): offset of coordinate (i, j); i: mode 0, j: {across}")
    return Grid(title or f"Layout {layout}", cells, tuple(map(str, range(rows))), tuple(map(str, range(cols))),
                legend + "; colour: offset mod 8")


def default_elem_bytes(swizzle: Any) -> int:
    """The element size a swizzle is most likely written for: the one that makes its moving unit
    (``2**base`` offsets) 16 bytes, as every hardware swizzle's is; 1 (byte offsets) when
    ``base`` > 4."""
    return 1 << (4 - swizzle.base) if 0 <= swizzle.base <= 4 else 1


def bank_conflict_ways(banks: np.ndarray, rows_per_phase: int = 8) -> int:
    """The worst bank conflict of reading one 16-byte column of ``rows_per_phase`` consecutive
    rows at once (an ldmatrix 8x8 matrix, a column of cp.async vectors), given ``banks[r, c]``:
    the first bank of 16-byte chunk ``c`` of row ``r``.  1 means conflict-free.

    A 16-byte chunk at a 16-byte aligned address covers one group of 4 banks, so a phase's
    conflict degree is the largest number of its chunks that fall in the same group.
    """
    b = np.asarray(banks) // (CHUNK_BYTES // BANK_BYTES)
    worst = 1
    for r0 in range(0, b.shape[0], rows_per_phase):
        blk = b[r0:r0 + rows_per_phase]
        for c in range(blk.shape[1]):
            worst = max(worst, int(np.bincount(blk[:, c]).max()))
    return worst


def swizzle_grid(swizzle: Any, elem_bytes: int | None = None, *, title: str | None = None) -> Grid:
    """The bank map of a ``Swizzle``: one period of it, as rows of ``2**(base + |shift|)``
    offsets, each cut into the units of ``2**base`` offsets that the swizzle moves.

    Cell (r, c) is the logical unit c of row r; its label and colour are the bank of the first
    word of the place the swizzle puts it (offsets are elements of ``elem_bytes`` bytes; by
    default the size that makes the unit 16 bytes, so ``Swizzle(3, 4, 3)`` is read on bytes and
    ``Swizzle(3, 3, 3)`` on 2-byte elements).  For ``SW128`` on bytes, cell (r, c) is bank
    ``4 * (c ^ r)``: a column of 8 rows hits 8 different groups of 4 banks.
    """
    if swizzle.bits == 0:
        raise FireschedError(f"swizzle_grid: {swizzle} is the identity (bits=0), which moves nothing; draw a "
                             "swizzle with bits >= 1, e.g. Swizzle(3, 4, 3) (SW128)")
    eb = default_elem_bytes(swizzle) if elem_bytes is None else int(elem_bytes)
    if eb not in (1, 2, 4, 8, 16):
        raise FireschedError(f"swizzle_grid: elem_bytes={elem_bytes!r} is no element size; use 1, 2, 4, 8 or 16")
    unit = 1 << swizzle.base
    row_len = 1 << (swizzle.base + abs(swizzle.shift))
    rows = int(swizzle.size()) // row_len
    upr = row_len // unit
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(upr, dtype=np.int64)[None, :]
    phys = np.asarray(swizzle((r * upr + c) * unit), dtype=np.int64)
    banks = _bank(phys * eb)
    cells = tuple(tuple(Cell(str(int(b)), bank_colour(int(b))) for b in row) for row in banks)
    ub = unit * eb
    legend = (f"cell (r, c): unit c of row r ({unit} offsets of {eb} B = {ub} B); label and colour: the bank "
              f"its first word lands in")
    if ub == CHUNK_BYTES:
        n = min(8, rows)
        legend += f"; 16-byte column reads of {n} rows: {_ways_text(bank_conflict_ways(banks, n))}"
    return Grid(title or f"{swizzle} bank map ({eb}-byte elements)", cells, tuple(map(str, range(rows))),
                tuple(map(str, range(upr))), legend)


def _ways_text(ways: int) -> str:
    return "conflict-free" if ways == 1 else f"{ways}-way bank conflict"


def tv_grid(tv: Any, *, title: str | None = None) -> Grid:
    """A ``TVLayout`` drawn over its tile: cell (row, col) names the thread and value that hold
    the element, ``T<t>V<v>`` (``+n`` when n more pairs hold it too), coloured by thread — the
    figures of CuTe's ``print_latex``.  Elements no pair holds are left blank."""
    rows, cols = tv.tile
    nt, nv = int(tv.num_threads), int(tv.num_values)
    t = np.arange(nt, dtype=np.int64)[:, None]
    v = np.arange(nv, dtype=np.int64)[None, :]
    idx = np.broadcast_to(np.asarray(tv.index(t, v), dtype=np.int64), (nt, nv))
    owners: dict[int, list[tuple[int, int]]] = {}
    for ti in range(nt):
        for vi in range(nv):
            owners.setdefault(int(idx[ti, vi]), []).append((ti, vi))
    cells = []
    replicated = False
    for r in range(rows):
        row = []
        for c in range(cols):
            who = owners.get(r + rows * c)     # TV layouts index their tile column-major
            if not who:
                row.append(Cell(""))
                continue
            ti, vi = who[0]
            more = f"+{len(who) - 1}" if len(who) > 1 else ""
            replicated |= len(who) > 1
            row.append(Cell(f"T{ti}V{vi}{more}", palette_colour(ti)))
        cells.append(tuple(row))
    legend = f"cell (row, col): thread T and value V holding it ({nt} threads x {nv} values); colour: thread"
    if replicated:
        legend += "; +n: n more (thread, value) pairs hold it too"
    return Grid(title or f"TV{tv.layout} on {rows}x{cols}", tuple(cells), tuple(map(str, range(rows))),
                tuple(map(str, range(cols))), legend)


def atom_grids(atom: Any) -> list[Grid]:
    """The TV layouts of an atom's register operands (e.g. A, B, C of ``mma_m16n8k16_f16_f32``),
    one grid each."""
    out = []
    dts = dict(getattr(atom, "dtypes", ()))
    for op in atom.operands:
        if getattr(op, "tv", None) is None:
            continue
        dt = dts.get(op.name)
        what = f"{op.memory} {dt}" if dt is not None else op.memory
        out.append(tv_grid(op.tv, title=f"{atom.name} operand {op.name} ({what}): TV{op.tv.layout} on "
                                         f"{op.tv.tile[0]}x{op.tv.tile[1]}"))
    if not out:
        raise FireschedError(f"atom {atom.name} has no operand with a thread-value layout (its operands: "
                             f"{', '.join(f'{o.name} in {o.memory}' for o in atom.operands)}); TV layouts belong "
                             "to register operands of MMA, ldmatrix and stmatrix atoms, e.g. mma_m16n8k16_f16_f32")
    return out


def smem_grid(smem: Any, elem_bytes: int, *, name: str = "", stage: int = 0) -> Grid:
    """The bank map of a shared-memory tile as lowering lays it out (``SmemLayout``: ``rows``,
    ``cols``, ``offset(row, col, stage)``, swizzle included): one cell per 16-byte chunk of each
    row (per element when rows are not whole chunks), labelled and coloured with the bank its
    first word lands in; the legend gives the worst conflict of 16-byte column reads of 8 rows.
    """
    rows, cols, eb = int(smem.rows), int(smem.cols), int(elem_bytes)
    per = CHUNK_BYTES // eb if eb <= CHUNK_BYTES and (cols * eb) % CHUNK_BYTES == 0 else 1
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(cols // per, dtype=np.int64)[None, :] * per
    offs = np.broadcast_to(np.asarray(smem.offset(r, c, stage), dtype=np.int64), (rows, cols // per))
    banks = _bank(offs * eb)
    cells = tuple(tuple(Cell(str(int(b)), bank_colour(int(b))) for b in row) for row in banks)
    unit = f"16-byte chunk ({per} elements)" if per > 1 else "element"
    sw = getattr(smem, "swizzle", None)
    sw_text = f" {sw}" if sw is not None and sw.bits else " unswizzled"
    legend = f"cell (r, c): {unit} c of row r; label and colour: its first bank"
    if per > 1:
        legend += f"; 16-byte column reads of 8 rows: {_ways_text(bank_conflict_ways(banks))}"
    title = f"shared {name} {rows}x{cols} x {eb} B{sw_text}".replace("  ", " ")
    stages = int(getattr(smem, "stages", 1))
    if stages > 1:
        title += f" (stage {stage} of {stages})"
    return Grid(title, cells, tuple(map(str, range(rows))), tuple(str(j * per) for j in range(cols // per)), legend)


def repr_svg(obj: Any) -> str | None:
    """SVG of a ``Layout``, ``ComposedLayout``, ``Swizzle`` or ``TVLayout`` for notebooks
    (``_repr_svg_``); None — the notebook then shows the text repr — when the picture would have
    more than ``MAX_REPR_CELLS`` cells or the object cannot be drawn (the identity swizzle)."""
    if hasattr(obj, "num_threads") and hasattr(obj, "tile"):
        n = obj.tile[0] * obj.tile[1]
        make = tv_grid
    elif hasattr(obj, "y_mask"):
        if obj.bits == 0:
            return None
        n = int(obj.size()) >> obj.base
        make = swizzle_grid
    else:
        n = int(obj.size())
        make = layout_grid
    if n > MAX_REPR_CELLS:
        return None
    return svg(make(obj))
