"""The public property-testing API (``firesched.testing``), used the way a kernel author would.

Two of the project's own random-chain laws (``test_random_chains.py``: Pointwise and Move) are
ported to it; the reference evaluator is checked against formulas written here and in
``oracles.py``; ``assert_schedule_correct`` is shown to fail on a wrong reference (naming the seed
and the inputs) and on a planted hazard; and the layering promise holds: ``import firesched``
does not import Hypothesis, and without Hypothesis the strategies say how to install it.
"""

from __future__ import annotations

import subprocess
import sys

import attrs
import numpy as np
import oracles
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ir, ops
from firesched import testing as ft
from firesched.errors import ScheduleError
from firesched.hardware import sm80
from firesched.strategies import (
    done,
    epilogue,
    move_to_regs,
    move_to_smem,
    part,
    pipeline,
    place,
    tile,
    to_blocks,
    to_threads,
    to_warps,
)

FEW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.filter_too_much])


# --------------------------------------------------------------------------- ported laws

@FEW
@given(data=st.data(), R=st.integers(1, 24), C=st.integers(1, 48), op=st.sampled_from(["add", "sub", "mul", "max"]),
       bcast=st.sampled_from(["none", "row", "col"]))
def test_pointwise_schedules_equal_their_spec(data, R, C, op, bcast):
    second = {"none": ("r", "c"), "row": ("c",), "col": ("r",)}[bcast]
    spec = fs.Pointwise.kernel(op, {"r": R, "c": C}, inputs=[("r", "c"), second])
    sched = data.draw(ft.schedules(spec))
    arrays = data.draw(ft.arrays_for(sched))
    ft.assert_schedule_correct(sched, arrays=arrays)


@FEW
@given(data=st.data(), R=st.integers(1, 30), C=st.integers(1, 40), src=st.sampled_from(["f16", "bf16", "f32"]),
       dst=st.sampled_from(["f16", "bf16", "f32"]), transpose=st.booleans())
def test_move_schedules_equal_their_spec(data, R, C, src, dst, transpose):
    spec = fs.Move.kernel({"r": R, "c": C}, src=src, dst=dst, dst_major="r" if transpose else "c")
    sched = data.draw(ft.schedules(spec, fitting=data.draw(st.booleans())))
    ft.assert_schedule_correct(sched, examples=1, seed=data.draw(st.integers(0, 99)))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_drawn_gemm_schedules_equal_their_spec(data):
    spec = fs.MatMul.kernel(32, 16, 32)
    sched = data.draw(ft.schedules(spec))
    ft.assert_schedule_correct(sched, examples=1)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(chain=ft.refused_chains(fs.MatMul.kernel(40, 24, 48)))
def test_refused_chains_are_refused_with_schedule_error(chain):
    spec = fs.MatMul.kernel(40, 24, 48)
    with pytest.raises(ScheduleError):
        spec.schedule(*chain).check("sm_80")


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data(), R=st.integers(1, 9), C=st.integers(1, 300), fitting=st.booleans(),
       kind=st.sampled_from(["rmsnorm", "layernorm", "add_rmsnorm", "softmax"]))
def test_drawn_fused_row_schedules_are_refused_or_equal_their_spec(data, R, C, fitting, kind):
    # the fused spec of a stock row recipe, scheduled by drawn chains instead of the recipe's own
    spec = getattr(fs.recipes, kind)(R, C, arch="sm_80").spec
    chain = data.draw(ft.strategy_chains(spec, fitting=fitting))
    sched = ft.try_schedule(spec, chain)
    if sched is not None:
        ft.assert_schedule_correct(sched, examples=1)


def test_threads_must_fill_the_warp_they_are_mapped_in():
    # 4 lanes per row inside a warp: lanes 4..31 would store the row's statistics again (a
    # write-after-write race on a shared local, found by the drawn fused schedules above)
    spec = fs.recipes.rmsnorm(4, 64, arch="sm_80", weight=False).spec
    row = (tile(r=1) >> to_warps(), tile(c=16), tile(r=1, c=4) >> to_threads(), done())
    sched = spec.schedule(tile(r=4) >> to_blocks(), *(place(t.name, fs.SH) for t in spec.locals),
                          *(part(i, *row) for i in range(len(spec.body))))
    with pytest.raises(ScheduleError, match="4 threads are mapped inside one warp, which has 32"):
        sched.check("sm_80")


def test_strategy_chains_name_what_they_cannot_draw():
    spec = fs.MatMul.kernel(32, 32, 32, batch=2)
    with pytest.raises(ValueError, match="batched MatMul.*allowed: kernel-level MatMul"):
        ft.strategy_chains(spec)


# --------------------------------------------------------------------------- the reference

def test_reference_of_a_gemm_with_epilogue_matches_the_oracle():
    spec = fs.MatMul.kernel(48, 40, 64)
    sched = spec.schedule(tile(m=32, n=32) >> to_blocks(), tile(k=32), move_to_smem("A"), move_to_smem("B"),
                          pipeline(2), tile(m=16, n=32) >> to_warps(), tile(k=16), move_to_regs("A"),
                          move_to_regs("B"), tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32),
                          epilogue(ops.bias("bias"), ops.relu()))
    A, B, bias = ft.random_arrays(sched, 3)
    want = oracles.gemm(A, B, ops=(ops.bias("bias"), ops.relu()), extras={"bias": bias})
    oracles.assert_close(ft.schedule_reference(sched, A, B, bias), want, out="f16", what="reference")
    ft.assert_schedule_correct(sched, examples=2)


def test_reference_of_each_kind():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((3, 5))
    r16 = oracles.rounded
    red = fs.Reduce.kernel("max", {"r": 3, "c": 5}, "c")
    np.testing.assert_array_equal(ft.reference(red, X), r16(X, "f16").max(1))
    mv = fs.Move.kernel({"r": 3, "c": 5}, src="f32", dst="bf16")
    np.testing.assert_array_equal(ft.reference(mv, X), r16(X, "bf16"))
    pw = fs.Pointwise.kernel("sub", {"r": 3, "c": 5}, inputs=[("r", "c"), ("r",)])
    y = rng.standard_normal(3)
    np.testing.assert_array_equal(ft.reference(pw, X, y), r16(r16(X, "f16") - r16(y, "f16")[:, None], "f16"))
    fused = fs.Fused.kernel(fs.Pointwise.kernel("add", {"r": 3, "c": 5}, names=("X", "Y", "H")),
                            fs.Reduce.kernel("sum", {"r": 3, "c": 5}, "c", names=("H", "S")))
    got = ft.reference(fused, X, X)
    np.testing.assert_allclose(got, r16(r16(X, "f16") * 2, "f16").sum(1), rtol=1e-6)
    with pytest.raises(ValueError, match=r"X has shape \(5, 3\)"):
        ft.reference(red, X.T)


# --------------------------------------------------------------------------- failures are reported

def _gemm():
    spec = fs.MatMul.kernel(32, 16, 32)
    return spec, spec.schedule(tile(m=32, n=16) >> to_blocks(), tile(k=32), move_to_smem("A"), move_to_smem("B"),
                               pipeline(2), tile(m=16, n=16) >> to_warps(), tile(k=16), move_to_regs("A"),
                               move_to_regs("B"), tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32),
                               epilogue(ops.relu()))


def test_a_wrong_reference_fails_with_the_seed_and_the_inputs():
    spec, sched = _gemm()
    with pytest.raises(AssertionError) as info:
        ft.assert_schedule_correct(sched, examples=2, seed=5, reference=lambda A, B: ft.reference(spec, A, B))
    msg = str(info.value)
    assert "seed 5 (random_arrays(schedule, 5))" in msg and "worst at" in msg and "A (32, 32):" in msg
    assert "relu()" in msg


def test_a_hazard_names_the_inputs_it_ran_on(monkeypatch):
    spec, sched = _gemm()
    real = sched.lower("sm_80")

    def drop_barriers(s):
        if isinstance(s, ir.Seq):
            return ir.Seq(tuple(drop_barriers(c) for c in s.body if not isinstance(c, ir.Barrier)))
        if isinstance(s, ir.For):
            return ir.For(s.var, s.extent, drop_barriers(s.body), s.unroll)
        return s

    bad = attrs.evolve(real, kernels=tuple(attrs.evolve(k, body=drop_barriers(k.body)) for k in real.kernels))
    monkeypatch.setattr(type(sched), "lower", lambda self, target=None: bad)
    with pytest.raises(fs.HazardError) as info:
        ft.assert_schedule_correct(sched, examples=1, seed=7)
    assert "on the inputs of seed 7" in "".join(getattr(info.value, "__notes__", []))
    assert str(info.value).splitlines()[0].startswith("race")


def test_tolerance_of_an_unknown_type_says_what_to_pass():
    with pytest.raises(ValueError, match="pass atol= and rtol="):
        ft.tolerance("i8")


# --------------------------------------------------------------------------- Hypothesis stays a dev dependency

def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_firesched_does_not_import_hypothesis():
    r = _run("import sys, firesched, firesched.testing; print('hypothesis' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_without_hypothesis_the_strategies_say_how_to_install_it():
    r = _run("import sys; sys.modules['hypothesis'] = None\n"
             "import firesched.testing as ft\n"
             "ft.assert_schedule_correct  # works without it\n"
             "ft.schedules")
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "pip install hypothesis" in r.stderr
