"""Element types.

A ``DType`` is a value: its name, its bit width, how numpy stores it (through ``ml_dtypes`` for
bf16, fp8 and int4) and its CUDA spelling.  Sub-byte types (i4, u4) carry their bit width; their
numpy storage is one element per byte, and ``pack``/``unpack`` convert to and from the dense
two-per-byte form the GPU reads (low nibble first, as PTX's ``.s4``/``.u4`` operands expect).
"""

from __future__ import annotations

import functools

import attrs
import ml_dtypes
import numpy as np


@attrs.frozen(repr=False)
class DType:
    name: str
    bits: int
    kind: str            # "float" | "int" | "uint"
    np_name: str         # numpy / ml_dtypes storage name
    cuda: str            # CUDA C++ spelling of one element (sub-byte: the storage byte)

    @property
    def np(self) -> np.dtype:
        return _np_dtype(self.np_name)

    @property
    def bytes(self) -> float:
        """Size in bytes; 0.5 for 4-bit types."""
        return self.bits / 8

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_subbyte(self) -> bool:
        return self.bits < 8

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"

    def __str__(self) -> str:
        return self.name


_NUMPY_NATIVE = {"float16", "float32", "float64", "int8", "uint8", "int32", "int64"}


@functools.lru_cache(maxsize=None)
def _np_dtype(np_name: str) -> np.dtype:
    """The numpy dtype stored under ``np_name`` (``DType.np``, asked for at every interpreted
    statement: built once per name)."""
    if np_name in _NUMPY_NATIVE:
        return np.dtype(np_name)
    return np.dtype(getattr(ml_dtypes, np_name))

f16 = DType("f16", 16, "float", "float16", "__half")
bf16 = DType("bf16", 16, "float", "bfloat16", "__nv_bfloat16")
f32 = DType("f32", 32, "float", "float32", "float")
f64 = DType("f64", 64, "float", "float64", "double")
# tf32 is an f32 in memory whose mantissa the tensor core reads as 10 bits.
tf32 = DType("tf32", 32, "float", "float32", "float")
f8e4m3 = DType("f8e4m3", 8, "float", "float8_e4m3fn", "__nv_fp8_e4m3")
f8e5m2 = DType("f8e5m2", 8, "float", "float8_e5m2", "__nv_fp8_e5m2")
i8 = DType("i8", 8, "int", "int8", "signed char")
u8 = DType("u8", 8, "uint", "uint8", "unsigned char")
i4 = DType("i4", 4, "int", "int4", "unsigned char")
u4 = DType("u4", 4, "uint", "uint4", "unsigned char")
i32 = DType("i32", 32, "int", "int32", "int")

ALL: tuple[DType, ...] = (f16, bf16, f32, f64, tf32, f8e4m3, f8e5m2, i8, u8, i4, u4, i32)
BY_NAME: dict[str, DType] = {d.name: d for d in ALL}


def dtype(x: DType | str) -> DType:
    """Look up a dtype by name (``"f16"``) or pass a ``DType`` through."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in BY_NAME:
        return BY_NAME[x]
    raise ValueError(f"unknown dtype {x!r}; allowed: {', '.join(BY_NAME)}")


def round_to(d: DType, x: np.ndarray) -> np.ndarray:
    """Round ``x`` to the values ``d`` can hold, returned as float64 (tf32 keeps 10 mantissa bits)."""
    x = np.asarray(x)
    if d is tf32 or d.name == "tf32":
        # Round to nearest even on the 13 dropped mantissa bits, as cvt.rna.tf32.f32 would (ties away).
        u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
        u = (u + 0x1000) & 0xFFFFE000
        return u.astype(np.uint32).view(np.float32).astype(np.float64)
    if x.dtype != d.np:
        x = x.astype(d.np)
    return x.astype(np.float64)


def pack(d: DType, x: np.ndarray) -> np.ndarray:
    """Dense device bytes for ``x`` (last axis packed two per byte for 4-bit types)."""
    arr = np.asarray(x).astype(d.np)
    if not d.is_subbyte:
        return arr.view(np.uint8).reshape(*arr.shape[:-1], -1) if arr.ndim else arr.view(np.uint8)
    if arr.shape[-1] % 2:
        raise ValueError(f"pack({d}): the last axis has odd length {arr.shape[-1]}; 4-bit values pack in pairs")
    nib = arr.view(np.uint8) & 0xF
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)


def unpack(d: DType, raw: np.ndarray) -> np.ndarray:
    """Inverse of ``pack``: bytes back to an array of ``d``."""
    raw = np.asarray(raw, dtype=np.uint8)
    if not d.is_subbyte:
        return raw.view(d.np)
    lo = raw & 0xF
    hi = raw >> 4
    nib = np.stack([lo, hi], axis=-1).reshape(*raw.shape[:-1], raw.shape[-1] * 2)
    if d.kind == "int":
        return ((nib.astype(np.int8) ^ 8) - 8).astype(d.np)
    return nib.astype(d.np)
