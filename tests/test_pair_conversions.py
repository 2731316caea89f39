"""``transforms.pair_conversions``: two f32 values rounded into one f16x2 / bf16x2 register.

Which conversions pair (consecutive in a sequence, elements 2k and 2k + 1 of one 16-bit buffer,
from consecutive f32 registers) and which do not; kernels that print the paired instruction and
compute the same bits as without the pass, in the interpreter, for an element-wise output, a
row normalization and a GEMM epilogue; and hand-written element-wise kernels (hypothesis) whose
outputs match numpy with the pass in place."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import dtypes as dt
from firesched import ir
from firesched.cuda import printer as cuda
from firesched.hardware.atoms import convert as cv
from firesched.hardware.target import target as get_target
from firesched.ir.expr import Var, lt
from firesched.ir.rewrite import walk
from firesched.lower import driver
from firesched.lower.transforms.pair_conversions import paired_conversions
from firesched.spec import Pointwise
from firesched.strategies import tile, to_blocks, to_threads

F32 = ir.RegBuffer("w", dt.f32, 4)
Y16 = ir.RegBuffer("y", dt.bf16, 8)
H16 = ir.RegBuffer("h", dt.f16, 8)
SM90A = get_target("sm_90a")


def _cvt(dst, i, src, j):
    return ir.Pointwise("cvt", ir.RegRef(dst, i), (ir.RegRef(src, j),))


def _pairs(stmts) -> list:
    return [s for s in walk(stmts) if isinstance(s, ir.AtomCall) and s.atom in cv.PAIR_ATOMS]


def test_consecutive_conversions_pair():
    out = paired_conversions([_cvt(Y16, 0, F32, 0), ir.Comment("between"), _cvt(Y16, 1, F32, 1),
                              _cvt(H16, 2, F32, 2), _cvt(H16, 3, F32, 3)], SM90A)
    calls = _pairs(out)
    assert [c.atom for c in calls] == [cv.cvt_f32x2_bf16x2, cv.cvt_f32x2_f16x2]
    assert calls[0].arg("d") == ir.RegRef(Y16, 0) and calls[0].arg("src") == ir.RegRef(F32, 0)
    assert calls[1].arg("d") == ir.RegRef(H16, 2) and calls[1].arg("src") == ir.RegRef(F32, 2)
    assert not [s for s in out if isinstance(s, ir.Pointwise)]


@pytest.mark.parametrize("stmts", [
    [_cvt(Y16, 1, F32, 0), _cvt(Y16, 2, F32, 1)],                          # an odd first element
    [_cvt(Y16, 1, F32, 1), _cvt(Y16, 0, F32, 0)],                          # the high half first
    [_cvt(Y16, 0, F32, 0), _cvt(H16, 1, F32, 1)],                          # two buffers
    [_cvt(Y16, 0, F32, 1), _cvt(Y16, 1, F32, 0)],                          # sources swapped
    [_cvt(Y16, 0, F32, 0), _cvt(Y16, 1, ir.RegBuffer("v", dt.f32, 2), 1)],  # two source buffers
    [_cvt(Y16, 0, F32, 0), ir.Pointwise("add", ir.RegRef(F32, 1), (ir.RegRef(F32, 1), 1.0)),
     _cvt(Y16, 1, F32, 1)],                                                # work between them
    [ir.Pointwise("cvt", ir.RegRef(Y16, 0), (1.0,)), _cvt(Y16, 1, F32, 1)],  # a constant
    [_cvt(ir.RegBuffer("z", dt.f32, 2), 0, F32, 0), _cvt(ir.RegBuffer("z", dt.f32, 2), 1, F32, 1)],
])
def test_other_conversions_stay_as_they_are(stmts):
    assert paired_conversions(stmts, SM90A) == stmts


def test_pairs_inside_loops_and_branches():
    body = ir.For(Var("i", 4), 4, ir.Seq((ir.If(lt(ir.tid(32), 3), ir.Seq((_cvt(Y16, 4, F32, 2),
                                                                             _cvt(Y16, 5, F32, 3)))),)))
    (out,) = paired_conversions([body], SM90A)
    assert len(_pairs([out])) == 1


def test_no_pairs_before_sm80():
    stmts = [_cvt(Y16, 0, F32, 0), _cvt(Y16, 1, F32, 1)]
    assert paired_conversions(stmts, get_target("sm_70")) == stmts


def _unpaired(monkeypatch):
    monkeypatch.setattr(driver, "paired_conversions", lambda body, target: list(body))
    # programs lowered without the pass are kept apart from (and dropped with) the patch
    monkeypatch.setattr(driver, "_LOWERED", {})


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a.view(np.uint32)


def _same_bits_either_way(monkeypatch, sched, arrays, target="sm_90a"):
    prog = sched.lower(target)
    assert _pairs([k.body for k in prog.kernels]), "the kernel has no paired conversion"
    assert "x2.f32 " in cuda.emit(prog)
    paired = fs.interpret(sched, *arrays, target=target)
    with monkeypatch.context() as m:
        _unpaired(m)
        assert not _pairs([k.body for k in sched.lower(target).kernels])
        plain = fs.interpret(sched, *arrays, target=target)
    for a, b in zip(paired if isinstance(paired, tuple) else (paired,), plain if isinstance(plain, tuple) else (plain,)):
        # (a NaN is a NaN: the interpreter's one-element conversion keeps numpy's NaN, the pair's
        # model the instruction's canonical 0x7fff)
        nan = np.isnan(np.asarray(a, np.float64))
        np.testing.assert_array_equal(nan, np.isnan(np.asarray(b, np.float64)))
        np.testing.assert_array_equal(_bits(a)[~nan], _bits(b)[~nan])
    return paired


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_a_row_normalization_computes_the_same_bits(monkeypatch, dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 512)) * 40 - 7
    w, b = rng.standard_normal(512), rng.standard_normal(512)
    sched = fs.recipes.layernorm(5, 512, dtype=dtype, arch="sm_90a")
    y = _same_bits_either_way(monkeypatch, sched, (x, w, b))
    xr = x.astype(dt.dtype(dtype).np).astype(np.float64)
    ref = (xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + 1e-5) * \
        w.astype(dt.dtype(dtype).np) + b.astype(dt.dtype(dtype).np)
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=2e-2, atol=2e-2)


def test_a_gemm_epilogue_computes_the_same_bits(monkeypatch):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((67, 40)), rng.standard_normal((40, 72))
    sched = fs.recipes.gemm(67, 72, 40, dtype="bf16", arch="sm_80")
    _same_bits_either_way(monkeypatch, sched, (a, b), target="sm_80")


def test_special_values_round_as_one_conversion_each(monkeypatch):
    """NaN, infinities, overflow, ties and subnormals of the 16-bit type through a cast kernel."""
    vals = np.array([np.nan, np.inf, -np.inf, 1e6, -7e4, 65520.0, 65519.0, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11,
                     2 ** -24, 2 ** -25, 3 * 2 ** -26, -0.0, 0.0, 5.96e-8, 1.5], np.float32)
    x = np.tile(vals, (4, 2))
    sched = fs.recipes.cast((4, 32), src="f32", dst="f16")
    y = _same_bits_either_way(monkeypatch, sched, (x,))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(np.asarray(y)[ok].view(np.uint16), want[ok].view(np.uint16))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 70), vec=st.sampled_from([1, 2, 4, 8]),
       threads=st.sampled_from([32, 64]), out=st.sampled_from(["f16", "bf16"]), op=st.sampled_from(["add", "mul"]))
def test_hand_written_pointwise_kernels(rows, cols, vec, threads, out, op):
    """A user's element-wise kernel (f32 inputs, a 16-bit output, any tile): paired or not, it
    matches numpy with the output rounded once."""
    spec = Pointwise.kernel(op, {"r": rows, "c": cols}, dtype="f32", out=out)
    sched = spec.schedule(tile(r=1, c=vec * threads) >> to_blocks(), tile(c=vec) >> to_threads())
    rng = np.random.default_rng(rows * 100 + cols)
    a, b = rng.standard_normal((rows, cols)) * 3, rng.standard_normal((rows, cols)) * 3
    try:
        got = fs.interpret(sched, a, b, target="sm_90a")
    except fs.ScheduleError:
        return
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    want = (a32 + b32 if op == "add" else a32 * b32).astype(dt.dtype(out).np)
    np.testing.assert_array_equal(_bits(got), _bits(want))
