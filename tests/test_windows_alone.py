"""Odd rows whose staged window two blocks an SM cannot hold (about 57,000 to 116,000 columns of a
16-bit type) wait in it on one block alone on its SM (``rows.STAGED_WINDOW_ALONE``) instead of a
cluster of element copies; longer ones keep their clusters, and causal softmax's staged windows no
longer stop at 41,000 columns."""

from __future__ import annotations

import pytest

import firesched as fs
from firesched.recipes import norms
from firesched.recipes import rows as row_model

OPS = ["layernorm", "rmsnorm", "softmax", "add_rmsnorm", "causal"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("cols", [65537, 100003, 110001])
def test_a_window_two_blocks_cannot_hold_takes_one_block_alone(op, cols):
    p = norms.recipe_plan(op, 1024, cols, "bf16", "sm_90a")
    lanes = row_model.window_warps(cols, row_model.STAGED_WINDOW_ALONE[op], 1)[0]
    assert (p.aligned, p.row_memory, p.cluster, p.blocks_per_sm, p.lanes) == (True, "SH", 1, 1, lanes), p
    window = row_model.window_passes(cols, p.lanes, 8) * p.lanes * 16
    assert row_model.blocks_that_fit(window, row_model.SHARED_PER_SM) == 1


@pytest.mark.parametrize("op", OPS)
def test_a_window_one_block_cannot_hold_keeps_its_cluster(op):
    p = norms.recipe_plan(op, 1024, 131071, "bf16", "sm_90a")
    assert p.cluster > 1, p


@pytest.mark.parametrize("cols", [45001, 49999, 57001])
def test_causal_windows_go_on_past_41000_columns(cols):
    p = norms.recipe_plan("causal", 1024, cols, "bf16", "sm_90a")
    assert (p.aligned, p.row_memory, p.cluster, p.blocks_per_sm) == (True, "SH", 1, 2), p


def test_the_alone_threads_are_checked():
    with pytest.raises(ValueError, match="staged_window_alone_threads=3"):
        row_model.row_plan(8, 65537, "bf16", stage=True, staged_window=True, staged_window_alone_threads=3)
    # 0: never alone (the cluster of element copies, as before)
    p = row_model.row_plan(8, 65537, "bf16", stage=True, staged_window=True, clusters=True)
    assert p.cluster > 1, p


@pytest.mark.parametrize("op", ["softmax", "layernorm"])
def test_a_window_alone_matches_numpy(op):
    plan = norms.recipe_plan(op, 1024, 65537, "f16", "sm_90a")
    sched = getattr(fs.recipes, op)(2, 65537, dtype="f16", arch="sm_90a", plan=plan)
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
    assert fs.compile(sched, arch="sm_90a").spills == 0
