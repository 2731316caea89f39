"""A persistent block's tile loop as a pipeline (``pipeline(stages=S)`` with no K loop below it,
``lower.transforms.tile_prefetch``): the shared tensors a ``Move`` fills from global memory once a
tile become S deep, and the copies of tile i + S - 1 are issued while tile i computes.  The
interpreter proves the rows right (every op, odd and even rows, more rows than blocks, two and
three stages) and catches a wait that lets a row be read while its copy is in flight; the
strategy refuses what it cannot pipeline, naming the fix."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ir
from firesched.hardware.target import target
from firesched.recipes import norms
from firesched.recipes import rows as row_model
from firesched.recipes.rows import RowPlan
from firesched.simulate.interp import run_program
from firesched.spec import Fused, Move, Pointwise
from firesched.strategies import done, part, pipeline, place, tile, to_blocks, to_threads
from firesched.tensor import GL, KERNEL, SH, Tensor, Tile
from firesched.testing.planting import planted


def _recipe(kind, *args, **kw):
    if kind == "causal":
        return fs.recipes.softmax(*args, causal=True, **kw)
    return getattr(fs.recipes, kind)(*args, **kw)


def _plan(cols, stages, lanes=64, aligned=None, blocks=1):
    aligned = cols % 8 != 0 if aligned is None else aligned
    return RowPlan(lanes, 8, -(-(cols + 7) // (8 * lanes)), 1, aligned=aligned, row_memory="SH", persistent=True,
                   tile_stages=stages, blocks_per_sm=blocks)


@pytest.mark.parametrize("kind, dt, cols, rows, stages, blocks", [
    ("rmsnorm", "bf16", 1001, 150, 2, 1), ("layernorm", "f16", 263, 300, 3, 1), ("softmax", "bf16", 512, 300, 2, 1),
    ("causal", "f16", 263, 150, 2, 1), ("layernorm", "bf16", 512, 300, 2, 2), ("rmsnorm", "f16", 263, 300, 3, 1),
    ("layernorm", "bf16", 1001, 27, 2, 1), ("softmax", "f16", 1001, 27, 3, 1), ("causal", "bf16", 1001, 27, 2, 1)])
def test_prefetched_rows_match_numpy(kind, dt, cols, rows, stages, blocks):
    # more rows than blocks (the grid is the SMs' 132 times the blocks an SM, rounded to a multiple
    # of 8 for odd rows): the blocks take one to three rows each, the copies of tiles past the rows
    # are not issued; 27 odd rows on 24 blocks: three take a second row.  LayerNorm's statistics:
    # the tuple on a block alone on its SM, two plain reductions beside another (rows.deviations_fit)
    plan = _plan(cols, stages, blocks=blocks)
    sched = _recipe(kind, rows, cols, dtype=dt, arch="sm_90a", plan=plan)
    assert f"pipeline(stages={stages})" in repr(sched.strategies)
    if kind == "layernorm":
        welford = [sp for sp in sched.spec.body if getattr(sp, "monoid", None) is not None]
        assert bool(welford) == (blocks == 1) == (not row_model.deviations_fit(plan)), plan
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


@pytest.mark.parametrize("tuple_stats", [False, True])
def test_a_wide_block_alone_matches_numpy(tuple_stats):
    # LayerNorm's long odd rows' plan (rows.PERSISTENT_PREFETCH_WIDE): 512 threads, one block an SM,
    # two rows in flight; its statistics in two reductions (the deviations in registers) or the tuple
    sched = fs.recipes.layernorm(11, 4601, dtype="bf16", arch="sm_90a", plan=_plan(4601, 2, lanes=512),
                                 tuple_stats=tuple_stats)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def _prefetched(rows, cols, stages=2, kind="rmsnorm", dt="bf16"):
    sched = _recipe(kind, rows, cols, dtype=dt, arch="sm_90a", plan=_plan(cols, stages))
    prog = sched.lower("sm_90a")
    return sched, prog, {b.name: a for b, a in zip(prog.inputs, fs.testing.random_arrays(sched, 0))}


def _copies(stmts):
    return [s for s in ir.rewrite.walk(stmts) if isinstance(s, ir.AtomCall) and s.atom.family == "cp_async"]


def test_the_next_rows_copy_is_issued_before_this_rows_work():
    sched, prog, _ = _prefetched(300, 1001)
    (kernel,) = prog.kernels
    body = ir.rewrite.flat([kernel.body])
    loop_at = next(i for i, s in enumerate(body) if isinstance(s, ir.For) and s.var.name == "tile_i")
    # the prologue copies tile 0; the loop's body waits, meets at one barrier, issues tile i + 1, then works
    assert _copies(body[:loop_at]), "no copy before the tile loop"
    loop = body[loop_at]
    inner = ir.rewrite.flat([loop.body])
    inner = ir.rewrite.flat([inner[0].then]) if isinstance(inner[0], ir.If) else inner
    assert isinstance(inner[0], ir.AsyncWait) and inner[0].pending == 0
    assert isinstance(inner[1], ir.Barrier)
    assert isinstance(inner[2], ir.If) and _copies([inner[2]])
    assert not _copies(inner[3:]), "a row copied after the work began"
    # the row's buffer holds two rows
    src = fs.compile(sched, arch="sm_90a").source
    assert "2 stage(s) x 1x" in src and "issued 1 tile(s) ahead" in src


def test_the_first_rows_copies_are_in_flight_while_the_block_stages_its_weights():
    # the weights' raw copies first, then the prologue's (tile 0), then a wait for the former
    # alone: the block shifts its windows while tile 0 is still in flight (a block of a 4,096-row
    # grid walks about five rows: the set-up is not hidden by many)
    prog = fs.recipes.layernorm(40, 4095, dtype="bf16", arch="sm_90a").lower("sm_90a")
    stmts = list(ir.rewrite.walk([prog.kernels[0].body]))

    def first(pred):
        return next(i for i, s in enumerate(stmts) if pred(s))

    def touches(s, name, family):
        return isinstance(s, ir.AtomCall) and s.atom.family == family and any(
            isinstance(v, ir.MemRef) and v.buffer.name == name for _, v in s.args)

    raw = first(lambda s: touches(s, "W_win", "cp_async"))
    copy = first(lambda s: touches(s, "Xr_smem", "cp_async"))
    wait = first(lambda s: isinstance(s, ir.AsyncWait))
    shift = first(lambda s: touches(s, "W_win", "copy"))
    loop = first(lambda s: isinstance(s, ir.For) and s.var.name == "tile_i")
    assert raw < copy < wait < shift < loop
    assert stmts[wait].pending == 1


def test_a_wait_that_lets_the_windows_raw_copies_in_flight_is_caught():
    sched = fs.recipes.layernorm(40, 4095, dtype="bf16", arch="sm_90a")
    prog = sched.lower("sm_90a")
    feed = {b.name: a for b, a in zip(prog.inputs, fs.testing.random_arrays(sched, 0))}
    assert np.isfinite(np.asarray(run_program(prog, dict(feed))["Y"], np.float32)).all()

    def weaker(s):
        return ir.AsyncWait(2) if isinstance(s, ir.AsyncWait) and s.pending == 1 else s

    with pytest.raises(fs.HazardError, match="in-flight"):
        run_program(planted(prog, weaker), dict(feed))


def test_a_wait_that_lets_the_row_in_flight_is_caught():
    sched, prog, feed = _prefetched(300, 1001)
    good = run_program(prog, dict(feed))["Y"]
    assert np.isfinite(np.asarray(good, np.float32)).all()

    def weaker(s):
        return ir.AsyncWait(1) if isinstance(s, ir.AsyncWait) and s.pending == 0 else s

    with pytest.raises(fs.HazardError, match="in-flight"):
        run_program(planted(prog, weaker), dict(feed))


def test_three_stages_keep_one_group_pending():
    _, prog, _ = _prefetched(300, 1001, stages=3)
    waits = [s.pending for s in ir.rewrite.walk([prog.kernels[0].body]) if isinstance(s, ir.AsyncWait)]
    assert 1 in waits


def test_pipeline_needs_a_persistent_grid():
    plan = attrs.evolve(_plan(1001, 2), persistent=False)
    with pytest.raises(fs.ScheduleError, match="persistent") as e:
        fs.recipes.rmsnorm(300, 1001, dtype="bf16", arch="sm_90a", plan=plan)
    assert "to_blocks(persistent=True)" in str(e.value)


def test_a_row_the_kernel_computes_is_not_prefetched():
    # add + RMSNorm's row is X + R, computed by the block: no move from global memory to prefetch
    with pytest.raises(fs.ScheduleError, match="moves nothing from global to shared memory"):
        fs.recipes.add_rmsnorm(300, 1001, dtype="bf16", arch="sm_90a", plan=_plan(1001, 2))


def test_rows_in_registers_have_nothing_to_prefetch():
    plan = attrs.evolve(_plan(1024, 2, aligned=False), row_memory="RF")
    with pytest.raises(fs.ScheduleError, match="moves nothing"):
        fs.recipes.rmsnorm(300, 1024, dtype="bf16", arch="sm_90a", plan=plan)


def _hand_written(rows, cols, lanes, stages, occupancy=1):
    # a user's row kernel, not a recipe's: Y = 2 X + X, the row waiting in shared memory
    def t(name, dt="f16"):
        return Tile(Tensor(name, dt, GL, ("r", "c"), (rows, cols), "c"), (rows, cols))

    spec = Fused.kernel(Move(t("X"), t("Xr"), KERNEL), Pointwise("add", (t("Xr"), t("Xr")), t("T"), KERNEL),
                        Pointwise("add", (t("T"), t("Xr")), t("Y"), KERNEL))
    walk = (tile(c=lanes * 8), tile(c=8) >> to_threads(), done())
    return spec.schedule(tile(r=1) >> to_blocks(persistent=True, occupancy=occupancy), place("Xr", SH),
                         place("T", fs.RF), part(1, *walk), part(2, *walk), pipeline(stages=stages))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 300), passes=st.integers(1, 4), lanes=st.sampled_from([32, 64, 128]),
       stages=st.integers(2, 3), occupancy=st.integers(1, 2), ragged=st.booleans())
def test_hand_written_prefetched_rows(rows, passes, lanes, stages, occupancy, ragged):
    # rows of whole passes of the block's threads (or, ragged, 8 columns short of them: refused,
    # since the on-chip row cannot be predicated), any count of rows; either check() refuses the
    # schedule or the interpreter agrees with numpy, with no hazard
    cols = passes * lanes * 8 - (8 if ragged else 0)
    if cols <= 0:
        return
    try:
        sched = _hand_written(rows, cols, lanes, stages, occupancy)
        sched.check("sm_90a")
    except fs.ScheduleError:
        assert ragged
        return
    assert not ragged or passes == 1
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_the_recipes_prefetch_where_measured():
    for op, cols in (("rmsnorm", 4095), ("layernorm", 4097), ("layernorm", 7001), ("rmsnorm", 1501)):
        plan = norms.recipe_plan(op, 8192, cols, "bf16", "sm_90a")
        assert plan.persistent and plan.tile_stages == 2, (op, cols, plan)
    # past RMSNorm's range: the persistent window one row at a time
    lo, hi = row_model.PERSISTENT_PREFETCH_COLS["rmsnorm"]
    plan = norms.recipe_plan("rmsnorm", 8192, hi + 1 + hi % 2, "bf16", "sm_90a")
    assert plan.persistent and plan.tile_stages == 1, plan
    # LayerNorm's longer rows on 256 threads, three or two blocks an SM, while two fit the SM's
    # shared memory, then on 512 alone; shorter ones on 128, four to six (the registers of its two
    # reductions: 48 at 24 values, 64 at 32, 80 at 40, 96 at 48)
    wlo, whi, wide = row_model.PERSISTENT_PREFETCH_WIDE["layernorm"]
    assert wide == (256, 512)
    for cols, lanes, blocks in ((wlo, 256, 3), (7803, 256, 3), (8191, 256, 3), (9999, 256, 2), (12289, 256, 2),
                                (14001, 256, 2), (14335, 512, 1), (16383, 512, 1), (whi, 512, 1), (2801, 128, 6),
                                (3583, 128, 6), (4097, 128, 6), (5119, 128, 5), (6001, 128, 4)):
        plan = norms.recipe_plan("layernorm", 8192, cols, "bf16", "sm_90a")
        # (whole warps where the last pass of the power-of-two block holds a few chunks)
        warps = row_model.window_warps(cols, lanes, blocks)[0]
        assert (plan.tile_stages, plan.lanes, plan.blocks_per_sm) == (2, warps, blocks), (cols, plan)
        if row_model.deviations_fit(plan):
            assert row_model.thread_registers(warps * blocks) >= row_model.deviation_registers(plan.reps * plan.vec)
        # the blocks fit the SM's shared memory with what the driver keeps (and two of 256 would not
        # fit where 512 threads take the SM alone)
        # (the target's shared memory an SM, what row_plan sizes the blocks by)
        need = row_model.persistent_window_bytes(cols, lanes, 2, 2)
        smem = target("sm_90a").smem_per_sm
        assert row_model.blocks_that_fit(need, smem) >= blocks
        assert lanes != 512 or row_model.blocks_that_fit(row_model.persistent_window_bytes(cols, 256, 2, 2), smem) < 2
    # past the range: a row at a time on three staged windows an SM
    plan = norms.recipe_plan("layernorm", 2048, whi + 2, "bf16", "sm_90a")
    assert not plan.persistent and plan.row_memory == "SH", plan
    assert norms.recipe_plan("layernorm", 8192, 7001, "bf16", "sm_90a").tile_stages == 2
    # a target without the measurements keeps its plans (sm_80: no persistent windows)
    assert norms.recipe_plan("layernorm", 8192, 4095, "bf16", "sm_80").tile_stages == 1
    # the blocks an SM count both rows a block holds, and fit the SM with what the driver reserves
    sched = fs.recipes.layernorm(8192, 4097, dtype="bf16", arch="sm_90a")
    sched.check("sm_90a")


@pytest.mark.parametrize("cols, two", [(2801, True), (3583, True), (4033, True), (4097, True), (6001, True),
                                       (6137, True), (6501, True), (7067, True), (7803, True), (8191, True),
                                       (9999, True), (12289, True), (14001, True), (16383, False), (24569, False),
                                       (4096, False), (24571, False), (2047, True), (1535, True),
                                       (1023, False)])
def test_layernorm_takes_two_reductions_where_the_deviations_fit(cols, two):
    # two plain reductions (the deviations in registers) on prefetching windows of at most 56
    # values a thread with the registers for them, beside another block on the SM
    # (rows.deviations_fit: 512 threads alone take the tuple); the Welford tuple elsewhere on rows
    # in shared memory
    plan = norms.recipe_plan("layernorm", 8192, cols, "bf16", "sm_90a")
    assert row_model.deviations_fit(plan) == two, plan
    spec = fs.recipes.layernorm(8192, cols, dtype="bf16", arch="sm_90a").spec
    welford = [sp for sp in spec.body if getattr(sp, "monoid", None) is not None]
    assert bool(welford) == (not two and plan.row_memory == "SH"), (cols, plan)


@pytest.mark.parametrize("cols, blocks", [(2817, 6), (3583, 6), (4095, 6), (5001, 6), (5999, 5)])
def test_softmax_takes_two_reductions_on_prefetching_windows(cols, blocks):
    # softmax's odd rows of 2,800 - 5,999 columns (1,700 - 2,799 on eight blocks: below): 128
    # threads, two rows in flight, the maximum and the sum in two plain reductions with the
    # exponentials in registers (2 a value: at 48 values five blocks an SM, not six); not the online
    # (max, sum) tuple
    plan = norms.recipe_plan("softmax", 8192, cols, "bf16", "sm_90a")
    lanes = row_model.window_warps(cols, 128, blocks)[0]             # (4,095: 96 threads x 6)
    assert (plan.persistent, plan.tile_stages, plan.lanes, plan.blocks_per_sm) == (True, 2, lanes, blocks), plan
    assert row_model.deviations_fit(plan, "softmax")
    assert row_model.thread_registers(lanes * blocks) >= row_model.deviation_registers(plan.reps * plan.vec, "softmax")
    spec = fs.recipes.softmax(8192, cols, dtype="bf16", arch="sm_90a").spec
    assert not [sp for sp in spec.body if getattr(sp, "monoid", None) is not None]
    # outside the range, and causal softmax, as before
    for c, kw in ((1535, {}), (6001, {}), (cols, {"causal": True})):
        p = norms.recipe_plan("causal" if kw else "softmax", 8192, c, "bf16", "sm_90a")
        assert not (p.persistent and p.tile_stages > 1), (c, kw, p)


def test_two_reductions_name_the_recipes_they_know():
    plan = norms.recipe_plan("softmax", 8192, 4095, "bf16", "sm_90a")
    with pytest.raises(ValueError, match="allowed: 'layernorm', 'softmax'"):
        row_model.deviations_fit(plan, "rmsnorm")
    with pytest.raises(ValueError, match="op='causal'"):
        row_model.deviation_registers(40, "causal")


def test_row_plan_sizes_the_stages():
    one = row_model.row_plan(8192, 6001, "bf16", stage=True, staged_window=True, persistent_window_blocks=8,
                             row_operands=2, shared_per_sm=228 * 1024)
    two = row_model.row_plan(8192, 6001, "bf16", stage=True, staged_window=True, persistent_window_blocks=8,
                             row_operands=2, shared_per_sm=228 * 1024, tile_stages=2)
    assert two.tile_stages == 2 and two.blocks_per_sm < one.blocks_per_sm
    with pytest.raises(ValueError, match="tile_stages"):
        row_model.row_plan(8192, 6001, "bf16", tile_stages=0)
    with pytest.raises(ValueError, match="persistent_window_threads"):
        row_model.row_plan(8192, 6001, "bf16", persistent_window_threads=96)


def test_a_persistent_window_block_takes_an_sm_alone_only_when_wide():
    # 16,383 columns: one block an SM holds two stages of the row's window and the weight's and
    # bias's windows; 512 threads take the SM alone (as whole warps: 416 threads x 5 passes, not
    # 512 x 5 with one chunk in the last), 256 fall back to a row at a time
    kw = dict(stage=True, staged_window=True, persistent_window_blocks=6, row_operands=2, tile_stages=2)
    wide = row_model.row_plan(2048, 16383, "bf16", persistent_window_threads=512, **kw)
    assert (wide.persistent, wide.lanes, wide.reps, wide.blocks_per_sm) == (True, 416, 5, 1), wide
    narrow = row_model.row_plan(2048, 16383, "bf16", persistent_window_threads=256, **kw)
    assert not narrow.persistent and narrow.blocks_per_sm >= 2, narrow


def test_element_copies_are_not_prefetched():
    # an odd row outside an aligned window is copied element by element through registers: nothing
    # stays in flight, so the tile loop cannot run ahead of it
    plan = RowPlan(64, 1, 16, 1, row_memory="SH", persistent=True, tile_stages=2, blocks_per_sm=1)
    with pytest.raises(fs.ScheduleError, match="not cp.async") as e:
        fs.recipes.rmsnorm(300, 1001, dtype="bf16", arch="sm_90a", plan=plan).lower("sm_90a")
    assert "align(c=...)" in str(e.value)


def test_the_occupancy_check_counts_the_drivers_reserve():
    # 7 blocks of 33 KB pass without the 1 KiB the driver keeps for each block, not with it
    plan = RowPlan(256, 8, 3, 1, aligned=True, row_memory="SH", persistent=True, tile_stages=2, blocks_per_sm=7)
    with pytest.raises(fs.ScheduleError, match="bytes the driver keeps for a block"):
        fs.recipes.rmsnorm(4096, 4095, dtype="bf16", arch="sm_90a", plan=plan).lower("sm_90a")
    fs.recipes.rmsnorm(4096, 4095, dtype="bf16", arch="sm_90a", plan=attrs.evolve(plan, blocks_per_sm=6)).lower("sm_90a")


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_prefetched_cluster_rows(kind):
    # rows split over clusters of two blocks that walk the rows (persistent, barrier exchange), each
    # part's next row copied while the cluster combines this one's statistics
    plan = RowPlan(64, 8, 2, 1, cluster=2, part=1024, blocks_per_sm=1, exchange="barrier", row_memory="SH",
                   persistent=True, tile_stages=2)
    sched = _recipe(kind, 300, 2048, dtype="bf16", arch="sm_90a", plan=plan)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_a_plans_stages_are_checked():
    with pytest.raises(ValueError, match="tile_stages"):
        fs.recipes.rmsnorm(300, 1001, dtype="bf16", arch="sm_90a", plan=attrs.evolve(_plan(1001, 2), tile_stages="2"))


@pytest.mark.parametrize("op", ["layernorm", "softmax"])
def test_short_odd_rows_prefetch_on_eight_blocks(op):
    # LayerNorm's and softmax's odd rows of 1,700 - 2,799 columns: persistent windows of 128 threads
    # (whole warps: 96 at 2,047), eight blocks an SM, the next row in flight
    # (rows.PERSISTENT_SHORT_WINDOWS); at 1,535 LayerNorm's rows take a warp each
    # (rows.PERSISTENT_WARP_WINDOWS), softmax's keep their element plan; 2,801 six blocks as before
    for cols, lanes in ((1701, 128), (2047, 96), (2303, 128), (2799, 128)):
        p = norms.recipe_plan(op, 16384, cols, "bf16", "sm_90a")
        assert (p.persistent, p.tile_stages, p.lanes, p.blocks_per_sm) == (True, 2, lanes, 8), (cols, p)
    short = norms.recipe_plan(op, 16384, 1535, "bf16", "sm_90a")
    assert (short.persistent, short.lanes == 32) == ((True, True) if op == "layernorm" else (False, False)), short
    assert norms.recipe_plan(op, 16384, 2801, "bf16", "sm_90a").blocks_per_sm == 6
    plan = norms.recipe_plan(op, 16384, 2047, "bf16", "sm_90a")
    sched = _recipe(op, 40, 2047, dtype="bf16", arch="sm_90a", plan=plan)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
