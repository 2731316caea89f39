"""Packings: a tensor stored with its elements permuted inside aligned blocks of its major dim.

A sub-byte weight is read by a thread eight values to a 32-bit register, and the register a
dequantisation atom converts must hold exactly the values the consuming MMA fragment wants, in
the order the atom leaves them.  Those values are not contiguous in the logical tensor (an
``mma.m16n8k16`` B fragment holds k = 2t, 2t+1, 2t+8, 2t+9 of a column), so the weight is stored
*packed*: inside every aligned block of ``block`` elements along the major dim, storage position
``p`` holds logical element ``order[p]``.  Everything else about the tensor (its dims, shape,
the order of its blocks and rows) is unchanged, so copies that move whole blocks — global to
shared memory in 16-byte chunks — keep the packing, and only the move that reads the registers
needs to know it::

    one block of 32 k of column n (16 bytes, 4 words of 8 nibbles), mma.m16n8k16 B, lane t = 0..3:

    storage  word 0            word 1            word 2            word 3
    holds k  0 8 16 24 1 9 17 25  2 10 18 26 3 11 19 27  4 12 ...        6 14 22 30 7 15 23 31
             '-- lane 0's values: after dequant, registers (k0 k1) (k8 k9) (k16 k17) (k24 k25)

``Packing`` is the value; ``pack`` / ``unpack`` apply it to host arrays.  Which packing a
schedule needs is derived from its atoms (``lower.synthesis``), not written by hand.
"""

from __future__ import annotations

import attrs
import numpy as np

__all__ = ["Packing"]


def _order(v) -> tuple[int, ...]:
    return tuple(int(x) for x in v)


@attrs.frozen
class Packing:
    """Storage position ``p`` of every aligned block of ``block`` elements along the major dim
    holds logical element ``order[p]`` of that block (``order`` is a permutation of
    ``range(block)``)."""

    block: int
    order: tuple[int, ...] = attrs.field(converter=_order)

    def __attrs_post_init__(self):
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block <= 0:
            raise ValueError(f"Packing: block={self.block!r} must be a positive int")
        if sorted(self.order) != list(range(self.block)):
            raise ValueError(f"Packing: order must be a permutation of range({self.block}); got {self.order}")

    @property
    def storage_of(self) -> np.ndarray:
        """``[block]``: the storage position of logical element ``i`` of a block (``order``'s inverse)."""
        inv = np.empty(self.block, dtype=np.int64)
        inv[np.asarray(self.order, dtype=np.int64)] = np.arange(self.block)
        return inv

    def position(self, i: int) -> int:
        """The storage index of logical index ``i`` along the major dim."""
        return i - i % self.block + int(self.storage_of[i % self.block])

    def _check(self, x: np.ndarray, axis: int, what: str) -> int:
        n = x.shape[axis]
        if n % self.block:
            raise ValueError(f"{what}: the packed axis has {n} elements; a packing of blocks of {self.block} needs a "
                             f"multiple of {self.block} (pad the weight along it)")
        return n

    def pack(self, x, axis: int = -1) -> np.ndarray:
        """``x`` in storage order: along ``axis``, block ``b``'s position ``p`` takes ``x[b, order[p]]``."""
        x = np.asarray(x)
        n = self._check(x, axis, "Packing.pack")
        idx = (np.arange(n) // self.block) * self.block + np.tile(np.asarray(self.order), n // self.block)
        return np.take(x, idx, axis=axis)

    def unpack(self, x, axis: int = -1) -> np.ndarray:
        """The inverse of ``pack``: logical order from storage order."""
        x = np.asarray(x)
        n = self._check(x, axis, "Packing.unpack")
        idx = (np.arange(n) // self.block) * self.block + np.tile(self.storage_of, n // self.block)
        return np.take(x, idx, axis=axis)
