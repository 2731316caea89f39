"""``align(c=vec)``: rows that are not a whole number of 16-byte vectors long, walked in windows
that start at the aligned vector holding each row's first element.

The interpreter runs hand-written and recipe schedules against numpy over every phase of the
rows (odd lengths, several rows so that the phases cycle), proves every vector aligned, and
catches a planted hazard: an edge vector accessed whole (past the end of the tensor) or an edge
element stored unpredicated (into the neighbouring row).  The strategy's errors name the fix."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ir
from firesched.errors import HazardError, ScheduleError
from firesched.recipes import rows as row_model
from firesched.recipes.rows import RowPlan
from firesched.simulate.interp import run_program
from firesched.spec import Fused, Move, Pointwise, Reduce
from firesched.strategies import align, done, part, place, tile, to_blocks, to_threads
from firesched.tensor import GL, KERNEL, Tensor, Tile
from firesched.testing.planting import planted


def _recipe(kind, *args, **kw):
    if kind == "causal":
        return fs.recipes.softmax(*args, causal=True, **kw)
    if kind == "layernorm_tuple":
        return fs.recipes.layernorm(*args, tuple_stats=True, **kw)
    return getattr(fs.recipes, kind)(*args, **kw)


def _t(name, dims, shape, dtype="f16"):
    return Tile(Tensor(name, dtype, GL, dims, shape, dims[-1]), shape)


def _add_rows(R, C, dtype="f16"):
    """A user's fused kernel over rows: ``Y = (X + Z) * W``, ``S = sum(Y)`` per row."""
    x, z, y = (_t(n, ("r", "c"), (R, C), dtype) for n in ("X", "Z", "Y"))
    h = _t("H", ("r", "c"), (R, C), "f32")
    w = _t("W", ("c",), (C,), dtype)
    s = _t("S", ("r",), (R,), "f32")
    return Fused.kernel(Pointwise("add", (x, z), h, KERNEL), Pointwise("mul", (h, w), y, KERNEL),
                        Reduce("sum", h, s, ("c",), KERNEL), results=("Y", "S"))


def _aligned(spec, lanes, vec, *, more=(), staged=False):
    """``spec`` on one row a block, aligned to ``vec``, its locals in registers; ``staged``: the
    row its first part copies (a plain ``Move``) waits in shared memory, the block's copy."""
    plan = RowPlan(lanes, vec, 1, 1, aligned=True)
    first = spec.body[0]
    row = first.dst.name if staged and isinstance(first, Move) and not first.ops else None
    strategies = [*row_model.kernel_strategies(plan), *more,
                  *(place(t.name, fs.SH, pad=lanes * vec) if t.name == row else place(t.name, fs.RF)
                    for t in spec.locals)]
    strategies += [part(i, *row_model.part_strategies(plan, walk_row="c" in sp.dims))
                   for i, sp in enumerate(spec.body) if not (row and i == 0)]
    return spec.schedule(*strategies)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "layernorm_tuple", "add_rmsnorm", "softmax", "causal"])
@pytest.mark.parametrize("dt, cols", [("bf16", 1001), ("f16", 263), ("f32", 517), ("f16", 1030)])
def test_aligned_rows_match_numpy_over_every_phase(kind, dt, cols):
    # 9 rows of an odd length start at every offset modulo 8 (and modulo 4 for f32); 1,030 f16
    # (4-byte aligned rows) at every even one.  The tile model aligns odd 16-bit rows; the others
    # take an aligned plan given by hand
    default = row_model.row_plan(9, cols, dt, align=True)
    assert default.aligned == (dt != "f32" and cols % 2 == 1)
    wide = 16 // (4 if dt == "f32" else 2)
    plan = default if default.aligned else RowPlan(64, wide, -(-(cols + wide - 1) // (64 * wide)), 1, aligned=True)
    sched = _recipe(kind, 9, cols, dtype=dt, arch="sm_90a", plan=plan)
    assert "align(c=" in repr(sched.strategies), sched.strategies
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_the_window_is_printed_and_reads_whole_vectors():
    sched = fs.recipes.rmsnorm(4096, 4095, dtype="bf16", arch="sm_90a", plan=row_model.row_plan(4096, 4095, align=True))
    text = str(sched)
    assert "align(c=8)" in text and "aligned(8)" in text and "X:GL bf16[1x4102]" in text
    assert "Reduce<block>(sum over c: Q:RF f32[1x4102] -> Rstd:RF f32[1]) with scale(0.0002442)" in text
    src = fs.compile(sched, arch="sm_90a").source
    assert "ld.global.v4.b32" in src and "st.global.v4.b32" in src
    assert eval(repr(align(c=8)), {"align": align}) == align(c=8)


@pytest.mark.parametrize("vec, lanes", [(2, 32), (4, 64), (8, 32), (16, 32)])
def test_a_users_fused_rows_aligned(vec, lanes):
    # a hand-written fused kernel (two row inputs, a weight, two outputs, a sum) at any vector
    # width: 2 and 4 elements give 4- and 8-byte windows, 16 elements two 16-byte vectors a step
    sched = _aligned(_add_rows(10, 333), lanes, vec)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(R=st.integers(1, 9), C=st.integers(1, 700), dt=st.sampled_from(["f16", "bf16", "f32"]),
       kind=st.sampled_from(["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal", "fused"]),
       vec=st.sampled_from([2, 4, 8]), lanes=st.sampled_from([32, 64, 128]), staged=st.booleans())
def test_hand_written_aligned_chains(R, C, dt, kind, vec, lanes, staged):
    # any row length (1 included: the window is wider than the row), any phase, any vector
    # width, a recipe's spec or a user's, the row in registers or (staged) copied by the block
    # into shared memory in chunks of the window: ScheduleError at check(), or the interpreter
    # equals numpy with no hazard
    if kind == "fused":
        spec = _add_rows(R, C, dt)
    else:
        spec = _recipe(kind, R, C, dtype=dt, arch="sm_90a").spec
    try:
        sched = _aligned(spec, lanes, vec, staged=staged)
        sched.check("sm_90a")
    except ScheduleError:
        return
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def _lowered(sched):
    """``sched``'s program for sm_90a and random inputs by buffer name."""
    prog = sched.lower("sm_90a")
    return prog, {b.name: a for b, a in zip(prog.inputs, fs.testing.random_arrays(sched, 0))}


def _prog(R=5, C=1001):
    sched = fs.recipes.rmsnorm(R, C, dtype="f16", arch="sm_90a", plan=row_model.row_plan(R, C, "f16", align=True))
    return (sched, *_lowered(sched))


@pytest.mark.parametrize("atom, match", [("ld_global_16", "outside|bounds|past"), ("st_global_2", "out-of-bounds write")],
                         ids=["edge-vector-read-whole", "edge-element-stored-unpredicated"])
def test_planted_edge_hazards_are_caught(atom, match):
    # the last row ends 5·1001 = 5005 elements in, inside a vector: its edge vector read whole, or
    # its edge elements stored without their predicates, pass the tensor's end (the other rows'
    # would overwrite their neighbours')
    _, prog, feed = _prog()
    run_program(prog, dict(feed))                   # the unplanted kernel runs clean

    def unpredicated(s):
        if isinstance(s, ir.AtomCall) and s.atom.name.startswith(atom):
            return attrs.evolve(s, pred=1)
        return s

    with pytest.raises(HazardError, match=match):
        run_program(planted(prog, unpredicated), dict(feed))


def test_align_refusals_name_the_fix():
    spec = fs.recipes.rmsnorm(8, 1001, dtype="f16", arch="sm_90a").spec
    with pytest.raises(ScheduleError, match="one dimension"):
        align(c=8, r=1)
    with pytest.raises(ScheduleError, match="power of two"):
        spec.schedule(tile(r=1) >> to_blocks() >> align(c=6))
    with pytest.raises(ScheduleError, match="block"):
        spec.schedule(align(c=8))
    with pytest.raises(ScheduleError, match="one row a block") as e:
        spec.schedule(tile(r=2) >> to_blocks() >> align(c=8))
    assert "tile(r=1)" in str(e.value)
    with pytest.raises(ScheduleError, match="before place"):
        spec.schedule(tile(r=1) >> to_blocks(), place("Xr", fs.RF), align(c=8))
    with pytest.raises(ScheduleError, match="whole row, or a thread-block cluster's part") as e:
        Move.kernel({"r": 8, "c": 1001}, src="f16").schedule(tile(r=1, c=512) >> to_blocks(), align(c=8))
    assert "cluster=" in str(e.value)
    with pytest.raises(ScheduleError, match="not whole vectors of 8") as e:
        spec.schedule(tile(r=1, c=508) >> to_blocks(cluster=2), align(c=8))
    assert "tile(c=512)" in str(e.value)
    with pytest.raises(ScheduleError, match="no dimension"):
        spec.schedule(tile(r=1) >> to_blocks() >> align(k=8))


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "layernorm_tuple", "softmax", "add_rmsnorm", "causal"])
@pytest.mark.parametrize("cols, plan", [
    (4095, RowPlan(256, 8, 2, 1, cluster=2, part=2048, aligned=True, row_memory="SH")),
    (4093, RowPlan(64, 8, 2, 1, cluster=8, part=512, aligned=True, row_memory="SH", exchange="push")),
    (1001, RowPlan(64, 8, 1, 1, cluster=2, part=504, aligned=True)),
    (10235, RowPlan(96, 8, 4, 1, cluster=4, part=2560, aligned=True, row_memory="SH"))])
def test_aligned_windows_of_a_clusters_parts(kind, cols, plan):
    # a cluster's parts of 9 odd rows (every phase), each part on an aligned window reaching into
    # the next part (in shared memory or registers, both exchanges, parts whole passes or not,
    # whole warps): the interpreter equals numpy with no hazard
    sched = _recipe(kind, 9, cols, dtype="f16", arch="sm_90a", plan=plan)
    assert "clusters(" in str(sched) and "aligned(8)" in str(sched)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(R=st.integers(1, 9), C=st.integers(9, 3000), dt=st.sampled_from(["f16", "bf16"]),
       kind=st.sampled_from(["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"]),
       cluster=st.sampled_from([2, 3, 4, 8]), lanes=st.sampled_from([32, 64, 96, 128]),
       staged=st.booleans(), exchange=st.sampled_from(["barrier", "push"]), extra=st.integers(0, 2))
def test_hand_written_cluster_windows(R, C, dt, kind, cluster, lanes, staged, exchange, extra):
    # any row length and cluster size, parts of whole vectors a little longer than their share
    # (extra): ScheduleError at check(), or the interpreter equals numpy with no hazard
    part = (-(-C // (8 * cluster)) + extra) * 8
    reps = -(-(part + 7) // (lanes * 8))
    plan = RowPlan(lanes, 8, reps, 1, cluster=cluster, part=part, aligned=True, exchange=exchange,
                   row_memory="SH" if staged else "RF")
    try:
        sched = _recipe(kind, R, C, dtype=dt, arch="sm_90a", plan=plan)
        sched.check("sm_90a")
    except ScheduleError:
        return
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_the_measured_choices_come_from_the_tile_model():
    # the recipes take their aligned windows, element plans, half blocks and staged odd rows from
    # one place (rows.measured_plan_args)
    args = row_model.measured_plan_args
    assert args("causal", 20480, "bf16", True)["half_block_values"] == row_model.CAUSAL_VALUES
    assert args("add_rmsnorm", 20482, "f16", False)["odd_values"] == row_model.ADD_RMSNORM_STAGED_PAIRS
    assert args("rmsnorm", 16383, "bf16", True)["odd_values"] == row_model.STAGED_ODD_VALUES["rmsnorm"]
    assert "odd_values" not in args("rmsnorm", 16383, "bf16", False) and args("rmsnorm", 16383, "bf16", False)["align"]
    with pytest.raises(ValueError, match="allowed"):
        args("transpose", 4095, "bf16", True)


def test_rows_of_different_strides_are_refused_at_check():
    # X is 1001 long, Z a transposed view would not be contiguous along c; two row tensors of
    # different lengths start at different phases
    x = _t("X", ("r", "c"), (4, 1001))
    z = Tile(Tensor("Z", "f16", GL, ("r", "c"), (4, 1001), "r"), (4, 1001))
    y = _t("Y", ("r", "c"), (4, 1001))
    spec = Fused.kernel(Pointwise("add", (x, z), y, KERNEL))
    with pytest.raises(ScheduleError, match="contiguous"):
        spec.schedule(tile(r=1) >> to_blocks() >> align(c=8))


def test_a_staged_row_in_an_aligned_window():
    # the row placed in shared memory: its copy goes element by element (odd rows), the
    # reductions skip the window's ends
    spec = fs.recipes.rmsnorm(6, 777, dtype="bf16", arch="sm_90a", plan=RowPlan(64, 8, 2, 1, aligned=True)).spec
    plan = RowPlan(64, 8, 2, 1, aligned=True)
    strategies = [*row_model.kernel_strategies(plan), place("Xr", fs.SH, pad=plan.span),
                  *(place(t.name, fs.RF) for t in spec.locals if t.name != "Xr")]
    strategies += [part(i, *row_model.part_strategies(plan, walk_row="c" in sp.dims))
                   for i, sp in enumerate(spec.body) if not (isinstance(sp, Move) and i == 0)]
    sched = spec.schedule(*strategies)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "softmax", "layernorm_tuple"])
@pytest.mark.parametrize("dt, rows, cols", [("bf16", 9, 1001), ("f16", 9, 777), ("bf16", 1, 13), ("f16", 10, 2047)])
def test_a_staged_window_is_copied_in_whole_chunks(kind, dt, rows, cols):
    # the row's window copied into shared memory by the block in 16-byte cp.async chunks: the
    # first holds the row before's last elements (never used), the last reads up to the row's end
    # (src-size), past the tensor's end on the last row; every phase of the rows against numpy
    lanes = 64
    plan = RowPlan(lanes, 8, -(-(cols + 7) // (8 * lanes)), 1, aligned=True, row_memory="SH")
    sched = _recipe(kind, rows, cols, dtype=dt, arch="sm_90a", plan=plan)
    src = fs.compile(sched, arch="sm_90a").source
    assert "cp.async.cg.shared.global [%0], [%1], 16, %2;" in src and "unaligned rows, element copies" not in src
    assert "(an aligned window: the row's last chunk partial)" in src
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("lanes, blocks", [(512, 3), (1024, 2)])
def test_a_staged_window_on_wide_blocks_matches_numpy(kind, lanes, blocks):
    # the recipes' longest odd windows take 512 or 1,024 threads (rows.STAGED_WINDOW_WIDE); the
    # same plans on a row of 9,001 columns (two or three passes, the last one partial)
    plan = RowPlan(lanes, 8, -(-(9001 + 7) // (8 * lanes)), 1, blocks_per_sm=blocks, aligned=True, row_memory="SH")
    sched = _recipe(kind, 2, 9001, dtype="bf16", arch="sm_90a", plan=plan)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_a_staged_windows_whole_last_chunk_is_caught():
    # planted: the window's chunks read whole (no src-size): the last row's last chunk passes the
    # end of X (9 x 1001 = 9009 elements; its chunk runs to 9016)
    plan = RowPlan(64, 8, 2, 1, aligned=True, row_memory="SH")
    prog, feed = _lowered(fs.recipes.softmax(9, 1001, dtype="bf16", arch="sm_90a", plan=plan))
    run_program(prog, dict(feed))

    def whole(s):
        if isinstance(s, ir.AtomCall) and s.src_bytes is not None:
            return attrs.evolve(s, src_bytes=None)
        return s

    with pytest.raises(HazardError, match="out-of-bounds read"):
        run_program(planted(prog, whole), dict(feed))


@pytest.mark.parametrize("rows, cols, reps", [(9, 1001, 2), (2, 8193, 17)], ids=["branch", "batched"])
def test_a_weights_shifted_runs_are_checked(rows, cols, reps):
    # the weight's runs in the window come from the two aligned vectors holding them
    # (threads.shifted_run), under a branch, or (17 passes) hoisted out of it, predicated, and
    # batched (batch_loads); planted: the pair loaded unguarded, so the last run's pair passes the
    # weight's end (1,001 elements: the runs of the row's end reach 1,008)
    plan = RowPlan(64, 8, reps, 1, aligned=True, row_memory="SH")
    sched = fs.recipes.layernorm(rows, cols, dtype="bf16", arch="sm_90a", plan=plan)
    src = fs.compile(sched, arch="sm_90a").source
    assert "convert.shift_halves_b16x8" in src and ("in flight at a time" in src) == (reps >= 8)
    prog, feed = _lowered(sched)
    run_program(prog, dict(feed))

    def pair(s) -> bool:
        return isinstance(s, ir.AtomCall) and "the aligned vectors holding a run" in s.comment

    def unguarded_branch(s):
        return attrs.evolve(s, cond=1) if any(pair(x) for x in ir.rewrite.flat([s.then])) else s

    def unguarded_load(s):
        return attrs.evolve(s, pred=1) if pair(s) else s

    with pytest.raises(HazardError, match="out-of-bounds read"):
        run_program(planted(prog, unguarded_load, branches=unguarded_branch), dict(feed))


def test_the_recipes_stage_odd_rows_in_windows_where_measured():
    # rows.staged_window_faster: RMSNorm from 4,096 columns, LayerNorm and softmax from 6,000, add
    # + RMSNorm (its sum staged) from 8,000 but where its window in registers fills whole passes
    # (24,569: 3,072 vectors on 1,024 threads); 256 threads, three blocks an SM while two fit
    # (more on a persistent grid, rows.PERSISTENT_WINDOW_COLS: RMSNorm from 1,500 columns, LayerNorm
    # from 1,700, add + RMSNorm from 1,500 and softmax from 1,700 to 5,999; causal softmax from 20,000 columns at two); not
    # causal softmax, not even rows, not rows whose window one block alone does not hold (from about
    # 116,000 columns; two blocks' windows that do not fit go on one block alone: STAGED_WINDOW_ALONE)
    from firesched.recipes.norms import recipe_plan

    for op, cols in [("rmsnorm", 16383), ("layernorm", 6001), ("softmax", 40959), ("rmsnorm", 4097), ("softmax", 4097),
                     ("rmsnorm", 40959), ("add_rmsnorm", 16383), ("add_rmsnorm", 32767), ("rmsnorm", 4095),
                     ("add_rmsnorm", 6001), ("causal", 24569), ("causal", 20001)]:
        p = recipe_plan(op, 2048, cols, "bf16", "sm_90a")
        # (a persistent block keeping two rows in flight takes rows.PERSISTENT_PREFETCH_THREADS;
        # the longest windows rows.STAGED_WINDOW_WIDE's blocks)
        wide = [t for start, t in row_model.STAGED_WINDOW_WIDE.get(op, ()) if cols >= start]
        threads = row_model.STAGED_WINDOW_THREADS if p.tile_stages == 1 else row_model.PERSISTENT_PREFETCH_THREADS
        threads = wide[-1] if wide and not p.persistent else threads
        # (whole warps where the power-of-two block's last pass would hold a few chunks)
        threads = row_model.window_warps(cols, threads, p.blocks_per_sm)[0]
        assert p.aligned and p.row_memory == "SH" and p.lanes == threads, (op, cols, p)
        most = row_model.PERSISTENT_WINDOW_BLOCKS[op] if p.persistent else \
            row_model.STAGED_WINDOW_BLOCKS_BY_OP.get(op, row_model.STAGED_WINDOW_BLOCKS)
        assert 2 <= p.occupancy <= most
        lo, hi = row_model.PERSISTENT_WINDOW_COLS.get(op, (0, -1))
        assert p.persistent == (lo <= cols <= hi), (op, cols, p)
    for op, cols in [("rmsnorm", 1499), ("layernorm", 1535), ("softmax", 1535), ("causal", 16383), ("add_rmsnorm", 24569),
                     ("add_rmsnorm", 1499), ("softmax", 16384), ("causal", 19999)]:
        p = recipe_plan(op, 2048, cols, "bf16", "sm_90a")
        assert not (p.aligned and p.row_memory == "SH"), (op, cols, p)
    # past what one block's window holds: a cluster's parts, each on an aligned window of its own
    for op, cols in [("softmax", 116009), ("causal", 131071), ("layernorm", 262143)]:
        p = recipe_plan(op, 2048, cols, "bf16", "sm_90a")
        assert p.aligned and p.row_memory == "SH" and p.cluster > 1 and p.part % 8 == 0, (op, cols, p)
    assert not row_model.row_plan(8, 16383, "f32", staged_window=True, stage=True).aligned
    # the wide blocks from rows.STAGED_WINDOW_WIDE's columns on, not below, not without clusters
    for op, steps in row_model.STAGED_WINDOW_WIDE.items():
        before = row_model.STAGED_WINDOW_THREADS
        for wide_from, wide in steps:
            assert wide_from % 2 == 0        # (odd rows on either side)
            p = recipe_plan(op, 1024, wide_from + 1, "bf16", "sm_90a")
            assert p.lanes == wide and p.row_memory == "SH" and 2 <= p.occupancy <= 3, (op, p)
            below = recipe_plan(op, 1024, wide_from - 1, "bf16", "sm_90a")
            assert below.lanes == before and below.row_memory == "SH", (op, below)
            before = wide
        on_sm80 = recipe_plan(op, 2, 36001, "bf16", "sm_80")
        assert on_sm80.lanes == row_model.STAGED_WINDOW_THREADS and on_sm80.row_memory == "SH", (op, on_sm80)
    assert row_model.row_plan(9, 45001, "bf16", stage=True, staged_window=True, staged_window_threads=512) == \
        row_model.RowPlan(512, 8, 11, 1, blocks_per_sm=2, row_memory="SH", aligned=True)
    with pytest.raises(ValueError, match="staged_window_threads=384; allowed"):
        row_model.row_plan(9, 45001, "bf16", stage=True, staged_window=True, staged_window_threads=384)
    with pytest.raises(ValueError, match="allowed"):
        row_model.staged_window_faster("transpose", 8191)


def test_plain_moves_align_too():
    x, y = _t("X", ("r", "c"), (7, 45)), _t("Y", ("r", "c"), (7, 45))
    sched = Move(x, y, KERNEL).schedule(tile(r=1) >> to_blocks() >> align(c=8), tile(c=8) >> to_threads(), done())
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    assert "ld.global.v4.b32" in fs.compile(sched, arch="sm_90a").source


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "softmax"])
def test_a_leaf_wholly_past_the_row_folds_and_stores_nothing(kind):
    # 601 columns in a window of 76 chunks on 64 threads: the second pass holds chunks 64-75, so
    # thread 40's leaf there lies past the row.  Its folds and stores sit under one test that
    # fails (no element-by-element guards run); only its loads take their edge path (they leave
    # its registers zero)
    from firesched.ir.expr import free_vars
    from firesched.simulate.exprs import compile_expr

    sched = _recipe(kind, 3, 601, dtype="bf16", arch="sm_90a", plan=RowPlan(64, 8, 2, 1, aligned=True))
    kernel = sched.lower("sm_90a").kernels[0]
    loops = {str(s.var) for s in ir.rewrite.walk([kernel.body]) if isinstance(s, ir.For)}
    taken = []
    for s in ir.rewrite.walk([kernel.body]):
        names = {str(v) for v in free_vars(s.cond)} if isinstance(s, ir.If) else set()
        if not names & loops:
            continue
        env = {n: 1 if n in loops else 40 if n == "tid" else 1 for n in names}
        if compile_expr(s.cond)(env):
            taken.append(s)
    inner = [x for s in taken for x in ir.rewrite.walk([s.then])]
    assert taken and all(isinstance(x, ir.AtomCall) for x in inner if not isinstance(x, (ir.Seq, ir.If))), taken
    assert not [x for x in inner if isinstance(x, ir.AtomCall) and isinstance(dict(x.args).get("dst"), ir.MemRef)]
