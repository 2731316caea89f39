"""``lower.transforms.barriers``: a block-wide barrier goes where the stretches before and after it
(up to the neighbouring barriers, along every path) touch no buffer that one of them writes; the
barriers that order something stay, and the interpreter finds no race in the kernels that lost
the others — while it does find one where a kept barrier is taken out."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs

import firesched as fs
from firesched import ir
from firesched.errors import HazardError
from firesched.hardware.atoms import sm70, sm80, sm90a
from firesched.ir.expr import Var
from firesched.lower.transforms.barriers import without_redundant_barriers
from firesched.simulate.kernel import run_program
from firesched.testing.planting import map_leaves, planted

F32 = fs.dtypes.f32
X = ir.SharedBuffer("X", F32, 128)
Y = ir.SharedBuffer("Y", F32, 128)
G = ir.GlobalBuffer("G", fs.dtypes.f16, (1024,), (1,))
R = ir.RegBuffer("r", F32, 4)
H = ir.RegBuffer("h", fs.dtypes.f16, 8)


def st(buf):
    return ir.AtomCall(sm70.st_shared_4, (("dst", ir.MemRef(buf, 0)), ("src", ir.RegRef(R, 0))))


def ld(buf):
    return ir.AtomCall(sm70.ld_shared_4, (("dst", ir.RegRef(R, 0)), ("src", ir.MemRef(buf, 0))))


def cp(buf):
    return ir.AtomCall(sm80.cp_async_16, (("dst", ir.MemRef(buf, 0)), ("src", ir.MemRef(G, 0))))


def bar(name):
    return ir.Barrier(name)


def kept(body) -> list[str]:
    """The comments of the block-wide barriers left in ``body``."""
    seen = []
    map_leaves(ir.Seq(tuple(body)), lambda s: seen.append(s.comment) if isinstance(s, ir.Barrier) else None)
    return seen


def test_the_first_barrier_and_one_right_after_another_go():
    body = [bar("first"), ir.Comment("c"), st(X), bar("filled"), ir.Comment("between"),
            ir.Seq((bar("again"), ld(X)))]
    out = without_redundant_barriers(body)
    # "filled" goes first (nothing after it before "again"), then "again" orders the write and read
    assert kept(out) == ["again"]
    assert sum(isinstance(s, ir.Comment) and "no barrier needed" in s.text for s in out) == 2


def test_a_barrier_between_a_write_and_a_read_of_one_buffer_stays():
    assert kept(without_redundant_barriers([st(X), bar("raw"), ld(X)])) == ["raw"]
    assert kept(without_redundant_barriers([ld(X), bar("war"), st(X)])) == ["war"]
    assert kept(without_redundant_barriers([st(X), bar("waw"), st(X)])) == ["waw"]
    # reads on both sides, or other buffers: nothing to order
    assert kept(without_redundant_barriers([ld(X), bar("rr"), ld(X), st(Y)])) == []


def test_a_reduction_that_reads_its_partials_needs_no_barrier_before_the_next_one_writes_others():
    # a block reduction's partial results, read back; the next reduction's barrier comes before
    # anything writes them again
    body = [st(X), bar("X in smem"), ld(X), bar("X was read"), st(Y), bar("Y in smem"), ld(Y), bar("Y was read")]
    assert kept(without_redundant_barriers(body)) == ["X in smem", "Y in smem"]


def test_loops_bring_the_next_iteration_round():
    i = Var("i", 4)
    # the next iteration writes X again before its first barrier: "X was read" stays
    loop = ir.For(i, 4, ir.Seq((st(X), bar("X in smem"), ld(X), bar("X was read"))))
    assert kept(without_redundant_barriers([loop])) == ["X in smem", "X was read"]
    # with a second reduction after it, each one's barrier orders the other's partials: the next
    # iteration writes X (not Y) before "X in smem"
    loop = ir.For(i, 4, ir.Seq((st(X), bar("X in smem"), ld(X), bar("X was read"), st(Y), bar("Y in smem"), ld(Y),
                                bar("Y was read"))))
    assert kept(without_redundant_barriers([loop])) == ["X in smem", "Y in smem"]


def test_a_skipped_branch_or_an_empty_loop_does_not_order_anything():
    i = Var("i", 4)
    c = Var("tid", 128)
    body = [ld(X), bar("war"), ir.If(ir.expr.lt(c, 1), ir.Seq((bar("maybe"),))), st(X)]
    assert kept(without_redundant_barriers(body)) == ["war"]
    body = [ld(X), bar("war"), ir.For(i, 4, bar("maybe"), stop=Var("n", 4)), st(X)]
    assert kept(without_redundant_barriers(body)) == ["war"]
    # a loop that runs at least once does
    body = [ld(X), bar("war"), ir.For(i, 4, bar("loop")), st(X)]
    assert kept(without_redundant_barriers(body)) == ["loop"]


def test_async_copies_count_where_a_barrier_orders_them():
    # readers of a stage must be done before a copy into it is issued
    assert kept(without_redundant_barriers([ld(X), bar("free"), cp(X)])) == ["free"]
    # a barrier right after the issue orders nothing of the copy: the wait and the one after do
    body = [ir.AsyncWait(0), bar("landed"), cp(Y), ir.AsyncCommit(), bar("earlier parts done"), ld(X)]
    assert kept(without_redundant_barriers(body)) == ["landed"]


def test_what_the_analysis_cannot_see_through_keeps_its_barriers():
    mb = ir.MBarrier("mb")
    init = ir.AtomCall(sm90a.mbarrier_init, (("bar", ir.MemRef(mb, 0)), ("count", ir.RegRef(R, 0))))
    named = ir.Barrier("warpgroup", bar_id=1, threads=128)
    assert kept(without_redundant_barriers([named, bar("after a named barrier"), ld(X)])) == \
        ["warpgroup", "after a named barrier"]
    assert kept(without_redundant_barriers([init, bar("initialised"), ld(X)])) == ["initialised"]
    roles = ir.Roles((ir.Role("producer", 0, 128, ld(X)),))
    assert kept(without_redundant_barriers([roles, bar("around roles"), st(X)])) == ["around roles"]


def test_a_row_kernel_on_prefetching_windows_keeps_one_barrier_a_reduction():
    sched = fs.recipes.layernorm(4096, 4095, dtype="bf16", arch="sm_90a")
    src = fs.compile(sched, arch="sm_90a").source
    # per row: the tile landed, and each reduction's partial results in shared memory; plus the
    # weights' windows once a block: their raw copies landed, and each window's shift between its
    # reads and its writes (the windows filled: the tile loop's first barrier orders that)
    assert src.count("__syncthreads();") == 6
    assert "(the windows are filled: no barrier needed here)" in src
    assert "(Mean's partial results were read: no barrier needed here)" in src
    assert "(the earlier parts are done with Xr: no barrier needed here)" in src


@pytest.mark.parametrize("words", ["Mean's partial results are in shared memory",
                                   "Rstd's partial results are in shared memory"])
def test_taking_out_a_kept_barrier_is_a_race(words):
    sched = fs.recipes.layernorm(24, 4095, dtype="bf16", arch="sm_90a",
                                 plan=fs.recipes.rows.RowPlan(128, 8, 5, 1, blocks_per_sm=4, row_memory="SH",
                                                              aligned=True, persistent=True, tile_stages=2))
    prog = sched.lower("sm_90a")
    arrays = dict(zip([b.name for b in prog.inputs], fs.testing.random_arrays(sched, seed=1)))
    run_program(prog, arrays)     # as lowered: no race
    hits = []

    def drop(s):
        if isinstance(s, ir.Barrier) and words in s.comment:
            hits.append(s)
            return None
        return s

    bad = planted(prog, drop)
    assert hits
    with pytest.raises(HazardError):
        run_program(bad, arrays)


def test_kernels_that_lost_barriers_interpret_without_races():
    for sched, arch in ((fs.recipes.layernorm(19, 4095, dtype="bf16", arch="sm_90a",
                                              plan=fs.recipes.rows.RowPlan(128, 8, 5, 1, blocks_per_sm=4,
                                                                           row_memory="SH", aligned=True,
                                                                           persistent=True, tile_stages=2)), "sm_90a"),
                        (fs.recipes.rmsnorm(7, 3001, dtype="f16", arch="sm_90a"), "sm_90a"),
                        (fs.recipes.softmax(5, 777, dtype="bf16", arch="sm_80"), "sm_80")):
        fs.testing.assert_schedule_correct(sched, examples=2, arch=arch)


def test_a_staged_row_kernel_keeps_the_barriers_it_needs():
    sched = fs.recipes.layernorm(3, 4096, dtype="f32", arch="sm_90a",
                                 plan=fs.recipes.rows.RowPlan(64, 4, 4, 1, cluster=4, part=1024,
                                                              exchange="barrier", row_memory="SH"))
    src = fs.compile(sched, arch="sm_90a").source
    assert "no barrier needed here" in src
    fs.testing.assert_schedule_correct(sched, examples=2, arch="sm_90a")


def test_the_pass_leaves_statements_other_than_barriers_alone():
    i = Var("i", 4)
    body = [st(X), bar("a"), ir.For(i, 4, ir.Seq((ld(X), bar("b"), st(Y)))), ir.If(1, ld(Y))]
    out = without_redundant_barriers(body)

    def strip(s):
        return None if isinstance(s, (ir.Barrier, ir.Comment)) else s

    assert map_leaves(ir.Seq(tuple(out)), strip) == map_leaves(ir.Seq(tuple(body)), strip)
    assert kept(out) == ["a", "b"]          # (b: the stores of Y on both sides of it, the branch loads Y)


# --------------------------------------------------------------------------- hand-written kernels

T = 64                                   # two warps: shifts of 32 cross them
TID = ir.tid(T)
SX, SY = ir.SharedBuffer("SX", F32, T), ir.SharedBuffer("SY", F32, T)
GIN = ir.GlobalBuffer("GIN", F32, (T,), (1,))
GOUT = ir.GlobalBuffer("GOUT", F32, (T,), (1,), "out")
ACC, TMP = ir.RegBuffer("acc", F32, 1), ir.RegBuffer("tmp", F32, 1)


def _stmt(kind: str, buf: str, shift: int):
    sb = SX if buf == "X" else SY
    at = ir.MemRef(sb, (TID + shift) % T)
    if kind == "st":
        return ir.AtomCall(sm70.st_shared_4, (("dst", at), ("src", ir.RegRef(ACC, 0))))
    return ir.Seq((ir.AtomCall(sm70.ld_shared_4, (("dst", ir.RegRef(TMP, 0)), ("src", at))),
                   ir.Pointwise("add", ir.RegRef(ACC, 0), (ir.RegRef(ACC, 0), ir.RegRef(TMP, 0)))))


_access = hs.builds(_stmt, hs.sampled_from(["st", "ld"]), hs.sampled_from(["X", "Y"]),
                    hs.sampled_from([0, 1, 31, 32, 33]))
_barrier = hs.builds(lambda n: bar(f"b{n}"), hs.integers(0, 99))


def _block(draw, depth: int) -> list:
    out = []
    for _ in range(draw(hs.integers(1, 6))):
        what = draw(hs.sampled_from(["access", "access", "barrier", "loop", "branch"] if depth < 2
                                    else ["access", "barrier"]))
        if what == "access":
            out.append(draw(_access))
        elif what == "barrier":
            out.append(draw(_barrier))
        elif what == "loop":
            out.append(ir.For(Var(f"i{depth}_{len(out)}", 3), 3, ir.Seq(tuple(_block(draw, depth + 1)))))
        else:
            # a branch some threads skip holds no barrier (a block-wide barrier there deadlocks)
            inner = [s for s in _block(draw, depth + 1) if not isinstance(s, (ir.Barrier, ir.For))]
            if inner:
                out.append(ir.If(ir.expr.lt(TID, draw(hs.sampled_from([1, 32, 40]))), ir.Seq(tuple(inner))))
    return out


@hs.composite
def _kernels(draw):
    load = ir.AtomCall(sm70.ld_global_4, (("dst", ir.RegRef(ACC, 0)), ("src", ir.MemRef(GIN, TID))))
    store = ir.AtomCall(sm70.st_global_4, (("dst", ir.MemRef(GOUT, TID)), ("src", ir.RegRef(ACC, 0))))
    return [load, *_block(draw, 0), store]


def _run(body):
    k = ir.Kernel("k", (GIN, GOUT), (1, 1, 1), T, (SX, SY), (ACC, TMP), ir.Seq(tuple(body)))
    prog = ir.Program((k,), (GIN,), GOUT)
    return run_program(prog, {"GIN": np.arange(T, dtype=np.float32) + 1})["GOUT"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(_kernels())
def test_a_hand_written_kernel_without_races_keeps_none_and_its_result(body):
    # kernels of stores and loads of two shared buffers at shifts that cross lanes and warps,
    # barriers anywhere but in branches, loops of three iterations: where the interpreter finds no
    # race in the kernel as written, it finds none without the barriers the pass drops, and the
    # result is the same
    try:
        want = _run(body)
    except HazardError:
        assume(False)
    out = without_redundant_barriers(body)
    np.testing.assert_array_equal(_run(out), want)
