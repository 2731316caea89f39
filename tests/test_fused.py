"""A fused kernel that is in no recipe, built from specs and strategies only: ``Y = relu(X W1) W2``
with the hidden tile ``H`` kept in shared memory (never written to global memory), checked in the
interpreter against numpy and compiled by NVRTC; and the refusals of fused schedules that could
not run right."""

from __future__ import annotations

import numpy as np
import pytest

import firesched as fs
from firesched import ops
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
    to_warps,
)
from firesched.tensor import GL, KERNEL, SH, Tensor, Tile

MMA = sm80.mma_m16n8k16_f16_f32


def mlp_spec(M, K, Hd, N):
    """``H = X @ W1`` (m x h, reduced over k), ``Y = H @ W2`` (m x n, reduced over h)."""
    X = Tensor("X", "f16", GL, ("m", "k"), (M, K), "k")
    W1 = Tensor("W1", "f16", GL, ("k", "h"), (K, Hd), "h")
    H = Tensor("H", "f16", GL, ("m", "h"), (M, Hd), "h")
    W2 = Tensor("W2", "f16", GL, ("h", "n"), (Hd, N), "n")
    Y = Tensor("Y", "f16", GL, ("m", "n"), (M, N), "n")

    def t(x):
        return Tile(x, x.shape)

    return fs.Fused.kernel(fs.MatMul(t(X), t(W1), t(H), KERNEL, "f32", roles=("m", "h", "k")),
                           fs.MatMul(t(H), t(W2), t(Y), KERNEL, "f32", roles=("m", "n", "h")))


def mlp_schedule(M, K, Hd, N, *, second_warps=(4, 1)):
    wm2, wn2 = second_warps
    return mlp_spec(M, K, Hd, N).schedule(
        tile(m=64) >> to_blocks(),
        place("H", SH),
        part(0, tile(k=32), move_to_smem("X"), move_to_smem("W1"), pipeline(stages=2),
             tile(m=32, h=Hd // 2) >> to_warps(2, 2), tile(k=16), move_to_regs("X"), move_to_regs("W1"),
             tile(m=16, h=8, k=16) >> done(MMA), epilogue(ops.relu())),
        part(1, tile(h=32), move_to_smem("W2"), pipeline(stages=2),
             tile(m=64 // wm2, n=N // wn2) >> to_warps(wm2, wn2), tile(h=16), move_to_regs("H"), move_to_regs("W2"),
             tile(m=16, n=8, h=16) >> done(MMA)),
    )


def _ref(x, w1, w2):
    r = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    return r(np.maximum(r(x) @ r(w1), 0.0)) @ r(w2)


@pytest.mark.parametrize("M, K, Hd, N", [(200, 96, 64, 72), (64, 32, 32, 16), (130, 48, 64, 40)])
def test_mlp_with_the_hidden_tile_on_chip_matches_numpy(M, K, Hd, N):
    sched = mlp_schedule(M, K, Hd, N)
    rng = np.random.default_rng(M)
    x, w1, w2 = rng.standard_normal((M, K)), rng.standard_normal((K, Hd)) / 8, rng.standard_normal((Hd, N)) / 8
    y = fs.interpret(sched, x, w1, w2)
    ref = _ref(x, w1, w2)
    assert np.abs(y - ref).max() <= 2e-2 * np.abs(ref).max()


def test_the_intermediate_never_reaches_global_memory():
    prog = mlp_schedule(200, 96, 64, 72).lower("sm_80")
    assert [b.name for b in prog.inputs] == ["X", "W1", "W2"] and prog.output.name == "Y"
    k = prog.kernels[0]
    assert [p.name for p in k.params] == ["X", "W1", "W2", "Y"]
    assert "H_smem" in {b.name for b in k.shared}
    src = fs.cuda.emit(prog)
    assert "the earlier parts are done with H" in src          # the barrier between the two parts


def test_fused_kernel_compiles_without_spills():
    k = fs.compile(mlp_schedule(200, 96, 64, 72), arch="sm_90a")
    assert k.spills == 0 and len(k.program.kernels) == 1


def test_parts_on_different_thread_counts_are_refused():
    with pytest.raises(ScheduleError, match="map different numbers of threads"):
        mlp_schedule(200, 96, 64, 72, second_warps=(2, 1)).check("sm_80")


def test_place_needs_an_intermediate_and_a_block():
    spec = mlp_spec(64, 32, 32, 16)
    with pytest.raises(ScheduleError, match="only an intermediate"):
        spec.schedule(tile(m=64) >> to_blocks(), place("X", SH))
    with pytest.raises(ScheduleError, match="tile the fused spec onto blocks first"):
        spec.schedule(place("H", SH))


def test_part_index_and_order():
    spec = mlp_spec(64, 32, 32, 16)
    with pytest.raises(ScheduleError, match="no such part"):
        spec.schedule(tile(m=64) >> to_blocks(), part(2, tile(k=32)))
    with pytest.raises(ScheduleError, match="place\\(...\\) comes before part"):
        spec.schedule(tile(m=64) >> to_blocks(), part(0, tile(k=32)), place("H", SH))


def test_fused_spec_names_its_inputs_intermediates_and_outputs():
    spec = mlp_spec(64, 32, 32, 16)
    assert [t.name for t in spec.inputs] == ["X", "W1", "W2"]
    assert [t.name for t in spec.locals] == ["H"]
    assert [t.name for t in spec.outputs] == ["Y"]
    assert "part(0, tile(k=32)" in repr(mlp_schedule(64, 32, 32, 16))
