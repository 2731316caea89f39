"""Loops that stop early (``ir.For.stop``): the causal key loop of attention ends at the diagonal.

The bound is block-uniform: each block runs its own number of iterations, barriers inside the
loop included; a bound that differs between the threads of one block is a hazard."""

from __future__ import annotations

import numpy as np
import pytest

# six blocks of 64 threads, a row of x and y per thread (the batched-blocks tests' kernel frame)
from test_interp_batch import BX, ROW, SMEM, TID, R, T, X, Y, call

import firesched as fs
from firesched import dtypes as dt
from firesched import ir
from firesched.cuda.printer import emit_kernel as print_kernel
from firesched.errors import HazardError
from firesched.hardware.atoms import sm70
from firesched.ir.expr import Var, minimum
from firesched.recipes.fmha import FmhaParams
from firesched.simulate.interp import run_program

ACC = ir.RegBuffer("acc", dt.f32, 4)


def program(stop):
    """Block b adds its rows ``min(4, stop)`` times, passing them through shared memory (with
    barriers) each iteration."""
    i = Var("i", 4)
    body = [
        ir.RegFill(ir.RegRef(ACC, 0), 4, 0.0),
        ir.For(i, 4, ir.Seq((
            ir.Barrier("the previous iteration's readers are done"),
            call(sm70.ld_global_16, src=ir.MemRef(X, ROW * 4), dst=ir.RegRef(R, 0)),
            call(sm70.st_shared_16, dst=ir.MemRef(SMEM, TID * 4), src=ir.RegRef(R, 0)),
            ir.Barrier("published"),
            call(sm70.ld_shared_16, src=ir.MemRef(SMEM, TID * 4), dst=ir.RegRef(R, 0)),
            *[ir.Pointwise("add", ir.RegRef(ACC, j), (ir.RegRef(ACC, j), ir.RegRef(R, j))) for j in range(4)],
        )), stop=stop),
        call(sm70.st_global_16, dst=ir.MemRef(Y, ROW * 4), src=ir.RegRef(ACC, 0)),
    ]
    k = ir.Kernel("stops", (X, Y), (6, 1, 1), T, (SMEM,), (R, ACC), ir.Seq(body))
    return ir.Program((k,), (X,), Y)


X_IN = np.arange(6 * T * 4, dtype=np.float32).reshape(6 * T, 4) % 97


def test_each_block_runs_its_own_number_of_iterations():
    got = run_program(program(BX % 4 + 1), {"x": X_IN})["y"]
    times = np.repeat(np.minimum(4, np.arange(6) % 4 + 1), T)[:, None]
    np.testing.assert_array_equal(got, X_IN * times)


def test_a_bound_past_the_extent_runs_the_extent():
    got = run_program(program(BX + 3), {"x": X_IN})["y"]
    times = np.repeat(np.minimum(4, np.arange(6) + 3), T)[:, None]
    np.testing.assert_array_equal(got, X_IN * times)


def test_a_bound_that_differs_inside_a_block_is_a_hazard():
    with pytest.raises(HazardError, match="block-uniform"):
        run_program(program(TID % 2 + 1), {"x": X_IN})


def test_the_printer_takes_the_minimum_once_per_loop():
    src = print_kernel(program(BX % 4 + 1).kernels[0])
    assert "for (int i = 0; i < min(4, bid_x % 4 + 1); ++i)" in src


def test_an_unrolled_loop_cannot_stop_early():
    i = Var("i", 4)
    k = ir.Kernel("bad", (X, Y), (6, 1, 1), T, (), (R,), ir.Seq((
        ir.For(i, 4, ir.RegFill(ir.RegRef(R, i), 1, 0.0), unroll=True, stop=minimum(BX, 4)),)))
    with pytest.raises(Exception, match="stops early"):
        print_kernel(k)


# --------------------------------------------------------------------------- the causal key loop

def _key_loops(sched) -> list[str]:
    src = fs.compile(sched, "sm_90a").source
    return [line.strip() for line in src.splitlines() if line.strip().startswith("for (int kv0")]


def test_the_causal_key_loop_stops_at_the_diagonal_of_the_block():
    p = FmhaParams(block_q=64, block_kv=32, warps=4)
    causal = fs.recipes.fmha(1, 2, 200, 200, 64, causal=True, params=p)
    # the block of queries q0 .. q0+63 needs keys up to q0+63: tiles 0 .. (q0 + 63) // 32; the
    # first q0 // 32 of them (keys up to q0 - 1) every query of the block sees whole, so they run
    # in a loop of their own without the causal mask, and the rest up to the stop after them
    stop = "min(7, bid_x * 2 + 2)"
    visible = f"min(bid_x * 2, {stop})"
    assert _key_loops(causal) == [f"for (int kv0 = 0; kv0 < min(7, {visible}); ++kv0) {{",
                                  f"for (int kv0m = 0; kv0m < min(7, {stop} - {visible}); ++kv0m) {{"]
    plain = fs.recipes.fmha(1, 2, 200, 200, 64, causal=False, params=p)
    assert _key_loops(plain) == ["for (int kv0 = 0; kv0 < 7; ++kv0) {"]


def test_online_softmax_can_visit_every_tile():
    from firesched.strategies import online_softmax

    s = online_softmax(kv=64, diagonal=False)
    assert repr(s) == "online_softmax(kv=64, diagonal=False)"
    assert eval(repr(s), {"online_softmax": online_softmax}) == s  # noqa: S307 - repr round trip
