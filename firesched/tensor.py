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
from .packing import Packing


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
    multi-buffered shared tensors a pipeline creates.  ``workspace`` marks a global tensor the
    program allocates itself (split-K partial sums, padded copies): it is no kernel argument.
    ``packing`` permutes the elements inside aligned blocks of the major dim (``Packing``: int4
    weights stored in the order their register fragments want them); copies on chip keep it.

    Any number of dimensions; they are stored from the first to the last with ``major`` moved
    last (``storage_dims``): a row-major ``(b, m, k)`` A is ``major="k"``, a column-major one
    ``major="m"`` (stored ``b, k, m``).
    """

    name: str
    dtype: DType = attrs.field(converter=dtype)
    memory: Memory
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    major: str
    swizzle: Swizzle | None = None
    stages: int = 1
    workspace: bool = False
    packing: Packing | None = None

    def __attrs_post_init__(self):
        if len(self.dims) != len(self.shape) or len(set(self.dims)) != len(self.dims):
            raise ValueError(f"Tensor {self.name!r}: dims {self.dims!r} and shape {self.shape!r} must have one "
                             "entry per dimension, with distinct names")
        if self.major not in self.dims:
            raise ValueError(f"Tensor {self.name!r}: major={self.major!r} is not one of its dims {self.dims!r}")
        if self.packing is not None and not isinstance(self.packing, Packing):
            raise ValueError(f"Tensor {self.name!r}: packing must be a Packing or None, not {self.packing!r}")

    @property
    def storage_dims(self) -> tuple[str, ...]:
        """Dims from slowest to fastest in memory (the major dim last)."""
        rest = tuple(d for d in self.dims if d != self.major)
        return rest + (self.major,)

    def extent(self, dim: str) -> int:
        return self.shape[self.dims.index(dim)]

    def __repr__(self):
        ws = ", workspace=True" if self.workspace else ""
        pk = f", packing={self.packing!r}" if self.packing is not None else ""
        return (f"Tensor({self.name!r}, {self.dtype!r}, {self.memory!r}, {self.dims!r}, "
                f"{self.shape!r}, {self.major!r}, swizzle={self.swizzle!r}, stages={self.stages}{ws}{pk})")

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

    def on_chip(self, memory: Memory, *, keep: tuple[str, ...] = (), swizzle: Swizzle | None = None,
                dtype: DType | str | None = None) -> "Tile":
        """This tile staged in ``memory`` (SH or RF): a new tensor of the tile's shape, without the
        dimensions of extent 1 that are not named in ``keep`` (a batch index inside a block), so
        that an on-chip tile is as small as its data.  A shared copy keeps the tensor's packing;
        ``dtype`` converts on the way (int4 weights dequantised into registers), which unpacks."""
        t = self.tensor
        dims = [d for d, s in zip(t.dims, self.shape) if s != 1 or d in keep or d == t.major]
        shape = tuple(self.extent(d) for d in dims)
        dt = t.dtype if dtype is None else dtype
        packing = t.packing if memory == SH and dtype is None else None
        tensor = Tensor(t.name, dt, memory, tuple(dims), shape, t.major, swizzle=swizzle, packing=packing)
        return Tile(tensor, shape)

    def __repr__(self):
        return f"Tile({self.tensor!r}, {self.shape!r})"

    def __str__(self):
        t = self.tensor
        sw = f" {t.swizzle}" if t.swizzle is not None and t.swizzle.bits else ""
        st = f" x{t.stages} stages" if t.stages > 1 else ""
        pk = " packed" if t.packing is not None else ""
        return f"{t.name}:{t.memory} {t.dtype}[{'x'.join(map(str, self.shape))}]{sw}{st}{pk}"
