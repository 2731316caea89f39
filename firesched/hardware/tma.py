"""TMA tensor maps (``cuTensorMapEncodeTiled``): the data-type and swizzle codes, the rules a 2-D
tiled map must satisfy, and where a box lands in shared memory.

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


def tma_box_problems(elem_bytes: int, shape, strides_bytes, box, swizzle: int) -> list[str]:
    """Why a 2-D tiled tensor map with these parameters would be rejected, as sentences (empty
    when it is valid).  ``shape``, ``strides_bytes`` and ``box`` are in row-major order
    ``(rows, cols)``; the column stride must be the element size (TMA's innermost dimension is
    contiguous).  The rules are those of cuTensorMapEncodeTiled: global strides multiples of 16
    below 2**40, dimensions in 1..2**32, box extents in 1..256, the box's inner extent a
    multiple of 16 bytes and, with a swizzle, at most the swizzle span."""
    out: list[str] = []
    eb = int(elem_bytes)
    shape, strides_bytes, box = tuple(shape), tuple(strides_bytes), tuple(box)
    if len(shape) != 2 or len(strides_bytes) != 2 or len(box) != 2:
        return [f"shape {shape}, strides {strides_bytes} and box {box} must each have 2 entries (rows, cols)"]
    rows, cols = (int(x) for x in shape)
    rs, cs = (int(x) for x in strides_bytes)
    br, bc = (int(x) for x in box)
    for name, n in (("rows", rows), ("cols", cols)):
        if not 1 <= n <= 1 << 32:
            out.append(f"global {name}={n} must be in 1..2**32")
    if cs != eb:
        out.append(f"the column stride is {cs} bytes; TMA's inner dimension must be contiguous ({eb} bytes)")
    if rs % 16 or not 0 < rs < 1 << 40:
        out.append(f"the row stride is {rs} bytes; it must be a positive multiple of 16 below 2**40")
    elif rs < cols * eb:
        out.append(f"the row stride ({rs} bytes) is smaller than a row ({cols} x {eb} bytes)")
    for name, n in (("rows", br), ("cols", bc)):
        if not 1 <= n <= 256:
            out.append(f"box {name}={n} must be in 1..256")
    if (bc * eb) % 16:
        out.append(f"the box's inner extent is {bc * eb} bytes; it must be a multiple of 16")
    if swizzle not in TMA_SWIZZLES:
        out.append(f"swizzle={swizzle!r} bytes; allowed: 0, 32, 64, 128")
    elif swizzle and bc * eb > swizzle:
        out.append(f"the box's inner extent ({bc * eb} bytes) is larger than the {swizzle}-byte swizzle span")
    return out


def tma_coordinate_problems(elem_bytes: int, coords, *, store: bool = False) -> list[str]:
    """Why a TMA box at ``coords`` = (column, row) of a tiled map of ``elem_bytes``-byte elements
    would fault, as sentences (empty when it is valid); ``store`` for a TMA store.

    Measured on an H100 (``tests/gpu/tma_edges.py``, one process per case, 2026-11-23): every
    box whose column coordinate is not on a 16-byte boundary of the row stops the kernel with
    "an illegal instruction was encountered" (loads and stores, e.g. f16 at column 70 or 4, u8
    at -4, bf16 at -4, f32 at -2; Triton's TMA descriptors enforce the same rule), and so does
    every *store* with a negative coordinate, even aligned (f16 at (-8, 0) and at (0, -4)).
    Aligned loads may hang over any edge, negative ones included, and stores over the far edges;
    out-of-bounds elements then read as zeros or are not written.  The coordinates themselves
    are signed 32-bit registers."""
    eb = int(elem_bytes)
    coords = tuple(coords)
    if len(coords) != 2:
        return [f"coordinates {coords} must have 2 entries (column, row)"]
    out = []
    for name, c in zip(("column", "row"), coords):
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
    """Shared-window byte address of element ``(i, j)`` of a TMA box written at ``dst``,
    ``[box_rows, box_cols]``: rows of ``box_cols * elem_bytes`` bytes, then the swizzle of the
    span on absolute addresses (firesched's model requires the inner extent to equal the span
    when a swizzle is used)."""
    i = np.arange(box_rows, dtype=np.int64)[:, None]
    j = np.arange(box_cols, dtype=np.int64)[None, :]
    lin = int(dst) + i * (box_cols * elem_bytes) + j * elem_bytes
    return np.asarray(SWIZZLES[swizzle](lin), dtype=np.int64)

