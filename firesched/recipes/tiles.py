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
#: at 8192^3, 192x128: 719, 128x128: 558 on an H100; 128x64 an estimate
TILES_SM90 = ((128, 256, 4, 1.0), (192, 128, 4, 0.96), (128, 128, 6, 0.75), (128, 64, 6, 0.55))


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


def params_sm90(M: int, N: int, K: int, *, batch: int = 1, sms: int = 132) -> dict:
    """``recipes.gemm(..., atoms="sm90a")`` parameters: warp-specialized, persistent, grouped, the
    block tile of least modelled time; single blocks (clusters of two measured on par, not faster,
    timed interleaved on an H100)."""

    def cost(t):
        bm, bn, _, eff = t
        return _waves(M, N, bm, bn, batch, sms) * bm * bn / eff

    fits = [t for t in TILES_SM90 if t[0] <= M and t[1] <= N] or [TILES_SM90[-1]]
    bm, bn, stages, _ = min(fits, key=cost)
    return dict(atoms="sm90a", block_m=bm, block_n=bn, stages=stages, group_m=8 if M >= 4 * bm else 1,
                warp_specialized=True, persistent=True, cluster=1)
