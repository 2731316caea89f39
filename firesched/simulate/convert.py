"""Rounding computed values into a buffer's dtype.

Moves (COPY, cp.async, ldmatrix, stmatrix) carry bits and never come here.  Arithmetic does:
``Pointwise`` and ``cvt`` compute in float64, MMA and wgmma results come back from their atom's
semantics, and each is rounded once to the destination dtype, as the hardware rounds once per
instruction.  Integers round to nearest and saturate (a float out of range does not wrap).
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DType, round_to


def to_dtype(values, dt: DType) -> np.ndarray:
    """Values converted to ``dt``'s numpy type, rounding to nearest (integers: rint, saturated)."""
    values = np.asarray(values)
    if values.dtype == dt.np:
        return values
    if dt.name == "tf32":
        return round_to(dt, values.astype(np.float32)).astype(np.float32)
    if dt.kind in ("int", "uint") and values.dtype.kind == "f":
        info = int_range(dt)
        values = np.clip(np.rint(values.astype(np.float64)), info[0], info[1])
    with np.errstate(over="ignore"):        # past the largest finite value: infinity, as the GPU rounds
        return values.astype(dt.np)


def int_range(dt: DType) -> tuple[int, int]:
    """The smallest and largest value of integer dtype ``dt``."""
    if dt.kind == "int":
        return -(1 << (dt.bits - 1)), (1 << (dt.bits - 1)) - 1
    return 0, (1 << dt.bits) - 1
