"""``lower.transforms.early_loads``: loads of a kernel's read-only inputs that would wait behind
its barriers (a row kernel's weight and bias, read after the row's statistics) are issued at
the kernel's start into registers of their own; loads where that could change what is read, or
that would hold too many registers over the kernel, stay.  The kernels it rewrites are checked by
the interpreter."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import firesched as fs
from firesched import ir
from firesched.dtypes import dtype
from firesched.hardware.atoms import catalog
from firesched.hardware.target import target
from firesched.ir.expr import Var
from firesched.lower.program import KernelBuilder
from firesched.lower.transforms.early_loads import early_loads
from firesched.testing.planting import map_leaves

BF16 = dtype("bf16")


def _kb():
    kb = KernelBuilder(SimpleNamespace(target=target("sm_90a")), "k")
    kb.threads, kb.min_blocks_per_sm = 256, 1
    return kb


def _loop(n=2, width=16, role="in", unroll=True, src="W"):
    """for c in 0..n (unrolled): r = W[c * 256 + tid]; Y[c * 256 + tid] = r"""
    c, tid = Var("c", n), ir.tid(256)
    size = width // 2
    r = ir.RegBuffer("r", BF16, size)
    w = ir.GlobalBuffer(src, BF16, (n * 256 * size,), (1,), role=role)
    y = ir.GlobalBuffer("Y", BF16, (n * 256 * size,), (1,), role="out")
    load = ir.AtomCall(catalog.copy_atom("GL", "RF", width), (("dst", ir.RegRef(r, 0)),
                                                              ("src", ir.MemRef(w, (c * 256 + tid) * size))))
    store = ir.AtomCall(catalog.copy_atom("RF", "GL", width), (("dst", ir.MemRef(y, (c * 256 + tid) * size)),
                                                               ("src", ir.RegRef(r, 0))))
    return ir.For(c, n, ir.Seq((load, store)), unroll=unroll), r, w


def _leaves(st):
    seen = []
    map_leaves(st, lambda s: seen.append(s))
    return seen


def _loads(st):
    return [s for s in _leaves(st) if isinstance(s, ir.AtomCall) and isinstance(dict(s.args).get("src"), ir.MemRef)]


def test_a_weight_read_after_a_barrier_is_loaded_first():
    loop, _, w = _loop(2)
    out = early_loads([ir.Barrier("the row's statistics"), loop], _kb())
    assert isinstance(out[0], ir.Comment) and isinstance(out[1], ir.For) and isinstance(out[2], ir.Barrier)
    pre, after = out[1], out[3]
    assert pre.unroll and pre.extent == 2 and pre.var != loop.var
    (load,) = _loads(pre)
    assert dict(load.args)["src"].buffer == w and dict(load.args)["dst"].buffer.name == "r_early"
    assert dict(load.args)["dst"].buffer.size == 16                       # each iteration's own registers
    assert not _loads(after)                                              # the loop keeps its store
    (store,) = [s for s in _leaves(after) if isinstance(s, ir.AtomCall)]
    assert dict(store.args)["src"].buffer.name == "r_early"


@pytest.mark.parametrize("why", ["no barrier", "written", "inout", "rolled", "read after", "registers", "nested"])
def test_loads_it_would_change_stay(why):
    loop, r, w = _loop(2)
    bar = ir.Barrier("between")
    if why == "no barrier":        # nothing to wait behind: the loop is already where it runs first
        body = [loop, bar]
    elif why == "written":         # the kernel writes the buffer: a later load must see the store
        y = ir.AtomCall(catalog.copy_atom("RF", "GL", 16), (("dst", ir.MemRef(w, 0)), ("src", ir.RegRef(r, 0))))
        body = [y, bar, loop]
    elif why == "inout":
        body = [bar, _loop(2, role="inout")[0]]
    elif why == "rolled":          # a rolled loop's iterations share their registers
        body = [bar, _loop(2, unroll=False)[0]]
    elif why == "read after":      # a statement after the loop reads the last iteration's load
        body = [bar, loop, ir.Pointwise("add", ir.RegRef(r, 0), (ir.RegRef(r, 0), 1.0))]
    elif why == "registers":       # four 16-byte vectors a thread: 16 registers over the kernel
        body = [bar, _loop(4)[0]]
    else:                          # inside a rolled loop: its address moves with that loop
        k = Var("k", 3)
        body = [bar, ir.For(k, 3, ir.Seq((loop,)))]
    assert early_loads(body, _kb()) == body


def test_row_kernels_take_their_weights_early_and_match_numpy():
    # RMSNorm over 4096 columns on one block of 256 threads: the weight's two 16-byte vectors a
    # thread are loaded before the statistics' barrier
    sched = fs.recipes.rmsnorm(3, 4096, dtype="bf16", arch="sm_90a")
    src = fs.compile(sched, arch="sm_90a").source
    assert "issued before the barriers" in src and "x_W_early" in src
    fs.testing.assert_schedule_correct(sched, examples=2, arch="sm_90a")


def test_only_what_fits_the_budget_moves():
    # LayerNorm over 8192 columns: weight and bias of 32 values a thread (16 registers each);
    # over 4096 the weight (8 registers) moves and the bias stays behind the barriers
    assert "_early" not in fs.compile(fs.recipes.layernorm(3, 8192, dtype="bf16", arch="sm_90a"), arch="sm_90a").source
    src = fs.compile(fs.recipes.layernorm(3, 4096, dtype="bf16", arch="sm_90a"), arch="sm_90a").source
    assert "x_W_early" in src and "x_B_early" not in src
