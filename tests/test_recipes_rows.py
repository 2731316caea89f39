"""The row recipes (RMSNorm, LayerNorm, residual-add + RMSNorm, softmax) against numpy formulas
written here, on small and odd shapes; hypothesis over shapes and dtypes; NVRTC compiles every
plan of the tile model without spills; and the fused-spec refusals a user meets writing such a
kernel by hand."""

from __future__ import annotations

import re

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import recipes
from firesched.dtypes import dtype as dtype_of
from firesched.dtypes import round_to
from firesched.errors import ScheduleError
from firesched.recipes import norms
from firesched.recipes import rows as row_model
from firesched.spec import Fused, Move, Pointwise, Reduce
from firesched.strategies import done, part, place, tile, to_blocks, to_threads
from firesched.tensor import GL, KERNEL, RF, Tensor, Tile


def _r(x, dt):
    return np.asarray(x, dtype=np.float64).astype(fs.dtypes.dtype(dt).np).astype(np.float64)


def _close(got, want, dt, scale=1.0):
    tol = {"f16": 2e-3, "bf16": 1.6e-2, "f32": 1e-5}[dt] * 2
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    err = np.abs(got - want).max(initial=0.0)
    assert err <= tol * max(1.0, np.abs(want).max(initial=0.0)) * scale, err


def rms_ref(x, w, eps, dt):
    y = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps)
    return _r(y * w if w is not None else y, dt)


def ln_ref(x, w, b, eps, dt):
    mu = x.mean(1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return _r(y, dt)


def softmax_ref(x, scale, dt):
    z = scale * x
    z = np.exp(z - z.max(1, keepdims=True))
    return _r(z / z.sum(1, keepdims=True), dt)


SHAPES = [(1, 1), (7, 1), (3, 5), (5, 64), (10, 256), (33, 100), (4, 512), (6, 512), (5, 1024), (5, 1001), (2, 4096),
          (3, 6000)]
RNG = np.random.default_rng(5)


@pytest.mark.parametrize("R, C", SHAPES)
def test_rmsnorm_matches_numpy(R, C):
    x, w = RNG.standard_normal((R, C)), RNG.standard_normal(C)
    _close(fs.interpret(recipes.rmsnorm(R, C), x, w), rms_ref(_r(x, "f16"), _r(w, "f16"), 1e-6, "f16"), "f16")


@pytest.mark.parametrize("R, C", SHAPES)
def test_layernorm_matches_numpy(R, C):
    x, w, b = RNG.standard_normal((R, C)), RNG.standard_normal(C), RNG.standard_normal(C)
    got = fs.interpret(recipes.layernorm(R, C, dtype="bf16"), x, w, b)
    _close(got, ln_ref(_r(x, "bf16"), _r(w, "bf16"), _r(b, "bf16"), 1e-5, "bf16"), "bf16")


@pytest.mark.parametrize("R, C", SHAPES)
def test_softmax_matches_numpy(R, C):
    x = RNG.standard_normal((R, C)) * 4
    _close(fs.interpret(recipes.softmax(R, C, scale=0.125), x), softmax_ref(_r(x, "f16"), 0.125, "f16"), "f16")


@pytest.mark.parametrize("R, C", [(1, 1), (3, 5), (10, 256), (5, 1001)])
def test_add_rmsnorm_writes_the_sum_and_its_norm(R, C):
    x, res, w = RNG.standard_normal((R, C)), RNG.standard_normal((R, C)), RNG.standard_normal(C)
    y, h = fs.interpret(recipes.add_rmsnorm(R, C), x, res, w)
    hr = _r(_r(x, "f16") + _r(res, "f16"), "f16")        # torch adds in f16: h is rounded first
    assert np.array_equal(h, hr)
    _close(y, rms_ref(hr, _r(w, "f16"), 1e-6, "f16"), "f16")


def test_statistics_for_the_backward_pass():
    R, C = 6, 300
    x, w, b = RNG.standard_normal((R, C)) + 3.0, RNG.standard_normal(C), RNG.standard_normal(C)
    xr = _r(x, "f16")
    y, rstd = fs.interpret(recipes.rmsnorm(R, C, stats=True), x, w)
    assert np.allclose(rstd, 1 / np.sqrt(np.mean(xr * xr, 1) + 1e-6), rtol=1e-5)
    y, mean, rstd = fs.interpret(recipes.layernorm(R, C, stats=True), x, w, b)
    assert np.allclose(mean, xr.mean(1), rtol=1e-6)
    assert np.allclose(rstd, 1 / np.sqrt(xr.var(1) + 1e-5), rtol=1e-5)
    _close(y, ln_ref(xr, _r(w, "f16"), _r(b, "f16"), 1e-5, "f16"), "f16")


def test_options_without_weight_or_bias():
    R, C = 4, 96
    x = RNG.standard_normal((R, C))
    xr = _r(x, "f16")
    _close(fs.interpret(recipes.rmsnorm(R, C, weight=False, eps=1e-3), x), rms_ref(xr, None, 1e-3, "f16"), "f16")
    _close(fs.interpret(recipes.layernorm(R, C, weight=False, bias=False), x), ln_ref(xr, None, None, 1e-5, "f16"),
           "f16")


def test_large_magnitudes_do_not_overflow_the_statistics():
    """Rows near the fp16 maximum: squares overflow fp16 but not the f32 statistics; softmax of
    large logits stays finite."""
    R, C = 3, 512
    x = np.clip(RNG.standard_normal((R, C)) * 8000.0, -30000, 30000)     # squares up to 9e8: past fp16
    xr = _r(x, "f16")
    y = fs.interpret(recipes.rmsnorm(R, C, weight=False), x)
    assert np.isfinite(y).all()
    _close(y, rms_ref(xr, None, 1e-6, "f16"), "f16")
    shifted = x / 8 + 20000.0                    # a large mean: E[x²] - E[x]² would cancel in f32
    y = fs.interpret(recipes.layernorm(R, C, weight=False, bias=False), shifted)
    assert np.isfinite(y).all()
    _close(y, ln_ref(_r(shifted, "f16"), None, None, 1e-5, "f16"), "f16")
    s = fs.interpret(recipes.softmax(R, C), x)
    assert np.isfinite(s).all()
    _close(s, softmax_ref(xr, 1.0, "f16"), "f16")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(R=1, C=3, dt="f16", kind="rmsnorm")      # one short row: fewer lanes than a warp
@example(R=1, C=33, dt="f16", kind="rmsnorm")     # one short narrow row on 4 lanes: a warp's block
@example(R=2, C=101, dt="f32", kind="softmax")    # (16 lanes)
@example(R=1, C=1, dt="f32", kind="layernorm")
@example(R=3, C=17, dt="bf16", kind="softmax")
@example(R=3, C=4094, dt="bf16", kind="rmsnorm")   # 256 threads, two rows a block (rows.LONG_PAIRS)
@example(R=5, C=1535, dt="f32", kind="softmax")    # 128 threads, two rows a block (rows.NARROW_BLOCK_F32)
@given(R=st.integers(1, 40), C=st.integers(1, 1500), dt=st.sampled_from(["f16", "bf16", "f32"]),
       kind=st.sampled_from(["rmsnorm", "layernorm", "softmax"]))
def test_random_shapes_match_numpy(R, C, dt, kind):
    rng = np.random.default_rng(R * 7919 + C)
    x, w, b = rng.standard_normal((R, C)) * 3, rng.standard_normal(C), rng.standard_normal(C)
    xr, wr, br = _r(x, dt), _r(w, dt), _r(b, dt)
    if kind == "rmsnorm":
        got, want = fs.interpret(recipes.rmsnorm(R, C, dtype=dt), x, w), rms_ref(xr, wr, 1e-6, dt)
    elif kind == "layernorm":
        got, want = fs.interpret(recipes.layernorm(R, C, dtype=dt), x, w, b), ln_ref(xr, wr, br, 1e-5, dt)
    else:
        got, want = fs.interpret(recipes.softmax(R, C, dtype=dt), x), softmax_ref(xr, 1.0, dt)
    _close(got, want, dt, scale=2.0)


@pytest.mark.parametrize("cols", [1, 7, 64, 256, 512, 1000, 1024, 4096, 8192, 16384, 20000, 32768, 4095, 1001, 8190,
                                  16383])
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "softmax", "add_rmsnorm"])
def test_every_plan_compiles_without_spills(kind, cols):
    k = fs.compile(getattr(recipes, kind)(4096, cols, dtype="bf16"), arch="sm_90a")
    assert k.spills == 0
    if cols % 8 == 0 or (cols in (4095, 16383) and kind == "add_rmsnorm"):
        # (odd rows through 16-byte windows: align(c=8))
        # (a row that waits in shared memory is copied there in 16-byte cp.async chunks)
        loads = ("ld.global.v4.b32", "cp.async.cg.shared.global [%0], [%1], 16")
        assert any(ld in k.source for ld in loads) and "st.global.v4.b32" in k.source


def test_causal_rows_of_few_passes_take_half_blocks():
    # a row 1,024 threads would hold in fewer than four passes goes to 512 threads (two blocks an
    # SM) where 48 elements a thread hold it (40 with the last pass partial)
    plan = row_model.row_plan
    cv = row_model.CAUSAL_VALUES
    assert plan(16, 20480, half_block_values=cv) == row_model.RowPlan(512, 8, 5, 1)
    assert plan(16, 24576, half_block_values=cv) == row_model.RowPlan(512, 8, 6, 1)
    assert plan(16, 20488, half_block_values=cv).lanes == 1024 and plan(16, 32768, half_block_values=cv).lanes == 1024
    assert plan(16, 20480).lanes == 1024
    # (two blocks an SM where the grid has more blocks than the SMs; 16 rows: one an SM)
    assert "occupancy=2" in repr(recipes.softmax(200, 20480, dtype="bf16", arch="sm_90a", causal=True).strategies[0])
    causal = recipes.softmax(16, 20480, dtype="bf16", arch="sm_90a", causal=True)
    assert "occupancy" not in repr(causal.strategies[0])
    assert fs.compile(causal, arch="sm_90a").spills == 0


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "softmax"])
def test_norm_rows_of_few_passes_take_half_blocks(kind):
    # 16,385 to 20,479 columns: 512 threads x 40 (two blocks an SM) on sm_90a, the last pass
    # partial (rows.HALF_BLOCK_VALUES, HALF_BLOCK_VECTORS); on sm_80 (not measured there) 1,024
    # threads as before
    args = row_model.measured_plan_args(kind, 20000, "bf16", True)
    assert row_model.row_plan(64, 20000, "bf16", clusters=True, stage=True, **args) == row_model.RowPlan(512, 8, 5, 1)
    on_sm80 = row_model.measured_plan_args(kind, 20000, "bf16", False)
    assert "half_block_values" not in on_sm80 and "half_block_vectors" not in on_sm80
    many = getattr(recipes, kind)(200, 16392, dtype="bf16", arch="sm_90a")
    assert repr(many.strategies[0]) == "tile(r=1) >> to_blocks(occupancy=2)"
    sched = getattr(recipes, kind)(3, 16392, dtype="bf16", arch="sm_90a")
    assert repr(sched.strategies[0]) == "tile(r=1) >> to_blocks()"        # (3 blocks: one an SM)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    assert fs.compile(sched, arch="sm_90a").spills == 0


@pytest.mark.parametrize("kind, partial", [("layernorm", 64), ("rmsnorm", 56), ("softmax", 48)])
def test_rows_of_partial_passes_take_half_blocks_before_clusters(kind, partial):
    # rows.HALF_BLOCK_VECTORS: where 1,024 threads' last pass would be partial, or they would take
    # fewer than four passes, 512 threads hold the row in registers (two blocks an SM) in up to
    # 40 elements a thread in whole passes and `partial` with their last pass partial; beyond
    # that the cluster of staged parts or 1,024 threads as before
    def plan(cols, dtype="bf16", arch="sm_90a"):
        return norms.recipe_plan(kind, 8192, cols, dtype, arch)

    for cols in (16392, 20480, partial * 512 - 8):
        p = plan(cols)
        assert (p.lanes, p.cluster, p.row_memory) == (512, 1, "RF"), (cols, p)
        assert p.reps * p.vec <= (40 if cols % (512 * 8) == 0 else partial)
    for cols in (24576, 28672):                   # 48, 56 a thread in whole passes: clusters
        assert plan(cols).cluster == 2 and plan(cols).lanes == 256
    assert plan(partial * 512 + 8).lanes != 512
    assert plan(32768).lanes == 1024
    assert plan(26624, arch="sm_80").lanes == 1024       # (measured on sm_90a only)
    assert plan(26624, "f32").lanes != 512
    # the longest of them compile without spills, LayerNorm with its per-row statistics too
    kw = {"stats": True} if kind != "softmax" else {"scale": 0.125}
    k = fs.compile(getattr(recipes, kind)(64, partial * 512 - 8, dtype="f16", arch="sm_90a", **kw), arch="sm_90a")
    assert k.spills == 0


def test_half_block_vectors_leave_other_rows_as_they_were():
    # rows.HALF_BLOCK_VECTORS takes rows of 16-byte vectors of LayerNorm, RMSNorm and softmax only:
    # causal softmax's plans keep their clusters of staged parts where asked for them
    # (plan_rows' stage_few_passes; the recipe does not ask), rows of 8-byte accesses the half
    # blocks of rows.HALF_BLOCK_VALUES (after the clusters), as before
    # (the row model asked as plan_rows asks by default, stage_few_passes=True, not as the recipe)
    assert norms.plan_rows(4096, 20480, "bf16", "sm_90a", op="causal").cluster == 2
    assert norms.plan_rows(4096, 24576, "f16", "sm_90a", op="causal").cluster == 2
    # the causal recipe keeps such rows on one block: half blocks of 512 threads in registers, or
    # staged (rows.STAGE_ONE_BLOCK)
    assert norms.recipe_plan("causal", 4096, 20480, "bf16", "sm_90a").cluster == 1
    p = norms.recipe_plan("layernorm", 4096, 8828, "bf16", "sm_90a")
    assert (p.lanes, p.vec, p.reps) == (512, 4, 5)
    assert norms.recipe_plan("softmax", 4096, 8828, "bf16", "sm_90a").lanes == 1024
    for bad in ((40,), (40, 0), [40, 48], (40, True)):
        with pytest.raises(ValueError, match="half_block_vectors"):
            row_model.row_plan(4, 20480, "bf16", half_block_vectors=bad)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_causal_rows_wait_in_shared_memory_on_half_blocks(dtype):
    # rows.STAGE_ONE_BLOCK["causal"]: an even causal row that stays on 1,024 threads in registers
    # after the half blocks (24,577 - 40,960 columns) waits in shared memory on 512 threads, two
    # blocks an SM, its statistics in one tuple reduction; shorter rows keep their half blocks in
    # registers, longer ones their clusters, sm_80 (no clusters, where not measured) 1,024 threads
    def plan(cols, arch="sm_90a"):
        return norms.recipe_plan("causal", 8192, cols, dtype, arch)

    for cols in (20992, 24584, 26000, 32768, 40960):
        p = plan(cols)
        assert (p.lanes, p.row_memory, p.cluster, p.occupancy) == (512, "SH", 1, 2), (cols, p)
        assert p.span * p.reps >= cols > p.span * (p.reps - 1)
    for cols in (20000, 24576):
        assert (plan(cols).lanes, plan(cols).row_memory) == (512, "RF")
    assert plan(40968).cluster > 1
    assert (plan(32768, "sm_80").lanes, plan(32768, "sm_80").row_memory) == (1024, "RF")
    # softmax keeps its 1,024 staged threads there
    assert norms.recipe_plan("softmax", 8192, 32768, dtype, "sm_90a").lanes == 1024
    with pytest.raises(ValueError, match="staged_block_threads"):
        row_model.row_plan(4, 32768, dtype, stage=True, clusters=True, stage_one_block=True, staged_block_threads=500)
    sched = recipes.softmax(8192, 26000, dtype=dtype, arch="sm_90a", causal=True)
    assert any(getattr(sp, "monoid", None) is not None for sp in sched.spec.body)     # one tuple reduction
    k = fs.compile(sched, arch="sm_90a")
    assert k.spills == 0
    # the shortest such row (at 48 values in registers its f16 kernel had spilled)
    assert plan(20488).row_memory == "SH"
    assert fs.compile(recipes.softmax(64, 20488, dtype=dtype, arch="sm_90a", causal=True), arch="sm_90a").spills == 0
    # the interpreter on two such rows (the last pass partial, most of each row masked or not)
    x = np.random.default_rng(1).standard_normal((2, 26000)) * 3
    got = np.asarray(fs.interpret(recipes.softmax(2, 26000, dtype=dtype, arch="sm_90a", causal=True,
                                                  diagonal=25000), x), np.float64)
    x = np.asarray(round_to(dtype_of(dtype), x), np.float64)
    mask = np.tril(np.ones(x.shape, bool), 25000)
    e = np.where(mask, np.exp(x - np.where(mask, x, -np.inf).max(1, keepdims=True)), 0.0)
    ref = e / e.sum(1, keepdims=True)
    assert (got[~mask] == 0).all() and np.abs(got - ref).max() <= 1e-2 * ref.max()


@pytest.mark.parametrize("op", ["rmsnorm", "add_rmsnorm"])
def test_long_rows_wait_in_shared_memory_on_one_block(op):
    # rows.STAGED_BLOCK_VALUES: RMSNorm's and add + RMSNorm's rows of 16-byte vectors longer than
    # one block's registers hold (40,968 - 98,304 columns) wait in shared memory on one block of
    # 1,024 threads, alone on its SM, instead of a cluster; longer rows, odd rows, other recipes
    # and sm_80 as before
    def plan(cols, dtype="bf16", arch="sm_90a", kind=op):
        return norms.recipe_plan(kind, 8192, cols, dtype, arch)

    for cols in (40968, 45056, 65536, 98304):
        p = plan(cols)
        assert (p.lanes, p.cluster, p.row_memory, p.occupancy) == (1024, 1, "SH", 1), (cols, p)
        assert p.span * p.reps >= cols > p.span * (p.reps - 1)
    assert plan(65536, "f16").row_memory == "SH" and plan(65536, "f16").cluster == 1
    assert plan(49152, "f32").cluster > 1                 # (f32 rows: not measured)
    # (an odd row of 65,537 stages its window on one block alone: tests/test_windows_alone.py)
    assert plan(98312).cluster > 1 and plan(116009).cluster > 1
    # (add + RMSNorm's registers hold 32 values a thread: its rows from 32,776 columns take the block)
    assert plan(40960).row_memory == ("SH" if op == "add_rmsnorm" else "RF")
    assert plan(32768).row_memory == "RF" and (plan(33280).row_memory == "SH") == (op == "add_rmsnorm")
    assert plan(65536, kind="layernorm").cluster > 1 and plan(65536, kind="softmax").cluster > 1
    with pytest.raises(ValueError, match="staged_block_values"):
        row_model.row_plan(4, 65536, "bf16", stage=True, clusters=True, staged_block_values=-1)
    k = fs.compile(getattr(recipes, op)(64, 98304, dtype="bf16", arch="sm_90a"), arch="sm_90a")
    smem = [int(m) for m in re.findall(r"x 1024 threads, (\d+) bytes of dynamic shared memory", k.source)]
    assert k.spills == 0 and smem and max(smem) >= 98304 * 2
    # the interpreter on two rows (the last pass partial)
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 45056)) * 10, rng.standard_normal(45056)
    r = rng.standard_normal((2, 45056))
    sched = getattr(recipes, op)(2, 45056, dtype="bf16", arch="sm_90a")
    rnd = lambda a: np.asarray(round_to(dtype_of("bf16"), a), np.float64)   # noqa: E731
    h = rnd(rnd(x) + rnd(r)) if op == "add_rmsnorm" else rnd(x)
    got = fs.interpret(sched, x, r, w) if op == "add_rmsnorm" else fs.interpret(sched, x, w)
    y = np.asarray(got[0] if op == "add_rmsnorm" else got, np.float64)
    ref = h / np.sqrt((h * h).mean(1, keepdims=True) + 1e-6) * rnd(w)
    assert np.abs(y - ref).max() <= 2e-2 * np.abs(ref).max()


@pytest.mark.parametrize("cols, tuple_stats", [(10752, True), (16384, True), (26624, True), (32768, True),
                                               (40960, True), (8192, False), (4096, False), (1023, False),
                                               (26625, False)])
def test_layernorm_takes_the_tuple_on_wide_blocks(cols, tuple_stats):
    # rows.wide_tuple: a 16-bit row of 16-byte vectors alone on one block of 512 or 1,024 threads
    # in registers takes the Welford tuple (one exchange across its warps); 256 threads and fewer,
    # rows sharing a block and odd rows keep the two plain reductions
    spec = recipes.layernorm(8192, cols, dtype="bf16", arch="sm_90a").spec
    plan = norms.recipe_plan("layernorm", 8192, cols, "bf16", "sm_90a")
    welford = [sp for sp in spec.body if getattr(sp, "monoid", None) is not None]
    assert bool(welford) == (tuple_stats or row_model.one_pass(plan)), (cols, plan)
    assert row_model.wide_tuple(plan, "layernorm", "bf16", cols) == tuple_stats, plan
    # ... not on 1,024 threads whose last pass is partial (sm_80's plans there), nor for f32 rows
    # or other recipes
    p80 = norms.recipe_plan("layernorm", 8192, 26624, "f16", "sm_80")
    assert p80.lanes == 1024 and not row_model.wide_tuple(p80, "layernorm", "f16", 26624)
    assert not row_model.wide_tuple(row_model.RowPlan(512, 8, 4, 1), "layernorm", "f32", 16384)
    assert not row_model.wide_tuple(row_model.RowPlan(512, 8, 4, 1), "rmsnorm", "bf16", 16384)


def test_layernorm_tuple_on_a_wide_block_interprets():
    # the Welford tuple on a 512-thread element plan, its last pass partial, with the per-row
    # statistics, against numpy
    sched = recipes.layernorm(2, 16392, dtype="f16", arch="sm_90a", stats=True)
    assert [sp for sp in sched.spec.body if getattr(sp, "monoid", None) is not None]
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def _refused_or_right(kind, R, C, dt, plan):
    """Recipe ``kind`` on ``plan``: ``check()`` refuses it, or the interpreter matches numpy."""
    try:
        if kind == "causal":
            sched = recipes.softmax(R, C, dtype=dt, arch="sm_90a", causal=True, plan=plan)
        else:
            sched = getattr(recipes, kind)(R, C, dtype=dt, arch="sm_90a", plan=plan)
        sched.check("sm_90a")
    except (ScheduleError, ValueError):
        return
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(R=5, C=1000, kind="layernorm", lanes=128, vec=8, reps=1, rows=2, dt="bf16")   # the last block half empty
@example(R=3, C=1023, kind="causal", lanes=128, vec=1, reps=8, rows=2, dt="f16")
@given(R=st.integers(1, 9), C=st.integers(1, 1200),
       kind=st.sampled_from(["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"]),
       lanes=st.sampled_from([8, 32, 64, 128, 256]), vec=st.sampled_from([1, 2, 4, 8]), reps=st.integers(1, 4),
       rows=st.sampled_from([1, 2, 3, 4, 8]), dt=st.sampled_from(["f16", "bf16", "f32"]))
def test_hand_written_plans_of_several_rows_a_block_are_refused_or_right(R, C, kind, lanes, vec, reps, rows, dt):
    # a user's RowPlan with several rows on a block (as the tile model's short rows now take:
    # rows.MIN_BLOCK_THREADS): rows of a warp or of several warps, passes that may not cover the
    # row or cover it with room to spare, blocks past the tensor's last row.  check() refuses it
    # or the interpreter matches numpy
    _refused_or_right(kind, R, C, dt, row_model.RowPlan(lanes, vec, reps, rows))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(R=2, C=2560, kind="layernorm", lanes=64, reps=5, dt="bf16")       # 320 vectors, every slot one
@example(R=1, C=4104, kind="causal", lanes=128, reps=5, dt="f16")          # the last pass partial
@given(R=st.integers(1, 3), C=st.integers(200, 4200),
       kind=st.sampled_from(["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"]),
       lanes=st.sampled_from([64, 128, 256, 512, 1024]), reps=st.integers(1, 8),
       dt=st.sampled_from(["f16", "bf16", "f32"]))
def test_hand_written_plans_of_many_passes_are_refused_or_right(R, C, kind, lanes, reps, dt):
    # a user's RowPlan of one row a block in up to 8 passes of 16-byte vectors (as the tile model
    # takes for rows whose vectors are not a power of two: rows.FILL_THREADS): passes that may not
    # cover the row, cover it exactly or end partial (LayerNorm's on 512 and 1,024 threads with
    # the Welford tuple where rows.wide_tuple says).  check() refuses it or the interpreter
    # matches numpy
    _refused_or_right(kind, R, C, dt, row_model.RowPlan(lanes, 4 if dt == "f32" else 8, reps, 1))


@settings(max_examples=200, deadline=None)
@given(vectors=st.integers(33, 5000), lanes=st.sampled_from([64, 128, 256, 512, 1024]),
       most_lanes=st.sampled_from([64, 256, 512]), most_reps=st.integers(1, 8))
def test_fewest_idle_never_idles_more(vectors, lanes, most_lanes, most_reps):
    # rows._fewest_idle: a power-of-two thread count in [64, most_lanes] covering the row in at
    # most most_reps passes (one fewer with a partial last pass) that idles fewer slots, else the
    # given plan
    reps = -(-vectors // lanes)
    got_lanes, got_reps = row_model._fewest_idle(vectors, lanes, reps, most_lanes, most_reps)
    assert got_lanes * got_reps >= vectors
    assert got_lanes * got_reps - vectors <= lanes * reps - vectors
    if (got_lanes, got_reps) != (lanes, reps):
        assert got_lanes * got_reps < lanes * reps
        assert 64 <= got_lanes <= most_lanes and got_lanes & (got_lanes - 1) == 0
        assert got_reps <= most_reps - (1 if vectors % got_lanes else 0)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
@pytest.mark.parametrize("R, C, dt", [(2, 2560, "bf16"), (3, 4104, "f16"), (2, 5120, "f32")])
def test_rows_of_passes_that_fill_their_threads_interpret(kind, R, C, dt):
    # the tile model's own plans there (64 x 5, 128 x 5 with the last pass partial, f32 256 x 5)
    if kind == "causal":
        sched = recipes.softmax(R, C, dtype=dt, arch="sm_90a", causal=True)
    else:
        sched = getattr(recipes, kind)(R, C, dtype=dt, arch="sm_90a")
    assert "to_threads" in repr(sched.strategies)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_plans_of_the_tile_model():
    assert row_model.row_plan(4096, 256) == row_model.RowPlan(32, 8, 1, 8)
    # rows on fewer than 256 threads share a block (rows.MIN_BLOCK_THREADS), never more rows than
    # the tensor's (rounded up to a power of two)
    assert row_model.row_plan(32768, 512) == row_model.RowPlan(64, 8, 1, 4)
    assert row_model.row_plan(16384, 1024) == row_model.RowPlan(128, 8, 1, 2)
    assert row_model.row_plan(1, 1024) == row_model.RowPlan(128, 8, 1, 1)
    assert row_model.row_plan(3, 300).rows == 2 and row_model.row_plan(3, 512).rows == 4   # (a row masked)
    assert row_model.row_plan(16384, 2048) == row_model.RowPlan(256, 8, 1, 1)
    assert row_model.row_plan(4096, 4096) == row_model.RowPlan(256, 8, 2, 1)
    assert row_model.row_plan(4096, 32768).threads == 1024
    # a row whose vectors are not a power of two takes the power-of-two threads (64 to 256) whose
    # passes leave the fewest slots idle, a block each (rows.FILL_THREADS, FILL_VALUES)
    assert row_model.row_plan(32768, 1536) == row_model.RowPlan(64, 8, 3, 1)
    assert row_model.row_plan(16384, 2560) == row_model.RowPlan(64, 8, 5, 1)
    assert row_model.row_plan(8192, 7168) == row_model.RowPlan(128, 8, 7, 1)
    assert row_model.row_plan(4096, 14336) == row_model.RowPlan(256, 8, 7, 1)
    assert row_model.row_plan(4096, 4104) == row_model.RowPlan(128, 8, 5, 1)     # the last pass partial
    assert row_model.row_plan(4096, 13312) == row_model.RowPlan(512, 8, 4, 1)    # 256 x 7 partial: 56 a thread
    assert row_model.row_plan(65536, 768) == row_model.RowPlan(128, 8, 1, 2)     # 64 x 2 idles as many
    assert row_model.row_plan(4096, 1536, "f32") == row_model.RowPlan(128, 4, 3, 1)   # f32: up to 512 x 7
    assert row_model.row_plan(4096, 10240, "f32", clusters=True, stage=True) == row_model.RowPlan(512, 4, 5, 1)
    # add + RMSNorm f16 on 512 threads with a partial last pass: one block an SM (it spilled at two)
    add = {(c, d): norms.recipe_plan("add_rmsnorm", 800, c, d, "sm_90a")
           for c in (13312, 16384) for d in ("f16", "bf16")}
    assert add[13312, "f16"].occupancy == 1 and add[13312, "bf16"].occupancy == 2
    assert add[16384, "f16"].occupancy == 2
    # an odd 16-bit row one block holds may walk 16-byte windows (align(c=8)); element accesses
    # without (the default, and where the recipes measured windows slower: rows.aligned_faster)
    assert row_model.row_plan(5, 1001, align=True) == row_model.RowPlan(128, 8, 1, 1, aligned=True)
    assert row_model.row_plan(5, 1001).vec == 1
    assert row_model.row_plan(5, 249, align=True).vec == 1     # 32 windows: several rows a warp, elements
    assert not row_model.row_plan(5, 4095, "f32", align=True).aligned        # 4-byte elements: as they are
    assert not row_model.row_plan(5, 4094, align=True).aligned               # 4-byte pairs
    # past ALIGNED_VALUES a thread the window's plan is not taken
    assert not row_model.row_plan(5, 28671, align=True).aligned and row_model.row_plan(5, 24569, align=True).aligned
    assert row_model.aligned_faster("add_rmsnorm", 4095) and not row_model.aligned_faster("rmsnorm", 4095)
    assert row_model.aligned_faster("rmsnorm", 16383) and not row_model.aligned_faster("layernorm", 8191)
    # (with clusters RMSNorm's odd rows up to 22,000 columns wait in shared memory instead; from
    # 6,000 columns the recipes stage the window itself: rows.staged_window_faster)
    assert not row_model.aligned_faster("rmsnorm", 16383, clusters=True)
    assert "cluster=" in repr(recipes.rmsnorm(64, 116009, dtype="bf16", arch="sm_90a").strategies[0])
    assert repr(recipes.rmsnorm(640, 16383, dtype="bf16", arch="sm_90a").strategies[0]) == \
        "tile(r=1) >> to_blocks(occupancy=3) >> align(c=8)"
    assert row_model.aligned_faster("layernorm", 24569) and not any(row_model.aligned_faster("causal", c)
                                                                    for c in (4095, 24569))
    with pytest.raises(ValueError, match="allowed"):
        row_model.aligned_faster("transpose", 4095)
    assert "align(c=8)" in repr(recipes.add_rmsnorm(64, 4095, dtype="bf16").strategies)
    assert "align(c=8)" in repr(recipes.layernorm(64, 24569, dtype="bf16").strategies)
    # (from 1,700 columns LayerNorm's odd rows take sm_90a's persistent windows: rows.PERSISTENT_WINDOW_COLS)
    assert "align(" not in repr(recipes.layernorm(64, 1535, dtype="bf16").strategies)
    assert "align(c=8)" in repr(recipes.layernorm(64, 2047, dtype="bf16", arch="sm_90a").strategies)
    assert "align(c=8)" in repr(recipes.layernorm(64, 3071, dtype="bf16", arch="sm_90a").strategies)
    # odd rows element by element: more elements a thread, fewer threads (rows.ODD_ROW_VALUES)
    assert row_model.odd_row_values("layernorm", 1023) == 8 and row_model.odd_row_values("softmax", 8191) == 32
    assert row_model.row_plan(64, 4095, element_values=16) == row_model.RowPlan(256, 1, 16, 1)
    assert row_model.row_plan(64, 511, element_values=16) == row_model.row_plan(64, 511)     # (short: as before)
    assert row_model.row_plan(64, 1023, element_values=8) == row_model.RowPlan(128, 1, 8, 2)   # (two rows a block)
    assert row_model.row_plan(64, 1023, element_values=8, element_min_threads=0).rows == 1
    assert row_model.measured_plan_args("softmax", 1023, "bf16", True)["element_min_threads"] == 0
    # LayerNorm's odd rows of up to 2,048 columns: 8 a thread on blocks of 512 threads
    # (rows.SHORT_ROWS_SHARE_THREADS): four rows of 1,023 columns on 128 threads, two of 2,047 on 256
    for cols, dt, arch, first in ((1023, "bf16", "sm_90a", (128, 1, 8, 4)), (2047, "f16", "sm_80", (256, 1, 8, 2))):
        p = norms.recipe_plan("layernorm", 8192, cols, dt, arch)
        assert (p.lanes, p.vec, p.reps, p.rows) == first, p
    assert norms.recipe_plan("layernorm", 8192, 2049, "bf16", "sm_90a").rows == 1
    assert row_model.measured_plan_args("rmsnorm", 1023, "bf16", True)["element_min_threads"] == \
        row_model.MIN_BLOCK_THREADS
    with pytest.raises(ValueError, match="element_min_threads"):
        row_model.row_plan(64, 1023, element_values=8, element_min_threads=-1)
    with pytest.raises(ValueError, match="allowed"):
        row_model.odd_row_values("cast", 4095)
    # rows of 4-byte accesses: 16-bit pairs (LayerNorm, softmax) and odd f32 rows, from 4,000 columns
    assert row_model.odd_row_values("layernorm", 8190, "bf16") == 32 and row_model.odd_row_values("rmsnorm", 8190) is None
    assert row_model.odd_row_values("softmax", 4095, "f32") == 16 and row_model.odd_row_values("softmax", 2047, "f32") is None
    assert row_model.row_plan(64, 8190, "bf16", element_values=32) == row_model.RowPlan(256, 2, 16, 1)


@pytest.mark.parametrize("kind, cols, dt", [("layernorm", 4094, "bf16"), ("softmax", 4094, "f16"), ("rmsnorm", 4095, "f32"),
                                            ("layernorm", 4097, "f32"), ("softmax", 4095, "f32")])
def test_rows_of_narrow_accesses_match_numpy(kind, cols, dt):
    # the plans of 4-byte accesses on few threads (rows.odd_row_values) against numpy
    plan = row_model.row_plan(3, cols, dt, element_values=row_model.odd_row_values(kind, cols, dt))
    assert plan.lanes <= 512 and plan.reps * plan.vec >= 8
    sched = getattr(recipes, kind)(3, cols, dtype=dt, arch="sm_90a")
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    with pytest.raises(ValueError, match="does not fit in the registers"):
        row_model.row_plan(16, 65536)
    with pytest.raises(ValueError, match="dtype"):
        recipes.rmsnorm(4, 4, dtype="f64")
    with pytest.raises(ValueError, match="scale"):
        recipes.softmax(4, 4, scale=-1.0)


# --------------------------------------------------------------------------- hand-written fused row kernels

def _t(name, dims, R, C, dt="f32"):
    ext = {"r": R, "c": C}
    shape = tuple(ext[d] for d in dims)
    return Tile(Tensor(name, dt, GL, dims, shape, dims[-1]), shape)


def _sum_then_scale(R, C):
    """Y = X * sum(X over c): the row in registers, the sum a register local."""
    X, Xr, S, Y = (_t("X", ("r", "c"), R, C, "f16"), _t("Xr", ("r", "c"), R, C, "f16"), _t("S", ("r",), R, C),
                   _t("Y", ("r", "c"), R, C, "f16"))
    return Fused.kernel(Move(X, Xr, KERNEL), Reduce("sum", Xr, S, ("c",), KERNEL),
                        Pointwise("mul", (Xr, S), Y, KERNEL))


def test_a_part_that_reads_registers_through_other_threads_is_refused():
    spec = _sum_then_scale(4, 256)
    sched = spec.schedule(tile(r=1) >> to_blocks(), place("Xr", RF), place("S", RF),
                          part(0, tile(c=8) >> to_threads(), done()),
                          part(1, tile(c=256), tile(c=8) >> to_threads(), done()),
                          part(2, tile(c=128), tile(c=4) >> to_threads(), done()))
    with pytest.raises(ScheduleError, match="register tensor Xr is held by the threads of another part"):
        sched.check("sm_80")


def test_hand_written_fused_row_kernel_matches_numpy():
    R, C = 5, 200
    spec = _sum_then_scale(R, C)
    ew = (tile(c=128), tile(c=4) >> to_threads(), done())
    sched = spec.schedule(tile(r=1) >> to_blocks(), place("Xr", RF), place("S", RF),
                          part(0, *ew), part(1, *ew), part(2, *ew))
    x = RNG.standard_normal((R, C))
    xr = _r(x, "f16")
    _close(fs.interpret(sched, x), _r(xr * xr.sum(1, keepdims=True), "f16"), "f16")


def test_fused_results_must_be_written_by_the_body():
    spec = _sum_then_scale(4, 8)
    with pytest.raises(ValueError, match="results"):
        Fused.kernel(*spec.body, results=("X",))
    f = Fused.kernel(*spec.body, results=("Y", "S"))
    assert [t.name for t in f.outputs] == ["Y", "S"] and "S" not in [t.name for t in f.locals]
    ns = {**vars(fs.spec), **vars(fs.tensor), "dtypes": fs.dtypes, "ops": fs.ops}
    assert eval(repr(f), ns) == f


# --------------------------------------------------------------------------- causal softmax

def causal_ref(x, scale, diagonal, dt):
    r, c = np.indices(x.shape)
    return softmax_ref(np.where(c > r + diagonal, -np.inf, x), scale, dt)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(R=5, C=3, diagonal=0, dt="f16")          # more rows than columns: the last rows see all
@example(R=1, C=1, diagonal=0, dt="f32")
@given(R=st.integers(1, 40), C=st.integers(1, 700), diagonal=st.integers(0, 9),
       dt=st.sampled_from(["f16", "bf16", "f32"]))
def test_causal_softmax_matches_numpy(R, C, diagonal, dt):
    x = np.random.default_rng(R * 31 + C).standard_normal((R, C)) * 4
    got = fs.interpret(recipes.softmax(R, C, dtype=dt, scale=0.5, causal=True, diagonal=diagonal), x)
    want = causal_ref(_r(x, dt), 0.5, diagonal, dt)
    _close(got, want, dt, scale=2.0)
    r, c = np.indices(x.shape)
    assert np.all(np.asarray(got)[c > r + diagonal] == 0)     # masked elements are exactly zero


def test_causal_mask_compiles_into_the_load():
    k = fs.compile(recipes.softmax(4096, 4096, dtype="bf16", causal=True), arch="sm_90a")
    assert k.spills == 0 and "-inf" in k.source
    assert "causal(r, c)" in str(recipes.softmax(8, 8, causal=True))


def test_a_causal_row_reads_its_visible_vectors_only():
    # 3 rows of 64 f32 (16-byte vectors of 4): row r reads the vectors whose first column is <= r
    # + 1; the interpreter counts the global loads each lane issues
    from firesched.hardware.atoms import catalog
    from firesched.simulate.interp import run_program
    from firesched.testing.planting import map_leaves

    sched = recipes.softmax(3, 64, dtype="f32", causal=True, diagonal=1)
    prog = sched.lower("sm_90a")
    loads = []

    def count(s):
        if getattr(s, "atom", None) is catalog.copy_atom("GL", "RF", 16):
            loads.append(s.pred)
        return s

    map_leaves(prog.kernels[0].body, count)
    assert loads and all(p != 1 for p in loads)          # every vector load has a visibility predicate
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    got = run_program(prog, {"X": x})["Y"]
    r, c = np.indices(x.shape)
    np.testing.assert_allclose(got, causal_ref(x.astype(np.float64), 1.0, 1, "f32"), rtol=1e-5, atol=1e-6)
    assert np.all(got[c > r + 1] == 0)


@pytest.mark.parametrize("kw, match", [({"causal": 1}, "causal"), ({"causal": True, "diagonal": -1}, "diagonal"),
                                       ({"causal": True, "diagonal": 1.5}, "diagonal")])
def test_causal_arguments_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        recipes.softmax(8, 8, **kw)


def test_a_mask_is_refused_where_only_values_are_known():
    from firesched import ops
    with pytest.raises(fs.ScheduleError, match="positional"):
        recipes.gemm(64, 64, 64, dtype="f16", arch="sm_80", epilogue_ops=(ops.causal(),)).check("sm_80")
    with pytest.raises(ValueError, match="two different dim names"):
        ops.causal(row="c", col="c")
    assert eval(repr(ops.causal(2, row="m", col="n")), {"ops": ops}) == ops.causal(2, row="m", col="n")


@pytest.mark.parametrize("field", ["element_min_threads", "partial_pass_blocks"])
@pytest.mark.parametrize("value", [-1, True, 2.0])
def test_row_plan_refuses_bad_counts(field, value):
    with pytest.raises(ValueError, match=f"row_plan: {field} must be an int >= 0"):
        row_model.row_plan(8, 4096, **{field: value})


@pytest.mark.parametrize("rows, cols, dtype, bias", [(5, 1023, "bf16", True), (3, 1535, "f16", False), (4, 1001, "f16", True)])
def test_layernorms_odd_rows_in_registers_take_the_output_from_the_row(rows, cols, dtype, bias):
    # an odd row (element accesses) in registers: (x - mean) · rstd · w + b from the row, the
    # deviations dying with the variance; rows of 16-byte vectors keep the output from the deviations
    sched = fs.recipes.layernorm(rows, cols, dtype=dtype, arch="sm_90a", bias=bias)
    ops_ = [getattr(sp, "op", None) for sp in sched.spec.body]
    assert ("normalize_affine" if bias else "normalize_scale") in ops_, ops_
    fs.testing.assert_schedule_correct(sched, examples=2, arch="sm_90a")
    even = fs.recipes.layernorm(rows, 4096, dtype=dtype, arch="sm_90a", bias=bias).spec.body
    assert not {"normalize_affine", "normalize_scale"} & {getattr(sp, "op", None) for sp in even}


def test_recipe_plans_are_the_recipes_own():
    # norms.recipe_plan is what each recipe schedules with (its arguments in one place,
    # recipe_plan_args): the schedule's block tiling is the plan's
    for op, cols, dt in [("rmsnorm", 45056, "bf16"), ("add_rmsnorm", 36864, "f16"), ("layernorm", 24569, "bf16"),
                         ("softmax", 32768, "bf16"), ("causal", 26000, "f16"), ("layernorm", 4000, "f32")]:
        plan = norms.recipe_plan(op, 64, cols, dt, "sm_90a")
        sched = (recipes.softmax(64, cols, dtype=dt, arch="sm_90a", causal=True) if op == "causal" else
                 getattr(recipes, op)(64, cols, dtype=dt, arch="sm_90a"))
        assert sched.strategies[0] == row_model.kernel_strategies(plan)[0], (op, cols, plan)
    with pytest.raises(ValueError, match="allowed: 'rmsnorm'"):
        norms.recipe_plan_args("rms", "f16", "sm_90a")


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
def test_short_narrow_rows_take_a_warp_or_less(op):
    # 16-bit rows of 33 - 1,000 columns (768 for add + RMSNorm) and f32 rows of up to 512 in
    # accesses of 2 to 8 bytes (add + RMSNorm: 16-bit rows of 2- and 4-byte accesses): a warp a row
    # or less at 8 or more elements a thread, rows sharing a block of 256 threads
    # (rows.SHORT_NARROW_COLS); rows of 16-byte accesses, rows of 32 or fewer columns and longer
    # rows as before
    c16, c32, widest = row_model.SHORT_NARROW_COLS[op]
    cases = [(33, "bf16", 4, 9, 2), (101, "bf16", 16, 7, 2), (255, "bf16", 32, 8, 2), (254, "bf16", 32, 4, 4),
             (767, "bf16", 32, 24, 2), (999, "bf16", 32, 32, 2), (252, "bf16", 32, 2, 8), (255, "f32", 32, 8, 4),
             (510, "f32", 32, 8, 8), (101, "f32", 16, 7, 4)]
    for cols, dt, lanes, reps, access in cases:
        plan = norms.recipe_plan(op, 65536, cols, dt, "sm_90a")
        if cols > (c16 if dt != "f32" else c32) or access > widest:
            assert plan.lanes != lanes or plan.rows == 1, (cols, dt, plan)
            continue
        assert (plan.lanes, plan.reps, plan.lanes * plan.rows, plan.row_memory) == (lanes, reps, 256, "RF"), \
            (cols, dt, plan)
        assert norms.recipe_plan(op, 3, cols, dt, "sm_80").lanes == lanes

    def fields(p):
        return p.lanes, p.vec, p.reps, p.rows, p.row_memory, p.aligned, p.persistent

    for cols, dt in ((256, "f16"), (31, "bf16"), (767, "f32"), (1020, "bf16")):
        without = row_model.row_plan(65536, cols, dt, **{**row_model.measured_plan_args(op, cols, dt, True, 65536),
                                                         "short_narrow_cols": 0})
        assert fields(norms.recipe_plan(op, 65536, cols, dt, "sm_90a")) == fields(without), (cols, dt)
    for bad in ({"short_narrow_cols": -1}, {"short_narrow_bytes": "8"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            row_model.row_plan(4, 255, "bf16", **bad)
    # the plans through the interpreter (the last block's rows partly past the end) and without
    # spills at their longest
    kind, kw = ("softmax", {"causal": True}) if op == "causal" else (op, {})
    for rows, cols, dt in ((19, 101, "f16"), (5, 254, "f16"), (70, 33, "f16"), (21, 252, "bf16"), (9, 255, "f32")):
        sched = getattr(recipes, kind)(rows, cols, dtype=dt, arch="sm_90a", **kw)
        fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    for cols, dt in ((c16 - 1, "bf16"), (c32 - 1, "f32")):
        if cols > 32:
            assert fs.compile(getattr(recipes, kind)(65536, cols, dtype=dt, arch="sm_90a", **kw), arch="sm_90a").spills == 0


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
def test_longer_narrow_rows_take_128_threads_two_rows_a_block(op, monkeypatch):
    # 16-bit rows of 2 or 4 mod 8 columns from 1,001 (rows.NARROW_BLOCK_COLS: up to 3,072 in
    # pairs, 2,560 in quads, by recipe and tier): 128 threads a row, two rows a block (one where
    # the tensor has one row), on sm_90a and sm_80 alike; rows of 16-byte vectors, odd rows, f32
    # rows and rows past the range as before
    tiers = row_model.NARROW_BLOCK_COLS.get(op, ())

    def last(vec, rows):
        return max((t[0 if vec == 2 else 1] for t in tiers if rows >= t[2]), default=0)

    for cols, dt, vec, reps in ((1002, "bf16", 2, 4), (1020, "f16", 4, 2), (1534, "bf16", 2, 6), (2044, "f16", 4, 4),
                                (2046, "bf16", 2, 8), (2556, "bf16", 4, 5), (3068, "f16", 4, 6), (3070, "bf16", 2, 12)):
        for rows in (4096, 65536):
            for arch in ("sm_90a", "sm_80"):
                plan = norms.recipe_plan(op, rows, cols, dt, arch)
                taken = (plan.lanes, plan.vec, plan.reps, plan.rows, plan.row_memory) == (128, vec, reps, 2, "RF")
                assert taken == (cols <= last(vec, rows)), (cols, dt, rows, arch, plan)
        assert norms.recipe_plan(op, 1, cols, dt, "sm_90a").rows == 1
    expected = {"softmax": (1, 1, 0), "layernorm": (1, 1, 0), "rmsnorm": (0, 1, 0), "causal": (0, 1, 0),
                "add_rmsnorm": (0, 0, 0)}[op]
    assert tuple(int(norms.recipe_plan(op, r, c, "bf16", "sm_90a").lanes == 128) for r, c in
                 ((4096, 2046), (16384, 3070), (32768, 3068))) == expected
    others = ((1000, "bf16"), (1024, "bf16"), (1023, "f16"), (3074, "bf16"), (1022, "f32"))
    plans = [norms.recipe_plan(op, 65536, cols, dt, "sm_90a") for cols, dt in others]
    with monkeypatch.context() as m:
        m.setitem(row_model.NARROW_BLOCK_COLS, op, ())
        assert plans == [norms.recipe_plan(op, 65536, cols, dt, "sm_90a") for cols, dt in others]
    for bad in ((96, 2), (128, 0), (128,), 128):
        with pytest.raises(ValueError, match="narrow_block"):
            row_model.row_plan(4, 1022, "bf16", narrow_block=bad)
    # a row past what 128 threads hold in registers keeps the plans of longer rows
    assert row_model.row_plan(4, 30002, "bf16", narrow_block=(128, 2)).lanes != 128
    assert row_model.narrow_block(op, 30002, "bf16") is None
    if not tiers:
        return
    # through the interpreter (an odd number of rows: the last block's second row past the end)
    # and without spills at the longest, both targets
    kind, kw = ("softmax", {"causal": True}) if op == "causal" else (op, {})
    for rows, cols, dt in ((3, 1022, "bf16"), (3, 1020, "f16")):
        sched = getattr(recipes, kind)(rows, cols, dtype=dt, arch="sm_90a", **kw)
        assert norms.recipe_plan(op, rows, cols, dt, "sm_90a").lanes == 128
        fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    for cols, dt, arch in ((last(2, 65536) - 2, "bf16", "sm_90a"), (last(4, 65536) - 4, "f16", "sm_80")):
        assert fs.compile(getattr(recipes, kind)(65536, cols, dtype=dt, arch=arch, **kw), arch=arch).spills == 0


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
def test_odd_rows_of_narrow_blocks(op):
    # odd 16-bit rows of the columns rows.NARROW_BLOCK_ODD names (causal softmax 1,025 - 1,700,
    # softmax 1,530 - 1,699, add + RMSNorm 1,025 - 1,300): 128 threads a row, two rows a block,
    # element accesses; others and other lengths as before
    first, last = row_model.NARROW_BLOCK_ODD.get(op, (0, 0))
    for cols in (1025, 1151, 1299, 1301, 1531, 1699, 1701):
        for arch in ("sm_90a", "sm_80"):
            plan = norms.recipe_plan(op, 16384, cols, "f16", arch)
            taken = (plan.lanes, plan.vec, plan.reps, plan.rows, plan.row_memory) == (128, 1, -(-cols // 128), 2, "RF")
            assert taken == (first <= cols <= last), (op, cols, arch, plan)
    assert row_model.narrow_block(op, 1151, "bf16") == ((128, 2) if first <= 1151 <= last else None)
    if not last:
        return
    # through the interpreter (the last block's second row past the end) and without spills at
    # the longest, both targets
    kind, kw = ("softmax", {"causal": True}) if op == "causal" else (op, {})
    sched = getattr(recipes, kind)(3, first + 2 if first % 2 else first + 1, dtype="bf16", arch="sm_90a", **kw)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    for arch in ("sm_90a", "sm_80"):
        longest = last if last % 2 else last - 1
        assert fs.compile(getattr(recipes, kind)(16384, longest, dtype="f16", arch=arch, **kw), arch=arch).spills == 0


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
def test_f32_rows_of_narrow_blocks(op):
    # f32 rows of 513 columns on (rows.NARROW_BLOCK_F32) in 4- or 8-byte accesses: 128 threads a
    # row, two rows a block, where the recipe measured it faster (LayerNorm from 8,192 rows)
    odd, pairs, fewest = row_model.NARROW_BLOCK_F32.get(op, (0, 0, 0))
    for cols in (513, 767, 1001, 1022, 1279, 1535, 1537, 1026, 2046):
        for rows in (4096, 16384):
            for arch in ("sm_90a", "sm_80"):
                plan = norms.recipe_plan(op, rows, cols, "f32", arch)
                vec = 1 if cols % 2 else 2
                taken = (plan.lanes, plan.vec, plan.reps, plan.rows) == (128, vec, -(-cols // 128 // vec), 2)
                assert taken == (rows >= fewest and cols <= (odd if vec == 1 else pairs)), (op, cols, rows, arch, plan)
    assert row_model.narrow_block(op, 767, "f32", rows=4) == ((128, 2) if 767 <= odd and fewest <= 4 else None)
    if not odd:
        return
    # the plan of many rows through the interpreter on three (the last block's second row past
    # the end), and without spills at its longest, both targets
    kind, kw = ("softmax", {"causal": True}) if op == "causal" else (op, {})
    plan = norms.recipe_plan(op, 16384, 515, "f32", "sm_90a")
    assert plan.lanes == 128
    fs.testing.assert_schedule_correct(getattr(recipes, kind)(3, 515, dtype="f32", arch="sm_90a", plan=plan, **kw),
                                       examples=1, arch="sm_90a")
    for arch in ("sm_90a", "sm_80"):
        longest = odd if odd % 2 else odd - 1
        assert fs.compile(getattr(recipes, kind)(16384, longest, dtype="f32", arch=arch, **kw), arch=arch).spills == 0


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
def test_long_rows_of_pairs(op, monkeypatch):
    # 16-bit rows of 2 mod 4 columns from 3,073 to the recipe's last (rows.LONG_PAIRS): 256
    # threads a row, two rows a block (causal softmax one), on both targets; quads, odd rows and
    # rows past the last as before
    last, lanes, per_block = row_model.LONG_PAIRS.get(op, (0, 0, 0))
    for cols in (3074, 3582, 4094, 6142, 6146, 8190, 8194):
        for arch in ("sm_90a", "sm_80"):
            plan = norms.recipe_plan(op, 16384, cols, "bf16", arch)
            taken = (plan.lanes, plan.vec, plan.reps, plan.rows) == (lanes, 2, -(-cols // 2 // max(1, lanes)), per_block)
            assert taken == (cols <= last), (op, cols, arch, plan)
    others = [(c, d) for c in (3070, 3076, 4092, 4095, 8194) for d in ("bf16", "f32")]
    plans = [norms.recipe_plan(op, 16384, c, d, "sm_90a") for c, d in others]
    with monkeypatch.context() as m:
        m.setitem(row_model.LONG_PAIRS, op, (0, 0, 0))
        assert plans == [norms.recipe_plan(op, 16384, c, d, "sm_90a") for c, d in others]
    assert row_model.narrow_block(op, 4094, "bf16") == ((lanes, per_block) if last else None)
    with pytest.raises(ValueError, match="narrow_block"):
        row_model.row_plan(4, 4094, "bf16", narrow_block=(256, True))
    if not last:
        return
    # the plan through the interpreter on three rows (the last block's second row past the end),
    # and without spills at its longest, both targets
    kind, kw = ("softmax", {"causal": True}) if op == "causal" else (op, {})
    fs.testing.assert_schedule_correct(getattr(recipes, kind)(3, 3074, dtype="bf16", arch="sm_90a", **kw),
                                       examples=1, arch="sm_90a")
    for arch in ("sm_90a", "sm_80"):
        assert fs.compile(getattr(recipes, kind)(16384, last - 2, dtype="f16", arch=arch, **kw), arch=arch).spills == 0


def test_grids_of_no_more_blocks_than_sms_ask_for_one_an_sm():
    # a grid of no more blocks than the target's SMs asks for one block an SM (norms.plan_rows):
    # more only capped the registers, and these spilled (RMSNorm 5 x 45,001 16 bytes a thread on
    # 1,024 threads at two an SM; softmax 1 x 262,143 on clusters of 8 at three, 8 bytes)
    for op, rows, cols in (("rmsnorm", 5, 45001), ("softmax", 1, 262143), ("layernorm", 3, 16392)):
        few, many = (norms.recipe_plan(op, r, cols, "bf16", "sm_90a") for r in (rows, 4096))
        assert many.occupancy > 1 and few.occupancy == 1 and attrs.evolve(few, blocks_per_sm=0) == \
            attrs.evolve(many, blocks_per_sm=0), (op, few, many)
    # (132 blocks of the sm_90a target: one an SM; 133: as the tile model says)
    assert norms.recipe_plan("layernorm", 132, 16392, "bf16", "sm_90a").occupancy == 1
    assert norms.recipe_plan("layernorm", 133, 16392, "bf16", "sm_90a").occupancy == 2
    # a persistent grid keeps its blocks an SM (they size its grid)
    assert norms.recipe_plan("rmsnorm", 8192, 2047, "bf16", "sm_90a").persistent
    for op, rows, cols in (("rmsnorm", 5, 45001), ("softmax", 1, 262143)):
        assert fs.compile(getattr(recipes, op)(rows, cols, dtype="bf16", arch="sm_90a"), arch="sm_90a").spills == 0


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
def test_odd_rows_past_a_blocks_window_take_cluster_windows(op):
    # 16-bit odd rows past what one block's window holds (114,687 - 262,143 columns): the staged
    # cluster plan of the row rounded up to 16-byte vectors, each part on an aligned window one
    # pass longer, pushing its statistics (rows.cluster_windows); f32 rows, sm_80 (no clusters)
    # and rows of whole vectors as before
    for cols in (114687, 116009, 131071, 200003, 262143):
        for dt in ("bf16", "f16"):
            plan = norms.recipe_plan(op, 1024, cols, dt, "sm_90a")
            even = norms.recipe_plan(op, 1024, -(-cols // 8) * 8, dt, "sm_90a")
            assert plan.aligned and (plan.vec, plan.row_memory, plan.exchange) == (8, "SH", "push"), plan
            assert (plan.lanes, plan.cluster, plan.part) == (even.lanes, even.cluster, even.part), (plan, even)
            assert plan.part % 8 == 0 and (plan.cluster - 1) * plan.part < cols <= plan.cluster * plan.part
            assert plan.reps * plan.span >= plan.part + 7 > (plan.reps - 1) * plan.span
            assert plan.occupancy * (plan.reps * plan.span * 2 + 1024) <= 227 * 1024
            # (the recipe's plan is the rule's, with the recipe's exchange and guards)
            assert attrs.evolve(row_model.cluster_windows(cols, 2), exchange=plan.exchange, guard=plan.guard) == plan
    for cols, dt in ((131072, "bf16"), (65537, "bf16"), (100003, "f16"), (131072, "f32")):
        plan = norms.recipe_plan(op, 1024, cols, dt, "sm_90a")
        assert not (plan.aligned and plan.cluster > 1), (cols, dt, plan)
    # f32 rows up to the recipe's F32_CLUSTER_WINDOWS (RMSNorm and add + RMSNorm 24,575), where
    # their rows take clusters; element copies beyond
    last = row_model.F32_CLUSTER_WINDOWS[op]
    for cols in (20001, 24575, 32767, 65537, 131071):
        plan = norms.recipe_plan(op, 1024, cols, "f32", "sm_90a")
        windows = row_model.cluster_windows(cols, 4)
        taken = plan.aligned and plan.cluster > 1
        assert taken == (cols <= last and windows is not None and plan.row_memory == "SH" and
                         (plan.lanes, plan.cluster, plan.part) == (windows.lanes, windows.cluster, windows.part)), \
            (cols, plan, windows)
        if cols > last:
            assert not taken, plan
    # the plan through the interpreter at full length (every part's window, the last part short),
    # and without spills at the longest
    kind, kw = ("softmax", {"causal": True}) if op == "causal" else (op, {})
    fs.testing.assert_schedule_correct(getattr(recipes, kind)(2, 131071, dtype="bf16", arch="sm_90a", **kw),
                                       examples=1, arch="sm_90a")
    f32 = min(65537, row_model.F32_CLUSTER_WINDOWS[op])
    assert norms.recipe_plan(op, 3, f32, "f32", "sm_90a").aligned
    fs.testing.assert_schedule_correct(getattr(recipes, kind)(3, f32, dtype="f32", arch="sm_90a", **kw),
                                       examples=1, arch="sm_90a")
    assert fs.compile(getattr(recipes, kind)(1024, 262143, dtype="f16", arch="sm_90a", **kw), arch="sm_90a").spills == 0
    longest = min(262143, row_model.F32_CLUSTER_WINDOWS[op])
    assert fs.compile(getattr(recipes, kind)(1024, longest, dtype="f32", arch="sm_90a", **kw), arch="sm_90a").spills == 0


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal"])
def test_f32_rows_of_narrow_accesses_stage_their_window(op):
    # f32 rows of 4-byte accesses (odd; and of 8-byte ones, 2 mod 4, but in add + RMSNorm) of
    # 8,193 to the recipe's last columns wait in shared memory in their aligned window, on blocks
    # of whole warps about F32_WINDOW_THREADS, several an SM where they fit (rows.F32_STAGED_WINDOWS);
    # rows of 16-byte vectors, shorter rows and sm_80 as before
    first, last, widest = row_model.F32_STAGED_WINDOWS[op]
    for cols in (8191, 8193, 12287, 16382, 20001, 28001, 28003, 32767, 32768, 40001):
        plan = norms.recipe_plan(op, 4096, cols, "f32", "sm_90a")
        access = 4 if cols % 2 else 8 if cols % 4 else 16
        staged = first <= cols <= last and access <= widest
        assert (plan.aligned and plan.cluster == 1 and plan.row_memory == "SH") == staged, (cols, plan)
        if staged:
            assert plan.vec == 4 and plan.lanes % 32 == 0 and plan.reps * plan.span >= cols + 3, plan
            assert plan.occupancy * (plan.reps * plan.span * 4 + 1024) <= 227 * 1024
    assert not norms.recipe_plan(op, 4096, 20001, "f32", "sm_80").aligned or \
        norms.recipe_plan(op, 4096, 20001, "f32", "sm_80").row_memory == "RF"
    with pytest.raises(ValueError, match="f32_staged_window"):
        row_model.row_plan(4, 20001, "f32", f32_staged_window=(8193, 32767))
    # through the interpreter on three rows (every phase's start), and without spills
    kind, kw = ("softmax", {"causal": True}) if op == "causal" else (op, {})
    fs.testing.assert_schedule_correct(getattr(recipes, kind)(3, 8193, dtype="f32", arch="sm_90a", **kw),
                                       examples=1, arch="sm_90a")
    assert fs.compile(getattr(recipes, kind)(4096, last, dtype="f32", arch="sm_90a", **kw), arch="sm_90a").spills == 0
