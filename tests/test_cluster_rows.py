"""Row reductions split over the blocks of a thread-block cluster (sm_90a): the blocks combine
their partial statistics through distributed shared memory, so rows longer than one block holds
(32,768 elements) are still read once and written once.  Recipes, hand-written schedules, the
strategy's errors, and the distributed shared memory atom in the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import firesched as fs
import firesched.testing as ft
from firesched import dtypes as dt
from firesched import ir
from firesched.errors import HazardError, ScheduleError
from firesched.hardware.atoms import catalog, sm90a
from firesched.recipes.rows import row_plan
from firesched.simulate.interp import run_program
from firesched.strategies import done, part, place, tile, to_blocks, to_threads


@pytest.mark.parametrize("cols, cluster, part_, threads, vec", [
    (32768, 1, 0, 1024, 8), (32767, 1, 0, 1024, 1), (40000, 1, 0, 1024, 8), (40960, 1, 0, 1024, 8),
    (40961, 8, 5121, 256, 1), (65536, 8, 8192, 256, 8), (81920, 8, 10240, 256, 8), (100003, 8, 12501, 512, 1),
    (131072, 8, 16384, 512, 8), (262144, 8, 32768, 1024, 8), (262143, 8, 32768, 1024, 1),
    (327680, 8, 40960, 1024, 8)])
def test_row_plan_takes_the_smallest_blocks_that_hold_the_row(cols, cluster, part_, threads, vec):
    # one block up to 1024 threads x 40 values; then blocks of 256 threads (four per SM) where a
    # cluster of 8 of them holds the row, else of 512 (two per SM), else of 1024; the parts keep
    # the row's own vector width (an odd row's start is not 16-byte aligned)
    plan = row_plan(2, cols, "f16", clusters=True)
    assert (plan.cluster, plan.part, plan.lanes, plan.vec) == (cluster, part_, threads, vec)
    assert plan.reps * plan.vec <= 40
    assert plan.occupancy * plan.threads * 64 <= 65536
    if cluster > 1:
        assert plan.reps * plan.vec * plan.lanes >= plan.part and plan.rows == 1


def test_f32_rows_keep_32_values_a_thread():
    # LayerNorm's f32 intermediates leave no room for 40 f32 values a thread
    assert row_plan(2, 32768, "f32").reps * 4 == 32
    assert row_plan(2, 40000, "f32", clusters=True).cluster > 1


def test_without_clusters_a_long_row_says_where_it_fits():
    with pytest.raises(ValueError, match="arch='sm_90a'"):
        fs.recipes.rmsnorm(2, 41000, arch="sm_80")
    with pytest.raises(ValueError, match="nor of a cluster of 8 blocks"):
        fs.recipes.rmsnorm(2, 524289, arch="sm_90a")      # odd rows wait in shared memory up to 524,288


def _check(sched, seed=0):
    ft.assert_schedule_correct(sched, examples=1, seed=seed, arch="sm_90a")


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("rows, cols", [(2, 50000), (1, 116009)])
def test_recipes_on_clusters_equal_their_spec(op, rows, cols):
    sched = getattr(fs.recipes, op)(rows, cols, arch="sm_90a")
    # (RMSNorm's and add + RMSNorm's even rows of 50,000 wait in shared memory on one block:
    # rows.STAGED_BLOCK_VALUES; their clusters at 262,144 columns below)
    one_block = op in fs.recipes.rows.STAGED_BLOCK_VALUES and cols % 8 == 0
    assert ("cluster=" in repr(sched.strategies[0])) != one_block
    _check(sched)


@pytest.mark.parametrize("op", ["rmsnorm", "softmax"])
def test_the_longest_rows(op):
    _check(getattr(fs.recipes, op)(1, 262144, arch="sm_90a"))


def test_causal_softmax_masks_by_the_whole_row_position():
    # the blocks of the cluster start at multiples of 6,250 columns: the mask must use global ones
    _check(fs.recipes.softmax(3, 50000, arch="sm_90a", causal=True, diagonal=20003), seed=3)


def _norm(R, C):
    return fs.recipes.rmsnorm(R, C, arch="sm_90a", weight=False).spec


@pytest.mark.parametrize("C, parts", [(512, 2), (512, 4), (1000, 4), (96, 2)])
def test_hand_written_cluster_split_divides_the_mean_by_the_whole_row(C, parts):
    spec = _norm(3, C)
    width = -(-C // parts)
    row = (tile(c=256), tile(c=8) >> to_threads(), done())
    sched = spec.schedule(tile(r=1, c=width) >> to_blocks(cluster=parts), *(place(t.name, fs.RF) for t in spec.locals),
                          *(part(i, *row) for i in range(len(spec.body))))
    _check(sched)


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_a_plain_reduce_split_over_a_cluster_is_one_launch(op):
    # without cluster= the same tiling takes two launches (a workspace of partial results)
    spec = fs.Reduce.kernel(op, {"r": 3, "c": 1000}, ("c",))
    chain = (tile(c=256), tile(c=8) >> to_threads(), done())
    sched = spec.schedule(tile(r=1, c=250) >> to_blocks(cluster=4), *chain)
    assert len(sched.lower("sm_90a").kernels) == 1
    assert len(spec.schedule(tile(r=1, c=250) >> to_blocks(), *chain).lower("sm_90a").kernels) == 2
    _check(sched)


def test_a_fused_reduction_split_over_blocks_needs_a_cluster():
    spec = _norm(4, 512)
    with pytest.raises(ScheduleError, match="cannot combine their parts without a cluster") as e:
        spec.schedule(tile(r=1, c=256) >> to_blocks())
    assert "to_blocks(cluster=2)" in str(e.value)


def test_the_cluster_holds_every_part_of_the_row():
    with pytest.raises(ScheduleError, match="a cluster of 2 must hold all of them"):
        _norm(4, 512).schedule(tile(r=1, c=128) >> to_blocks(cluster=2))


def test_a_cluster_that_splits_no_reduction_is_refused():
    with pytest.raises(ScheduleError, match="this tile maps neither"):
        _norm(4, 512).schedule(tile(r=2) >> to_blocks(cluster=2))


def test_clusters_need_sm90a():
    spec = _norm(2, 512)
    row = (tile(c=256), tile(c=8) >> to_threads(), done())
    sched = spec.schedule(tile(r=1, c=256) >> to_blocks(cluster=2), *(place(t.name, fs.RF) for t in spec.locals),
                          *(part(i, *row) for i in range(len(spec.body))))
    with pytest.raises(ScheduleError, match="thread-block clusters need sm_90a"):
        sched.check("sm_80")


def test_cluster_kernels_compile():
    # the row's part waits in shared memory (cp.async), four blocks of 256 threads a cluster, six
    # blocks an SM where the grid has more blocks than the SMs (40 rows: 160), one where it has no
    # more (4 rows: 16 blocks; norms.plan_rows)
    k = fs.compile(fs.recipes.softmax(40, 65536, arch="sm_90a", exchange="barrier"), arch="sm_90a")
    assert "__cluster_dims__(4, 1, 1)" in k.source and "__launch_bounds__(256, 6)" in k.source
    assert "ld.shared::cluster" in k.source and "cp.async.cg.shared.global" in k.source
    k = fs.compile(fs.recipes.softmax(4, 65536, arch="sm_90a", exchange="barrier"), arch="sm_90a")
    assert "__cluster_dims__(4, 1, 1)" in k.source and "__launch_bounds__(256, 1)" in k.source
    # by default the blocks push their parts into each other's shared memory
    k = fs.compile(fs.recipes.softmax(4, 65536, arch="sm_90a"), arch="sm_90a")
    assert "st.async" in k.source and "ld.shared::cluster" not in k.source


# --------------------------------------------------------------------------- the atom

IN = ir.GlobalBuffer("x", dt.f32, (2,), (1,), "in")
OUT = ir.GlobalBuffer("out", dt.f32, (2,), (1,), "out")
SMEM = ir.SharedBuffer("part", dt.f32, 1, 16)
R = ir.RegBuffer("r", dt.f32, 1)


def _exchange(barrier=True, cta=None):
    """Two blocks of a cluster: thread 0 of block b publishes x[b] in its shared memory, then
    reads the other block's and writes it to out[b]."""
    bid = ir.bid(0, 2)
    cta = (1 - bid % 2) if cta is None else cta
    first = ir.expr.lt(ir.tid(32), 1)
    body = [
        ir.If(first, ir.Seq((
            ir.AtomCall(catalog.copy_atom("GL", "RF", 4), (("dst", ir.RegRef(R, 0)), ("src", ir.MemRef(IN, bid)))),
            ir.AtomCall(catalog.copy_atom("RF", "SH", 4), (("dst", ir.MemRef(SMEM, 0)), ("src", ir.RegRef(R, 0)))),
        ))),
        *([ir.AtomCall(sm90a.barrier_cluster, ())] if barrier else []),
        ir.If(first, ir.Seq((
            ir.AtomCall(sm90a.ld_shared_cluster_4, (("dst", ir.RegRef(R, 0)), ("src", ir.MemRef(SMEM, 0)),
                                                    ("cta", ir.Scalar(cta)))),
            ir.AtomCall(catalog.copy_atom("RF", "GL", 4), (("dst", ir.MemRef(OUT, bid)), ("src", ir.RegRef(R, 0)))),
        ))),
        ir.AtomCall(sm90a.barrier_cluster, ()),
    ]
    k = ir.Kernel("exchange", (IN, OUT), (2, 1, 1), 32, (SMEM,), (R,), ir.Seq(tuple(body)), cluster=2)
    return ir.Program((k,), (IN,), OUT)


X = {"x": np.array([3.0, 5.0], np.float32)}


def test_each_block_reads_the_other_blocks_shared_memory():
    np.testing.assert_array_equal(run_program(_exchange(), X)["out"], [5.0, 3.0])


def test_a_read_of_another_block_before_its_store_is_ordered_is_a_race():
    with pytest.raises(HazardError, match="race \\(read after write\\)"):
        run_program(_exchange(barrier=False), X)


def test_a_rank_outside_the_cluster_is_a_hazard():
    with pytest.raises(HazardError, match="cluster rank 2 .* the cluster has 2 block"):
        run_program(_exchange(cta=2), X)


@pytest.mark.parametrize("op, cols, dtype, exchange", [
    ("rmsnorm", 131072, "bf16", "barrier"), ("rmsnorm", 24576, "f16", "barrier"), ("rmsnorm", 65536, "f32", "barrier"),
    ("rmsnorm", 116009, "bf16", "push"),          # an odd row too long for a window on one block: element accesses
    ("rmsnorm", 65536, "bf16", "push"),           # one staged block: no cluster, nothing exchanged
    ("layernorm", 131072, "bf16", "push"), ("softmax", 131072, "bf16", "push"), ("add_rmsnorm", 131072, "bf16", "push"),
    ("causal", 131072, "bf16", "push")])
def test_each_recipe_exchanges_as_measured(op, cols, dtype, exchange):
    # rows.cluster_exchange: the barrier for RMSNorm's rows of 16-byte vectors on a cluster (one
    # f32 sum a block), pushes for the tuples and the odd rows (bench/README.md)
    plan = fs.recipes.norms.recipe_plan(op, 8, cols, dtype, "sm_90a")
    assert plan.exchange == exchange
    assert (plan.cluster > 1) == (cols != 65536 or dtype == "f32")
    # a caller's choice wins
    other = {"push": "barrier", "barrier": "push"}[exchange]
    assert fs.recipes.norms.recipe_plan(op, 8, cols, dtype, "sm_90a", exchange=other).exchange == other


def test_rmsnorm_on_a_cluster_meets_at_the_barrier_by_default():
    sched = fs.recipes.rmsnorm(2, 24576, dtype="f16", arch="sm_90a")
    assert "cluster=2" in repr(sched.strategies[0]) and "push" not in repr(sched.strategies[0])
    k = fs.compile(sched, arch="sm_90a")
    assert "barrier.cluster" in k.source and "st.async" not in k.source
    _check(sched)
