"""Row parts staged in shared memory (``RowPlan.row_memory = "SH"``): a cluster's part of the row
is copied into shared memory by ``cp.async`` and every later part reads it there, so no thread
holds the row in registers while the cluster exchanges its statistics.  The plans of the tile
model, the interpreter against the same schedules with the row in registers (bitwise) and
against numpy, a planted hazard, and the errors."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ir
from firesched.errors import HazardError, ScheduleError
from firesched.recipes import norms
from firesched.recipes import rows as row_model
from firesched.recipes.rows import RowPlan, row_plan
from firesched.simulate.interp import run_program
from firesched.spec import Move
from firesched.strategies import part, place, tile, to_blocks
from firesched.testing.planting import map_leaves, planted

RNG = np.random.default_rng(11)


def _recipe(kind, *args, **kw):
    """The row recipe of ``kind``; ``causal`` is ``softmax(..., causal=True)``."""
    if kind == "causal":
        return fs.recipes.softmax(*args, causal=True, **kw)
    return getattr(fs.recipes, kind)(*args, **kw)


@pytest.mark.parametrize("cols, cluster, part_, threads, occupancy", [
    (65536, 4, 16384, 256, 6), (49152, 3, 16384, 256, 6), (131072, 8, 16384, 256, 6),
    (262144, 8, 32768, 256, 3), (200000, 7, 28672, 256, 3), (327680, 5, 65536, 1024, 1)])
def test_staged_plans_take_whole_passes(cols, cluster, part_, threads, occupancy):
    plan = row_plan(2, cols, "bf16", clusters=True, stage=True)
    assert (plan.cluster, plan.part, plan.lanes, plan.blocks_per_sm, plan.row_memory) == \
        (cluster, part_, threads, occupancy, "SH")
    assert plan.part % plan.span == 0 and plan.reps * plan.vec <= (64 if cols <= 131072 else 128)
    # shared memory for every block the occupancy asks for
    assert plan.blocks_per_sm * (plan.part * 2 + 1024) <= 227 * 1024


@pytest.mark.parametrize("cols, cluster, part_, threads", [
    (50000, 4, 14336, 256), (100000, 7, 14336, 256), (60000, 4, 16384, 256), (45000, 3, 16384, 256),
    (200000, 7, 28672, 256)])
def test_staged_parts_are_rounded_up_to_whole_passes(cols, cluster, part_, threads):
    # the last block's part reaches past the row; its copy zero-fills that end, and the
    # reductions stop at the row's end.  Clusters of any size up to 8 (100,000: 7 blocks, 45,000: 3)
    plan = row_plan(2, cols, "bf16", clusters=True, stage=True)
    assert (plan.cluster, plan.part, plan.lanes, plan.row_memory) == (cluster, part_, threads, "SH")
    assert plan.part % plan.span == 0 and (plan.cluster - 1) * plan.part < cols <= plan.cluster * plan.part


def test_a_padded_buffer_takes_a_partial_last_pass():
    # place(..., pad=): the tile of 1000 elements in a buffer of 1024, walked in passes of 256
    # (the last partial); the copy zero-fills the tail and does not read the next block's part
    rec = fs.recipes.layernorm(2, 4000, dtype="f32", arch="sm_90a")
    plan = RowPlan(64, 4, 4, 1, cluster=4, part=1000, exchange="push")
    spec = rec.spec
    strategies = [*row_model.kernel_strategies(plan), place("Xr", fs.SH, pad=plan.span),
                  *(place(t.name, fs.RF) for t in spec.locals if t.name != "Xr"),
                  *(part(i, *row_model.part_strategies(plan, walk_row="c" in sp.dims))
                    for i, sp in enumerate(spec.body) if i)]
    sched = spec.schedule(*strategies)
    assert "Xr:SH f32[1x1000]" in str(sched) and "place(Xr, SH, pad=256)" in str(sched)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    # without the pad the partial pass is refused (it would read past the buffer)
    strategies[1] = place("Xr", fs.SH)
    with pytest.raises(ScheduleError, match="do not divide"):
        spec.schedule(*strategies).check("sm_90a")
    with pytest.raises(ScheduleError, match="pad"):
        spec.schedule(*strategies[:1], place("Xr", fs.RF, pad=8))


@pytest.mark.parametrize("cols", [32768, 16383, 1001])
def test_rows_one_block_holds_stay_in_registers(cols):
    # 32,768: four whole passes of 1024 threads; odd rows of at most 16 elements a thread
    plan = row_plan(2, cols, "bf16", clusters=True, stage=True)
    assert plan.row_memory == "RF" and plan.cluster == 1
    assert plan == row_plan(2, cols, "bf16", clusters=True)


@pytest.mark.parametrize("cols", [16385, 32767, 40961, 100003, 262143])
@pytest.mark.parametrize("dt", ["bf16", "f32"])
def test_long_odd_rows_wait_in_shared_memory(cols, dt):
    # element accesses: in registers such rows spilled (16-176 bytes a thread); in shared memory
    # they take parts of whole passes like the rows of 16-byte vectors
    # (align=False: the rows one block holds take 16-byte windows by default, RowPlan.aligned)
    plan = row_plan(2, cols, dt, clusters=True, stage=True, align=False)
    assert (plan.vec, plan.row_memory) == (1, "SH") and plan.reps <= 64
    assert (plan.cluster - 1) * plan.part < cols <= plan.cluster * plan.part
    # without clusters (sm_80) on one block, in shared memory sized by the target's; softmax's
    # rows one block holds stay in registers on a cluster target
    one_block = cols <= (40960 if dt == "bf16" else 32768)
    if one_block:
        alone = row_plan(2, cols, dt, clusters=False, stage=True, shared_per_sm=164 * 1024, align=False)
        assert (alone.cluster, alone.row_memory) == (1, "SH") and alone.span * alone.reps >= cols
        assert alone.blocks_per_sm * (alone.span * alone.reps * (2 if dt == "bf16" else 4) + 1024) <= 164 * 1024
    kept = row_plan(2, cols, dt, clusters=True, stage=True, odd_values=40, align=False)
    assert kept.row_memory == ("RF" if one_block else "SH")
    if kept.row_memory == "RF":
        assert kept.cluster == 1 and "cluster" not in repr(fs.recipes.softmax(2, cols, dtype=dt, arch="sm_90a")
                                                            .strategies[0])


@pytest.mark.parametrize("cols, memory", [(1535, "RF"), (2047, "SH"), (3071, "SH"), (4095, "SH"), (16385, "SH"), (20479, "SH"), (20481, "SH"),
                                          (32767, "SH")])
def test_layernorm_stages_odd_rows_in_their_window(cols, memory):
    # from 24 elements a thread LayerNorm's odd rows spilled in registers (32-80 bytes); from
    # 1,700 columns they wait in shared memory in their aligned window (on a persistent grid to
    # 24,569: rows.PERSISTENT_WINDOW_COLS; rows.staged_window_faster above)
    sched = fs.recipes.layernorm(2, cols, dtype="bf16", arch="sm_90a")
    assert ("place('Xr', Memory.SH" in repr(sched.strategies)) == (memory == "SH")
    assert ("align(c=8)" in repr(sched.strategies)) == (memory == "SH")


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "softmax", "causal", "add_rmsnorm"])
@pytest.mark.parametrize("plan", [RowPlan(32, 1, 11, 1, cluster=3, part=352, exchange="push", row_memory="SH"),
                                  RowPlan(64, 1, 9, 1, row_memory="SH")], ids=["cluster", "one-block"])
# (a hand-written plan: the tile model puts odd rows in shared memory on clusters only)
def test_odd_rows_in_shared_memory_match_numpy(kind, plan):
    # a bf16 row of odd length is copied element by element through registers, 8 loads of a thread
    # in flight (the last batch partial: 11 and 9 a thread), the last part short of its buffer
    R, C = 2, 1001 if plan.cluster > 1 else 573
    sched = _recipe(kind, R, C, dtype="bf16", arch="sm_90a", plan=plan)
    if kind not in ("causal", "add_rmsnorm"):        # theirs are mapped onto threads (a mask, a sum)
        assert "element copies 8 at a time" in fs.compile(sched, arch="sm_90a").source
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_recipes_stage_their_cluster_rows():
    # a loaded row is copied by cp.async; add + RMSNorm's sum is stored by the threads that add
    assert "cp.async" in fs.compile(fs.recipes.layernorm(2, 65536, arch="sm_90a"), arch="sm_90a").source
    src = fs.compile(fs.recipes.add_rmsnorm(2, 65536, arch="sm_90a"), arch="sm_90a").source
    assert "cp.async" not in src and "st.shared.v4" in src
    # a causal row is masked as it is loaded: through registers into shared memory, no cp.async
    src = fs.compile(fs.recipes.softmax(2, 65536, arch="sm_90a", causal=True), arch="sm_90a").source
    assert "cp.async" not in src and "st.shared.v4" in src


@pytest.mark.parametrize("cols, memory", [(20480, "SH"), (24576, "SH"), (32768, "RF"), (36000, "RF"), (18000, "RF")])
def test_rows_a_block_holds_in_few_or_partial_passes_take_a_staged_cluster(cols, memory):
    # 20,480 and 24,576 columns: fewer than four whole passes of 1024 threads (or a partial one),
    # and two staged parts of whole passes; 32,768: four whole passes; 36,000 and 18,000: the
    # staged parts would leave the last block short
    plan = row_plan(2, cols, "bf16", clusters=True, stage=True)
    assert plan.row_memory == memory
    if memory == "SH":
        assert plan.cluster * plan.part == cols and plan.part % plan.span == 0
    assert row_plan(2, cols, "bf16", clusters=False, stage=True).row_memory == "RF"


def _sched(kind, R, C, plan, memory):
    rec = _recipe(kind, R, C, dtype="f32", arch="sm_90a")
    row = "Hr" if kind == "add_rmsnorm" else "Xr"
    return norms.schedule_rows(rec.spec, attrs.evolve(plan, row_memory=memory),
                               tuple(t.name for t in rec.spec.locals), row=row)


PLANS = [pytest.param(3, 4096, RowPlan(64, 4, 4, 1, cluster=4, part=1024, exchange="push"), id="cluster-push"),
         pytest.param(2, 2048, RowPlan(64, 2, 4, 1, cluster=4, part=512, exchange="barrier"), id="cluster-barrier"),
         pytest.param(5, 1024, RowPlan(128, 4, 2, 1), id="one-block"),
         # parts of whole passes reaching past the row: the last block holds 4000 - 3 * 1024 = 928
         pytest.param(3, 4000, RowPlan(64, 4, 4, 1, cluster=4, part=1024, exchange="push"), id="last-part-short"),
         # parts of 250 vectors on 64 threads: 4 passes, the last of 58 vectors, in a buffer
         # padded to 256 (and the last block's part one vector short)
         pytest.param(3, 3996, RowPlan(64, 4, 4, 1, cluster=4, part=1000, exchange="push"), id="last-pass-partial"),
         pytest.param(2, 3000, RowPlan(64, 4, 3, 1, cluster=4, part=752, exchange="barrier"),
                      id="last-pass-partial-barrier"),
         # clusters of 3 and 6 blocks (any size up to 8), the last part short
         pytest.param(3, 4000, RowPlan(64, 4, 6, 1, cluster=3, part=1536, exchange="push"), id="cluster-3-push"),
         pytest.param(2, 3000, RowPlan(32, 4, 4, 1, cluster=6, part=512, exchange="barrier"), id="cluster-6-barrier")]


@pytest.mark.parametrize("R, C, plan", PLANS)
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "softmax", "causal", "add_rmsnorm"])
def test_staged_rows_equal_rows_in_registers(kind, R, C, plan):
    staged, regs = _sched(kind, R, C, plan, "SH"), _sched(kind, R, C, plan, "RF")
    # rows of a large mean: LayerNorm's statistics must not cancel
    arrays = fs.testing.random_arrays(staged, 0)
    arrays = (arrays[0] * 3 - 3000.0,) + tuple(arrays[1:])
    got = fs.interpret(staged, *arrays, target="sm_90a")
    want = fs.interpret(regs, *arrays, target="sm_90a")
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        np.testing.assert_array_equal(g, w)
    fs.testing.assert_schedule_correct(staged, examples=1, arch="sm_90a")


def test_the_plain_load_is_a_blocks_copy_and_a_masked_one_goes_through_registers():
    src = _sched("softmax", 3, 4096, PLANS[0].values[2], "SH").lower("sm_90a").kernels[0].body
    masked = _sched("causal", 3, 4096, PLANS[0].values[2], "SH").lower("sm_90a").kernels[0].body
    def atoms(body):
        seen = set()
        map_leaves(body, lambda s: seen.add(s.atom.name) if isinstance(s, ir.AtomCall) else None)
        return seen

    assert "cp_async_16" in atoms(src)
    assert "cp_async_16" not in atoms(masked) and "st_shared_16" in atoms(masked)


def test_a_read_before_the_copy_lands_is_a_hazard():
    sched = _sched("layernorm", 3, 4096, PLANS[0].values[2], "SH")
    prog = sched.lower("sm_90a")
    feed = {b.name: a for b, a in zip(prog.inputs, fs.testing.random_arrays(sched, 0))}
    run_program(prog, dict(feed))                   # the unplanted kernel runs clean
    bad = planted(prog, lambda s: None if isinstance(s, ir.AsyncWait) else s)
    with pytest.raises(HazardError, match="cp.async|in flight|before"):
        run_program(bad, dict(feed))


def test_a_block_copy_applies_no_ops():
    # cp.async copies bytes: a causal mask on a block-level move is refused, naming the fix
    spec = fs.recipes.softmax(2, 512, dtype="f32", arch="sm_90a", causal=True).spec
    load = next(i for i, sp in enumerate(spec.body) if isinstance(sp, Move))
    assert load == 0
    sched = spec.schedule(tile(r=1, c=128) >> to_blocks(cluster=4, exchange="push"), place("Xr", fs.SH),
                          *(place(t.name, fs.RF) for t in spec.locals if t.name != "Xr"),
                          *(part(i, *row_model.part_strategies(RowPlan(32, 4, 1, 1, cluster=4, part=128),
                                                                  walk_row="c" in sp.dims))
                            for i, sp in enumerate(spec.body) if i != load))
    with pytest.raises(ScheduleError, match="copies bytes") as e:
        sched.check("sm_90a")
    assert "to_threads" in str(e.value)


def test_schedule_rows_names_the_row_it_stages():
    rec = fs.recipes.rmsnorm(2, 4096, dtype="f32", arch="sm_90a")
    plan = RowPlan(64, 4, 4, 1, cluster=4, part=1024, exchange="push", row_memory="SH")
    with pytest.raises(ValueError, match="row=None must name"):
        norms.schedule_rows(rec.spec, plan, ("Xr", "N"), row=None)
    with pytest.raises(ValueError, match="row_memory='GL'"):
        norms.schedule_rows(rec.spec, attrs.evolve(plan, row_memory="GL"), ("Xr",), row="Xr")


def test_a_causal_row_one_block_holds_stays_on_one_block():
    # its parts' work is uneven (the mask leaves the first part most of it): no staged cluster
    assert "cluster" not in repr(fs.recipes.softmax(2, 24576, arch="sm_90a", causal=True).strategies[0])
    assert "cluster=2" in repr(fs.recipes.softmax(2, 24576, arch="sm_90a").strategies[0])
    plan = row_plan(2, 24576, "bf16", clusters=True, stage=True, stage_few_passes=False)
    assert plan.cluster == 1 and plan.row_memory == "RF"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(R=st.integers(1, 3), C=st.integers(1, 3000), kind=st.sampled_from(["rmsnorm", "layernorm", "softmax",
                                                                          "causal", "add_rmsnorm"]),
       cluster=st.integers(1, 8), lanes=st.sampled_from([32, 64, 128]), vec=st.sampled_from([1, 2, 4]),
       reps=st.integers(1, 6), exchange=st.sampled_from(["push", "barrier"]))
def test_random_staged_plans_are_refused_or_right(R, C, kind, cluster, lanes, vec, reps, exchange):
    # a hand-written plan with the row in shared memory: whatever it is, check() refuses it or the
    # interpreter matches numpy (parts of any length, partial passes in a padded buffer, any cluster)
    part = -(-C // cluster) if cluster > 1 else 0
    plan = RowPlan(lanes, vec, reps, 1, cluster=cluster, part=part, exchange=exchange if cluster > 1 else "barrier",
                   row_memory="SH")
    try:
        sched = _sched(kind, R, C, plan, "SH")
        sched.check("sm_90a")
    except (ScheduleError, ValueError):
        return
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


@pytest.mark.parametrize("cols", [20480, 50000, 32767, 131071])
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
def test_staged_plans_compile_without_spills(kind, cols):
    # two parts of whole passes (20,480), a short last part (50,000), odd rows (32,767: 16-80
    # bytes a thread spilled in registers, 131,071: 44-176); f16 and bf16
    for dt in ("f16", "bf16"):
        k = fs.compile(_recipe(kind, 64, cols, dtype=dt, arch="sm_90a"), arch="sm_90a")
        assert k.spills == 0, (kind, cols, dt, k.resources)


@pytest.mark.parametrize("kind", ["layernorm", "add_rmsnorm"])
@pytest.mark.parametrize("cols", [24577, 32767])
def test_odd_rows_without_clusters_wait_in_shared_memory_of_one_block(kind, cols):
    # sm_80: no clusters; in registers these rows spilled 8-64 bytes a thread.  On one staged block
    # the statistics are one tuple reduction and the output one pass (no f32 copy of the row)
    sched = getattr(fs.recipes, kind)(4, cols, dtype="bf16", arch="sm_80")
    assert "place('" + ("Hr" if kind == "add_rmsnorm" else "Xr") + "', Memory.SH" in repr(sched.strategies)
    assert fs.compile(sched, arch="sm_80").spills == 0


def test_an_odd_row_on_one_staged_block_matches_numpy():
    # a hand-written one-block plan on sm_80 (the tile model's, smaller): element copies, one tuple
    # reduction, the output in one pass
    plan = RowPlan(64, 1, 9, 1, row_memory="SH")
    for kind in ("layernorm", "softmax", "rmsnorm"):
        sched = getattr(fs.recipes, kind)(3, 573, dtype="f16", arch="sm_80", plan=plan)
        fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_80")


def test_row_plan_names_a_bad_odd_values_or_shared_memory():
    with pytest.raises(ValueError, match="odd_values must be a positive int"):
        row_plan(2, 32767, "bf16", clusters=True, stage=True, odd_values=0)
    with pytest.raises(ValueError, match="shared_per_sm must be a positive int"):
        row_plan(2, 32767, "bf16", stage=True, shared_per_sm="164K")


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "add_rmsnorm", "softmax", "causal"])
def test_two_rows_a_cluster_block_match_numpy(kind):
    # each block holds two rows' parts (five rows: the last block's second row is past the end),
    # unswizzled: two 2,048-element lines in a buffer of 2 x 2,048; the weight's part is loaded
    # once for both rows
    odd = kind in ("softmax", "causal")
    plan = RowPlan(64, 1 if odd else 8, 32 if odd else 4, 2, cluster=2, part=2048, row_memory="SH",
                   blocks_per_sm=3)
    sched = _recipe(kind, 5, 4001 if odd else 4000, dtype="bf16", arch="sm_90a", plan=plan)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    kern = sched.lower("sm_90a").kernels[0]
    (row,) = [b for b in kern.shared if b.name.endswith("r_smem")]
    assert row.size == 2 * 2048 and "Sw<" not in row.note
    if kind == "layernorm":
        src = fs.compile(sched, arch="sm_90a").source
        # W and B, one load each a pass for both rows (the passes' loads written out where
        # transforms.split_guards settles their guards)
        assert src.count("ld.global.v4.b32") in (2, 2 * plan.reps)


def test_place_swizzle_is_a_bool_and_round_trips():
    from firesched.tensor import SH

    p = place("Xr", SH, swizzle=False)
    assert repr(p) == "place('Xr', Memory.SH, swizzle=False)" and p == place("Xr", SH, swizzle=False)
    assert repr(place("Xr", SH)) == "place('Xr', Memory.SH)"
    with pytest.raises(ScheduleError, match="swizzle"):
        norms.layernorm(4, 64, dtype="f16", arch="sm_90a").spec.schedule(
            tile(r=1) >> to_blocks(), place("Xr", SH, swizzle="no"))


@pytest.mark.parametrize("R, C", [(2, 26000), (1, 32768)])
def test_softmax_rows_on_one_block_wait_in_shared_memory(R, C):
    # a softmax row of 16-byte vectors on one block of 1,024 threads (sm_90a) waits in shared
    # memory (rows.STAGE_ONE_BLOCK); 26,000: the last pass partial, its buffer padded to whole
    # passes (shorter such rows take 512 threads in registers: rows.HALF_BLOCK_VECTORS).  The norms
    # keep such rows in registers; causal softmax's wait in shared memory on 512 threads
    sched = fs.recipes.softmax(R, C, dtype="bf16", arch="sm_90a")
    assert "Memory.SH" in repr(sched.strategies) and "cluster" not in repr(sched.strategies[0])
    assert "Memory.SH" not in repr(fs.recipes.layernorm(R, C, dtype="bf16", arch="sm_90a").strategies)
    causal = fs.recipes.softmax(R, C, dtype="bf16", arch="sm_90a", causal=True)
    assert "Memory.SH" in repr(causal.strategies) and "tile(c=4096)" in repr(causal.strategies)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    assert fs.compile(sched, arch="sm_90a").spills == 0
