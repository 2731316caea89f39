"""Batched GEMM (``recipes.bmm`` and hand-written batched chains): torch ``bmm`` / ``matmul``
semantics, broadcasting, odd shapes, epilogues that see the batch index; checked in the
interpreter against numpy's own ``matmul`` (an oracle that shares nothing with the lowering)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ops
from firesched.errors import ScheduleError
from firesched.hardware import sm80
from firesched.strategies import (
    done,
    epilogue,
    move_to_regs,
    move_to_smem,
    pipeline,
    tile,
    to_blocks,
    to_warps,
)


def _round(x, dt="f16"):
    return x.astype(fs.dtypes.dtype(dt).np).astype(np.float64)


def _check(C, ref, tol=2e-2):
    C = np.asarray(C, dtype=np.float64)
    assert C.shape == ref.shape
    assert np.abs(C - ref).max() <= tol * max(np.abs(ref).max(), 1e-3)


@pytest.mark.parametrize("batch, M, N, K, a_b, b_b", [
    (3, 70, 40, 50, True, True),
    (2, 64, 64, 32, False, True),      # A shared by every batch element
    (4, 33, 17, 40, True, False),      # B shared
    (1, 16, 16, 16, True, True),
    (5, 1, 9, 3, True, True),          # tiny and odd
])
def test_bmm_sm80_matches_numpy(batch, M, N, K, a_b, b_b):
    sched = fs.recipes.bmm(batch, M, N, K, arch="sm_80", a_batched=a_b, b_batched=b_b, block_m=64, block_n=64,
                           warps_m=2, warps_n=2)
    rng = np.random.default_rng(batch * 1000 + M)
    A = rng.standard_normal((batch, M, K) if a_b else (M, K))
    B = rng.standard_normal((batch, K, N) if b_b else (K, N))
    _check(fs.interpret(sched, A, B), np.matmul(_round(A), _round(B)))


def test_batch_maps_to_the_grid():
    sched = fs.recipes.bmm(6, 128, 128, 64, arch="sm_80", block_m=64, block_n=64, warps_m=2, warps_n=2)
    assert "b0 in block(6)" in str(sched)
    assert sched.lower("sm_80").kernels[0].grid == (2, 2, 6)


def test_epilogue_extras_follow_the_batch():
    """A residual has C's batched shape; a bias over N is shared by every batch element."""
    batch, M, N, K = 3, 40, 24, 32
    spec = fs.MatMul.kernel(M, N, K, batch=batch)
    sched = spec.schedule(tile(b=1, m=32, n=32) >> to_blocks(), tile(k=32), move_to_smem("A"), move_to_smem("B"),
                          pipeline(stages=2), tile(m=16, n=16) >> to_warps(), tile(k=16), move_to_regs("A"),
                          move_to_regs("B"), tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32),
                          epilogue(ops.bias("bias"), ops.residual("res"), ops.relu()))
    rng = np.random.default_rng(5)
    A, B = rng.standard_normal((batch, M, K)), rng.standard_normal((batch, K, N))
    bias, res = rng.standard_normal(N), rng.standard_normal((batch, M, N))
    ref = np.maximum(np.matmul(_round(A), _round(B)) + _round(bias) + _round(res), 0.0)
    _check(fs.interpret(sched, A, B, bias, res), ref)


@settings(max_examples=60 if settings().max_examples >= 500 else 12, deadline=None)
@given(batch=st.integers(1, 3), M=st.integers(1, 70), N=st.integers(1, 40), K=st.integers(1, 48),
       a_b=st.booleans(), b_b=st.booleans(), bm=st.sampled_from([32, 64]), bn=st.sampled_from([32, 64]))
def test_random_batched_shapes_match_numpy(batch, M, N, K, a_b, b_b, bm, bn):
    sched = fs.recipes.bmm(batch, M, N, K, arch="sm_80", a_batched=a_b, b_batched=b_b, block_m=bm, block_n=bn,
                           warps_m=2, warps_n=2, block_k=32, stages=2)
    rng = np.random.default_rng(M * 7 + N)
    A = rng.standard_normal((batch, M, K) if a_b else (M, K))
    B = rng.standard_normal((batch, K, N) if b_b else (K, N))
    ref = np.broadcast_to(np.matmul(_round(A), _round(B)), (batch, M, N))
    _check(fs.interpret(sched, A, B), ref)


@pytest.mark.parametrize("bad", [0, -2, True, 2.0])
def test_bmm_refuses_a_bad_batch(bad):
    with pytest.raises(ScheduleError, match="batch"):
        fs.recipes.bmm(bad, 16, 16, 16)


def test_tile_model_counts_the_batch():
    one = fs.recipes.tiles.params_sm90(512, 512, 64, batch=1)
    many = fs.recipes.tiles.params_sm90(512, 512, 64, batch=64)
    assert (one["block_m"], one["block_n"]) != (many["block_m"], many["block_n"]) or one == many
    assert fs.recipes.tiles.params_sm80(4096, 4096, 4096)["block_m"] == 256


# --------------------------------------------------------------------------- Hopper (rank-3 TMA)

@pytest.mark.parametrize("batch, M, N, K, a_b, b_b, kw", [
    (3, 100, 72, 40, True, True, {}),                               # tiles overhang M, N and K
    (2, 64, 128, 64, False, True, {}),                              # A broadcast: a 2-d tensor map
    (3, 70, 136, 96, True, False, dict(warp_specialized=False)),    # one role
    (2, 33, 64, 30, True, True, {}),                                # rows of 60 bytes: a padded copy first
])
def test_bmm_sm90a_matches_numpy(batch, M, N, K, a_b, b_b, kw):
    sched = fs.recipes.bmm(batch, M, N, K, arch="sm_90a", a_batched=a_b, b_batched=b_b, **kw)
    rng = np.random.default_rng(M + N + K)
    A = rng.standard_normal((batch, M, K) if a_b else (M, K))
    B = rng.standard_normal((batch, K, N) if b_b else (K, N))
    _check(fs.interpret(sched, A, B), np.broadcast_to(np.matmul(_round(A), _round(B)), (batch, M, N)))


def test_batched_operands_take_rank3_tensor_maps():
    prog = fs.recipes.bmm(4, 256, 256, 64, arch="sm_90a", block_m=128, block_n=256, stages=4).lower()
    maps = {p.name: p for p in prog.kernels[-1].params if isinstance(p, fs.ir.TensorMapParam)}
    assert maps["tmap_A"].box == (1, 128, 64) and maps["tmap_B"].box[0] == 1
    assert maps["tmap_C"].box == (1, 64, 64)          # the TMA-store epilogue, one batch at a time
    src = fs.cuda.emit(prog)
    assert "cp.async.bulk.tensor.3d" in src


def test_bmm_sm90a_compiles_without_spills():
    k = fs.compile(fs.recipes.bmm(8, 512, 512, 64, arch="sm_90a"), arch="sm_90a")
    assert k.spills == 0
