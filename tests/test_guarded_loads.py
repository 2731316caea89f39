"""How a thread's guarded loads are written: ``done(guard=...)``.

``guard="predicate"`` writes a load that the row's end (or a mask) guards as one asm statement —
the zeros and ``@p ld.global`` under a PTX predicate — instead of ``if (in) load; else zeros``.
The semantics are the same (the interpreter runs both alike); these tests check the refusals, the
CUDA source for every load width (through NVRTC and ptxas, so the PTX must be well formed), that
stores and unguarded loads keep their form, and which recipes' plans take it
(``rows.load_guard``)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import firesched as fs
from firesched import ir
from firesched.errors import ScheduleError
from firesched.hardware.atoms import catalog, sm70, sm80
from firesched.ir.rewrite import guard_loads
from firesched.recipes import norms, rows
from firesched.strategies import done, tile, to_blocks, to_threads


def test_guard_refusals():
    spec = fs.Move.kernel({"r": 5, "c": 37}, src="f16", dst="f16")
    with pytest.raises(ScheduleError, match="guard") as e:
        spec.schedule(tile(r=1, c=8) >> to_blocks(), tile(r=1, c=1) >> to_threads(), done(guard="maybe"))
    assert "'branch', 'predicate'" in str(e.value)
    mm = fs.MatMul.kernel(16, 8, 16)
    with pytest.raises(ScheduleError, match="an atom's operands"):
        mm.schedule(tile(m=16, n=8) >> to_blocks(), done(sm80.mma_m16n8k16_f16_f32, guard="predicate"))
    with pytest.raises(ValueError, match="only a COPY load"):
        catalog.predicated(sm70.st_global_16)
    with pytest.raises(ValueError, match="already predicated"):
        catalog.predicated(catalog.predicated(sm70.ld_global_16))
    with pytest.raises(ValueError, match="allowed"):
        guard_loads([], "sometimes")
    with pytest.raises(ValueError):
        ir.AtomCall(sm70.ld_global_4, (), 1, guard="sometimes")


# (source dtype, columns, elements a thread): loads of 1, 2, 4, 8 and 16 bytes, each guarded
@pytest.mark.parametrize("src, cols, tc", [("i8", 37, 1), ("f16", 37, 1), ("f32", 37, 1), ("f16", 36, 4),
                                           ("f16", 40, 8), ("u8", 48, 16)])
def test_every_load_width_under_a_predicate(src, cols, tc):
    spec = fs.Move.kernel({"r": 5, "c": cols}, src=src, dst="f32")
    chain = (tile(r=2, c=max(16, tc * 2)) >> to_blocks(), tile(r=1, c=tc) >> to_threads())
    pred = spec.schedule(*chain, done(guard="predicate"))
    branch = spec.schedule(*chain, done())
    k, kb = fs.compile(pred, arch="sm_90a"), fs.compile(branch, arch="sm_90a")
    width = {"i8": 1, "u8": 1, "f16": 2, "f32": 4}[src] * tc
    assert k.spills == 0
    # the load under the predicate, no branch around it; the store still tested by an if
    assert k.source.count("@fs_g ld.global") == 1 and f"ld_global_{width}" in k.source
    assert "@fs_g" not in kb.source
    assert k.source.count("if (") == kb.source.count("if (") - 1
    rng = np.random.default_rng(0)
    X = rng.integers(0, 100, (5, cols)) if src in ("i8", "u8") else rng.standard_normal((5, cols))
    want = np.asarray(fs.interpret(branch, X), np.float64)
    assert np.array_equal(np.asarray(fs.interpret(pred, X), np.float64), want)
    assert np.allclose(want, X, atol=1e-2)


def test_unguarded_loads_and_stores_keep_their_form():
    # whole vectors inside the row: no guard, nothing to predicate; stores are never rewritten
    spec = fs.Move.kernel({"r": 4, "c": 64}, src="f16", dst="f16")
    k = fs.compile(spec.schedule(tile(r=1, c=64) >> to_blocks(), tile(c=8) >> to_threads(), done(guard="predicate")),
                   arch="sm_90a")
    assert "@fs_g" not in k.source
    load = ir.AtomCall(sm70.ld_global_16, (), ir.expr.Var("p"))
    store = ir.AtomCall(sm70.st_global_16, (), ir.expr.Var("p"))
    shared = ir.AtomCall(sm70.ld_shared_16, (), ir.expr.Var("p"))
    out = guard_loads([ir.Seq((load, store, shared)), ir.AtomCall(sm70.ld_global_16, (), 1)], "predicate")
    assert [s.guard for s in out[0].body] == ["predicate", "branch", "branch"] and out[1].guard == "branch"


@pytest.mark.parametrize("op, cols, dtype, want", [
    ("rmsnorm", 10752, "bf16", "predicate"),     # 512 threads x 3 passes, the last partial
    ("rmsnorm", 20000, "f16", "predicate"),
    ("rmsnorm", 30720, "bf16", "predicate"),     # 1,024 threads, partial last pass
    ("rmsnorm", 16384, "bf16", "branch"),        # whole passes: nothing guarded
    ("rmsnorm", 4095, "bf16", "branch"),         # an odd row (a window)
    ("layernorm", 10752, "bf16", "branch"),      # measured slower under the predicate
    ("add_rmsnorm", 4095, "f16", "branch"),
    ("softmax", 2047, "bf16", "branch"),
    ("causal", 2047, "bf16", "predicate"),       # odd rows, a row a block
    ("causal", 4095, "f16", "predicate"),
    ("causal", 1023, "bf16", "branch"),          # two rows a block: slower under the predicate
    ("causal", 10752, "bf16", "branch"),         # whole vectors
])
def test_recipes_take_the_measured_guards(op, cols, dtype, want):
    plan = norms.recipe_plan(op, 4096, cols, dtype, "sm_90a")
    assert plan.guard == want == rows.load_guard(op, plan, cols, dtype), plan
    sched = (fs.recipes.softmax(8, cols, dtype=dtype, causal=True) if op == "causal" else
             getattr(fs.recipes, op)(8, cols, dtype=dtype))
    assert (f"guard={want!r}" in str(sched)) == (want == "predicate")


def test_a_row_plans_guard_is_checked():
    plan = attrs.evolve(norms.recipe_plan("rmsnorm", 8, 10752, "bf16", "sm_90a"), guard="maybe")
    with pytest.raises(ValueError, match="plan.guard='maybe'; allowed: 'branch', 'predicate'"):
        fs.recipes.rmsnorm(8, 10752, dtype="bf16", arch="sm_90a", plan=plan)
