"""Fused multi-head attention, forward, as a schedule: two designs built from strategies only.

``recipes.fmha(batch, heads, seq_q, seq_kv, head_dim)`` returns the schedule of
``O = softmax(scale · Q Kᵀ + mask) V`` (``firesched.Attention``).  On sm_90a it is
``fmha_schedule_wgmma`` (warpgroup MMAs: one warpgroup per 64 queries, S from shared-memory
operands, P from registers); elsewhere — and with ``FmhaParams(mma="mma_sync")`` on sm_90a too —
it is the FlashAttention-2 design::

    Attention<kernel>(Q, K, V -> O)
      tile(b=1, hk=1, g=1, q=128) >> to_blocks()      one block per 128 queries of one head
      move_to_smem("Q")                                the query tile, loaded once
      online_softmax(kv=32)                            the key loop: S = Q Kᵀ, running max/sum,
                                                       O += P V (strategies/attention.py); causal:
                                                       it stops at the block's diagonal
      move_to_smem("K"), move_to_smem("V")             the key and value tiles of each step ...
      pipeline(stages=2)                               ... double-buffered with cp.async
      place("S", RF), place("P", RF)                   scores and probabilities never leave registers
      part(SCORES, tile(q=32) >> to_warps(), ...)      S = Q Kᵀ: 32 query rows per warp, mma.sync
      part(VALUES, tile(q=32) >> to_warps(), ...)      O += P V: the A operand is P, the same lanes'
                                                       registers the first MMA's accumulator left

Every query row of a warp stays in that warp, so the softmax's row max and sum are a fold of
the thread's registers and two butterfly shuffles (lanes of a quad).  ``check()`` proves that P's
registers — the accumulator of ``m16n8k16`` — are where the A operand of the second
``m16n8k16`` expects them, lane by lane (``lower.fragments.register_map``).

``plan`` picks the tiles per shape (``FmhaParams``); ``params=`` overrides them.
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..hardware import sm80
from ..hardware.target import target as get_target
from ..layout import Swizzle
from ..schedule import Schedule
from ..spec import Attention
from ..strategies import (
    done,
    move_to_regs,
    move_to_smem,
    online_softmax,
    part,
    pipeline,
    place,
    tile,
    to_blocks,
    to_warpgroups,
    to_warps,
    warp_specialize,
)
from ..strategies.attention import SCORES, VALUES
from ..tensor import RF

HEAD_DIMS = (32, 64, 96, 128, 256)
#: registers a thread of the producer warpgroup keeps by default (it only issues TMA copies)
PRODUCER_REGS = 40
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a")


MMAS = ("mma_sync", "wgmma")


@attrs.frozen
class FmhaParams:
    """The tiles of the attention schedule.

    * ``block_q``: queries per block (a multiple of 16 x ``warps``);
    * ``block_kv``: keys per step of the key loop (a multiple of 16);
    * ``warps``: warps per block, each holding ``block_q / warps`` query rows;
    * ``stages``: shared buffers of the K and V tiles (2: double buffering);
    * ``mma``: ``"mma_sync"`` (the FlashAttention-2 design, sm_80 and later) or ``"wgmma"``
      (sm_90a: a warpgroup of 4 warps per 64 query rows, S = Q Kᵀ from shared memory, O += P V
      with P from registers); with wgmma ``warps`` is ``4 * block_q / 64`` and ``block_kv`` at
      most 256 (wgmma's N);
    * ``tma``: with wgmma, K and V arrive by TMA (one thread issues a tile's copy; it completes on
      an mbarrier) instead of every thread's cp.async;
    * ``warp_specialized``: with TMA, a producer warpgroup issues the copies (``warp_specialize``)
      and the consumer warpgroups release each stage on an mbarrier instead of meeting at a
      block-wide barrier every key tile;
    * ``reverse``: blocks take the query tiles last to first (``to_blocks(reverse=True)``); with a
      causal mask the last tiles have the longest key loops, so they start first and short ones
      fill the tail;
    * ``pingpong``: with warp specialization and two or more consumer warpgroups, they take turns
      to issue their wgmma (``warp_specialize(pingpong=True)``): one warpgroup's softmax runs
      while the tensor cores work on the other's S = Q Kᵀ or O += P V;
    * ``overlap``: with warp specialization, each key step's S = Q Kᵀ issues together with the
      previous step's O += P V (``pipeline(overlap=True)``), so a warpgroup's softmax runs under
      its own matrix products;
    * ``persistent``: with wgmma, one block per SM walks the query tiles
      (``to_blocks(persistent=True)``; with a causal mask only warp-specialized, whose producer
      passes the steps past a tile's diagonal through the ring, so that every tile counts the same
      ring steps).  Measured slower than the plain grid on an H100 with Q loaded by the consumers
      (each tile waits for its Q);
    * ``q_by_producer``: with warp specialization, the producer warpgroup loads the query tile by
      TMA too (``move_to_smem("Q", via=(sm90a.tma_load_2d,))`` above the key loop), on an mbarrier
      ring of its own over the block's tiles (``lower.transforms.tile_moves``): the consumers wait
      for it and release it when their key loop is done, so with ``persistent`` the next tile's Q
      and first K and V tiles arrive while they finish the current tile and store its output
      (FlashAttention-3's design).  Measured on an H100 it brings the persistent grid level with
      the plain one (16x16x1024x128: 0.78 -> 0.83x cuDNN), not past it;
    * ``q_slice``: with mma.sync (wgmma reads Q by descriptor and takes only 16), the head-dim
      columns of a warp's query fragments it loads at a time from shared memory (16 or a
      multiple: one ``ldmatrix`` x4 per 16 rows and 16 columns), each slice multiplied by every
      key fragment of the step before the next is loaded; wider
      slices load fewer times, and at head dim 128 ptxas allocates the kernel in fewer registers
      (4x16x4096x128: 255 registers and 8 bytes of spill with 16, 240 and none with 32);
    * ``roll_slices``: with mma.sync, the loop over the query slices of S = Q Kᵀ runs at run time
      (``tile(d=q_slice, unroll=False)``) instead of unrolled: each slice computes its fragments'
      shared addresses itself, where unrolled the compiler keeps every slice's (16 at head dim
      128, 32 columns a slice) in registers across the key loop.  It takes FlashAttention-2's
      128 x 64 tile at head dim 128 from 136 bytes of spill to 8 (sm_90a), but measured on an
      H200 the plan's tiles ran 13-15 % slower rolled and the 128 x 64 tile no faster than
      unrolled (bench/README.md): not in the plan;
    * ``q_stages``: with ``q_by_producer``, buffers of the query tile's ring
      (``move_to_smem("Q", ..., stages=)``): with 2 a persistent block's next query tile arrives
      while the consumers still multiply the current one, and the output, which could borrow the
      query rows of a one-buffer ring, is staged in a buffer of its own;
    * ``separate``: with warp specialization, K and V on mbarrier rings of their own
      (``pipeline(separate=True)``): the consumers release K's stage once S = Q Kᵀ has retired and
      V's once O += P V has, so the producer refills K a step earlier (FlashAttention-3's two
      pipelines);
    * ``blocks_per_sm``: the blocks an SM holds at once (``to_blocks(occupancy=...)``, either design): with 2, one
      block's prologue and epilogue (Q's load, the first step's softmax, the output's store) run
      while the other's key loop keeps the tensor cores busy; its tiles and stages must leave room
      for two blocks' shared memory and registers (with warp specialization each consumer
      warpgroup's ``setmaxnreg`` is sized for that);
    * ``producer_regs``: with warp specialization, the registers the producer warpgroup keeps
      (``setmaxnreg.dec``; it only issues copies), the consumers taking what is left, at most 240
      (``consumer_regs``): 40 leaves two consumer warpgroups 232, 24 (FlashAttention-3's) 240.
    """

    block_q: int = 128
    block_kv: int = 64
    warps: int = 8
    stages: int = 2
    mma: str = "mma_sync"
    tma: bool = False
    warp_specialized: bool = False
    reverse: bool = False
    pingpong: bool = False
    overlap: bool = False
    persistent: bool = False
    q_by_producer: bool = False
    blocks_per_sm: int = 1
    q_slice: int = 16
    q_stages: int = 1
    separate: bool = False
    producer_regs: int = PRODUCER_REGS
    roll_slices: bool = False

    def __attrs_post_init__(self):
        for f in ("block_q", "block_kv", "warps", "stages", "blocks_per_sm", "q_slice", "q_stages"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"FmhaParams: {f} must be a positive int, got {v!r}")
        if self.mma not in MMAS:
            raise ValueError(f"FmhaParams: mma={self.mma!r}; allowed {', '.join(map(repr, MMAS))}")
        for f in ("tma", "warp_specialized", "reverse", "pingpong", "overlap", "persistent", "q_by_producer",
                  "separate", "roll_slices"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"FmhaParams: {f} must be a bool, got {getattr(self, f)!r}")
        if self.block_q % (16 * self.warps):
            raise ValueError(f"FmhaParams: block_q={self.block_q} must be a multiple of 16 x warps "
                             f"({16 * self.warps}): each warp holds whole m16 tiles of queries")
        if self.block_kv % 16:
            raise ValueError(f"FmhaParams: block_kv={self.block_kv} must be a multiple of 16")
        if isinstance(self.producer_regs, bool) or not isinstance(self.producer_regs, int) \
                or self.producer_regs % 8 or not 24 <= self.producer_regs <= 256:
            raise ValueError(f"FmhaParams: producer_regs={self.producer_regs!r}; setmaxnreg takes a multiple of 8 "
                             f"from 24 to 256")
        if self.q_slice % 16:
            raise ValueError(f"FmhaParams: q_slice={self.q_slice} must be a multiple of 16 (an ldmatrix x4 holds "
                             f"16 columns of a fragment)")
        if self.mma == "wgmma" and self.roll_slices:
            raise ValueError("FmhaParams: roll_slices=True runs the loop over the query slices mma.sync loads at run "
                             "time; with mma='wgmma' S = Q Kᵀ reads Q from shared memory by descriptor: leave "
                             "roll_slices=False")
        if self.mma == "wgmma" and self.q_slice != 16:
            raise ValueError(f"FmhaParams: q_slice={self.q_slice} slices the query fragments mma.sync loads into "
                             f"registers; with mma='wgmma' S = Q Kᵀ reads Q from shared memory by descriptor, "
                             f"16 columns a wgmma: leave q_slice=16")
        if not isinstance(self.tma, bool) or (self.tma and self.mma != "wgmma"):
            raise ValueError(f"FmhaParams: tma={self.tma!r}; TMA loads are part of the wgmma design (mma='wgmma')")
        if not isinstance(self.warp_specialized, bool) or (self.warp_specialized and not self.tma):
            raise ValueError(f"FmhaParams: warp_specialized={self.warp_specialized!r}; a producer warpgroup issues "
                             f"TMA copies: it needs tma=True (and mma='wgmma')")
        if self.pingpong and (not self.warp_specialized or self.block_q < 128):
            raise ValueError(f"FmhaParams: pingpong=True passes the turn to issue wgmma between consumer "
                             f"warpgroups: it needs warp_specialized=True and block_q >= 128 (two warpgroups of 64 "
                             f"queries); got warp_specialized={self.warp_specialized}, block_q={self.block_q}")
        if self.persistent and self.mma != "wgmma":
            raise ValueError("FmhaParams: persistent=True walks the tiles with the wgmma design's blocks: it needs "
                             "mma='wgmma'")
        if self.q_by_producer and not self.warp_specialized:
            raise ValueError("FmhaParams: q_by_producer=True has the producer warpgroup load the query tile by TMA: it "
                             "needs warp_specialized=True (and tma=True, mma='wgmma')")
        if self.separate and not self.warp_specialized:
            raise ValueError("FmhaParams: separate=True gives K and V mbarrier rings of their own, which a producer "
                             "warpgroup fills: it needs warp_specialized=True (and tma=True, mma='wgmma')")
        if self.q_stages > 1 and not self.q_by_producer:
            raise ValueError(f"FmhaParams: q_stages={self.q_stages} gives the producer's query-tile ring more "
                             f"buffers: it needs q_by_producer=True (and warp_specialized=True)")
        if self.overlap and not self.warp_specialized:
            raise ValueError("FmhaParams: overlap=True rotates the warp-specialized consumers' key loop: it needs "
                             "warp_specialized=True")
        if self.warp_specialized and self.stages < 2:
            raise ValueError(f"FmhaParams: warp_specialized=True with stages={self.stages}; the producer fills one "
                             f"stage while the consumers read another: stages >= 2")
        if self.mma == "wgmma" and (self.block_q % 64 or self.warps != self.block_q // 16 or self.block_kv > 256):
            raise ValueError(f"FmhaParams: with mma='wgmma' a warpgroup holds 64 query rows and the key tile is "
                             f"wgmma's N: block_q a multiple of 64 (got {self.block_q}), warps = block_q // 16 "
                             f"(got {self.warps}, want {self.block_q // 16}), block_kv <= 256 (got {self.block_kv})")


def plan(batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int, *, arch: str | None = None,
         sms: int | None = None, causal: bool = False) -> FmhaParams:
    """The schedule and tiles for a shape on ``arch`` (measured on an H100, bench/README.md).

    On sm_90a, warpgroup MMAs (``mma="wgmma"``) with K and V by TMA: above head dim 64 a producer
    warpgroup and two consumer warpgroups of 64 queries each (128-key tiles and 3 stages up to
    head dim 128; at 256 64-key tiles, K and V on rings of their own of 2 stages each,
    ``separate``, and with a causal mask 240 registers a consumer, ``producer_regs=24``), taking
    turns to issue their wgmma, each step's S = Q Kᵀ issued with the previous step's O += P V; at
    head dim 64 and below 64 queries on one warpgroup, 64 keys a step, without a producer (faster
    there; 64 keys against 128: 0.82 -> 0.90x cuDNN at the BERT shape 32x16x384x64, 0.80 -> 0.93x
    causal, equal at 2048 keys; ``bench/fmha.py --vary``, timed through CUDA graphs).  Without a
    mask, at head dims 96 and 128 and up to 2,048 keys: FlashAttention-3's persistent design — K
    and V on rings of their own, two stages each (``separate``), one block per SM walking the
    query tiles, the producer loading each tile's Q into one of two buffers (``persistent``,
    ``q_by_producer``, ``q_stages=2``), so a tile's boundary does not wait for its Q.  Longer key
    loops and causal masks keep a block per query tile on one three-stage ring.  Causal at head
    dim 128 with up to 512 keys: two blocks an SM of one 64-query consumer warpgroup each
    (``blocks_per_sm=2``).

    Elsewhere, FlashAttention-2's mma.sync design:

    * 32 query rows a warp up to head dim 128: every K and V fragment a warp loads from shared
      memory feeds two MMAs.  Its registers hold the output (32 x ``head_dim`` / 32 a thread),
      the scores (32 x ``block_kv`` / 32) and P, so the key tile is 64 at head dim 64 and below
      and 32 at 96 and 128 (64 there spills); at 128 the query fragments come 32 head-dim
      columns at a time (``q_slice``: 16 at a time spills);
    * 16 rows a warp at head dim 256 (the output alone is 128 registers a thread), keys 32 at a
      time; and with a causal mask above head dim 64 (its predicates take the registers 32 rows
      leave: 16 bytes spill at head dim 128), there as 64 queries on 4 warps with 64 keys a step,
      within 2% of the spilling 32-row kernel.

    Either way 64 queries a block where 128 would leave SMs idle (``sms``: the GPU's SM count,
    the target's by default, 132 on an H100)."""
    tgt = get_target(arch)
    sms = tgt.sm_count if sms is None else sms
    if tgt.has_wgmma:
        if head_dim <= 64:
            return FmhaParams(block_q=64, block_kv=64, warps=4, stages=2, mma="wgmma", tma=True)
        if causal and head_dim == 128 and seq_kv <= 512:
            # short causal key loops: two blocks an SM of one 64-query consumer warpgroup, so that
            # one block's prologue and output store run under the other's key loop (32x16x512x128
            # causal: 0.83-0.85 -> 0.89-0.92x cuDNN; level at 1,024 keys, 0.96 against 1.03x at
            # 2,048; bench/README.md, "two blocks an SM, with the TMA-store epilogue")
            return FmhaParams(block_q=64, block_kv=64, warps=4, stages=3, mma="wgmma", tma=True,
                              warp_specialized=True, reverse=True, overlap=True, blocks_per_sm=2)
        block_kv, stages = 128, 3
        block_q = 64 if batch * heads * -(-seq_q // 128) < sms or seq_q <= 64 else 128
        # causal: longest query tiles first (4x16x4096x128: 0.81 -> 0.84x cuDNN, 16x16x1024x128:
        # 0.68 -> 0.72x; at head dim 64 the reversed indices cost registers and it measured slower).
        # Each step's S = Q Kᵀ issued with the previous step's O += P V (overlap), and the two
        # consumer warpgroups taking turns (pingpong): when chosen, 4x16x4096x128 0.82 -> 0.92-0.93x
        # cuDNN, causal 0.83-0.84 -> 0.86-0.89x, 16x16x1024x128 0.70-0.75 -> 0.77-0.82x; either
        # alone gains less, pingpong alone loses (bench/README.md, "overlap and ping-pong"; with
        # the later lowering changes the plan reads 0.98-1.01x at 4x16x4096x128)
        # one block per SM walking the query tiles, with the producer loading the next tile's Q
        # (persistent, q_by_producer) measured no faster at 16x16x1024x128, where each tile's
        # Q load and O store are what is left unoverlapped: 0.82-0.83x cuDNN against 0.83 for
        # this plain grid (persistent alone 0.78-0.79; causal 0.64-0.69 against 0.81), and
        # 0.90-0.93x against 0.98-0.99 at 4096 keys (bench/README.md, "Q by the producer")
        if head_dim > 128:
            # head dim 256: K and V on rings of their own, two 64-key stages each (K's stage goes
            # back to the producer once S = Q Kᵀ retired, a step before V's): 1.3-1.6x faster than
            # one ring of two stages, 0.91-0.99x cuDNN with the producer loading Q, and 1-3 % more
            # with the consumers loading it (4x16x4096x256 1.00, causal 1.00; 16x16x1024x256 0.98,
            # causal 0.95); the persistent grid loses there (0.50-0.93x; bench/README.md, "Head
            # dims 96 and 256 on rings of their own")
            # with a causal mask the consumers take 240 registers (the producer 24): at 232 the
            # diagonal steps' loop spilled 32-40 bytes a thread (NVRTC 13.0)
            return FmhaParams(block_q=block_q, block_kv=64, warps=block_q // 16, stages=2, mma="wgmma", tma=True,
                              warp_specialized=True, reverse=causal, pingpong=block_q >= 128, overlap=True,
                              separate=True, producer_regs=24 if causal else PRODUCER_REGS)
        if block_q == 128 and head_dim in (96, 128) and not causal and seq_kv <= 2048:
            # FlashAttention-3's layout of the 224 KiB: K and V on rings of their own, two 128-key
            # stages each (K's stage goes back to the producer once S = Q Kᵀ retired, a step
            # before V's: two such stages keep the copies as far ahead as three shared ones), which
            # leaves room for two query buffers and the output's own staging, so one block per SM
            # walks the query tiles with the next tile's Q already loaded.  Where key loops are
            # short a tile's boundary is a large part of it: 32x16x512x128 0.86-0.87 -> 1.02-1.05x
            # cuDNN, 16x16x1024x128 0.96 -> 1.02, 8x16x2048x128 0.99 -> 1.00-1.01; at 4,096 keys
            # the plain grid stays 2 % ahead, and with a causal mask the persistent grid's fixed
            # order loses (0.69-0.82x; bench/README.md, "K and V on rings of their own").  Head
            # dim 96 alike: 16x16x1024x96 0.93 -> 1.03x, 8x16x2048x96 1.05 -> 1.07, and at 4,096
            # keys the plain grid 1.09 against 1.09 (bench/README.md, "Head dims 96 and 256")
            return FmhaParams(block_q=128, block_kv=128, warps=8, stages=2, mma="wgmma", tma=True,
                              warp_specialized=True, pingpong=True, overlap=True, persistent=True,
                              q_by_producer=True, q_stages=2, separate=True)
        return FmhaParams(block_q=block_q, block_kv=block_kv, warps=block_q // 16, stages=stages, mma="wgmma",
                          tma=True, warp_specialized=True, reverse=causal, pingpong=block_q >= 128, overlap=True)
    if head_dim > 128:
        rows, block_kv, block_q = 16, 32, 128
    elif causal and head_dim > 64:
        rows, block_kv, block_q = 16, 64, 64
    else:
        rows, block_kv, block_q = 32, 64 if head_dim <= 64 else 32, 128
    tiles = batch * heads * -(-seq_q // block_q)
    if tiles < sms or seq_q <= 64:
        block_q = 64
    # 32 rows a warp at head dim 128: query fragments 32 columns at a time (16 at a time the kernel
    # took 255 registers and spilled 8 bytes a thread wherever the tiles divide the sequence; 32:
    # 240 for sm_80, 246 for sm_90a, no spill, 0.95-0.96x flash against 0.93-0.95; causal's 16-row
    # tiles measured 1.5-3% slower with 32, bench/README.md "query fragments 32 columns at a time")
    q_slice = 32 if rows == 32 and head_dim == 128 else 16
    return FmhaParams(block_q=block_q, block_kv=block_kv, warps=block_q // rows, stages=2, q_slice=q_slice)


def fmha_schedule(spec: Attention, p: FmhaParams) -> Schedule:
    """The schedule of ``spec`` with tiles ``p``: FlashAttention-2's (see the module docstring),
    or with ``p.mma == "wgmma"`` Hopper's warpgroup MMAs (``fmha_schedule_wgmma``)."""
    if p.mma == "wgmma":
        return fmha_schedule_wgmma(spec, p)
    mma = sm80.mma_m16n8k16_f16_f32 if spec.q.dtype.name == "f16" else sm80.mma_m16n8k16_bf16_f32
    rows = p.block_q // p.warps
    d = spec.o.extent("d")
    return spec.schedule(
        # reverse: the last query tiles (causal: the longest key loops) start first
        tile(b=1, hk=1, g=1, q=p.block_q) >> to_blocks(reverse=p.reverse, occupancy=p.blocks_per_sm),
        move_to_smem("Q"),
        online_softmax(kv=p.block_kv),
        move_to_smem("K"), move_to_smem("V"),
        pipeline(stages=p.stages, prefetch=False),
        # P stays in registers: the probabilities are the scores' accumulator, converted in place,
        # and the second MMA reads them as its A operand
        place("S", RF), place("P", RF),
        # a warp's query fragments of one slice of d (q_slice columns) stay while its key
        # fragments come 16 keys at a time (one ldmatrix x4 each): few registers live next to S and O
        part(SCORES, tile(q=rows) >> to_warps(), tile(d=min(p.q_slice, d), unroll=not p.roll_slices),
             move_to_regs("Q"), tile(kv=16),
             move_to_regs("K"),
             tile(q=16, kv=8, d=16) >> done(mma)),
        part(VALUES, tile(q=rows) >> to_warps(), tile(kv=16), tile(d=min(d, 128)), move_to_regs("V"),
             tile(q=16, d=8, kv=16) >> done(mma)),
    )


def consumer_regs(warpgroups: int, blocks_per_sm: int = 1, producer_regs: int = PRODUCER_REGS) -> int:
    """The registers each consumer thread may take (``setmaxnreg``): what the launch gives the
    block (its share of the SM's 64K with ``blocks_per_sm`` blocks at once) after the producer
    warpgroup's ``producer_regs``, shared by ``warpgroups`` consumers, a multiple of 8, at most 240
    (``lower.transforms.specialize.consumer_regs_for``)::

        two consumer warpgroups, producer 40:  (384 x 168 - 128 x 40) / 256 = 232
        two consumer warpgroups, producer 24:  (384 x 168 - 128 x 24) / 256 = 240
    """
    from ..lower.transforms.specialize import consumer_regs_for

    return consumer_regs_for(get_target("sm_90a"), warpgroups, producer_regs, cap=240, blocks=blocks_per_sm)


def fmha_schedule_wgmma(spec: Attention, p: FmhaParams) -> Schedule:
    """Attention on sm_90a's warpgroup MMAs, one warpgroup per 64 query rows::

        move_to_smem("Q"), online_softmax(kv), move_to_smem("K"), move_to_smem("V"), pipeline(...)
        place("S", RF), place("P", RF)
        part(SCORES, tile(q=64) >> to_warpgroups(), tile(d=16) >> done(wgmma m64n{kv}k16, A and B
             from shared memory: Q and K, both K-major))
        part(VALUES, tile(q=64) >> to_warpgroups(), tile(kv=16) >> done(wgmma m64n{d}k16 with A from
             registers — P, the first wgmma's accumulator converted in place — and B = V read MN-major))

    K and V arrive by TMA (``p.tma``; one thread issues a tile, it completes on an mbarrier) or
    by every thread's cp.async, Q by cp.async (or, with ``p.q_by_producer``, by the producer's
    TMA once per query tile); either way in the canonical swizzled layout wgmma's descriptors
    describe (cp.async copies are fenced into the async proxy before the barrier that hands a
    stage over).  Each MatMul's wgmma group is committed and waited for
    before the softmax reads its accumulator.

    With warp specialization the output leaves through shared memory and TMA stores
    (``lower.rules.accumulators.store_via_tma``), staged in the query rows each consumer
    warpgroup has finished multiplying (``lower.rules.borrow``): the three-stage K/V ring leaves
    no room for staging of its own (16x16x1024x128: 0.84 -> 0.93x cuDNN, bench/README.md).
    With ``p.separate`` K and V have rings of their own (``pipeline(separate=True)``), whose two
    stages keep the copies as far ahead as three shared ones; the 64 KiB that frees holds a
    second query buffer (``p.q_stages``) and the output's own staging, FlashAttention-3's
    persistent layout."""
    from ..hardware.atoms import sm90a

    dt = spec.q.dtype.name
    d = spec.o.extent("d")
    # the widest wgmma swizzle span (128, 64 or 32 bytes: 64, 32, 16 elements) that tiles a row of
    # head_dim elements: rows are cut into boxes one span wide
    bits = next(b for b in (3, 2, 1) if d % (8 << b) == 0)
    sw = Swizzle(bits, 3, 3)
    via = (sm90a.tma_load_2d,) if p.tma else ()      # the TMA family: the rule picks the map's rank
    # q_by_producer: a TMA move above the key loop, which the producer issues once per query tile
    via_q = (sm90a.tma_load_2d,) if p.q_by_producer else ()
    return spec.schedule(
        # reverse: the last query tiles (causal: the longest key loops) start first; persistent:
        # one block per SM walks the tiles, its producer loading the next tile's keys while the
        # consumers finish the last
        tile(b=1, hk=1, g=1, q=p.block_q) >> to_blocks(reverse=p.reverse, persistent=p.persistent,
                                                       occupancy=p.blocks_per_sm),
        # q_stages: with q_by_producer the next tile's Q lands in a buffer of its own
        move_to_smem("Q", swizzle=sw, via=via_q, stages=p.q_stages),
        online_softmax(kv=p.block_kv),
        move_to_smem("K", swizzle=sw, via=via), move_to_smem("V", swizzle=sw, via=via),
        # overlap: each step's S = Q Kᵀ issues with the previous step's O += P V
        # separate: K and V on rings of their own, K's stage released once S = Q Kᵀ retired
        pipeline(stages=p.stages, overlap=p.overlap, separate=p.separate),
        # pingpong: the consumer warpgroups take turns to issue their wgmma, so that one's softmax
        # runs under the other's matrix products
        *([warp_specialize(producer_regs=p.producer_regs,
                           consumer_regs=consumer_regs(p.block_q // 64, p.blocks_per_sm, p.producer_regs),
                           pingpong=p.pingpong)]
          if p.warp_specialized else []),
        # P stays in registers: the second wgmma reads its A operand from them
        place("S", RF), place("P", RF),
        part(SCORES, tile(q=64) >> to_warpgroups(), tile(d=16) >> done(sm90a.wgmma_atom(p.block_kv, dt))),
        part(VALUES, tile(q=64) >> to_warpgroups(),
             tile(kv=16) >> done(sm90a.wgmma_atom(d, dt, a_in_registers=True, b_mn_major=True))),
    )


def fmha(batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int, *, dtype: str = "f16",
         arch: str | None = None, causal: bool = False, kv_heads: int | None = None, scale: float | None = None,
         lse: bool = False, params: FmhaParams | None = None) -> Schedule:
    """The schedule of attention's forward pass: Q, O ``(batch, heads, seq_q, head_dim)``, K, V
    ``(batch, kv_heads, seq_kv, head_dim)`` (kv_heads divides heads: grouped-query attention),
    fp16 or bf16, f32 softmax statistics; ``lse=True`` also returns the row log-sum-exp
    ``(batch, heads, seq_q)`` in f32.  ``causal`` masks keys past the query's position
    (torch's ``is_causal``); ``scale`` defaults to ``1/sqrt(head_dim)``.

    The kernel's operands are 5-D views without copies: Q and O as ``(batch, kv_heads,
    heads // kv_heads, seq, head_dim)``, LSE as ``(batch, kv_heads, heads // kv_heads, seq)``.
    ``arch`` is where it runs (None: the GPU present, else sm_90a): on sm_90a the schedule uses
    warpgroup MMAs (``fmha_schedule_wgmma``), elsewhere FlashAttention-2's mma.sync design (which
    ``params=FmhaParams(..., mma="mma_sync")`` also picks on sm_90a).
    """
    if dtype not in ("f16", "bf16"):
        raise ValueError(f"fmha: dtype={dtype!r}; allowed 'f16', 'bf16'")
    arch = get_target(arch).name if arch is None else arch
    if arch not in ARCHS:
        raise ValueError(f"fmha: arch={arch!r}; allowed {', '.join(ARCHS)}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"fmha: head_dim={head_dim}; allowed {', '.join(map(str, HEAD_DIMS))}")
    spec = Attention.kernel(batch, heads, seq_q, seq_kv, head_dim, dtype=dtype, kv_heads=kv_heads,
                            causal=causal, scale=scale, lse=lse)
    if params is not None and not isinstance(params, FmhaParams):
        raise ScheduleError("params is an FmhaParams", field="params", value=params,
                            fix="fs.recipes.FmhaParams(block_q=128, block_kv=64, warps=8)")
    p = params if params is not None else plan(batch, heads, seq_q, seq_kv, head_dim, arch=arch, causal=causal)
    if p.mma == "wgmma" and not get_target(arch).has_wgmma:
        raise ScheduleError(f"wgmma needs sm_90a; the target is {arch}", field="mma", value=p.mma,
                            allowed="'mma_sync'", fix="FmhaParams(..., mma='mma_sync') or arch='sm_90a'")
    return fmha_schedule(spec, p)


__all__ = ["fmha", "fmha_schedule", "fmha_schedule_wgmma", "plan", "FmhaParams", "HEAD_DIMS", "MMAS"]
