"""Weight-only int4 GEMM (W4A16): packings derived from atoms, the dequantising register move,
``ops.group_scale``, ``recipes.gemm_w4a16`` and the host packing, interpreted against numpy.

The dequantised weights are checked bit-exactly (one-hot activation rows select single weight
rows: the product with 1.0 is exact, so C holds the kernel's dequantised f16/bf16 weights) and
the products within the output type's tolerance, on odd shapes, every group size, signed and
unsigned codes, f16 and bf16; hand-written chains drawn by hypothesis are refused at ``check()``
or right.
"""

from __future__ import annotations

import attrs
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ops
from firesched.errors import ScheduleError
from firesched.hardware.atoms import catalog, sm80, sm90a
from firesched.hardware.atoms import convert as cv
from firesched.layout import Swizzle
from firesched.lower.layouts import coords
from firesched.lower.synthesis import packing_for
from firesched.packing import Packing
from firesched.quant import dequantize_int4, pack_int4, quantize_int4, unpack_int4
from firesched.recipes.w4a16 import (
    MIN_SHARE_K,
    SHARED_K_CONSUMERS,
    W4A16Params,
    W4A16WgmmaParams,
    gemm_w4a16,
    pack_weights,
    plan,
    plan_wgmma,
    w4a16_spec,
    weight_packing,
    wgmma_spec,
)
from firesched.strategies import (
    done,
    move_to_regs,
    move_to_smem,
    pipeline,
    prologue,
    scale_partials,
    split_k,
    tile,
    to_blocks,
    to_warpgroups,
    to_warps,
    warp_specialize,
)
from firesched.tensor import BLOCK, WARPGROUP
from firesched.testing.check import assert_schedule_correct
from firesched.testing.reference import schedule_reference, w4a16_reference
from firesched.testing.strategies import try_schedule

MMA = {"f16": sm80.mma_m16n8k16_f16_f32, "bf16": sm80.mma_m16n8k16_bf16_f32}
NP = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def _weights(K, N, group_size, signed, dtype, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((K, N))
    return quantize_int4(w, group_size, signed=signed, scale_dtype=dtype)


# --------------------------------------------------------------------------- packing synthesis

@pytest.mark.parametrize("words", [1, 2, 4])
@pytest.mark.parametrize("conv", cv.DEQUANT_ATOMS, ids=lambda a: a.name)
def test_packing_puts_each_lanes_fragment_in_one_word(conv, words):
    """Under the derived packing, word w of a 32-k step of a column holds, in the convert atom's
    output order, exactly the k of one lane's B fragment values over two k16 steps — read off the
    MMA's TV layout independently of how packing_for computes it — and a lane's ``words`` words
    are adjacent (one vector load)."""
    mma = MMA[str(conv.dtype_of("dst"))]
    pk = packing_for(mma, "b", conv, words)
    assert pk.block == 32 * words
    tv = mma.operand("b").tv
    src_of = cv.source_index(conv)
    for lane in range(32):
        n = {coords(tv)[lane][v][1] for v in range(4)}
        assert len(n) == 1
        for j in range(words):
            ks = [32 * j + 16 * r + coords(tv)[lane][v][0] for r in range(2) for v in range(4)]
            word = words * (lane % 4) + j          # the lanes of a column in order, each its words
            got = [pk.order[8 * word + int(src_of[v])] for v in range(8)]
            assert got == ks


def test_packing_pack_unpack_round_trip_and_errors():
    pk = weight_packing("f16")
    x = np.arange(3 * 64).reshape(3, 64)
    assert np.array_equal(pk.unpack(pk.pack(x)), x)
    assert pk.position(1) == 4 and pk.position(33) == 36
    with pytest.raises(ValueError, match="multiple of 32"):
        pk.pack(np.zeros((2, 48)))
    with pytest.raises(ValueError, match="permutation"):
        Packing(4, (0, 1, 1, 2))
    assert eval(repr(pk), {"Packing": Packing}) == pk


def test_packing_for_refuses_what_cannot_be_one_word():
    with pytest.raises(ValueError, match="allowed 'a', 'b'"):
        packing_for(MMA["f16"], "c", cv.dequant_u4_f16)
    # A's lanes hold two rows; a word holds one lane's run on one row: still derivable
    assert packing_for(MMA["f16"], "a", cv.dequant_u4_f16).block == 32


@pytest.mark.parametrize("signed", [False, True])
def test_pack_int4_round_trip(signed):
    q, _, _ = _weights(96, 10, 32, signed, "f16")
    pk = weight_packing("f16", signed)
    raw = pack_int4(q, pk)
    assert raw.shape == (10, 48) and raw.dtype == np.uint8
    back = unpack_int4(raw, pk, signed)
    assert np.array_equal(back.astype(np.int64), np.asarray(q).astype(np.int64))
    # storage byte 0 of column 0: codes k=0 (low nibble) and k=8 (high nibble)
    codes = np.asarray(q).astype(np.int64) & 0xF
    assert raw[0, 0] == codes[0, 0] | (codes[8, 0] << 4)


def test_pack_int4_errors():
    pk = weight_packing("f16")
    with pytest.raises(ValueError, match="int4 / uint4 codes"):
        pack_int4(np.zeros((32, 4)), pk)
    q, _, _ = _weights(64, 4, 32, False, "f16")
    with pytest.raises(ValueError, match="multiple of the packing"):
        pack_int4(q[:48], pk)
    with pytest.raises(ValueError, match="pass a Packing"):
        pack_int4(q, None)


# --------------------------------------------------------------------------- the recipe

SHAPES = [(1, 8, 32, 32), (5, 72, 96, 32), (16, 136, 256, 128), (17, 64, 192, 64), (3, 40, 128, None),
          (33, 24, 64, 64), (16, 40, 256, 32), (9, 24, 384, 64)]   # the last two: 128-k blocks of 4 groups


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("M,N,K,gs", SHAPES)
def test_recipe_matches_the_reference(M, N, K, gs, signed, dtype):
    sched = gemm_w4a16(M, N, K, group_size=gs, signed=signed, dtype=dtype, arch="sm_80")
    q, s, _ = _weights(K, N, gs, signed, dtype, seed=M + N)
    a = np.random.default_rng(K).standard_normal((M, K)).astype(NP[dtype]).astype(np.float32)
    got = fs.interpret(sched, a, q.astype(np.float64), s.astype(np.float32), target="sm_80").astype(np.float64)
    want = w4a16_reference(a, q, s, None, gs)
    tol = 1e-2 if dtype == "f16" else 2e-2
    assert np.abs(got - want).max() <= tol * (1 + np.abs(want).max())
    # the schedule's own meaning (dequantised weights rounded to the register type) agrees too
    ref = schedule_reference(sched, a, q.astype(np.float64), s.astype(np.float32))
    assert np.abs(got - ref).max() <= tol * (1 + np.abs(ref).max())


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("signed,gs", [(False, 32), (True, 64), (False, None)])
def test_dequantised_weights_are_bit_exact(dtype, signed, gs):
    """One-hot rows of A select weight rows: C = W exactly as the registers held it, which must be
    the f16/bf16 rounding of (code - zero) * scale (one rounding, as the atoms compute it)."""
    K, N = 64, 24
    q, s, _ = _weights(K, N, gs, signed, dtype, seed=3)
    sched = gemm_w4a16(K, N, K, group_size=gs, signed=signed, dtype=dtype, arch="sm_80",
                       params=W4A16Params(block_m=16, block_n=32, block_k=64, warps_n=2, warp_k=32, stages=2))
    a = np.eye(K, dtype=np.float32)
    got = fs.interpret(sched, a, q.astype(np.float64), s.astype(np.float32), target="sm_80")
    zero = 0 if signed else 8
    codes = np.asarray(q).astype(np.int64) - zero
    g = np.arange(K) // (gs or K)
    exact = (codes * s.astype(np.float64)[g]).astype(NP[dtype])       # one rounding of an exact product
    assert np.array_equal(got.astype(NP[dtype]).view(np.uint16), exact.view(np.uint16))
    assert np.allclose(dequantize_int4(q, s, None, gs), exact.astype(np.float32), atol=0.6 * np.abs(s).max())


def test_sixteen_byte_loads_where_k_allows():
    """K a multiple of 128 and a warp's K step of 128: a lane's four words of a block are one
    16-byte shared load (of 64: two words, 8 bytes), and the result is still right; otherwise one
    word a load."""
    p = W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=128)
    wide = gemm_w4a16(16, 64, 256, arch="sm_80", params=p)
    assert wide.spec.operand("B").tensor.packing.block == 128
    src = fs.compile(wide, "sm_80").source
    assert "ld.shared.v4.b32" in src and "ld.shared.b32" not in src
    assert_schedule_correct(wide, examples=1)
    half = gemm_w4a16(16, 64, 192, arch="sm_80", params=attrs.evolve(p, block_k=64, warp_k=64))
    assert half.spec.operand("B").tensor.packing.block == 64
    assert "ld.shared.v2.b32" in fs.compile(half, "sm_80").source
    assert_schedule_correct(half, examples=1)
    narrow = gemm_w4a16(16, 64, 96, arch="sm_80")
    assert narrow.spec.operand("B").tensor.packing.block == 32


@pytest.mark.parametrize("stages", [2, 3])
def test_prefetched_dequantised_fragments_in_the_steady_state(stages):
    """Several warp K steps a tile: the next tile's first words are loaded, dequantised and scaled
    one step early, after the barrier that frees a stage; the last step's math reads no shared
    memory, so the ring's refill of that stage races with nothing (K long enough for the ring
    to wrap several times)."""
    p = W4A16Params(block_m=32, block_n=32, block_k=64, warps_m=2, warps_n=2, warp_k=32, stages=stages)
    sched = gemm_w4a16(20, 40, 640, group_size=64, arch="sm_80", params=p)
    src = fs.compile(sched, "sm_80").source
    assert "stage kt-1 is no longer read" in src
    assert_schedule_correct(sched, examples=1)


@pytest.mark.parametrize("M,N,K,gs,p", [
    (5, 72, 1024, 128, W4A16Params(block_m=16, block_n=32, block_k=512, warps_n=2, warp_k=128, warps_k=4, stages=2)),
    (16, 40, 640, 64, W4A16Params(block_m=16, block_n=16, block_k=256, warps_n=1, warp_k=64, warps_k=4, stages=3)),
    (3, 24, 448, 32, W4A16Params(block_m=16, block_n=16, block_k=128, warps_n=2, warp_k=32, warps_k=2, stages=2,
                                 split_k=2)),
])
def test_warps_sharing_a_k_tile(M, N, K, gs, p):
    """``warps_k``: groups of warps take parts of each K tile with their own accumulators, added
    through shared memory before C is stored: right at odd N and K (a last K tile past the end,
    groups inside a warp's part), alone and under a K split over blocks, with no hazard."""
    sched = gemm_w4a16(M, N, K, group_size=gs, arch="sm_80", params=p)
    assert "split_k(" + str(p.warps_k) + ", across=warp)" in str(sched)
    assert_schedule_correct(sched, examples=1)


def test_warps_k_must_divide_the_k_tile_in_warp_steps():
    with pytest.raises(ValueError, match="warps_k=4"):
        W4A16Params(block_k=128, warp_k=64, warps_k=4)


@pytest.mark.parametrize("gs", [32, 128, None])
def test_group_scales_ride_the_ring(gs):
    """In a cp.async ring the group scales of each K tile are staged with the tile and read from
    shared memory; where a row of scales cannot be copied in 4-byte chunks (odd N) they are read
    from global memory.  Both are right, K long enough for the ring to wrap."""
    staged = gemm_w4a16(16, 64, 1024, group_size=gs, arch="sm_80")
    src = fs.compile(staged, "sm_80").source
    assert "S rows of this K tile -> shared" in src and "ld.global.b16" not in src
    assert_schedule_correct(staged, examples=1)
    odd = gemm_w4a16(5, 71, 512, group_size=gs, arch="sm_80")
    assert "ld.global.b16" in fs.compile(odd, "sm_80").source
    assert_schedule_correct(odd, examples=1)


def test_a_split_k_part_starting_inside_a_group_keeps_global_scales():
    """K = 384 in two parts of 192 with 128-k tiles and groups of 128: part 1's first tile spans
    groups 1 and 2, so its scales cannot be one staged row; the ring stages nothing and the
    scales come from global memory, per word (found by the hypothesis test)."""
    spec = w4a16_spec(1, 8, 384)
    sched = spec.schedule(split_k(2, across=BLOCK), tile(m=16, n=8) >> to_blocks(), tile(k=128), move_to_smem("A"),
                          move_to_smem("B"), tile(m=16, n=8) >> to_warps(1, 1), tile(k=32), move_to_regs("A"),
                          move_to_regs("B"), prologue("B", ops.group_scale("S", 128, zero=8)),
                          tile(m=16, n=8, k=16) >> done(MMA["f16"]))
    assert "staged" not in fs.compile(sched, "sm_80").source
    assert_schedule_correct(sched, examples=2)
    for M, N, K in [(1, 4096, 4096), (16, 8192, 8192), (64, 4096, 4096)]:
        assert "S rows of this K tile" in fs.compile(gemm_w4a16(M, N, K, arch="sm_90a"), "sm_90a").source


def test_pack_weights_reads_the_schedules_packing():
    sched = gemm_w4a16(16, 64, 128, arch="sm_80")
    q, _, _ = _weights(128, 64, 128, False, "f16")
    assert np.array_equal(pack_weights(q, sched), pack_int4(q, sched.spec.operand("B").tensor.packing))
    with pytest.raises(ValueError, match="gemm_w4a16 schedule"):
        pack_weights(q, "B")


@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (16, 8192, 8192), (64, 4096, 4096), (4096, 8192, 8192),
                                   (1, 11008, 4096), (17, 4096, 11008)])
def test_plan_fills_the_gpu(M, N, K):
    p = plan(M, N, K)
    tiles = -(-M // p.block_m) * -(-N // p.block_n) * p.split_k
    assert tiles >= 64
    # parts of whole K tiles (11008 in four parts of 2752 once cut the codes' 128-k blocks)
    assert p.split_k == 1 or (K % p.split_k == 0 and (K // p.split_k) % max(64, p.block_k) == 0)
    gemm_w4a16(M, N, K, arch="sm_80", params=p)


@pytest.mark.parametrize("M,N,K,rows", [(512, 4096, 4096, 128), (384, 8192, 8192, 192), (768, 4096, 4096, 192),
                                        (1024, 8192, 8192, 256), (4096, 4096, 4096, 256), (999, 1000, 4128, 128)])
def test_wgmma_plan_feeds_large_m_from_a_producer(M, N, K, rows):
    """Above M = 256 the sm_90a plan takes a TMA producer and the activation rows (256, 192, 128)
    that finish the grid's waves first (the winners measured at these shapes, bench/README.md),
    with a ring that fits shared memory; up to 256 it keeps the cp.async tiles and splits K."""
    from firesched.recipes.w4a16 import RING_BYTES

    p = plan(M, N, K, wgmma=True)
    assert isinstance(p, W4A16WgmmaParams) and p.producer and not p.pingpong and p.block_m == rows
    assert 2 <= p.stages <= 4 and p.stages * (p.block_m * p.block_k * 2 + p.block_n * p.block_k // 2) <= RING_BYTES
    # up to M = 256 a producer too, 64 or 128 rows, K split as far as one wave of blocks allows
    small = plan(256, N, K, wgmma=True)
    assert small.producer and small.block_m in (64, 128)
    assert -(-256 // 128) * -(-N // 128) * small.split_k <= 132 or small.split_k == 1


@pytest.mark.parametrize("M,N,K,rows,cols,split,bk", [
    (64, 4096, 4096, 64, 64, 2, 256), (64, 8192, 8192, 64, 64, 1, 256), (33, 8192, 8192, 40, 64, 1, 256),
    (32, 4096, 4096, 32, 64, 2, 512), (17, 8192, 8192, 24, 64, 1, 512), (96, 4096, 4096, 96, 128, 4, 128),
    (128, 8192, 8192, 128, 128, 2, 128), (256, 4096, 4096, 128, 128, 2, 128), (256, 8192, 8192, 128, 128, 1, 128),
    (200, 1000, 4128, 64, 128, 1, 32)])
def test_wgmma_plan_up_to_256_rows_fills_one_wave(M, N, K, rows, cols, split, bk):
    """Up to M = 256: of the row tiles (64, or M rounded to 8 up to 128), the column tiles (64 too
    up to M = 64) and K splits that keep the grid to one wave of 132 blocks, the one with the most
    blocks, then the largest rows, then the fewest K parts; K tiles of 512 k up to 32 rows and 256
    up to 64 where K's parts divide into them."""
    p = plan(M, N, K, wgmma=True)
    assert p.producer and (p.block_m, p.block_n, p.split_k, p.block_k) == (rows, cols, split, bk)
    assert (K // split) % p.block_k == 0


@pytest.mark.parametrize("M,N,K,family,cols", [(1, 8192, 8192, "wgmma", 64), (16, 8192, 8192, "wgmma", 64),
                                               (1, 4096, 4096, "wgmma", 64), (16, 4096, 4096, "wgmma", 64),
                                               (1, 2048, 4096, "mma", 64), (16, 1024, 4096, "mma", 64),
                                               (7, 1000, 4128, "mma", 64), (1, 11008, 4096, "wgmma", 128),
                                               (1, 28672, 8192, "wgmma", 128), (16, 14336, 4096, "wgmma", 128),
                                               (16, 22016, 4096, "mma", 128), (17, 4096, 4096, "wgmma", 64)])
def test_small_m_takes_wgmma_where_it_needs_no_split(M, N, K, family, cols):
    """M <= 16 runs the wgmma family only where its tiles fill more than half a wave with K
    unsplit (no second launch): 64 columns a block, or 128 where they make one wave or K is long
    (w4a16.WIDE_WGMMA_K), or where its 64-column tiles' two K parts add up in a cluster
    (w4a16.CLUSTER_SPLITS; N = 4096); otherwise the mma.sync tiles, which split K, and take 128
    columns on 8 warps where 64 would make more than two waves.  Above 16 rows, wgmma."""
    p = plan(M, N, K, wgmma=True)
    assert isinstance(p, W4A16WgmmaParams if family == "wgmma" else W4A16Params)
    assert p.block_n == cols
    if M <= 16:
        assert p.split_k == 1 or family == "mma" or (p.cluster_combine and p.split_k == 2)
    assert isinstance(plan(M, N, K), W4A16Params)           # sm_80: always the mma.sync family
    assert plan(M, N, K).block_n == 64 or M > 16            # (and its 64 columns)


@pytest.mark.parametrize("M,N,K,dtype,shared", [
    (1, 8192, 8192, "f16", 4), (16, 8192, 28672, "f16", 4), (1, 28672, 8192, "f16", 2), (16, 14336, 4096, "f16", 2),
    (32, 8192, 8192, "f16", 2), (64, 8192, 8192, "f16", 2), (17, 4096, 4096, "f16", 1), (64, 4096, 4096, "f16", 1),
    (32, 28672, 8192, "f16", 1), (128, 8192, 8192, "f16", 1), (300, 4096, 4096, "f16", 1),
    (1, 8192, 8192, "bf16", 4), (8, 28672, 8192, "bf16", 2), (16, 8192, 8192, "bf16", 4), (17, 8192, 8192, "bf16", 1),
    (32, 8192, 8192, "bf16", 1), (64, 8192, 8192, "bf16", 2)])
def test_consumers_share_k_tiles_where_k_is_not_split(M, N, K, dtype, shared):
    """Where K is not split over blocks, consumer warpgroups share each K tile until a block has
    as many consumers as w4a16.SHARED_K_CONSUMERS gives its rows and type (f16: four up to M =
    16, two up to 64), each with ``MIN_SHARE_K`` of a tile or more; a split K keeps one a 64
    columns."""
    p = plan(M, N, K, wgmma=True, dtype=dtype)
    assert isinstance(p, W4A16WgmmaParams) and p.warpgroups_k == shared, p
    assert p.warpgroups_k == 1 or (p.split_k == 1 and p.block_k // p.warpgroups_k >= MIN_SHARE_K)
    assert p.warpgroups_k == 1 or (p.block_n // 64) * p.warpgroups_k <= next(
        c for rows, c in SHARED_K_CONSUMERS[dtype] if M <= rows)


def test_plan_refuses_an_unknown_dtype():
    with pytest.raises(ValueError, match="dtype='f32'"):
        plan(1, 4096, 4096, dtype="f32")
    with pytest.raises(ValueError, match="plan_wgmma: dtype='f32'"):
        plan_wgmma(1, 8192, 8192, dtype="f32")


def test_small_m_k_tiles_of_64_where_128_stop_the_split():
    """11,008 = 86 x 128: two parts of whole 128-k tiles, four of 64-k tiles (w4a16.SHORT_K_STAGES);
    at N = 4096 the wgmma tile's two parts added in a cluster instead."""
    p = plan(1, 2048, 11008, wgmma=True)
    assert isinstance(p, W4A16Params) and (p.block_k, p.stages, p.split_k) == (64, 8, 4)
    p = plan(1, 4096, 11008, wgmma=True)
    assert p.cluster_combine and (p.block_k, p.split_k) == (128, 2)
    assert plan(1, 1024, 4096).block_k == 128               # its split stops on the parts' length, not tiles
    assert plan(1, 4096, 8000).block_k == 128               # tiles of 64 split it no further


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(M=st.one_of(st.integers(1, 16), st.integers(17, 300)), N=st.one_of(st.integers(1, 2000), st.integers(8000, 40000)),
       k=st.one_of(st.integers(1, 40), st.integers(100, 512)), gs=st.sampled_from([32, 64, 128, None]),
       zp=st.booleans(), arch=st.sampled_from(["sm_90a", "sm_80"]))
def test_the_plan_builds_for_any_shape(M, N, k, gs, zp, arch):
    """The default plan of any shape (wide weights, K of few or many tiles, every group size, zero
    points) builds a schedule that check() accepts, its K parts whole K tiles."""
    sched = gemm_w4a16(M, N, 32 * k, group_size=gs, zero_point=zp and gs is not None, arch=arch)
    p = plan(M, N, 32 * k, wgmma=arch == "sm_90a", group_size=gs, zero_point=zp and gs is not None)
    assert p.split_k == 1 or (32 * k) % p.split_k == 0 and (32 * k // p.split_k) % p.block_k == 0
    # (the wgmma family computes C^T: the weights are its A operand, the activations its N side)
    assert sorted((sched.spec.m, sched.spec.n)) == sorted((M, N)) and sched.spec.k == 32 * k


@pytest.mark.parametrize("N,K", [(4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096), (28672, 8192),
                                 (8192, 28672), (1000, 4128)])
def test_wgmma_plans_fit_shared_memory(N, K):
    """The plan's wgmma ring holds its stages with the K tile's scale rows (and zero-point rows)
    beside the tiles, for every group size (M = 17-24 at N = 11008 once planned 4 stages of 512 k
    over 128 columns, and 192-row tiles 4 stages, which with group 32 or zero points overflowed)."""
    from firesched.recipes.w4a16 import RING_BYTES

    for M in (1, 8, 16, 17, 24, 32, 40, 48, 64, 96, 128, 192, 256, 257, 768, 4096):
        for gs in (32, 64, 128, None):
            for zp in (False, True) if gs else (False,):
                p = plan(M, N, K, wgmma=True, group_size=gs, zero_point=zp)
                if isinstance(p, W4A16WgmmaParams):
                    rows = (-(-p.block_k // gs) if gs else 1) * (2 if zp else 1)
                    stage = p.block_m * p.block_k * 2 + p.block_n * p.block_k // 2 + rows * p.block_n * 2
                    assert p.stages * stage <= RING_BYTES, (M, gs, zp, p)
                    assert not zp or not gs or p.block_k <= max(128, 8 * gs), (M, gs, p)


@pytest.mark.parametrize("M,N,K,gs", [(17, 11008, 4096, 32), (512, 11008, 4096, 64)])
def test_default_plan_with_zero_points_at_wide_n_builds(M, N, K, gs):
    """Zero points double the rows a stage stages beside the tiles and take registers a group:
    the default recipe builds and compiles without spills where it once overflowed."""
    k = fs.compile(gemm_w4a16(M, N, K, group_size=gs, zero_point=True, arch="sm_90a"), "sm_90a")
    assert k.spills == 0


@pytest.mark.parametrize("M,N,K,gs,signed,dtype", [(1, 4096, 4096, 128, False, "f16"), (16, 8192, 8192, 128, False, "f16"),
                                                  (24, 11008, 4096, 32, False, "f16"),
                                                  (64, 4096, 4096, 64, True, "bf16"), (4096, 4096, 4096, 32, False, "f16"),
                                                  (7, 1000, 4128, None, False, "bf16"),
                                                  # the small-M plans of wide weights and of K = 11,008
                                                  (1, 28672, 8192, 128, False, "f16"), (16, 22016, 4096, 32, True, "bf16"),
                                                  (1, 4096, 11008, 64, False, "f16")])
def test_every_variant_compiles_without_spills(M, N, K, gs, signed, dtype):
    sched = gemm_w4a16(M, N, K, group_size=gs, signed=signed, dtype=dtype, arch="sm_90a")
    k = fs.compile(sched, "sm_90a")
    assert k.spills == 0
    # the plan's wgmma tiles (above M = 16; at M <= 16 where K is not split, N = K = 8192, or its two
    # K parts add up in a cluster, N = 4096) dequantise into its A fragment
    p = plan(M, N, K, wgmma=True)
    wg = isinstance(p, W4A16WgmmaParams)
    assert wg == (M > 16 or (N, K) in ((8192, 8192), (28672, 8192)) or N == 4096)
    assert (wg and p.cluster_combine) == (N == 4096 and M <= 64)
    assert "lop3.b32" in k.source and ("wgmma.mma_async" if wg else "mma.sync") in k.source


# --------------------------------------------------------------------------- errors

def test_recipe_argument_errors():
    with pytest.raises(ValueError, match="multiple of 32"):
        gemm_w4a16(16, 64, 100, arch="sm_80")
    with pytest.raises(ValueError, match="group_size"):
        gemm_w4a16(16, 64, 128, group_size=16, arch="sm_80")
    with pytest.raises(ValueError, match="dtype"):
        gemm_w4a16(16, 64, 128, dtype="f32", arch="sm_80")
    with pytest.raises(ValueError, match="warp_k"):
        W4A16Params(warp_k=16)
    with pytest.raises(ScheduleError, match="W4A16Params"):
        gemm_w4a16(16, 64, 128, arch="sm_80", params={"block_n": 64})


def _chain(spec, *, scale=True, zero=8, regs=None, pro_on="B"):
    return [tile(m=16, n=32) >> to_blocks(), tile(k=64), move_to_smem("A"), move_to_smem("B"),
            tile(m=16, n=16) >> to_warps(1, 2), move_to_regs("A"), regs or move_to_regs("B"),
            *([prologue(pro_on, ops.group_scale("S", 32, zero=zero))] if scale else []),
            tile(m=16, n=8, k=16) >> done(MMA["f16"])]


def test_a_dequantising_move_needs_a_packing():
    spec = MatMul_u4(16, 32, 64, packing=None)
    sched = spec.schedule(*_chain(spec))
    with pytest.raises(ScheduleError, match="packing"):
        sched.check("sm_80")


def test_a_packing_for_another_consumer_is_refused_naming_both():
    wrong = Packing(32, tuple(range(32)))         # logical order: a word holds k 0..7 of a column
    spec = MatMul_u4(16, 32, 64, packing=wrong)
    sched = spec.schedule(*_chain(spec))
    with pytest.raises(ScheduleError, match=r"does not deliver mma_m16n8k16_f16_f32's b fragment") as e:
        sched.check("sm_80")
    assert "packing_for" in str(e.value)


def test_group_scale_errors():
    spec = MatMul_u4(16, 32, 64)
    with pytest.raises(ScheduleError, match="zero point"):
        spec.schedule(*_chain(spec, zero=3))
    with pytest.raises(ScheduleError, match="dequantises int4 codes"):
        spec.schedule(*_chain(spec, pro_on="A"))
    f16 = fs.MatMul.kernel(16, 32, 64)
    with pytest.raises(ScheduleError, match="prologue op"):
        f16.schedule(tile(m=16, n=32) >> to_blocks(), tile(k=32), fs.strategies.epilogue(ops.group_scale("S")))
    with pytest.raises(ValueError, match="group_size"):
        ops.group_scale("S", 48)
    with pytest.raises(ValueError, match="zero"):
        ops.group_scale("S", 32, zero=16)


def test_move_to_regs_dtype_errors():
    spec = MatMul_u4(16, 32, 64)
    with pytest.raises(ScheduleError, match="dequantise to a 16-bit float"):
        spec.schedule(*_chain(spec, regs=move_to_regs("B", dtype="f32")))
    f16 = fs.MatMul.kernel(16, 32, 64)
    with pytest.raises(ScheduleError, match="only int4 operands"):
        f16.schedule(*_chain(f16, scale=False, regs=move_to_regs("B", dtype="bf16")))
    assert repr(move_to_regs("B", dtype="bf16")) == "move_to_regs('B', dtype='bf16')"


def test_codes_without_scales_are_numbers():
    """No group_scale: the MMA multiplies by the codes' values (u4: 0..15)."""
    spec = MatMul_u4(16, 32, 64)
    sched = spec.schedule(*_chain(spec, scale=False))
    assert_schedule_correct(sched, examples=1)


def MatMul_u4(M, N, K, *, packing="derive", signed=False):
    spec = w4a16_spec(M, N, K, signed=signed)
    if packing != "derive":
        spec = spec.with_operand("B", attrs.evolve(spec.b, tensor=attrs.evolve(spec.b.tensor, packing=packing)))
    return spec


# --------------------------------------------------------------------------- hand-written chains

@st.composite
def chains(draw):
    M = draw(st.integers(1, 40))
    N = draw(st.integers(1, 72))
    K = 32 * draw(st.integers(1, 12))
    gs = draw(st.sampled_from([32, 64, 128, None]))
    signed = draw(st.booleans())
    dtype = draw(st.sampled_from(["f16", "bf16"]))
    bm = draw(st.sampled_from([16, 32]))
    bn = draw(st.sampled_from([8, 16, 32, 64]))
    bk = draw(st.sampled_from([32, 64, 128]))
    wm = draw(st.sampled_from([w for w in (1, 2) if bm % (16 * w) == 0]))
    wn = draw(st.sampled_from([w for w in (1, 2, 4) if bn % (8 * w) == 0]))
    wk = draw(st.sampled_from([k for k in (32, 64, 128) if bk % k == 0]))
    stages = draw(st.sampled_from([1, 2, 3]))
    split = draw(st.sampled_from([1, 2]))
    zeros = draw(st.booleans())
    partials = draw(st.booleans())          # the scales on each group's partial product instead
    # the codes staged in shared memory, or loaded straight from global memory by each warp with
    # the ring (if any) on the block's K loop (A alone) or on the warps' (in registers)
    codes = draw(st.sampled_from(["SH", "GL", "GL ring"]))
    spec = w4a16_spec(M, N, K, dtype=dtype, signed=signed)
    chain = [split_k(split, across=BLOCK)] if split > 1 else []
    chain += [tile(m=bm, n=bn) >> to_blocks(), tile(k=bk), move_to_smem("A")]
    chain += [move_to_smem("B")] if codes == "SH" else []
    chain += [pipeline(stages=stages)] if stages > 1 and codes != "GL ring" else []
    chain += [tile(m=bm // wm, n=bn // wn) >> to_warps(wm, wn), tile(k=wk), move_to_regs("A"), move_to_regs("B"),
              prologue("B", ops.group_scale("S", gs, zeros="Z") if zeros else
                       ops.group_scale("S", gs, zero=0 if signed else 8))]
    chain += [pipeline(stages=stages + 1)] if codes == "GL ring" else []
    chain += [scale_partials()] if partials else []
    chain += [tile(m=16, n=8, k=16) >> done(MMA[dtype])]
    return spec, chain


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_hand_written_chains_are_refused_or_right(case):
    sched = try_schedule(*case, arch="sm_80")
    if sched is not None:
        assert_schedule_correct(sched, examples=1)


# --------------------------------------------------------------------------- planted hazards

def _planted(pred, sched=None, arch="sm_80"):
    """``sched``'s program (by default the sm_80 recipe at a shape whose ring wraps), the same
    program with every leaf statement ``s`` replaced by ``pred(s)`` (True: dropped, False: kept,
    a statement: put instead), and the feed in storage form (codes packed along K, group 64)."""
    from firesched.ir.rewrite import replace_leaves

    if sched is None:
        sched = gemm_w4a16(16, 64, 1024, group_size=64, arch="sm_80")
    (M, K), N = sched.spec.operand("A").tensor.shape, sched.spec.operand("C").tensor.shape[1]
    prog = sched.lower(arch)
    k = prog.kernels[0]

    def swap(s):
        r = pred(s)
        return None if r is True else (s if r is False else r)

    q, s, _ = _weights(K, N, 64, False, "f16")
    pk = sched.spec.operand("B").tensor.packing
    a = np.random.default_rng(1).standard_normal((M, K))
    feed = {"A": a, "B": pk.pack(np.asarray(q).T.astype(np.float64), axis=-1), "S": np.asarray(s, np.float64)}
    bad = attrs.evolve(k, body=replace_leaves(k.body, swap))
    return prog, attrs.evolve(prog, kernels=(bad,) + prog.kernels[1:]), feed


def _found_only_when_planted(pred, sched=None, arch="sm_80", match=None):
    """The program runs clean, and the one ``_planted(pred, ...)`` makes raises ``HazardError``."""
    from firesched.errors import HazardError
    from firesched.simulate import run_program

    good, bad, feed = _planted(pred, sched, arch)
    assert bad != good, "nothing planted"
    run_program(good, dict(feed))
    with pytest.raises(HazardError, match=match):
        run_program(bad, dict(feed))


@pytest.mark.parametrize("what", ["barrier", "cp.async wait"])
def test_planted_hazards_are_found(what):
    """Without the ring's barrier (a stage refilled while read) or its cp.async wait (codes and
    staged scales read in flight) the interpreter reports a hazard; with them it runs clean."""
    from firesched import ir

    pred = {"barrier": lambda s: isinstance(s, ir.Barrier), "cp.async wait": lambda s: isinstance(s, ir.AsyncWait)}[what]
    _found_only_when_planted(pred)


# --------------------------------------------------------------------------- group scales on partial products

WG = W4A16WgmmaParams


@pytest.mark.parametrize("M,N,K,gs,zp,signed,dtype,p", [
    (16, 128, 512, 128, False, False, "f16",        # one copy on each of four consumers sharing K
     WG(block_m=16, block_n=64, block_k=512, stages=2, producer=True, warpgroups_k=4, scale_partials=True)),
    (5, 64, 512, 32, True, True, "bf16",            # eight copies of a 256-k tile, zero points
     WG(block_m=8, block_n=64, block_k=256, stages=2, producer=True, scale_partials=True)),
    (9, 128, 256, 64, False, False, "f16",          # cp.async ring, two consumers along n
     WG(block_m=16, block_n=128, block_k=128, stages=2, scale_partials=True)),
    (3, 64, 384, None, True, False, "f16",          # whole columns, K split over blocks
     WG(block_m=8, block_n=64, block_k=128, stages=2, producer=True, split_k=3, scale_partials=True)),
    (9, 64, 256, 64, False, False, "f16",           # no pipeline: the MatMul retires its own group
     WG(block_m=16, block_n=64, block_k=128, stages=1, scale_partials=True)),
    (5, 72, 512, 32, False, False, "f16",           # mma.sync: a warp's K step of two groups
     W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=4, split_k=2, scale_partials=True)),
    (5, 72, 512, 128, False, True, "bf16",          # mma.sync, codes straight from global memory
     W4A16Params(block_m=16, block_n=64, block_k=256, warps_n=4, warp_k=64, stages=3, direct=True,
                 scale_partials=True)),
])
def test_scale_partials_matches_the_reference(M, N, K, gs, zp, signed, dtype, p):
    """``scale_partials``: the dequantising move leaves code - zero, each group's partial product
    is scaled in f32 and added: interpreted against numpy, both families, every group size."""
    arch = "sm_90a" if isinstance(p, WG) else "sm_80"
    sched = gemm_w4a16(M, N, K, group_size=gs, signed=signed, dtype=dtype, zero_point=zp, arch=arch, params=p)
    text = str(sched)
    assert "on partials" in text and "ScaleAdd" in text and "_groups:RF" in text
    assert_schedule_correct(sched, examples=1, arch=arch)


def test_scale_partials_missing_wait_is_a_hazard():
    """Without the wait before the scaling, ScaleAdd reads partial products a wgmma still owns."""
    from firesched import ir

    sched = gemm_w4a16(16, 128, 512, group_size=64, arch="sm_90a",
                       params=WG(block_m=16, block_n=64, block_k=256, stages=2, producer=True, scale_partials=True))
    _found_only_when_planted(lambda s: isinstance(s, ir.AtomCall) and "partial products are done" in s.comment,
                             sched, "sm_90a", match="before wgmma.wait_group")


def test_scale_partials_errors_and_repr():
    spec = MatMul_u4(16, 32, 64)
    with pytest.raises(ScheduleError, match="no operand of the MatMul is dequantised"):
        spec.schedule(*_chain(spec, scale=False)[:-1], scale_partials())
    with pytest.raises(ScheduleError, match="already multiply partial products"):
        spec.schedule(*_chain(spec)[:-1], scale_partials(), scale_partials())
    with pytest.raises(ScheduleError, match="a warp's or warpgroup's MatMul"):
        spec.schedule(tile(m=16, n=32) >> to_blocks(), scale_partials())
    wide = MatMul_u4(16, 32, 192)
    with pytest.raises(ScheduleError, match="neither holds whole groups of 64"):
        wide.schedule(tile(m=16, n=32) >> to_blocks(), tile(k=96), move_to_smem("A"), move_to_smem("B"),
                      tile(m=16, n=16) >> to_warps(1, 2), move_to_regs("A"), move_to_regs("B"),
                      prologue("B", ops.group_scale("S", 64, zero=8)), scale_partials())
    with pytest.raises(ScheduleError, match="scale_partials"):
        spec.schedule(*_chain(spec, scale=False)[:-1], prologue("B", ops.group_scale("S", 32, zero=8, partials=True)))
    # a split-K part starting at k = 192 makes the K tiles of 128 straddle groups of 128: refused
    # at check() (with the scales on the weights the same schedule is right)
    odd = MatMul_u4(5, 32, 320)
    chain = [split_k(2, across=BLOCK), tile(m=16, n=32) >> to_blocks(), tile(k=128), move_to_smem("A"),
             move_to_smem("B"), tile(m=16, n=16) >> to_warps(1, 2), tile(k=128), move_to_regs("A"), move_to_regs("B"),
             prologue("B", ops.group_scale("S", 128, zero=8))]
    with pytest.raises(ScheduleError, match="span two groups of 128"):
        odd.schedule(*chain, scale_partials(), tile(m=16, n=8, k=16) >> done(MMA["f16"])).check("sm_80")
    assert_schedule_correct(odd.schedule(*chain, tile(m=16, n=8, k=16) >> done(MMA["f16"])), examples=1)
    with pytest.raises(ValueError, match="partials"):
        ops.group_scale("S", 32, partials=1)
    assert eval(repr(scale_partials()), {"scale_partials": scale_partials}) == scale_partials()
    op = ops.group_scale("S", 64, zero=8, partials=True)
    assert eval(repr(op), {"ops": ops}) == op and str(op).endswith("on partials")


# --------------------------------------------------------------------------- per-group zero points

@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("M,N,K,gs", [(5, 72, 256, 32), (17, 40, 512, 128), (3, 24, 1024, None), (9, 71, 96, 32)])
def test_zero_points_per_group(M, N, K, gs, signed):
    """quantize_int4(zero_point=True): codes, scales and zero points per group; the kernel takes
    the zero points as numbers (input Z) and computes (q - z) * s, the difference exact."""
    sched = gemm_w4a16(M, N, K, group_size=gs, signed=signed, zero_point=True, arch="sm_80")
    rng = np.random.default_rng(M + K)
    q, s, z = quantize_int4(rng.standard_normal((K, N)) + 0.7, gs, signed=signed, zero_point=True,
                            scale_dtype="f16")
    a = rng.standard_normal((M, K)).astype(np.float16)
    got = fs.interpret(sched, a, q, s, z.astype(np.float64), target="sm_80").astype(np.float64)
    want = w4a16_reference(a, q, s, z, gs)
    assert np.abs(got - want).max() <= 1e-2 * (1 + np.abs(want).max())
    assert_schedule_correct(sched, examples=1)


def test_zero_point_weights_are_bit_exact():
    K, N, gs = 64, 24, 32
    q, s, z = quantize_int4(np.random.default_rng(5).standard_normal((K, N)) + 1.0, gs, signed=False,
                            zero_point=True, scale_dtype="f16")
    sched = gemm_w4a16(K, N, K, group_size=gs, zero_point=True, arch="sm_80",
                       params=W4A16Params(block_m=16, block_n=32, block_k=64, warps_n=2, warp_k=32, stages=2))
    got = fs.interpret(sched, np.eye(K, dtype=np.float32), q, s, z.astype(np.float64), target="sm_80")
    g = np.arange(K) // gs
    codes = np.asarray(q).astype(np.int64) - np.asarray(z).astype(np.int64)[g]
    exact = (codes * s.astype(np.float64)[g]).astype(np.float16)
    assert np.array_equal(got.astype(np.float16).view(np.uint16), exact.view(np.uint16))


def test_zero_points_argument_errors():
    with pytest.raises(ValueError, match="zeros names"):
        ops.group_scale("S", 32, zero=8, zeros="Z")
    with pytest.raises(ValueError, match="zeros names"):
        ops.group_scale("S", 32, zeros="S")
    with pytest.raises(ValueError, match="zero_point"):
        gemm_w4a16(16, 64, 128, zero_point=1, arch="sm_80")
    spec = MatMul_u4(16, 32, 64)
    with pytest.raises(ScheduleError, match="already used"):
        spec.schedule(*_chain(spec, scale=False), prologue("B", ops.group_scale("S", 32, zeros="A")))
    assert repr(ops.group_scale("S", 64, zeros="Z")) == "ops.group_scale('S', 64, zero=0, zeros='Z')"


# --------------------------------------------------------------------------- bank conflicts

@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (16, 8192, 8192), (17, 1000, 4096), (64, 4096, 4096),
                                   (4096, 4096, 4096), (7, 1000, 4128)])
def test_word_loads_are_free_of_bank_conflicts(M, N, K):
    """The codes' shared tile is swizzled for the word loads that read it (swizzle_for_words): in
    the lowered kernel every warp's word load takes as many wavefronts as its bytes need (128
    bytes a wavefront), evaluated on the load's own address expression, lane by lane."""
    from firesched import ir
    from firesched.ir.expr import evaluate, free_vars
    from firesched.ir.rewrite import walk
    from firesched.lower.synthesis import wavefronts

    prog = gemm_w4a16(M, N, K, arch="sm_90a").lower("sm_90a")
    loads = [s for s in walk([prog.kernels[0].body]) if isinstance(s, ir.AtomCall)
             and s.atom.name.startswith("ld_shared") and "codes" in (s.comment or "")]
    assert loads
    for load in loads:
        src, w = load.arg("src"), load.atom.width
        names = [v.name for v in free_vars(src.offset)]
        for warp in range(2):
            addrs = [int(evaluate(src.offset, {n: (32 * warp + lane if n == "tid" else 1) for n in names})) // 2
                     for lane in range(32)]
            assert wavefronts(addrs, w) == 32 * w // 128, (load.comment, w, addrs[:8])


def test_swizzle_for_words_finds_the_conflicts_auto_leaves():
    """64-byte rows read 8 bytes a lane: without a swizzle two rows of a phase share banks."""
    from firesched.layout import Swizzle
    from firesched.lower.synthesis import lane_reads, swizzle_for_words, wavefronts

    mma = MMA["f16"]
    reads = lane_reads(mma, "b", 2)
    plain = [(r * 128 + k) // 2 for r, k in reads]
    assert wavefronts(plain, 8) == 4
    sw = swizzle_for_words(mma, "b", 2, 64, 128, 4)
    assert sw != Swizzle(0, 0, 0)
    assert wavefronts([sw(r * 128 + k) // 2 for r, k in reads], 8) == 2


# --------------------------------------------------------------------------- the sm_90a wgmma family

WGMMA_SHAPES = [(5, 72, 256, 32), (40, 200, 352, 32), (70, 130, 256, 64), (9, 128, 512, None)]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("M,N,K,gs", WGMMA_SHAPES)
def test_wgmma_family_matches_the_reference(M, N, K, gs, signed, dtype):
    """Cᵀ = dequant(B)ᵀ Aᵀ on wgmma, the weights dequantised by 128 threads into the _rs A
    fragment: weight tiles past N, activation tiles past M, whole-column scales."""
    p = W4A16WgmmaParams(block_m=min(256, -(-M // 8) * 8), block_n=128 if N > 64 else 64,
                         block_k=64 if K % 64 == 0 else 32, stages=3)
    sched = gemm_w4a16(M, N, K, group_size=gs, signed=signed, dtype=dtype, arch="sm_90a", params=p)
    q, s, _ = _weights(K, N, gs, signed, dtype, seed=M + N)
    a = np.random.default_rng(K).standard_normal((M, K)).astype(NP[dtype]).astype(np.float32)
    got = fs.interpret(sched, a, q.astype(np.float64), s.astype(np.float32), target="sm_90a").astype(np.float64)
    want = w4a16_reference(a, q, s, None, gs)
    tol = 1e-2 if dtype == "f16" else 2e-2
    assert np.abs(got - want).max() <= tol * (1 + np.abs(want).max())


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("zero_point", [False, True])
def test_wgmma_dequantised_weights_are_bit_exact(dtype, zero_point):
    """One-hot activation rows: C holds the weights exactly as the A fragment registers held
    them, the f16/bf16 rounding of (code - zero) * scale."""
    K, N, gs = 128, 72, 32
    q, s, z = quantize_int4(np.random.default_rng(5).standard_normal((K, N)) + (1.0 if zero_point else 0), gs,
                            signed=False, zero_point=zero_point, scale_dtype=dtype)
    sched = gemm_w4a16(K, N, K, group_size=gs, dtype=dtype, zero_point=zero_point, arch="sm_90a",
                       params=W4A16WgmmaParams(block_m=64, block_n=64, block_k=64, stages=2))
    extra = (z.astype(np.float64),) if zero_point else ()
    got = fs.interpret(sched, np.eye(K, dtype=np.float32), q.astype(np.float64), s.astype(np.float32), *extra,
                       target="sm_90a")
    g = np.arange(K) // gs
    zero = np.asarray(z).astype(np.int64)[g] if zero_point else 8
    exact = ((np.asarray(q).astype(np.int64) - zero) * s.astype(np.float64)[g]).astype(NP[dtype])
    assert np.array_equal(got.astype(NP[dtype]).view(np.uint16), exact.view(np.uint16))


def test_wgmma_family_splits_k_and_loads_sixteen_bytes():
    p = W4A16WgmmaParams(block_m=16, block_n=64, block_k=128, stages=2, split_k=2)
    sched = gemm_w4a16(9, 100, 1024, group_size=128, arch="sm_90a", params=p)
    src = fs.compile(sched, "sm_90a").source
    assert "ld.shared.v4.b32" in src and "wgmma.mma_async" in src and "lop3.b32" in src
    assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_wgmma_split_k_sums_every_row_of_a_transposed_product():
    """The parts' sum walks C (M x N) in storage order, not the product's roles (N x M): with
    M > N, rows past N were once left unsummed."""
    sched = gemm_w4a16(100, 64, 512, group_size=32, signed=True, dtype="bf16", zero_point=True, arch="sm_90a",
                       params=W4A16WgmmaParams(block_m=128, block_n=64, block_k=32, stages=4, split_k=2))
    assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_wgmma_body_retires_its_group_before_the_next_dequantisation():
    """The wgmma reads its A registers until retired, and the next K tile's dequantisation writes
    them: the K loop waits for the tile's group (wait_group 0), and the interpreter reports the
    hazard when that wait is weakened to keep one group in flight."""
    from firesched import ir

    sched = gemm_w4a16(24, 64, 256, group_size=64, arch="sm_90a",
                       params=W4A16WgmmaParams(block_m=24, block_n=64, block_k=64, stages=2))

    def weaken(s):
        if isinstance(s, ir.AtomCall) and s.atom.name.startswith("wgmma_wait"):
            return attrs.evolve(s, atom=catalog.with_immediates(sm90a.wgmma_wait, n=1))
        return False

    _found_only_when_planted(weaken, sched, "sm_90a", match="wgmma")


def test_wgmma_family_errors():
    with pytest.raises(ValueError, match="block_m"):
        W4A16WgmmaParams(block_m=12)
    with pytest.raises(ValueError, match="block_n"):
        W4A16WgmmaParams(block_n=96)
    with pytest.raises(ValueError, match="block_k"):
        W4A16WgmmaParams(block_k=48)
    with pytest.raises(ScheduleError, match="wgmma"):
        gemm_w4a16(16, 128, 256, arch="sm_80", params=W4A16WgmmaParams(block_m=16))
    # a warpgroup loads register fragments only by dequantising codes
    spec = fs.spec.MatMul.kernel(64, 64, 64, a="f16", b="f16", c="f16", layout="RC")
    with pytest.raises(ScheduleError, match="warpgroup"):
        spec.schedule(tile(m=64, n=64) >> to_blocks(), tile(k=64), move_to_smem("A"), move_to_smem("B"),
                      tile(m=64) >> to_warpgroups(), move_to_regs("A"))


@st.composite
def wgmma_chains(draw):
    M = draw(st.integers(1, 90))
    N = draw(st.integers(1, 140))
    K = 32 * draw(st.integers(1, 10))
    gs = draw(st.sampled_from([32, 64, 128, None]))
    signed = draw(st.booleans())
    dtype = draw(st.sampled_from(["f16", "bf16"]))
    bm = draw(st.sampled_from([8, 16, 24, 40]))
    bn = draw(st.sampled_from([64, 128]))
    bk = draw(st.sampled_from([32, 64, 128]))
    stages = draw(st.sampled_from([1, 2, 3]))
    words = draw(st.sampled_from([1, 2, 4]))
    split = draw(st.sampled_from([1, 1, 2]))
    parts = draw(st.sampled_from([1, 1, 2, 4]))        # consumer warpgroups sharing each K tile
    partials = draw(st.booleans())                     # the scales on each group's partial product
    atom = sm90a.wgmma_atom(bm, dtype, a_in_registers=True)
    spec = wgmma_spec(M, N, K, dtype=dtype, signed=signed, block_m=bm, words=words)
    chain = [split_k(split, across=BLOCK)] if split > 1 else []
    chain += [tile(m=bm, n=bn) >> to_blocks(), tile(k=bk), move_to_smem("B"), move_to_smem("A")]
    chain += [pipeline(stages=stages)] if stages > 1 else []
    chain += [split_k(parts, across=WARPGROUP)] if parts > 1 else []
    chain += [tile(n=64) >> to_warpgroups(), move_to_regs("B"),
              prologue("B", ops.group_scale("S", gs, zero=0 if signed else 8)),
              *([scale_partials()] if partials else []), tile(k=16) >> done(atom)]
    return spec, chain


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wgmma_chains())
def test_hand_written_wgmma_chains_are_refused_or_right(case):
    """A user's own chain over the wgmma spec (any tile sizes, packings of 1, 2 or 4 words a load
    that may not divide the K tile, no pipeline): refused at check(), or right."""
    sched = try_schedule(*case, arch="sm_90a")
    if sched is not None:
        assert_schedule_correct(sched, examples=1, arch="sm_90a")


@st.composite
def wgmma_producer_chains(draw):
    """A user's own warp-specialized chain: TMA loads of the codes (as bytes) and activations into
    a ring, K split over blocks (a second launch or the fix-up) and over consumer warpgroups,
    ping-pong between two column groups, K tiles of 64 to 512 that may not divide a block's part,
    the group scales on the weights or on each group's partial product."""
    M, N, K = draw(st.integers(1, 90)), draw(st.integers(1, 140)), 32 * draw(st.integers(1, 40))
    gs = draw(st.sampled_from([32, 64, 128, None]))
    signed = draw(st.booleans())
    dtype = draw(st.sampled_from(["f16", "bf16"]))
    bm, bn = draw(st.sampled_from([8, 16, 24, 40])), draw(st.sampled_from([64, 128]))
    bk, stages = draw(st.sampled_from([64, 128, 256, 512])), draw(st.sampled_from([2, 3, 4]))
    words, split, parts = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2]))
    pingpong = draw(st.booleans()) and parts * bn >= 128
    partials = draw(st.booleans())
    tma = (sm90a.tma_load_2d,)
    chain = [split_k(split, across=BLOCK, combine=draw(st.sampled_from(["launch", "fixup"])))] if split > 1 else []
    chain += [tile(m=bm, n=bn) >> to_blocks(), tile(k=bk), move_to_smem("B", swizzle=Swizzle(0, 0, 0), via=tma),
              move_to_smem("A", via=tma), pipeline(stages=stages),
              warp_specialize(producer_regs=40, pingpong=pingpong, consumer_regs=232 if parts * bn <= 128 else 152)]
    chain += [split_k(parts, across=WARPGROUP)] if parts > 1 else []
    chain += [tile(n=64) >> to_warpgroups(), move_to_regs("B"),
              prologue("B", ops.group_scale("S", gs, zero=0 if signed else 8)), *([scale_partials()] if partials else []),
              tile(k=16) >> done(sm90a.wgmma_atom(bm, dtype, a_in_registers=True))]
    return wgmma_spec(M, N, K, dtype=dtype, signed=signed, block_m=bm, words=words), chain


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wgmma_producer_chains())
def test_hand_written_producer_chains_are_refused_or_right(case):
    """Refused at check() (a TMA box reaching into the next block's part, a packing block cut by
    K, shared memory or registers over budget), or hazard-free and right."""
    sched = try_schedule(*case, arch="sm_90a")
    if sched is not None:
        assert_schedule_correct(sched, examples=1, arch="sm_90a")


# --------------------------------------------------------------------------- wgmma with a producer warpgroup

@pytest.mark.parametrize("pingpong", [False, True])
@pytest.mark.parametrize("M,N,K,gs,signed,dtype,zero_point", [
    (40, 200, 512, 64, False, "f16", False),
    (100, 130, 1024, 32, True, "bf16", True),
    (9, 192, 256, None, False, "f16", False),
])
def test_wgmma_producer_matches_the_reference(M, N, K, gs, signed, dtype, zero_point, pingpong):
    """A producer warpgroup loads the codes (as bytes) and the activations by TMA; the consumers
    dequantise from the ring's stages, taking turns with ``pingpong``."""
    p = W4A16WgmmaParams(block_m=min(128, -(-M // 8) * 8), block_n=128 if N > 128 else 64, block_k=128 if K >= 256 else 64,
                         stages=3, producer=True, pingpong=pingpong and N > 128)
    sched = gemm_w4a16(M, N, K, group_size=gs, signed=signed, dtype=dtype, zero_point=zero_point, arch="sm_90a",
                       params=p)
    _interprets_like_numpy(sched, M, N, K, gs, signed, dtype, zero_point, M, 0.05 if zero_point else 0)
    src = fs.compile(sched, "sm_90a").source
    assert "cp.async.bulk.tensor.2d" in src and "setmaxnreg" in src and "cp.async.cg" not in src


@pytest.mark.parametrize("M,N,K,gs,signed,dtype,zero_point,bk,split,bn", [
    (3, 72, 1536, None, True, "bf16", False, 512, 1, 64), (37, 100, 1024, 64, False, "f16", True, 256, 2, 64),
    (17, 200, 2048, 32, False, "f16", False, 512, 1, 128)])
def test_small_m_wgmma_tiles_match_the_reference(M, N, K, gs, signed, dtype, zero_point, bk, split, bn):
    """The plan's small-M wgmma tiles: 64 weight columns on one consumer warpgroup (128 on two,
    as the plan takes at wide N) and 256 or 512 k a stage (each stage's scale rows: 1 to 16
    groups), M and N not multiples of the tile, K split or not, against numpy; more K tiles than
    the ring has stages where K allows, so a stage is refilled after its reader released it."""
    p = W4A16WgmmaParams(block_m=-(-M // 8) * 8 if M <= 32 else 40, block_n=bn, block_k=bk,
                         stages=(2 if bn == 64 else 3) if K // split // bk > 2 else 4, split_k=split, producer=True)
    sched = gemm_w4a16(M, N, K, group_size=gs, signed=signed, dtype=dtype, zero_point=zero_point, arch="sm_90a",
                       params=p)
    _interprets_like_numpy(sched, M, N, K, gs, signed, dtype, zero_point, M + N)
    assert fs.compile(sched, "sm_90a").spills == 0


def _interprets_like_numpy(sched, M, N, K, gs, signed, dtype, zero_point, seed, shift=0.0):
    """``sched`` interpreted on sm_90a on random weights (quantised with ``seed``, shifted by
    ``shift``) and activations, against the dequantise-then-matmul reference."""
    q, s, z = quantize_int4(np.random.default_rng(seed).standard_normal((K, N)) * 0.1 + shift, gs, signed=signed,
                            zero_point=zero_point, scale_dtype=dtype)
    a = np.random.default_rng(K).standard_normal((M, K)).astype(NP[dtype]).astype(np.float32)
    extra = (z.astype(np.float64),) if zero_point else ()
    got = fs.interpret(sched, a, q.astype(np.float64), s.astype(np.float32), *extra, target="sm_90a")
    want = w4a16_reference(a, q, s, z, gs)
    tol = 1e-2 if dtype == "f16" else 2e-2
    assert np.abs(got.astype(np.float64) - want).max() <= tol * (1 + np.abs(want).max())


def test_default_plan_above_256_rows_matches_the_reference():
    """The default schedule of a 257-row problem (the plan's producer tiles, 128 rows: three
    blocks of rows, the last holding one; 72 of the block's 128 weight columns) against numpy;
    five 128-k tiles on the 4-stage ring, so the producer refills a stage the consumers released."""
    M, N, K = 257, 72, 640
    assert plan(M, N, K, wgmma=True).block_k == 128
    sched = gemm_w4a16(M, N, K, group_size=32, arch="sm_90a")
    q, s, _ = quantize_int4(np.random.default_rng(1).standard_normal((K, N)) * 0.1, 32, signed=False,
                            scale_dtype="f16")
    a = np.random.default_rng(2).standard_normal((M, K)).astype(np.float16).astype(np.float32)
    got = fs.interpret(sched, a, q.astype(np.float64), s.astype(np.float32), target="sm_90a")
    want = w4a16_reference(a, q, s, None, 32)
    assert np.abs(got.astype(np.float64) - want).max() <= 1e-2 * (1 + np.abs(want).max())
    assert "setmaxnreg" in fs.compile(sched, "sm_90a").source


@pytest.mark.parametrize("producer", [False, True])
def test_wgmma_issues_as_the_fragment_fills(producer):
    """Within a K tile a warpgroup's wgmmas issue as their k16 slices are dequantised, not after
    the whole fragment (``transforms.interleave``): a wgmma precedes the tile's last conversion.
    Each batch needs its fence: without them the interpreter finds a wgmma reading registers the
    dequantisation wrote after the last fence."""
    from firesched import ir

    sched = gemm_w4a16(24, 64, 512, group_size=64, arch="sm_90a",
                       params=W4A16WgmmaParams(block_m=24, block_n=64, block_k=128, stages=2, producer=producer))
    src = fs.compile(sched, "sm_90a").source
    loop = src[src.index("K loop"):]
    loop = loop[:loop.index("wgmma.wait_group")]
    assert loop.index("wgmma.mma_async") < loop.rindex("lop3.b32")
    _found_only_when_planted(lambda s: isinstance(s, ir.AtomCall) and "slices of the fragment are ready" in s.comment,
                             sched, "sm_90a", match="missing wgmma.fence")


def test_wgmma_producer_stage_is_released_after_every_reader():
    """The consumers read the codes with their own loads (not only through wgmma), so a stage goes
    back to the producer only once all 128 threads of each warpgroup are past them: every thread
    arrives on the stage's empty barrier, which counts them all.  Counting one arrival a
    warpgroup instead (as a ring read only by wgmma does), the interpreter finds the producer's
    refill racing the reads of the threads that have not arrived yet."""
    from firesched import ir

    sched = gemm_w4a16(24, 64, 512, group_size=64, arch="sm_90a",
                       params=W4A16WgmmaParams(block_m=24, block_n=64, block_k=64, stages=2, producer=True))

    def one_per_warpgroup(s):
        if not isinstance(s, ir.AtomCall) or s.atom.name not in ("mbarrier_init", "mbarrier_arrive") or \
                s.arg("bar").buffer.name != "empty":
            return False
        if s.atom.name == "mbarrier_arrive":
            return ir.If(ir.expr.lt(ir.role_tid(128) % 128, 1), s)      # the warpgroup's first thread
        assert s.arg("count").value == 128
        return attrs.evolve(s, args=tuple((n, ir.Scalar(1)) if n == "count" else (n, a) for n, a in s.args))

    _found_only_when_planted(one_per_warpgroup, sched, "sm_90a", match="race")


@pytest.mark.parametrize("M,N,K,gs,signed,dtype,zero_point,bk,parts,producer,bn", [
    (5, 100, 2048, 32, False, "f16", False, 512, 2, True, 64),
    (16, 130, 1024, 64, True, "bf16", True, 256, 2, True, 128),
    (3, 64, 1536, None, False, "f16", False, 512, 4, True, 64),
    (9, 72, 1024, 128, False, "f16", False, 256, 2, False, 64)])
def test_consumers_sharing_a_k_tile_match_the_reference(M, N, K, gs, signed, dtype, zero_point, bk, parts, producer,
                                                        bn):
    """``W4A16WgmmaParams(warpgroups_k=...)``: ``split_k(..., across=WARPGROUP)``, each consumer
    warpgroup dequantising ``bk / parts`` of every stage; more K tiles than stages, so a stage is
    refilled only after every part released it; odd M and N, zero points, two column groups of
    two parts each (four consumers), and the same without a producer.  The parts meet behind the
    consumers' own named barrier (a block barrier would wait for the producer too: the interpreter
    reports it as divergent)."""
    p = W4A16WgmmaParams(block_m=-(-M // 8) * 8, block_n=bn, block_k=bk, stages=2, producer=producer, warpgroups_k=parts)
    sched = gemm_w4a16(M, N, K, group_size=gs, signed=signed, dtype=dtype, zero_point=zero_point, arch="sm_90a",
                       params=p)
    assert f"split_k({parts}, across=warpgroup)" in str(sched)
    _interprets_like_numpy(sched, M, N, K, gs, signed, dtype, zero_point, M + N, 0.05 if zero_point else 0)
    k = fs.compile(sched, "sm_90a")
    assert k.spills == 0
    consumers = parts * bn // 64
    assert ('"n"(15), "n"(%d)' % (128 * consumers) in k.source) == producer


@pytest.mark.parametrize("plant", ["dropped", "block-wide"])
def test_consumers_sharing_a_k_tile_planted_barriers(plant):
    """The barrier between the parts' partial sums in shared memory and part 0's reads: dropped,
    part 0 reads them before they are written (a race); as a block-wide __syncthreads inside the
    consumers' role it waits for the producer, which never comes (divergent)."""
    from firesched import ir

    sched = gemm_w4a16(5, 64, 512, group_size=64, arch="sm_90a",
                       params=W4A16WgmmaParams(block_m=8, block_n=64, block_k=128, stages=2, producer=True,
                                               warpgroups_k=2))

    def partials(s):
        if not (isinstance(s, ir.Barrier) and s.comment == "partials written"):
            return False
        return True if plant == "dropped" else ir.Barrier(s.comment)

    _found_only_when_planted(partials, sched, "sm_90a", match="race" if plant == "dropped" else "divergent")


@pytest.mark.parametrize("bn, parts, pingpong", [(192, 2, False), (128, 2, True)])
def test_many_consumers_sharing_k_tiles(bn, parts, pingpong):
    """Six consumer warpgroups (three column groups of two parts), and four taking turns to issue
    (ping-pong) while pairs of them share each K tile: right, and free of hazards."""
    p = W4A16WgmmaParams(block_m=16, block_n=bn, block_k=512, stages=2, producer=True, pingpong=pingpong,
                         warpgroups_k=parts)
    sched = gemm_w4a16(5, 200, 2048, group_size=64, arch="sm_90a", params=p)
    _interprets_like_numpy(sched, 5, 200, 2048, 64, False, "f16", False, 1)


def test_consumers_sharing_a_k_tile_errors():
    with pytest.raises(ValueError, match="each a multiple of 32 k"):
        W4A16WgmmaParams(block_k=64, warpgroups_k=4)
    with pytest.raises(ValueError, match="positive int"):
        W4A16WgmmaParams(warpgroups_k=0)
    # eight consumer warpgroups and the producer: more threads than a block has
    with pytest.raises(ScheduleError, match="1152 threads per block"):
        gemm_w4a16(16, 1024, 4096, arch="sm_90a",
                   params=W4A16WgmmaParams(block_m=16, block_n=128, block_k=512, stages=2, producer=True,
                                           warpgroups_k=4))


def test_wgmma_producer_errors():
    with pytest.raises(ValueError, match="pingpong"):
        W4A16WgmmaParams(pingpong=True)
    with pytest.raises(ValueError, match="producer"):
        W4A16WgmmaParams(producer=1)
    # int4 codes travel by TMA unswizzled, in rows of whole 16-byte units
    spec = wgmma_spec(64, 128, 256, block_m=64, words=2)
    tma = (sm90a.tma_load_2d,)
    chain = [tile(m=64, n=128) >> to_blocks(), tile(k=64), move_to_smem("B", via=tma), move_to_smem("A", via=tma),
             pipeline(stages=2), tile(n=64) >> to_warpgroups(), move_to_regs("B"),
             tile(k=16) >> done(sm90a.wgmma_atom(64, "f16", a_in_registers=True))]
    with pytest.raises(ScheduleError, match="unswizzled"):
        spec.schedule(*chain).check("sm_90a")


# --------------------------------------------------------------------------- stream-K instead of split-K

@pytest.mark.parametrize("M,N,K,gs,parts,signed,dtype", [
    (5, 200, 1024, 128, 6, False, "f16"),     # chunks of 192 k: they start inside groups of 128
    (1, 72, 512, 32, 3, True, "bf16"),
    (16, 100, 2048, None, 4, False, "f16"),
])
def test_stream_k_adds_the_partial_tiles_in_one_launch(M, N, K, gs, parts, signed, dtype):
    """``W4A16Params(stream_k=...)``: the K chunks of every tile spread over a persistent grid and
    combined in the kernel — one launch, where split_k needs a second."""
    p = W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=3, stream_k=parts)
    sched = gemm_w4a16(M, N, K, group_size=gs, signed=signed, dtype=dtype, arch="sm_90a", params=p)
    assert len(sched.lower("sm_90a").kernels) == 1
    q, s, _ = _weights(K, N, gs, signed, dtype, seed=parts)
    a = np.random.default_rng(K).standard_normal((M, K)).astype(NP[dtype]).astype(np.float32)
    got = fs.interpret(sched, a, q.astype(np.float64), s.astype(np.float32), target="sm_90a").astype(np.float64)
    want = w4a16_reference(a, q, s, None, gs)
    tol = 1e-2 if dtype == "f16" else 2e-2
    assert np.abs(got - want).max() <= tol * (1 + np.abs(want).max())
    with pytest.raises(ValueError, match="choose one"):
        W4A16Params(split_k=2, stream_k=2)


# --------------------------------------------------------------------------- scales staged by TMA

def _producer_sched(group_size=64):
    return gemm_w4a16(72, 136, 1024, group_size=group_size, arch="sm_90a",
                      params=W4A16WgmmaParams(block_m=64, block_n=128, block_k=128, stages=3, producer=True))


def test_producer_ring_stages_the_group_scales():
    """A TMA ring stages each K tile's group scales (transforms.staged_scales): one more box a
    stage, its bytes announced with the tiles' on the stage's full mbarrier, and the consumers
    read them from shared memory instead of global memory."""
    from firesched import ir
    from firesched.ir.rewrite import walk

    k = _producer_sched().lower("sm_90a").kernels[0]
    calls = [s for s in walk([k.body]) if isinstance(s, ir.AtomCall)]
    assert "S_smem" in {b.name for b in k.shared}
    boxes = [c for c in calls if c.atom.name == "tma_load_2d" and c.comment.startswith("S rows")]
    assert len(boxes) == 1
    assert not [c for c in calls if c.atom.name.startswith("ld_global") and "S[" in (c.comment or "")]
    expect = {c.arg("bytes").value for c in calls if c.atom.name == "mbarrier_arrive_expect_tx"}
    # a stage: 64 rows x 128 k of activations, 128 columns x 128 codes, 2 rows x 128 scales
    assert expect == {64 * 128 * 2 + 128 * 128 // 2 + 2 * 128 * 2}


@pytest.mark.parametrize("params", [
    W4A16WgmmaParams(block_m=64, block_n=64, block_k=256, stages=4, split_k=2, producer=True, cluster_combine=True),
    W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=4, split_k=4, cluster_combine=True),
    W4A16Params(block_m=16, block_n=64, block_k=128, warps_n=4, warp_k=64, stages=4, stream_k=4),
], ids=["cluster-wgmma", "cluster-mma", "stream-k"])
def test_parts_of_k_on_whole_groups_stage_their_scales(params):
    """K parts whose origin is a cluster rank (``bid_x % 2 * 2048``) or a stream-K chunk start
    begin on whole groups: their rings stage the scales like the plain split's (they read them
    from global memory in the dequantisation while their origin's alignment was not known)."""
    from firesched import ir
    from firesched.ir.rewrite import walk
    from firesched.lower.transforms.staged_scales import _alignment

    assert _alignment(ir.expr.mul(ir.expr.mod(ir.expr.Var("bid_x", 264), 2), 2048), 256) == 256
    assert _alignment(ir.expr.add(ir.expr.mul(ir.expr.Var("t", 9), 96), 64), 256) == 32
    k = gemm_w4a16(16, 4096, 4096, group_size=128, arch="sm_90a", params=params).lower("sm_90a").kernels[0]
    assert "S_smem" in {b.name for b in k.shared}
    loads = [s for s in walk([k.body]) if isinstance(s, ir.AtomCall) and s.atom.name.startswith("ld_global")
             and any(isinstance(a, ir.MemRef) and a.buffer.name == "S" for _, a in s.args)]
    assert not loads


def test_scales_missing_from_the_stage_bytes_are_found():
    """Announcing only the tiles' bytes lets a stage complete before its scales land: the
    interpreter reports the consumers' read of them in flight (or the excess bytes)."""
    from firesched import ir

    def pred(s):
        if isinstance(s, ir.AtomCall) and s.atom.name == "mbarrier_arrive_expect_tx":
            return attrs.evolve(s, args=tuple((n, ir.Scalar(a.value - 2 * 128 * 2)) if n == "bytes" else (n, a)
                                              for n, a in s.args))
        return False

    _found_only_when_planted(pred, _producer_sched(), "sm_90a")


def test_a_split_k_part_inside_a_packing_block_is_refused():
    """Codes are packed in blocks of 32 x words k (a word holds k 8 apart): a split-K part of 64 k
    under a 128-k packing would read the other part's codes.  check() refuses it."""
    spec = wgmma_spec(1, 64, 128, words=4, block_m=8)
    chain = [split_k(2, across=BLOCK), tile(m=8, n=64) >> to_blocks(), tile(k=128), move_to_smem("B"),
             move_to_smem("A"), tile(n=64) >> to_warpgroups(), move_to_regs("B"),
             prologue("B", ops.group_scale("S", 32, zero=8)),
             tile(k=16) >> done(sm90a.wgmma_atom(8, "f16", a_in_registers=True))]
    with pytest.raises(ScheduleError, match="packing's 128-k blocks"):
        spec.schedule(*chain).check("sm_90a")
    spec2 = wgmma_spec(1, 64, 256, words=4, block_m=8)
    assert_schedule_correct(spec2.schedule(*chain), examples=1, arch="sm_90a")


def test_transposed_stores_swap_rows_between_lanes():
    """wgmma's D and mma.sync's C fragments hold rows r and r + 1 of a column in lanes l and
    l ^ 4 (accumulators.row_partner): a Cᵀ store swaps one value with the partner lane and stores
    two elements along C's rows at once."""
    from firesched import ir
    from firesched.ir.rewrite import walk
    from firesched.lower.rules.accumulators import row_partner

    assert row_partner(sm90a.wgmma_atom(64, "f16").operand("d").tv) == 4
    assert row_partner(MMA["f16"].operand("c").tv) == 4
    k = gemm_w4a16(300, 4096, 4096, arch="sm_90a").lower("sm_90a").kernels[0]
    names = [s.atom.name for s in walk([k.body]) if isinstance(s, ir.AtomCall)]
    assert names.count("shfl_sync_bfly_b32") == names.count("st_global_4") > 0
    assert "st_global_2" not in names


# --------------------------------------------------------------------------- codes from global memory

DIRECT = [
    # M, N, K, group, params: split over blocks, odd N, a K part the ring covers in fewer steps than
    # it has slots, warps sharing the K part, a block K loop of two tiles (the ring filled twice)
    (16, 64, 1024, 128, W4A16Params(block_n=64, warps_n=4, block_k=512, warp_k=128, stages=8, split_k=2,
                                    direct=True)),
    (5, 72, 512, 32, W4A16Params(block_n=64, warps_n=4, block_k=512, warp_k=64, stages=3, direct=True)),
    (3, 40, 768, 64, W4A16Params(block_n=16, warps_n=2, block_k=768, warp_k=128, warps_k=2, stages=3,
                                 direct=True)),
    (1, 200, 1024, None, W4A16Params(block_n=32, warps_n=2, block_k=256, warp_k=64, stages=4, split_k=2,
                                     direct=True)),
]


@pytest.mark.parametrize("M,N,K,gs,p", DIRECT)
@pytest.mark.parametrize("kw", [{}, {"dtype": "bf16", "signed": True}, {"zero_point": True}])
def test_codes_straight_from_global_memory(M, N, K, gs, p, kw):
    """``direct=True``: no shared tile of codes; each warp's words come from global memory on a
    ring of register slots, right on odd shapes, every group size, signed codes and zero points."""
    sched = gemm_w4a16(M, N, K, group_size=gs, arch="sm_80", params=p, **kw)
    src = fs.compile(sched, "sm_80").source
    assert "B_smem" not in src and "B codes, from global memory" in src and "register slots" in src
    assert_schedule_correct(sched, examples=1)


def test_the_register_ring_starts_beside_the_activations():
    """Where the ring runs once per block, its first loads follow the commit of the activations'
    copies and come before their wait: both in flight together; each step loads the slot
    ``stages - 1`` ahead of the one it reads."""
    p = W4A16Params(block_n=64, warps_n=4, block_k=1024, warp_k=128, stages=8, split_k=4, direct=True)
    src = fs.compile(gemm_w4a16(16, 4096, 4096, arch="sm_90a", params=p), "sm_90a").source
    commit, ring, wait = (src.index(t) for t in ("cp.async.commit_group", "register slots; steps 0 .. 6",
                                                 "cp.async.wait_group"))
    assert commit < ring < wait
    assert "B_codes_ring[(k1 + 7) % 8 * 32" in src and "B_codes_ring[k1 * 32" in src      # k1 < 8: k1 % 8 = k1
    # a block K loop of several tiles fills the ring again in each: its loads stay in the loop
    p2 = attrs.evolve(p, block_k=512)
    src2 = fs.compile(gemm_w4a16(16, 4096, 4096, arch="sm_90a", params=p2), "sm_90a").source
    assert src2.index("cp.async.wait_group") < src2.index("register slots; steps 0 .. 3")


def test_register_ring_refusals():
    spec = w4a16_spec(16, 64, 256)
    head = [tile(m=16, n=64) >> to_blocks(), tile(k=256), move_to_smem("A"), tile(m=16, n=16) >> to_warps(1, 4),
            tile(k=64), move_to_regs("A"), move_to_regs("B"), prologue("B", ops.group_scale("S", 128, zero=8))]
    with pytest.raises(ScheduleError, match="overlap and separate are for rings of shared memory"):
        spec.schedule(*head, pipeline(stages=2, overlap=True))
    # only int4 codes are loaded into fragments from global memory; f16 operands come by ldmatrix
    f16 = fs.MatMul.kernel(16, 64, 256, a="f16", b="f16", c="f16")
    with pytest.raises(ScheduleError, match="int4 codes in SH or GL"):
        f16.schedule(tile(m=16, n=64) >> to_blocks(), tile(k=64), move_to_smem("B"),
                     tile(m=16, n=16) >> to_warps(1, 4), move_to_regs("A"))
    # a loop whose moves are all from shared memory has nothing for pipeline() to put in flight
    with pytest.raises(ScheduleError, match="moves nothing from global to shared memory"):
        f16.schedule(tile(m=16, n=64) >> to_blocks(), move_to_smem("A"), move_to_smem("B"),
                     tile(m=16, n=16) >> to_warps(1, 4), tile(k=64), move_to_regs("A"), move_to_regs("B"),
                     pipeline(stages=2))
