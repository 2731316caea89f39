"""``lower.transforms.split_guards``: a loop whose guards are provably settled (true or false for
every thread) on some iterations runs those without the tests — a rolled loop split into a guarded
head, an unguarded middle and a guarded tail, an unrolled loop with an edge path written out
iteration by iteration — and loops where that is not safe or not worth it stay as they are.  The
row kernels it rewrites are checked by the interpreter against numpy."""

from __future__ import annotations

import pytest

import firesched as fs
from firesched import ir
from firesched.dtypes import dtype
from firesched.hardware.atoms import catalog
from firesched.ir.expr import Var, ge, land, lt
from firesched.lower.transforms.split_guards import (
    WRITTEN_OUT_THREADS,
    provably_false,
    provably_true,
    split_guards,
)
from firesched.recipes.rows import RowPlan
from firesched.testing.planting import map_leaves

BF16 = dtype("bf16")
N = 1000 + 5                  # a row of 1,005 elements in chunks of 8 (126 chunks, the last partial)


def _leaves(st):
    seen = []
    map_leaves(st, lambda s: seen.append(s))
    return seen


def _row_loop(extent=5, unroll=False, edge=True, extra=()):
    """for c in 0..extent: a 16-byte chunk of the row at c*256 + tid*8 (32 threads), loaded whole
    where it lies in the row, else (``edge``) element by element::

        if (p + 7 < N)  r = X[p .. p+7]                 (whole)
        if (!(p + 7 < N))  if (p < N) r[0] = X[p] ...   (the edge)
    """
    c, tid = Var("c", extent), ir.tid(32)
    p = c * 256 + tid * 8
    r = ir.RegBuffer("r", BF16, 8)
    x = ir.GlobalBuffer("X", BF16, (N,), (1,))
    s = ir.SharedBuffer("S", BF16, extent * 256)
    whole = ir.If(lt(p + 7, N), ir.AtomCall(catalog.copy_atom("GL", "RF", 16),
                                              (("dst", ir.RegRef(r, 0)), ("src", ir.MemRef(x, p)))))
    body = [whole]
    if edge:
        one = ir.AtomCall(catalog.copy_atom("GL", "RF", 2), (("dst", ir.RegRef(r, 0)), ("src", ir.MemRef(x, p))),
                          pred=lt(p, N))
        body.append(ir.If(ge(p + 7, N), one))
    store = ir.AtomCall(catalog.copy_atom("RF", "SH", 16), (("dst", ir.MemRef(s, p)), ("src", ir.RegRef(r, 0))))
    return ir.For(c, extent, ir.Seq((*body, store, *extra)), unroll=unroll)


def _loops(st):
    return [s for s in ir.rewrite.walk([st]) if isinstance(s, ir.For)]


def test_settled_conditions_by_bounds():
    tid = ir.tid(32)
    assert provably_true(lt(tid * 8 + 7, 256)) and provably_false(lt(tid * 8 + 300, 256))
    assert not provably_true(lt(tid * 8, 100)) and not provably_false(lt(tid * 8, 100))
    assert provably_true(land(ge(tid, 0), lt(tid, 32))) and provably_false(land(lt(tid, 40), ge(tid, 40)))


def test_a_rolled_row_loop_splits_around_its_settled_passes():
    # 5 passes of 256 elements over a row of 1,005: passes 0-2 lie in the row for every thread
    # (p + 7 <= 767), pass 3 (768 .. 1023) straddles its end, pass 4 (from 1,024) lies past it --
    # the middle loop takes the longest settled run, 0-2, with no test; the tail 3-4 keeps them
    (out,) = split_guards([_row_loop()], threads=32)
    assert isinstance(out, ir.Seq)
    loops = [s for s in out.body if isinstance(s, ir.Seq)]
    mid, tail = (next(x for x in part.body if isinstance(x, ir.For)) for part in loops)
    assert mid.extent == 3 and tail.extent == 2 and not mid.unroll
    assert not any(isinstance(s, ir.If) for s in ir.rewrite.walk([mid.body]))
    assert all(isinstance(s, ir.AtomCall) and s.pred == 1 for s in _leaves(mid.body))
    assert sum(isinstance(s, ir.If) for s in ir.rewrite.walk([tail.body])) == 2
    assert "every guard settled, none tested" in str(out.body[0])


def test_loops_that_stay_as_they_are():
    # a barrier in the body, an asynchronous copy, narrow accesses only, too few iterations
    loop = _row_loop(extra=(ir.Barrier(),))
    assert split_guards([loop], threads=32) == [loop]
    cp = ir.AtomCall(catalog.copy_atom("GL", "SH", 16), (("dst", ir.MemRef(ir.SharedBuffer("T", BF16, 8), 0)),
                                                         ("src", ir.MemRef(ir.GlobalBuffer("Y", BF16, (8,), (1,)), 0))))
    loop = _row_loop(extra=(cp,))
    assert split_guards([loop], threads=32) == [loop]
    c, tid = Var("c", 5), ir.tid(32)
    r = ir.RegBuffer("r", BF16, 1)
    narrow = ir.For(c, 5, ir.If(lt(c * 32 + tid, 150), ir.AtomCall(
        catalog.copy_atom("GL", "RF", 2), (("dst", ir.RegRef(r, 0)),
                                           ("src", ir.MemRef(ir.GlobalBuffer("X", BF16, (150,), (1,)), c * 32 + tid))))))
    assert split_guards([narrow], threads=32) == [narrow]
    short = _row_loop(extent=2)
    assert split_guards([short], threads=32) == [short]


def test_an_unrolled_loop_with_an_edge_path_is_written_out_on_small_blocks():
    loop = _row_loop(unroll=True)
    (out,) = split_guards([loop], threads=WRITTEN_OUT_THREADS)
    assert isinstance(out, ir.Seq) and not _loops(out)
    passes = [s for s in out.body]
    assert len(passes) == 5
    # passes 0-2 test nothing; 3 keeps its guards; 4, past the row for every thread, only its
    # edge path, whose element loads stay predicated off (they zero their registers)
    assert [sum(isinstance(s, ir.If) for s in ir.rewrite.walk([p])) for p in passes] == [0, 0, 0, 2, 0]
    assert [s.atom.width for s in _leaves(passes[4]) if isinstance(s, ir.AtomCall)] == [2, 16]
    # larger blocks keep the loop (measured slower written out), and so does a loop of whole
    # vectors with no edge path (its one test a pass is cheap)
    assert split_guards([loop], threads=2 * WRITTEN_OUT_THREADS) == [loop]
    plain = _row_loop(unroll=True, edge=False)
    assert split_guards([plain], threads=32) == [plain]


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "add_rmsnorm", "softmax"])
@pytest.mark.parametrize("cols", [4001, 5003])
def test_split_row_kernels_match_numpy(kind, cols):
    # odd rows in their staged window on 128 threads (5 passes: the middle ones unguarded), the
    # passes of register parts written out; rows of a large mean and every phase of the window
    plan = RowPlan(128, 8, -(-(cols + 7) // 1024), 1, blocks_per_sm=2, row_memory="SH", aligned=True)
    sched = getattr(fs.recipes, kind)(9, cols, dtype="bf16", arch="sm_90a", plan=plan)
    src = fs.compile(sched, arch="sm_90a").source
    assert "every guard settled, none tested" in src
    fs.testing.assert_schedule_correct(sched, examples=1, arch="sm_90a")
