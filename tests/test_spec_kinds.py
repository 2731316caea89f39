"""Every spec kind is scheduled by the same strategies and lowered by the same rules: kernel-level
``Pointwise`` (with broadcasting), ``Move`` (copy, cast, transpose through shared memory) and
``Reduce`` (sum, max, min, mean; within a warp through shuffles, within a block through shared
memory), checked in the interpreter against numpy formulas written here, and compiled by NVRTC."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ops
from firesched.errors import ScheduleError
from firesched.hardware import sm80
from firesched.strategies import done, move_to_smem, tile, to_blocks, to_threads, to_warps


def _r(x, dt="f16"):
    return np.asarray(x).astype(fs.dtypes.dtype(dt).np).astype(np.float64)


def _close(got, want, tol=1e-2):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))


RNG = np.random.default_rng(11)


# --------------------------------------------------------------------------- Pointwise

@pytest.mark.parametrize("R, C, br, bc, tc", [(37, 100, 4, 64, 8), (8, 64, 8, 64, 4), (1, 7, 1, 8, 1), (65, 33, 16, 32, 2)])
def test_binary_pointwise_with_a_broadcast_row(R, C, br, bc, tc):
    spec = fs.Pointwise.kernel("add", {"r": R, "c": C}, inputs=[("r", "c"), ("c",)])
    sched = spec.schedule(tile(r=br, c=bc) >> to_blocks(), tile(r=1, c=tc) >> to_threads(), done())
    X, Y = RNG.standard_normal((R, C)), RNG.standard_normal(C)
    _close(fs.interpret(sched, X, Y), _r(_r(X) + _r(Y)[None, :]))


def test_pointwise_broadcast_column_and_op_chain():
    """O = relu(2 * (X * y[r])) with y broadcast along the columns."""
    spec = fs.Pointwise.kernel("mul", {"r": 30, "c": 48}, inputs=[("r", "c"), ("r",)])
    spec = fs.Pointwise(spec.op, spec.inputs, spec.out, spec.level, (ops.scale(2.0), ops.relu()))
    sched = spec.schedule(tile(r=8, c=48) >> to_blocks(), tile(r=1, c=8) >> to_threads(), done())
    X, Y = RNG.standard_normal((30, 48)), RNG.standard_normal(30)
    _close(fs.interpret(sched, X, Y), _r(np.maximum(2.0 * _r(X) * _r(Y)[:, None], 0.0)))


def test_pointwise_compiles_with_sixteen_byte_accesses():
    spec = fs.Pointwise.kernel("sub", {"r": 64, "c": 256})
    sched = spec.schedule(tile(r=2, c=256) >> to_blocks(), tile(r=1, c=8) >> to_threads(), done())
    k = fs.compile(sched, arch="sm_80")
    assert k.spills == 0
    assert "ld.global.v4.b32" in k.source and "st.global.v4.b32" in k.source


# --------------------------------------------------------------------------- Move

@pytest.mark.parametrize("src, dst", [("f32", "bf16"), ("f16", "f32"), ("bf16", "f16"), ("f16", "f16")])
def test_copy_and_cast(src, dst):
    spec = fs.Move.kernel({"r": 50, "c": 70}, src=src, dst=dst)
    sched = spec.schedule(tile(r=8, c=64) >> to_blocks(), tile(r=1, c=4) >> to_threads(), done())
    X = RNG.standard_normal((50, 70))
    _close(fs.interpret(sched, X), _r(_r(X, src), dst), tol=0)


@pytest.mark.parametrize("R, C", [(70, 90), (32, 32), (5, 129)])
def test_transpose_through_shared_memory(R, C):
    """Rows are read from global memory along their contiguous dim into shared memory, and written
    out along the other dim: both sides of the transpose access memory contiguously."""
    spec = fs.Move.kernel({"r": R, "c": C}, src="f16", dst_major="r")
    sched = spec.schedule(tile(r=32, c=32) >> to_blocks(), move_to_smem("X"), tile(r=8, c=1) >> to_threads(),
                          done())
    X = RNG.standard_normal((R, C))
    _close(fs.interpret(sched, X), _r(X), tol=0)
    prog = sched.lower("sm_80")
    assert prog.output.shape == (C, R)              # Y is stored column by column


# --------------------------------------------------------------------------- Reduce

REF = {"sum": lambda x: x.sum(1), "max": lambda x: x.max(1), "min": lambda x: x.min(1), "mean": lambda x: x.mean(1)}


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("R, C", [(13, 1000), (4, 256), (3, 7)])
def test_warp_per_row_reductions(op, R, C):
    spec = fs.Reduce.kernel(op, {"r": R, "c": C}, "c")
    sched = spec.schedule(tile(r=4) >> to_blocks(), tile(r=1) >> to_warps(), tile(c=256),
                          tile(c=8) >> to_threads(), done())
    X = RNG.standard_normal((R, C))
    _close(fs.interpret(sched, X), REF[op](_r(X)), tol=1e-4)


@pytest.mark.parametrize("threads", [64, 128, 256])
def test_block_per_row_sum_combines_warps_through_shared_memory(threads):
    spec = fs.Reduce.kernel("sum", {"r": 5, "c": 3000}, "c")
    sched = spec.schedule(tile(r=1) >> to_blocks(), tile(c=8 * threads), tile(c=8) >> to_threads(), done())
    X = RNG.standard_normal((5, 3000))
    _close(fs.interpret(sched, X), _r(X).sum(1), tol=1e-4)
    src = fs.compile(sched, arch="sm_80").source
    assert "shfl.sync.bfly.b32" in src and "Y_partials" in src


@pytest.mark.parametrize("op", ["sum", "max", "mean"])
@pytest.mark.parametrize("threads", [96, 160, 544, 992])
def test_block_per_row_reductions_over_any_whole_number_of_warps(op, threads):
    """3, 5, 17 or 31 warps: each warp's lanes halve their partial results with shuffles, and the
    warps' results fold through shared memory, however many there are."""
    spec = fs.Reduce.kernel(op, {"r": 3, "c": 9001}, "c")
    sched = spec.schedule(tile(r=1) >> to_blocks(), tile(c=8 * threads), tile(c=8) >> to_threads(), done())
    X = RNG.standard_normal((3, 9001))
    _close(fs.interpret(sched, X), REF[op](_r(X)), tol=1e-4 if op != "max" else 0)


@settings(max_examples=40 if settings().max_examples >= 500 else 10, deadline=None)
@given(warps=st.integers(1, 32), op=st.sampled_from(["sum", "max", "min", "mean"]), R=st.integers(1, 4),
       C=st.integers(1, 3000), per=st.sampled_from([1, 2, 4, 8]))
def test_hypothesis_block_reductions_over_whole_warps(warps, op, R, C, per):
    # any whole number of warps, rows that do not divide the block's pass, a few elements a thread
    spec = fs.Reduce.kernel(op, {"r": R, "c": C}, "c")
    sched = spec.schedule(tile(r=1) >> to_blocks(), tile(c=per * 32 * warps), tile(c=per) >> to_threads(), done())
    X = RNG.standard_normal((R, C))
    _close(fs.interpret(sched, X), REF[op](_r(X)), tol=1e-4 if op not in ("max", "min") else 0)


def test_a_tuple_reduction_over_warps_not_a_power_of_two_folds_the_rest_first():
    """A monoid's warps' results: lane l takes warp l % 16's and, for l % 16 < 1, warp 16's too
    (17 warps), then four shuffles; every component is exchanged (the lanes' counts differ)."""
    from firesched.recipes.rows import RowPlan

    plan = RowPlan(544, 8, 3, 1)
    sched = fs.recipes.layernorm(3, 13001, dtype="bf16", arch="sm_90a", plan=plan, tuple_stats=True)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    src = fs.compile(sched, arch="sm_90a").source
    assert "part_rest" in src and "Mean_partials" in src


def test_partial_results_within_a_warp_stay_a_power_of_two():
    spec = fs.Reduce.kernel("sum", {"r": 3, "c": 500}, "c")
    with pytest.raises(ScheduleError, match="power of two within a warp") as e:
        spec.schedule(tile(r=1) >> to_blocks(), tile(c=8 * 48), tile(c=8) >> to_threads(), done()).check()
    assert "a multiple of the units one warp holds (32)" in str(e.value)


def test_sub_warp_rows_use_fewer_shuffles():
    """Eight lanes per row, four rows per warp: the butterflies stay within each row's lanes."""
    spec = fs.Reduce.kernel("max", {"r": 16, "c": 64}, "c")
    sched = spec.schedule(tile(r=4) >> to_blocks(), tile(c=64), tile(r=1, c=8) >> to_threads(), done())
    X = RNG.standard_normal((16, 64))
    _close(fs.interpret(sched, X), _r(X).max(1), tol=0)


# --------------------------------------------------------------------------- refusals

def test_done_without_an_atom_needs_thread_level_elementwise_work():
    spec = fs.Pointwise.kernel("add", {"r": 8, "c": 8})
    with pytest.raises(ScheduleError, match="map the focus onto threads first"):
        spec.schedule(tile(r=8, c=8) >> to_blocks(), done())
    mm = fs.MatMul.kernel(16, 8, 16)
    with pytest.raises(ScheduleError, match="this focus needs an atom"):
        mm.schedule(tile(m=16, n=8) >> to_blocks(), tile(m=16, n=8) >> to_warps(), done())


def test_a_thread_tile_too_large_for_registers_is_refused():
    spec = fs.Pointwise.kernel("add", {"r": 8, "c": 1024})
    with pytest.raises(ScheduleError, match="elements per thread"):
        spec.schedule(tile(r=8, c=1024) >> to_blocks(), tile(r=1, c=512) >> to_threads(), done())


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("R,C,part", [(4, 1 << 16, 4096), (3, 1000, 256), (1, 33, 32), (2, 5000, 4096)])
def test_a_reduction_across_blocks_is_two_launches(op, R, C, part):
    """A reduced dim tiled onto blocks: each block reduces its part into a workspace of partial
    results (in f32, one row per part) and a second launch folds the parts; a mean divides by the
    whole count once, at the end."""
    spec = fs.Reduce.kernel(op, {"r": R, "c": C}, "c", out="f16")
    chunk = min(part, 256)
    sched = spec.schedule(tile(r=1, c=part) >> to_blocks(), tile(c=chunk), tile(c=chunk // 32) >> to_threads(),
                          done())
    text = str(sched)
    parts = -(-C // part)
    assert f"Y_part:GL f32[{parts}x{R}] -> Y:GL f16[{R}]" in text
    prog = sched.lower("sm_80")
    assert len(prog.kernels) == 2 and prog.kernels[0].grid[0] * prog.kernels[0].grid[1] == R * parts
    X = RNG.standard_normal((R, C))
    want = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}[op](_r(X), axis=1)
    got = np.asarray(fs.interpret(sched, X), np.float64)
    assert np.allclose(got, want.astype(np.float16).astype(np.float64), rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_a_reduction_across_blocks_splits_one_reduced_dim():
    spec = fs.Reduce.kernel("sum", {"r": 4, "c": 64, "d": 64}, ("c", "d"))
    with pytest.raises(ScheduleError, match="splits one reduced dimension into parts"):
        spec.schedule(tile(r=1, c=16, d=16) >> to_blocks())


def test_a_reduced_tile_left_off_the_blocks_is_refused_at_check():
    spec = fs.Reduce.kernel("sum", {"r": 3, "c": 1000}, "c")
    sched = spec.schedule(tile(c=256), tile(r=1) >> to_blocks(), tile(c=256), tile(c=8) >> to_threads(), done())
    with pytest.raises(ScheduleError, match=r"loops c0 over c are not mapped onto blocks") as e:
        sched.check("sm_80")
    assert "tile(r=..., c=...) >> to_blocks()" in e.value.fix


def test_one_strategy_creates_the_accumulator_and_maps_the_reduction():
    """tile(c=8) creates the register accumulator and its store; >> to_threads() then spreads the
    reduced dim over threads, whose partial results that store combines."""
    spec = fs.Reduce.kernel("sum", {"r": 4, "c": 256}, "c")
    sched = spec.schedule(tile(r=1) >> to_blocks())
    ok = sched.apply(tile(c=8) >> to_threads(), done())
    X = RNG.standard_normal((4, 256))
    _close(fs.interpret(ok, X), _r(X).sum(1), tol=1e-4)


def test_elementwise_leaves_refuse_sm80_only_atoms_on_no_target():
    spec = fs.Pointwise.kernel("add", {"r": 8, "c": 8})
    sched = spec.schedule(tile(r=8, c=8) >> to_blocks(), tile(r=1, c=8) >> to_threads(), done())
    # plain loads, stores and ALU ops exist everywhere
    sched.check("sm_70")
    assert sm80.cp_async_16.min_target == "sm_80"
