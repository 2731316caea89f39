"""The row recipes on the GPU against torch in float32: fixed odd shapes, cols = 1, rows with
large magnitudes, random shapes up to 32,768 columns in fp16 and bf16, and rows of up to 262,144
columns on thread-block clusters."""

from __future__ import annotations

import random

import pytest

import firesched as fs

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TDT = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def _run(op, rows, cols, dtype, magnitude=1.0, shift=0.0, exchange="barrier", arch="sm_90a", plan=None):
    dt = TDT[dtype]
    F = torch.nn.functional
    k = fs.compile(getattr(fs.recipes, op)(rows, cols, dtype=dtype, arch=arch, exchange=exchange, plan=plan),
                   arch=arch)
    x = (torch.randn(rows, cols, device="cuda") * magnitude + shift).to(dt)
    w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
    outs = [torch.full((rows, cols), float("nan"), device="cuda", dtype=dt) for _ in range(2 if op == "add_rmsnorm" else 1)]
    if op == "rmsnorm":
        k(x, w, *outs)
        refs = [F.rms_norm(x.float(), (cols,), w.float(), 1e-6)]
    elif op == "layernorm":
        k(x, w, b, *outs)
        refs = [F.layer_norm(x.float(), (cols,), w.float(), b.float(), 1e-5)]
    elif op == "add_rmsnorm":
        r = torch.randn(rows, cols, device="cuda", dtype=dt)
        k(x, r, w, *outs)
        h = (x + r).float()
        refs = [F.rms_norm(h, (cols,), w.float(), 1e-6), h]
    else:
        k(x, *outs)
        refs = [torch.softmax(x.float(), dim=-1)]
    torch.cuda.synchronize()
    for o, ref in zip(outs, refs):
        assert torch.isfinite(o.float()).all(), (op, rows, cols, dtype)
        err = ((o.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
        assert err < (1e-2 if dtype == "f16" else 3e-2), (op, rows, cols, dtype, err)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("rows, cols", [(1, 1), (37, 1), (33, 100), (5, 1001), (64, 256), (7, 4096), (3, 32768)])
def test_row_recipes_match_torch(op, rows, cols):
    _run(op, rows, cols, "bf16")


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("rows, cols", [(7, 1536), (5, 2560), (3, 3584), (2, 4104), (3, 7168), (2, 14336)])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_rows_of_passes_that_fill_their_threads(op, rows, cols, dtype):
    # vectors not a power of two: 64 to 256 threads of up to 7 passes (rows.FILL_THREADS)
    assert fs.recipes.rows.row_plan(rows, cols, dtype).lanes <= 256
    _run(op, rows, cols, dtype)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("rows, cols", [(5, 1536), (3, 2560), (2, 5120), (2, 10240), (2, 14336), (3, 4100)])
def test_f32_rows_of_passes_that_fill_their_threads(op, rows, cols):
    # f32: up to 512 threads x 7 passes (rows.FILL_THREADS_F32; 4,100 columns on 256 x 5: the last pass partial)
    _run(op, rows, cols, "f32")


@pytest.mark.parametrize("cols", [13312, 15360])
def test_add_rmsnorm_partial_passes_on_one_block_an_sm(cols):
    # 512 threads x 4, the last pass partial: f16 spilled at two blocks an SM (rows.PARTIAL_PASS_BLOCKS)
    assert "occupancy" not in repr(fs.recipes.add_rmsnorm(1000, cols, dtype="f16", arch="sm_90a").strategies[0])
    _run("add_rmsnorm", 3, cols, "f16")


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax"])
def test_large_magnitudes(op):
    _run(op, 64, 2048, "f16", magnitude=3000.0)


@pytest.mark.parametrize("seed", range(16))
def test_random_row_shapes(seed):
    rnd = random.Random(seed)
    op = rnd.choice(["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
    _run(op, rnd.randint(1, 300), rnd.choice([rnd.randint(1, 2000), 2 ** rnd.randint(3, 15)]), rnd.choice(["f16", "bf16"]))


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("rows, cols", [(3, 40961), (5, 65536), (2, 100003), (4, 262144), (1, 262143)])
def test_long_rows_on_clusters(op, rows, cols):
    # one block holds up to 40,960 values of a 16-bit row (40 a thread); beyond, clusters
    assert fs.recipes.rows.row_plan(rows, cols, "bf16", clusters=True).cluster > 1
    _run(op, rows, cols, "bf16")


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("rows, cols", [(3, 32769), (5, 40960), (2, 40000), (3, 20000), (2, 16392)])
def test_long_rows_on_one_block(op, rows, cols):
    assert fs.recipes.rows.row_plan(rows, cols, "bf16", clusters=True).cluster == 1 or op == "add_rmsnorm"
    _run(op, rows, cols, "bf16")


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax"])
@pytest.mark.parametrize("shift", [0.0, -3000.0])
@pytest.mark.parametrize("rows, cols, dtype", [(5, 20480, "bf16"), (3, 22528, "f16"), (7, 26624, "bf16"),
                                               (4, 30720, "f16"), (3, 24568, "bf16"), (2, 16384, "f16"),
                                               (3, 32768, "bf16")])
def test_rows_on_half_blocks_and_wide_tuples(op, shift, rows, cols, dtype):
    # the plans of rows.HALF_BLOCK_VECTORS (512 threads, two blocks an SM, where 1,024 threads' last
    # pass would be partial) and LayerNorm's Welford tuple on blocks of 512 and 1,024 threads
    # (rows.wide_tuple), on rows of a large mean
    _run(op, rows, cols, dtype, shift=shift)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax"])
def test_long_rows_large_magnitudes(op):
    _run(op, 8, 131072, "f16", magnitude=3000.0)


@pytest.mark.parametrize("op", ["layernorm", "softmax"])
@pytest.mark.parametrize("shift", [3000.0, -3000.0])
@pytest.mark.parametrize("rows, cols", [(3, 40961), (2, 100003), (1, 262143)])
def test_long_odd_rows_of_a_large_mean(op, shift, rows, cols):
    # the last block of the cluster holds fewer elements than the others: its padding must count
    # in no statistic (a maximum of rows near -3000 lies below padding zeros), and the tuple
    # reductions (softmax's (max, sum), LayerNorm's Welford tuple) merge the parts in one exchange
    _run(op, rows, cols, "f16", magnitude=3.0, shift=shift)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("rows, cols", [(3, 40961), (5, 65536), (2, 100003), (4, 262144), (1, 262143)])
def test_long_rows_with_pushes(op, rows, cols):
    # to_blocks(exchange="push"): st.async into every block's shared memory and an mbarrier
    # instead of barrier.cluster
    _run(op, rows, cols, "bf16", exchange="push")


@pytest.mark.parametrize("op", ["layernorm", "softmax"])
@pytest.mark.parametrize("shift", [3000.0, -3000.0])
def test_pushes_on_rows_of_a_large_mean(op, shift):
    _run(op, 3, 100003, "f16", magnitude=3.0, shift=shift, exchange="push")


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("shift", [0.0, -3000.0])
@pytest.mark.parametrize("rows, cols", [(3, 65536), (2, 50000), (5, 20480), (3, 24576), (2, 100000), (1, 200000),
                                        (4, 40961), (3, 32769), (2, 50001), (1, 131071)])
def test_rows_staged_in_shared_memory(op, shift, rows, cols):
    # cluster parts copied into shared memory (cp.async); 50,000 / 100,000 / 200,000: the last
    # block's part stops short of its buffer (zero-filled past the row, where a maximum of rows
    # near -3000 must not see the zeros); 20,480 / 24,576: rows one block holds, on two parts;
    # odd rows longer than one block's registers hold (32,769 to 131,071): on clusters copied
    # element by element through registers, or up to about 57,000 columns on one block in
    # their aligned window (16-byte chunks)
    assert fs.recipes.rows.row_plan(rows, cols, "bf16", clusters=True, stage=True).row_memory == "SH"
    _run(op, rows, cols, "f16", magnitude=3.0, shift=shift, exchange="push")


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax", "add_rmsnorm"])
@pytest.mark.parametrize("shift", [0.0, -3000.0])
@pytest.mark.parametrize("rows, cols, dtype, arch", [(9, 6001, "bf16", "sm_90a"), (5, 8191, "f16", "sm_90a"),
                                                     (8, 16383, "bf16", "sm_90a"), (3, 24569, "f16", "sm_90a"),
                                                     (2, 40959, "bf16", "sm_90a"), (1, 12289, "f16", "sm_90a"),
                                                     (7, 20481, "bf16", "sm_80"), (11, 4095, "bf16", "sm_90a")])
def test_odd_rows_staged_in_their_window(op, shift, rows, cols, dtype, arch):
    # odd 16-bit rows whose aligned window waits in shared memory (the recipes' default from 4,096
    # to 8,000 columns on, rows.staged_window_faster; given here for every op and length): copied
    # in 16-byte cp.async chunks whose first reads the row before's last elements and whose last
    # reads up to the row's end (src-size; past the tensor's end on the last row), add + RMSNorm's
    # sum stored there by its threads, the weight's runs shifted out of its aligned vectors;
    # outputs start as NaN, rows of a large mean see no zero-filled element
    from firesched.hardware.target import target

    plan = fs.recipes.rows.row_plan(rows, cols, dtype, stage=True, staged_window=True,
                                    shared_per_sm=target(arch).smem_per_sm)
    assert plan.aligned and plan.row_memory == "SH", plan
    _run(op, rows, cols, dtype, magnitude=3.0, shift=shift, arch=arch, plan=plan)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax", "add_rmsnorm"])
@pytest.mark.parametrize("shift", [0.0, -3000.0])
@pytest.mark.parametrize("rows, cols, dtype, blocks", [(2500, 4095, "bf16", 8), (1500, 6001, "f16", 4),
                                                       (900, 8191, "bf16", 4), (5, 4097, "f16", 8),
                                                       (700, 9999, "bf16", 2), (1100, 4097, "f16", 6)])
def test_odd_rows_on_a_persistent_grid(op, shift, rows, cols, dtype, blocks):
    # odd 16-bit rows in their staged window on a persistent grid (the recipes' default for RMSNorm,
    # LayerNorm and add + RMSNorm at some lengths, rows.PERSISTENT_WINDOW_COLS; given here for every
    # op): a multiple of 8 blocks, each walking rows of one phase, more rows than blocks (but the
    # 5 rows), the weights shifted into the window once a block; outputs start as NaN
    plan = fs.recipes.rows.row_plan(rows, cols, dtype, stage=True, staged_window=True,
                                    persistent_window_blocks=blocks, row_operands=2)
    assert plan.persistent and plan.aligned and plan.row_memory == "SH", plan
    _run(op, rows, cols, dtype, magnitude=3.0, shift=shift, plan=plan)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("rows, cols, dtype", [(3000, 4095, "bf16"), (1200, 8191, "f16"), (600, 9999, "bf16"),
                                               (1500, 6001, "f16"), (2100, 3001, "bf16"), (1900, 2047, "f16"),
                                               (2500, 1535, "bf16"), (1000, 3583, "f16"), (700, 10001, "f16"),
                                               (400, 14335, "bf16"), (300, 20479, "f16"), (250, 24569, "bf16")])
def test_the_recipes_persistent_windows(op, rows, cols, dtype):
    _run(op, rows, cols, dtype, magnitude=3.0)


WARP_WINDOWS = [(op, rows, cols, dtype) for op in ("rmsnorm", "layernorm", "softmax")
                for rows, cols, dtype in [(8192, 1023, "bf16"), (8200, 1279, "f16"), (9001, 1001, "bf16"),
                                          (8192, 1499, "f16"), (8192, 1151, "f16"), (8300, 1535, "bf16"),
                                          (9000, 1407, "bf16"), (8192, 1699, "f16")]
                if fs.recipes.rows.PERSISTENT_WARP_WINDOWS[op][0] <= cols <= fs.recipes.rows.PERSISTENT_WARP_WINDOWS[op][1]]


@pytest.mark.parametrize("op, rows, cols, dtype", WARP_WINDOWS)
@pytest.mark.parametrize("shift", [0.0, -3000.0])
def test_the_recipes_warp_windows(op, rows, cols, dtype, shift):
    # short odd rows from 8,192 rows: a warp (or two) a row on a persistent grid, many blocks an SM,
    # the next row in flight (rows.PERSISTENT_WARP_WINDOWS)
    plan = fs.recipes.norms.recipe_plan(op, rows, cols, dtype, "sm_90a")
    assert plan.persistent and plan.tile_stages == 2 and plan.lanes in fs.recipes.rows.PERSISTENT_WARP_WINDOWS[op][2]
    _run(op, rows, cols, dtype, magnitude=3.0, shift=shift)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("shift", [0.0, -3000.0])
@pytest.mark.parametrize("rows, cols, dtype", [(5, 40959, "bf16"), (3, 49999, "f16"), (4, 36001, "bf16"),
                                               (270, 57001, "f16"), (400, 45001, "bf16")])
def test_the_recipes_wide_staged_windows(op, shift, rows, cols, dtype):
    # the recipes' longest odd staged windows on 512- or 1,024-thread blocks (rows.STAGED_WINDOW_WIDE):
    # three or two blocks an SM, more rows than one wave holds at 45,001 and 57,001 columns
    plan = fs.recipes.norms.recipe_plan(op, rows, cols, dtype, "sm_90a")
    # (as whole warps where the wide block's last pass would hold a few chunks: rows.whole_warps)
    wide = [t for start, t in fs.recipes.rows.STAGED_WINDOW_WIDE[op] if cols >= start][-1]
    # (the blocks an SM the window was shaped for: those of a grid of more blocks than SMs; a grid
    # of fewer asks for one, norms.plan_rows)
    per_sm = fs.recipes.norms.recipe_plan(op, 100000, cols, dtype, "sm_90a").blocks_per_sm
    assert plan.blocks_per_sm == (1 if rows <= 132 else per_sm), plan
    assert wide in (512, 1024) and plan.lanes == fs.recipes.rows.window_warps(cols, wide, per_sm)[0], plan
    assert plan.aligned and plan.row_memory == "SH" and not plan.persistent, plan
    _run(op, rows, cols, dtype, magnitude=3.0, shift=shift)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax"])
@pytest.mark.parametrize("shift", [0.0, -3000.0])
@pytest.mark.parametrize("rows, cols, dtype, lanes, stages, blocks", [
    (2500, 4095, "bf16", 128, 2, 6), (1500, 6001, "f16", 256, 2, 4), (900, 8191, "bf16", 128, 2, 3),
    (5, 4097, "f16", 128, 2, 6), (3000, 4097, "bf16", 256, 3, 4), (2000, 4096, "f16", 256, 2, 6),
    (777, 1000, "bf16", 64, 3, 8),
    # room for the deviations in registers: LayerNorm's statistics in two plain reductions (rows.deviations_fit)
    (2500, 4095, "bf16", 128, 2, 4), (1500, 6001, "f16", 128, 2, 4), (700, 4033, "f16", 128, 2, 4),
    (333, 5001, "bf16", 128, 3, 4), (1100, 7803, "bf16", 256, 2, 2), (400, 8191, "f16", 256, 2, 2),
    (1300, 3001, "bf16", 128, 2, 6), (800, 3583, "f16", 128, 2, 5),
    # LayerNorm's long odd rows (rows.PERSISTENT_PREFETCH_WIDE): 256 threads two an SM, 512 alone
    (900, 12289, "bf16", 256, 2, 2), (500, 14001, "f16", 256, 2, 2), (300, 16383, "bf16", 512, 2, 1),
    (200, 24569, "f16", 512, 2, 1), (7, 20479, "bf16", 512, 2, 1)])
def test_prefetched_rows_on_a_persistent_grid(op, shift, rows, cols, dtype, lanes, stages, blocks):
    # pipeline(stages=...) over a persistent block's tile loop (RowPlan.tile_stages): the next rows'
    # copies in flight while a block computes one; odd rows in their windows (the weights shifted
    # once a block) and even rows, more rows than blocks (but the 5 rows), outputs starting as NaN
    plan = fs.recipes.rows.RowPlan(lanes, 8, -(-(cols + 7) // (8 * lanes)), 1, blocks_per_sm=blocks,
                                   row_memory="SH", aligned=cols % 8 != 0, persistent=True, tile_stages=stages)
    _run(op, rows, cols, dtype, magnitude=3.0, shift=shift, plan=plan)


ALIGNED = [(9, 1001, "bf16"), (17, 4095, "f16"), (8, 12289, "bf16"), (3, 24569, "f16"), (11, 4097, "bf16"),
           (5, 8193, "f16"), (33, 257, "bf16"), (2, 16383, "f16")]


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("shift", [0.0, -3000.0])
@pytest.mark.parametrize("rows, cols, dtype", ALIGNED)
def test_aligned_rows(op, shift, rows, cols, dtype):
    # rows not a whole number of 16-byte vectors, in windows that start at the aligned vector
    # holding each row's first element (align(c=8)): every phase of the rows, the edge vectors
    # element by element (the outputs start as NaN: every element must be written, and none of
    # a neighbour's overwritten); rows of a large mean, whose maximum lies below the zeros the
    # window's edges load
    # (the window's plan whether or not the recipe takes it by default: rows.aligned_faster;
    # LayerNorm holds at most 16 elements of a window a thread)
    plan = fs.recipes.rows.row_plan(rows, cols, dtype, align=True, aligned_values=16 if op == "layernorm" else None)
    assert plan.aligned or (op == "layernorm" and cols > 16376)
    _run(op, rows, cols, dtype, magnitude=3.0, shift=shift, plan=plan)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("rows, cols, dtype", [(9, 4094, "bf16"), (5, 8190, "f16"), (7, 4095, "f32"), (3, 8191, "f32"),
                                               (2, 20482, "f16"), (9, 1023, "bf16"), (5, 2047, "f16")])
def test_rows_of_narrow_accesses(op, rows, cols, dtype):
    # rows of 2- or 4-byte accesses on as few threads as hold them at 8-32 elements a thread
    # (rows.odd_row_values); add + RMSNorm's f16 pairs from 16,384 elements in shared memory
    _run(op, rows, cols, dtype, magnitude=3.0, shift=-3000.0 if op == "softmax" else 0.0)


@pytest.mark.parametrize("rows, cols, diagonal", [(7, 20481, 20470), (5, 24569, 12000), (3, 40959, 40950),
                                                  (4, 32767, 100), (9, 20001, 0)])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_causal_rows_staged_in_their_window(rows, cols, diagonal, dtype):
    # causal softmax's odd rows of 20,000 to 41,000 columns wait in their aligned window in shared
    # memory, two blocks an SM (the recipe's default, rows.STAGED_WINDOW_UPTO): the masked load
    # stores the visible part, the rest of the window is masked; most of each row visible, or little
    import torch

    plan = fs.recipes.norms.recipe_plan("causal", rows, cols, dtype, "sm_90a")
    # (two blocks an SM where the grid has more blocks than SMs; these few rows' one an SM)
    assert plan.aligned and plan.row_memory == "SH" and plan.blocks_per_sm == 1, plan
    assert fs.recipes.norms.recipe_plan("causal", 1000, cols, dtype, "sm_90a").blocks_per_sm == 2
    tdt = TDT[dtype]
    x = (torch.randn(rows, cols, device="cuda") * 3.0).to(tdt)
    k = fs.compile(fs.recipes.softmax(rows, cols, dtype=dtype, arch="sm_90a", causal=True, diagonal=diagonal),
                   arch="sm_90a")
    y = torch.full_like(x, float("nan"))
    k(x, y)
    mask = torch.ones(rows, cols, device="cuda", dtype=torch.bool).tril(diagonal)
    ref = torch.softmax(x.float().masked_fill(~mask, float("-inf")), dim=-1)
    torch.cuda.synchronize()
    assert torch.isfinite(y.float()).all()
    assert (y.float()[~mask] == 0).all()
    assert ((y.float() - ref).abs().max() / ref.abs().max()).item() < (1e-2 if dtype == "f16" else 3e-2)


@pytest.mark.parametrize("op", ["rmsnorm", "add_rmsnorm"])
@pytest.mark.parametrize("rows, cols, dtype", [(3, 40968, "bf16"), (5, 45056, "f16"), (2, 65536, "bf16"),
                                               (3, 81920, "f16"), (2, 98304, "bf16")])
def test_long_rows_staged_on_one_block(op, rows, cols, dtype):
    # rows.STAGED_BLOCK_VALUES: rows longer than one block's registers wait in shared memory on
    # one block of 1,024 threads (up to 96 elements a thread) instead of a cluster
    plan = fs.recipes.norms.recipe_plan(op, rows, cols, dtype, "sm_90a")
    assert (plan.lanes, plan.cluster, plan.row_memory) == (1024, 1, "SH"), plan
    _run(op, rows, cols, dtype, magnitude=100.0)


def _causal(rows, cols, dtype, diagonal, plan=None, magnitude=3.0):
    """Causal softmax (rows masked right of ``diagonal``) against torch in f32; masked outputs 0."""
    x = (torch.randn(rows, cols, device="cuda") * magnitude).to(TDT[dtype])
    k = fs.compile(fs.recipes.softmax(rows, cols, dtype=dtype, arch="sm_90a", causal=True, diagonal=diagonal,
                                      plan=plan), arch="sm_90a")
    y = torch.full_like(x, float("nan"))
    k(x, y)
    mask = torch.ones(rows, cols, device="cuda", dtype=torch.bool).tril(diagonal)
    ref = torch.softmax(x.float().masked_fill(~mask, float("-inf")), dim=-1)
    torch.cuda.synchronize()
    assert torch.isfinite(y.float()).all(), (rows, cols, dtype, plan)
    assert (y.float()[~mask] == 0).all(), (rows, cols, dtype, plan)
    assert ((y.float() - ref).abs().max() / ref.abs().max()).item() < (1e-2 if dtype == "f16" else 3e-2), plan


@pytest.mark.parametrize("rows, cols, diagonal", [(5, 32768, 0), (3, 26000, 20000), (4, 40960, 100),
                                                  (2, 24584, 24583), (6, 36864, 36000)])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_causal_rows_staged_on_half_blocks(rows, cols, diagonal, dtype):
    # causal softmax's even rows that 1,024 threads would hold in registers wait in shared
    # memory on 512 threads, two blocks an SM (rows.STAGE_ONE_BLOCK), partial last passes too
    plan = fs.recipes.norms.recipe_plan("causal", rows, cols, dtype, "sm_90a")
    assert plan.lanes == 512 and plan.row_memory == "SH" and plan.cluster == 1, plan
    _causal(rows, cols, dtype, diagonal)


@pytest.mark.parametrize("seed", range(16))
def test_guarded_loads_under_a_predicate(seed):
    # done(guard="predicate") (the zeros and `@p ld` in one asm statement) on random recipes,
    # rows and plans of the tile model: partial last passes, odd rows, rows sharing a warp,
    # clusters, windows; softmax causal on its default plan (odd rows take it: rows.load_guard)
    import attrs

    rnd = random.Random(seed)
    op = rnd.choice(["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
    dtype = rnd.choice(["f16", "bf16"])
    rows = rnd.randint(1, 40)
    cols = rnd.choice([rnd.randint(1, 3000), rnd.randint(1000, 5000) * 8 + 8 * rnd.randint(0, 1), rnd.randint(3000, 45000)])
    if op == "causal":
        plan = attrs.evolve(fs.recipes.norms.recipe_plan("causal", rows, cols, dtype, "sm_90a"), guard="predicate")
        _causal(rows, cols, dtype, rnd.randint(0, cols), plan=plan)
        return
    plan = attrs.evolve(fs.recipes.rows.row_plan(rows, cols, dtype, clusters=True), guard="predicate")
    _run(op, rows, cols, dtype, shift=rnd.choice([0.0, -3000.0]), plan=plan)


@pytest.mark.parametrize("rows, cols, aligned", [(64, 65536, False), (9, 50000, False), (40, 4096, False),
                                                 (3, 100000, False), (9, 4095, False), (20, 1001, False),
                                                 (9, 4095, True), (20, 1001, True), (11, 12289, True),
                                                 (6, 20480, False), (5, 24576, False), (3, 19464, False)])
def test_causal_rows_read_their_visible_part(rows, cols, aligned):
    import torch

    # (aligned: the window's plan, align(c=8), which the recipe does not take by default)
    plan = fs.recipes.rows.row_plan(rows, cols, "f16", align=True) if aligned else None
    assert plan is None or plan.aligned
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
    k = fs.compile(fs.recipes.softmax(rows, cols, dtype="f16", arch="sm_90a", causal=True, diagonal=5, plan=plan),
                   arch="sm_90a")
    y = torch.empty_like(x)
    k(x, y)
    mask = torch.ones(rows, cols, device="cuda", dtype=torch.bool).tril(5)
    ref = torch.softmax(x.float().masked_fill(~mask, float("-inf")), dim=-1)
    torch.cuda.synchronize()
    assert (y.float()[~mask] == 0).all()
    assert ((y.float() - ref).abs().max() / ref.abs().max()).item() < 1e-2


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("shift", [0.0, -3000.0])
@pytest.mark.parametrize("rows, cols", [(3, 24577), (2, 32767)])
def test_odd_rows_on_one_staged_block_without_clusters(op, shift, rows, cols):
    # the sm_80 plan (no clusters), run on this GPU: the odd row copied element by element into
    # the shared memory of one block, the statistics in one tuple reduction
    plan = fs.recipes.rows.row_plan(rows, cols, "f16", stage=True, shared_per_sm=164 * 1024)
    assert plan.row_memory == "SH" or op == "softmax"
    _run(op, rows, cols, "f16", magnitude=3.0, shift=shift, arch="sm_80")


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax"])
@pytest.mark.parametrize("rows, cols, dtype, cluster, stages", [(700, 65536, "bf16", 4, 1), (700, 65536, "f16", 4, 2),
                                                                (1500, 32768, "bf16", 2, 2), (3, 32768, "f16", 2, 2)])
def test_rows_on_persistent_clusters(op, rows, cols, dtype, cluster, stages):
    # clusters that walk the rows (to_blocks(cluster=..., persistent=True), the barrier exchange),
    # one or two rows' parts a block in shared memory (RowPlan.tile_stages); more rows than clusters
    # (but the 3 rows); means -3000
    part = cols // cluster
    plan = fs.recipes.rows.RowPlan(256, 8, part // 2048, 1, cluster=cluster, part=part, blocks_per_sm=2,
                                   exchange="barrier", row_memory="SH", persistent=True, tile_stages=stages)
    _run(op, rows, cols, dtype, magnitude=3.0, shift=-3000.0, exchange="barrier", plan=plan)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
@pytest.mark.parametrize("rows, cols, dtype", [(2000, 4095, "f16"), (900, 6139, "bf16"), (700, 8191, "bf16"),
                                               (300, 12287, "f16"), (200, 16383, "bf16"), (150, 20479, "f16"),
                                               (100, 30751, "bf16"), (2500, 2047, "bf16")])
def test_windows_on_whole_warps(op, rows, cols, dtype):
    # the plans whose power-of-two block's last pass would hold a few chunks take whole warps
    # (rows.whole_warps: 96 - 416 threads); each recipe on the plan of 4,096 such rows
    plan = fs.recipes.norms.recipe_plan(op, 4096, cols, dtype, "sm_90a")
    if op == "causal":
        _causal(rows, cols, dtype, max(0, cols - rows), plan=plan)
    else:
        _run(op, rows, cols, dtype, magnitude=3.0, shift=-3000.0 if op in ("layernorm", "softmax") else 0.0, plan=plan)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
@pytest.mark.parametrize("rows, cols, dtype", [(3, 65537, "bf16"), (2, 100003, "f16"), (2, 110001, "bf16"),
                                               (300, 81919, "f16"), (5, 45001, "bf16")])
def test_windows_alone_on_their_sm(op, rows, cols, dtype):
    # odd rows whose window two blocks an SM cannot hold, on one block alone (rows.STAGED_WINDOW_ALONE),
    # more rows than SMs at 81,919 columns; causal softmax's windows past 41,000 columns
    plan = fs.recipes.norms.recipe_plan(op, rows, cols, dtype, "sm_90a")
    assert plan.aligned and plan.cluster == 1 and plan.row_memory == "SH", plan
    if op == "causal":
        _causal(rows, cols, dtype, max(0, cols - rows), plan=plan)
    else:
        _run(op, rows, cols, dtype, magnitude=3.0, shift=-3000.0 if op in ("layernorm", "softmax") else 0.0, plan=plan)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
@pytest.mark.parametrize("rows, cols, dtype", [(3, 131071, "bf16"), (2, 262143, "f16"), (1, 114687, "bf16"),
                                               (300, 120001, "f16"), (5, 200003, "bf16"), (140, 116009, "bf16")])
def test_cluster_windows(op, rows, cols, dtype):
    # odd rows past what one block's window holds: a cluster whose parts each walk an aligned
    # window of 16-byte vectors (rows.cluster_windows), more rows than SMs at 120,001 columns and
    # clusters of 7 at 200,003
    plan = fs.recipes.norms.recipe_plan(op, rows, cols, dtype, "sm_90a")
    assert plan.aligned and plan.cluster > 1 and plan.vec == 8, plan
    if op == "causal":
        _causal(rows, cols, dtype, max(0, cols - rows), plan=plan)
    else:
        _run(op, rows, cols, dtype, magnitude=3.0, shift=-3000.0 if op in ("layernorm", "softmax") else 0.0, plan=plan)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
@pytest.mark.parametrize("rows, cols", [(9, 20001), (300, 24575), (2, 65537), (3, 131071)])
def test_f32_cluster_windows(op, rows, cols):
    # f32 odd rows on clusters of aligned windows where the recipe takes them
    # (rows.F32_CLUSTER_WINDOWS), element copies elsewhere: both against torch
    plan = fs.recipes.norms.recipe_plan(op, rows, cols, "f32", "sm_90a")
    windows = plan.aligned and plan.cluster > 1
    assert windows == (plan.row_memory == "SH" and plan.cluster > 1 and cols <= fs.recipes.rows.F32_CLUSTER_WINDOWS[op])
    if op == "causal":
        _causal(rows, cols, "f32", max(0, cols - rows), plan=plan)
    else:
        _run(op, rows, cols, "f32", magnitude=3.0, shift=-3000.0 if op in ("layernorm", "softmax") else 0.0, plan=plan)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax"])
@pytest.mark.parametrize("lanes, reps, cluster, part", [(128, 5, 4, 2560), (96, 3, 2, 2048), (64, 9, 8, 512)])
def test_cluster_windows_of_other_parts(op, lanes, reps, cluster, part):
    # hand-written cluster window plans: parts not a whole number of passes, whole warps that are
    # not a power of two, and windows reaching a part into the next at 2,047 - 4,095 columns
    cols = {2: 4095, 4: 10235, 8: 4093}[cluster]
    plan = fs.recipes.rows.RowPlan(lanes, 8, reps, 1, cluster=cluster, part=part, row_memory="SH", aligned=True,
                                   exchange="push")
    _run(op, 37, cols, "bf16", magnitude=3.0, plan=plan)


SHORT_NARROW = [(1000, 255, "bf16"), (777, 254, "f16"), (3001, 101, "bf16"), (5000, 33, "f16"), (300, 999, "bf16"),
                (257, 767, "f16"), (9, 383, "bf16"), (70, 35, "bf16"), (500, 769, "f16"), (1000, 252, "bf16"),
                (300, 255, "f32"), (64, 510, "f32"), (33, 101, "f32"), (1, 33, "bf16"), (3, 101, "f16")]


def _short_narrow(op, cols, dtype):
    """Whether recipe ``op`` takes a warp or less for rows of ``cols`` (rows.SHORT_NARROW_COLS)."""
    c16, c32, widest = fs.recipes.rows.SHORT_NARROW_COLS[op]
    eb = 4 if dtype == "f32" else 2
    vec = 16 // eb
    while cols % vec:
        vec //= 2
    return cols <= (c16 if eb == 2 else c32) and vec * eb <= widest


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("rows, cols, dtype", SHORT_NARROW)
@pytest.mark.parametrize("shift", [0.0, -3000.0])
def test_short_narrow_rows(op, rows, cols, dtype, shift):
    # 16-bit rows of 33 - 1,000 columns in 2- or 4-byte accesses: a warp a row or less, several
    # rows a block (rows.SHORT_NARROW_COLS), the last block's rows partly past the tensor's end
    plan = fs.recipes.norms.recipe_plan(op, rows, cols, dtype, "sm_90a")
    short = _short_narrow(op, cols, dtype)
    assert (plan.lanes == fs.recipes.rows.short_narrow_lanes(cols) and plan.rows > 1) == short, plan
    _run(op, rows, cols, dtype, magnitude=3.0, shift=shift)


@pytest.mark.parametrize("rows, cols, dtype", SHORT_NARROW)
@pytest.mark.parametrize("diagonal", [0, 40])
def test_short_narrow_causal_rows(rows, cols, dtype, diagonal):
    plan = fs.recipes.norms.recipe_plan("causal", rows, cols, dtype, "sm_90a")
    short = _short_narrow("causal", cols, dtype)
    assert (plan.lanes == fs.recipes.rows.short_narrow_lanes(cols) and plan.rows > 1) == short, plan
    _causal(rows, cols, dtype, diagonal)


NARROW_BLOCK = [(700, 1022, "bf16"), (301, 1020, "f16"), (99, 2046, "bf16"), (5, 3070, "f16"), (257, 2556, "bf16"),
                (3, 1534, "bf16"), (1, 1002, "f16"), (129, 2558, "f16"), (16385, 3070, "bf16"), (12289, 2046, "f16"),
                (333, 1151, "bf16"), (7, 1535, "f16"), (1001, 1025, "f16"), (65, 1699, "bf16"), (4, 1279, "bf16"),
                (333, 767, "f32"), (5, 1535, "f32"), (1001, 1022, "f32"), (64, 513, "f32"), (8193, 1279, "f32")]


def _narrow_block(op, rows, cols, dtype):
    """Whether recipe ``op`` takes rows.NARROW_BLOCK_THREADS a row for ``rows`` x ``cols`` values
    of ``dtype`` (rows.NARROW_BLOCK_COLS's tiers, rows.NARROW_BLOCK_ODD, rows.NARROW_BLOCK_F32)."""
    if dtype == "f32":
        odd, pairs, fewest = fs.recipes.rows.NARROW_BLOCK_F32.get(op, (0, 0, 0))
        return cols % 4 != 0 and rows >= fewest and \
            fs.recipes.rows.NARROW_BLOCK_F32_FROM <= cols <= (odd if cols % 2 else pairs)
    if cols % 2:
        first, last = fs.recipes.rows.NARROW_BLOCK_ODD.get(op, (0, 0))
        return first <= cols <= last
    if cols % 8 == 0 or cols < fs.recipes.rows.NARROW_BLOCK_FROM:
        return False
    tiers = [t for t in fs.recipes.rows.NARROW_BLOCK_COLS.get(op, ()) if rows >= t[2]]
    return cols <= max((t[0 if cols % 4 else 1] for t in tiers), default=0)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("rows, cols, dtype", NARROW_BLOCK)
@pytest.mark.parametrize("shift", [0.0, -3000.0])
def test_narrow_block_rows(op, rows, cols, dtype, shift):
    # 16-bit rows of 2 or 4 mod 8 columns, 1,001 - 3,072, and some odd ones: 128 threads a row,
    # two rows a block (rows.NARROW_BLOCK_COLS, NARROW_BLOCK_ODD), an odd number of rows (the last
    # block's second row past the end)
    plan = fs.recipes.norms.recipe_plan(op, rows, cols, dtype, "sm_90a")
    taken = plan.lanes == fs.recipes.rows.NARROW_BLOCK_THREADS and plan.rows == min(2, rows)
    assert taken == _narrow_block(op, rows, cols, dtype), plan
    _run(op, rows, cols, dtype, magnitude=3.0, shift=shift)


@pytest.mark.parametrize("rows, cols, dtype", NARROW_BLOCK)
@pytest.mark.parametrize("diagonal", [0, 900])
def test_narrow_block_causal_rows(rows, cols, dtype, diagonal):
    plan = fs.recipes.norms.recipe_plan("causal", rows, cols, dtype, "sm_90a")
    taken = plan.lanes == fs.recipes.rows.NARROW_BLOCK_THREADS and plan.rows == min(2, rows)
    assert taken == _narrow_block("causal", rows, cols, dtype), plan
    _causal(rows, cols, dtype, diagonal)


LONG_PAIRS = [(5, 4094, "bf16"), (301, 6142, "f16"), (3, 8190, "bf16"), (129, 3074, "bf16"), (8193, 5118, "f16")]


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
@pytest.mark.parametrize("rows, cols, dtype", LONG_PAIRS)
def test_long_pair_rows(op, rows, cols, dtype):
    # 16-bit rows of 2 mod 4 columns from 3,073 (rows.LONG_PAIRS): 256 threads a row, two rows a
    # block (causal softmax one), an odd number of rows; outputs start as NaN
    last, lanes, per_block = fs.recipes.rows.LONG_PAIRS.get(op, (0, 0, 0))
    plan = fs.recipes.norms.recipe_plan(op, rows, cols, dtype, "sm_90a")
    assert ((plan.lanes, plan.rows) == (lanes, min(per_block, rows))) == (cols <= last), plan
    if op == "causal":
        _causal(rows, cols, dtype, cols // 2)
    else:
        _run(op, rows, cols, dtype, magnitude=3.0, shift=-3000.0 if op in ("layernorm", "softmax") else 0.0)
