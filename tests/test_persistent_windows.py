"""Odd rows on a persistent grid (``RowPlan(persistent=True)``): a multiple of 8 blocks walks the
rows, so each block's rows start at one phase, and a weight is shifted into the window's frame
once a block, into shared memory (``lower.rules.threads.staged_run``), not once a row.  The
interpreter proves the rows right over every phase, and that they read the block's window."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ir
from firesched.recipes import norms
from firesched.recipes import rows as row_model
from firesched.recipes.rows import RowPlan
from firesched.simulate.interp import run_program
from firesched.testing.planting import planted


def _recipe(kind, *args, **kw):
    if kind == "causal":
        return fs.recipes.softmax(*args, causal=True, **kw)
    return getattr(fs.recipes, kind)(*args, **kw)


def _plan(cols, memory, lanes=64):
    return RowPlan(lanes, 8, -(-(cols + 7) // (8 * lanes)), 1, aligned=True, row_memory=memory, persistent=True)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
@pytest.mark.parametrize("memory", ["RF", "SH"])
@pytest.mark.parametrize("dt, cols", [("bf16", 1001), ("f16", 263)])
def test_persistent_windows_match_numpy(kind, memory, dt, cols):
    # 27 rows on 24 blocks (the grid rounded down to a multiple of 8): three blocks take a second
    # row, at the phase of their first; the rows start at every offset modulo 8
    sched = _recipe(kind, 27, cols, dtype=dt, arch="sm_90a", plan=_plan(cols, memory))
    assert "persistent=True" in repr(sched.strategies)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def _tile_loop(body):
    return next(s for s in ir.rewrite.walk([body]) if isinstance(s, ir.For) and s.var.name == "tile_i")


def _reads_of(stmt, name):
    return [s for s in ir.rewrite.walk(stmt if isinstance(stmt, list) else [stmt]) if isinstance(s, ir.AtomCall)
            and any(isinstance(v, ir.MemRef) and v.buffer.name == name for _, v in s.args)]


def test_a_persistent_block_shifts_its_weights_once():
    sched = fs.recipes.layernorm(40, 1001, dtype="bf16", arch="sm_90a", plan=_plan(1001, "SH"))
    (kernel,) = sched.lower("sm_90a").kernels
    assert kernel.grid[0] == 40 - 40 % 8
    loop = _tile_loop(kernel.body)
    # the weight and the bias are read from global memory before the tile loop only; inside it
    # every run is one aligned shared load of their windows
    for name in ("W", "B"):
        assert _reads_of(kernel.body, name) and not _reads_of(loop, name), name
        assert _reads_of(loop, f"{name}_win"), name
    src = fs.compile(sched, arch="sm_90a").source
    # copied as they are, through L1, then shifted in shared memory
    assert "W copied as it is" in src and "B copied as it is" in src
    assert src.count("cp.async.ca.shared.global") == 2 and "the operands' raw copies have landed" in src


def test_a_window_shifts_in_batches_within_a_quarter_of_the_registers():
    # LayerNorm 4096 x 4095 on prefetching windows: five window vectors a thread, two registers
    # pairs (8 registers) each; six blocks of 128 threads an SM leave 85 registers, a quarter of
    # them two vectors' pairs, so three batches of two; at four blocks an SM (128) batches of three.
    # The interpreter runs the second
    six = RowPlan(128, 8, 5, 1, blocks_per_sm=6, row_memory="SH", aligned=True, persistent=True, tile_stages=2)
    kernel = fs.recipes.layernorm(4096, 4095, dtype="bf16", arch="sm_90a", plan=six).lower("sm_90a").kernels[0]
    assert {r.name: r.size for r in kernel.regs}["W_win_pair"] == 2 * 16
    plan = RowPlan(128, 8, 5, 1, blocks_per_sm=4, row_memory="SH", aligned=True, persistent=True, tile_stages=2)
    sched = fs.recipes.layernorm(19, 4095, dtype="bf16", arch="sm_90a", plan=plan)
    assert {r.name: r.size for r in sched.lower("sm_90a").kernels[0].regs}["W_win_pair"] == 3 * 16
    fs.testing.assert_schedule_correct(sched, examples=2, arch="sm_90a")


@pytest.mark.parametrize("barrier", ["this batch's slots are read", "the operands' raw copies have landed"])
def test_the_windows_fill_without_a_barrier_is_a_race(barrier):
    # the shift's reads of the raw slots and its writes in place, and the raw copies' wait and the
    # shift: without the barrier between them the interpreter reports the hazard
    sched = fs.recipes.rmsnorm(20, 333, dtype="f16", arch="sm_90a", plan=_plan(333, "SH"))
    prog = sched.lower("sm_90a")
    feed = {b.name: a for b, a in zip(prog.inputs, fs.testing.random_arrays(sched, 0))}

    def drop(s):
        return None if isinstance(s, ir.Barrier) and barrier in s.comment else s

    bad = planted(prog, drop)
    assert bad != prog
    with pytest.raises(fs.HazardError):
        run_program(bad, dict(feed))


def test_the_rows_read_the_blocks_window():
    # the rows' runs of W are the setup's: with the setup's stores into W_win dropped, Y changes
    # (and the second row of a block reads what its first did: the same window)
    sched = fs.recipes.rmsnorm(20, 333, dtype="f16", arch="sm_90a", plan=_plan(333, "SH"))
    prog = sched.lower("sm_90a")
    feed = {b.name: a for b, a in zip(prog.inputs, fs.testing.random_arrays(sched, 0))}
    good = run_program(prog, dict(feed))["Y"]

    def no_window_stores(s):
        stores = isinstance(s, ir.AtomCall) and s.atom.name.startswith("st_shared") and _reads_of([s], "W_win")
        return None if stores else s

    bad = run_program(planted(prog, no_window_stores), dict(feed))["Y"]
    assert not np.array_equal(np.asarray(good, np.float32), np.asarray(bad, np.float32))


def test_an_unpersistent_window_keeps_its_shifted_runs():
    # one row a block: the weight's runs come from its aligned vectors every row, no window buffer
    plan = attrs.evolve(_plan(1001, "SH"), persistent=False)
    src = fs.compile(fs.recipes.rmsnorm(20, 1001, dtype="bf16", arch="sm_90a", plan=plan), arch="sm_90a").source
    assert "W_win" not in src and "shift_halves" in src


def test_the_persistent_plans_come_from_the_tile_model():
    args = row_model.measured_plan_args
    a = args("rmsnorm", 4095, "bf16", True)
    assert a["staged_window"] and a["persistent_window_blocks"] == row_model.PERSISTENT_WINDOW_BLOCKS["rmsnorm"]
    assert "persistent_window_blocks" not in args("rmsnorm", 4095, "bf16", False)      # measured on sm_90a only
    assert "persistent_window_blocks" not in args("rmsnorm", 9999, "bf16", True)
    assert "persistent_window_blocks" not in args("softmax", 8191, "bf16", True)
    p = norms.recipe_plan("rmsnorm", 4096, 4095, "bf16", "sm_90a")
    # (96 threads x 6 passes: whole warps, where 128 x 5 would leave all but one chunk of the last idle)
    assert p.persistent and p.aligned and p.row_memory == "SH" and p.tile_stages == 2 and \
        p.lanes == row_model.window_warps(4095, 128, p.blocks_per_sm)[0] == 96
    # shared memory bounds the blocks: the row's windows (two: the next one in flight) and the weights'
    shared = 228 * 1024
    for op, cols, weights in (("rmsnorm", 4095, 1), ("layernorm", 8191, 2), ("rmsnorm", 8191, 1)):
        q = norms.recipe_plan(op, 4096, cols, "bf16", "sm_90a")
        window = -(-(cols + 7) // 8) * 8 * 2
        block = q.tile_stages * q.reps * q.span * 2 + weights * window + 1024
        assert q.persistent and q.blocks_per_sm * block <= shared, (op, cols, q)
        # the blocks are counted on the power-of-two threads' window, which whole warps then
        # take in no more shared memory (rows.whole_warps)
        pl = row_model.measured_plan_args(op, cols, "bf16", True).get("persistent_window_threads",
                                                                      row_model.STAGED_WINDOW_THREADS)
        assert q.lanes == row_model.window_warps(cols, pl, q.blocks_per_sm)[0], (op, cols, q)
        block = q.tile_stages * row_model.window_passes(cols, pl, 8) * pl * 8 * 2 + weights * window + 1024
        # (LayerNorm's prefetching windows: room for its two reductions' registers)
        cap = row_model.PERSISTENT_WINDOW_BLOCKS[op] if op != "layernorm" or q.tile_stages == 1 else \
            min(row_model.PERSISTENT_WINDOW_BLOCKS[op], row_model.deviation_blocks(q.lanes, q.reps * q.vec))
        assert q.blocks_per_sm == cap or (q.blocks_per_sm + 1) * block > shared
    assert not norms.recipe_plan("rmsnorm", 4096, 4095, "bf16", "sm_80").persistent
    with pytest.raises(ValueError, match="persistent_window_blocks"):
        row_model.row_plan(8, 4095, "bf16", persistent_window_blocks=-1)


def test_add_rmsnorms_short_rows_take_eight_blocks_of_the_fuller_window():
    assert row_model.fuller_window_threads(2047, (128, 256)) == 128      # 257 chunks: 384 slots, not 512
    assert row_model.fuller_window_threads(3583, (128, 256)) == 256      # 449 chunks: 512 slots either way
    assert row_model.fuller_window_threads(1535, (256, 128)) == 256
    for cols, lanes in ((1535, 256), (2047, 128), (3001, 128), (3583, 256), (3999, 256)):
        p = norms.recipe_plan("add_rmsnorm", 8192, cols, "bf16", "sm_90a")
        lanes = row_model.window_warps(cols, lanes, 8)[0]           # (2,047: 96 threads x 3 passes)
        assert p.persistent and p.aligned and p.row_memory == "SH" and (p.lanes, p.blocks_per_sm) == (lanes, 8), p
    # from 4,000 columns as before: four blocks of 256 threads (4,095: whole warps, 288 x 2)
    p = norms.recipe_plan("add_rmsnorm", 8192, 4095, "bf16", "sm_90a")
    assert p.persistent and (p.lanes, p.blocks_per_sm) == (288, 4)
    assert not norms.recipe_plan("add_rmsnorm", 8192, 1499, "bf16", "sm_90a").persistent
    assert not norms.recipe_plan("add_rmsnorm", 8192, 3001, "bf16", "sm_80").persistent


@pytest.mark.parametrize("kind, cols", [("rmsnorm", 4095), ("rmsnorm", 8191), ("layernorm", 6001),
                                        ("layernorm", 8191), ("add_rmsnorm", 9999),
                                        ("add_rmsnorm", 1501), ("add_rmsnorm", 2047), ("add_rmsnorm", 3583),
                                        ("softmax", 2817), ("softmax", 4095), ("softmax", 5999),
                                        # LayerNorm's two reductions at the registers the rule leaves
                                        # (rows.deviation_blocks): 24, 32, 40, 48 and 56 values a
                                        # thread (56 on 128 and on 256 threads)
                                        ("layernorm", 2801), ("layernorm", 3583), ("layernorm", 4095),
                                        ("layernorm", 6137), ("layernorm", 7803), ("layernorm", 6501),
                                        ("layernorm", 12501)])
@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_the_persistent_plans_compile_without_spills(kind, cols, dt):
    sched = getattr(fs.recipes, kind)(4096, cols, dtype=dt, arch="sm_90a")
    assert "persistent=True" in repr(sched.strategies)
    assert fs.compile(sched, arch="sm_90a").spills == 0


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(R=st.integers(1, 30), C=st.integers(1, 400), dt=st.sampled_from(["f16", "bf16", "f32"]),
       kind=st.sampled_from(["rmsnorm", "layernorm", "add_rmsnorm", "softmax"]),
       lanes=st.sampled_from([32, 64]), memory=st.sampled_from(["RF", "SH"]), occupancy=st.sampled_from([0, 1, 3]),
       stages=st.integers(1, 2))
def test_hand_written_persistent_windows(R, C, dt, kind, lanes, memory, occupancy, stages):
    # any row count (fewer than 8 blocks, or a grid rounded down to a multiple of 8), any length,
    # any phase, the row in registers or in shared memory, the next row in flight or not (with
    # LayerNorm's and softmax's statistics in two reductions or the tuple by rows.deviations_fit):
    # ScheduleError at check(), or the interpreter equals numpy with no hazard
    plan = attrs.evolve(_plan(C, memory, lanes), blocks_per_sm=occupancy,
                        tile_stages=stages if memory == "SH" else 1)
    try:
        sched = _recipe(kind, R, C, dtype=dt, arch="sm_90a", plan=plan)
        sched.check("sm_90a")
    except fs.ScheduleError:
        return
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def _users_rows(R, C, dtype):
    """A user's fused kernel over rows: ``Y = (X + Z) * W + B`` and ``S = sum(Y)`` per row."""
    from firesched.spec import Fused, Pointwise, Reduce
    from firesched.tensor import GL, KERNEL, Tensor, Tile

    def t(name, dims, shape, dt=dtype):
        return Tile(Tensor(name, dt, GL, dims, shape, dims[-1]), shape)

    x, z, y = (t(n, ("r", "c"), (R, C)) for n in ("X", "Z", "Y"))
    h, g = t("H", ("r", "c"), (R, C), "f32"), t("G", ("r", "c"), (R, C), "f32")
    w, b = t("W", ("c",), (C,)), t("B", ("c",), (C,))
    s = t("S", ("r",), (R,), "f32")
    return Fused.kernel(Pointwise("add", (x, z), h, KERNEL), Pointwise("mul", (h, w), g, KERNEL),
                        Pointwise("add", (g, b), y, KERNEL), Reduce("sum", g, s, ("c",), KERNEL), results=("Y", "S"))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(R=st.integers(1, 40), C=st.integers(1, 300), dt=st.sampled_from(["f16", "bf16"]),
       lanes=st.sampled_from([32, 64]), occupancy=st.sampled_from([0, 2]))
def test_a_users_fused_rows_on_a_persistent_grid(R, C, dt, lanes, occupancy):
    # a hand-written fused kernel with two weights, its locals in registers, on a persistent grid
    # with an aligned window: each weight is shifted into its window once a block
    from firesched.strategies import part, place

    spec = _users_rows(R, C, dt)
    plan = attrs.evolve(_plan(C, "RF", lanes), blocks_per_sm=occupancy)
    strategies = [*row_model.kernel_strategies(plan), *(place(t.name, fs.RF) for t in spec.locals)]
    strategies += [part(i, *row_model.part_strategies(plan, walk_row="c" in sp.dims)) for i, sp in enumerate(spec.body)]
    sched = spec.schedule(*strategies)
    prog = sched.lower("sm_90a")
    (kernel,) = prog.kernels
    if kernel.grid[0] > 8:
        assert kernel.grid[0] % 8 == 0
    if kernel.grid[0] % 8 == 0 and C >= 16 and C % 2:
        # (a grid of fewer than 8 blocks, one row each, keeps the shifted runs: its phase is not
        # proved the same from tile to tile; a row of a few elements reads its weights element by
        # element, and even rows read them in pairs or vectors in place)
        assert _reads_of(_tile_loop(kernel.body), "W_win") and _reads_of(_tile_loop(kernel.body), "B_win")
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


@pytest.mark.parametrize("exchange", ["barrier", "push"])
def test_a_persistent_cluster_plan_is_honoured_or_refused(exchange):
    # RowPlan(persistent=True) on a cluster's rows reaches to_blocks: with barrier.cluster the
    # clusters walk the rows (right against numpy); with pushes (one exchange buffer a launch) the
    # strategy refuses it and says why, rather than the plan dropping persistent silently
    plan = RowPlan(64, 8, 1, 1, cluster=2, part=512, persistent=True)
    if exchange == "push":
        with pytest.raises(fs.ScheduleError, match="not persistent"):
            fs.recipes.rmsnorm(10, 1000, dtype="f16", arch="sm_90a", exchange=exchange, plan=plan)
        return
    sched = fs.recipes.rmsnorm(10, 1000, dtype="f16", arch="sm_90a", exchange=exchange, plan=plan)
    assert "persistent=True" in repr(sched.strategies)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


@pytest.mark.parametrize("op, cols", [("layernorm", 4219), ("layernorm", 5139), ("layernorm", 7035),
                                      ("rmsnorm", 7771), ("rmsnorm", 7931), ("layernorm", 7025),
                                      ("layernorm", 7027)])
def test_the_persistent_blocks_fit_their_sm(op, cols):
    # the blocks an SM the plan asks for hold the row's window (and the next one's), the weights',
    # the partial results and the 1 KiB the driver keeps for each block: lowering checks the
    # occupancy against all of it (at these lengths one block more was asked for than fits, and a
    # persistent grid's extra wave ran alone; at 7,025 and 7,027 the check counted 128 bytes of
    # alignment a buffer where the layout takes 48 in all, and refused four blocks that fit)
    getattr(fs.recipes, op)(8192, cols, dtype="bf16", arch="sm_90a").lower("sm_90a")


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_short_odd_rmsnorm_rows_take_a_warp_a_row_on_a_persistent_grid(dt):
    # 1,000 - 1,499 columns from 8,192 rows: a warp a row, sixteen blocks an SM, the next row in
    # flight; fewer rows keep the element plan (the window's fill is not paid back)
    many = fs.recipes.rmsnorm(16384, 1023, dtype=dt, arch="sm_90a")
    assert "persistent=True, occupancy=16" in repr(many.strategies) and "pipeline(stages=2)" in repr(many.strategies)
    assert "tile(c=8) >> to_threads()" in repr(many.strategies)
    for few in (fs.recipes.rmsnorm(4096, 1023, dtype=dt, arch="sm_90a"),
                fs.recipes.rmsnorm(16384, 1023, dtype=dt, arch="sm_80")):
        assert "persistent=True" not in repr(few.strategies)
    assert row_model.measured_plan_args("rmsnorm", 1279, dt, True, 8192)["persistent_window_threads"] == 32
    assert "persistent_window_threads" not in row_model.measured_plan_args("rmsnorm", 1279, dt, True, 8191)
    # the plan on a few rows, through the interpreter: two rows a block, the last block's second
    # missing, phases 0 .. 7
    plan = RowPlan(32, 8, 5, 1, blocks_per_sm=16, row_memory="SH", aligned=True, persistent=True, tile_stages=2)
    sched = fs.recipes.rmsnorm(21, 1023, dtype=dt, arch="sm_90a", plan=plan)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    assert fs.compile(sched, arch="sm_90a").spills == 0


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_short_odd_layernorm_and_softmax_rows_take_a_warp_or_two_a_row(dt):
    # LayerNorm's odd rows of 1,057 - 1,699 columns and softmax's of 1,100 - 1,529 from 8,192 rows:
    # the block of a warp or two whose passes over the window idle least, at 768 threads an SM or
    # as many blocks as fit; elsewhere (fewer rows, other lengths, sm_80) the element plans
    def plan(op, rows, cols, arch="sm_90a"):
        return fs.recipes.norms.recipe_plan(op, rows, cols, dt, arch)

    for op, cols, lanes in (("layernorm", 1535, 32), ("layernorm", 1407, 64), ("layernorm", 1101, 32),
                            ("softmax", 1151, 32), ("softmax", 1279, 64), ("softmax", 1529, 64)):
        p = plan(op, 16384, cols)
        fit = row_model.blocks_that_fit(row_model.persistent_window_bytes(cols, lanes, 2, row_model.ROW_OPERANDS[op]),
                                        row_model.SHARED_PER_SM)
        assert (p.lanes, p.persistent, p.tile_stages, p.row_memory) == (lanes, True, 2, "SH"), (op, cols, p)
        assert p.blocks_per_sm == min(768 // lanes, fit), (op, cols, p)
    for op, rows, cols, arch in (("layernorm", 16384, 1023, "sm_90a"), ("layernorm", 8191, 1535, "sm_90a"),
                                 ("layernorm", 16384, 1535, "sm_80"), ("softmax", 16384, 1535, "sm_90a"),
                                 ("softmax", 16384, 1023, "sm_90a")):
        assert not plan(op, rows, cols, arch).persistent, (op, rows, cols, arch)
    # the plans on a few rows through the interpreter (two rows a block, phases 0 .. 7), and at
    # the real shapes without spills
    for op, cols in (("layernorm", 1535), ("softmax", 1279)):
        real = plan(op, 16384, cols)
        assert fs.compile(getattr(fs.recipes, op)(16384, cols, dtype=dt, arch="sm_90a"), arch="sm_90a").spills == 0
        sched = getattr(fs.recipes, op)(19, cols, dtype=dt, arch="sm_90a", plan=real)
        fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
