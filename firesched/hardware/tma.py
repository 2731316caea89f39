"""TMA tensor maps (``cuTensorMapEncodeTiled``): the data-type and swizzle codes, the rules a tiled
map of rank 1 to 5 must satisfy (2-D for matrices, 3-D for batches of them), the coordinates a box
may start at, and where a box lands in shared memory.

These are facts of the hardware and driver, shared by the kernel IR (which validates a
``TensorMapParam``), the runtime (which encodes the map) and the interpreter (which places a box).
"""

from __future__ import annotations

import numpy as np

from .descriptors import SWIZZLES

#: firesched dtype name -> CUtensorMapDataType value (CU_TENSOR_MAP_DATA_TYPE_*).
TMA_DATA_TYPES = {"u8": 0, "i8": 0, "f8e4m3": 0, "f8e5m2": 0, "i32": 3, "f16": 6, "f32": 7,
                  "tf32": 7, "f64": 8, "bf16": 9}
#: Swizzle span in bytes -> CUtensorMapSwizzle value.
TMA_SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}


#: The ranks of a tiled tensor map: ``cuTensorMapEncodeTiled`` takes 1 to 5 dimensions (3 to 5
#: with interleave, which firesched does not use).
TMA_RANKS = (1, 2, 3, 4, 5)


def dim_names(rank: int) -> tuple[str, ...]:
    """The names messages give the dimensions of a rank-``rank`` view, outermost first: the
    innermost (contiguous) one is ``"cols"``, the next ``"rows"``, the others ``"dim i"`` by
    their row-major index (``dim 0`` is the batch of a (batch, rows, cols) tensor)."""
    r = int(rank)
    return tuple(f"dim {i}" for i in range(r - 2)) + ("rows", "cols")[max(2 - r, 0):]


def coordinate_names(rank: int) -> tuple[str, ...]:
    """The names messages give the coordinates of a rank-``rank`` box, innermost first as TMA
    takes them (``$c0``, ``$c1``, ...): ``"column"``, ``"row"``, then ``"dim i"`` for the outer
    dimensions (``$c2`` of a rank-3 map is ``dim 0``)."""
    r = int(rank)
    return ("column", "row")[:r] + tuple(f"dim {r - 1 - p}" for p in range(2, r))


def _stride_name(rank: int, i: int) -> str:
    return "row stride" if i == rank - 2 else f"stride of dim {i}"


def tma_box_problems(elem_bytes: int, shape, strides_bytes, box, swizzle: int, *,
                     rank: int | None = None) -> list[str]:
    """Why a tiled tensor map with these parameters would be rejected, as sentences (empty
    when it is valid).  ``shape``, ``strides_bytes`` and ``box`` are in row-major order,
    outermost first (``(rows, cols)``, ``(batch, rows, cols)``...), one entry per dimension, of
    rank 1 to 5 (``rank``, when given, is the one the caller requires); the innermost stride must
    be the element size (TMA's innermost dimension is contiguous).

    The rules are those of cuTensorMapEncodeTiled: global strides (all but the innermost)
    multiples of 16 below 2**40, dimensions in 1..2**32, box extents in 1..256, the box's inner
    extent a multiple of 16 bytes and, with a swizzle, at most the swizzle span; and firesched's
    own: strides positive, and no dimension steps inside the span of the dimensions below it
    (the view's elements would overlap: a row stride smaller than a row, a batch stride smaller
    than its matrix); the strides of the outer dimensions may come in any order."""
    out: list[str] = []
    eb = int(elem_bytes)
    shape, strides_bytes, box = tuple(shape), tuple(strides_bytes), tuple(box)
    r = len(shape) if rank is None else int(rank)
    if r == 2 and (len(shape) != 2 or len(strides_bytes) != 2 or len(box) != 2):
        return [f"shape {shape}, strides {strides_bytes} and box {box} must each have 2 entries (rows, cols)"]
    if r not in TMA_RANKS:
        return [f"shape {shape} has {len(shape)} dimensions; a tiled tensor map has 1 to 5"]
    if len(shape) != r or len(strides_bytes) != r or len(box) != r:
        return [f"shape {shape}, strides {strides_bytes} and box {box} must each have {r} entries "
                f"({', '.join(dim_names(r))})"]
    names = dim_names(r)
    shape = tuple(int(x) for x in shape)
    strides = tuple(int(x) for x in strides_bytes)
    box = tuple(int(x) for x in box)
    cols, bc = shape[-1], box[-1]
    for name, n in zip(names, shape):
        if not 1 <= n <= 1 << 32:
            out.append(f"global {name}={n} must be in 1..2**32")
    if strides[-1] != eb:
        out.append(f"the column stride is {strides[-1]} bytes; TMA's inner dimension must be contiguous ({eb} bytes)")
    bad_stride = False
    for i in range(r - 1):
        s = strides[i]
        if s % 16 or not 0 < s < 1 << 40:
            out.append(f"the {_stride_name(r, i)} is {s} bytes; it must be a positive multiple of 16 below 2**40")
            bad_stride = True
    if not bad_stride:
        # each outer dimension, smallest stride first, must step over everything below it; one
        # of extent 1 above the rows (a batch of one) steps nowhere, so its stride is free
        need, what = cols * eb, f"a row ({cols} x {eb} bytes)"
        for i in sorted((i for i in range(r - 1) if shape[i] > 1 or i == r - 2), key=lambda i: (strides[i], -i)):
            if strides[i] < need:
                out.append(f"the {_stride_name(r, i)} ({strides[i]} bytes) is smaller than {what}")
            need = strides[i] * shape[i]
            what = f"the {shape[i]} x {strides[i]} bytes of {names[i]}"
    for name, n in zip(names, box):
        if not 1 <= n <= 256:
            out.append(f"box {name}={n} must be in 1..256")
    if (bc * eb) % 16:
        out.append(f"the box's inner extent is {bc * eb} bytes; it must be a multiple of 16")
    if swizzle not in TMA_SWIZZLES:
        out.append(f"swizzle={swizzle!r} bytes; allowed: 0, 32, 64, 128")
    elif swizzle and bc * eb > swizzle:
        out.append(f"the box's inner extent ({bc * eb} bytes) is larger than the {swizzle}-byte swizzle span")
    return out


def tma_coordinate_problems(elem_bytes: int, coords, *, store: bool = False, rank: int | None = None) -> list[str]:
    """Why a TMA box at ``coords`` of a tiled map of ``elem_bytes``-byte elements would fault, as
    sentences (empty when it is valid); ``store`` for a TMA store.  ``coords`` are innermost
    first, as the instruction takes them: (column, row) for a 2-D map, (column, row, batch) for
    a (batch, rows, cols) one; rank 1 to 5 (``rank``, when given, is the one the caller requires).

    Measured on an H100 (``tests/gpu/tma_edges.py``, one process per case, 2026-11-23): every
    box whose column coordinate is not on a 16-byte boundary of the row stops the kernel with
    "an illegal instruction was encountered" (loads and stores, e.g. f16 at column 70 or 4, u8
    at -4, bf16 at -4, f32 at -2; Triton's TMA descriptors enforce the same rule), and so does
    every *store* with a negative coordinate, even aligned (f16 at (-8, 0) and at (0, -4)).
    Aligned loads may hang over any edge, negative ones included, and stores over the far edges;
    out-of-bounds elements then read as zeros or are not written.  The coordinates themselves
    are signed 32-bit registers.  Rank-3 maps were not measured at these edges: the same rules
    hold for them here (the column alone must be aligned; a store refuses a negative coordinate
    of any dimension)."""
    eb = int(elem_bytes)
    coords = tuple(coords)
    r = len(coords) if rank is None else int(rank)
    if r == 2 and len(coords) != 2:
        return [f"coordinates {coords} must have 2 entries (column, row)"]
    if r not in TMA_RANKS:
        return [f"coordinates {coords} have {len(coords)} entries; a tiled tensor map has 1 to 5 dimensions"]
    if len(coords) != r:
        return [f"coordinates {coords} must have {r} entries ({', '.join(coordinate_names(r))})"]
    out = []
    for name, c in zip(coordinate_names(r), coords):
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not -(1 << 31) <= int(c) < 1 << 31:
            out.append(f"the {name} coordinate {c!r} is not a signed 32-bit integer")
    if out:
        return out
    if (int(coords[0]) * eb) % 16:
        out.append(f"the box starts at column {coords[0]}, byte {int(coords[0]) * eb} of the row; TMA boxes "
                   f"must start on a 16-byte boundary along the contiguous dimension (a column that is a "
                   f"multiple of {max(16 // eb, 1)})")
    if store and min(int(c) for c in coords) < 0:
        out.append(f"a TMA store at {coords} starts before the tensor; stores may only hang over its far "
                   f"edges (coordinates >= 0)")
    return out


def box_byte_offsets(box_rows: int, box_cols: int, elem_bytes: int, swizzle: int, dst: int = 0) -> np.ndarray:
    """Shared-window byte address of element ``(i, j)`` of a 2-D TMA box written at ``dst``,
    ``[box_rows, box_cols]``: rows of ``box_cols * elem_bytes`` bytes, then the swizzle of the
    span on absolute addresses (firesched's model requires the inner extent to equal the span
    when a swizzle is used).  ``box_byte_offsets_nd`` for any rank."""
    return box_byte_offsets_nd((box_rows, box_cols), elem_bytes, swizzle, dst)


def box_byte_offsets_nd(box, elem_bytes: int, swizzle: int, dst: int = 0) -> np.ndarray:
    """Shared-window byte address of every element of a TMA box of extents ``box`` (outermost
    first, rank 1 to 5) written at ``dst``, an array of shape ``box``.

    The box lands row-major over its dimensions, outermost first: the rows of ``box[-1] *
    elem_bytes`` bytes of every outer index follow each other (a (2, 8, 64) box is the 16 rows
    of its two 8 x 64 matrices), then the swizzle of the span acts on the absolute addresses as
    for 2-D boxes (firesched's model requires the inner extent to equal the span when a swizzle
    is used), so a (1, rows, cols) box lands exactly as the 2-D (rows, cols) box."""
    box = tuple(int(x) for x in box)
    if len(box) not in TMA_RANKS or min(box) < 1:
        raise ValueError(f"box_byte_offsets_nd: box {box} must have 1 to 5 positive extents, outermost first")
    eb = int(elem_bytes)
    lin = int(dst) + np.arange(int(np.prod(box)), dtype=np.int64).reshape(box) * eb
    return np.asarray(SWIZZLES[swizzle](lin), dtype=np.int64)
