"""``stream_k(parts)``: the K loop and the output tiles as one iteration space over a persistent
grid (Stream-K, Osama et al. 2023), so the last wave of tiles does not leave SMs idle.

On the kernel-level MatMul, before ``tile(m=..., n=...) >> to_blocks()``::

    MatMul<kernel>(A:GL f16[4096x4096], B:GL f16[4096x4096], C:GL f16[4096x4096]) acc f32
      stream_k(4)
      for kc0 in block(4) stream-K:
        MatMul<kernel>(A:GL f16[4096x1024], B:GL f16[1024x4096], C:GL f16[4096x4096]) acc f32   <- focus

The chunks (tile, kc) are numbered tile-major, chunk-minor, and each of the persistent grid's
blocks takes one contiguous range of them (equal to within one chunk).  A block walks its range
from the top down, so a tile shared by two blocks is the *first* work of the lower-numbered
block (the tile's low chunks) and the *last* work of the higher one (its top chunks)::

    chunks:   t0.0 t0.1 t0.2 t0.3 | t1.0 t1.1 t1.2 t1.3 | t2.0 ...
    blocks:   [------ b0 ------][------ b1 ------][---- ...
    b0 walks  t1.1 t1.0 t0.3 ... t0.0    (t1.0-1 partial: written to b0's workspace slot, flag set)
    b1 walks  ...  t1.3 t1.2             (t1 finished: waits for b0's flag, adds its slot, stores C)

The block holding a tile's top chunk stores it: it adds the partial sums of the blocks below that
share the tile, in a fixed order (bitwise the same result run to run), after waiting on their
flags, which they set long before (their first work).  A block waits only for lower-numbered
blocks, which the GPU starts first, so the grid cannot deadlock; the interpreter runs blocks in
that order and reports a wait on a flag no earlier block has set.
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..schedule import Loop, Node
from ..spec import MatMul
from ..tensor import BLOCK, GL, KERNEL
from .base import Strategy, fresh_var, positive_int

#: K chunks are rounded to this many elements, so a chunk's loads stay whole 16-byte rows and
#: whole 64-element K tiles
CHUNK_GRANULE = 64


@attrs.frozen(repr=False)
class stream_k(Strategy):
    """``stream_k(parts)``: split each output tile's K range into ``parts`` chunks and spread all
    chunks of all tiles evenly over a persistent grid; partial tiles are combined in the kernel
    through a workspace and flags (see the module docstring for the tree and the walk).

    Apply it to the kernel-level MatMul before ``tile(m=..., n=...) >> to_blocks()``; the launch
    becomes persistent (one block per SM, or ``to_blocks(occupancy=N)`` per SM).

    * ``parts``: a positive int, chunks per tile (1 changes nothing).  K is cut in chunks of
      ``ceil(K / parts)`` rounded up to a multiple of 64; the last may be partial.
    """

    parts: int

    def apply(self, sched):
        node = sched.open_focus(self)
        spec = node.spec
        if not isinstance(spec, MatMul):
            raise ScheduleError("stream_k spreads a MatMul's K loop and output tiles over the grid", strategy=self,
                                spec=spec, fix="apply stream_k(...) to a MatMul")
        positive_int(self, spec, "parts", self.parts)
        if self.parts == 1:
            return sched
        if spec.level != KERNEL or spec.c.memory != GL:
            raise ScheduleError("stream_k refines the kernel-level MatMul (C in global memory)", strategy=self,
                                spec=spec, field="level", value=str(spec.level), allowed="kernel",
                                fix="apply stream_k(...) before tile(m=..., n=...) >> to_blocks()")
        chunk = -(-spec.k // self.parts)
        chunk = -(-chunk // CHUNK_GRANULE) * CHUNK_GRANULE
        used = -(-spec.k // chunk)
        if used != self.parts:
            raise ScheduleError(f"K={spec.k} cut in chunks of {chunk} (multiples of {CHUNK_GRANULE}) gives {used} "
                                f"chunks, not {self.parts}", strategy=self, spec=spec, field="parts",
                                value=self.parts, allowed=f"2..{max(1, -(-spec.k // CHUNK_GRANULE))} with no empty chunk",
                                fix=f"use stream_k({used}) or fewer parts")
        var = fresh_var(sched, "kc")
        loop = Loop(var, self.parts, ((spec.k_dim, chunk),), BLOCK, stream=True)
        child = spec.with_extents(**{spec.k_dim: chunk})
        return sched.replace_focus(attrs.evolve(node, strategy=self, loops=(loop,), body=(Node(child),)))

    def __repr__(self):
        return f"stream_k({self.parts!r})"

    __str__ = __repr__
