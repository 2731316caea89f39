"""``split_k(parts, across=Level.BLOCK | Level.WARPGROUP | Level.WARP)``: parallelise the reduction over K.

Across blocks (on the kernel-level spec, before ``to_blocks``), the parts added by a second
launch (``combine="launch"``)::

    MatMul<kernel>(A[MxK], B[KxN], C:GL[MxN])
      split_k(4, across=block)
      for kp0 in block(4):
        MatMul<kernel>(A[MxKp], B[KpxN], C_part:GL f32[1xMxN])      <- focus
      Reduce<kernel>(sum over kp: C_part:GL f32[4xMxN] -> C:GL[MxN])   (a second launch)

or in the same launch (``combine="fixup"``): the block of a tile's last part waits for the
others' partial sums (a workspace and a flag per block), adds them in a fixed order and stores
C; the other parts store nothing::

    MatMul<kernel>(A[MxK], B[KxN], C:GL[MxN])
      split_k(4, across=block, combine='fixup')
      for kp0 in block(4) fixup:
        MatMul<kernel>(A[MxKp], B[KpxN], C:GL[MxN])                  <- focus

    block (tile, kp < 3):  acc -> partials[slot]; barrier; flag[slot] = 1 (release)
    block (tile, kp = 3):  for q = 2, 1, 0: wait flag[slot of q] (acquire); acc += partials[...]
                           barrier; reset the flags; the store of C (and its epilogue)

A part waits only for lower parts, whose blocks the GPU starts first, so the grid cannot deadlock
(the fix-up of ``stream_k``, ``lower.rules.stream_fixup``); the additions are in a fixed order,
so the result is the same bits run to run.

or in a thread-block cluster (``combine="cluster"``, sm_90a, 2 to 8 parts): a tile's parts run on
the blocks of one cluster, which the GPU starts together; the lower parts push their partial sums
into the shared memory of the last part's block (``st.async``, completing on its mbarrier), which
adds them in the same fixed order as the fix-up and stores C — no workspace in global memory, no
flags, no second launch::

    MatMul<kernel>(A[MxK], B[KxN], C:GL[MxN])
      split_k(2, across=block, combine='cluster')
      for kp0 in block(2) clusters(2) fixup:
        MatMul<kernel>(A[MxKp], B[KpxN], C:GL[MxN])                  <- focus

    block rank kp < 1:  acc -> parts[kp] of block rank 1      st.async, complete_tx on its mbarrier
    block rank 1:       wait its mbarrier; acc += parts[0]; the store of C

Across warps (on a block-level spec inside the K loop, seed 000's intra-block split-K): the K
tile is divided between groups of warps, each keeping its own partial accumulator; the store of
the accumulator becomes a ``Reduce`` through shared memory before the epilogue.  Across
warpgroups the same, each part a warpgroup (or several, mapped below it by ``to_warpgroups``):
a warp-specialized kernel's consumer warpgroups sharing each stage of the ring, their parts
meeting behind the consumers' own named barrier.
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..schedule import Loop, Node, find_store
from ..spec import MatMul, Reduce
from ..tensor import BLOCK, GL, KERNEL, RF, WARP, WARPGROUP, Level, Tensor, Tile
from .base import Strategy, fresh_var, positive_int

# Block-level parts are rounded to this many K elements, so a part's loads stay whole 16-byte chunks.
PART_GRANULE = 64

#: how split_k(across=BLOCK) adds its parts: a second launch, the last part's block (fix-up through
#: global memory), or the last part's block of a thread-block cluster (through shared memory)
COMBINES = ("launch", "fixup", "cluster")
#: parts a cluster combine takes: a tile's parts are one cluster (the portable cluster sizes)
CLUSTER_PARTS = range(2, 9)


@attrs.frozen(repr=False)
class split_k(Strategy):
    """``split_k(parts, across=Level.WARP)``: split a MatMul's reduction dimension into ``parts``
    that run in parallel, then add the partial results.

    Across warps (``across=Level.WARP``, on the block-level focus inside the K loop): groups of
    warps take parts of the K tile, each with its own accumulator, and the store of C becomes a
    reduction through shared memory::

        MatMul<block>(A:SH f16[128x32] Sw<2,3,3>, B:SH f16[32x128] Sw<3,3,4>, C:RF f32[128x128]) acc f32
          split_k(2, across=warp)
          for kp0 in warp(2):
            MatMul<block>(A:SH f16[128x16] Sw<2,3,3>, B:SH f16[16x128] Sw<3,3,4>, C:RF f32[128x128]) acc f32   <- focus
        Reduce<block>(sum over kp0: C:RF f32[128x128] -> C:GL f16[128x128])     (was a Move)

    Across warpgroups (``across=Level.WARPGROUP``, the same place, before ``tile(...) >>
    to_warpgroups()``): each part is a warpgroup's (wgmma accumulators), e.g. the consumers of a
    warp-specialized W4A16 kernel each dequantising half of every stage
    (``W4A16WgmmaParams(warpgroups_k=2)``)::

        MatMul<block>(B:SH u4[512x64] x4 stages packed, A:SH f16[8x512] Sw<3,3,6> x4 stages, C:RF f32[8x64]) acc f32
          split_k(2, across=warpgroup)
          for kp0 in warpgroup(2):
            MatMul<block>(B:SH u4[256x64] x4 stages packed, A:SH f16[8x256] Sw<3,3,6> x4 stages, C:RF f32[8x64]) acc f32   <- focus
        Reduce<block>(sum over kp0: C:RF f32[8x64] -> C:GL f16[8x64])     (was a Move)

    Across blocks (``across=Level.BLOCK``, on the kernel-level focus, before ``to_blocks``): each
    block of parts writes an f32 workspace, and a second launch adds them (``combine="launch"``),
    or the block of each tile's last part adds them in the same launch (``combine="fixup"``: no
    second launch, C written once), or a tile's parts form a thread-block cluster whose blocks
    push their partial sums into the last part's shared memory (``combine="cluster"``, sm_90a, 2
    to 8 parts; the module docstring shows the trees).  Parts are whole multiples of 64 K
    elements.

    * ``parts``: a positive int (1 changes nothing); 2 to 8 with ``combine="cluster"``.
    * ``across``: ``Level.WARP``, ``Level.WARPGROUP`` or ``Level.BLOCK``.
    * ``combine``: across blocks, ``"launch"``, ``"fixup"`` or ``"cluster"``; across warps or
      warpgroups it must stay ``"launch"`` (the parts meet in shared memory).
    """

    parts: int
    across: Level = WARP
    combine: str = "launch"

    def apply(self, sched):
        node = sched.open_focus(self)
        spec = node.spec
        if not isinstance(spec, MatMul):
            raise ScheduleError("split_k divides a MatMul's k; other reductions map their reduced dimension "
                                "onto units with tile(...) >> to_threads() / to_warps()", strategy=self, spec=spec)
        positive_int(self, spec, "parts", self.parts)
        if not isinstance(self.across, Level) or self.across not in (BLOCK, WARPGROUP, WARP):
            raise ScheduleError("split-K runs across blocks, warpgroups or warps", strategy=self, spec=spec,
                                field="across", value=self.across,
                                allowed="Level.BLOCK, Level.WARPGROUP, Level.WARP")
        if self.combine not in COMBINES or (self.across != BLOCK and self.combine != "launch"):
            allowed = (", ".join(map(repr, COMBINES)) if self.across == BLOCK
                       else "'launch' (across warps or warpgroups)")
            raise ScheduleError("split_k's parts are added by a second launch or by the block of the last part",
                                strategy=self, spec=spec, field="combine", value=self.combine, allowed=allowed,
                                fix=f"combine={self.combine!r} needs across=Level.BLOCK")
        if self.combine == "cluster" and self.parts != 1 and self.parts not in CLUSTER_PARTS:
            raise ScheduleError("split_k(..., combine='cluster') puts a tile's parts on the blocks of one thread-block "
                                "cluster", strategy=self, spec=spec, field="parts", value=self.parts,
                                allowed=f"{CLUSTER_PARTS.start}..{CLUSTER_PARTS.stop - 1}",
                                fix="fewer parts, or combine='fixup' / 'launch'")
        if self.parts == 1:
            return sched
        if self.across == BLOCK:
            return self._blocks(sched, node, spec)
        return self._warps(sched, node, spec)

    def _blocks(self, sched, node, spec):
        if spec.level != KERNEL or spec.c.memory != GL:
            raise ScheduleError("split_k across blocks refines the kernel-level spec (C in global memory)",
                                strategy=self, spec=spec, field="level", value=str(spec.level),
                                allowed="kernel", fix="apply split_k(..., across=BLOCK) before tile(...) >> to_blocks()")
        kp = -(-spec.k // self.parts)
        kp = -(-kp // PART_GRANULE) * PART_GRANULE
        used = -(-spec.k // kp)
        if used != self.parts:
            raise ScheduleError(f"K={spec.k} split in parts of {kp} (multiples of {PART_GRANULE}) "
                                f"gives {used} parts, not {self.parts}", strategy=self, spec=spec,
                                field="parts", value=self.parts,
                                allowed=f"2..{max(1, -(-spec.k // PART_GRANULE))} with no empty part",
                                fix=f"use split_k({used}) or fewer parts")
        if self.combine in ("fixup", "cluster"):
            var = fresh_var(sched, "kp")
            loop = Loop(var, self.parts, ((spec.k_dim, kp),), BLOCK, fixup=True,
                        cluster=self.parts if self.combine == "cluster" else 1)
            child = spec.with_extents(**{spec.k_dim: kp})
            return sched.replace_focus(attrs.evolve(node, strategy=self, loops=(loop,), body=(Node(child),)))
        c = spec.c
        # the partial sums live in a workspace the program allocates: one C per part
        ws_t = Tensor(f"{c.name}_part", spec.acc, GL, ("kp",) + c.dims, (self.parts,) + c.shape, c.tensor.major,
                      workspace=True)
        child = attrs.evolve(spec.with_extents(**{spec.k_dim: kp}), c=Tile(ws_t, (1,) + c.shape))
        var = fresh_var(sched, "kp")
        loop = Loop(var, self.parts, ((spec.k_dim, kp), ("kp", 1)), BLOCK)
        reduce = Reduce("sum", Tile(ws_t, ws_t.shape), c, ("kp",), KERNEL)
        new = attrs.evolve(node, strategy=self, loops=(loop,), body=(Node(child),),
                           post=(Node(reduce),))
        return sched.replace_focus(new)

    def _warps(self, sched, node, spec):
        if spec.level != BLOCK or spec.c.memory != RF:
            raise ScheduleError(f"split_k across {self.across}s divides a block's K tile between them: the focus "
                                "must be a block-level MatMul whose C is the register accumulator",
                                strategy=self, spec=spec, field="level/C",
                                value=f"{spec.level}/{spec.c.memory}", allowed="block/RF",
                                fix="apply it after tile(k=...) (and the moves to shared memory), "
                                    "before tile(...) >> to_warps() (or to_warpgroups())")
        if spec.k % self.parts:
            raise ScheduleError(f"the K tile {spec.k} does not divide into {self.parts} parts",
                                strategy=self, spec=spec, field="parts", value=self.parts,
                                allowed=f"divisors of {spec.k}")
        kp = spec.k // self.parts
        var = fresh_var(sched, "kp")
        loop = Loop(var, self.parts, ((spec.k_dim, kp),), self.across)
        child = spec.with_extents(**{spec.k_dim: kp})
        sched = sched.replace_focus(attrs.evolve(node, strategy=self, loops=(loop,), body=(Node(child),)))
        found = find_store(sched, spec.c.name)
        if found is None:  # pragma: no cover - tile(k) always creates the store
            raise ScheduleError("no accumulator store found", strategy=self, spec=spec)
        path, i = found
        holder = path[-1]
        st = holder.post[i]
        red = Reduce("sum", st.spec.src, st.spec.dst, (var,), st.spec.level, getattr(st.spec, "ops", ()))
        new_holder = attrs.evolve(holder, post=holder.post[:i] + (attrs.evolve(st, spec=red),) + holder.post[i + 1:])
        return _replace_node(sched, path, new_holder)

    def __repr__(self):
        across = f"Level.{self.across.name}" if isinstance(self.across, Level) else repr(self.across)
        comb = f", combine={self.combine!r}" if self.combine != "launch" else ""
        return f"split_k({self.parts!r}, across={across}{comb})"

    def __str__(self):
        comb = f", combine={self.combine!r}" if self.combine != "launch" else ""
        return f"split_k({self.parts}, across={self.across}{comb})"


def _replace_node(sched, path, new_last):
    """Replace the last node of ``path`` (a chain of body/children links) in the tree."""
    node = new_last
    for parent, child in zip(reversed(path[:-1]), reversed(path[1:])):
        def swap(seq, old=child, new=node):
            return tuple(new if c is old else c for c in seq)
        node = attrs.evolve(parent, pre=swap(parent.pre), body=swap(parent.body), post=swap(parent.post))
    return attrs.evolve(sched, root=node)
