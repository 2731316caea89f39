"""Data tensors and the tiles of them that specs operate on; levels and memories.

A ``Tensor`` is a named array in one memory (``GL`` global, ``SH`` shared, ``RF`` registers),
with logical dimensions named after the computation (A is ``("m", "k")``, B ``("k", "n")``, C
``("m", "n")``) and a *major* dimension: the one contiguous in memory.  A ``Tile`` is the part of a
tensor a spec works on: the tensor plus the tile's extents along the tensor's dimensions; where in
the tensor the tile sits is decided by the loops above it in the schedule, not by the tile.

Thread tensors (a warp ``32:1``, a quad-pair ``(4,2):(1,16)``, a warpgroup ``128:1``) live in
``layout`` as layouts; ``Level`` names the granularity a spec is executed at.
"""

from __future__ import annotations

import enum

import attrs

from .dtypes import DType, dtype
from .layout import Swizzle


class Memory(enum.Enum):
    GL = "GL"
    SH = "SH"
    RF = "RF"

    def __repr__(self):
        return f"Memory.{self.name}"

    def __str__(self):
        return self.name


class Level(enum.IntEnum):
    """Execution granularity, coarse to fine."""

    KERNEL = 0
    CLUSTER = 1
    BLOCK = 2
    WARPGROUP = 3
    WARP = 4
    THREAD = 5

    def __repr__(self):
        return f"Level.{self.name}"

    def __str__(self):
        return self.name.lower()


GL, SH, RF = Memory.GL, Memory.SH, Memory.RF
KERNEL, CLUSTER, BLOCK, WARPGROUP, WARP, THREAD = (
    Level.KERNEL, Level.CLUSTER, Level.BLOCK, Level.WARPGROUP, Level.WARP, Level.THREAD)

# Threads in one unit of each level that has a fixed size.
LEVEL_THREADS = {Level.WARP: 32, Level.WARPGROUP: 128, Level.THREAD: 1}


@attrs.frozen(repr=False)
class Tensor:
    """A named array: dtype, memory, logical dims, full shape, contiguous (major) dim.

    ``swizzle`` applies to shared-memory tensors (element offsets); ``stages`` > 1 for the
    multi-buffered shared tensors a pipeline creates.
    """

    name: str
    dtype: DType = attrs.field(converter=dtype)
    memory: Memory
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    major: str
    swizzle: Swizzle | None = None
    stages: int = 1

    @property
    def storage_dims(self) -> tuple[str, ...]:
        """Dims from slowest to fastest in memory (the major dim last)."""
        rest = tuple(d for d in self.dims if d != self.major)
        return rest + (self.major,)

    def extent(self, dim: str) -> int:
        return self.shape[self.dims.index(dim)]

    def __repr__(self):
        return (f"Tensor({self.name!r}, {self.dtype!r}, {self.memory!r}, {self.dims!r}, "
                f"{self.shape!r}, {self.major!r}, swizzle={self.swizzle!r}, stages={self.stages})")

    def __str__(self):
        return f"{self.name}:{self.memory} {self.dtype}[{'x'.join(map(str, self.shape))}]"


@attrs.frozen(repr=False)
class Tile:
    """The part of ``tensor`` a spec reads or writes: extents along ``tensor.dims``."""

    tensor: Tensor
    shape: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.tensor.name

    @property
    def memory(self) -> Memory:
        return self.tensor.memory

    @property
    def dtype(self) -> DType:
        return self.tensor.dtype

    @property
    def dims(self) -> tuple[str, ...]:
        return self.tensor.dims

    def extent(self, dim: str) -> int:
        return self.shape[self.tensor.dims.index(dim)]

    def with_extent(self, **ext: int) -> "Tile":
        shape = tuple(ext.get(d, s) for d, s in zip(self.tensor.dims, self.shape))
        return attrs.evolve(self, shape=shape)

    def __repr__(self):
        return f"Tile({self.tensor!r}, {self.shape!r})"

    def __str__(self):
        t = self.tensor
        sw = f" {t.swizzle}" if t.swizzle is not None and t.swizzle.bits else ""
        st = f" x{t.stages} stages" if t.stages > 1 else ""
        return f"{t.name}:{t.memory} {t.dtype}[{'x'.join(map(str, self.shape))}]{sw}{st}"
