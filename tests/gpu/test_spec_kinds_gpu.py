"""Pointwise, Move (cast, transpose) and Reduce kernels on the GPU against torch."""

from __future__ import annotations

import pytest

import firesched as fs
from firesched.strategies import done, move_to_smem, tile, to_blocks, to_threads, to_warps

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

T = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


@pytest.mark.parametrize("R, C", [(37, 100), (1024, 1024), (3, 7)])
def test_pointwise_add_broadcast(R, C):
    spec = fs.Pointwise.kernel("add", {"r": R, "c": C}, inputs=[("r", "c"), ("c",)])
    k = fs.compile(spec.schedule(tile(r=4, c=64) >> to_blocks(), tile(r=1, c=8) >> to_threads(), done()),
                   arch="sm_90a")
    X, Y = torch.randn(R, C, device="cuda", dtype=torch.float16), torch.randn(C, device="cuda", dtype=torch.float16)
    O = torch.empty(R, C, device="cuda", dtype=torch.float16)
    k(X, Y, O)
    assert torch.allclose(O.float(), (X + Y).float(), atol=1e-2)


@pytest.mark.parametrize("src, dst", [("f32", "bf16"), ("f16", "f32")])
def test_cast(src, dst):
    spec = fs.Move.kernel({"r": 300, "c": 520}, src=src, dst=dst)
    k = fs.compile(spec.schedule(tile(r=8, c=64) >> to_blocks(), tile(r=1, c=4) >> to_threads(), done()),
                   arch="sm_90a")
    X = torch.randn(300, 520, device="cuda", dtype=T[src])
    Y = torch.empty(300, 520, device="cuda", dtype=T[dst])
    k(X, Y)
    assert torch.equal(Y, X.to(T[dst]))


@pytest.mark.parametrize("R, C", [(70, 90), (1024, 2048)])
def test_transpose(R, C):
    spec = fs.Move.kernel({"r": R, "c": C}, src="f16", dst_major="r")
    k = fs.compile(spec.schedule(tile(r=32, c=32) >> to_blocks(), move_to_smem("X"), tile(r=8, c=1) >> to_threads(),
                                 done()), arch="sm_90a")
    X = torch.randn(R, C, device="cuda", dtype=torch.float16)
    Yt = torch.empty(C, R, device="cuda", dtype=torch.float16)     # Y stored column-major = Y^T row-major
    k(X, Yt.t())
    assert torch.equal(Yt, X.t().contiguous())


def _transposed(k, X):
    Yt = torch.empty(X.shape[1], X.shape[0], device="cuda", dtype=X.dtype)    # Y stored column-major
    k(X, Yt.t())
    torch.cuda.synchronize()
    return Yt


@pytest.mark.parametrize("R, C, dt", [(4096, 4096, "f16"), (4096, 4104, "bf16"), (300, 72, "f32"),
                                      (130, 257, "bf16"), (4096, 4096, "f32"), (1, 7, "f16")])
def test_transpose_recipe(R, C, dt):
    """The recipe's own plans: through registers (16-bit at 64 MiB), through shared memory on
    128-thread blocks eight an SM (above 64 MiB), and element accesses at odd edges."""
    k = fs.compile(fs.recipes.transpose(R, C, dt, "sm_90a"), arch="sm_90a")
    X = torch.randn(R, C, device="cuda", dtype=T[dt])
    assert torch.equal(_transposed(k, X), X.t().contiguous())


def test_transpose_random_schedules():
    """Tiles and schedule flags a user may pass (through registers or shared memory, persistent
    blocks with a ring of tiles), drawn at random over odd and aligned shapes: each one the
    recipe accepts is bit-exact on the GPU."""
    import random

    rng, ran = random.Random(11), 0
    for _ in range(40):
        R, C = rng.choice([8, 72, 300, 1000, 4096]) + rng.choice([0, 0, 1, 3]), rng.choice([8, 64, 520, 4096])
        params = dict(block_r=rng.choice([8, 32, 64, 128, 256]), block_c=rng.choice([8, 32, 64]),
                      staged=rng.random() < 0.6, persistent=rng.random() < 0.5, occupancy=rng.choice([1, 2, 4]),
                      stages=rng.choice([1, 2, 3]))
        dt = rng.choice(["f16", "bf16", "f32"])
        try:
            sched = fs.recipes.transpose(R, C, dt, "sm_90a", params=params)
        except fs.ScheduleError:
            continue
        X = torch.randn(R, C, device="cuda", dtype=T[dt])
        assert torch.equal(_transposed(fs.compile(sched, arch="sm_90a"), X), X.t().contiguous()), (R, C, dt, params)
        ran += 1
    assert ran >= 15


@pytest.mark.parametrize("op", ["sum", "max", "mean"])
@pytest.mark.parametrize("R, C", [(13, 1000), (4096, 4096)])
def test_row_reduce(op, R, C):
    spec = fs.Reduce.kernel(op, {"r": R, "c": C}, "c")
    k = fs.compile(spec.schedule(tile(r=4) >> to_blocks(), tile(r=1) >> to_warps(), tile(c=256),
                                 tile(c=8) >> to_threads(), done()), arch="sm_90a")
    X = torch.randn(R, C, device="cuda", dtype=torch.float16)
    Y = torch.empty(R, device="cuda", dtype=torch.float32)
    k(X, Y)
    ref = {"sum": X.float().sum(1), "max": X.float().max(1).values, "mean": X.float().mean(1)}[op]
    assert torch.allclose(Y, ref, rtol=1e-3, atol=1e-3)


def test_block_per_row_reduce():
    spec = fs.Reduce.kernel("sum", {"r": 64, "c": 30000}, "c")
    k = fs.compile(spec.schedule(tile(r=1) >> to_blocks(), tile(c=2048), tile(c=8) >> to_threads(), done()),
                   arch="sm_90a")
    X = torch.randn(64, 30000, device="cuda", dtype=torch.float16)
    Y = torch.empty(64, device="cuda", dtype=torch.float32)
    k(X, Y)
    assert torch.allclose(Y, X.float().sum(1), rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("threads", [96, 544, 992])
def test_block_per_row_reduce_over_warps_not_a_power_of_two(threads):
    spec = fs.Reduce.kernel("sum", {"r": 64, "c": 30001}, "c")
    k = fs.compile(spec.schedule(tile(r=1) >> to_blocks(), tile(c=8 * threads), tile(c=8) >> to_threads(), done()),
                   arch="sm_90a")
    X = torch.randn(64, 30001, device="cuda", dtype=torch.float16)
    Y = torch.empty(64, device="cuda", dtype=torch.float32)
    k(X, Y)
    assert torch.allclose(Y, X.float().sum(1), rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("R, C, part", [(4, 1 << 20, 16384), (3, 1000, 256)])
def test_reduce_across_blocks(op, R, C, part):
    """Long rows: the reduced dim tiled onto blocks, partial results in a workspace, a second
    launch folding them."""
    spec = fs.Reduce.kernel(op, {"r": R, "c": C}, "c")
    k = fs.compile(spec.schedule(tile(r=1, c=part) >> to_blocks(), tile(r=1) >> to_warps(), tile(c=256),
                                 tile(c=8) >> to_threads(), done()), arch="sm_90a")
    assert len(k.program.kernels) == 2
    X = torch.randn(R, C, device="cuda", dtype=torch.float16)
    Y = torch.empty(R, device="cuda", dtype=torch.float32)
    for _ in range(2):          # the workspace is reused: a second call must not see the first's parts
        Y.fill_(float("nan"))
        k(X, Y)
        ref = {"sum": X.float().sum(1), "max": X.float().max(1).values, "min": X.float().min(1).values,
               "mean": X.float().mean(1)}[op]
        assert torch.allclose(Y, ref, rtol=1e-3, atol=1e-3 * max(1.0, ref.abs().max().item()))


@pytest.mark.parametrize("seed", range(12))
def test_guarded_loads_under_a_predicate_in_hand_written_kernels(seed):
    # done(guard="predicate") in kernels a user writes: odd shapes, loads of 1 to 16 bytes (their
    # zeros and `@p ld` in one asm statement), a pointwise with a broadcast operand, a cast, a
    # row reduction; each against torch
    import random

    rnd = random.Random(seed)
    R, C = rnd.randint(1, 300), rnd.randint(1, 3000)
    kind = rnd.choice(["pointwise", "cast", "reduce"])
    tc = rnd.choice([1, 2, 4, 8])
    if kind == "pointwise":
        spec = fs.Pointwise.kernel("add", {"r": R, "c": C}, inputs=[("r", "c"), ("c",)])
        sched = spec.schedule(tile(r=2, c=8 * tc) >> to_blocks(), tile(r=1, c=tc) >> to_threads(),
                              done(guard="predicate"))
        X, Y = torch.randn(R, C, device="cuda", dtype=torch.float16), torch.randn(C, device="cuda", dtype=torch.float16)
        O = torch.empty(R, C, device="cuda", dtype=torch.float16)
        fs.compile(sched, arch="sm_90a")(X, Y, O)
        assert torch.allclose(O.float(), (X + Y).float(), atol=1e-2), (R, C, tc)
    elif kind == "cast":
        src = rnd.choice(["i8", "f16", "f32"])
        spec = fs.Move.kernel({"r": R, "c": C}, src=src, dst="f32")
        sched = spec.schedule(tile(r=4, c=16 * tc) >> to_blocks(), tile(r=1, c=tc) >> to_threads(),
                              done(guard="predicate"))
        X = (torch.randint(-100, 100, (R, C), device="cuda", dtype=torch.int8) if src == "i8"
             else torch.randn(R, C, device="cuda", dtype={"f16": torch.float16, "f32": torch.float32}[src]))
        Y = torch.empty(R, C, device="cuda", dtype=torch.float32)
        fs.compile(sched, arch="sm_90a")(X, Y)
        assert torch.equal(Y, X.float()), (src, R, C, tc)
    else:
        spec = fs.Reduce.kernel("sum", {"r": R, "c": C}, "c")
        sched = spec.schedule(tile(r=4) >> to_blocks(), tile(r=1) >> to_warps(), tile(c=32 * tc),
                              tile(c=tc) >> to_threads(), done(guard="predicate"))
        X = torch.randn(R, C, device="cuda", dtype=torch.float16)
        Y = torch.empty(R, device="cuda", dtype=torch.float32)
        fs.compile(sched, arch="sm_90a")(X, Y)
        assert torch.allclose(Y, X.float().sum(1), rtol=1e-3, atol=1e-3), (R, C, tc)
