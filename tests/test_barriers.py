"""``lower.transforms.barriers``: the block-wide barriers a kernel does not need (the first
statement of the kernel; a second right after a first) are dropped, and the interpreter finds no
race in the kernels that lost them."""

from __future__ import annotations

import firesched as fs
from firesched import ir
from firesched.lower.transforms.barriers import without_redundant_barriers
from firesched.testing.planting import map_leaves


def _barriers(body) -> int:
    seen = []
    map_leaves(ir.Seq(tuple(body)) if isinstance(body, list) else body,
               lambda s: seen.append(s) if isinstance(s, ir.Barrier) else None)
    return len(seen)


def test_leading_and_doubled_barriers_go_named_ones_stay():
    a, b = ir.Barrier("first"), ir.Barrier("second")
    named = ir.Barrier("warpgroup", bar_id=1, threads=128)
    work = ir.RegFill(ir.RegRef(ir.RegBuffer("r", fs.dtypes.f32, 1), 0), 1, 0.0)
    body = [a, ir.Comment("c"), work, b, ir.Comment("between"), ir.Seq((ir.Barrier("nested"), work)), named, named]
    out = without_redundant_barriers(body)
    # the leading barrier and the nested one right after `second` are gone; named ones stay
    assert _barriers(out) == 3
    assert sum(isinstance(s, ir.Comment) and "no barrier needed" in s.text for s in out) == 1


def test_a_staged_row_kernel_keeps_the_barriers_it_needs():
    sched = fs.recipes.layernorm(3, 4096, dtype="f32", arch="sm_90a",
                                 plan=fs.recipes.rows.RowPlan(64, 4, 4, 1, cluster=4, part=1024,
                                                              exchange="barrier", row_memory="SH"))
    src = fs.compile(sched, arch="sm_90a").source
    assert "no barrier needed here" in src and src.count("__syncthreads();") == 2
    fs.testing.assert_schedule_correct(sched, examples=2, arch="sm_90a")
