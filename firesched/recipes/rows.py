"""The tile model of row-wise kernels (norms, softmax): how many threads share a row, how many
elements each holds, how many rows a block takes, and whether the row stays on chip.

A row-wise kernel only moves bytes: each element is read once and written once, so the model
aims at three things, in this order —

* **16-byte accesses**: ``vec`` elements per access (8 for fp16/bf16), the largest power of two
  that divides the row (an odd row of a 16-bit type takes element accesses, 4 to 32 a thread on
  as few threads as hold it: ``odd_row_values``; or, where that measured slower, ``align=True``
  — ``aligned_faster`` — 16-byte accesses of a window that starts at the aligned vector holding
  the row's first element: ``RowPlan.aligned``, ``strategies.align``);
* **the row stays in registers** between the statistics and the output: each thread holds
  ``vec * reps`` elements of its row, up to 40 of a 16-bit type (32 of f32:
  ``VALUES_IN_REGISTERS``), so a block of up to 1024 threads holds rows of up to 40,960 elements
  without spilling (56-64 per thread spill under 1024 threads' 64 registers).  A longer row goes
  to a thread-block cluster (sm_90a) of 2, 4 or 8 blocks, each holding an equal part of it; the
  blocks combine their partial statistics through distributed shared memory
  (``to_blocks(cluster=C)``), so rows of up to 327,680 elements are still read once and written
  once.  A row of 16-byte vectors on a cluster waits in shared memory instead
  (``row_memory="SH"``: filled by ``cp.async``, read back by every later part; a causal row
  through registers, masked as it loads): up to 64 elements a thread in parts of whole passes,
  the last block's part possibly short, on clusters of 2 to 8 blocks chosen by an estimated cost
  (``BLOCK_COST``).  The registers then hold no row, 30-40 a thread, and six blocks of 256
  threads share an SM.  Rows one block would hold in fewer than four passes, or with a partial
  last pass, take such a cluster where its parts are equal (20,480 and 24,576 columns) —
  LayerNorm's, RMSNorm's and softmax's take 512 threads first where they hold the row without
  spilling (``HALF_BLOCK_VECTORS``);
* **enough bytes in flight**: a row of at most 32 vectors goes to ``lanes`` < 32 threads of a
  warp, several rows per warp and eight warps per block (a short row alone would leave most lanes
  idle); a longer row takes ``lanes`` threads of a block (warps combine their partial results
  through shared memory), with two vectors per thread from 4,096 columns on, so that every thread
  has two 16-byte loads in flight before its first use; rows on fewer than 256 threads in one
  pass share a block (``MIN_BLOCK_THREADS``: short rows are limited by how fast the GPU starts
  blocks) — several rows a warp, or each thread its columns of several rows; a row whose vectors are not a power of two takes the power-of-two threads (64 to
  256; f32 up to 512) whose passes leave the fewest slots idle, up to 56 elements a thread
  (``FILL_VALUES``; f32 28); an odd row staged in its window in shared memory whose
  power-of-two block would leave its last pass all but idle takes whole warps instead
  (``whole_warps``: a block's warps combine through shared memory, any number of them)::

      cols (fp16)   lanes  vec  reps  rows/block   threads
      64              8     8     1       32          256
      256            32     8     1        8          256
      512             64    8     1        4           64 (each thread: its 8 columns of 4 rows)
      767             32    1    24        8          256 (a 16-bit row of 2- to 8-byte accesses of 33 -
                                                         1,000 columns, f32 up to 512: a warp a row or
                                                         less, 8 or more elements a thread, rows sharing
                                                         a block; SHORT_NARROW_COLS)
      1,024         128     8     1        2          128
      1,022         128     2     4        2          128 (a 16-bit row of 4- or 8-byte accesses past 1,000
                                                         columns, odd rows of some recipes, f32 rows past
                                                         512: 128 threads a row, two rows a block, each
                                                         thread its columns of both; NARROW_BLOCK_COLS,
                                                         NARROW_BLOCK_ODD, NARROW_BLOCK_F32)
      2,560          64     8     5        1           64 (vectors not a power of two: the power-of-two
                                                         threads whose passes idle least, FILL_THREADS)
      4,096         256     8     2        1          256
      4,094         256     2     8        2          256 (a 16-bit row of pairs past 3,072: LONG_PAIRS;
                                                         causal softmax a row a block)
      14,336        256     8     7        1          256 (1,792 vectors; 512 x 4 would idle 256 slots)
      20,000        512     8     5        1          512, 2 per SM (LayerNorm, RMSNorm, softmax, causal
                                                         softmax: half_block_values); 1024 x 3 otherwise
      20,480        512     8     5        1          512, 2 per SM (LayerNorm, RMSNorm, softmax); 256 x a
                                                         cluster of 2 otherwise
      24,576        256     8     6        1          256 x a cluster of 2, 6 per SM, in shared memory
      26,624        512     8     7        1          512, 2 per SM (LayerNorm, RMSNorm: 1,024 threads' last
                                                         pass partial); 1024 x 4 otherwise
      32,768       1024     8     4        1         1024 (softmax: in shared memory, stage_one_block;
                                                         causal softmax: 512 x 8 in shared memory, 2 per SM)
      40,960       1024     8     5        1         1024 (causal softmax: 512 x 10 in shared memory, 2 per SM)
      65,536        256     8     8        1          256 x a cluster of 4, 6 per SM, in shared memory (RMSNorm,
                                                         add + RMSNorm: 1024 x 8, one block alone on its SM, in
                                                         shared memory, up to 98,304: STAGED_BLOCK_VALUES)
      100,000       256     8     7        1          256 x a cluster of 7 (the last part short)
      1,023          32     8     5        1          32, 16 per SM (RMSNorm from 8,192 rows: the window in
                                                         shared memory on a persistent grid, a warp a row, the next
                                                         row in flight, PERSISTENT_WARP_WINDOWS); element by
                                                         element otherwise
      1,407          64     8     3        1          64, 12 per SM (LayerNorm from 1,057 and softmax from 1,100
                                                         columns and 8,192 rows: as RMSNorm's at 1,023, on
                                                         the block of a warp or two whose passes idle least;
                                                         a warp, 15 per SM, at 1,535); element by element
                                                         otherwise
      4,095          96     8     6        1          96, the window of 513 vectors in shared memory on a
                                                         persistent grid of a multiple of 8 blocks, each block's
                                                         rows of one phase, its weights shifted once a block
                                                         (PERSISTENT_WINDOW_COLS), two rows a block in flight
                                                         (PERSISTENT_PREFETCH_COLS: RMSNorm 7 per SM,
                                                         LayerNorm and softmax 6): whole warps, where 128 x 5
                                                         would leave all but one vector of its last pass idle
                                                         (whole_warps); add + RMSNorm 288 x 2
      16,383        320     8     7        1          320, 3 per SM: the aligned window of 2,049 vectors in shared
                                                         memory, copied in 16-byte chunks (RMSNorm, softmax, add +
                                                         RMSNorm from 4,096-8,000 columns: staged_window_faster;
                                                         whole warps for 256 x 9); LayerNorm's on a persistent
                                                         grid, 416 x 5 (whole warps for 512 x 5), one block an SM
                                                         with two rows in flight (256 x 2 per SM to about 14,000
                                                         columns: PERSISTENT_PREFETCH_WIDE)
      65,537        640     8    13        1          640, alone on its SM: the window of 8,193 vectors in shared
                                                         memory, two blocks of which an SM does not hold
                                                         (STAGED_WINDOW_ALONE; RMSNorm, add + RMSNorm 832 x 10)
      131,071       256     8     9        1          256 x a cluster of 8, 6 per SM, in shared memory (odd, its
                                                         window too long for one block: each block's part of 16,384
                                                         on an aligned window of its own, one pass longer,
                                                         cluster_windows; before, element by element)
      20,001 (f32)  512     4    10        1          512, 2 per SM: an f32 row of 4- or 8-byte accesses of
                                                         8,193 - 32,767 columns, its window in shared memory
                                                         (F32_STAGED_WINDOWS); clusters of aligned windows past
                                                         (F32_CLUSTER_WINDOWS)

The strategies that realise a plan (the same for every part of a fused row kernel, so that each
thread reads back the registers it wrote) come from ``part_strategies``.
"""

from __future__ import annotations

import math

import attrs

from ..dtypes import dtype as _dtype
from ..strategies import align, done, tile, to_blocks, to_threads, to_warps

MAX_THREADS = 1024
CLUSTERS = (2, 4, 8)           # blocks per cluster a row too long for one block may take (sm_90a)
# threads per block of a cluster's row parts, in order of preference, each with as many blocks
# per SM as leave every thread 64 registers: what a block loses waiting on its cluster's
# barriers, the SM's other blocks fill.  Measured on an H100 (bench/row_plans.py, bf16 over
# 65,536 columns): softmax 2.27 TB/s at 256 threads x 32 values, four blocks per SM (cluster of
# 8), 2.10 at 512 x two, 1.85-1.98 at 1024 x one; rmsnorm 2.47-2.50 at any of them
CLUSTER_THREADS = (256, 512, 1024)
# threads' worth of rows a block of short rows takes at least: rows of up to 128 threads' vectors
# share a block (several rows a warp and eight warps; a row of 64 or 128 threads: each thread
# holds its columns of 4 or 2 rows).  What limits such kernels is the
# rate at which the GPU starts blocks, not its bandwidth: measured on an H200 (bf16,
# bench/row_plans.py, TB/s), 32768 x 512 RMSNorm 1.66 on blocks of one 64-thread row against 3.92
# on four rows a block (torch 2.33), LayerNorm 1.68 / 3.78, softmax 1.67 / 3.87; 32768 x 1024
# RMSNorm 3.34 / 4.11 (128 threads a row, two rows a block), LayerNorm 3.28 / 4.07, softmax 3.32 /
# 4.07 (add + RMSNorm, which moves 2.5 times the bytes a row, 4.17 / 4.14); 65536 x 256 RMSNorm
# 3.29 / 3.95 (eight warps of a row each against four), LayerNorm 3.18 / 3.70, softmax 3.29 / 3.88.
# Blocks of 512 threads read 2-5 % under 256 (bench/README.md, "Rows a block")
MIN_BLOCK_THREADS = 256
# a 16-bit row of 16-byte vectors one block holds takes the power-of-two threads, up to
# FILL_THREADS, whose passes leave the fewest slots idle (_fewest_idle), at up to FILL_VALUES
# elements a thread (whatever the recipe's max_values, which budget 1,024 threads): a block of
# 256 threads, two an SM, leaves each thread twice the registers of 1024.  Measured on
# an H200 (bf16, TB/s against the plan of power-of-two passes before; 56 a thread compiled without
# spills, LayerNorm 96 registers): RMSNorm / LayerNorm / softmax 32768 x 1536 on 64 threads x 3
# 4.10 / 4.08 / 4.13 (3.71 / 3.38 / 3.41 on 256 x 1), 16384 x 3072 on 128 x 3 4.10 / 4.08 / 4.11
# (3.95 / 3.57 / 4.10 on 256 x 2), 8192 x 5120 on 128 x 5 4.02 / 3.98 / 4.07 (3.75 / 3.54 / 4.05
# on 256 x 3), 8192 x 7168 on 128 x 7 4.02 / 3.98 / 4.06 (3.90 / 3.59 / 4.06 on 256 x 4), 4096 x
# 10240 on 256 x 5 3.95 / 3.90 / 3.96 (2.89 / 3.14 / 3.11 on 512 x 3), 4096 x 14336 on 256 x 7
# 3.98 / 3.82 / 4.00 (3.36 / 3.70 / 3.74 on 512 x 4); such rows keep a block each (their
# threads have several loads in flight: two rows a block of 128 x 3 or 128 x 5 read 0.98-1.01 of one)
FILL_THREADS = 256
FILL_VALUES = 56
# the same for f32 rows of 16-byte vectors: up to 512 threads x 28 elements (LayerNorm 64
# registers at 512 x 28, no spills).  Measured on an H200 (TB/s, RMSNorm / LayerNorm / softmax,
# against the plans before): 4096 x 10240 on 512 x 5 4.05 / 4.01 / 4.04 (3.68 / 3.55 / 3.94 on a
# cluster of two staged parts), 2048 x 14336 on 512 x 7 3.94 / 3.89 / 3.97 (3.72 / 3.62 / 3.88),
# 8192 x 5120 on 256 x 5 4.06 / 4.06 / 4.07 (4.12 / 3.61 / 4.14 on 512 x 3), 16384 x 1536 on 128 x 3
# 4.10 / 4.08 / 4.12 (4.14 / 3.87 / 4.12), 4096 x 7168 on 256 x 7 3.98 / 3.95 / 4.02 (4.04 /
# 3.89 / 4.05), 8192 x 2560 on 128 x 5 4.02 / 4.02 / 4.05 (4.03 / 4.02 / 4.03): LayerNorm's gains
# and the clusters' outweigh RMSNorm's and softmax's 1-2 %
FILL_THREADS_F32 = 512
FILL_VALUES_F32 = 28
WARPS_FOR_SHORT_ROWS = MIN_BLOCK_THREADS // 32   # warps per block when several rows share a warp
REGISTERS_PER_SM = 65536       # every target's register file (hardware.target.Target.regs_per_sm)
# a cluster's row part staged in shared memory (RowPlan.row_memory = "SH"): up to 64 elements a
# thread (the registers hold none of them: 30-40 a thread, STAGED_REGISTERS), as many blocks per
# SM as registers, threads and shared memory allow.  Measured on an H100 (bench/row_plans.py,
# bf16, 4096 x 65,536): RMSNorm 2.89 TB/s on 4 blocks of 256 threads x 64 elements against 2.51
# with the row in registers (8 x 256 x 32), LayerNorm 2.74 against 2.43
STAGED_VALUES = 64
# a row of 16-byte vectors no cluster of the fewest threads (CLUSTER_THREADS[0]) holds at
# STAGED_VALUES a thread (over 131,072 columns of 16-bit values) takes up to this many a thread
# on those blocks before more threads: a thread's registers then hold several passes of the
# output's weight and bias loads (lower.transforms.batch_loads).  Measured on an H100
# (bench/row_plans.py, bf16, 1024 x 262,144, eight parts of 32,768 in shared memory, three blocks
# an SM): LayerNorm 2.78 TB/s on 256 threads x 128 elements against 2.65 on 512 x 64; RMSNorm 2.93
# against 2.75 (two blocks an SM)
STAGED_VALUES_LONG = 128
# blocks per cluster a staged row may take: any portable cluster size, so that the parts' whole
# passes cover the row with little to spare
STAGED_CLUSTERS = (2, 3, 4, 5, 6, 7, 8)
# what a block costs besides its part, in elements per thread of the block (_staged_cluster).
# Fitted on an H100 (bf16, each against the plan of clusters of 2, 4 or 8 only): 4 parts of
# 14,336 over 50,000 columns ran 4 % faster than 5 of 10,240 (LayerNorm), 4 of 16,384 over
# 60,000 7 % faster than 5 of 12,288; 7 parts of 14,336 on 256 threads over 100,000 ran 3-11 %
# faster than 4 of 28,672 on 512 (LayerNorm, softmax, causal; RMSNorm 1 % slower), 3 of 16,384
# over 45,000 1-5 % faster than 4 of 12,288 (add + RMSNorm 3 % slower), 7 of 28,672 over
# 200,000 10-26 % faster than 4 of 57,344 on 1,024 threads
BLOCK_COST = 32
STAGED_REGISTERS = 40          # registers a thread of a staged plan needs (measured: 26-40)
# elements of an odd row (element accesses, vec * size < 16 bytes) a thread of one block may hold
# in registers; a longer odd row waits in shared memory (row_plan)
ODD_VALUES = 16
MAX_THREADS_PER_SM = 2048
SHARED_PER_SM = 227 * 1024     # the shared memory an H100 SM gives its blocks (sm_90a)
RESERVED_SHARED = 1024         # what the driver keeps of it for each resident block (Target.smem_reserved_per_block)
# a block's shared memory besides its row (and its weights' windows): the partial results, a
# cluster's exchange buffers and mbarriers (580-700 bytes in the recipes' f32 parts of 14,336
# elements on 7 blocks, whose four blocks an SM did not fit with the driver's reserve; LayerNorm's
# and RMSNorm's persistent windows of 4,219-7,961 columns asked for one block more than fits without it)
PART_OVERHEAD = 512


def blocks_that_fit(block_bytes: int, shared_per_sm: int) -> int:
    """How many blocks of ``block_bytes`` of staged data (rows, parts, weights' windows) an SM's
    ``shared_per_sm`` holds beside each one's partial results and the driver's reserve."""
    return shared_per_sm // (block_bytes + PART_OVERHEAD + RESERVED_SHARED)
# elements of its row a thread may hold: of 16-bit types 40 (measured on an H100, 1024 threads x
# 40 bf16 values: LayerNorm 2.65, softmax 2.63, RMSNorm 2.89 TB/s over 40,000 columns, no spills;
# 48 spill in LayerNorm's f32 intermediates, 56-64 everywhere), of f32 32 (LayerNorm's register
# budget)
VALUES_IN_REGISTERS = {2: 40, 4: 32}
# elements of its window a thread of an aligned row (RowPlan.aligned) may hold: the window's
# edge tests and the weights' element loads take registers of their own.  Compiled for sm_90a
# (RMSNorm, add + RMSNorm, softmax, LayerNorm): 32 bf16 a thread spilled RMSNorm (8 bytes at
# 32,767 columns), 24 f32 RMSNorm (24 bytes), 20 f32 add + RMSNorm (64 bytes); LayerNorm takes
# fewer (norms.layernorm)
ALIGNED_VALUES = {2: 28, 4: 16}
# elements a thread of an odd 16-bit row's element plan on one block, by recipe: rows of up to
# 2,048, up to 4,096 and longer columns (row_plan's element_values; it was 4, on up to 1,024
# threads).  Measured on an H100 (bf16, bench/row_plans.py, TB/s against the plan of 4 a thread):
# softmax 32768 x 1023 2.66 on 128 threads x 8 (2.21), 16384 x 2047 2.64 on 256 x 8 (1.96),
# 8192 x 4095 2.38 on 256 x 16 (1.37), 4096 x 8191 2.08 on 256 x 32 (1.88), 2048 x 16383 1.73 on
# 512 x 32 (1.35); causal softmax 2.59, 2.59, 2.75, 3.19, 2.97 (2.19, 1.97, 1.43, 2.09, 2.00);
# LayerNorm at 16 a thread 2.25 (64 threads), 2.17, 2.02, 1.83 (512), 1.28 (1,024) against 1.81,
# 1.57, 0.89, 1.20, 1.28 (32 a thread spilled 40 bytes); RMSNorm 2.50 at 4 a thread over 1,023
# (2.40 at 8), 2.26 at 8 over 2,047, 2.10 at 16 over 4,095 (1.70); add + RMSNorm 2.76 and 2.71 at 4
# over 1,023 and 2,047 (2.62, 2.52 at 8), and 32 a thread spilled it and RMSNorm
# The values are for rows of up to 1,024, up to 2,048, up to 4,096 and longer.  LayerNorm's rows of
# up to 1,024 take 8 a thread on blocks of two rows (ODD_ROWS_SHARE_BLOCKS): measured on an H200
# (bf16, 16384 x 1023) 2.37 TB/s on 128 threads x 8 x 2 rows against 1.99 on 64 x 16 (one row or
# four a block) and 1.83 on 128 x 8 alone; at 8192 x 2047, 8 a thread on 256 threads read 1.78
# against 1.95 at 16 on 128 (bench/README.md, "Rows a block"), one row a block; on blocks of two
# rows 8 a thread is the faster (SHORT_ROWS_SHARE_THREADS below), and rows up to 2,048 take it
ODD_ROW_VALUES = {"rmsnorm": (4, 4, 16, 16), "add_rmsnorm": (4, 4, 16, 16), "layernorm": (8, 8, 16, 16),
                  "softmax": (8, 8, 16, 32), "causal": (8, 8, 16, 32)}
# the recipes whose element plans put rows of fewer than MIN_BLOCK_THREADS threads on a block
# together (row_plan's element_min_threads), as the plans of 16-byte vectors do.  Measured on an
# H200 (bf16 and f16, bench/rows.py against one row a block): LayerNorm 16384 x 1023, 32768 x 1001
# and 65536 x 1023 0.83-0.87 of the time, causal softmax 0.90-0.92; softmax 1.03-1.05 (128
# threads x 8 a row), which keeps a row a block
ODD_ROWS_SHARE_BLOCKS = ("rmsnorm", "add_rmsnorm", "layernorm", "causal")
# LayerNorm's odd rows of up to 2,048 columns share blocks of 512 threads (8 a thread: four rows of
# 1,023 on 128 threads, two of 2,047 on 256).  Measured on an H200 (bench/row_plans.py, bf16, TB/s
# against 128 threads x 16 (2,047) or x 8 (1,023) on blocks of two rows, the output from the row):
# 8192 x 2047 2.39 (2.22), 16384 x 2047 2.74 (2.72), 16384 x 1023 2.54 (2.45); one row of 256
# threads 2.03, 512 threads x 4 1.53, 128 x 16 on four rows 2.05, 64 x 16 on four 2.06
# (results/row-plans-ln-element-2026-11-28-h200.txt).  As the plan (bench/rows.py --old, bf16 / f16,
# time new / old): 8192 x 2047 0.923 / 0.932, 8192 x 1535 0.933 / 0.928, 16384 x 1023 0.961 /
# 0.989, 32768 x 1001 0.948 / 0.969, 65536 x 1023 0.950 / 0.942, but 16384 x 2047 1.000 / 1.011 and
# 32768 x 1535 1.016 / 1.008.  By recipe: (up to this many columns, threads)
SHORT_ROWS_SHARE_THREADS = {"layernorm": (2048, 512)}
# the recipes whose rows on one block of 1,024 threads wait in shared memory (row_plan's
# stage_one_block; measured there), and the threads of that block (staged_block_threads).  Not
# measured on an H100, where softmax 8192 x 32,768 read 2.92 TB/s in registers, at its copy rate.
# Causal softmax's on 512 threads, two blocks an SM, with one tuple reduction: measured on an H200
# (bf16, bench/row_plans.py, TB/s; the plan then 1,024 threads x 32 in registers, two reductions):
# 8192 x 32,768 4.59 (3.60), 32768 x 32,768 4.56 (3.44); 1,024 threads staged 3.20 / 3.13, 512 x 64
# in registers 4.04 / 3.94 spilling 88 bytes, clusters of two or four 3.47 - 4.82 (4.82 at 8,192
# rows only: 3.82 at 32,768).  The rule takes the rows of 16-byte vectors of 20,488 - 40,960
# columns but 24,576 (where the half blocks of HALF_BLOCK_VALUES leave 1,024 threads): time
# against the plan before 0.69 - 0.76 at 20,992 - 24,000 and 0.75 - 0.79 at 24,584 - 40,960
# (bench/README.md)
STAGE_ONE_BLOCK = {"softmax": MAX_THREADS, "causal": MAX_THREADS // 2}
# RMSNorm's and add + RMSNorm's rows of 16-byte vectors longer than one block's registers hold
# wait in shared memory on one block of 1,024 threads (alone on its SM) instead of a cluster of
# staged parts, up to this many elements a thread (row_plan's staged_block_values).  Measured on
# an H200 (bf16, bench/row_plans.py, TB/s against the plan then, a cluster of 256-thread staged
# parts): RMSNorm 8192 x 45,056 3.96 (3.56), 8192 x 49,152 4.05 (3.60), 57,344 3.85 (3.59),
# 4096 x 65,536 3.90 (3.56), 32768 x 65,536 3.97 (3.63), 4096 x 81,920 4.00 (3.58), 2048 x
# 98,304 3.96 (3.56); add + RMSNorm 8192 x 49,152 4.13 (3.76), 4096 x 65,536 4.02 (3.69).  Not
# LayerNorm (8192 x 49,152 3.32 against 3.61) nor softmax (4096 x 65,536 3.64 against 3.97).
# add + RMSNorm's registers hold 32 values a thread: its rows from 32,776 columns take the block
# (8192 x 33,280 and 36,864 0.97 of the time before, 40,960 0.88 - 0.89)
STAGED_BLOCK_VALUES = {"rmsnorm": 96, "add_rmsnorm": 96}
# the same for rows of 4-byte accesses (row_plan's element_values): a 16-bit row of 2 mod 4
# columns (pairs) and an odd f32 row (elements), from NARROW_FROM columns, where measured (bf16 and f32,
# bench/row_plans.py, TB/s against the plans of 4 accesses a thread): pairs, LayerNorm 8192 x 4094
# 2.69 on 256 threads x 16 (2.41), 4096 x 8190 2.52 on 256 x 32 (1.43); softmax 2.81 (2.70), 2.69
# (2.23); RMSNorm's 2.79 and 2.45 stay (16 and 32 a thread: 2.45, 1.91).  f32, 16 a thread: RMSNorm
# 8192 x 4095 2.66 (2.58), 4096 x 8191 2.65 (1.78); LayerNorm 2.79 (1.47), 2.76 (2.08); softmax 2.88
# (2.28), 2.76 (2.76).  Softmax's pairs up to 48 a thread (512 threads, two blocks an SM, where
# 1,024 threads would take the row): 2048 x 20482 2.26 on 512 x 42 against 1.73 on 1,024 x 20,
# 2048 x 24574 2.26 on 512 x 48 against 1.96 (LayerNorm at 40 spilled 56 bytes)
PAIR_ROW_VALUES = {"layernorm": (16, 32), "softmax": (16, 48)}
F32_ODD_ROW_VALUES = {"rmsnorm": 16, "layernorm": 16, "softmax": 16}
NARROW_FROM = 4000


def odd_row_values(op: str, cols: int, dtype="bf16") -> int | None:
    """Elements a thread of recipe ``op``'s element plan for a row of ``cols`` columns of
    ``dtype`` whose accesses are narrower than 8 bytes (``ODD_ROW_VALUES`` for an odd 16-bit row,
    ``PAIR_ROW_VALUES`` and ``F32_ODD_ROW_VALUES`` for 4-byte accesses; ``row_plan(element_values=)``),
    or None: the plan's own."""
    if op not in ODD_ROW_VALUES:
        raise ValueError(f"odd_row_values: op={op!r}; allowed: {', '.join(ODD_ROW_VALUES)}")
    eb = max(1, _dtype(dtype).bits // 8)
    if eb == 2 and cols % 2:
        shortest, short, mid, long = ODD_ROW_VALUES[op]
        return shortest if cols <= 1024 else short if cols <= 2048 else mid if cols <= 4096 else long
    if cols < NARROW_FROM:
        return None
    if eb == 2 and cols % 4 == 2 and op in PAIR_ROW_VALUES:
        mid, long = PAIR_ROW_VALUES[op]
        return mid if cols <= 4096 else long
    if eb == 4 and cols % 2 and op in F32_ODD_ROW_VALUES:
        return F32_ODD_ROW_VALUES[op]
    return None


# 16-bit and f32 rows of 33 to these many columns in accesses narrower than 16 bytes (16-bit: odd,
# 2 or 4 mod 8; f32: odd or 2 mod 4) take a warp a row or less (row_plan's short_narrow_cols): lanes that hold the row at about
# SHORT_NARROW_VALUES or more elements a thread, at most a warp (short_narrow_lanes), rows sharing
# a block of MIN_BLOCK_THREADS; the plans before put such a row on up to 256 threads of one
# element each (a block of 256 threads a row of 255 columns: 0.83 TB/s, a third of torch's
# softmax).  Measured on an H200 (bench/row_plans.py --together, bf16, TB/s against the plan
# then; results/rows-short-narrow-probe*-2026-11-29-h200.txt): softmax 131072 x 255 on a warp x 8 a
# thread, 8 rows a block, 3.51 (0.83; torch 2.48), 16 rows 3.41, 64 threads x 4 3.12; 131072 x 511
# on a warp x 16 3.69 - 3.72 (1.58), 64 x 8 3.25; 65536 x 767 on a warp x 24 3.67 (2.14), 64 x 12
# 3.29; 131072 x 383 x 12 3.63 (1.24); 65536 x 901 x 29 3.63 (2.12), 65536 x 999 x 32 3.66 (2.29),
# 64 x 16 3.28, 128 x 8 3.02; 262144 x 101 on 16 lanes x 8, 16 rows a block, 3.27 (0.67), a warp x 4
# 2.48; 524288 x 33 on 16 x 3 1.67 (0.43), a warp x 2 0.86 - 0.98; LayerNorm 2.14 - 3.22 (0.44 -
# 1.86) and RMSNorm 2.36 - 3.34 (0.43 - 2.71) alike (64 threads a row within 4 % of a warp at 383 -
# 999 columns), f16 16384 x 255 2.57 / 1.87 / 2.02 (softmax / LayerNorm / RMSNorm; 0.78 - 0.80).
# As the plan (bench/rows.py --old, time new / old, bf16; results/rows-short-narrow-{bf16,f16}-2026-11-29-h200.json):
# 131072 x 255 0.234 - 0.485 (softmax 0.83 -> 3.57 TB/s, torch 2.50), 131072 x 254 (pairs)
# 0.431 - 0.846, 131072 x 511 0.430 - 0.867, 65536 x 767 0.588 - 0.884, 65536 x 999 0.621 - 0.879,
# 262144 x 101 0.202 - 0.495, 524288 x 33 0.312 - 0.745 (1.10 - 1.42 TB/s), f16 alike; but add +
# RMSNorm 65536 x 999 1.051 / 1.102 (bf16 / f16; 72 registers a thread) and f16 65536 x 767 1.033
# (bf16 0.884): its rows up to 768 columns.  Rows of 8-byte accesses and f32 rows too (probes,
# results/rows-short-narrow-probe3-2026-11-29-h200.txt, TB/s against the plan then): bf16 131072 x
# 252 on a warp x 8 3.83 - 3.97 (3.28 - 3.30); f32 131072 x 255 on a warp x 8 3.84 - 4.07 (1.65 -
# 1.66; torch's softmax 3.88), 262144 x 101 on 16 lanes x 7 3.28 - 4.00 (1.33), but 65536 x 767 on a
# warp x 24 softmax 3.99 (3.56), LayerNorm 3.74 (3.45), RMSNorm 3.45 (3.71): f32 rows up to 512.
# As the plan (bench/rows.py --old; results/rows-short-narrow-{8byte-bf16,f32}-2026-11-29-h200.json):
# bf16 131072 x 252, 65536 x 508, 764, 996 0.547 - 0.860 (softmax 65536 x 764 2.23 -> 4.03 TB/s), f32
# 131072 x 255, 383, 254, 65536 x 511, 510, 262144 x 101 0.334 - 0.926 (softmax 131072 x 255 1.66 ->
# 4.05, torch 3.84), but add + RMSNorm's 0.943 - 1.027 in bf16 and 0.760 - 1.058 in f32 (its rows
# of 8-byte accesses and f32 rows of 511 columns slower): its rows keep 2- and 4-byte 16-bit
# accesses.  By recipe: (the last such 16-bit row's columns, f32 row's, the widest access in bytes)
SHORT_NARROW_COLS = {"rmsnorm": (1000, 512, 8), "layernorm": (1000, 512, 8), "softmax": (1000, 512, 8),
                     "causal": (1000, 512, 8), "add_rmsnorm": (768, 0, 4)}
SHORT_NARROW_VALUES = 8


# 16-bit rows of NARROW_BLOCK_FROM to a few thousand columns in 4- or 8-byte accesses (2 or 4 mod
# 8) take NARROW_BLOCK_THREADS threads a row, NARROW_BLOCK_ROWS rows a block (each thread holds its
# columns of both rows: narrow_block, row_plan's narrow_block); the plans before
# put such a row alone on a block of 256 or 512 threads of 2 - 6 pairs (1 - 3 quads) each.  Probed
# on an H200 (bench/row_plans.py --together, bf16, TB/s against the plan then;
# results/rows-narrow-block-probe-2026-11-29-h200.txt): softmax 65536 x 1022 on 128 threads x 8,
# two rows a block, 4.06 (2.76), a warp x 32 4.05; 32768 x 2046 x 16 4.05 (3.73), one row a block
# 3.70; 32768 x 3070 x 24 4.07 (2.96), 256 x 12 alone 4.08; LayerNorm 3.91 (2.63), 3.87 (3.19),
# 3.87 (2.45); RMSNorm 4.10 (3.16), 3.97 (3.91), 3.90 (3.27; 256 x 12 4.08).  As the plan
# (bench/rows.py --old, time old / new, bf16 / f16, 4,096 to 65,536 rows;
# results/rows-narrow-block{,-rows}-{bf16,f16}-2026-11-29-h200.json): softmax 1.03 - 1.58 at every
# shape (65536 x 1022 2.73 -> 4.02 TB/s, 32768 x 2558 2.58 -> 4.00), LayerNorm 1.04 - 1.86 (32768 x
# 3070 2.41 -> 3.81) but 4096 x 2046 0.96 / 1.01; RMSNorm 1.09 - 1.35 up to 1,534 columns and at
# 16,384 rows or more (32768 x 2558 2.84 -> 3.83), 0.92 - 1.03 at 2,046 - 3,070 columns on 4,096 -
# 12,288 rows; causal softmax 1.07 - 1.52 (f16 at 2,046 - 3,070 columns 0.98 - 1.01, bf16 at 2,046
# on 4,096 - 8,192 rows 0.96 - 0.98).  Quads (8-byte accesses) 1.02 - 1.14 at 2,044 and 2,300 - 2,556
# (RMSNorm 0.97 - 1.01 there), 0.96 - 1.01 at 3,068 (the plan before holds 256 x 3 quads, every
# thread busy).  Add + RMSNorm: 0.92 - 1.04 (not taken).  By recipe, tiers of (the last such row's
# columns in 4-byte accesses, in 8-byte accesses, the fewest rows the tier needs)
NARROW_BLOCK_COLS = {"softmax": ((3072, 2560, 0),), "layernorm": ((3072, 2560, 0),),
                     "rmsnorm": ((1536, 2048, 0), (3072, 2048, 16384)),
                     "causal": ((1536, 2560, 0), (3072, 2560, 12288))}
# and odd 16-bit rows (2-byte accesses) between these columns, by recipe, likewise: probed on an H200
# (bench/row_plans.py --together, bf16, TB/s against the element plan of 256 or 512 threads a row
# then): causal softmax 16384 x 1151 2.78 (2.34), 16384 x 1535 2.89 (2.47); softmax 16384 x 1535
# 3.12 (2.86), 8192 x 1801 2.95 (2.83; from 1,700 columns softmax takes a persistent window
# first), 16384 x 1151 2.92 (3.00, its warp window); LayerNorm 0.84 - 0.92 of its plans at 1,151 -
# 1,801 (not taken).  As the plan (bench/rows.py --old, time new / old, bf16 / f16;
# results/rows-narrow-odd-2026-11-29-h200.txt): causal softmax 0.76 - 0.97 at 1,025 - 1,601
# columns and 4,096 - 32,768 rows (16384 x 1151 2.33 -> 2.74 TB/s), 1,699 0.99 - 1.00; softmax
# 0.89 - 0.97 at 1,531 - 1,699; add + RMSNorm 0.79 - 0.93 at 1,025 - 1,279 columns from 16,384
# rows, but 1,409 and 1,499 0.94 - 1.03 and 4096 x 1151 1.01 / 1.03
NARROW_BLOCK_ODD = {"causal": (1025, 1700), "softmax": (1530, 1699), "add_rmsnorm": (1025, 1300)}
# and f32 rows from NARROW_BLOCK_F32_FROM columns in 4- or 8-byte accesses (odd, 2 mod 4),
# likewise: probed on an H200 (bench/row_plans.py --together, f32, TB/s against the plan of 256
# or 512 threads a row alone then; results/rows-narrow-f32-probe-2026-11-29-h200.txt): softmax
# 32768 x 767 3.96 (3.49, torch 3.68), 16384 x 1535 3.93 (3.00, torch 3.56), 32768 x 1022 4.06
# (3.90), but 16384 x 2046 3.98 (4.08) and 3070 4.02 (4.01); LayerNorm 3.90 (3.41), 3.66 (2.99),
# 4.02 (3.87), 3.92 (4.07); causal softmax 3.96 (3.52), 3.99 (3.04), 4.08 (3.92), 4.11 (4.17);
# RMSNorm 767 4.04 (3.71), 1535 3.34 (3.31), 1022 3.99 (4.01), 2046 3.71 (4.08).  As the plan
# (bench/rows.py --old, time new / old; results/rows-narrow-f32-2026-11-29-h200.json): softmax and
# causal softmax 0.68 - 0.96 at 513 - 1,535 columns, 4,096 - 65,536 rows (softmax 16384 x 1535 2.96
# -> 3.86 TB/s, 1.10x torch); LayerNorm 0.70 - 0.96 but 4096 x 767 1.17; RMSNorm 0.80 - 0.92 at
# 513 - 767, 1.01 - 1.05 at 1,001 - 1,023.  By recipe: (the last odd row's columns, the last of 2
# mod 4, the fewest rows)
NARROW_BLOCK_F32 = {"softmax": (1536, 1024, 0), "layernorm": (1536, 1024, 8192), "causal": (1536, 1024, 0),
                    "rmsnorm": (1000, 0, 0)}
NARROW_BLOCK_F32_FROM = 513
# 16-bit rows of 2 mod 4 columns from LONG_PAIRS_FROM to a recipe's last: a row on these many
# threads, these many rows a block (narrow_block, row_plan's narrow_block), where the plans before put a row alone
# on 512 or 1,024 threads of 4 - 8 pairs or 256 threads of 8 - 16.  Probed on an H200
# (bench/row_plans.py --together, bf16, TB/s; results/rows-long-pairs-probe-2026-11-29-h200.txt),
# 256 threads two rows a block against the plan then: RMSNorm 16384 x 3582 4.00 (3.37), 4094 4.00
# (3.58), 8192 x 6142 3.80 (3.43), 8190 3.45 (2.88); LayerNorm 3.80 (2.57), 3.86 (3.65), 3.67
# (3.60), but 8190 3.11 (3.56); softmax 3.98 (3.08; a row a block 4.12), 4.01 (3.47), 3.86 (3.53),
# 8190 3.26 (3.56); causal softmax on 256 threads a row a block 3.90 (2.67), 3.84 (2.94), 4.25
# (3.16), 8192 x 8190 4.44 (1.65; 1,024 threads x 4 pairs), two rows a block 3.44 - 3.89.  By
# recipe: (the last such row's columns, threads a row, rows a block)
LONG_PAIRS = {"rmsnorm": (8192, 256, 2), "layernorm": (6144, 256, 2), "softmax": (6144, 256, 2),
              "causal": (8192, 256, 1)}
LONG_PAIRS_FROM = 3073
NARROW_BLOCK_FROM = 1001
NARROW_BLOCK_THREADS = 128
NARROW_BLOCK_ROWS = 2


def narrow_block(op: str, cols: int, dtype, rows: int | None = None) -> tuple[int, int] | None:
    """``(threads a row, rows a block)`` recipe ``op``'s row of ``cols`` columns of ``dtype`` in
    accesses narrower than 16 bytes takes (``row_plan(narrow_block=)``), from the measurements of
    ``LONG_PAIRS``, ``NARROW_BLOCK_COLS``, ``NARROW_BLOCK_ODD`` and ``NARROW_BLOCK_F32`` (their
    tiers of rows where there are ``rows`` enough; None: as many as it takes), or None where
    none of them names the row::

        softmax 1,022 bf16 (pairs): (128, 2)     causal softmax 8,190 bf16: (256, 1)     4,096: None
    """
    eb = max(1, _dtype(dtype).bits // 8)
    vec = 16 // eb
    while cols % vec:
        vec //= 2

    def enough(fewest: int) -> bool:
        return rows is None or rows >= fewest

    narrow = (NARROW_BLOCK_THREADS, NARROW_BLOCK_ROWS)
    if eb == 2 and vec == 2 and LONG_PAIRS_FROM <= cols <= LONG_PAIRS.get(op, (0,))[0]:
        return LONG_PAIRS[op][1:]
    if eb == 2 and vec in (2, 4):
        last = max((t[0 if vec == 2 else 1] for t in NARROW_BLOCK_COLS.get(op, ()) if enough(t[2])), default=0)
        return narrow if NARROW_BLOCK_FROM <= cols <= last else None
    if eb == 2 and vec == 1:
        first, last = NARROW_BLOCK_ODD.get(op, (0, 0))
        return narrow if first <= cols <= last else None
    if eb == 4 and vec in (1, 2):
        odd, pairs, fewest = NARROW_BLOCK_F32.get(op, (0, 0, 0))
        return narrow if enough(fewest) and NARROW_BLOCK_F32_FROM <= cols <= (odd, pairs)[vec - 1] else None
    return None


def short_narrow_lanes(cols: int) -> int:
    """The threads a short row of ``cols`` columns in accesses narrower than 16 bytes takes
    (``row_plan(short_narrow_cols=)``): the power of two at or above ``cols / SHORT_NARROW_VALUES``
    (about that many elements a thread, a few fewer where the row is just under a power of two),
    at most a warp::

        33 columns: 4 lanes x 9      101: 16 lanes x 7      255: 32 lanes x 8      999: 32 lanes x 32
    """
    return min(32, _pow2_at_least(max(1, cols // SHORT_NARROW_VALUES)))


# the shortest odd row an aligned window (RowPlan.aligned) may serve.  Measured on an H100 (bf16,
# bench/rows.py) against the element plans of 4 a thread that came before ODD_ROW_VALUES: RMSNorm
# 0.72-0.94 of the time from 4,095 to 24,569 columns, add + RMSNorm 0.66-0.90 from 8,191,
# softmax 0.65-0.96 but at 8,191 (0.99-1.08); 1,023 and 2,047 columns 1.08-1.82 for every op (one
# window more than a power of two of vectors: a pass of 129 or 257 threads' vectors on 256 or
# 512, where the element plans keep every thread busy)
ALIGN_FROM = 4000
# Against the element plans of ODD_ROW_VALUES (bench/row_plans.py, bf16, TB/s window / elements):
# add + RMSNorm 2.44 / 2.11 at 4,095, 2.35 / 2.07 at 8,191, 2.16 / 1.94 at 16,383, 2.66 / 1.52 at
# 24,569; RMSNorm 1.89 / 2.10, 1.84 / 1.79, 1.58 / 1.35, 2.14 / 1.33; softmax 1.94 / 2.38, 1.77 /
# 2.08, 1.42 / 1.73, 2.03 / 1.49; LayerNorm 1.18 / 2.02, 1.37 / 1.83, 1.09 / 1.28, 1.50 / 1.32;
# causal softmax 1.96 / 2.75, 1.92 / 3.19, 1.56 / 2.97, 1.94 / 2.07: the windows from these
# lengths on (None: never).  With clusters (sm_90a) RMSNorm's odd rows of 8,193 to 22,000 columns
# wait in shared memory on clusters of two instead (STAGED_ODD_VALUES): 1.82, 1.92, 1.99 TB/s at
# 12,289, 16,383, 20,481 against 1.52, 1.58, 1.89 in windows; at 24,569 1.67 against 2.14
ALIGN_FROM_BY_OP = {"add_rmsnorm": ALIGN_FROM, "rmsnorm": 12000, "softmax": 20000, "layernorm": 20000,
                    "causal": None}
ALIGN_FROM_WITH_CLUSTERS = {"rmsnorm": 22000}
# elements a thread of one block from which RMSNorm's odd rows wait in shared memory on a cluster
# (row_plan's odd_values, sm_90a; the others keep ODD_VALUES): softmax 1.66 / 1.40, 1.71 / 1.76,
# 1.73 / 1.78 TB/s staged / its plan at 12,289, 16,383, 20,481; LayerNorm 1.16 / 1.26, 1.33 /
# 1.27, 1.30 / 1.39; add + RMSNorm 2.02 / 2.02, 1.99 / 2.16, 1.96 / 2.25
STAGED_ODD_VALUES = {"rmsnorm": 8}
# elements of a 16-bit row a thread of a causal softmax holds on 512 threads instead of 1,024
# (row_plan's half_block_values).  Measured on an H100 (bench/row_plans.py): 16384 x 20,480 bf16
# 4.12 TB/s on 512 threads x 40 against 2.52 on 1,024 x 24 (f16 4.09 against 2.47), 16384 x
# 24,576 4.31 on 512 x 48 against 2.87 (no spills); 8192 x 32,768 on 512 x 64 spilled 312 bytes
# (3.21 against 3.35 on 1,024 x 32); f16 rows of 20,488 to 23,560 columns (48 a thread, the last
# pass partial) spilled 8 bytes (sm_90a) and 40 (sm_80)
CAUSAL_VALUES = 48
# the same for LayerNorm's and RMSNorm's rows (their 16-bit rows of 16,385 to 20,479 columns: 40
# a thread on 512 threads, the last pass partial).  Measured on an H200 (bf16, 8192 x 20,000,
# bench/row_plans.py): LayerNorm 4.02 TB/s on 512 threads x 40 (two blocks an SM, 64 registers,
# no spills) against 2.58 on 1,024 x 24, RMSNorm 3.87 against 2.62; clusters of staged or register
# parts 1.96-3.08 and 2.88-3.40
HALF_BLOCK_VALUES = {"causal": CAUSAL_VALUES, "layernorm": 48, "rmsnorm": 48}
# Before that, and before a cluster of staged parts: LayerNorm's and RMSNorm's rows of 16-byte
# vectors take 512 threads (two blocks an SM) wherever 1,024 would hold them in fewer than four
# passes or with the last pass partial, and 512 hold them in at most 40 elements a thread in
# whole passes or at most 64 (LayerNorm) / 56 (RMSNorm) with the last pass partial: (whole,
# partial).  Measured on an H200 (bf16 / f16, 8192 rows, TB/s on 512 threads against the plan then; LayerNorm
# with the tuple, TUPLE_THREADS): LayerNorm 20,480 x 40 4.12 / 4.11 against 3.56 / 3.53 (a
# cluster of two staged parts), 22,528 x 48 4.13 / 4.13 against 2.92 / 2.75 (1,024 x 24), 26,624
# x 56 4.08 / 4.10 against 3.18 / 2.91 (1,024 x 32), 30,720 x 64 4.09 / 4.09 against 3.40 / 3.16;
# RMSNorm 22,528 4.05 against 2.78, 26,624 4.08 against 2.87, 30,720 x 64 3.87 against 3.06 but
# spilling 56 bytes (bf16).  Whole passes of more than 40 spilled (bf16 LayerNorm 24,576 x 48 32
# bytes, 28,672 x 56 64, 32,768 x 64 192): those rows keep their clusters (24,576, 28,672: 3.58
# and 3.68 bf16) or 1,024 threads (32,768: 3.92); so do 72 and 80 a thread (36,864, 40,960:
# 264-376 bytes spilled, bf16).  Softmax's rows alike at up to 48 a thread (its exponentials in
# registers, two plain reductions), where it waited in shared memory on 1,024 threads
# (stage_one_block) or a cluster (same H200, bf16, 8192 rows, TB/s on 512 threads against the plan
# then): 17,000 x 40 3.88 against 3.18, 20,480 x 40 4.14 against 4.00 (a cluster of two), 22,528 x
# 48 4.16 against 3.76, 24,568 x 48 4.09 against 3.82; at 26,624 x 56 it spilled 56 bytes
HALF_BLOCK_VECTORS = {"layernorm": (40, 64), "rmsnorm": (40, 56), "softmax": (40, 48)}


# odd 16-bit rows of these many columns wait in shared memory in their aligned window
# (RowPlan(aligned=True, row_memory="SH"), row_plan's staged_window): one block of
# STAGED_WINDOW_THREADS threads copies the window in 16-byte cp.async chunks (the last one partial,
# lower.rules.copies), STAGED_WINDOW_BLOCKS blocks an SM.  Measured on an H100 (bf16,
# bench/row_plans.py, 256 threads, three blocks an SM; TB/s against the plans then, bench/rows.py):
# softmax 4096 x 8191 2.67 (2.09), 2048 x 12289 2.56 (1.74), 2048 x 16383 2.64 (1.75), 1024 x
# 24569 2.62 (2.04), but 8192 x 4095 2.24 (2.41); RMSNorm 2.52 (1.79), 2.29 (1.81), 2.35 (1.91),
# 2.18 (2.13), 8192 x 4095 2.16 (2.11); LayerNorm 1.91 (1.81), 1.79 (1.28), 1.77 (1.29), 1.78
# (1.50), 8192 x 4095 1.44 (2.00).  Six blocks an SM (40 registers) spilled RMSNorm; 512 threads
# read 0.92-1.06 of these.  As the plan (bench/rows.py --old, bf16 / f16): 8192 x 6001 RMSNorm
# 2.63 / 2.65 (1.80 / 1.97), LayerNorm 2.09 / 2.13 (1.78 / 1.66), softmax 2.81 / 2.82 (2.33 /
# 2.35); 1024 x 32767 1.97, 1.56, 2.47 (1.67, 1.01, 1.57); 1024 x 40959 LayerNorm 1.51 (1.22),
# softmax 2.39 (1.54).  With the weight's shifted runs (threads.shifted_run), bf16, the window
# against the plan then: RMSNorm 8192 x 4095 2.18 (2.08), 16384 x 4097 2.31 (2.04), 1024 x 40959
# 2.22 (1.92, clusters); add + RMSNorm (the sum staged) 4096 x 8191 2.53 (2.33), 2048 x 12289
# 2.49 (2.08), 2048 x 16383 2.50 (2.19), 1024 x 32767 2.29 (1.70), 1024 x 40959 2.13 (1.82), but
# 8192 x 6001 2.63 (2.72), 8192 x 4095 2.31 (2.42) and 1024 x 24569 2.38 (2.70: its window in
# registers fills whole passes of its 1,024 threads, STAGED_WINDOW_WHOLE_PASSES); softmax 16384 x 4097
# 2.28 (2.40), LayerNorm 8192 x 4095 1.38 (2.02).  As the plan (bench/rows.py --old, bf16 / f16):
# RMSNorm 16384 x 4097 2.32 / 2.31 (2.06 / 2.07), but 8192 x 4095 2.17 / 2.24 (2.09 / 2.43: its
# element plan, 256 threads x 16, fills its passes): from 4,096.  Columns from
STAGED_WINDOW_COLS = {"rmsnorm": 4096, "layernorm": 6000, "softmax": 6000, "add_rmsnorm": 8000, "causal": 20000}
# causal softmax's staged windows: two blocks an SM (STAGED_WINDOW_BLOCKS_BY_OP).  Measured on an
# H200 (bench/row_plans.py, bf16, 256 threads; TB/s against the plan then: half blocks or clusters
# of element copies): 2048 x 20481 at 2 blocks an SM 2.72, at 3 2.40 (2.12); 2048 x 24569 at 2
# 3.14, at 3 2.69 (2.24; f16 2.75 against 2.21); 1024 x 32767 2.82 (2.26); 1024 x 40959 2.66
# (2.34); but 8192 x 8191 2.39 (3.22), 4096 x 12289 2.30 (3.01) and 4096 x 16383 2.73 (3.09),
# where one block's registers hold the row.  Longer ones too (they stopped at 41,000 columns):
# 1024 x 45001 4.43, 1024 x 49999 4.44, 2048 x 49999 4.71 (two blocks an SM), 1024 x 57001 4.62
# (alone: STAGED_WINDOW_ALONE) against 1.62 - 1.74 on clusters of element copies
STAGED_WINDOW_BLOCKS_BY_OP = {"causal": 2}
# recipes that keep an odd row's window in registers where it fills whole passes of the block's
# threads (row_plan(align=True); measured at 24,569 columns only, above)
STAGED_WINDOW_WHOLE_PASSES = ("add_rmsnorm",)
STAGED_WINDOW_THREADS = 256
STAGED_WINDOW_BLOCKS = 3
# odd 16-bit rows from these many columns stage their window on blocks of these many threads
# (row_plan's staged_window_threads; the last step whose columns a row reaches), on sm_90a.
# Measured on an H200 (bench/rows.py --old, 1,024-2,048 rows of 36,001-57,001 columns, bf16 / f16,
# the time against 256 threads three or two blocks an SM): 512 threads RMSNorm 0.88-0.95, add +
# RMSNorm 0.79-0.93, LayerNorm 0.89-1.004, softmax 0.81-0.92; from 24,000 columns 512 threads
# spilled RMSNorm bf16 at 28,671 and 32,767 (three blocks an SM, 42 registers).  1,024 threads two
# an SM (32 registers; bench/row_plans.py, bf16, TB/s against 512): RMSNorm 1024 x 36001 3.02
# (3.02), 40959 3.03 (2.87), 49999 3.10 (2.95), 57001 3.25 (3.11); softmax 3.09 (3.42), 3.13
# (3.07), 3.30 (3.18), 3.37 (3.22); add + RMSNorm spilled 8-112 bytes there, LayerNorm 4-8 at some.
# As the plan from 40,000 columns (bench/rows.py --old, against 512): RMSNorm 0.93-0.985 of the
# time at 40,001-57,001 columns; softmax 0.94-1.06 (slower at 40,001 and 45,001), not taken
# an odd 16-bit row whose staged window two blocks an SM cannot hold (from about 57,000 columns)
# stages it on one block of these many threads alone on its SM (row_plan's
# staged_window_alone_threads; whole warps then, rows.whole_warps), on sm_90a, where it used to
# take a cluster of element copies.  Measured on an H200 (bench/row_plans.py --row-memory SH
# --occupancy 1, bf16, 1,024 rows, TB/s at 65,537 / 100,003 columns against the clusters then):
# LayerNorm 640 threads x 13 2.33 / 512 x 25 2.38 (1.34 / 1.38), RMSNorm 1024 3.01 / 3.11 (2.16 /
# 2.35), add + RMSNorm 1024 3.18 / 3.04 (2.19 / 2.41), softmax 640 2.83 / 512 3.07 (1.72 / 1.70),
# causal softmax 512 3.81 / 4.03 (1.59 / 1.67); 1,024 threads read 2.25 / 2.37, 2.66 / 3.01 and
# 3.53 / 3.95 for the last three, 512 2.82 / 3.05 and 2.66 / 2.66 for the norms
STAGED_WINDOW_ALONE = {"layernorm": 512, "softmax": 512, "causal": 512, "rmsnorm": 1024, "add_rmsnorm": 1024}
STAGED_WINDOW_WIDE = {"rmsnorm": ((36000, 512), (40000, 1024)), "softmax": ((36000, 512),),
                      "add_rmsnorm": ((36000, 512),), "layernorm": ((36000, 512),)}

# odd 16-bit rows of these many columns (first to last, inclusive) wait in their staged window on a
# persistent grid (RowPlan(persistent=True), row_plan's persistent_window): a multiple of 8 blocks,
# so each block's rows keep one phase, and the weights (ROW_OPERANDS of them) are shifted into the
# window's frame once a block, into shared memory (lower.rules.threads.staged_run), not once a row;
# with less shared memory a block, up to PERSISTENT_WINDOW_BLOCKS blocks an SM (those that fit).
# Measured on an H200 (bench/row_plans.py, bf16, 256 threads; TB/s against the plan then, the
# element plan below 4,096 columns): RMSNorm 4096 x 4095 at 8 blocks an SM 2.74 (1.96; f16 2.76
# against 2.23), 16384 x 4097 at 6 3.03 (2.41), 8192 x 6001 at 5 3.47 (3.20), 8192 x 8191 at 4-6
# 3.35-3.43 (3.15), but 4096 x 12289 3.25 (3.32), 2048 x 16383 2.88 (3.03), 1024 x 32767 2.12
# (2.75) and 16384 x 1023 1.91 (2.63); LayerNorm 8192 x 8191 at 4 2.25 (2.01), at 3 2.13, but 4096
# x 4095 1.46-1.58 (the element plan's 1.83) and 8192 x 6001 at 3 2.11 (2.26); add + RMSNorm
# 8192 x 8191 at 4 3.26 (3.11), at 5 it spilled; softmax (no weight) 8192 x 8191 2.48-2.63 (3.01).
# As the plan (bench/rows.py --old, bf16 / f16, time new / old): RMSNorm 4096 x 4095 0.72 / 0.82,
# 16384 x 4097 0.75 / 0.76, 16384 x 4095 0.78 / 0.91, 8192 x 6001 0.95 / 0.96, 8192 x 8191 0.94 /
# 0.95, but 4096 x 9999 1.07 / 1.07 (5 blocks); LayerNorm 8192 x 6001 0.94 / 0.96, 8192 x 8191
# 0.89 / 0.91, but 4096 x 9999 1.02 / 1.06 (3 blocks); add + RMSNorm 8192 x 8191 0.96 / 0.95,
# 4096 x 9999 0.98 / 0.98.  Hence the ranges, RMSNorm's and LayerNorm's to 8,191 columns.  Then
# (bench/row_plans.py, bf16, against the plan then): add + RMSNorm 4096 x 4095 at 4 3.15, at 6
# 3.01 (2.61, its window in registers), 8192 x 6001 at 4 3.57 (3.45); LayerNorm 8192 x 6001 at 6
# 2.53, at 5 2.51 (2.43 at 4), but 4096 x 4095 at 5-6 1.50, 128 threads at 8 1.86 (1.85, the
# element plan), 16384 x 4097 at 5-6 1.67-1.68 (1.96); RMSNorm 8192 x 2047 on 256 threads 2.09
# (2.31).  Hence add + RMSNorm from 4,000 columns (since from 1,500: below), LayerNorm up to 6 blocks an SM
# LayerNorm's and softmax's from 1,700 columns (they started at 2,800): on an H200 (bench/row_plans.py
# --together --row-memory SH, bf16, 16,384 rows, TB/s against their element plans then, in
# brackets), 128 threads (whole warps: 96 at 2,047) eight blocks an SM with the next row in flight:
# LayerNorm 1,791 2.93 (2.63), 2,047 3.08 (2.73), 2,303 3.02 (2.33), 2,559 3.13 (2.31), 2,799 3.33
# (2.35); softmax 3.22 (3.09), 3.28 (2.95), 3.38 (3.10), 3.34 (2.93), 3.42 (2.93); but at 1,535
# 2.56 (2.64) and 2.78 (2.86) at best (PERSISTENT_SHORT_WINDOWS)
PERSISTENT_WINDOW_COLS = {"rmsnorm": (1500, 8191), "layernorm": (1700, 24569), "add_rmsnorm": (1500, 10000),
                          "softmax": (1700, 5999)}
PERSISTENT_WINDOW_BLOCKS = {"rmsnorm": 8, "layernorm": 6, "add_rmsnorm": 4, "softmax": 6}
# add + RMSNorm's shorter rows (below the first number of columns) take eight blocks an SM, of 128
# or 256 threads, whichever leaves fewer of the window's chunks idle (the more threads on a tie:
# fuller_window_threads).  Measured on an H200 (bench/row_plans.py --together, bf16, TB/s; the
# element plans then in brackets): 4096 x 3583 on 256 threads at 8 blocks 3.31, at 4 3.30, on 128
# at 8 3.30 (2.28); 8192 x 3001 on 128 at 6 3.55, at 8 3.40, on 256 at 8 3.36 (2.43); 8192 x 2047
# on 128 at 8 3.18, on 256 2.34-2.42 (2.86); 16384 x 1535 on 256 at 8 3.40, on 128 at 8 3.31, on
# 64 2.47 (3.09); fewer blocks were slower at every length but 3,583
PERSISTENT_SHORT_WINDOWS = {"add_rmsnorm": (4000, 8, (128, 256)), "layernorm": (2800, 8, (128,)),
                            "softmax": (2800, 8, (128,))}
# RMSNorm's odd rows of 1,000 - 1,499 columns: a warp a row, sixteen blocks an SM, the next row's
# copy in flight (tile_stages=2), since the weight's window is filled from a raw copy
# (lower.rules.threads._stage_window_raw).  Measured on an H200 (bench/row_plans.py --together
# --row-memory SH, bf16, TB/s against the element plan's 2.63): 16384 x 1023 on 32 threads at 16
# blocks an SM 3.11, at 12 2.83, at 8 2.27; on 64 threads at 12 2.78, at 16 2.75; on 128 at 8-16
# 2.27-2.32; on 256 (one pass, no prefetch) 2.06.  With the register fill these had read 2.43-2.52.
# As the plan (bench/rows.py --old, bf16 / f16, time new / old): 16384 x 1023 0.849 / 0.872 (3.11 /
# 3.03 TB/s), 32768 x 1023 0.797 / 0.818, 65536 x 1023 0.781 / 0.807, 16384 x 1001 0.813 / 0.838,
# 16384 x 1279 0.575 / 0.591, 16384 x 1499 0.608 / 0.632, 8192 x 1023 0.934 / 0.961, but 4096 x
# 1023 1.084 / 1.089 (some two rows a block of 2,112: the window's fill is not paid back); hence
# from 8,192 rows.
# LayerNorm's and softmax's rows of about 1,100 - 1,700 columns gain from them too (they took
# element plans): on an H200 (bench/row_plans.py --together --row-memory SH, 16,384 rows, bf16 / f16,
# TB/s against the element plan's): LayerNorm 1,101 on a warp at 20 blocks an SM 2.81 / 2.75 (2.29
# / 2.29), at 16 2.69 / 2.64; 1,151 at 20 2.94 / 2.87 (2.37 / 2.36); 1,279 on 64 threads at 12
# 2.79 / 2.80, on a warp at 16 2.70 / 2.69 (2.48 / 2.52); 1,407 on 64 at 12 3.02 / 3.03, on a warp
# at 16 2.97 / 2.93 (2.53 / 2.55); 1,535 on a warp at 16 2.86 / 2.81, at 12 2.62 / 2.60, on 64 at 12
# 2.48 / 2.46 (2.62 / 2.65); 1,663 on a warp at 12 2.81 / 2.79, on 64 2.72 / 2.67 (2.61 / 2.66);
# 32,768 x 1,535 on a warp at 16 3.19 / 3.14 (2.81 / 2.85), 8,192 x 1,535 2.48 / 2.47 (2.33 / 2.37);
# 1,023 on a warp at 16 2.49 (2.53); softmax 1,151 on a warp at 16-20 3.09 - 3.12 (2.47 - 2.50), on
# 64 2.37 - 2.49, but 1,535 and 1,663 at best 2.66 - 2.77 (2.84 - 2.98).  So the block of the
# fewest idle chunks, the larger on a tie (fuller_window_threads: 64 threads at 1,279 and 1,407,
# where a warp and two take as many passes), at 768 threads an SM (as many blocks as fit below
# that).  As the plan (bench/rows.py --old, 16,384 rows, time new / old, bf16 / f16): LayerNorm
# 1,101 0.832 / 0.836, 1,151 0.812 / 0.832, 1,279 0.895 / 0.905, 1,407 0.846 / 0.848, 1,535 0.936 /
# 0.967 (2.77 / 2.72 TB/s, was 2.60 / 2.63), 1,663 0.878 / 0.900, 1,699 0.921 / 0.948, 32,768 x
# 1,151 0.791 / 0.802, 32,768 x 1,535 0.933 / 0.958, 8,192 x 1,535 0.987 / 0.987, and 1,001 (two
# warps) 0.897 / 0.899, but 1,023 1.028 / 1.039 (a warp's five passes over 129 chunks, the last
# holding one); softmax 1,101 0.826 / 0.828, 1,151 0.835 / 0.835, 1,279 0.894 / 0.891, 1,407 0.838 /
# 0.831, 32,768 x 1,151 0.798 / 0.801, but 1,001 and 1,023 1.022 - 1.062, 1,535 - 1,699 (a warp of
# seven passes) 1.062 - 1.091.  A warp takes five passes over any row of 1,017 - 1,273 columns
# (129 - 160 chunks), so a row at the short end pays a fifth pass for a few chunks: LayerNorm's
# from 1,057 columns (the last pass holding more than an eighth of the warp's lanes, as
# WHOLE_WARPS_IDLE), softmax's from 1,100 to 1,529 (the longest row two warps hold in three passes).
# By recipe: (first, last columns, the blocks' threads to choose from, threads an SM, the fewest rows)
PERSISTENT_WARP_WINDOWS = {"rmsnorm": (1000, 1499, (32,), 512, 8192),
                           "layernorm": (1057, 1699, (32, 64), 768, 8192),
                           "softmax": (1100, 1529, (32, 64), 768, 8192)}
# ... and of these many columns a block keeps two rows in shared memory, the next one's copy in
# flight while it computes one (RowPlan.tile_stages: pipeline(stages=2) over the persistent tile
# loop, lower.transforms.tile_prefetch), on blocks of PERSISTENT_PREFETCH_THREADS (the first
# measurements below took RMSNorm's on 256).
# add + RMSNorm's row is a sum the kernel computes, not a copy: it has nothing to prefetch.
# Measured on an H200 (bench/row_plans.py --together, bf16 / f16, TB/s against the plan then):
# LayerNorm on 128 threads, 4096 x 4095 at 6 blocks an SM 1.98 / 1.99 (1.82 / 1.83, the element
# plan), 16384 x 4097 at 6 2.48 / 2.48 (1.95 / 1.95), 8192 x 6001 at 4 2.84 / 2.90 (2.73 / 2.73),
# 8192 x 8191 at 3 2.47 / 2.44 (2.43 / 2.46; 256 threads 2.50 / 2.51), where 256 threads read
# 1.64-1.66 at 4,095 columns and 64 threads, three stages or fewer blocks were slower; RMSNorm on
# 256 threads at 6 blocks, 4096 x 4095 2.75 / 2.77 (2.74 / 2.75), 16384 x 4097 3.31 / 3.30 (3.20 /
# 3.17), 8192 x 6001 3.39 / 3.36 (3.34 / 3.30), but 8192 x 8191 at 4 blocks 2.68 / 2.67 (3.38 /
# 3.37; at 3 blocks 3.43 / 3.41: 4 blocks did not fit with the driver's reserve)
# Shorter RMSNorm rows take the persistent window too, on 128 threads (bench/row_plans.py, bf16):
# 8192 x 2047 at 8 blocks an SM 2.75 (2.31), at 12 2.76; 16384 x 2047 3.01 (2.40), at 12 3.04,
# where 256 threads read 2.16-2.31; but 16384 x 1023 on 64 threads 2.43-2.52 (2.62) and LayerNorm's
# short rows 1.05-1.79 (2.23-2.73).  As the plan (bench/rows.py --old, bf16 / f16, time new / old):
# RMSNorm 8192 x 1535 0.715 / 0.738, 8192 x 2047 0.832 / 0.865, 16384 x 2047 0.792 / 0.815, 8192 x
# 2049 0.803 / 0.805, 8192 x 3001 0.700 / 0.774, 8192 x 3071 0.745 / 0.826, 4096 x 4095 1.003 /
# 0.997, 16384 x 4097 0.962 / 0.960, but 4096 x 5001 1.029 / 1.039 (on 256 threads 1.020 / 1.025)
# and 8192 x 6001 0.988 / 0.983 (256 threads).  Hence RMSNorm's range ends at 4,200 columns.
# LayerNorm's (bench/rows.py --old, bf16 / f16): 8192 x 4251 0.848 / 0.851, 8192 x 5171 0.759 /
# 0.742, 8192 x 7067 0.923 / 0.970, but 8192 x 7803 1.061 / 1.097 (2.80 -> 2.64 TB/s: four blocks
# of 256 threads, one row each, against three of 128 with two) and 8192 x 8191 0.985 / 1.008.
# Hence LayerNorm's range ends at 7,200 columns.
# The prefetching windows' threads:
PERSISTENT_PREFETCH_COLS = {"rmsnorm": (1500, 4200), "layernorm": (1700, 7200), "softmax": (1700, 5999)}
PERSISTENT_PREFETCH_THREADS = 128
# LayerNorm's statistics on the prefetching windows: two plain reductions (the mean, then the mean
# of the squared deviations, kept in registers for the output) where every thread holds at most
# LAYERNORM_TWO_REDUCTION_VALUES elements and has the registers for them (below); the Welford
# tuple elsewhere.  On an H200
# (bench/row_plans.py --tuple-stats both, bf16, 128 threads, TB/s two reductions / the tuple at
# the blocks an SM named): 16384 x 4097 at 4 2.74 / 2.41 (at 6 2.80 / 2.53), 4096 x 4095 at 4
# 2.13 / 1.97 (the tuple at 6 2.03), 4096 x 5001 at 4 2.58 / 2.41 (the tuple at 5 2.47), 8192 x
# 6001 at 4 3.13 / 2.93, 8192 x 7067 at 3 2.80 / 2.77.  Where each thread has fewer registers
# the deviations spill at some lengths (4,095 and 4,123 columns at 6 blocks: 88 bytes, 1.57 TB/s;
# at 5: 12-24 bytes), which the compiler decides, not the plan.  56 values a thread at 4 blocks
# spilled too at first (40 bytes at half the odd lengths of 6,139 - 7,161 columns sampled, 128
# registers); since the loops split around their guards none does (sm_90a, bf16 and f16: 128
# threads at 6,139 - 7,161 columns, 256 at 12,283 - 14,313, 94 - 128 registers), and there the two
# reductions are the faster (same H200, two reductions / the tuple, bf16 then f16): 128 threads 8192
# x 6139 3.30 / 3.16, 3.22 / 3.20; 8192 x 6501 3.50 / 3.49, 3.48 / 3.38; 8192 x 6777 3.47 / 3.45,
# 3.52 / 3.39; 8192 x 7067 3.39 / 3.40, 3.29 / 3.26; 4096 x 7161 3.27 / 3.30, 3.32 / 3.25; 16384 x
# 6143 3.41 / 3.24, 3.29 / 3.28; 256 threads two an SM 4096 x 12287 3.16 / 3.06, 3.08 / 3.06; 4096
# x 12501 3.31 / 3.24, 3.22 / 3.11; 4096 x 13313 3.44 / 3.40, 3.41 / 3.21; 4096 x 14001 3.44 /
# 3.44, 3.45 / 3.32; 8192 x 12999 3.63 / 3.59, 3.61 / 3.52; 2048 x 13711 3.10 / 3.09, 3.13 / 3.06
LAYERNORM_TWO_REDUCTION_VALUES = 56
# The registers a thread of those two reductions takes: 2 a value it holds (its deviation, the
# output's); the blocks an SM leave each thread that many (thread_registers).  It was 2 a value and
# 32 besides (then 96 registers at 40 values spilled 12-24 bytes, 80 at 40 88 bytes); since the
# window's edge skip and the loops split around their guards (lower.transforms.split_guards) the
# kernels compile to 80 registers at 40 values and 95 at 48 without spills (sm_90a, 2,801-9,001
# columns, bf16 and f16).  Measured on an H200 (bench/rows.py --old, bf16 / f16, against 32
# besides): 8192 x 3583 at 6 blocks an SM 0.970 / 0.966 of the time, 4096 x 4095 at 6 0.953 /
# 0.961 (2.38 -> 2.51 TB/s), 16384 x 4097 0.975 / 0.949, 8192 x 4123 0.972 / 0.975, 4096 x 5001 at
# 5 0.986 / 0.998, 8192 x 5119 at 5 0.999 / 0.972, 4096 x 8193 at 3 (256 threads) 0.929 / 0.922
LAYERNORM_DEVIATION_REGISTERS = (2, 0)
# Softmax on the prefetching windows alike: its maximum and its sum of exponentials in two plain
# reductions (the exponentials kept in registers for the output), where the tuple (the online
# merge of (max, sum)) is much slower.  On an H200 (bench/row_plans.py --tuple-stats both, bf16,
# 128 threads, TB/s two reductions / the tuple): 4096 x 4095 at 4 blocks an SM 2.68 / 2.29, at 6
# 2.93 / 2.27, at 8 2.79 / 2.36 (8 bytes spilled), against the element plan's 2.63; the tuple at
# 4096 x 5001 2.75 - 2.87 (2.42), 4096 x 3583 2.34 - 2.53 (2.32); but 8192 x 2047 1.69 - 1.83
# (2.82).  A thread holding v exponentials takes 2v registers (compiled for sm_90a: 64 at 32
# values, 80 at 40 and 48; 64 at 40 spilled 8 bytes, at 48 68)
SOFTMAX_TWO_REDUCTION_VALUES = 48
SOFTMAX_EXPONENTIAL_REGISTERS = (2, 0)
#: by recipe: (the most values a thread of the two reductions holds, its registers (per value, besides))
TWO_REDUCTIONS = {"layernorm": (LAYERNORM_TWO_REDUCTION_VALUES, LAYERNORM_DEVIATION_REGISTERS),
                  "softmax": (SOFTMAX_TWO_REDUCTION_VALUES, SOFTMAX_EXPONENTIAL_REGISTERS)}
# ... and only where another block shares the SM: its rows run while one block waits at the second
# reduction's barriers.  A block alone on its SM (LayerNorm's 512-thread windows, below; softmax's
# plans never leave one alone, a user's plan may) has no one to cover them and takes the tuple (one
# exchange a row).  Measured on an H200 (bench/row_plans.py
# --tuple-stats both, 512 threads alone, two rows in flight; TB/s the tuple / two reductions),
# bf16: 4096 x 14319 2.98 / 2.90, 4096 x 15001 2.98 / 2.93, 4096 x 16127 3.15 / 3.06, 4096 x
# 16375 3.12 / 3.09, 2048 x 16383 2.62 / 2.55, 4096 x 16383 2.74 / 2.67, 8192 x 16383 2.79 / 2.73,
# 4096 x 16385 2.85 / 2.82, 4096 x 16447 2.81 / 2.76, 4096 x 17001 3.02 / 2.91, 4096 x 18425 3.25 /
# 3.14, 4096 x 20479 2.93 / 2.84, 2048 x 24569 3.32 / 3.29; f16: 4096 x 14319 2.99 / 2.89, 4096 x
# 15001 2.98 / 2.93, 16,383 columns at 2048 / 4096 / 8192 rows 2.59 / 2.58, 2.68 / 2.69, 2.74 /
# 2.75, 4096 x 17001 2.96 / 2.93, 4096 x 18425 3.18 / 3.13.  On 256 threads two an SM the two
# reductions stay faster (2048 x 12287 2.92 / 2.84 bf16, 2.83 / 2.80 f16, two reductions / the tuple)
TWO_REDUCTIONS_BLOCKS = 2
# LayerNorm's 16-bit rows on one block of 512 or more threads in registers (the element plans of
# 12,289 - 40,960 columns) take the tuple too: one exchange across 16 or 32 warps instead of two.
# Measured on an H200 (bench/row_plans.py --plan default --tuple-stats both, 8192 rows unless
# named, TB/s the tuple / two reductions, bf16 then f16): 1,024 threads 8192 x 32,768 3.93 / 3.51,
# 3.92 / 3.50; 32768 x 32,768 3.99 / 3.57, 3.99 / 3.56; 4096 x 40,960 3.85 / 3.68, 3.85 / 3.71;
# 512 threads 4096 x 10,752 (24 a thread) 3.62 / 3.35, 3.36 / 3.34; 12,288 3.89 / 3.81, 3.88 /
# 3.80; 16,384 4.14 / 4.11, 4.14 / 4.11; 4096 x 16,384 4.04 / 3.99, 4.03 / 3.99; 20,480 4.12 /
# 4.12, 4.11 / 4.13; 18,432 (40 a thread) 4.04 / 4.09, 3.95 / 4.00 and 20,000 4.00 / 4.04, 3.92 /
# 3.96 the exceptions; from 48 a thread the two reductions spill (HALF_BLOCK_VECTORS).  Not on
# 1,024 threads whose last pass is partial (the plans of sm_80 at 16,392 - 32,760 columns, where
# sm_90a takes 512 threads): compiled for sm_90a, 8192 x 26,624 3.18 / 3.00 but f16 2.48 / 2.91,
# 30,720 3.40 / 3.25, f16 2.56 / 3.16.  On 256
# threads and fewer the two stay (level at 3,840 - 14,336 columns, 16384 x 1,024 on 128 x 2 rows
# 3.77 / 3.56).  By recipe: the fewest threads of a row's block
TUPLE_THREADS = {"layernorm": 512}
# LayerNorm's odd rows of 7,201 - 8,191 columns prefetch too, on blocks of 256 threads, two an SM
# (two reductions, 32 - 40 values a thread).  Same H200 (bench/row_plans.py, bf16, TB/s against
# the plan then, four blocks of 256 threads a row at a time with the tuple): 8192 x 7803 3.09
# (2.80), 8192 x 8191 2.67 (2.55; f16 2.57), 4096 x 7501 2.69, 8192 x 7067 2.82 (2.75, the
# 128-thread prefetch with the tuple); but 8192 x 6501 2.57, where 128 threads keep it.
# So do its rows of 2,800 - 4,000 columns (PERSISTENT_PREFETCH_COLS), on 128 threads, five or six
# blocks an SM (24 - 32 values a thread, the blocks deviation_blocks leaves): 8192 x 3001 at 6
# blocks 2.96, at 5 2.89, at 4 2.73 (its element plan then 2.01), where 1,535 and 2,047 columns read
# 2.06 and 1.98 on such windows against their element plans' 2.17 and 2.21
# Longer ones, to 24,569 columns (48 values a thread of 512), prefetch on the first of these
# block sizes two of whose blocks an SM's shared memory holds (the row's two stages and the
# weight's and bias's windows: persistent_window_bytes), else on the last alone
# (ALONE_WINDOW_THREADS): 256 threads two an SM up to about 14,000 columns, 512 one an SM above.
# Same H200 (bench/row_plans.py --tuple-stats both, bf16, TB/s the tuple / two reductions, against
# the plan then: three staged windows of 256 threads an SM, a row at a time, with the tuple):
# 256 threads two an SM 4096 x 8193 2.27 / 2.48 (2.12), 4096 x 9001 2.62 / 2.76 (2.39), 4096 x
# 12289 2.70 / 2.74 (2.34), where one such block an SM read 1.59-2.07 and 512 threads two an SM
# 1.88-2.53; 512 threads alone 2048 x 16383 2.22 / 2.29 (2.12), 4096 x 16383 2.34 / 2.43 (2.28),
# 2048 x 20479 2.34 / 2.40 (2.10), 2048 x 24569 3.08 / 3.03 (2.56), where 1,024 threads read 1.99 /
# 2.07 / 2.47 / 2.94 and 256 threads alone 1.85-2.63.  (Since the windows are filled from a raw
# copy, 512 threads alone take the tuple, the faster there now: TWO_REDUCTIONS_BLOCKS.)
PERSISTENT_PREFETCH_WIDE = {"layernorm": (7201, 24569, (256, 512))}
#: a persistent window's block of at least this many threads may take an SM alone (measured
#: above, at 16,383-24,569 columns: one block of 256 threads an SM read 1.68-2.63 TB/s, one of
#: 512 2.22-3.08); the power-of-two block's threads, of which whole warps may then take fewer
#: (``whole_warps``: 416 at 16,383 columns, measured faster than 512)
ALONE_WINDOW_THREADS = 512
#: the operands along the row only each recipe shifts into its window (its weight; LayerNorm's bias)
ROW_OPERANDS = {"rmsnorm": 1, "layernorm": 2, "add_rmsnorm": 1, "softmax": 0}


# Guarded loads under a PTX predicate (done(guard="predicate"): the zeros and `@p ld` in one asm
# statement) instead of a branch, by recipe and row: "vectors", a row of whole 16-byte vectors in
# registers on one block whose last pass is partial (its last pass's loads are guarded);
# "elements", a row not a whole number of 16-byte vectors.  ptxas issued RMSNorm bf16's guarded
# last-pass load in a branch after the other passes' squares (a second trip to memory a row) and
# f16's with the others; under a predicate both issue every load first.  Measured on an H200
# (bench/rows.py, time predicate / branch, bf16 and f16): RMSNorm 4096 x 10,752 0.732, 0.987;
# 8192 x 30,720 0.789, 1.005; 8192 x 17,000 0.882, 1.000; 8192 x 20,000 0.935, 1.002; causal
# softmax's odd rows 0.894 - 0.937 (2,047 - 16,383 columns, both types) but 8192 x 1,023 (two
# rows a block of 128 threads) 1.03 - 1.09.  Not the others: add + RMSNorm's odd rows 1.11,
# LayerNorm 4096 x 10,752 1.06 - 1.10, softmax 8192 x 2,047 1.04 - 1.08
PREDICATED_LOADS = {"rmsnorm": "vectors", "causal": "elements"}


def load_guard(op: str | None, plan: RowPlan, cols: int, dtype) -> str:
    """How recipe ``op``'s guarded loads on ``plan`` over rows of ``cols`` elements of ``dtype``
    are written (``RowPlan.guard``, ``done(guard=...)``): ``"predicate"`` where
    ``PREDICATED_LOADS`` names the recipe and the row is of its class — ``"vectors"``: whole
    16-byte vectors in registers on one block (no window, no cluster) whose last pass is partial;
    ``"elements"``: not a whole number of 16-byte vectors, a row a block —, else ``"branch"``."""
    rows_of = PREDICATED_LOADS.get(op)
    eb = max(1, _dtype(dtype).bits // 8)
    if rows_of == "vectors" and plan.access_bytes(dtype) == 16 and plan.alone_in_registers and cols % plan.span:
        return "predicate"
    if rows_of == "elements" and (cols * eb) % 16 and plan.rows == 1:
        return "predicate"
    return "branch"


# How a cluster's blocks hand each other a split row's statistics (to_blocks(exchange=...)), by
# recipe: "barrier" (barrier.cluster, then each block loads the others' parts) where the row is of
# 16-byte vectors, for the recipes named here; "push" (st.async into every block's shared memory,
# an mbarrier an exchange) elsewhere.  RMSNorm's one f32 sum a block: measured on an H200
# (bench/rows.py --exchange push,barrier, time barrier / push), bf16 8192 x 24,576 0.864, 28,672
# 0.940, 4096 x 36,864 0.912, 53,248 - 90,112 0.997 - 1.003, 2048 x 114,688 0.967, 122,880 0.953,
# 131,072 0.946, 1024 x 150,000 0.968, 240,000 0.966, 262,144 0.969; f16 131,072 0.942, 262,144
# 0.980; f32 8192 x 12,288 0.937, 4096 x 22,528 0.959, 36,864 0.928, 2048 x 65,536 0.947, 98,304
# 0.941, 1024 x 131,072 0.955, 200,000 0.962; but its odd rows (element accesses) 1.03 - 1.08
# (8192 x 25,002, 2048 x 65,537, 2048 x 100,003, 1024 x 200,003).  Not the others: LayerNorm's and
# softmax's tuples 1.00 - 1.15 at 20,480 - 262,144 columns, add + RMSNorm 0.98 - 1.07, causal
# softmax 1.00 - 1.04
BARRIER_EXCHANGE = ("rmsnorm",)


# f32 rows of accesses narrower than 16 bytes (at most the widest bytes named: 4, odd rows; 8,
# odd rows and rows of 2 mod 4 columns) from the first to the last columns named here wait in
# shared memory in their aligned window (row_plan(f32_staged_window=)), on blocks of
# F32_WINDOW_THREADS threads (whole warps: window_warps), as many an SM as fit up to
# STAGED_WINDOW_BLOCKS, else one alone, instead of one block of element accesses in registers or
# a cluster of element copies.  Measured on an H200: first softmax's plans by hand
# (bench/row_plans.py --dtype f32 --row-memory RF,SH; TB/s against the element plan, torch in
# brackets): 4096 x 20001 3.92 (512 threads two an SM) against 2.52 (2.80), 8192 x 12287 3.97
# against 2.39 (2.34), 4096 x 32767 3.52 (1,024 threads alone) against 2.71 (2.58); then every
# recipe's plans against the tree before (bench/rows.py --old, 8,193 - 32,767 columns, time new /
# old): softmax 0.577 - 0.764, causal softmax 0.546 - 0.683 (32,767: 0.990), RMSNorm 0.744 -
# 0.925, LayerNorm 0.504 - 0.876 on two blocks an SM (alone at 32,767 2.44 TB/s, where its cluster
# of aligned windows reads 2.73: it stops at 28,001), add + RMSNorm 0.765 - 0.901 on odd rows
# (its rows of 2 mod 4 columns 1.106: 4096 x 16382 3.67 -> 3.32 TB/s, kept as before)
F32_STAGED_WINDOWS = {"softmax": (8193, 32767, 8), "causal": (8193, 32767, 8), "layernorm": (8193, 28001, 8),
                      "rmsnorm": (8193, 32767, 8), "add_rmsnorm": (8193, 32767, 4)}
F32_WINDOW_THREADS = 512

# The longest f32 odd row (columns) each recipe takes on a cluster of aligned windows
# (row_plan(f32_cluster_windows=), rows.cluster_windows) instead of a cluster of element copies.
# Measured on an H200 (bench/rows.py --old, time windows / element copies): LayerNorm 4096 x
# 32,767 0.466, 2048 x 65,537 0.614, 1024 x 100,003 0.703, 131,071 0.477; softmax 0.790 - 0.909 and
# causal softmax 0.649 - 0.759 at 65,537 - 131,071 (where their rows take clusters); RMSNorm 8192 x
# 12,287 0.882 and 4096 x 20,001 0.889 but 1.029 - 1.101 from 32,767 (add + RMSNorm 0.890 at
# 20,001, 1.007 - 1.136 from 32,767): four-byte element copies cost those two less than the
# windows' idle last pass
F32_CLUSTER_WINDOWS = {"layernorm": 1 << 30, "softmax": 1 << 30, "causal": 1 << 30, "rmsnorm": 24575,
                       "add_rmsnorm": 24575}


def cluster_exchange(op: str | None, plan: RowPlan, dtype) -> str:
    """How recipe ``op``'s cluster on ``plan`` over rows of ``dtype`` combines its blocks'
    statistics (``RowPlan.exchange``, ``to_blocks(exchange=...)``):
    ``"barrier"`` where ``BARRIER_EXCHANGE`` names the recipe and the row is whole 16-byte vectors
    split over a cluster, else ``"push"`` (an odd row's aligned windows on a cluster too: RMSNorm
    2048 x 131,071 bf16 3.17 TB/s pushing, 3.07 at the barrier, on an H200)."""
    if op in BARRIER_EXCHANGE and plan.cluster > 1 and plan.access_bytes(dtype) == 16 and not plan.aligned:
        return "barrier"
    return "push"


# blocks an SM a row of 16-byte vectors on 512 threads whose last pass is partial asks for, by
# recipe and type (row_plan's partial_pass_blocks): at two (64 registers a thread) add + RMSNorm
# f16 spilled 96 bytes at 13,312 and 15,360 columns (512 x 4), at one it takes 84 registers.
# Measured on an H200 (bench/row_plans.py, 8192 rows): 4.02 and 4.14 TB/s against 3.66 and 3.65
# spilling (1,024 threads x 2: 3.94, 4.09)
PARTIAL_PASS_BLOCKS = {("add_rmsnorm", "f16"): 1}


# 16-bit rows of 2 mod 4 columns (pairs) in add + RMSNorm wait in shared memory from this many
# pairs a thread of one block (row_plan's odd_values): in registers the f16 kernel spilled 32-120
# bytes a thread from 20,482 columns (sm_90a and sm_80)
ADD_RMSNORM_STAGED_PAIRS = 8


def measured_plan_args(op: str, cols: int, dtype, clusters: bool, rows: int | None = None) -> dict:
    """The ``row_plan`` arguments the measurements above choose for recipe ``op`` (``rmsnorm``,
    ``add_rmsnorm``, ``layernorm``, ``softmax``, ``causal``) on a row of ``cols`` elements of
    ``dtype`` for a target with or without ``clusters``: ``align`` (``aligned_faster``),
    ``element_values`` (``odd_row_values``), ``element_min_threads`` (``ODD_ROWS_SHARE_BLOCKS``,
    ``SHORT_ROWS_SHARE_THREADS``), the ``half_block_values`` of causal softmax, LayerNorm
    and RMSNorm (``HALF_BLOCK_VALUES``) and the ``half_block_vectors`` of LayerNorm, RMSNorm and
    softmax (``HALF_BLOCK_VECTORS``), the ``odd_values`` of RMSNorm's staged odd rows
    (``STAGED_ODD_VALUES``) and add + RMSNorm's pairs (``ADD_RMSNORM_STAGED_PAIRS``),
    ``staged_window`` (``staged_window_faster``) and, on sm_90a, its blocks' threads
    (``STAGED_WINDOW_WIDE``), ``partial_pass_blocks``
    (``PARTIAL_PASS_BLOCKS``) and, on sm_90a, the persistent staged windows of
    ``PERSISTENT_WINDOW_COLS`` (``persistent_window_blocks``, ``row_operands``), and those of a
    warp a row of ``PERSISTENT_WARP_WINDOWS`` where there are ``rows`` enough (None: as many as
    it takes), the short rows of narrow accesses of ``SHORT_NARROW_COLS``
    (``short_narrow_cols``, ``short_narrow_bytes``) and the longer ones of ``narrow_block``
    (``narrow_block``)."""
    eb = max(1, _dtype(dtype).bits // 8)
    args = {"align": aligned_faster(op, cols, clusters), "element_values": odd_row_values(op, cols, dtype),
            "staged_window": staged_window_faster(op, cols),
            "staged_window_blocks": STAGED_WINDOW_BLOCKS_BY_OP.get(op, STAGED_WINDOW_BLOCKS),
            "element_min_threads": MIN_BLOCK_THREADS if op in ODD_ROWS_SHARE_BLOCKS else 0,
            "stage_one_block": op in STAGE_ONE_BLOCK, "staged_block_threads": STAGE_ONE_BLOCK.get(op, MAX_THREADS),
            "staged_block_values": STAGED_BLOCK_VALUES.get(op, 0)}
    narrow16, narrow32, widest = SHORT_NARROW_COLS.get(op, (0, 0, 0))
    args.update(short_narrow_cols=narrow16 if eb == 2 else narrow32, short_narrow_bytes=widest)
    args["narrow_block"] = narrow_block(op, cols, dtype, rows)
    wide = [threads for start, threads in STAGED_WINDOW_WIDE.get(op, ()) if cols >= start]
    if clusters and args["staged_window"] and wide:
        # (measured on sm_90a only)
        args["staged_window_threads"] = wide[-1]
    if clusters and args["staged_window"] and op in STAGED_WINDOW_ALONE:
        # (measured on sm_90a only)
        args["staged_window_alone_threads"] = STAGED_WINDOW_ALONE[op]
    upto, threads = SHORT_ROWS_SHARE_THREADS.get(op, (0, 0))
    if cols <= upto:
        args["element_min_threads"] = threads
    if op in HALF_BLOCK_VALUES and eb == 2 and (clusters or op == "causal"):
        # (the norms' on sm_90a, where measured: compiled for sm_80, LayerNorm f16 spilled 8 bytes)
        args["half_block_values"] = HALF_BLOCK_VALUES[op]
    if op in HALF_BLOCK_VECTORS and eb == 2 and clusters:
        # (measured on sm_90a only)
        args["half_block_vectors"] = HALF_BLOCK_VECTORS[op]
    if op in STAGED_ODD_VALUES and clusters:
        args["odd_values"] = STAGED_ODD_VALUES[op]
    if eb == 4 and op in F32_CLUSTER_WINDOWS:
        args["f32_cluster_windows"] = F32_CLUSTER_WINDOWS[op]
    if eb == 4 and op in F32_STAGED_WINDOWS and clusters:
        # (measured on sm_90a only)
        args["f32_staged_window"] = F32_STAGED_WINDOWS[op]
    if (op, str(_dtype(dtype))) in PARTIAL_PASS_BLOCKS:
        args["partial_pass_blocks"] = PARTIAL_PASS_BLOCKS[op, str(_dtype(dtype))]
    if op == "add_rmsnorm" and eb == 2 and cols % 4 == 2:
        args["odd_values"] = ADD_RMSNORM_STAGED_PAIRS
    lo, hi, threads, per_sm, fewest = PERSISTENT_WARP_WINDOWS.get(op, (0, -1, (), 0, 0))
    if clusters and lo <= cols <= hi and (rows is None or rows >= fewest):
        # (measured on sm_90a only)
        lanes = fuller_window_threads(cols, threads)
        args.update(staged_window=True, persistent_window_blocks=per_sm // lanes, row_operands=ROW_OPERANDS[op],
                    persistent_window_threads=lanes, tile_stages=2)
        return args
    lo, hi = PERSISTENT_WINDOW_COLS.get(op, (0, -1))
    if clusters and lo <= cols <= hi:
        # (measured on sm_90a only)
        args.update(staged_window=True, persistent_window_blocks=PERSISTENT_WINDOW_BLOCKS[op],
                    row_operands=ROW_OPERANDS[op])
        below, blocks, threads = PERSISTENT_SHORT_WINDOWS.get(op, (0, 0, ()))
        if cols < below:
            args.update(persistent_window_blocks=blocks, persistent_window_threads=fuller_window_threads(cols, threads))
        lo, hi = PERSISTENT_PREFETCH_COLS.get(op, (0, -1))
        wlo, whi, wide = PERSISTENT_PREFETCH_WIDE.get(op, (0, -1, ()))
        lanes = PERSISTENT_PREFETCH_THREADS
        if wlo <= cols <= whi:
            # the first block size two of whose blocks fit an SM, else the last (alone)
            lanes = next((t for t in wide if blocks_that_fit(
                persistent_window_bytes(cols, t, 2, ROW_OPERANDS[op]), SHARED_PER_SM) >= 2), wide[-1])
        if wlo <= cols <= whi or lo <= cols <= hi:
            args.update(tile_stages=2, persistent_window_threads=lanes)
            values = window_passes(cols, lanes, 8) * 8          # (the window's 16-byte chunks a thread)
            if op in TWO_REDUCTIONS and values <= TWO_REDUCTIONS[op][0]:
                # room for the deviations (exponentials) of two plain reductions (deviations_fit)
                args["persistent_window_blocks"] = min(args["persistent_window_blocks"],
                                                       deviation_blocks(lanes, values, op))
    return args


def persistent_window_bytes(cols: int, lanes: int, tile_stages: int, row_operands: int, eb: int = 2) -> int:
    """The shared memory a block of a persistent window stages (``row_plan(persistent_window_blocks=)``):
    ``tile_stages`` rows' windows of whole passes of its ``lanes`` threads over a row of ``cols``
    elements of ``eb`` bytes in 16-byte chunks, and ``row_operands`` weights' windows beside them."""
    wide = 16 // eb
    # a weight's window and the two 16-byte vectors its raw copy takes beside it
    # (lower.rules.threads._stage_window_raw)
    window = (-(-(cols + wide - 1) // wide) + 2) * wide * eb
    return tile_stages * window_passes(cols, lanes, wide) * lanes * wide * eb + row_operands * window


def window_passes(cols: int, lanes: int, wide: int) -> int:
    """The passes of ``lanes`` threads over the aligned window of a row of ``cols`` elements, ``wide``
    elements a chunk (the window holds the row and up to ``wide - 1`` elements before it)."""
    return -(-(cols + wide - 1) // (wide * lanes))


def fuller_window_threads(cols: int, threads: tuple[int, ...], wide: int = 8) -> int:
    """Of ``threads`` (block sizes), the one whose passes over a row's aligned window of ``cols``
    elements (``wide`` a chunk) leave the fewest chunks idle; the largest of those that tie::

        2,047 columns (257 chunks):  128 threads x 3 passes = 384 slots   <- fewer idle
                                     256 threads x 2 passes = 512 slots
    """
    return min(sorted(threads, reverse=True), key=lambda t: window_passes(cols, t, wide) * t)


#: a staged window whose last pass holds at most 1 / WHOLE_WARPS_IDLE of its block's threads' chunks
#: takes whole warps instead (``whole_warps``), from WHOLE_WARPS_RANGE[0] to [1] times the threads,
#: in at most WHOLE_WARPS_MORE_PASSES passes more.  Measured on an H200 (bf16, TB/s before -> after,
#: bench/README.md "Whole warps for a nearly idle last pass"): softmax 8192 x 6139 3.22 -> 3.86
#: (160 threads x 5 passes for 256 x 4), 8192 x 8191 3.56 -> 3.88; LayerNorm 4096 x 16383 2.74 ->
#: 2.89 (416 x 5 for 512 x 5), 4096 x 20479 2.92 -> 3.25; RMSNorm 4096 x 12287 3.39 -> 3.60.  Up to
#: twice the passes on fewer threads lost up to 16 % (160 x 25 for 256 x 16 at 30,751 columns).
WHOLE_WARPS_IDLE = 8
WHOLE_WARPS_RANGE = (5 / 8, 5 / 4)
WHOLE_WARPS_MORE_PASSES = 1


def whole_warps(chunks: int, lanes: int, reps: int, blocks: int = 1) -> tuple[int, int]:
    """``(lanes, reps)`` for a row of ``chunks`` accesses planned on a power-of-two block of
    ``lanes`` threads in ``reps`` passes, ``blocks`` such blocks an SM: where the last pass holds
    only a few chunks (at most ``lanes / WHOLE_WARPS_IDLE``), the whole number of warps within
    ``WHOLE_WARPS_RANGE`` of ``lanes`` whose passes take the fewest warp-passes (the most warps
    among equals), in at most ``WHOLE_WARPS_MORE_PASSES`` passes more than ``reps`` and at most
    ``MAX_THREADS_PER_SM`` threads an SM.  A pass costs every warp its instructions however few of
    its lanes hold a chunk; the block combines its warps' partial results in shared memory, any
    number of them (``lower.rules.threads.store_thread_accumulator``)::

        2,049 chunks (LayerNorm, 16,383 bf16 columns in a window):
        512 threads x 5 passes:  |################|################|################|################|#...............|
        416 threads x 5 passes:  |#############|#############|#############|#############|#############|

        80 warp-passes for 65; 2,560 chunks of shared memory a row for 2,080

    The row's shared memory never grows (fewer warp-passes hold fewer chunks)."""
    if reps < 2 or chunks - lanes * (reps - 1) > lanes // WHOLE_WARPS_IDLE:
        return lanes, reps
    lo = max(1, math.ceil(lanes * WHOLE_WARPS_RANGE[0] / 32))
    hi = min(MAX_THREADS, int(lanes * WHOLE_WARPS_RANGE[1]), MAX_THREADS_PER_SM // max(1, blocks)) // 32
    best = (lanes // 32 * reps, -(lanes // 32), lanes, reps)
    for w in range(lo, hi + 1):
        r = -(-chunks // (32 * w))
        if r <= reps + WHOLE_WARPS_MORE_PASSES:
            best = min(best, (w * r, -w, 32 * w, r))
    return best[2], best[3]


def window_warps(cols: int, lanes: int, blocks: int, wide: int = 8) -> tuple[int, int]:
    """``(threads, passes)`` of a staged window of a row of ``cols`` elements (``wide`` a chunk)
    planned on ``lanes`` threads, ``blocks`` blocks an SM: ``whole_warps`` of its chunks."""
    return whole_warps(window_passes(cols, 1, wide), lanes, window_passes(cols, lanes, wide), blocks)


def thread_registers(threads_per_sm: int) -> int:
    """The registers each of ``threads_per_sm`` resident threads may take: what the compiler caps a
    kernel at for that occupancy (``lower.transforms.specialize.launch_regs``; the register file is
    the same on every target, ``REGISTERS_PER_SM``)."""
    from ..hardware.target import SM90A
    from ..lower.transforms.specialize import launch_regs

    return launch_regs(SM90A, max(threads_per_sm, 1))


def deviation_registers(values: int, op: str = "layernorm") -> int:
    """The registers a thread of recipe ``op``'s two reductions holding ``values`` elements of its
    row takes (``TWO_REDUCTIONS``: LayerNorm's deviations, softmax's exponentials)."""
    if op not in TWO_REDUCTIONS:
        raise ValueError(f"rows.deviation_registers: op={op!r}; allowed: {', '.join(map(repr, TWO_REDUCTIONS))}")
    per, base = TWO_REDUCTIONS[op][1]
    return per * values + base


def deviation_blocks(lanes: int, values: int, op: str = "layernorm") -> int:
    """The most blocks of ``lanes`` threads an SM whose threads have the registers of
    ``deviation_registers(values, op)`` (at least 1)."""
    b = 1
    while thread_registers(lanes * (b + 1)) >= deviation_registers(values, op) and \
            lanes * (b + 1) <= MAX_THREADS_PER_SM:
        b += 1
    return b


def staged_window_faster(op: str, cols: int) -> bool:
    """Whether an odd 16-bit row of ``cols`` columns in recipe ``op`` waits in shared memory in
    its aligned window (``row_plan(staged_window=True)``): where measured faster,
    ``STAGED_WINDOW_COLS`` on (but add + RMSNorm's register windows of whole passes,
    ``STAGED_WINDOW_WHOLE_PASSES``)."""
    if op not in ODD_ROW_VALUES:
        raise ValueError(f"staged_window_faster: op={op!r}; allowed: {', '.join(ODD_ROW_VALUES)}")
    lo = STAGED_WINDOW_COLS.get(op)
    if lo is None or cols < lo:
        return False
    if op in STAGED_WINDOW_WHOLE_PASSES and cols % 2:
        regs = row_plan(1, cols, "bf16", align=True, clusters=True)
        if regs.aligned and -(-(cols + regs.vec - 1) // regs.vec) % regs.lanes == 0:
            return False
    return True


def aligned_faster(op: str, cols: int, clusters: bool = False) -> bool:
    """Whether an odd row of ``cols`` columns takes an aligned window (``row_plan(align=True)``)
    in recipe ``op`` (``rmsnorm``, ``add_rmsnorm``, ``softmax``, ``causal``, ``layernorm``) rather
    than the element plan of ``odd_row_values``: as measured, from ``ALIGN_FROM_BY_OP[op]``
    columns (``ALIGN_FROM_WITH_CLUSTERS[op]`` on a target with ``clusters``, whose staged
    cluster plans come first)."""
    if op not in ALIGN_FROM_BY_OP:
        raise ValueError(f"aligned_faster: op={op!r}; allowed: {', '.join(ALIGN_FROM_BY_OP)}")
    start = ALIGN_FROM_WITH_CLUSTERS.get(op, ALIGN_FROM_BY_OP[op]) if clusters else ALIGN_FROM_BY_OP[op]
    return start is not None and cols >= start


@attrs.frozen
class RowPlan:
    """One row-wise schedule: ``lanes`` threads per row, ``vec`` elements per access, ``reps``
    accesses per thread along the row, ``rows`` rows per block."""

    lanes: int
    vec: int
    reps: int
    rows: int
    cluster: int = 1               # blocks sharing each row (a thread-block cluster)
    part: int = 0                  # elements of the row each block of the cluster takes
    blocks_per_sm: int = 0         # the occupancy to ask for; 0: the default below
    exchange: str = "barrier"      # how a cluster's blocks combine: to_blocks(exchange=...)
    row_memory: str = "RF"         # where the row waits for its statistics: registers, or "SH"
    #                                (shared memory filled by cp.async, read back by every part)
    # a row not a whole number of 16-byte vectors long, walked in a window that starts at the
    # aligned vector holding its first element (align(c=vec)): vec is then 16 bytes of elements
    aligned: bool = False
    # a grid of as many blocks as the SMs hold at once, each walking rows (to_blocks(persistent=
    # True)); with ``aligned``, a multiple of 8 blocks whose rows keep one phase, so that a weight
    # is shifted into the window's frame once a block (rules.threads.staged_run)
    persistent: bool = False
    # rows a persistent block has in flight in shared memory: the next ``tile_stages - 1`` rows'
    # copies are issued while it computes one (pipeline(stages=...) over the tile loop;
    # row_memory "SH" and persistent only)
    tile_stages: int = 1
    # how its threads' guarded loads are written: done(guard=...) ("branch" or "predicate")
    guard: str = "branch"

    @property
    def span(self) -> int:
        """Elements of a row one pass of the block's threads covers."""
        return self.lanes * self.vec

    @property
    def threads(self) -> int:
        """Threads per block: whole warps of rows where rows share a warp (``lanes`` <= 32),
        else ``lanes`` (a block's rows on the same threads: each holds its columns of every row,
        ``part_strategies``)."""
        return max(32, self.rows * self.lanes) if self.lanes <= 32 else self.lanes

    def access_bytes(self, dtype) -> int:
        """Bytes of one of its accesses to a row of ``dtype``: 16 for a row of 16-byte vectors,
        fewer for a row whose length is not a whole number of them (element accesses)."""
        return self.vec * max(1, _dtype(dtype).bits // 8)

    @property
    def alone_in_registers(self) -> bool:
        """Whether each row waits in the registers of one block: no cluster, no aligned window, not
        a persistent grid, not staged in shared memory."""
        return self.row_memory == "RF" and self.cluster == 1 and not self.aligned and not self.persistent

    @property
    def occupancy(self) -> int:
        """Blocks each SM must hold at once: two, so that one block's loads are in flight while
        the other waits on its reductions, wherever two blocks' threads leave each thread at least
        64 registers (a 512-thread block; a 1024-thread block keeps the SM to itself)."""
        if self.blocks_per_sm:
            return self.blocks_per_sm
        return 2 if self.threads * 2 * 64 <= REGISTERS_PER_SM else 1


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def row_plan(rows: int, cols: int, dtype="f16", *, max_values: int | None = None,
             clusters: bool = False, stage: bool = False, stage_few_passes: bool = True,
             odd_values: int | None = None, shared_per_sm: int = SHARED_PER_SM, align: bool = False,
             aligned_values: int | None = None, half_block_values: int | None = None,
             half_block_vectors: tuple[int, int] | None = None,
             element_values: int | None = None, element_min_threads: int = MIN_BLOCK_THREADS,
             staged_window: bool = False, stage_one_block: bool = False, staged_block_threads: int = MAX_THREADS,
             staged_block_values: int = 0, partial_pass_blocks: int = 0,
             persistent_window_blocks: int = 0, row_operands: int = 0,
             staged_window_blocks: int = STAGED_WINDOW_BLOCKS, staged_window_threads: int = STAGED_WINDOW_THREADS,
             persistent_window_threads: int = STAGED_WINDOW_THREADS, tile_stages: int = 1,
             staged_window_alone_threads: int = 0, short_narrow_cols: int = 0,
             short_narrow_bytes: int = 8, narrow_block: tuple[int, int] | None = None,
             f32_cluster_windows: int = 0, f32_staged_window: tuple[int, int, int] | None = None) -> RowPlan:
    """The plan for ``rows`` x ``cols`` elements of ``dtype`` (see the module docstring);
    ``max_values`` caps the elements of its row one thread keeps in registers (default
    ``VALUES_IN_REGISTERS`` for the type's size; a kernel with more f32 intermediates per element
    asks for fewer); ``clusters`` (the target has them:
    sm_90a) lets a row too long for one block take a cluster of blocks; ``stage`` (the kernel can
    keep its row in shared memory: ``norms.schedule_rows(..., row=...)``) lets a cluster's parts
    wait there (``row_memory="SH"``) where they are whole passes of the block's threads, and
    (``stage_few_passes``) a row one block would hold in few or partial passes take such a
    cluster too; ``odd_values``: an odd row (element accesses) of more than that many elements a
    thread of one block (default ``ODD_VALUES``) waits in shared memory (with ``stage``): on a
    cluster (with ``clusters``) even where one block would hold it in registers, else on one block
    where its registers would hold more than that; ``shared_per_sm``: the target's shared memory
    an SM, what the staged plans' occupancy counts on; ``align``: an odd row of a 16-bit type (element
    accesses) that one block holds in registers (at least 33 vectors) walks a window that starts at
    the aligned vector holding its first element (``RowPlan.aligned``, ``align(c=vec)``) in 16-byte
    accesses, up to ``aligned_values`` elements a thread (default ``ALIGNED_VALUES``); the recipes
    ask for it where it measured faster (``aligned_faster``); ``half_block_values``: a row that one
    block would hold on 1,024 threads in fewer than four passes takes 512 threads instead (two
    blocks an SM) where that leaves at most this many elements a thread (that many less a vector
    where 512 threads' last pass is partial; causal softmax, LayerNorm and RMSNorm ask for
    ``HALF_BLOCK_VALUES``); ``half_block_vectors`` (whole, partial): first, before a cluster of
    staged parts, a row of 16-byte vectors that 1,024 threads would hold in fewer than four
    passes or with a partial last pass takes 512 threads where they hold it in at most ``whole``
    elements a thread in whole passes or ``partial`` with their last pass partial (LayerNorm,
    RMSNorm and softmax ask for ``HALF_BLOCK_VECTORS``); ``element_values``: a row of more than
    1,000 elements in accesses of 2 or 4 bytes that one block holds takes as few threads as hold it at about this many elements a
    thread (the recipes ask for ``odd_row_values``), with rows on fewer than
    ``element_min_threads`` threads sharing a block (0: a row a block); ``staged_window`` (with ``stage``): an odd
    row of a 16-bit type waits in shared memory in its aligned window, copied in 16-byte chunks,
    on one block of ``staged_window_threads`` threads (default ``STAGED_WINDOW_THREADS``; the
    recipes ask for 512 or 1,024 on their longest such rows: ``STAGED_WINDOW_WIDE``) (``RowPlan(aligned=True,
    row_memory="SH")``), where ``shared_per_sm`` holds at least two such blocks, at up to
    ``staged_window_blocks`` blocks an SM (the recipes ask for it where ``staged_window_faster``,
    causal softmax at two: ``STAGED_WINDOW_BLOCKS_BY_OP``), or where two such blocks do not fit, on
    one block of ``staged_window_alone_threads`` threads alone on its SM where it fits (0: never;
    the recipes ask for ``STAGED_WINDOW_ALONE``); ``stage_one_block`` (with ``stage``): a row of
    16-byte vectors of a 16-bit type on one block of ``MAX_THREADS`` threads waits in shared memory
    (``row_memory="SH"``) instead of registers, on one block of ``staged_block_threads`` threads
    (512: two blocks an SM, where ``shared_per_sm`` holds them) (the recipes ask for it for
    softmax and causal softmax: ``STAGE_ONE_BLOCK``); ``staged_block_values`` (with ``stage`` and
    ``clusters``): a 16-bit row of 16-byte vectors longer than one block's registers hold waits
    in shared memory on one block of ``MAX_THREADS`` threads (alone on its SM) instead of a cluster,
    where that leaves at most this many elements a thread (0: never; RMSNorm and add + RMSNorm
    ask for ``STAGED_BLOCK_VALUES``); ``partial_pass_blocks``: a row of 16-byte vectors on 512 threads
    whose last pass is partial asks for this many blocks an SM (0: ``RowPlan.occupancy``'s;
    add + RMSNorm f16 asks for one: ``PARTIAL_PASS_BLOCKS``); ``persistent_window_blocks`` (with
    ``staged_window``): the staged window goes on a persistent grid (``RowPlan.persistent``) of up
    to this many blocks an SM, as many as ``shared_per_sm`` holds with the row's window and
    ``row_operands`` windows of its weights (``persistent_window_bytes``; at least two, or one of
    at least ``ALONE_WINDOW_THREADS`` threads; the recipes ask for it where
    ``PERSISTENT_WINDOW_COLS`` says), on blocks of ``persistent_window_threads`` threads, each
    with ``tile_stages`` rows in shared memory (``RowPlan.tile_stages``: the next rows' copies in
    flight while it computes one; the recipes ask for two where ``PERSISTENT_PREFETCH_COLS`` and
    ``PERSISTENT_PREFETCH_WIDE`` say); ``short_narrow_cols``: a 16-bit or f32 row of 33 to this
    many columns in accesses of 2 to ``short_narrow_bytes`` (at most 8) bytes (a 16-bit row not a
    multiple of 8, an f32 row not a multiple of 4) takes a warp or less (``short_narrow_lanes``),
    rows sharing a block of ``MIN_BLOCK_THREADS`` (0: never; the recipes ask for
    ``SHORT_NARROW_COLS``); ``narrow_block`` = (threads, rows): a longer row of accesses narrower
    than 16 bytes takes ``threads`` threads, ``rows`` rows a block (each thread its columns of
    every row), where ``threads`` hold it in ``max_values`` a thread (None: never; the recipes ask
    for ``narrow_block(op, cols, dtype, rows)``: ``LONG_PAIRS``, ``NARROW_BLOCK_COLS``,
    ``NARROW_BLOCK_ODD``, ``NARROW_BLOCK_F32``).  A 16-bit odd row that takes a staged cluster
    with ``staged_window`` takes a cluster of aligned windows (``cluster_windows``); an f32 one
    too up to ``f32_cluster_windows`` columns (0: never; the recipes ask for
    ``F32_CLUSTER_WINDOWS``).  ``f32_staged_window`` = (first, last, widest): an f32 row of
    ``first`` to ``last`` columns in accesses of at most ``widest`` bytes (4 or 8) stages its
    window as a 16-bit one does with ``staged_window``, on ``F32_WINDOW_THREADS`` threads (None:
    never; the recipes ask for ``F32_STAGED_WINDOWS``)."""
    for name, v in (("rows", rows), ("cols", cols), ("odd_values", odd_values), ("shared_per_sm", shared_per_sm)):
        if v is None and name == "odd_values":
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"row_plan: {name} must be a positive int, got {v!r}")
    for name, v, zero in (("element_min_threads", element_min_threads, "a row a block"),
                          ("f32_cluster_windows", f32_cluster_windows, "never"),
                          ("short_narrow_cols", short_narrow_cols, "never"),
                          ("short_narrow_bytes", short_narrow_bytes, "never"),
                          ("partial_pass_blocks", partial_pass_blocks, "RowPlan.occupancy's"),
                          ("staged_block_values", staged_block_values, "clusters"),
                          ("persistent_window_blocks", persistent_window_blocks, "one row a block"),
                          ("row_operands", row_operands, "no weight"),
                          ("staged_window_blocks", staged_window_blocks, "no staged window")):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"row_plan: {name} must be an int >= 0 (0: {zero}), got {v!r}")
    for name, v in (("persistent_window_threads", persistent_window_threads),
                    ("staged_window_threads", staged_window_threads), ("staged_block_threads", staged_block_threads)):
        if v not in (32, 64, 128, 256, 512, 1024):
            raise ValueError(f"row_plan: {name}={v!r}; allowed: 32, 64, 128, 256, 512, 1024")
    if staged_window_alone_threads not in (0, 32, 64, 128, 256, 512, 1024):
        raise ValueError(f"row_plan: staged_window_alone_threads={staged_window_alone_threads!r}; allowed: 0 (never "
                         "alone), 32, 64, 128, 256, 512, 1024")
    if narrow_block is not None and not (
            isinstance(narrow_block, tuple) and len(narrow_block) == 2 and
            narrow_block[0] in (32, 64, 128, 256, 512, 1024) and
            isinstance(narrow_block[1], int) and not isinstance(narrow_block[1], bool) and narrow_block[1] >= 1):
        raise ValueError(f"row_plan: narrow_block={narrow_block!r}; allowed: None (never) or (threads a row: 32 - "
                         "1024, a power of two; rows a block >= 1)")
    if half_block_vectors is not None and not (
            isinstance(half_block_vectors, tuple) and len(half_block_vectors) == 2 and
            all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in half_block_vectors)):
        raise ValueError(f"row_plan: half_block_vectors={half_block_vectors!r}; allowed: None or a pair of positive "
                         "ints (whole, partial): the most elements a thread of 512 holds in whole passes, and with "
                         "the last pass partial")
    if isinstance(tile_stages, bool) or not isinstance(tile_stages, int) or not 1 <= tile_stages <= 4:
        raise ValueError(f"row_plan: tile_stages={tile_stages!r}; allowed: 1 (a row at a time) to 4")
    eb = max(1, _dtype(dtype).bits // 8)
    if max_values is None:
        max_values = VALUES_IN_REGISTERS[2 if eb <= 2 else 4]
    vec = 16 // eb
    while cols % vec:
        vec //= 2
    vectors = -(-cols // vec)
    longest = MAX_THREADS * max_values
    odd_values = ODD_VALUES if odd_values is None else odd_values
    if f32_staged_window is not None and not (isinstance(f32_staged_window, tuple) and len(f32_staged_window) == 3
                                              and f32_staged_window[2] in (4, 8)):
        raise ValueError(f"row_plan: f32_staged_window={f32_staged_window!r}; allowed: None or (first, last, widest) "
                         "with first and last columns and widest 4 or 8 (bytes of an access)")
    f32_window = eb == 4 and f32_staged_window is not None and vec * eb <= f32_staged_window[2] and \
        f32_staged_window[0] <= cols <= f32_staged_window[1]
    if ((vec * eb < 4 and eb == 2 and staged_window) or f32_window) and stage:
        # the row's window (align) in shared memory: its copy takes whole 16-byte chunks (an odd
        # row's element copies kept few bytes in flight: STAGED_WINDOW_COLS's measurements)
        wide = 16 // eb
        lanes = F32_WINDOW_THREADS if f32_window else staged_window_threads
        reps = window_passes(cols, lanes, wide)
        if persistent_window_blocks:
            # the weights' windows beside the row's (tile_stages of them), once a block
            # (rules.threads.staged_run)
            pl = persistent_window_threads
            pr = window_passes(cols, pl, wide)
            per_sm = min(persistent_window_blocks, MAX_THREADS_PER_SM // pl,
                         blocks_that_fit(persistent_window_bytes(cols, pl, tile_stages, row_operands, eb),
                                         shared_per_sm))
            if per_sm >= 2 or (per_sm == 1 and pl >= ALONE_WINDOW_THREADS):
                pl, pr = window_warps(cols, pl, per_sm, wide)
                return RowPlan(pl, wide, pr, 1, blocks_per_sm=per_sm, row_memory="SH", aligned=True,
                               persistent=True, tile_stages=tile_stages)
        per_sm = min(staged_window_blocks, MAX_THREADS_PER_SM // lanes,
                     blocks_that_fit(reps * lanes * wide * eb, shared_per_sm))
        if per_sm >= 2:
            lanes, reps = window_warps(cols, lanes, per_sm, wide)
            return RowPlan(lanes, wide, reps, 1, blocks_per_sm=per_sm, row_memory="SH", aligned=True)
        alone = staged_window_alone_threads
        if alone and blocks_that_fit(window_passes(cols, alone, wide) * alone * wide * eb, shared_per_sm):
            # a window two blocks do not fit: one block alone on its SM (not a cluster of element copies)
            lanes, reps = window_warps(cols, alone, 1, wide)
            return RowPlan(lanes, wide, reps, 1, blocks_per_sm=1, row_memory="SH", aligned=True)
    if vec * eb < 4 and align:
        # the row's window (align): up to 16 // eb - 1 elements of the row before and after it,
        # on as few threads as hold it at ALIGNED_VALUES a thread (or aligned_values)
        wide = 16 // eb
        windows = -(-(cols + wide - 1) // wide)
        most = min(max_values, ALIGNED_VALUES[2 if eb <= 2 else 4] if aligned_values is None else aligned_values)
        plan = _one_block(rows, windows, wide, MAX_THREADS)
        if plan.reps * wide > most and most >= wide:
            lanes = min(MAX_THREADS, _pow2_at_least(-(-windows // (most // wide))))
            plan = RowPlan(lanes, wide, -(-windows // lanes), 1)
        if windows > 32 and plan.reps * wide <= most:
            return attrs.evolve(plan, aligned=True)
    if vec * eb != 16 and stage and vectors > MAX_THREADS * min(odd_values, max_values) and \
            (clusters or vectors <= longest):
        # an odd row (element accesses) of more than ODD_VALUES elements a thread of one block
        # waits in shared memory, on a cluster of parts (on one block without clusters): in
        # registers, each element is an access of its own with its own predicate and address,
        # and such rows spilled 16-176 bytes
        # a thread (sm_90a, 32,767 to 262,143 columns).  Measured on an H100 (bf16, bench/rows.py,
        # against the rows in registers): RMSNorm 2.0-2.15 TB/s against 1.2-1.5, add + RMSNorm
        # 1.8-2.2 against 1.1-2.1, LayerNorm 1.1-1.3 against 0.7-1.5 (1.48 spilling at 32,767;
        # 1.34 against 1.19 at 16,385 without spilling: LayerNorm stages from 20 elements a
        # thread, where it starts to spill); softmax's odd rows one block holds keep their
        # registers (1.40-1.67 against 1.18-1.27 staged, no spills there)
        # without clusters (sm_80) on one block: in registers LayerNorm and add + RMSNorm spilled
        # 8-64 bytes a thread at 24,577 to 32,767 columns
        if clusters and staged_window and (eb == 2 or (eb == 4 and cols <= f32_cluster_windows)):
            # a 16-bit row (an f32 one where measured faster) on a cluster: each block's part walks
            # an aligned window of 16-byte vectors in shared memory (the plan of the row rounded up
            # to them; cluster_windows says why)
            windows = cluster_windows(cols, eb, shared_per_sm)
            if windows is not None:
                return windows
        staged = _staged_cluster(vectors, vec, eb, odd=True, sizes=STAGED_CLUSTERS if clusters else (1,),
                                 shared_per_sm=shared_per_sm)
        if staged is not None:
            return staged
    if staged_block_values and vec * eb == 16 and eb == 2 and vectors * vec > longest and clusters and stage:
        # (RMSNorm, add + RMSNorm: STAGED_BLOCK_VALUES) a 16-bit row of 16-byte vectors longer than
        # one block's registers hold waits in shared memory on one block of 1,024 threads, alone
        # on its SM, before a cluster of staged parts (f32 rows: not measured)
        passes = -(-vectors // MAX_THREADS)
        if passes * vec <= staged_block_values and blocks_that_fit(passes * MAX_THREADS * vec * eb, shared_per_sm):
            return RowPlan(MAX_THREADS, vec, passes, 1, blocks_per_sm=1, row_memory="SH")
    if vectors * vec > longest and clusters and stage:
        staged = _staged_cluster(vectors, vec, eb, shared_per_sm=shared_per_sm)
        if staged is not None:
            return staged
    if vectors * vec > longest and clusters:
        # the fewest blocks whose equal parts (whole vectors) each fit a block of the first of
        # CLUSTER_THREADS that can hold the row in a cluster of at most 8 (several blocks per SM
        # overlap one's combine with the others' loads); the parts keep the row's vector width
        # (a row's start is only that aligned).  A row one
        # block holds stays on one block: measured on an H100, an odd LayerNorm row of 32,767
        # bf16 runs at 1.51 TB/s on one block (spilling 80 bytes) and at 0.94-1.00 on clusters
        # with fewer elements per thread (no spills)
        for threads in CLUSTER_THREADS:
            for C in CLUSTERS:
                part = -(-vectors // C) * vec
                if part <= threads * max_values:
                    one = _one_block(1, part // vec, vec, threads)
                    per_sm = max(1, REGISTERS_PER_SM // (one.threads * 64))
                    return attrs.evolve(one, cluster=C, part=part, blocks_per_sm=per_sm)
    # (16-byte vectors of 16-bit or f32 values: FILL_THREADS, FILL_THREADS_F32)
    fill, fill_threads = {2: (FILL_VALUES, FILL_THREADS), 4: (FILL_VALUES_F32, FILL_THREADS_F32)}.get(eb, (0, 0)) \
        if vec * eb == 16 else (0, 0)
    plan = _one_block(rows, vectors, vec, MAX_THREADS, MIN_BLOCK_THREADS, fill_values=fill, fill_threads=fill_threads)
    if plan.lanes <= fill_threads:
        # (a plan of fewer passes than the fill allows is within max_values anyway)
        max_values = max(max_values, min(plan.reps * vec, fill))
    if short_narrow_cols and eb in (2, 4) and vec * eb <= min(8, short_narrow_bytes) and 32 < cols <= short_narrow_cols:
        # a short row of 2- to 8-byte accesses: a warp or less, SHORT_NARROW_VALUES or more
        # elements a thread, rows sharing a block (SHORT_NARROW_COLS's measurements)
        lanes = short_narrow_lanes(cols)
        # (at least a whole warp: the row's lanes combine their partial results with full-warp
        # shuffles; rows past the end of the tensor are masked)
        rows_a_block = max(32 // lanes, _rows_a_block(rows, lanes, MIN_BLOCK_THREADS))
        plan = RowPlan(lanes, vec, -(-vectors // lanes), rows_a_block)
        max_values = max(max_values, plan.reps * vec)
    elif narrow_block and vec * eb < 16 and -(-vectors // narrow_block[0]) * vec <= max_values:
        # a longer row of 2-, 4- or 8-byte accesses: a few threads' worth of rows a block
        # (narrow_block's measurements; a row longer than max_values a thread keeps the plans
        # below)
        lanes, per_block = narrow_block
        plan = RowPlan(lanes, vec, -(-vectors // lanes), _rows_a_block(rows, lanes, lanes * per_block))
    elif element_values and vec * eb <= 4 and vectors * vec > 1000:
        # a row of 2- or 4-byte accesses: more elements a thread on fewer threads (more blocks an
        # SM) than a row of 16-byte vectors takes (odd_row_values)
        # (rows on fewer than element_min_threads threads share a block, as above)
        lanes = min(MAX_THREADS, _pow2_at_least(-(-vectors // max(1, element_values // vec))))
        plan = RowPlan(lanes, vec, -(-vectors // lanes), _rows_a_block(rows, lanes, element_min_threads))
        max_values = max(max_values, element_values)
    half = MAX_THREADS // 2
    if half_block_vectors and plan.lanes == MAX_THREADS and vec * eb == 16 and \
            (plan.reps < 4 or vectors % MAX_THREADS):
        # LayerNorm's, RMSNorm's and softmax's rows of 16-byte vectors that 1024 threads would
        # hold in few passes or with a partial last pass: on half the threads, two blocks an SM,
        # before a cluster of staged parts (HALF_BLOCK_VECTORS: whole, partial)
        whole, partial = half_block_vectors
        values = -(-vectors // half) * vec
        if values <= (partial if vectors % half else whole):
            plan = RowPlan(half, vec, -(-vectors // half), 1)
            max_values = max(max_values, values)
    if clusters and stage and stage_few_passes and plan.lanes == MAX_THREADS and \
            (plan.reps < 4 or vectors % plan.lanes):
        # a row one block of 1024 threads holds in fewer than four passes, or with its last pass
        # partial, runs faster on a cluster of staged parts that are equal whole passes (measured
        # on an H100, bf16: 16384 x 20,480 softmax 2.75 against 2.19 TB/s, LayerNorm 2.87 against
        # 2.19; 16384 x 24,576 softmax 2.84 against 2.53).  Four whole passes stay on one block
        # (8192 x 32,768: LayerNorm and RMSNorm 2.98 against 2.88), and so do rows whose staged
        # parts would leave the last block short (8192 x 36,000: softmax 2.63 against 2.23).  A
        # causal row's work is uneven across its parts: it stays on one block (16384 x 24,576:
        # 2.38 staged against 2.52)
        staged = _staged_cluster(vectors, vec, eb, shared_per_sm=shared_per_sm)
        if staged is not None and staged.cluster * staged.part == vectors * vec:
            return staged
    if stage_one_block and staged_block_threads == MAX_THREADS and stage and clusters and plan.lanes == MAX_THREADS \
            and vec * eb == 16 and eb == 2 and plan.reps * vec <= max_values:
        # a 16-bit row on one block of 1024 threads waits in shared memory (softmax: its two passes
        # over the row then read shared memory, and its registers fall from 56 to 28 a thread; why
        # that is faster was not profiled).  Measured on an H200 (bf16, bench/row_plans.py): softmax 8192 x 32,768 4.09-4.10
        # TB/s against 3.33 in registers (a cluster of four staged parts 4.10, 512 threads x 64
        # staged 4.11); LayerNorm 2.88 against 3.48-3.51 in registers (not taken)
        plan = attrs.evolve(plan, row_memory="SH")
    # (a partial last pass keeps its tests in registers: one vector fewer a thread there)
    if half_block_values and plan.lanes == MAX_THREADS and plan.reps < 4 and \
            -(-vectors // half) * vec <= half_block_values - (vec if vectors % half else 0):
        # a row of 1024 threads' few passes on half the threads, two blocks an SM: while one
        # block waits on its reductions' barriers the other loads (a causal row, whose blocks
        # also differ in their work: bench/README.md)
        plan = RowPlan(half, vec, -(-vectors // half), 1)
        max_values = max(max_values, half_block_values)
    if stage_one_block and staged_block_threads < MAX_THREADS and stage and clusters and plan.lanes == MAX_THREADS \
            and plan.row_memory == "RF" and vec * eb == 16 and eb == 2 and plan.reps * vec <= max_values:
        # (causal softmax: STAGE_ONE_BLOCK) a 16-bit row that stays on 1,024 threads in registers
        # (after the half blocks above) waits in shared memory on fewer threads, two or more
        # blocks an SM
        reps = -(-vectors // staged_block_threads)
        if blocks_that_fit(reps * staged_block_threads * vec * eb, shared_per_sm) >= 2:
            plan = RowPlan(staged_block_threads, vec, reps, 1, row_memory="SH")
            max_values = max(max_values, reps * vec)
    if partial_pass_blocks and plan.lanes == MAX_THREADS // 2 and plan.cluster == 1 and vectors % plan.lanes and \
            vec * eb == 16:
        plan = attrs.evolve(plan, blocks_per_sm=partial_pass_blocks)
    if plan.reps * vec > max_values:
        most = longest * CLUSTERS[-1]
        raise ValueError(f"row_plan: a row of {cols} {_dtype(dtype)} elements does not fit in the registers of one "
                         f"block (at most {longest} here: {MAX_THREADS} threads x {max_values} elements)"
                         + (f" nor of a cluster of {CLUSTERS[-1]} blocks (at most {most})" if clusters else
                            f"; on sm_90a a thread-block cluster of up to {CLUSTERS[-1]} blocks shares longer rows "
                            f"(up to {most} elements): arch='sm_90a'"))
    return plan


def cluster_windows(cols: int, eb: int, shared_per_sm: int = SHARED_PER_SM) -> RowPlan | None:
    """The cluster plan of a row of ``cols`` elements of ``eb`` bytes that is not whole 16-byte
    vectors: the staged cluster plan of the row rounded up to them (``_staged_cluster``), each
    block's part walking an aligned window (``align(c=vec)`` under the cluster) — the part and
    the ``vec - 1`` elements before it, so one more pass of the block's threads, and the blocks an
    SM recounted for that; None where the rounded row takes no cluster.  Every part starts at the
    row's phase (a part is whole vectors), so the window's accesses are whole 16-byte vectors but
    for its first and last, where the part meets its neighbours (``lower.rules.align``)::

        row r:      |p ------------ part 0 ------------|------------ part 1 ------------| ...
        windows:  |--- block 0: part 0's, from 8q ---|..|--- block 1: part 1's ---------|..
                  (each window reaches vec - 1 elements into the next part, which it leaves to it)

    Measured on an H200 (``bench/row_plans.py --plan L,8,R,1,C,PART,a``, bf16; bench/README.md,
    "Odd rows on clusters of aligned windows"), TB/s against the element copies' cluster:
    softmax 2048 x 131,071 3.21 against 1.81 (torch 1.78), 1024 x 262,143 3.00 against 1.77 (torch
    1.81), 512 x 116,009 2.81 against 1.68; RMSNorm 3.17 / 3.02 / 2.90 against 2.42 / 2.25 / 2.34;
    LayerNorm 2.29 / 2.17 / 1.99 against 1.44 / 1.38 / 1.33."""
    wide = 16 // eb
    even = _staged_cluster(-(-cols // wide), wide, eb, shared_per_sm=shared_per_sm)
    if even is None or even.cluster == 1:
        return None
    span = even.lanes * wide
    passes = -(-(even.part + wide - 1) // span)
    per_sm = _staged_blocks_per_sm(even.lanes, passes * span * eb, shared_per_sm)
    if per_sm < 1:
        return None
    return attrs.evolve(even, reps=passes, blocks_per_sm=per_sm, aligned=True)


def _staged_blocks_per_sm(threads: int, staged_bytes: int, shared_per_sm: int) -> int:
    """Blocks of ``threads`` threads staging ``staged_bytes`` of a row part in shared memory an
    SM holds: within the registers of ``STAGED_REGISTERS`` a thread, the SM's threads and its
    shared memory."""
    return min(REGISTERS_PER_SM // (threads * STAGED_REGISTERS), MAX_THREADS_PER_SM // threads,
               blocks_that_fit(staged_bytes, shared_per_sm))


def _staged_cluster(vectors: int, vec: int, eb: int, odd: bool = False, sizes: tuple[int, ...] = STAGED_CLUSTERS,
                    shared_per_sm: int = SHARED_PER_SM) -> RowPlan | None:
    """A cluster plan whose parts wait in shared memory: of the blocks of ``CLUSTER_THREADS``
    threads and clusters of ``STAGED_CLUSTERS`` blocks whose parts, rounded up to whole passes of
    the block's threads, hold at most ``STAGED_VALUES`` elements a thread (``STAGED_VALUES_LONG``
    on the fewest threads for a row no cluster of those holds at that) and leave the last
    block part of the row, the one of the least estimated cost (then the fewest threads, then
    the smallest cluster): ``C x (part + BLOCK_COST x threads)`` — a cluster takes as long as its
    full blocks, and each block costs its exchange and launch besides its part.

    Whole passes, not equal parts: the last block's part may stop short (its copy zero-fills past
    the row, its reductions stop at the row's end).  Equal parts in buffers padded to whole
    passes (``place(..., pad=)``, every block's last pass partial) measured slower on an H100
    (bf16, 4096 x 50,000 to 2048 x 100,000: LayerNorm 2.28-2.45 against 2.45-2.64 TB/s, RMSNorm
    2.69-2.76 against 2.79-2.87).  None for rows of other than 16-byte vectors unless ``odd`` (an
    odd row: its copy into shared memory goes element by element, a batch of loads in flight a
    thread, ``lower.rules.copies``).  ``sizes``: the cluster sizes to consider (1: one block);
    ``shared_per_sm``: the target's shared memory an SM."""
    if vec * eb != 16 and not odd:
        return None
    best = None
    fewest = CLUSTER_THREADS[0]
    # (16-byte vectors, and parts of which three blocks fit an SM, as measured)
    long_row = vec * eb == 16 and -(-vectors // max(sizes)) > fewest * (STAGED_VALUES // vec) and \
        blocks_that_fit(fewest * STAGED_VALUES_LONG * eb, shared_per_sm) >= 3
    for threads in CLUSTER_THREADS:
        most = STAGED_VALUES_LONG if long_row and threads == fewest else STAGED_VALUES
        for C in sizes:
            per = -(-vectors // C)                   # vectors of an equal part
            passes = -(-per // threads)
            part = passes * threads * vec
            if passes * vec > most or (C - 1) * part >= vectors * vec:
                continue
            key = (C * (part + BLOCK_COST * threads), threads, C)
            if best is None or key < best[0]:
                best = (key, threads, C, passes, part)
    if best is None:
        return None
    _, threads, C, passes, part = best
    per_sm = _staged_blocks_per_sm(threads, part * eb, shared_per_sm)
    return RowPlan(threads, vec, passes, 1, cluster=C, part=part if C > 1 else 0, blocks_per_sm=max(1, per_sm),
                   row_memory="SH")


def _one_block(rows: int, vectors: int, vec: int, max_threads: int, min_threads: int = 0,
               fill_values: int = 0, fill_threads: int = FILL_THREADS) -> RowPlan:
    """The plan of rows of ``vectors`` accesses of ``vec`` elements on blocks of at most
    ``max_threads`` threads (``reps`` may exceed what fits in registers: the caller checks); a
    row on fewer than ``min_threads`` threads in one pass shares its block with other rows (as
    many as make ``min_threads``, at most the tensor's rows rounded up to a power of two);
    ``fill_values``: a row of more than 32 accesses may instead take the power-of-two threads,
    64 to ``fill_threads``, whose passes leave the fewest of them idle, at up to this many
    elements a thread (``_fewest_idle``)."""
    if vectors <= 32:
        lanes = _pow2_at_least(vectors)
        per_warp = 32 // lanes
        rows_per_block = per_warp * WARPS_FOR_SHORT_ROWS
        # at least a whole warp: the row's lanes combine their partial results with full-warp
        # shuffles (rows past the end of the tensor are masked)
        return RowPlan(lanes, vec, 1, max(per_warp, min(rows_per_block, _pow2_at_least(rows))))
    # more elements per thread on longer rows: fewer threads per row leave room for more blocks
    # (rows) per SM, whose loads overlap the others' reductions and barriers (measured on an H100:
    # softmax over 16,384 columns went from 1.8 to ... TB/s with 32 elements per thread instead of 16)
    reps = 1 if vectors <= 256 else 2 if vectors <= 512 else 4
    lanes = min(max_threads, _pow2_at_least(-(-vectors // reps)))
    reps = -(-vectors // lanes)
    if fill_values:
        lanes, reps = _fewest_idle(vectors, lanes, reps, min(max_threads, fill_threads), fill_values // vec)
    return RowPlan(lanes, vec, reps, _rows_a_block(rows, lanes, min_threads) if reps == 1 else 1)


def _rows_a_block(rows: int, lanes: int, min_threads: int) -> int:
    """Rows a block of rows on ``lanes`` threads takes so that it holds ``min_threads`` threads'
    worth of rows, at most the tensor's ``rows`` rounded up to a power of two, at least one."""
    return max(1, min(min_threads // lanes, _pow2_at_least(rows)))


def _fewest_idle(vectors: int, lanes: int, reps: int, most_lanes: int, most_reps: int) -> tuple[int, int]:
    """``(lanes, reps)``: of the power-of-two thread counts from 64 to ``most_lanes`` whose passes
    cover ``vectors`` accesses in at most ``most_reps`` each (one fewer where the last pass is
    partial), the one that leaves the fewest slots idle (``lanes x reps - vectors``), then the
    most threads; the given ``lanes, reps`` where none leaves fewer idle than they do (a row of
    1,024 f32 vectors keeps 256 x 4, not 512 x 2).  A row of 2,560 columns of 16-bit values (320
    vectors) takes 64 threads x 5 instead of 256 x 2, whose second pass ran three quarters idle::

        256 x 2:  pass 0 |################################|   pass 1 |########........................|
        64 x 5:   passes 0-4 |########| x 5, every slot a vector
    """
    best = (lanes * reps - vectors, 0, -lanes, lanes, reps)      # (the given plan first among equals)
    # (from 64: a row of a warp keeps a block of its own here, and a block of 32 threads starts
    # as slowly as MIN_BLOCK_THREADS says; 65536 x 768 on warps of a row each, eight rows a
    # block, read 0.99-1.05 of 128 threads x 1, two rows a block)
    n = 64
    while n <= most_lanes:
        r = -(-vectors // n)
        # (a partial last pass keeps its edge tests in registers: one vector fewer a thread there;
        # add + RMSNorm f16 at 13,312 columns on 256 x 7 spilled 16 bytes)
        if r <= most_reps - (1 if vectors % n else 0):
            best = min(best, (n * r - vectors, 1, -n, n, r))
        n *= 2
    return best[3], best[4]


def deviations_fit(plan: RowPlan, op: str = "layernorm") -> bool:
    """Whether recipe ``op`` (``layernorm``, ``softmax``) on ``plan`` takes its statistics in two
    plain reductions, LayerNorm's deviations from the mean (softmax's exponentials) kept in
    registers, though its row waits in shared memory: a persistent block with the next rows in
    flight (``tile_stages`` > 1), beside at least one other block on its SM (``TWO_REDUCTIONS_BLOCKS``),
    whose threads each hold at most ``TWO_REDUCTIONS[op][0]`` elements of the row and have the
    registers for them beside the SM's other blocks (``deviation_registers``, ``thread_registers``)."""
    if op not in TWO_REDUCTIONS:
        raise ValueError(f"rows.deviations_fit: op={op!r}; allowed: {', '.join(map(repr, TWO_REDUCTIONS))}")
    values = plan.reps * plan.vec
    most = TWO_REDUCTIONS[op][0]
    return plan.row_memory == "SH" and plan.cluster == 1 and plan.tile_stages > 1 and \
        plan.blocks_per_sm >= TWO_REDUCTIONS_BLOCKS and values <= most and \
        thread_registers(plan.lanes * plan.rows * plan.blocks_per_sm) >= deviation_registers(values, op)


def wide_tuple(plan: RowPlan, op: str, dtype, cols: int) -> bool:
    """Whether recipe ``op``'s statistics on ``plan`` are one tuple reduction although its row of
    ``cols`` elements waits in registers: a row of 16-byte vectors of a 16-bit ``dtype`` alone on
    one block of at least ``TUPLE_THREADS[op]`` threads (no cluster, no window, not persistent), where
    the block's warps exchange once instead of twice, but not on 1,024 threads whose last pass is
    partial (False for other recipes: ``TUPLE_THREADS``)."""
    least = TUPLE_THREADS.get(op)
    return least is not None and _dtype(dtype).bits == 16 and plan.access_bytes(dtype) == 16 and plan.rows == 1 and \
        plan.alone_in_registers and plan.lanes >= least and (plan.lanes < MAX_THREADS or cols == plan.span * plan.reps)


def one_pass(plan: RowPlan) -> bool:
    """Whether a kernel on ``plan`` takes its statistics in one tuple reduction and writes its
    output in one pass from the row: a row split over a cluster (one exchange between the blocks)
    or waiting in shared memory (no f32 copy of the row in registers between the parts)."""
    return plan.cluster > 1 or plan.row_memory == "SH"


def kernel_strategies(plan: RowPlan) -> list:
    """The block tiling of a row kernel: ``plan.rows`` rows per block, or each row split into
    ``plan.cluster`` parts of ``plan.part`` elements on the blocks of a cluster (``plan.rows``
    rows' parts a block: a weight's part, loaded once, serves all of them); an ``aligned`` plan's
    row walks the window of ``align(c=plan.vec)`` (on a cluster each block's part a window of its
    own: ``cluster_windows``)."""
    if plan.cluster > 1:
        blocks = tile(r=plan.rows, c=plan.part) >> to_blocks(cluster=plan.cluster, occupancy=plan.occupancy,
                                                             exchange=plan.exchange, persistent=plan.persistent)
        return [blocks >> align(c=plan.vec) if plan.aligned else blocks]
    blocks = to_blocks(occupancy=plan.occupancy, persistent=plan.persistent)
    if plan.aligned:
        return [tile(r=plan.rows) >> blocks >> align(c=plan.vec)]
    return [tile(r=plan.rows) >> blocks]


def part_strategies(plan: RowPlan, *, walk_row: bool = True) -> tuple:
    """The strategies of one part of a fused row kernel, at the block level::

        rows share a warp (lanes <= 32):    tile(r=32/lanes) >> to_warps(), tile(c=span),
                                            tile(r=1, c=vec) >> to_threads(), done()
        a row per block:                    tile(c=span), tile(c=vec) >> to_threads(), done()

    ``tile(c=span)`` walks the row in passes of the block's threads (in a ``Reduce`` it also
    creates the accumulator: each thread folds its elements, and the store combines the threads'
    partial results); ``walk_row=False`` leaves it out for a part without the ``c`` dim (a
    per-row statistic)."""
    out: list = []
    if plan.lanes <= 32 and plan.rows > 1:
        out.append(tile(r=32 // plan.lanes) >> to_warps())
        if walk_row:
            out += [tile(c=plan.span), tile(r=1, c=plan.vec) >> to_threads()]
        else:
            out.append(tile(r=1) >> to_threads())
    else:
        out += [tile(c=plan.span), tile(c=plan.vec) >> to_threads()]
    out.append(done(guard=plan.guard))
    return tuple(out)
