"""The sm_90 shared-memory matrix descriptor of wgmma operands, and the canonical layouts it names.

Shared-memory operands (``smem_descriptor`` / ``operand_byte_offsets``): the sm_90 matrix
descriptor holds the start address >> 4 in bits 0-13, the leading-dimension byte offset (LBO)
>> 4 in bits 16-29, the stride-dimension byte offset (SBO) >> 4 in bits 32-45, the matrix base
offset in bits 49-51 and the swizzle mode in bits 62-63 (0 none, 1 128B, 2 64B, 3 32B), as the
PTX ISA's "Matrix Descriptor Format" states.  The canonical layouts (in bytes, ``eb`` the element
size, ``S`` the swizzle span, ``T = 16 / eb`` elements per 16-byte chunk):

* K-major, no swizzle: 8x16-byte core matrices; element (r, k) at
  ``(r % 8)*16 + (r // 8)*SBO + ((k*eb) // 16)*LBO + (k*eb) % 16``;
* K-major, swizzle S: rows of S bytes; ``(r % 8)*S + (r // 8)*SBO + k*eb`` (LBO unused);
* MN-major, no swizzle: element (mn, k) at ``(mn % T)*eb + (mn // T)*SBO + (k % 8)*16 +
  (k // 8)*LBO``;
* MN-major, swizzle S (``W = S / 16``): ``(mn % T)*eb + ((mn // T) % W)*16 + (mn // (T*W))*LBO +
  (k % 8)*S + (k // 8)*SBO``;

added to the start address, and then, for a swizzle mode, the 16-byte chunk bits of the *shared
address* XORed with its row bits: 128B is ``Swizzle(3, 4, 3)``, 64B ``Swizzle(2, 4, 3)``, 32B
``Swizzle(1, 4, 3)`` on byte addresses (``firesched.layout.SW128/SW64/SW32``).  firesched always
encodes base offset 0, which requires the first row of every 8-row swizzle atom to start on a
multiple of ``8*S`` bytes; a TMA box written with the same swizzle lands in exactly this form.
"""

from __future__ import annotations

import attrs
import numpy as np

from ..layout import NO_SWIZZLE, SW32, SW64, SW128

#: Swizzle span in bytes -> the 2-bit mode of the matrix descriptor (bits 62-63).
DESCRIPTOR_MODE = {0: 0, 128: 1, 64: 2, 32: 3}
#: The swizzle spans (bytes) that wgmma descriptors and TMA share.
SWIZZLE_SPANS = (32, 64, 128)
#: Swizzle span in bytes -> the XOR pattern on shared-memory byte addresses.
SWIZZLES = {0: NO_SWIZZLE, 32: SW32, 64: SW64, 128: SW128}

# --------------------------------------------------------------------------- shared-memory matrix descriptors

@attrs.frozen
class SmemDescriptor:
    """The fields of an sm_90 shared-memory matrix descriptor, in bytes (``swizzle`` is the span:
    0, 32, 64 or 128)."""

    addr: int
    lbo: int
    sbo: int
    swizzle: int = 0
    base_offset: int = 0


def _check_field(name: str, value: int, limit: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"smem_descriptor: {name}={value!r} is not an int")
    if value < 0 or value % 16 or value >= limit:
        raise ValueError(f"smem_descriptor: {name}={value} must be a multiple of 16 in [0, {limit})")


def smem_descriptor(addr_bytes: int, lbo_bytes: int, sbo_bytes: int, swizzle: int = 0,
                    base_offset: int = 0) -> int:
    """The 64-bit wgmma matrix descriptor of a shared-memory operand.

    ``addr_bytes`` is the operand's shared-window address, ``lbo_bytes`` / ``sbo_bytes`` the
    leading / stride dimension byte offsets, ``swizzle`` the swizzle span in bytes (0, 32, 64,
    128; encoded as mode 0, 3, 2, 1).  Bits: start address >> 4 in 0-13 (the address is taken
    modulo 2**18), LBO >> 4 in 16-29, SBO >> 4 in 32-45, base offset in 49-51, mode in 62-63.
    """
    _check_field("addr_bytes", int(addr_bytes) & 0x3FFFF, 1 << 18)
    _check_field("lbo_bytes", lbo_bytes, 1 << 18)
    _check_field("sbo_bytes", sbo_bytes, 1 << 18)
    if swizzle not in DESCRIPTOR_MODE:
        raise ValueError(f"smem_descriptor: swizzle={swizzle!r}; allowed: 0, 32, 64, 128 (bytes)")
    if not 0 <= int(base_offset) < 8:
        raise ValueError(f"smem_descriptor: base_offset={base_offset!r} must be in 0..7")
    return (((int(addr_bytes) & 0x3FFFF) >> 4)
            | ((int(lbo_bytes) >> 4) << 16)
            | ((int(sbo_bytes) >> 4) << 32)
            | (int(base_offset) << 49)
            | (DESCRIPTOR_MODE[swizzle] << 62))


def decode_smem_descriptor(desc: int) -> SmemDescriptor:
    """Inverse of ``smem_descriptor`` (the address comes back modulo 2**18)."""
    desc = int(desc)
    mode = (desc >> 62) & 3
    span = {v: k for k, v in DESCRIPTOR_MODE.items()}[mode]
    return SmemDescriptor(addr=(desc & 0x3FFF) << 4, lbo=((desc >> 16) & 0x3FFF) << 4,
                          sbo=((desc >> 32) & 0x3FFF) << 4, swizzle=span,
                          base_offset=(desc >> 49) & 7)


def canonical_offset(row, k, lbo: int, sbo: int, swizzle: int, *, major: str = "K", elem_bytes: int = 2):
    """Byte offset of element ``(row, k)`` of a wgmma operand from its start, *before* the swizzle.

    Only ``+ * // %`` touch ``row`` and ``k``, so they may be ints, numpy arrays or index
    expressions.  ``row`` is the M (A) or N (B) coordinate; ``major`` is ``"K"`` or ``"MN"``."""
    if swizzle not in SWIZZLES:
        raise ValueError(f"canonical_offset: swizzle={swizzle!r}; allowed: 0, 32, 64, 128")
    if major not in ("K", "MN"):
        raise ValueError(f"canonical_offset: major={major!r}; allowed: 'K', 'MN'")
    eb = int(elem_bytes)
    if major == "K":
        kb = k * eb
        if swizzle == 0:
            return (row % 8) * 16 + (row // 8) * sbo + (kb // 16) * lbo + kb % 16
        return (row % 8) * swizzle + (row // 8) * sbo + kb
    t = 16 // eb
    if swizzle == 0:
        return (row % t) * eb + (row // t) * sbo + (k % 8) * 16 + (k // 8) * lbo
    w = swizzle // 16
    return ((row % t) * eb + ((row // t) % w) * 16 + (row // (t * w)) * lbo
            + (k % 8) * swizzle + (k // 8) * sbo)


def operand_byte_offsets(addr: int, lbo: int, sbo: int, swizzle: int, rows: int, *,
                         major: str = "K", elem_bytes: int = 2, k: int = 16) -> np.ndarray:
    """Shared-window byte address of element ``(row, kk)`` of a wgmma operand, ``[rows, k]``.

    ``rows`` is the M (A) or N (B) extent, ``k`` the K extent of one instruction; ``major`` is
    ``"K"`` (the K elements of a row are contiguous) or ``"MN"``.  This is ``canonical_offset``
    added to the start address ``addr`` and then swizzled as an absolute address (module
    docstring)."""
    r = np.arange(rows, dtype=np.int64)[:, None]
    kk = np.arange(k, dtype=np.int64)[None, :]
    lin = canonical_offset(r, kk, lbo, sbo, swizzle, major=major, elem_bytes=elem_bytes)
    return np.asarray(SWIZZLES[swizzle](int(addr) + lin), dtype=np.int64)


def descriptor_byte_offsets(desc: int, rows: int, *, major: str = "K", elem_bytes: int = 2,
                            k: int = 16) -> np.ndarray:
    """The inverse of ``smem_descriptor`` as the hardware reads it: the shared-window byte
    address of element ``(row, kk)`` of the ``rows`` x ``k`` operand the 64-bit descriptor
    ``desc`` names (base offset 0 only)."""
    f = decode_smem_descriptor(desc)
    if f.base_offset:
        raise ValueError(f"descriptor_byte_offsets: base offset {f.base_offset} is not modelled (only 0)")
    return operand_byte_offsets(f.addr, f.lbo, f.sbo, f.swizzle, rows, major=major, elem_bytes=elem_bytes, k=k)


def swizzle_atom_bytes(swizzle: int) -> int:
    """Bytes after which a swizzle pattern repeats (8 rows of the span): 256, 512, 1024; 16 for
    no swizzle (one 16-byte chunk)."""
    return 8 * swizzle if swizzle else 16

