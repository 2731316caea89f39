"""Batches of independent blocks: the interpreter runs up to ``BATCH_THREADS`` threads of
consecutive blocks per statement, and must give exactly what one block at a time gives — the same
results, and the same hazard, reported with the same message."""

from __future__ import annotations

import numpy as np
import pytest

import firesched as fs
from firesched import dtypes as dt
from firesched import ir
from firesched.errors import HazardError
from firesched.hardware.atoms import sm70
from firesched.ir.expr import binop, lt
from firesched.simulate import kernel as K
from firesched.simulate.interp import run_program

T = 64
TID = ir.tid(T)
BX = ir.bid(0, 6)
X = ir.GlobalBuffer("x", dt.f32, (6 * T, 4), (4, 1), "in")
Y = ir.GlobalBuffer("y", dt.f32, (6 * T, 4), (4, 1), "out")
SMEM = ir.SharedBuffer("A_smem", dt.f32, T * 4)
R = ir.RegBuffer("r", dt.f32, 4)
R2 = ir.RegBuffer("r2", dt.f32, 4)
ROW = BX * T + TID                 # this thread's row of x and y
NEXT = (TID + 5) % T               # the neighbour whose chunk a thread reads


def call(atom, **args):
    return ir.AtomCall(atom, tuple(args.items()))


def program(body, grid=(6, 1, 1)):
    k = ir.Kernel("blocks", (X, Y), grid, T, (SMEM,), (R, R2), ir.Seq(body))
    return ir.Program((k,), (X,), Y)


def exchange(guarded_barrier=None):
    """Each block rotates its rows through shared memory; ``guarded_barrier`` (a condition) puts
    the barrier under an ``If`` (the condition 1 is the correct kernel)."""
    barrier = ir.Barrier() if guarded_barrier is None else ir.If(guarded_barrier, ir.Barrier())
    return [
        call(sm70.ld_global_16, src=ir.MemRef(X, ROW * 4), dst=ir.RegRef(R, 0)),
        call(sm70.st_shared_16, dst=ir.MemRef(SMEM, TID * 4), src=ir.RegRef(R, 0)),
        barrier,
        call(sm70.ld_shared_16, src=ir.MemRef(SMEM, NEXT * 4), dst=ir.RegRef(R2, 0)),
        call(sm70.st_global_16, dst=ir.MemRef(Y, ROW * 4), src=ir.RegRef(R2, 0)),
    ]


def run(prog, feed, batch_threads, batches=None):
    """``run_program`` with batches of at most ``batch_threads`` threads; the batch size of each
    ``KernelRun`` made is appended to ``batches``."""
    init = K.KernelRun.__init__

    def record(self, kernel, memory, batch=1, pending=frozenset()):
        if batches is not None:
            batches.append(batch)
        init(self, kernel, memory, batch, pending)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(K, "BATCH_THREADS", batch_threads)
        mp.setattr(K.KernelRun, "__init__", record)
        return run_program(prog, feed)


def both(prog, feed, fallback=False):
    """The results batched (every block at once) and one block at a time; they must be equal.
    Unless ``fallback``, the batched run must not have needed the one-at-a-time re-run."""
    made: list[int] = []
    batched = run(prog, feed, 1 << 16, made)
    blocks = sum(len(K.block_ids(k)) for k in prog.kernels)
    if fallback:
        assert made[-1] == 1 and made[0] > 1, made
    else:
        assert 1 not in made or blocks == len(prog.kernels), made
    alone = run(prog, feed, 1)
    assert batched.keys() == alone.keys()
    for name in batched:
        np.testing.assert_array_equal(batched[name], alone[name])
    return batched


def hazard_message(prog, feed, batch_threads) -> str:
    with pytest.raises(HazardError) as info:
        run(prog, feed, batch_threads)
    return str(info.value)


X_IN = {"x": np.arange(6 * T * 4, dtype=np.float32).reshape(6 * T, 4)}
ROTATED = np.concatenate([np.roll(X_IN["x"][b * T:(b + 1) * T], -5, axis=0) for b in range(6)])


def test_blocks_run_batched_and_match():
    got = both(program(exchange()), X_IN)["y"]
    np.testing.assert_array_equal(got, ROTATED)


def test_batches_that_do_not_divide_the_grid():
    # 6 blocks of 64 threads in batches of 4: one batch of 4, then one of 2
    prog = program(exchange())
    np.testing.assert_array_equal(run(prog, X_IN, 4 * T)["y"], ROTATED)


def test_a_race_in_one_block_is_reported_as_one_block_at_a_time_reports_it():
    # block 3 skips its barrier: a read-after-write race there and nowhere else
    prog = program(exchange(guarded_barrier=binop("!=", BX, 3)))
    with pytest.raises(HazardError) as info:
        run(prog, X_IN, 1 << 16)
    assert info.value.__context__ is None          # not chained to the batch's own report
    batched = str(info.value)
    alone = hazard_message(prog, X_IN, 1)
    assert batched == alone
    assert "race (read after write)" in batched and "block (3, 0, 0)" in batched


def test_a_barrier_some_blocks_skip_whole_is_no_hazard():
    # blocks 0..2 load again after a second barrier, blocks 3..5 skip it entirely: legal, although
    # the batch cannot run it in lockstep (it re-runs one block at a time)
    body = exchange() + [ir.If(lt(BX, 3), ir.Seq([
        ir.Barrier(),
        call(sm70.st_shared_16, dst=ir.MemRef(SMEM, TID * 4), src=ir.RegRef(R2, 0)),
        ir.Barrier(),
        call(sm70.ld_shared_16, src=ir.MemRef(SMEM, NEXT * 4), dst=ir.RegRef(R2, 0)),
        call(sm70.st_global_16, dst=ir.MemRef(Y, ROW * 4), src=ir.RegRef(R2, 0)),
    ]))]
    got = both(program(body), X_IN, fallback=True)["y"]
    twice = np.concatenate([np.roll(X_IN["x"][b * T:(b + 1) * T], -10 if b < 3 else -5, axis=0)
                            for b in range(6)])
    np.testing.assert_array_equal(got, twice)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_gemm_recipes_batched_equal_one_block_at_a_time(arch):
    rng = np.random.default_rng(0)
    sched = fs.recipes.gemm(200, 136, 64, dtype="f16", arch=arch)
    prog = sched.lower(arch)
    feed = {b.name: rng.standard_normal(b.shape).astype(np.float16) for b in prog.inputs}
    k = prog.kernels[0]
    assert len(K.block_ids(k)) > 1 and K.batchable(k)
    both(prog, feed)


def test_softmax_recipe_batched_equal_one_block_at_a_time():
    rng = np.random.default_rng(1)
    sched = fs.recipes.softmax(37, 100, dtype="f16", arch="sm_90a")
    prog = sched.lower("sm_90a")
    feed = {b.name: rng.standard_normal(b.shape).astype(np.float16) for b in prog.inputs}
    both(prog, feed)


def test_clusters_run_unbatched():
    sched = fs.recipes.gemm(256, 256, 64, dtype="f16", arch="sm_90a", cluster=2)
    k = sched.lower("sm_90a").kernels[0]
    assert k.cluster == 2 and not K.batchable(k)
