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
