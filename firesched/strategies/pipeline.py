"""``pipeline(stages=)``: turn the K loop and its global → shared moves into a software pipeline
(or, with no K loop, a persistent block's tile loop and the copies it makes once a tile).

::

    for k0 in seq(128):                       for k0 in seq(128) pipelined(4 stages):
      Move<block>(A:GL -> A:SH)        ==>      Move<block>(A:GL -> A:SH x4 stages)
      ...                                        ...

Shared buffers become ``stages`` deep; the lowering issues ``stages - 1`` tiles ahead with
cp.async groups and places the waits and the one barrier per iteration that make it race-free.
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..spec import Move
from ..tensor import BLOCK, GL, RF, SH
from .base import Strategy

#: deep enough for a 64 x 64 tile's ring to fill an H100's 227 KB of shared memory (14 stages of
#: 16 KB): small-M problems are latency-bound and want every tile in flight they can hold
MAX_STAGES = 16


@attrs.frozen(repr=False)
class pipeline(Strategy):
    """``pipeline(stages=3, prefetch=True)``: software-pipeline the innermost sequential K loop at or
    above the focus, with the global -> shared moves inside it::

        for k0 in seq(16):                                          tile(k=32), move_to_smem('A')
          Move<block>(A:GL f16[128x32] -> A:SH f16[128x32] Sw<2,3,3>)
            ==> pipeline(stages=3)
        for k0 in seq(16) pipelined(3 stages):
          Move<block>(A:GL f16[128x32] -> A:SH f16[128x32] Sw<2,3,3> x3 stages)

    The focus is unchanged, so ``pipeline`` may come anywhere after the moves (also after
    ``done``).  With ``cp.async`` moves the ring is kept with commit/wait groups; with TMA moves
    (``via=(sm90a.tma_load_2d,)``) with full/empty mbarriers.

    A K loop whose only moves load int4 codes from global memory straight into registers
    (``move_to_regs`` of a u4/i4 operand left in GL) pipelines *in registers*: each thread keeps
    ``stages`` K steps of codes and group scales, the loads of step k + stages - 1 issued before
    step k computes (``lower.transforms.register_ring``) — a weight-streaming kernel at small M
    keeps its DRAM reads in flight without shared memory or barriers::

        for k1 in seq(8):                                      tile(k=128), move_to_regs('B')
          Move<warp>(B:GL u4[128x16] packed -> B:RF f16[128x16])
            ==> pipeline(stages=8)
        for k1 in seq(8) pipelined(8 stages):
          Move<warp>(B:GL u4[128x16] packed -> B:RF f16[128x16])

    With no K loop at or above the focus, ``pipeline`` takes a persistent grid's tile loop
    (``to_blocks(persistent=True)``) instead: each shared tensor a ``Move`` fills from global
    memory once a tile becomes ``stages`` deep, and a block copies its next ``stages - 1`` tiles
    while it computes one (``lower.transforms.tile_prefetch``) — a row kernel whose row waits in
    shared memory keeps a row's loads in flight all the time::

        for r0 in block(4096) persistent occupancy(6):            place(Xr, SH), part(...)
          Move<block>(X:GL bf16[1x4102] -> Xr:SH bf16[1x4102])
            ==> pipeline(stages=2)
        for r0 in block(4096) pipelined(2 stages) persistent occupancy(6):
          Move<block>(X:GL bf16[1x4102] -> Xr:SH bf16[1x4102] x2 stages)

    * ``stages``: shared buffers per staged operand, 1..16 (1: no overlap, 2: double buffering).
    * ``prefetch``: also load the register fragments of the next warp K step while the current one
      computes (double-buffered fragments, where a warp's K tile has more than one step).
    * ``separate``: with TMA moves under ``warp_specialize``, each staged operand gets full and
      empty mbarriers of its own (same stages): the producer refills an operand's stage as soon as
      the consumers release it, and the overlapped loop releases an operand once the wgmma group
      that reads it has retired (attention: K after S = Q Kᵀ, V after O += P V, a step apart) —
      FlashAttention-3's separate K and V pipelines.  Elsewhere the operands share one ring.
    * ``overlap``: in warp-specialized consumers whose loop body is a wgmma group, element-wise
      work on its result, and a second wgmma group (attention: S = Q Kᵀ, softmax, O += P V), issue
      each step's first group together with the previous step's second, so the work between them
      runs while the tensor cores compute (``lower.transforms.overlap``; the loop prints
      ``pipelined(3 stages, overlapped)``)::

          step j:  issue S(j) = Q K(j)ᵀ and O += P(j-1) V(j-1); wait for S(j)
                   softmax of S(j)                      <- under O += P(j-1) V(j-1)
                   wait for O; rescale O; P(j) = S(j)
    """

    stages: int = 2
    prefetch: bool = True
    overlap: bool = False
    separate: bool = False

    def apply(self, sched):
        path = sched.focus_path()
        spec = path[-1].spec
        if isinstance(self.stages, bool) or not isinstance(self.stages, int) or not 1 <= self.stages <= MAX_STAGES:
            raise ScheduleError(f"stages must be an int from 1 to {MAX_STAGES}", strategy=self, spec=spec, field="stages",
                                value=self.stages, allowed=f"1..{MAX_STAGES}")
        for i in range(len(path) - 1, -1, -1):
            node = path[i]
            kloops = [lp for lp in node.loops if lp.unit is None and lp.dim in node.spec.reduction_dims]
            if not kloops:
                continue
            moved = _staged_tensors(path[i:])
            if not moved and not _register_moves(path[i:]):
                # (int4 codes loaded into registers from global memory would make a ring of registers)
                raise ScheduleError("the K loop moves nothing from global to shared memory", strategy=self,
                                    spec=node.spec, fix="apply move_to_smem(...) before pipeline(...)")
            if not moved and (self.overlap or self.separate):
                raise ScheduleError("overlap and separate are for rings of shared memory; this K loop's ring is "
                                    "in registers (its only moves load int4 codes from global memory)",
                                    strategy=self, spec=node.spec, field="overlap" if self.overlap else "separate",
                                    value=True, allowed="False", fix=f"pipeline(stages={self.stages})")
            deep = sorted((name, n) for name, n in moved.items() if n not in (1, self.stages))
            if deep:
                name, n = deep[0]
                raise ScheduleError(f"{name} is staged inside the K loop, whose moves take pipeline's {self.stages} "
                                    f"stages, but it is already {n} stages deep (move_to_smem(..., stages={n}) "
                                    "is for a tile move above the loop)", strategy=self, spec=node.spec,
                                    field="stages", value=self.stages, allowed=str(n),
                                    fix=f"drop stages= from move_to_smem({name!r}, ...), or pipeline(stages={n})")
            for f in ("prefetch", "overlap", "separate"):
                if not isinstance(getattr(self, f), bool):
                    raise ScheduleError(f"{f} is a bool", strategy=self, spec=spec, field=f,
                                        value=getattr(self, f), allowed="True, False")
            loops = tuple(attrs.evolve(lp, stages=self.stages, prefetch=self.prefetch, overlap=self.overlap,
                                       separate=self.separate)
                          if lp is kloops[-1] else lp for lp in node.loops)
            sched = sched.replace_path(path[:i + 1], attrs.evolve(node, loops=loops))
            return _restage(sched, moved, self.stages)
        return self._tile_loop(sched, path, spec)

    def _tile_loop(self, sched, path, spec):
        """No K loop: pipeline the tile loop of a persistent block instead (each block copies its
        next tiles' shared operands while it computes the current one)."""
        for i in range(len(path) - 1, -1, -1):
            node = path[i]
            blocks = [lp for lp in node.loops if lp.unit == BLOCK]
            if not blocks:
                continue
            if not any(lp.persistent for lp in blocks):
                raise ScheduleError("there is no sequential K loop to pipeline, and the block loops are not a "
                                    "persistent grid's tile loop (a block of a plain grid computes one tile: there "
                                    "is no next tile to copy ahead)", strategy=self, spec=node.spec,
                                    field="persistent", value=False, allowed="to_blocks(persistent=True)",
                                    fix="tile(k=...) inside a block for a K-loop pipeline, or "
                                        "to_blocks(persistent=True) to pipeline the block's tiles")
            for f in ("overlap", "separate"):
                if getattr(self, f) is not False:
                    raise ScheduleError(f"{f} is for a K loop's ring; a tile loop's ring is cp.async copies of "
                                        "whole tiles", strategy=self, spec=node.spec, field=f,
                                        value=getattr(self, f), allowed="False",
                                        fix=f"pipeline(stages={self.stages})")
            moved = _tile_moves(path[i:], self)
            if not moved:
                raise ScheduleError("the persistent block's tile loop moves nothing from global to shared memory "
                                    "once a tile", strategy=self, spec=node.spec,
                                    fix="place the row (or tile) the parts read in shared memory first: "
                                        "place(name, SH) of a tensor a Move fills from global memory")
            loops = tuple(attrs.evolve(lp, stages=self.stages) if lp is blocks[-1] else lp for lp in node.loops)
            sched = sched.replace_path(path[:i + 1], attrs.evolve(node, loops=loops))
            return _restage(sched, moved, self.stages)
        raise ScheduleError("there is no sequential K loop to pipeline", strategy=self, spec=spec,
                            fix="tile(k=...) inside a block first")

    def __repr__(self):
        pf = "" if self.prefetch else ", prefetch=False"
        pf += ", overlap=True" if self.overlap else ""
        pf += ", separate=True" if self.separate else ""
        return f"pipeline(stages={self.stages}{pf})"

    __str__ = __repr__


def _staged_tensors(path) -> dict:
    """The shared tensors the moves under ``path`` fill from global memory, and their stages."""
    names = {}
    for node in path:
        for c in node.body:
            if isinstance(c.spec, Move) and c.spec.src.memory == GL and c.spec.dst.memory == SH:
                names[c.spec.dst.name] = c.spec.dst.tensor.stages
    return names


def _tile_moves(path, strategy) -> dict:
    """The shared tensors the moves under ``path`` (from the node of a persistent block's tile loop
    along the focus) fill from global memory once a tile, and their stages; a move under a loop of
    more than one step besides the block loops is refused (it is issued several times a tile)."""
    names = {}
    for j, node in enumerate(path):
        for c in node.body:
            if isinstance(c.spec, Move) and c.spec.src.memory == GL and c.spec.dst.memory == SH:
                inner = [lp for n in path[:j + 1] for lp in n.loops if lp.count > 1 and lp.unit != BLOCK]
                if inner:
                    raise ScheduleError(f"{c.spec.dst.name} is copied inside loop {inner[0].var} of "
                                        f"{inner[0].count} steps, not once a tile", strategy=strategy,
                                        spec=c.spec, field="stages", value=strategy.stages,
                                        fix="pipeline the K loop (tile(k=...) first), or copy the tile whole")
                names[c.spec.dst.name] = c.spec.dst.tensor.stages
    return names


def _register_moves(path) -> list:
    """The moves under ``path`` that load global memory straight into registers (int4 codes
    dequantised into an MMA fragment): a K loop of those alone pipelines in registers."""
    return [c for node in path for c in node.body
            if isinstance(c.spec, Move) and c.spec.src.memory == GL and c.spec.dst.memory == RF]


def _restage(sched, names, stages):
    """Every SH tensor named in ``names`` becomes ``stages`` deep, wherever it appears."""

    def fix_tile(t):
        if t.memory == SH and t.name in names:
            return attrs.evolve(t, tensor=attrs.evolve(t.tensor, stages=stages))
        return t

    def fix(node):
        sp = node.spec
        fields = {f.name: getattr(sp, f.name) for f in attrs.fields(type(sp))}
        changed = {k: fix_tile(v) for k, v in fields.items() if hasattr(v, "tensor") and hasattr(v, "shape")}
        return attrs.evolve(node, spec=attrs.evolve(sp, **changed)) if changed else node

    return sched.map_nodes(fix)
