"""Staged windows on whole warps (``rows.whole_warps``): where a power-of-two block's last pass over
a row would hold only a few chunks, the plan takes the whole number of warps whose passes cost the
fewest warp-passes.  The choice keeps its bounds (threads an SM, passes, shared memory), the
recipes take it where measured, and their kernels on such blocks interpret equal to numpy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched.recipes import norms
from firesched.recipes import rows as row_model


def test_a_nearly_idle_last_pass_takes_whole_warps():
    # LayerNorm 16,383 bf16 columns: a window of 2,049 chunks; 512 x 5 leaves one chunk in its last
    # pass (80 warp-passes), 416 x 5 covers it in 65
    assert row_model.whole_warps(2049, 512, 5, 1) == (416, 5)
    # softmax 6,139: 769 chunks; 256 x 4 -> 160 x 5 (25 warp-passes for 32)
    assert row_model.whole_warps(769, 256, 4, 3) == (160, 5)
    # a last pass half full keeps the plan (14,319 columns: 1,791 chunks on 512 x 4)
    assert row_model.whole_warps(1791, 512, 4, 1) == (512, 4)
    # one pass: nothing to drop
    assert row_model.whole_warps(100, 128, 1, 4) == (128, 1)


@settings(max_examples=300, deadline=None)
@given(lanes=st.sampled_from([64, 128, 256, 512, 1024]), reps=st.integers(1, 32), blocks=st.integers(1, 8),
       short=st.integers(0, 1023))
def test_whole_warps_keep_their_bounds(lanes, reps, blocks, short):
    chunks = lanes * reps - short % lanes
    warps, passes = row_model.whole_warps(chunks, lanes, reps, blocks)
    assert warps % 32 == 0 and warps * passes >= chunks                    # whole warps cover the row
    assert warps * passes <= lanes * reps                                   # no more shared memory
    assert passes <= reps + row_model.WHOLE_WARPS_MORE_PASSES
    assert warps <= row_model.MAX_THREADS
    assert warps * blocks <= max(row_model.MAX_THREADS_PER_SM, lanes * blocks)
    lo, hi = row_model.WHOLE_WARPS_RANGE
    assert (warps, passes) == (lanes, reps) or lo * lanes <= warps <= hi * lanes
    if chunks - lanes * (reps - 1) > lanes // row_model.WHOLE_WARPS_IDLE:
        assert (warps, passes) == (lanes, reps)


@pytest.mark.parametrize("op, cols, lanes, reps", [("layernorm", 16383, 416, 5), ("softmax", 6139, 160, 5),
                                                   ("rmsnorm", 12287, 224, 7), ("add_rmsnorm", 4095, 288, 2)])
def test_the_recipes_take_whole_warps_where_measured(op, cols, lanes, reps):
    p = norms.recipe_plan(op, 4096, cols, "bf16", "sm_90a")
    assert (p.lanes, p.reps, p.aligned, p.row_memory) == (lanes, reps, True, "SH"), p
    # even rows keep their plans
    even = norms.recipe_plan(op, 4096, cols + 1, "bf16", "sm_90a")
    assert even.lanes & (even.lanes - 1) == 0, even


@pytest.mark.parametrize("op, rows, cols", [("layernorm", 3, 16383), ("softmax", 5, 6139), ("rmsnorm", 3, 12287),
                                            ("add_rmsnorm", 9, 4095)])
def test_kernels_on_whole_warps_match_numpy(op, rows, cols):
    # the plan of 4,096 such rows, on a few: the blocks' warps (13, 5, 7 and 9 of them) combine
    # through shared memory, the windows' edges are guarded
    plan = norms.recipe_plan(op, 4096, cols, "f16", "sm_90a")
    assert plan.lanes & (plan.lanes - 1)
    sched = getattr(fs.recipes, op)(rows, cols, dtype="f16", arch="sm_90a", plan=plan)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    assert fs.compile(sched, arch="sm_90a").spills == 0
