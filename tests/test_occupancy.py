"""``to_blocks(occupancy=N)``: N blocks resident per SM, as launch bounds the compiler honours."""

from __future__ import annotations

import pytest

import firesched as fs
from firesched import recipes
from firesched.recipes import rows as row_model
from firesched.strategies import done, tile, to_blocks, to_threads


def _copy(occupancy: int, threads: int = 256, rows: int = 64, cols: int = 2048):
    spec = fs.Move.kernel({"r": rows, "c": cols}, src="f16", dst="f16")
    return spec.schedule(tile(r=1) >> to_blocks(occupancy=occupancy), tile(c=threads * 8),
                         tile(c=8) >> to_threads(), done())


def test_occupancy_is_printed_and_round_trips():
    st = to_blocks(group=1, occupancy=2)
    assert repr(st) == "to_blocks(occupancy=2)"
    assert eval(repr(st), {"to_blocks": to_blocks}) == st
    sched = _copy(2)
    assert "occupancy=2" in repr(sched.root.loops[0])


def test_occupancy_becomes_launch_bounds():
    src = fs.compile(_copy(2), arch="sm_90a").source
    assert "__launch_bounds__(256, 2)" in src
    assert "__launch_bounds__(256, 1)" in fs.compile(_copy(1), arch="sm_90a").source


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_occupancy_must_be_a_positive_int(bad):
    with pytest.raises(fs.ScheduleError, match="occupancy"):
        _copy(bad)


def test_occupancy_that_does_not_fit_the_sm_is_refused():
    # 1024 threads twice: 2048 threads fit an SM; three times do not
    _copy(2, threads=1024, cols=8192).check("sm_90a")
    with pytest.raises(fs.ScheduleError, match=r"occupancy=3\) needs 3072 threads per SM") as e:
        _copy(3, threads=1024, cols=8192).check("sm_90a")
    assert "allowed: <= 2" in str(e.value)


def test_only_blocks_have_an_occupancy():
    spec = fs.Move.kernel({"r": 64, "c": 2048}, src="f16", dst="f16")
    from firesched.strategies.mapping import to
    from firesched.tensor import THREAD
    with pytest.raises(fs.ScheduleError, match="occupancy"):
        spec.schedule(tile(r=1) >> to_blocks(), tile(c=256), tile(c=8) >> to(THREAD, (), 1, False, 1, 2), done())


def test_row_plans_ask_for_two_blocks_where_registers_allow():
    assert row_model.row_plan(4096, 16384, "bf16").occupancy == 2      # 512 threads: 64 registers each
    assert row_model.row_plan(4096, 32768, "bf16").occupancy == 1      # 1024 threads keep the SM
    # softmax over 16,384 columns held 79 registers at one block per SM; two blocks cap it at 64
    k = fs.compile(recipes.softmax(4096, 16384, dtype="bf16"), arch="sm_90a")
    assert "__launch_bounds__(512, 2)" in k.source
    assert k.spills == 0 and max(r.registers for r in k.resources.values()) <= 64
