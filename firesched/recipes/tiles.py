"""The GEMM tile model: which block tile a problem gets when the caller names none.

A fixed model, not a tuner: among a few block tiles, the one that minimises (waves of tiles over
the SMs) x (time of one tile), where a tile's time is its area over the relative throughput one
such block reaches when the GPU is full (read off ``bench/sweep_gemm.py`` runs on an H100).  Batch
elements multiply the tile count.  ``bench/gemm.py`` times the recipes with these parameters.
"""

from __future__ import annotations

#: sm_80 atoms: (block_m, block_n, warps_m, warps_n, relative throughput of one block)
TILES_SM80 = ((256, 128, 4, 2, 1.0), (128, 128, 2, 2, 0.9), (64, 128, 2, 2, 0.7), (64, 64, 2, 2, 0.5))
#: sm_90a atoms: (block_m, block_n, stages, relative throughput of one block); 128x256: 741 TFLOP/s
#: at 8192^3, 192x128: 719, 128x128: 558 on an H100; 128x64 an estimate; the 64-row tiles (one
#: consumer warpgroup) fitted to ``firesched.tune``'s winners on the 34 shapes of
#: ``bench/gemm_suite.py`` (the model then picks the tuned block tile and split on 17 of the 25
#: shapes, and a tile within a few per cent on the rest); 64x64 runs 8 stages deep (128 KB in
#: flight: 127x4096x4096 went from 0.88 to 0.92x cuBLAS, 64x4096x4096 from 0.92 to 1.00x; deeper
#: rings measured no better at M = 127)
TILES_SM90 = ((128, 256, 4, 1.0), (192, 128, 4, 0.96), (128, 128, 6, 0.75), (128, 64, 6, 0.55),
              (64, 256, 5, 0.8), (64, 128, 6, 0.65), (64, 64, 8, 0.5))
#: split-K factors the model and ``gemm_space`` consider
SPLITS = (1, 2, 3, 4, 6, 8)


def _waves(M: int, N: int, bm: int, bn: int, batch: int, sms: int) -> int:
    tiles = -(-M // bm) * -(-N // bn) * batch
    return -(-tiles // sms)


def params_sm80(M: int, N: int, K: int, *, batch: int = 1, sms: int = 132) -> dict:
    """``recipes.gemm(..., atoms="sm80")`` parameters for one problem: the tile of least modelled
    time, 4 stages, 32-wide K tiles (64 for short M; 16 when rows are not 16-byte aligned, which
    takes the synchronous copy path), groups of 8 M tiles (16 for 256x128 tiles over fewer than
    8 waves, measured better at 4096^3)."""
    aligned = K % 8 == 0 and N % 8 == 0

    def cost(t):
        bm, bn, _, _, eff = t
        return _waves(M, N, bm, bn, batch, sms) * bm * bn / eff

    fits = [t for t in TILES_SM80 if t[0] <= M and t[1] <= N] or [TILES_SM80[-1]]
    bm, bn, wm, wn, _ = min(fits, key=cost)
    # a short M (few block rows) leaves registers for a 64-wide K tile, which halves the barriers
    bk = (64 if M < 256 else 32) if aligned else 16
    tiles = -(-M // bm) * -(-N // bn) * batch
    few_waves = (bm, bn) == (256, 128) and aligned and tiles < 8 * sms
    return dict(atoms="sm80", block_m=bm, block_n=bn, block_k=bk, warps_m=wm, warps_n=wn, stages=4,
                group_m=(16 if few_waves else 8) if M >= 4 * bm else 1)


def split_factors(M: int, N: int, K: int, bm: int, bn: int, bk: int, *, batch: int = 1, sms: int = 132):
    """Split-K factors worth considering for ``bm x bn`` tiles: more than one only where the
    tiles leave SMs idle, each part keeping at least two K tiles, and not past two waves."""
    tiles = -(-M // bm) * -(-N // bn) * batch
    if tiles >= sms:
        return [1]
    return [s for s in SPLITS if s == 1 or (K >= 2 * bk * s and tiles * s <= 2 * sms)]


def params_small_m(M: int, N: int, K: int, *, batch: int = 1, sms: int = 132) -> dict:
    """Parameters for ``M`` <= 16 (a matrix-vector product in all but name): the time is reading
    B once, so mma.sync tiles of 16 x 64 (a 64-row wgmma would compute 4-64x more than it keeps)
    over four warps of 16 x 16 stream B through a 4-deep pipeline of 128-wide K tiles, and the K
    loop is split over two blocks where the N tiles alone leave half the SMs idle on a long K.
    Measured on an H100 against ``torch.matmul`` (f16, interleaved, ``bench/gemm_suite.py``,
    where ``firesched.tune`` chose these): 0.98-1.02x at M = 1, 8 and 16 with N = K = 8192."""
    tiles = -(-N // 64) * batch
    split = 2 if 2 * tiles < sms and K >= 8192 else 1
    return dict(atoms="sm80", block_m=16, block_n=64, block_k=128, warps_m=1, warps_n=4, warp_k=32, stages=4,
                split_k_blocks=split, group_m=1)


def params_sm90(M: int, N: int, K: int, *, batch: int = 1, sms: int = 132) -> dict:
    """``recipes.gemm(..., atoms="sm90a")`` parameters: warp-specialized, grouped, the block tile
    and split-K factor of least ``modelled_time`` (64-row tiles and split-K for problems of few
    tiles, 128 x 256 or 192 x 128 for large ones); persistent blocks where there is more than one
    wave of work; clusters of two blocks sharing B where two or four block rows span many block
    columns (elsewhere pairs measured on par, not faster, timed interleaved on an H100)."""
    best = None
    for bm, bn, stages, _ in TILES_SM90:
        if bm > max(64, M) or bn > max(64, N):
            continue
        for split in split_factors(M, N, K, bm, bn, 64, batch=batch, sms=sms):
            t = modelled_time(M, N, K, "sm90a", bm, bn, split, batch=batch, sms=sms)
            if best is None or t < best[0]:
                best = (t, bm, bn, stages, split)
    _, bm, bn, stages, split = best
    mt, nt = -(-M // bm), -(-N // bn)
    parts = mt * nt * batch * split
    # two or four block rows over many block columns: B is most of the traffic, and pairs of
    # blocks sharing each B tile by multicast measured 0.85 -> 0.99x cuBLAS at 256x16384x4096
    cluster = 2 if mt in (2, 4) and nt >= 16 and bn % 128 == 0 and split == 1 and batch == 1 else 1
    # a partial last K tile (K not a multiple of 64) over an even number of block rows: pairs
    # measured 0.80 -> 0.92x at 1000^3 and 1-4 % faster at 4095x4097x1023, 3001x2999x1531 and
    # 2047x8191x4093; on whole K tiles pairs measured slower (1024x1024x256: 1.08 -> 0.77x)
    if K % 64 and K >= 512 and mt % 2 == 0 and split == 1 and batch == 1:
        cluster = 2
    # two 64 x 64 block rows (M = 121 .. 127, which stay unswapped: see ``swaps``): pairs sharing
    # B over a 12-deep ring, as cuBLAS runs it (127x4096x4096: 0.86-0.91 -> 0.94x)
    if (bm, bn) == (64, 64) and mt == 2 and split == 1 and batch == 1:
        cluster, stages = 2, 12
    return dict(atoms="sm90a", block_m=bm, block_n=bn, stages=stages, group_m=8 if M >= 4 * bm else 1,
                split_k_blocks=split, warp_specialized=True, persistent=parts > sms, cluster=cluster)


#: the sm_80 family's best block reaches about half the sm_90a family's throughput on an H100
#: (about 370 against 740 TFLOP/s at 8192^3, ``bench/README.md``)
SM80_RELATIVE = 0.5
#: an H100's MMA throughput over its memory bandwidth (about 740 TFLOP/s against 3 TB/s): what a
#: byte of split-K workspace traffic costs in multiply-adds
FLOP_PER_BYTE = 250
#: L2's bandwidth over DRAM's on an H100 (about 4): a tile's operands mostly come from L2
L2_OVER_DRAM = 4
#: K tiles of pipeline fill and drain each block tile pays on top of its own K tiles
FILL_TILES = 2
#: what the split-K reduction's launch costs, in the model's units (multiply-adds per SM at peak:
#: about 2.8e6 a microsecond on an H100), about 0.7 us
REDUCE_LAUNCH = 2e6
#: split-K parts up to this many bytes are taken to stay in L2 (an H100 has 50 MB)
L2_PARTS = 32 * 2**20


#: what a stream-K block's exchange of one partial tile costs (written by one block, read back
#: by another: 2 x bm x bn x 4 bytes through L2, all blocks at once), over its price at L2 speed:
#: fitted to 128 x 256 tiles on an H100 (``bench/results/gemm-stream-k-2026-11-26-h100.json``:
#: 2048^3 in two chunks per tile 0.83x the whole tiles' speed, 3072^3 in four 1.17x)
STREAM_K_EXCHANGE = 1.5


#: the most a tile outside the measured tables is credited with (an unmeasured tile is a guess)
UNMEASURED = 0.85


def efficiency(family: str, bm: int, bn: int) -> float:
    """Relative throughput of one ``bm x bn`` block of ``family`` when the GPU is full (1.0: the
    sm_90a family's 128x256 tile): from the measured tables above, and for other tiles a smooth
    guess that falls with the tile's area (less reuse of each loaded element)."""
    table = {(t[0], t[1]): t[-1] for t in TILES_SM90} if family == "sm90a" else \
        {(t[0], t[1]): t[-1] for t in TILES_SM80}
    scale = 1.0 if family == "sm90a" else SM80_RELATIVE
    if (bm, bn) in table:
        return table[bm, bn] * scale
    return scale * min(UNMEASURED, (bm * bn / (128 * 256)) ** 0.35)


#: relative throughput of an sm_90a block without a producer warpgroup, and of a non-persistent
#: grid, against the warp-specialized persistent kernel (``bench/README.md`` sweeps)
UNSPECIALIZED = 0.9
NON_PERSISTENT = 0.97


def modelled_time(M: int, N: int, K: int, family: str, bm: int, bn: int, split: int = 1, *, batch: int = 1,
                  sms: int = 132, specialized: bool = True, persistent: bool = True, stream: int = 1) -> float:
    """Relative time of one configuration (only comparisons between configurations mean
    anything): waves of ``split`` x tiles over ``sms``, each tile the larger of its multiply-adds
    ``bm x bn x K / split`` at the tile's ``efficiency`` and its operand bytes at the SM's share
    of L2 bandwidth, at least the problem's bytes through DRAM (what bounds a small M), plus the
    split-K reduction's traffic.  With ``stream`` chunks a tile (``stream_k``) the waves are
    fractional (the chunks are spread evenly: the busiest block's chunks over ``stream``), each
    chunk pays the pipeline fill, and each block one exchange of a partial tile.
    ``gemm_space`` orders its points by it, so that the first ones are those the model expects
    to be fast."""
    tiles = -(-M // bm) * -(-N // bn) * batch
    waves = -(-(tiles * split) // sms)
    if stream > 1:
        # the chunks spread evenly: the busiest block takes ceil(chunks / blocks) of them
        chunks = tiles * stream
        waves = -(-chunks // min(chunks, sms)) / stream
        split = 1
    eff = efficiency(family, bm, bn)
    if family == "sm90a":
        eff *= (1.0 if specialized else UNSPECIALIZED) * (1.0 if persistent else NON_PERSISTENT)
    k = -(-K // split)
    # per SM, in multiply-adds at the SM's peak: the tile's MMAs, its operands through L2, and the
    # problem's unique bytes through DRAM shared by all SMs (the floor a small M sits on); every
    # tile also pays about FILL_TILES K tiles of pipeline fill and drain, so that splitting a short
    # K is not free (1009x2048x2048 measured 0.60x cuBLAS on 128x256 tiles split two ways, 0.94x
    # on whole-K 64x256 tiles)
    k_tiles = -(-k // 64)
    if stream > 1:
        k_tiles = -(-k_tiles // stream)
        k = k_tiles * 64 * stream
    tile = max(bm * bn * k / eff, (bm + bn) * k * 2 * FLOP_PER_BYTE / (2 * L2_OVER_DRAM)) * (k_tiles + FILL_TILES) / k_tiles
    dram = (M * K + K * N + M * N) * 2 * batch * FLOP_PER_BYTE / (2 * sms)
    t = max(waves * tile, dram)
    if stream > 1:
        t += STREAM_K_EXCHANGE * 2 * bm * bn * 4 * FLOP_PER_BYTE / (2 * L2_OVER_DRAM)
    if split > 1:
        # f32 parts written and read back: time in the same units (multiply-adds per SM / 2); parts
        # that fit in L2 stay there (measured: 257x1024x4096 runs 64x256 tiles split six ways at
        # 0.94x cuBLAS, the 64x128 tiles split three ways that DRAM-priced parts chose at 0.86x)
        parts = 4 * split * M * N * batch
        t += 2 * parts * FLOP_PER_BYTE / (2 * sms) / (L2_OVER_DRAM if parts <= L2_PARTS else 1)
        # and the reduction is a second launch (64x4096x4096: 64x128 tiles split two ways measured
        # 0.88x cuBLAS, whole-K 64x64 tiles 1.00x)
        t += REDUCE_LAUNCH
    return t


def params_swapped(M: int, N: int, K: int, *, smem: int = 232448) -> dict:
    """Parameters for a short M with a row-major A: ``Cᵀ = Bᵀ Aᵀ`` (``swap_ab``), M on the
    wgmma's N side in the smallest multiple of 8 that covers it, 64 columns of C (one consumer
    warpgroup) a block, as deep a ring of 64-wide K tiles as ``smem`` bytes of shared memory hold,
    at most 12.  Measured on an H100 against ``torch.matmul`` (``bench/gemm_variants.py``,
    ``bench/results/gemm-swap-ab-*-2026-11-26-h100.json``), M = 1 to 64 with N = K = 4096 and
    8192: with a column-major B (an ``nn.Linear`` weight) 1.00-1.20x where the unswapped defaults
    read 0.96-1.13x; with a row-major B 1.01-1.23x (geometric mean 1.045) where they read
    0.98-1.15x (1.027); 128 columns, 8 stages and split-K over 2 or 4 blocks all measured slower.
    For 64 < M <= 128 see ``swaps``."""
    bm = min(256, -(-M // 8) * 8)
    return dict(atoms="sm90a", swap_ab=True, block_m=bm, block_n=64, block_k=64,
                stages=swapped_stages(bm, 64, 64, 2, smem),
                group_m=1, split_k_blocks=1, warp_specialized=True, persistent=False, cluster=1)


def swapped_stages(bm: int, bn: int, bk: int, elem_bytes: int, smem: int) -> int:
    """The deepest ring of ``bk``-wide K tiles of a swapped ``bm x bn`` block (no TMA-store
    staging: its C is stored from registers) that ``smem`` bytes hold, less 1 KiB for barriers
    and alignment; 2 to 12 stages."""
    return max(2, min(12, (smem - 1024) // ((bm + bn) * bk * elem_bytes)))


def swaps(M: int) -> bool:
    """Whether a GEMM of ``M`` rows (row-major A, one GEMM) takes ``params_swapped``: every
    M <= 64, and above that where it measured faster than the unswapped tiles on an H100
    (``bench/results/gemm-swap-mid-*-2026-11-26-h100.*``, N = K = 4096, ratio to cuBLAS):

    * the unswapped 64 x 64 tiles pay for a last tile row that is mostly outside A (M = 65: 0.57,
      72: 0.61, 80: 0.66, 100: 0.68) where the swapped tile covers M in a multiple of 8 (0.92,
      0.96-1.01, 0.99, 0.88); M = 128: 0.98 against 0.89-0.95;
    * M from 121 to 127 stays unswapped (0.86-0.93 against 0.61-0.86);
    * a swapped tile whose last row alone lies outside A (M = 8j + 7) measured 0.61-0.73 for
      reasons not understood; at M <= 120 it stays swapped, better than the unswapped tiles at
      71 (0.73 against 0.59) and slightly worse at 103 (0.67 against 0.72)."""
    return M <= 120 or M == 128


def default_params(M: int, N: int, K: int, target, *, batch: int = 1, layout: str = "RR") -> dict:
    """What ``recipes.gemm`` takes when the caller names no tile parameter: on a target with
    wgmma, ``params_swapped`` where ``swaps(M)`` with a row-major A (one GEMM), ``params_sm80`` for
    a column-major A above 16 rows, ``params_small_m``
    for other ``M`` <= 16 and ``params_sm90`` above; else ``params_sm80``."""
    sms = target.sm_count
    if target.has_wgmma:
        if swaps(M) and layout[0] == "R" and batch == 1:
            return params_swapped(M, N, K, smem=target.smem_per_block_optin)
        if M <= 16:
            return params_small_m(M, N, K, batch=batch, sms=sms)
        if layout[0] != "R":
            # the wgmma family reads A K-major from its TMA boxes: a column-major A runs mma.sync
            return params_sm80(M, N, K, batch=batch, sms=sms)
        return params_sm90(M, N, K, batch=batch, sms=sms)
    return params_sm80(M, N, K, batch=batch, sms=sms)
