"""Weight-only int4 GEMM (W4A16): ``C (M, N) = A (M, K) @ dequant(B)``, the weights int4 codes
with a scale per group of ``group_size`` rows of a column, dequantised in registers.

Built only from strategies; the one thing particular to int4 is the register move of B, which
dequantises (``move_to_regs`` of a u4/i4 operand, ``lower.rules.dequant``) with the group scales
a prologue op adds::

    split_k(s, across=BLOCK)                       # small M: K parts over blocks, then a reduction
    tile(m=BM, n=BN) >> to_blocks()
    tile(k=BK)
    move_to_smem("A"), move_to_smem("B", swizzle)  # B: packed codes, 16-byte cp.async chunks, in the
                                                   # swizzle its word loads read without conflicts
    pipeline(stages=S)                             # S K tiles of weights in flight per block; the
                                                   # ring also stages each tile's group scales
    tile(m=WM, n=WN) >> to_warps(...)
    tile(k=WK)
    move_to_regs("A")                              # ldmatrix
    move_to_regs("B")                              # one 32-bit word of 8 codes per 2 MMAs of a lane,
    prologue("B", ops.group_scale("S", group_size, zero=8))   # dequantised and scaled in registers
    tile(m=16, n=8, k=16) >> done(mma_m16n8k16)

On sm_90a, M above 16 runs on wgmma instead (``W4A16WgmmaParams``, ``plan_wgmma``), and so does
M <= 16 where 64-column tiles fill the GPU without a K split; the product
is computed transposed, ``Cᵀ = dequant(B)ᵀ Aᵀ``, so that the dequantised weights are the wgmma's A
operand, which it reads from registers, and the activations its B, read from shared memory::

    tile(m=BM, n=BN) >> to_blocks()                # BM activation rows x BN weight columns
    tile(k=BK)
    move_to_smem("B", swizzle), move_to_smem("A")  # cp.async: codes, and 128-byte swizzled activations
    pipeline(stages=S)
    tile(n=64) >> to_warpgroups()                  # 64 weight columns: the wgmma's 64 rows
    move_to_regs("B")                              # 128 threads dequantise into the _rs A fragment
    prologue("B", ops.group_scale("S", group_size, zero=8))
    tile(k=16) >> done(wgmma_m64n<BM>k16_rs)

The plan's tiles take a producer warpgroup that loads the codes (as bytes) and the activations by
TMA into an mbarrier ring instead (``W4A16WgmmaParams(producer=True)``: ``move_to_smem(..., via=tma)`` and
``warp_specialize``), and the two consumer warpgroups only dequantise and issue wgmma.  The ring
brings each K tile's scale rows too (one more TMA box a stage), every consumer thread hands a
stage back by its own arrival once its reads are done, and C (stored transposed) goes out in
pairs of elements that neighbouring lanes swap into place.

B is stored ``(N, K)``, K contiguous (``torch.nn.Linear``'s ``weight`` layout), two codes a byte,
and *packed*: inside each block of 32 k of a column (64 or 128 k where a lane loads two or four
words at once) the codes are in the order the MMA's fragments want them (``lower.synthesis.packing_for``, derived from the MMA's TV layout and the
convert atom's value order).  ``pack_weights`` produces that from ``quant.quantize_int4``'s codes.
The scales are ``(ceil(K / group_size), N)`` in the activations' type (and so are the zero points
with ``zero_point=True``); the K loop's ring stages each tile's rows of them in shared memory.
"""

from __future__ import annotations

import attrs
import numpy as np

from .. import ops as fops
from ..dtypes import dtype as fs_dtype
from ..errors import ScheduleError
from ..hardware.atoms import convert as cv
from ..hardware.atoms import sm80, sm90a
from ..hardware.target import target as get_target
from ..layout import Swizzle
from ..lower.synthesis import packing_for, swizzle_for_words
from ..packing import Packing
from ..quant import GROUP_SIZES, pack_int4
from ..schedule import Schedule
from ..spec import MatMul
from ..strategies import (
    done,
    move_to_regs,
    move_to_smem,
    pipeline,
    prologue,
    scale_partials,
    split_k,
    stream_k,
    tile,
    to_blocks,
    to_warpgroups,
    to_warps,
    warp_specialize,
)
from ..strategies.partials import group_copies
from ..tensor import BLOCK, GL, KERNEL, WARP, WARPGROUP, Tensor, Tile

_MMA = {"f16": sm80.mma_m16n8k16_f16_f32, "bf16": sm80.mma_m16n8k16_bf16_f32}
#: K elements of one packed block (a 16-byte chunk of a column): K must be a multiple
PACK_K = 32
#: K per split-K part: split_k across blocks cuts K in multiples of 64
SPLIT_UNIT = 64
# M <= 16 on sm_90a, weights of many columns (bench/README.md, "W4A16 at models' shapes"; measured
# on an H200, f16, M = 1 / 16, us): the wgmma family's 128 columns a block, K unsplit, where its
# blocks make one wave or K is this long — 28672 x 8192 45.2 / 46.9 against 80.7 / 79.3 on the
# cp.async tiles of 64 columns, 14336 x 4096 (112 blocks) 13.6 / 13.4 against 14.7 / 14.3; but
# 22016 x 4096 (172 blocks, 1.3 waves) 24.2 / 24.9 against 24.2 / 24.3 — there the cp.async tiles
# take 128 columns on 8 warps (21.7 / 21.9)
WIDE_WGMMA_K = 8192
#: ... that is, where their 64-column tiles unsplit would make more than this many waves of blocks
WIDE_COLUMN_WAVES = 2
# M <= 16 where K's tiles of 128 stop the split short of the wave but tiles of 64 do not: 64 k a
# stage on this many stages.  Measured on an H200 (f16, M = 1 / 16): 4096 x 11008 (86 tiles of
# 128 k, split 2) 16.6 / 16.4 us against 15.2 / 14.8 on 64 k a stage, 8 stages, split 4 (12
# stages: 16.0 / 16.0)
SHORT_K_STAGES = 8
#: the least K a part of the wgmma family's K split keeps (eight K tiles of 128)
MIN_PART_K = 1024
#: registers a thread of the producer warpgroup keeps (it only issues TMA copies), and the most a
#: consumer thread takes (what the GEMM's warp-specialized schedule uses)
PRODUCER_REGS = 40
CONSUMER_REGS_MAX = 240


def _check_field_types(params) -> None:
    """Every field of a parameter record is a positive int, or a bool where its default is one."""
    name = type(params).__name__
    for f in attrs.fields(type(params)):
        v = getattr(params, f.name)
        if isinstance(f.default, bool):
            if not isinstance(v, bool):
                raise ValueError(f"{name}: {f.name} must be True or False, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name}: {f.name} must be a positive int, got {v!r}")


def _check_combine(params) -> None:
    """At most one way of adding a K split's parts in the kernel."""
    if params.fixup and params.cluster_combine:
        raise ValueError(f"{type(params).__name__}: fixup=True and cluster_combine=True both add the K parts in the "
                         f"kernel; choose one")


@attrs.frozen
class W4A16Params:
    """The tiles of the W4A16 schedule.

    * ``block_m``, ``block_n``, ``block_k``: a block's tile (``block_k`` a multiple of 32);
    * ``warps_m`` x ``warps_n``: warps of a block, each with ``block_m / warps_m`` rows (a
      multiple of 16) and ``block_n / warps_n`` columns (a multiple of 8);
    * ``warp_k``: K per fragment load (a multiple of 32: one word of codes covers 32 k);
    * ``warps_k``: groups of warps that share a K tile, each taking ``block_k / warps_k`` of it
      with its own accumulator (``split_k(warps_k, across=WARP)``), their partial sums added
      through shared memory before C is stored: more warps dequantise a block's weights without
      more blocks, so small M fills the SMs in one launch (measured on an H100 at M <= 16, N = K =
      4096: 6.7-7.5 us against the K split's 6.2-6.9, so ``plan`` leaves it at 1);
    * ``stages``: K tiles in flight (the cp.async ring);
    * ``split_k``: K parts over blocks (their f32 partial sums added by a second launch, or with
      ``fixup`` by the block of each tile's last part in the same launch);
    * ``fixup``: ``split_k(..., combine="fixup")`` instead of a second launch (measured slower on
      an H100 at the plan's tiles: M = 1-256, N = K = 4096 and 8192, 0.85-1.02x the two launches;
      ``plan`` leaves it off);
    * ``cluster_combine``: ``split_k(..., combine="cluster")`` instead: a tile's K parts form a
      thread-block cluster (sm_90a, 2 to 8 parts) and push their partial sums into the last
      part's shared memory; one of ``fixup`` and ``cluster_combine``;
    * ``direct``: the codes go straight from global memory into each warp's registers (no shared
      memory, no barriers in the K loop: ``move_to_regs("B")`` of the codes left in GL), on a ring
      of ``stages`` register slots of ``warp_k`` each (``pipeline`` in registers,
      ``lower.transforms.register_ring``), the first slots loaded at the kernel's start;
      ``block_k`` is then the K of A a block copies into shared memory at once, before its warps'
      loop (the whole K part: one copy, and the ring's first loads issued beside it).  Measured
      slower on an H100 at M <= 16 (N = K = 4096: 7.4-8.5 us against the shared-memory ring's
      6.1-6.7; bench/README.md), so ``plan`` leaves it off;
    * ``stream_k``: K chunks per output tile spread over a persistent grid instead
      (``strategies.stream_k``): the partial tiles are added in the same kernel, through a
      workspace and flags, so there is no second launch.  One of the two, not both.  Measured
      slower than split-K at M <= 16 on an H100 (0.74-1.49x cuBLAS against 2.0-2.6x: a block
      waits for its neighbour's partial tile), so ``plan`` splits K;
    * ``scale_partials``: the group scales multiply each group's f32 partial product of a warp's
      K step instead of every dequantised weight (``strategies.scale_partials``; see
      ``W4A16WgmmaParams``).
    """

    block_m: int = 16
    block_n: int = 128
    block_k: int = 128
    warps_m: int = 1
    warps_n: int = 4
    warp_k: int = 32
    warps_k: int = 1
    stages: int = 4
    split_k: int = 1
    stream_k: int = 1
    fixup: bool = False
    cluster_combine: bool = False
    direct: bool = False
    scale_partials: bool = False

    def __attrs_post_init__(self):
        _check_field_types(self)
        _check_combine(self)
        if self.direct and self.stream_k > 1:
            raise ValueError(f"W4A16Params: direct=True keeps a block's whole K part of A in shared memory; "
                             f"stream_k={self.stream_k} walks K chunks of several tiles: choose one")
        if self.split_k > 1 and self.stream_k > 1:
            raise ValueError(f"W4A16Params: split_k={self.split_k} and stream_k={self.stream_k} both cut K; "
                             f"choose one (the other 1)")
        if self.block_m % (16 * self.warps_m) or self.block_n % (8 * self.warps_n):
            raise ValueError(f"W4A16Params: block_m={self.block_m} must be a multiple of 16 x warps_m "
                             f"({16 * self.warps_m}) and block_n={self.block_n} of 8 x warps_n ({8 * self.warps_n})")
        if self.block_k % PACK_K or self.warp_k % PACK_K or self.block_k % self.warp_k:
            raise ValueError(f"W4A16Params: block_k={self.block_k} and warp_k={self.warp_k} must be multiples of "
                             f"{PACK_K} (a word of codes covers {PACK_K} k), warp_k dividing block_k")
        if self.block_k % (self.warps_k * self.warp_k):
            raise ValueError(f"W4A16Params: warps_k={self.warps_k} groups of warps each take block_k / warps_k = "
                             f"{self.block_k / self.warps_k:g} k of a K tile, which must be a multiple of warp_k="
                             f"{self.warp_k}; use block_k={self.warps_k * self.warp_k} or a divisor warps_k")


@attrs.frozen
class W4A16WgmmaParams:
    """The tiles of the sm_90a W4A16 schedule, which computes ``Cᵀ = dequant(B)ᵀ Aᵀ`` on wgmma:
    the dequantised weights are the wgmma's A operand, from registers (``_rs``), and the
    activations its B operand, from shared memory (module docstring, ``gemm_w4a16``).

    * ``block_m``: activation rows a block (the wgmma's N: a multiple of 8 up to 256);
    * ``block_n``: weight columns a block, 64 per consumer warpgroup (64, 128, 192);
    * ``block_k``: K a stage (a multiple of 32, a 16-byte load of codes per lane at 128);
    * ``stages``: K tiles in flight (the cp.async ring; it also stages the group scales);
    * ``split_k``: K parts over blocks (their f32 partial sums added by a second launch, or with
      ``fixup`` by the block of each tile's last part in the same launch);
    * ``fixup``: ``split_k(..., combine="fixup")`` instead of a second launch (measured slower at
      the plan's tiles, as for ``W4A16Params``);
    * ``cluster_combine``: ``split_k(..., combine="cluster")`` instead (as for ``W4A16Params``);
    * ``occupancy``: blocks resident on an SM at once (``to_blocks(occupancy=...)``: the register
      budget ptxas gets), so one block's dequantisation runs under another's wgmma;
    * ``producer``: a producer warpgroup loads codes and activations by TMA into an mbarrier ring
      (``warp_specialize``; the codes travel as bytes, unswizzled), and the consumer warpgroups
      load the group scales themselves; with ``pingpong`` they take turns to dequantise and issue,
      so one's dequantisation runs while the other's wgmma do;
    * ``warpgroups_k``: consumer warpgroups sharing each K tile (``split_k(warpgroups_k,
      across=WARPGROUP)``): each dequantises and multiplies ``block_k / warpgroups_k`` of every
      stage into an accumulator of its own, and the parts are added through shared memory before
      C is stored: more warps dequantise what one block streams (``plan_wgmma`` takes it where K
      is not split over blocks, ``SHARED_K_CONSUMERS``; measured slower with K split over blocks,
      bench/README.md);
    * ``scale_partials``: the group scales multiply each group's f32 partial product once the
      stage's wgmmas are done, instead of every dequantised weight (``strategies.scale_partials``):
      a consumer thread then converts a word of codes without its four ``mul.f16x2``.

    A warpgroup dequantises its whole K tile, then issues its wgmmas and retires them before the
    next tile's dequantisation overwrites the fragment (the wgmma reads A registers until it is
    retired); the overlap is between warpgroups and blocks.
    """

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    stages: int = 4
    split_k: int = 1
    fixup: bool = False
    occupancy: int = 1
    producer: bool = False
    pingpong: bool = False
    cluster_combine: bool = False
    warpgroups_k: int = 1
    scale_partials: bool = False

    def __attrs_post_init__(self):
        _check_field_types(self)
        _check_combine(self)
        if self.block_k % (self.warpgroups_k * PACK_K):
            raise ValueError(f"W4A16WgmmaParams: block_k={self.block_k} is shared by warpgroups_k={self.warpgroups_k} "
                             f"consumer warpgroups, each a multiple of {PACK_K} k (a word of codes)")
        if self.pingpong and not self.producer:
            raise ValueError("W4A16WgmmaParams: pingpong=True takes turns between the consumers of a producer "
                             "warpgroup: set producer=True too")
        if self.block_m % 8 or self.block_m > 256:
            raise ValueError(f"W4A16WgmmaParams: block_m={self.block_m} is the wgmma's N: a multiple of 8 up to 256")
        if self.block_n % 64 or self.block_n > 192:
            raise ValueError(f"W4A16WgmmaParams: block_n={self.block_n} is 64 weight columns per consumer "
                             f"warpgroup: 64, 128 or 192")
        if self.block_k % PACK_K:
            raise ValueError(f"W4A16WgmmaParams: block_k={self.block_k} must be a multiple of {PACK_K} (a word of "
                             f"codes covers {PACK_K} k)")


def plan(M: int, N: int, K: int, *, sms: int = 132, wgmma: bool = False, group_size: int | None = 128,
         zero_point: bool = False, dtype: str = "f16") -> W4A16Params | W4A16WgmmaParams:
    """The tiles for a shape, from a sweep on an H100 (``bench/gemm_w4a16.py --sweep``,
    bench/README.md).  Every warp holds all of its block's rows where it can, so a weight is
    dequantised once per block, not once per warp row:

    * M <= 16 (the kernel streams the weights): 16 rows a block (one m16 MMA tile), 64 columns on
      4 warps, 128 k a stage in two steps of 64 (a warp's 16 columns x 64 k are 16 registers), 6
      stages from K = 8192 (4 below: equal at 4096), and K split until the grid holds about two
      blocks an SM (a deeper ring on fewer blocks: 2.58 -> 2.69x cuBLAS at M = 1, N = K = 8192;
      ``--sweep --deep``); on sm_90a 128 columns on 8 warps where 64 unsplit would make more than
      ``WIDE_COLUMN_WAVES`` waves, and 64 k a stage on ``SHORT_K_STAGES`` stages where K's tiles
      of 128 stop the split short of the wave (K = 11,008);
    * M <= 32: 32 rows, 128 columns on 4 warps, 128 k a step, 3 stages;
    * M <= 128: 64 rows on one warp row, 64 columns (N <= 4096) or 128 on 4 warps, 64 k a stage
      and a step, 4 stages (1.43 -> 1.51x at M = 64, N = K = 8192);
    * larger M: 64 x 256 blocks on 8 warps (64 x 32 each), 64 k a stage, 32 a step, 4 stages
      (128 k a stage is 10-20% faster but spills at some edge shapes).  These run mma.sync, at
      about 0.35-0.45x cuBLAS's wgmma on fp16 weights.

    K is split over blocks (``split_k``, a second launch adds the f32 parts) until the grid holds
    one to two blocks an SM while each part keeps at least 4 K tiles.  ``group_size`` and
    ``zero_point`` (what ``gemm_w4a16`` is called with) size the scale (and zero-point) rows a
    wgmma ring stage holds beside its tiles, and with zero points a K tile spans at most 8 groups
    (the registers of their zero points); ``dtype`` (the activations', f16 or bf16) how many
    consumer warpgroups of the wgmma family share a K tile (``SHARED_K_CONSUMERS``).

    With ``wgmma`` (an sm_90a target), M above 16 takes the wgmma family instead
    (``plan_wgmma``): measured on an H100 against the tiles above, 1.14 -> 1.31x cuBLAS at M = 64,
    N = K = 4096, 0.87 -> 1.19x at M = 128, N = K = 8192, 0.41 -> 0.91x at M = 1024, 1.56 -> 1.89x
    at M = 32, N = K = 4096 (bench/README.md).  So does M <= 16 where the wgmma family's tile is
    64 columns with K unsplit, more than half a wave without a second launch: 2.80 -> 3.07x at M = 1 and
    2.71 -> 3.06x at M = 16, N = K = 8192; and so does M <= 16 where that tile's two K parts
    add up in a thread-block cluster (``CLUSTER_SPLITS``; measured on an H200 against the tiles
    above: N = K = 4096 6.0 -> 6.1 us at M = 1 f16, 6.2 - 6.6 -> 5.9 - 6.2 at M = 1 - 16
    otherwise; N = 4096, K = 11008 7 - 12 %, K = 14336 and N = 3072, K = 8192 3 - 5 % faster);
    where it would split K otherwise the tiles above stay (2.50x against 2.36x at M = 1, N = K =
    4096, parts added by a second launch).  Its tile of 128 columns (wide weights: N above 132 x
    64) is taken where it makes one wave or K is at least ``WIDE_WGMMA_K`` (measured on an H200:
    28672 x 8192 0.56-0.59 of the time of the 64-column cp.async tiles, 14336 x 4096 0.93-0.94,
    12288 and 11008 x 4096 0.97-0.98)."""
    _check_dtype("plan", dtype)
    if wgmma:
        p = plan_wgmma(M, N, K, sms=sms, group_size=group_size, zero_point=zero_point, dtype=dtype)
        blocks = -(-M // p.block_m) * -(-N // p.block_n)
        if M > 16 or p.cluster_combine or (p.split_k == 1 and 2 * blocks > sms and
                                           (p.block_n == 64 or blocks <= sms or K >= WIDE_WGMMA_K)):
            return p
    if M <= 16:
        bm, wm, bn, wn, bk, wk, st = 16, 1, 64, 4, 128, 64, 6 if K >= 8192 else 4
        columns = -(-N // bn)
        if wgmma and columns > WIDE_COLUMN_WAVES * sms:
            bn, wn = 128, 8
        elif _split_stops_on_tiles(columns, K, bk, 2 * sms) and \
                _k_split(columns, K, 64, 2 * sms) > _k_split(columns, K, bk, 2 * sms):
            # (11,008 = 86 x 128: two parts of 43 tiles, where four of 43 tiles of 64 fit)
            bk, st = 64, SHORT_K_STAGES
    elif M <= 32:
        bm, wm, bn, wn, bk, wk, st = 32, 1, 128, 4, 128, 128, 3
    elif M <= 128:
        bm, wm, bn, wn, bk, wk, st = 64, 1, 64 if N <= 4096 else 128, 4, 64, 64, 4
    else:
        bm, wm, bn, wn, bk, wk, st = 64, 1, 256, 8, 64, 32, 4
    tiles = -(-M // bm) * -(-N // bn)
    # small M streams the weights: the ring keeps them in flight, a second wave of parts only
    # adds reduction traffic
    return W4A16Params(block_m=bm, block_n=bn, block_k=bk, warps_m=wm, warps_n=wn, warp_k=wk,
                       stages=st, split_k=_k_split(tiles, K, bk, 2 * sms))


def _split_stops_on_tiles(tiles: int, K: int, bk: int, want: int) -> bool:
    """Whether ``_k_split`` stops doubling only because a part would not be whole K tiles of
    ``bk`` (the grid and the parts' length would allow it)."""
    split = _k_split(tiles, K, bk, want)
    return tiles * split * 2 <= want and K // (split * 2) >= 4 * bk and \
        (K % (split * 2) != 0 or (K // (split * 2)) % max(SPLIT_UNIT, bk) != 0)


def _k_split(tiles: int, K: int, bk: int, want: int) -> int:
    """The K split (a power of two) of ``tiles`` output tiles: doubled while the grid stays
    within ``want`` blocks and each part keeps at least 4 K tiles of ``bk``, in parts of whole K
    tiles (a part starting inside a tile would cut the codes' packed blocks)."""
    split = 1
    while (tiles * split * 2 <= want and K // (split * 2) >= 4 * bk and K % (split * 2) == 0
           and (K // (split * 2)) % max(SPLIT_UNIT, bk) == 0):
        split *= 2
    return split


#: consumer warpgroups a producer-fed block of K unsplit runs, per activation type, by the most
#: rows it holds (M up to the first entry's rows: its count; past the last: one a 64 columns):
#: the consumers share each K tile (``warpgroups_k``) where one per 64 columns would leave the SM
#: waiting on their dequantisation.  Measured on an H200 (bench/README.md), f16: M = 1, N = K =
#: 8192 14.4 -> 13.0 us with four consumers of 128 k each, 8192 x 28672 43.4 -> 37.6, 28672 x
#: 8192 44.6 -> 41.0 with two a column half, M = 64, N = K = 8192 21.2 -> 20.0 with two; bf16
#: gains at M = 1 (4-5 %) and M = 64 (4-8 %) but lost 0-2 % at M = 16 and 2-4 % at M = 32;
#: with the group scales on the partial products (``_partials``), four at M = 16 read 14.3 ->
#: 13.8 us against one.  Shares of less than ``MIN_SHARE_K`` measured slower, and so did K split
#: over blocks.
SHARED_K_CONSUMERS = {"f16": ((16, 4), (64, 2)), "bf16": ((16, 4), (32, 1), (64, 2))}
MIN_SHARE_K = 128

#: shared memory a block's ring may take (sm_90a's 227 KiB a block, less room for its mbarriers)
RING_BYTES = 227 * 1024 - 1024
#: K splits whose parts a producer-fed tile of 64 weight columns adds in a thread-block cluster
#: (``cluster_combine``) instead of a second launch.  Measured on an H200 (bench/README.md), time
#: launch / cluster: N = K = 4096 M = 17 1.16, 32 1.14, 64 1.10 (bf16 1.06, 1.09); N = 4096, K =
#: 14336 M = 17 1.07, 32 1.09, 64 1.03.  Tiles of 128 columns read 0.95 - 1.05 (M = 96 - 256), and
#: split in four their pushed tiles do not fit beside the ring; the mma.sync tiles' clusters of
#: four measured slower (0.78 at M = 1): neither is taken.
CLUSTER_SPLITS = (2,)
#: activation rows a producer-fed block takes above M = 256, with the rate each was measured to
#: reach on a full wave relative to 256 rows (H100, N = K = 4096 and 8192: bench/README.md)
ROW_RATES = {256: 1.0, 192: 0.92, 128: 0.80}


def plan_wgmma(M: int, N: int, K: int, *, sms: int = 132, group_size: int | None = 128,
               zero_point: bool = False, dtype: str = "f16") -> W4A16WgmmaParams:
    """The sm_90a family's tiles for a shape (measured on an H100, bench/README.md).  A
    warpgroup's dequantisation and its wgmmas take turns (the wgmma reads the fragment the
    dequantisation writes), so the overlap comes from other warpgroups:

    * 128 weight columns a block (two consumer warpgroups) and 128 k a stage: a 16-byte load of
      codes a lane, and half as many ring hand-overs as 64 k;
    * up to M = 256, a producer warpgroup too (below), with 64 or 128 activation rows a block
      (the wgmma's N; M rounded up to 8 below 128) and K split over blocks: of the row tiles and
      splits (powers of two, each part at least ``MIN_PART_K``) that keep the grid to one wave,
      the one with the most blocks, then the largest rows (no tile fits one wave: the fewest
      blocks).  Measured on an H100 against the cp.async tiles it replaces (64 rows, K split to
      nearly two blocks an SM): M = 64, N = K = 4096 1.32 -> 1.41x cuBLAS (split 4), 8192 1.78
      -> 2.06x (split 2); M = 128, 8192 1.23 -> 1.44x (128 rows, split 2); M = 256, 4096 0.79 ->
      0.92x (128 rows, split 2), 8192 0.75 -> 1.09x (128 rows);
    * up to M = 64, 64 weight columns a block (one consumer warpgroup) where they make as many
      blocks with fewer K parts (less partial-sum traffic, a longer K loop to hide the ring's
      start behind; two parts add up in a thread-block cluster, ``CLUSTER_SPLITS``: 8.9 -> 8.1
      us at M = 64, N = K = 4096 on an H200), and a longer K tile: 512 k up to 32 rows, 256 up
      to 64 (a warpgroup dequantises a whole K tile, then retires its wgmmas: longer tiles take
      fewer such turns).
      Measured on an H100 (``bench/gemm_w4a16.py --sweep --family wgmma``): M = 64, N = K = 4096
      1.50 -> 1.63x cuBLAS (64 columns, split 2, 256 k); M = 32, 4096 1.89x and 8192 2.91x;
      M = 16, 8192 3.06x (64 columns, no split, 512 k); where K is not split, consumer
      warpgroups share each K tile (``SHARED_K_CONSUMERS``: for f16 four of 128 k up to M = 16,
      two up to 64; measured on an H200, M = 1, N = K = 8192 2.68 -> 3.03x cuBLAS);
    * above: a producer warpgroup loads codes and activations by TMA (``producer=True``) for two
      consumer warpgroups that both dequantise and issue at once (taking turns, ``pingpong``,
      measured 2-5% slower), with 256, 192 or 128 activation rows a block — whichever finishes
      the grid's waves first at the rate each tile reaches (``ROW_RATES``) — and a ring as deep
      as shared memory holds, at most 4 (256 rows: 3 stages).  Against the cp.async tiles of
      two blocks an SM that this replaces: M = 1024, N = K = 8192 0.66 -> 0.91x cuBLAS, M = 4096
      0.72 -> 0.84x, M = 768, N = K = 4096 (192 rows) 0.74 -> 0.92x.  With the scales staged by
      the ring and every consumer thread releasing its stage: M = 4096 0.94-0.96x, M = 512-2048
      0.93-1.01x.
    """
    _check_dtype("plan_wgmma", dtype)
    bk = 128 if K % 128 == 0 else (64 if K % 64 == 0 else PACK_K)
    cols = -(-N // 128)
    if M <= 256:
        def splits(bm: int, bn: int) -> tuple[int, int, int, int]:
            """(blocks, split, rows, columns) of ``bm`` x ``bn`` tiles with K split as far as one
            wave allows."""
            tiles, split = -(-M // bm) * -(-N // bn), 1
            while (tiles * split * 2 <= sms and K % (split * 2) == 0 and K // (split * 2) >= MIN_PART_K
                   and (K // (split * 2)) % SPLIT_UNIT == 0):
                split *= 2
            return tiles * split, split, bm, bn

        r8 = -(-M // 8) * 8
        rows = [min(64, r8)] + ([min(128, r8)] if M > 64 else [])
        widths = (64, 128) if M <= 64 else (128,)
        # one wave with the most blocks (else the fewest blocks), then the largest rows, then the
        # fewest K parts
        _, _, bm, _, split, bn = max((b <= sms, b if b <= sms else -b, r, -sp, sp, c)
                                  for b, sp, r, c in (splits(r, c) for r in rows for c in widths))
        longest = 512 if bm <= 32 else 256 if bm <= 64 else 128
        if zero_point and group_size:
            longest = min(longest, max(128, 8 * group_size))
        bk = next(b for b in (512, 256, 128, 64, PACK_K) if b <= longest and (K // split) % b == 0)
        stage = _stage_bytes(bm, bn, bk, group_size, zero_point)
        share = _shared_k(M, bn, bk, split, dtype)
        # a 64-column tile's two K parts add up in a cluster: the lower part pushes its f32 tile
        # into the upper one's shared memory beside the ring (CLUSTER_SPLITS)
        cluster = bn == 64 and split in CLUSTER_SPLITS
        push = (split - 1) * bm * bn * 4 if cluster else 0
        return W4A16WgmmaParams(block_m=bm, block_n=bn, block_k=bk, stages=min(4, (RING_BYTES - push) // stage),
                                split_k=split, producer=True, warpgroups_k=share, cluster_combine=cluster,
                                scale_partials=_partials(bm, bk // share, group_size))

    def finish(bm: int) -> float:
        """The grid's time in units of a 256-row block's: its waves, each as long as a block."""
        waves = -(-(-(-M // bm) * cols) // sms)
        return waves * bm / 256 / ROW_RATES[bm]

    bm = min(ROW_RATES, key=finish)                  # ties: the first, the largest tile
    stage = _stage_bytes(bm, 128, bk, group_size, zero_point)
    return W4A16WgmmaParams(block_m=bm, block_n=128, block_k=bk, stages=min(4, RING_BYTES // stage),
                            producer=True)


#: scale_partials where a consumer's copies of the accumulator (one per group of its K share, each
#: ``block_m / 2`` f32 a thread) add at most this many columns' worth, ``block_m x copies``: measured
#: on an H200 (bench/README.md), 1.03-1.10x at 8 and 16 (M = 1 and 16 with one copy, M = 1 with
#: two), 0.94-0.99x at 32-64 but for M = 32, N = K = 8192 (1.04x)
PARTIALS_MAX_COLUMNS = 16


def _partials(bm: int, part_k: int, group_size: int | None) -> bool:
    """Whether a consumer that dequantises ``part_k`` of each K tile scales its group partial
    products (``W4A16WgmmaParams.scale_partials``): where the groups and its share nest, and the
    copies of its ``bm``-column accumulator stay few."""
    copies = group_copies(part_k, group_size)
    return copies is not None and bm * copies <= PARTIALS_MAX_COLUMNS


def _check_dtype(who: str, dtype: str) -> None:
    if dtype not in SHARED_K_CONSUMERS:
        raise ValueError(f"w4a16.{who}: dtype={dtype!r} (the activations'); allowed: "
                         f"{', '.join(map(repr, SHARED_K_CONSUMERS))}")


def _shared_k(M: int, bn: int, bk: int, split: int, dtype: str = "f16") -> int:
    """Consumer warpgroups sharing each K tile of a producer-fed block (``SHARED_K_CONSUMERS``):
    as many as make the block's consumers up to the count for ``M`` and ``dtype``, each with at
    least ``MIN_SHARE_K`` of the tile (a power of two); 1 where K is split over blocks."""
    most = next((c for rows, c in SHARED_K_CONSUMERS[dtype] if M <= rows), 1)
    share = 1
    while split == 1 and 2 * share * (bn // 64) <= most and bk // (2 * share) >= MIN_SHARE_K:
        share *= 2
    return share


def _stage_bytes(rows: int, cols: int, bk: int, group_size: int | None, zero_point: bool = False) -> int:
    """Shared memory of one stage of the wgmma family's ring: ``rows`` x ``bk`` activations,
    ``cols`` x ``bk`` codes, and the K tile's rows of group scales (one row for whole columns),
    and as many of zero points with ``zero_point``."""
    scale_rows = (-(-bk // group_size) if group_size else 1) * (2 if zero_point else 1)
    return rows * bk * 2 + cols * bk // 2 + scale_rows * cols * 2


def w4a16_spec(M: int, N: int, K: int, *, dtype: str = "f16", signed: bool = False, words: int = 1) -> MatMul:
    """The kernel spec: A ``(M, K)`` row-major ``dtype``, B ``(K, N)`` int4 codes stored ``(N, K)``
    packed for ``mma.m16n8k16``'s B fragments (``words`` of them a load), C ``(M, N)`` ``dtype``."""
    spec = MatMul.kernel(M, N, K, a=dtype, b="i4" if signed else "u4", c=dtype, layout="RC")
    pk = weight_packing(dtype, signed, words)
    return spec.with_operand("B", attrs.evolve(spec.b, tensor=attrs.evolve(spec.b.tensor, packing=pk)))


def weight_packing(dtype: str = "f16", signed: bool = False, words: int = 1) -> Packing:
    """The packing of B's k that the schedule's dequantising move reads (``packing_for`` the
    m16n8k16 B operand and the dequantisation atom): ``words=4`` puts a lane's four words of a
    128-k block side by side, so one 16-byte shared load reads them (``words=2``: 8 bytes)."""
    conv = getattr(cv, f"dequant_{'i4' if signed else 'u4z8'}_{dtype}")
    return packing_for(_MMA[dtype], "b", conv, words)


def load_words(K: int, p: W4A16Params) -> int:
    """Words of codes a lane loads at once: 4 (16 bytes, blocks of 128 k), 2 (8 bytes, blocks of
    64 k) or 1, the most for which K and a warp's K step are multiples of the block."""
    return next(w for w in (4, 2, 1) if K % (w * PACK_K) == 0 and p.warp_k % (w * PACK_K) == 0)


def gemm_w4a16(M: int, N: int, K: int, *, group_size: int | None = 128, dtype: str = "f16",
               arch: str | None = None, signed: bool = False, zero_point: bool = False,
               params: W4A16Params | None = None, check: bool = True) -> Schedule:
    """The schedule of ``C = A @ dequant(B)`` (module docstring): ``A (M, K)`` and ``C (M, N)`` in
    ``dtype`` (f16 / bf16), B int4 codes with one scale per ``group_size`` rows of a column (32,
    64, 128, or None for whole columns), unsigned with zero point 8 (``signed=False``, as
    ``quant.quantize_int4(signed=False)``) or two's complement (``signed=True``); with
    ``zero_point=True`` each group has its own zero point instead (``quantize_int4(...,
    zero_point=True)``).  The kernel takes ``A``, ``B`` (``pack_weights(codes)``), ``S`` (scales,
    ``(ceil(K / group_size), N)``) and, with zero points, ``Z`` (the zero-point codes as numbers
    in ``dtype``, the scales' shape).
    ``params`` overrides the tiles ``plan`` picks; ``arch`` None is the GPU present (sm_80 and
    later run it)."""
    if dtype not in _MMA:
        raise ValueError(f"gemm_w4a16: dtype={dtype!r}; allowed 'f16', 'bf16'")
    if group_size is not None and (isinstance(group_size, bool) or group_size not in GROUP_SIZES):
        raise ValueError(f"gemm_w4a16: group_size={group_size!r}; allowed 32, 64, 128 or None (whole columns)")
    if not isinstance(signed, bool):
        raise ValueError(f"gemm_w4a16: signed={signed!r}; allowed True (int4 codes) or False (uint4, zero point 8)")
    if not isinstance(zero_point, bool):
        raise ValueError(f"gemm_w4a16: zero_point={zero_point!r}; allowed True (a zero point per group, input Z) "
                         f"or False")
    for name, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"gemm_w4a16: {name}={v!r} must be a positive int")
    if K % PACK_K:
        raise ValueError(f"gemm_w4a16: K={K} must be a multiple of {PACK_K}: the weights are packed in blocks of "
                         f"{PACK_K} k (pad K with zero activations and zero-point codes)")
    tgt = get_target(arch)
    p = params if params is not None else plan(M, N, K, sms=tgt.sm_count, wgmma=tgt.has_wgmma,
                                               group_size=group_size, zero_point=zero_point, dtype=dtype)
    if isinstance(p, W4A16WgmmaParams):
        return _gemm_w4a16_wgmma(M, N, K, group_size, dtype, tgt, signed, zero_point, p, check)
    if not isinstance(p, W4A16Params):
        raise ScheduleError("params is a W4A16Params (mma.sync) or a W4A16WgmmaParams (sm_90a)", field="params",
                            value=p, fix="fs.recipes.W4A16Params(block_m=16, block_n=128, block_k=128)")
    words = load_words(K, p)
    spec = w4a16_spec(M, N, K, dtype=dtype, signed=signed, words=words)
    # the codes' shared tile is swizzled for the word loads that read it (derived, not chosen)
    sw = swizzle_for_words(_MMA[dtype], "b", words, p.block_n, p.block_k, 4)
    chain = [_split(p)] if p.split_k > 1 else []
    chain += [stream_k(p.stream_k)] if p.stream_k > 1 else []
    if p.direct:
        # the weights stream from global memory into registers, `stages` warp K steps in flight;
        # the activations (the block's K part) wait in shared memory, copied once
        chain += [
            tile(m=p.block_m, n=p.block_n) >> to_blocks(),
            tile(k=p.block_k),
            move_to_smem("A"),
            *([split_k(p.warps_k, across=WARP)] if p.warps_k > 1 else []),
            tile(m=p.block_m // p.warps_m, n=p.block_n // p.warps_n) >> to_warps(p.warps_m, p.warps_n),
            tile(k=p.warp_k),
            move_to_regs("A"), move_to_regs("B"),
            prologue("B", _group_scale(group_size, signed, zero_point)),
            pipeline(stages=p.stages),
            *([scale_partials()] if p.scale_partials else []),
            tile(m=16, n=8, k=16) >> done(_MMA[dtype]),
        ]
        sched = spec.schedule(*chain)
        if check:
            sched.check(tgt)
        return sched
    chain += [
        tile(m=p.block_m, n=p.block_n) >> to_blocks(),
        tile(k=p.block_k),
        move_to_smem("A"), move_to_smem("B", swizzle=sw),
        pipeline(stages=p.stages),
        *([split_k(p.warps_k, across=WARP)] if p.warps_k > 1 else []),
        tile(m=p.block_m // p.warps_m, n=p.block_n // p.warps_n) >> to_warps(p.warps_m, p.warps_n),
        tile(k=p.warp_k),
        move_to_regs("A"), move_to_regs("B"),
        prologue("B", _group_scale(group_size, signed, zero_point)),
        *([scale_partials()] if p.scale_partials else []),
        tile(m=16, n=8, k=16) >> done(_MMA[dtype]),
    ]
    sched = spec.schedule(*chain)
    if check:
        sched.check(tgt)
    return sched


def _split(p) -> split_k:
    return split_k(p.split_k, across=BLOCK,
                   combine="cluster" if p.cluster_combine else "fixup" if p.fixup else "launch")


def _group_scale(group_size, signed: bool, zero_point: bool):
    return fops.group_scale("S", group_size, zeros="Z") if zero_point else \
        fops.group_scale("S", group_size, zero=0 if signed else 8)


def wgmma_spec(M: int, N: int, K: int, *, dtype: str = "f16", signed: bool = False, block_m: int = 128,
               words: int = 2) -> MatMul:
    """The spec of the sm_90a schedule, ``Cᵀ = dequant(B)ᵀ Aᵀ``: the weights B ``(K, N)``, stored
    ``(N, K)`` K-contiguous and packed for the ``m64n<block_m>k16`` wgmma's A fragment in registers
    (``words`` words a load), play the MatMul's A role over rows ``n``; the activations A ``(M,
    K)`` row-major its K-major B; C ``(M, N)`` row-major.  The spec lists B before A (its A role
    first); the compiled kernel and ``interpret`` take ``A, B, S`` as for the mma.sync family."""
    atom = sm90a.wgmma_atom(block_m, dtype, a_in_registers=True)
    pk = packing_for(atom, "a", getattr(cv, f"dequant_{'i4' if signed else 'u4z8'}_{dtype}"), words)
    dt = fs_dtype(dtype)
    tb = Tensor("B", fs_dtype("i4" if signed else "u4"), GL, ("k", "n"), (K, N), "k", packing=pk)
    ta = Tensor("A", dt, GL, ("m", "k"), (M, K), "k")
    tc = Tensor("C", dt, GL, ("m", "n"), (M, N), "n")
    return MatMul(Tile(tb, tb.shape), Tile(ta, ta.shape), Tile(tc, tc.shape), KERNEL, "f32", roles=("n", "m", "k"))


def _gemm_w4a16_wgmma(M, N, K, group_size, dtype, tgt, signed, zero_point, p: W4A16WgmmaParams, check):
    """``gemm_w4a16`` with ``W4A16WgmmaParams``: the weights are the wgmma's A, dequantised into its
    register fragment by each consumer warpgroup; the activations its B from shared memory::

        tile(m=BM, n=BN) >> to_blocks()            BM activation rows x BN weight columns of C
        tile(k=BK)
        move_to_smem("B", swizzle), move_to_smem("A")   cp.async: packed codes, 128-byte swizzled rows
        pipeline(stages=S)                         the ring also stages each tile's group scales
        tile(n=64) >> to_warpgroups()              64 weight columns per warpgroup: the wgmma's 64 rows
        move_to_regs("B")                          a 128-thread dequantising move into the _rs A fragment,
        prologue("B", ops.group_scale(...))        scaled by the group's scale
        tile(k=16) >> done(wgmma m64 n<BM> k16 _rs)
    """
    if not tgt.has_wgmma:
        raise ScheduleError(f"W4A16WgmmaParams schedule wgmma, which {tgt.name} does not have", field="params",
                            value=p, allowed="W4A16Params on targets before sm_90a",
                            fix="arch='sm_90a', or params=W4A16Params(...)")
    part_k = p.block_k // p.warpgroups_k                # what one consumer warpgroup dequantises a stage
    words = next(w for w in (4, 2, 1) if K % (w * PACK_K) == 0 and part_k % (w * PACK_K) == 0)
    spec = wgmma_spec(M, N, K, dtype=dtype, signed=signed, block_m=p.block_m, words=words)
    atom = sm90a.wgmma_atom(p.block_m, dtype, a_in_registers=True)
    chain = [_split(p)] if p.split_k > 1 else []
    chain += [tile(m=p.block_m, n=p.block_n) >> to_blocks(occupancy=p.occupancy), tile(k=p.block_k)]
    if p.producer:
        from ..lower.transforms.specialize import consumer_regs_for

        tma = (sm90a.tma_load_2d,)
        chain += [move_to_smem("B", swizzle=Swizzle(0, 0, 0), via=tma), move_to_smem("A", via=tma),
                  pipeline(stages=p.stages),
                  warp_specialize(producer_regs=PRODUCER_REGS, pingpong=p.pingpong,
                                  consumer_regs=consumer_regs_for(tgt, p.warpgroups_k * p.block_n // 64,
                                                                  PRODUCER_REGS, cap=CONSUMER_REGS_MAX))]
    else:
        sw = swizzle_for_words(atom, "a", words, p.block_n, p.block_k, 4)
        chain += [move_to_smem("B", swizzle=sw), move_to_smem("A"), pipeline(stages=p.stages)]
    if p.warpgroups_k > 1:
        chain.append(split_k(p.warpgroups_k, across=WARPGROUP))   # the consumers share each K tile
    chain += [
        tile(n=64) >> to_warpgroups(),
        move_to_regs("B"), prologue("B", _group_scale(group_size, signed, zero_point)),
        *([scale_partials()] if p.scale_partials else []),
        tile(k=16) >> done(atom),
    ]
    sched = spec.schedule(*chain)
    if check:
        sched.check(tgt)
    return sched


def pack_weights(codes, schedule_or_packing) -> np.ndarray:
    """The device form of ``codes`` (``(K, N)`` int4 / uint4 codes, ``quant.quantize_int4``'s
    ``q``) for a W4A16 schedule (or a ``Packing``): ``(N, K / 2)`` uint8, each column's k packed
    in the schedule's order, two codes a byte, low nibble first."""
    pk = schedule_or_packing
    if isinstance(pk, Schedule):
        pk = pk.spec.operand("B").tensor.packing
    if not isinstance(pk, Packing):
        raise ValueError("pack_weights: pass the gemm_w4a16 schedule or its B packing")
    return pack_int4(codes, pk)


__all__ = ["gemm_w4a16", "W4A16Params", "W4A16WgmmaParams", "wgmma_spec", "plan", "plan_wgmma", "w4a16_spec", "weight_packing", "load_words", "pack_weights",
           "PACK_K"]
