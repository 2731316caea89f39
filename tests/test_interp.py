"""The CPU interpreter: every catalog atom through its one-atom kernel, and hand-written IR."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firesched import dtypes as dt
from firesched import ir
from firesched.hardware.atoms import base as atoms
from firesched.hardware.atoms import catalog, sm70, sm80
from firesched.ir.expr import Var, binop, ge, land, lt, select
from firesched.simulate.interp import describe, run_program
from firesched.testing.microkernel import UNDER_TEST, atom_program, random_inputs

INTERPRETED = [a for a in catalog.ALL_ATOMS if a.family != atoms.SYNC]


def call(atom, pred=1, comment="", **args):
    return ir.AtomCall(atom, tuple(args.items()), pred, comment)


def gbuf(name, d, shape, role="in", strides=None):
    shape = tuple(shape)
    if strides is None:
        strides, acc = [], 1
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
    return ir.GlobalBuffer(name, d, shape, tuple(strides), role)


def program(body, params, *, threads=32, grid=(1, 1, 1), shared=(), regs=(), inputs=None, output=None,
            name="k"):
    k = ir.Kernel(name, params, grid, threads, shared, regs, ir.Seq(body))
    ins = tuple(p for p in params if p.role == "in") if inputs is None else inputs
    out = output if output is not None else next(p for p in params if p.role == "out")
    return ir.Program((k,), ins, out)


# --------------------------------------------------------------------------- every atom

@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in INTERPRETED])
def test_atom_microkernel(atom):
    prog, inputs, expected = atom_program(atom)
    for seed in (0, 1):
        inputs = random_inputs(atom, seed)
        got = run_program(prog, inputs)["out"]
        want = expected(inputs)
        assert got.shape == want.shape and got.dtype == want.dtype
        if atom.family == atoms.MMA:
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(got, want)
    calls = [s for s in prog.kernels[0].body.body if isinstance(s, ir.AtomCall) and s.comment == UNDER_TEST]
    assert [c.atom.name for c in calls] == [atom.name]


@pytest.mark.parametrize("atom,dtype", [
    (sm70.ld_global_16, dt.f32), (sm70.ld_global_16, dt.i8), (sm70.st_shared_16, dt.bf16),
    (sm70.ld_shared_8, dt.f32), (sm70.st_global_2, dt.u8), (sm80.cp_async_16, dt.f32),
    (sm80.cp_async_8, dt.i8), (sm80.ldmatrix_x4, dt.bf16), (sm80.ldmatrix_x2_trans, dt.bf16),
    (sm70.shfl_sync_idx_b32, dt.i32), (sm70.bar_sync, dt.f16), (sm80.cp_async_commit, dt.f16),
    (sm80.cp_async_wait, dt.f16),
], ids=lambda x: getattr(x, "name", None) or str(x))
def test_atom_microkernel_dtypes(atom, dtype):
    prog, _, expected = atom_program(atom, dtype)
    inputs = random_inputs(atom, 3, dtype)
    np.testing.assert_array_equal(run_program(prog, inputs)["out"], expected(inputs))


def test_mma_expected_is_a_matmul():
    for atom in (sm80.mma_m16n8k16_f16_f32, sm70.mma_m8n8k4_f16_f32):
        _, inputs, expected = atom_program(atom)
        ref = np.einsum("gmk,gkn->gmn", inputs["a"].astype(np.float64), inputs["b"].astype(np.float64))
        np.testing.assert_allclose(expected(inputs), ref + inputs["c"], rtol=1e-6)


def test_ldmatrix_x4_fragment_of_lane_5():
    # PTX: lane l gets elements (l//4, 2*(l%4)+{0,1}) of matrices 0..3 (rows 8*(i%2), cols 8*(i//2)).
    prog, inputs, _ = atom_program(sm80.ldmatrix_x4)
    tile, out = inputs["tile"], run_program(prog, inputs)["out"]
    r, c = 5 // 4, 2 * (5 % 4)
    want = [tile[r, c], tile[r, c + 1], tile[r + 8, c], tile[r + 8, c + 1],
            tile[r, c + 8], tile[r, c + 9], tile[r + 8, c + 8], tile[r + 8, c + 9]]
    np.testing.assert_array_equal(out[5], want)


# --------------------------------------------------------------------------- hand-written IR

def test_block_copy_gl_sh_gl_transposes_tiles_of_a_strided_matrix():
    """Each block stages a 16x16 tile of a padded (pitch 40) matrix in shared memory and writes
    it back transposed; 4x2 blocks, 32 threads, 8 elements per thread."""
    T = 32
    t = ir.tid(T)
    bx, by = ir.bid(0, 4), ir.bid(1, 2)
    src = gbuf("src", dt.f16, (32, 64), strides=(72, 1))
    dst = gbuf("dst", dt.f16, (64, 32), "out")
    sh = ir.SharedBuffer("tile", dt.f16, 16 * 24)      # pitch 24
    r = ir.RegBuffer("r", dt.f16, 8)
    col = ir.RegBuffer("col", dt.f16, 1)
    row, half = t // 2, t % 2
    i = Var("i", 8)
    body = [
        call(sm70.ld_global_16, src=ir.MemRef(src, (by * 16 + row) * 72 + bx * 16 + half * 8), dst=ir.RegRef(r, 0)),
        call(sm70.st_shared_16, dst=ir.MemRef(sh, row * 24 + half * 8), src=ir.RegRef(r, 0)),
        ir.Barrier("tile stored"),
        # thread t now gathers column `row` of the tile (8 rows starting at half*8), one element at a time
        ir.For(i, 8, ir.Seq([
            call(sm70.ld_shared_2, src=ir.MemRef(sh, (half * 8 + i) * 24 + row), dst=ir.RegRef(col, 0)),
            call(sm70.st_global_2, dst=ir.MemRef(dst, (bx * 16 + row) * 32 + by * 16 + half * 8 + i),
                 src=ir.RegRef(col, 0)),
        ])),
    ]
    prog = program(body, (src, dst), threads=T, grid=(4, 2, 1), shared=(sh,), regs=(r, col))
    a = (np.arange(32 * 64) % 1000).astype(np.float16).reshape(32, 64)
    out = run_program(prog, {"src": a})
    np.testing.assert_array_equal(out["dst"], a.T)
    np.testing.assert_array_equal(out["src"], a)


def test_predicated_loads_zero_fill_and_predicated_stores_write_nothing():
    T = 32
    t = ir.tid(T)
    x = gbuf("x", dt.f32, (T, 4))
    y = gbuf("y", dt.f32, (T, 4), "out")
    z = gbuf("z", dt.f32, (T, 4), "workspace")
    sh = ir.SharedBuffer("s", dt.f32, T * 4)
    r = ir.RegBuffer("r", dt.f32, 4)
    body = [
        ir.RegFill(ir.RegRef(r, 0), 4, 7.0),
        # threads >= 20 do not load: their registers become zeros (and the wild address is never read)
        call(sm70.ld_global_16, pred=lt(t, 20), src=ir.MemRef(x, select(lt(t, 20), t * 4, 10**6)),
             dst=ir.RegRef(r, 0)),
        # odd threads do not store: y keeps what it had
        call(sm70.st_global_16, pred=t % 2, dst=ir.MemRef(y, t * 4), src=ir.RegRef(r, 0)),
        # cp.async with threads >= 24 disabled: their shared chunks are zero-filled
        call(sm80.cp_async_16, pred=lt(t, 24), src=ir.MemRef(x, t * 4), dst=ir.MemRef(sh, t * 4)),
        ir.AsyncCommit(),
        ir.AsyncWait(0),
        call(sm70.ld_shared_16, src=ir.MemRef(sh, t * 4), dst=ir.RegRef(r, 0)),
        call(sm70.st_global_16, dst=ir.MemRef(z, t * 4), src=ir.RegRef(r, 0)),
    ]
    k = ir.Kernel("k", (x, y, z), (1, 1, 1), T, (sh,), (r,), ir.Seq(body))
    prog = ir.Program((k,), (x,), y, (z,))
    xv = np.arange(T * 4, dtype=np.float32).reshape(T, 4) + 1
    yv = np.full((T, 4), -1.0, dtype=np.float32)
    out = run_program(prog, {"x": xv, "y": yv})
    want_y = np.where((np.arange(T) % 2 == 1)[:, None], np.where((np.arange(T) < 20)[:, None], xv, 0), -1)
    np.testing.assert_array_equal(out["y"], want_y)
    np.testing.assert_array_equal(out["z"], np.where((np.arange(T) < 24)[:, None], xv, 0))


def test_unrolled_loops_index_registers_and_divergent_ifs_mask():
    T = 32
    t = ir.tid(T)
    x = gbuf("x", dt.f32, (T, 8))
    y = gbuf("y", dt.f32, (T, 8), "out")
    r = ir.RegBuffer("r", dt.f32, 8)
    acc = ir.RegBuffer("acc", dt.f32, 8)
    i, j = Var("i", 2), Var("j", 4)
    body = [
        ir.For(i, 2, call(sm70.ld_global_16, src=ir.MemRef(x, t * 8 + i * 4), dst=ir.RegRef(r, i * 4)),
               unroll=True),
        ir.RegFill(ir.RegRef(acc, 0), 8, 0.0),
        # acc[2j] = r[2j] + r[2j+1]; acc[2j+1] = r[2j] * r[2j+1]
        ir.For(j, 4, ir.Seq([
            ir.Pointwise("add", ir.RegRef(acc, 2 * j), (ir.RegRef(r, 2 * j), ir.RegRef(r, 2 * j + 1))),
            ir.Pointwise("mul", ir.RegRef(acc, 2 * j + 1), (ir.RegRef(r, 2 * j), ir.RegRef(r, 2 * j + 1))),
        ]), unroll=True),
        # threads 8..15 negate acc[0]; threads with t % 3 == 0 inside them also add 100 to acc[7]
        ir.If(land(ge(t, 8), lt(t, 16)), ir.Seq([
            ir.Pointwise("mul", ir.RegRef(acc, 0), (ir.RegRef(acc, 0), -1.0)),
            ir.If(binop("==", t % 3, 0), ir.Pointwise("add", ir.RegRef(acc, 7), (ir.RegRef(acc, 7), 100.0))),
        ])),
        ir.For(i, 2, call(sm70.st_global_16, dst=ir.MemRef(y, t * 8 + i * 4), src=ir.RegRef(acc, i * 4)),
               unroll=True),
    ]
    prog = program(body, (x, y), threads=T, regs=(r, acc))
    xv = np.random.default_rng(0).integers(-9, 9, (T, 8)).astype(np.float32)
    got = run_program(prog, {"x": xv})["y"]
    want = np.empty_like(xv)
    want[:, 0::2] = xv[:, 0::2] + xv[:, 1::2]
    want[:, 1::2] = xv[:, 0::2] * xv[:, 1::2]
    tt = np.arange(T)
    inside = (tt >= 8) & (tt < 16)
    want[inside, 0] *= -1
    want[inside & (tt % 3 == 0), 7] += 100
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op,src_dt,dst_dt,ref", [
    ("relu", dt.f32, dt.f32, lambda x: np.maximum(x, 0)),
    ("sigmoid", dt.f32, dt.f32, lambda x: 1 / (1 + np.exp(-x))),
    ("tanh", dt.f32, dt.f32, np.tanh),
    ("gelu_tanh", dt.f32, dt.f32,
     lambda x: 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))),
    ("gelu", dt.f32, dt.f16, None),
    ("cvt", dt.f32, dt.f16, lambda x: x),
    ("cvt", dt.f32, dt.bf16, lambda x: x),
    ("cvt", dt.f16, dt.f32, lambda x: x),
    ("cvt", dt.f32, dt.tf32, None),
])
def test_pointwise(op, src_dt, dst_dt, ref):
    T = 32
    t = ir.tid(T)
    x = gbuf("x", src_dt, (T,))
    y = gbuf("y", dst_dt, (T,), "out")
    a, b = ir.RegBuffer("a", src_dt, 1), ir.RegBuffer("b", dst_dt, 1)
    ld = catalog.copy_atom("GL", "RF", src_dt.bits // 8)
    st = catalog.copy_atom("RF", "GL", dst_dt.bits // 8)
    body = [
        call(ld, src=ir.MemRef(x, t), dst=ir.RegRef(a, 0)),
        ir.Pointwise(op, ir.RegRef(b, 0), (ir.RegRef(a, 0),)),
        call(st, dst=ir.MemRef(y, t), src=ir.RegRef(b, 0)),
    ]
    prog = program(body, (x, y), threads=T, regs=(a, b))
    xv = (np.random.default_rng(1).standard_normal(T) * 3).astype(src_dt.np)
    got = run_program(prog, {"x": xv})["y"]
    assert got.dtype == dst_dt.np
    x64 = xv.astype(np.float64)
    if op == "gelu":
        from math import erf, sqrt
        want = np.array([0.5 * v * (1 + erf(v / sqrt(2))) for v in x64])
    elif dst_dt == dt.tf32:
        want = dt.round_to(dt.tf32, xv)
    else:
        want = ref(x64)
    np.testing.assert_array_equal(got, want.astype(dst_dt.np))


def test_pointwise_binary_with_constants_and_max():
    T = 32
    t = ir.tid(T)
    x = gbuf("x", dt.f16, (T, 2))
    y = gbuf("y", dt.f16, (T, 2), "out")
    r = ir.RegBuffer("r", dt.f16, 2)
    body = [
        call(sm70.ld_global_4, src=ir.MemRef(x, t * 2), dst=ir.RegRef(r, 0)),
        ir.Pointwise("max", ir.RegRef(r, 0), (ir.RegRef(r, 0), ir.RegRef(r, 1))),
        ir.Pointwise("add", ir.RegRef(r, 1), (ir.RegRef(r, 1), 0.5)),
        call(sm70.st_global_4, dst=ir.MemRef(y, t * 2), src=ir.RegRef(r, 0)),
    ]
    xv = np.random.default_rng(2).standard_normal((T, 2)).astype(np.float16)
    got = run_program(program(body, (x, y), regs=(r,)), {"x": xv})["y"]
    np.testing.assert_array_equal(got[:, 0], np.maximum(xv[:, 0], xv[:, 1]))
    np.testing.assert_array_equal(got[:, 1], (xv[:, 1].astype(np.float64) + 0.5).astype(np.float16))


def test_kernels_run_in_order_over_a_workspace():
    T = 32
    t = ir.tid(T)
    x = gbuf("x", dt.f32, (T,))
    w = gbuf("w", dt.f32, (T,), "workspace")
    y = gbuf("y", dt.f32, (T,), "out")
    r = ir.RegBuffer("r", dt.f32, 1)
    k1 = ir.Kernel("first", (x, w), (1, 1, 1), T, (), (r,), ir.Seq([
        call(sm70.ld_global_4, src=ir.MemRef(x, t), dst=ir.RegRef(r, 0)),
        ir.Pointwise("mul", ir.RegRef(r, 0), (ir.RegRef(r, 0), 2.0)),
        call(sm70.st_global_4, dst=ir.MemRef(w, (t + 1) % T), src=ir.RegRef(r, 0)),
    ]))
    k2 = ir.Kernel("second", (w, y), (1, 1, 1), T, (), (r,), ir.Seq([
        call(sm70.ld_global_4, src=ir.MemRef(w, t), dst=ir.RegRef(r, 0)),
        ir.Pointwise("add", ir.RegRef(r, 0), (ir.RegRef(r, 0), 1.0)),
        call(sm70.st_global_4, dst=ir.MemRef(y, t), src=ir.RegRef(r, 0)),
    ]))
    xv = np.arange(T, dtype=np.float32)
    out = run_program(ir.Program((k1, k2), (x,), y, (w,)), {"x": xv})
    np.testing.assert_array_equal(out["y"], np.roll(xv * 2, 1) + 1)
    np.testing.assert_array_equal(out["w"], np.roll(xv * 2, 1))


def test_shared_memory_starts_fresh_in_every_block():
    T = 32
    t = ir.tid(T)
    bx = ir.bid(0, 3)
    y = gbuf("y", dt.f32, (3, T), "out")
    sh = ir.SharedBuffer("s", dt.f32, T)
    r = ir.RegBuffer("r", dt.f32, 1)
    body = [
        call(sm70.ld_shared_4, src=ir.MemRef(sh, t), dst=ir.RegRef(r, 0)),
        call(sm70.st_global_4, dst=ir.MemRef(y, bx * T + t), src=ir.RegRef(r, 0)),
        ir.Barrier(),
        ir.RegFill(ir.RegRef(r, 0), 1, 5.0),
        call(sm70.st_shared_4, dst=ir.MemRef(sh, t), src=ir.RegRef(r, 0)),
    ]
    out = run_program(program(body, (y,), grid=(3, 1, 1), shared=(sh,), regs=(r,), inputs=()), {})
    np.testing.assert_array_equal(out["y"], 0)


# --------------------------------------------------------------------------- GEMMs through ldmatrix and mma

def gemm_program(M, N, K, *, BM, BN, BK, warps_m, warps_n, stage="cp_async", c_dtype=dt.f32):
    """C = A @ B (A row-major MxK, B row-major KxN, f16) with mma.m16n8k16: each block computes a
    BMxBN tile with warps_m x warps_n warps; A and B tiles are staged in padded shared memory, A
    fragments come from ldmatrix.x4 and B fragments from ldmatrix.x2.trans."""
    mma = sm80.mma_m16n8k16_f16_f32 if c_dtype == dt.f32 else sm80.mma_m16n8k16_f16_f16
    T = 32 * warps_m * warps_n
    WM, WN = BM // warps_m, BN // warps_n
    MI, NI = WM // 16, WN // 8
    pa, pb = BK + 8, BN + 8
    t = ir.tid(T)
    bx, by = ir.bid(0, N // BN), ir.bid(1, M // BM)
    warp, lane = t // 32, t % 32
    wm, wn = warp // warps_n, warp % warps_n
    A = gbuf("A", dt.f16, (M, K))
    B = gbuf("B", dt.f16, (K, N))
    C = gbuf("C", c_dtype, (M, N), "out")
    As = ir.SharedBuffer("A_smem", dt.f16, BM * pa, note=f"{BM}x{BK}, pitch {pa}")
    Bs = ir.SharedBuffer("B_smem", dt.f16, BK * pb, note=f"{BK}x{BN}, pitch {pb}")
    fa = ir.RegBuffer("frag_a", dt.f16, MI * 8)
    fb = ir.RegBuffer("frag_b", dt.f16, NI * 4)
    acc = ir.RegBuffer("acc", c_dtype, MI * NI * 4)
    stage_r = ir.RegBuffer("stage", dt.f16, 8)
    k0, kk, mi, ni, v = Var("k0", K // BK), Var("kk", BK // 16), Var("mi", MI), Var("ni", NI), Var("v", 2)

    def load_tile(g, sm, rows, cols, pitch, g_row0, g_col0, g_pitch, name):
        chunks = rows * cols // 8
        per = -(-chunks // T)
        ci = Var(f"c_{name}", per)
        idx = t + T * ci
        row, col = idx // (cols // 8), (idx % (cols // 8)) * 8
        gsrc = ir.MemRef(g, (g_row0 + row) * g_pitch + g_col0 + col)
        sdst = ir.MemRef(sm, row * pitch + col)
        if stage == "cp_async":
            body = call(sm80.cp_async_16, src=gsrc, dst=sdst, comment=f"{name} tile")
        else:
            body = ir.Seq([call(sm70.ld_global_16, src=gsrc, dst=ir.RegRef(stage_r, 0)),
                           call(sm70.st_shared_16, dst=sdst, src=ir.RegRef(stage_r, 0), comment=f"{name} tile")])
        if chunks % T:
            body = ir.If(lt(idx, chunks), body)
        return ir.For(ci, per, body, unroll=True)

    a_addr = sm80.ldmatrix_x4.operand("src").addr(lane)
    b_addr = sm80.ldmatrix_x2_trans.operand("src").addr(lane % 16)
    mainloop = ir.Seq([
        load_tile(A, As, BM, BK, pa, by * BM, k0 * BK, K, "A"),
        load_tile(B, Bs, BK, BN, pb, k0 * BK, bx * BN, N, "B"),
        *([ir.AsyncCommit(), ir.AsyncWait(0)] if stage == "cp_async" else []),
        ir.Barrier("tiles staged"),
        ir.For(kk, BK // 16, ir.Seq([
            ir.For(mi, MI, call(sm80.ldmatrix_x4, dst=ir.RegRef(fa, mi * 8), comment="A fragment",
                                src=ir.MemRef(As, (wm * WM + mi * 16 + a_addr % 16) * pa + kk * 16 + a_addr // 16)),
                   unroll=True),
            ir.For(ni, NI, call(sm80.ldmatrix_x2_trans, dst=ir.RegRef(fb, ni * 4), comment="B fragment",
                                src=ir.MemRef(Bs, (kk * 16 + b_addr % 16) * pb + wn * WN + ni * 8 + b_addr // 16)),
                   unroll=True),
            ir.For(mi, MI, ir.For(ni, NI, call(
                mma, d=ir.RegRef(acc, (mi * NI + ni) * 4), a=ir.RegRef(fa, mi * 8), b=ir.RegRef(fb, ni * 4),
                c=ir.RegRef(acc, (mi * NI + ni) * 4)), unroll=True), unroll=True),
        ]), unroll=True),
        ir.Barrier("tiles consumed"),
    ])
    tv = mma.operand("d").tv
    row, col = tv.coord(lane, v * 2)
    st = sm70.st_global_8 if c_dtype == dt.f32 else sm70.st_global_4
    store = ir.For(mi, MI, ir.For(ni, NI, ir.For(v, 2, call(
        st, dst=ir.MemRef(C, (by * BM + wm * WM + mi * 16 + row) * N + bx * BN + wn * WN + ni * 8 + col),
        src=ir.RegRef(acc, (mi * NI + ni) * 4 + v * 2)), unroll=True), unroll=True), unroll=True)
    body = [ir.RegFill(ir.RegRef(acc, 0), MI * NI * 4, 0.0), ir.For(k0, K // BK, mainloop), store]
    k = ir.Kernel("gemm", (A, B, C), (N // BN, M // BM, 1), T, (As, Bs), (fa, fb, acc, stage_r), ir.Seq(body))
    return ir.Program((k,), (A, B), C)


def gemm_inputs(M, N, K, seed=0):
    rng = np.random.default_rng(seed)
    return {"A": (rng.integers(-8, 9, (M, K)) / 8).astype(np.float16),
            "B": (rng.integers(-8, 9, (K, N)) / 8).astype(np.float16)}


def test_tiny_gemm_one_warp_through_ldmatrix():
    prog = gemm_program(16, 8, 16, BM=16, BN=8, BK=16, warps_m=1, warps_n=1, stage="ld_st")
    x = gemm_inputs(16, 8, 16)
    got = run_program(prog, x)["C"]
    np.testing.assert_allclose(got, x["A"].astype(np.float64) @ x["B"].astype(np.float64), rtol=1e-6)


@pytest.mark.parametrize("c_dtype", [dt.f32, dt.f16])
def test_gemm_64_four_warps_cp_async(c_dtype):
    M = N = K = 64
    prog = gemm_program(M, N, K, BM=32, BN=64, BK=32, warps_m=2, warps_n=2, c_dtype=c_dtype)
    x = gemm_inputs(M, N, K, seed=1)
    start = time.perf_counter()
    got = run_program(prog, x)["C"]
    elapsed = time.perf_counter() - start
    want = x["A"].astype(np.float64) @ x["B"].astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3 if c_dtype == dt.f16 else 1e-6)
    assert elapsed < 10, f"a 64x64x64 GEMM took {elapsed:.2f} s in the interpreter"


def test_describe_names_atom_arguments_and_comment():
    t = ir.tid(32)
    sh = ir.SharedBuffer("A_smem", dt.f16, 512)
    r = ir.RegBuffer("frag", dt.f16, 8)
    text = describe(call(sm80.ldmatrix_x4, dst=ir.RegRef(r, 0), src=ir.MemRef(sh, t * 8), comment="A fragment"))
    assert "sm80.ldmatrix_x4" in text and "A_smem" in text and "frag" in text and "A fragment" in text


@settings(max_examples=30, deadline=None)
@given(warps_m=st.sampled_from([1, 2]), warps_n=st.sampled_from([1, 2]), mi=st.sampled_from([1, 2]),
       ni=st.sampled_from([1, 2, 4]), bk=st.sampled_from([16, 32]), k_tiles=st.integers(1, 2),
       grid_m=st.integers(1, 2), grid_n=st.integers(1, 2), stage=st.sampled_from(["cp_async", "ld_st"]),
       seed=st.integers(0, 2**16))
def test_gemm_tilings_agree_with_numpy(warps_m, warps_n, mi, ni, bk, k_tiles, grid_m, grid_n, stage, seed):
    BM, BN = 16 * mi * warps_m, 8 * ni * warps_n
    M, N, K = BM * grid_m, BN * grid_n, bk * k_tiles
    prog = gemm_program(M, N, K, BM=BM, BN=BN, BK=bk, warps_m=warps_m, warps_n=warps_n, stage=stage)
    x = gemm_inputs(M, N, K, seed)
    got = run_program(prog, x)["C"]
    np.testing.assert_allclose(got, x["A"].astype(np.float64) @ x["B"].astype(np.float64), rtol=1e-6)
