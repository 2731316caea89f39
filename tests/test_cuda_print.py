"""The CUDA printer: deterministic text, errors on IR it does not know, and hand-built programs
(and, where the microkernel builder exists, every catalog atom) that compile with NVRTC for
sm_80 and sm_90a without spilling."""

from __future__ import annotations

import functools
import importlib
import re

import numpy as np
import pytest

from firesched import dtypes as dt
from firesched import ir
from firesched.cuda import printer as cuda
from firesched.cuda.nvrtc import compile_cuda
from firesched.errors import InternalError
from firesched.hardware.atoms import catalog, sm70, sm80
from firesched.hardware.target import TARGETS
from firesched.ir import expr as ex

ARCHS = ("sm_80", "sm_90a")


def compile_ok(source: str, arch: str, kernels) -> None:
    # through the compile cache: many microkernels print the same source (a move of 8 bytes of
    # f16 or of bf16), compiled once
    mod = compile_cuda(source, arch=arch)
    for name in kernels:
        res = mod.resources_of(name)
        assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0, (name, arch, res)


def kernel_text(kernel: ir.Kernel) -> str:
    """The printed kernel without the prelude."""
    src = cuda.emit_kernel(kernel)
    assert src.startswith(cuda.PRELUDE)
    return src[len(cuda.PRELUDE):]


def program_of(*kernels: ir.Kernel) -> ir.Program:
    bufs = {b.name: b for k in kernels for b in k.params}
    outs = [b for b in bufs.values() if b.role == "out"]
    ins = [b for b in bufs.values() if b.role == "in"]
    return ir.Program(kernels=kernels, inputs=ins, output=outs[0] if outs else None)


# --------------------------------------------------------------------------- hand-built programs

def copy_kernel() -> ir.Kernel:
    """A 100x64 f16 matrix copied through shared memory by 4 blocks of 128 threads: predicated
    cp.async (rows past 100 zero-fill), commit, wait, barrier, shared loads, predicated stores."""
    a = ir.GlobalBuffer("A", dt.f16, (100, 64), (64, 1), role="in")
    b = ir.GlobalBuffer("B", dt.f16, (100, 64), (64, 1), role="out")
    s = ir.SharedBuffer("A_s", dt.f16, 32 * 64, note="32x64 rows of A")
    r = ir.RegBuffer("frag", dt.f16, 8)
    tid, bx = ir.tid(128), ir.bid(0, 4)
    i = ex.Var("i", 2)
    j = ex.Var("j", 2)
    row_i = i * 16 + tid // 8
    row_j = j * 16 + tid // 8
    col = (tid % 8) * 8
    load = ir.For(i, 2, ir.AtomCall(
        sm80.cp_async_16,
        (("dst", ir.MemRef(s, row_i * 64 + col)), ("src", ir.MemRef(a, (bx * 32 + row_i) * 64 + col))),
        pred=ex.lt(bx * 32 + row_i, 100), comment="A tile, 16 bytes per thread"), unroll=True)
    store = ir.For(j, 2, ir.Seq([
        ir.AtomCall(sm70.ld_shared_16, (("dst", ir.RegRef(r, 0)), ("src", ir.MemRef(s, row_j * 64 + col)))),
        ir.AtomCall(sm70.st_global_16, (("dst", ir.MemRef(b, (bx * 32 + row_j) * 64 + col)), ("src", ir.RegRef(r, 0))),
                    pred=ex.lt(bx * 32 + row_j, 100)),
    ]), unroll=True)
    body = ir.Seq([
        ir.Comment("global -> shared"),
        load, ir.AsyncCommit(), ir.AsyncWait(0), ir.Barrier("A_s is complete"),
        ir.Comment("shared -> global"),
        store,
    ])
    return ir.Kernel("copy_tile", params=(a, b), grid=(4, 1, 1), threads=128, shared=(s,), regs=(r,),
                     body=body, header="copy(A -> B)\n  tile 32x64 per block\n  cp.async 16 B per thread")


def masked_load_kernel() -> ir.Kernel:
    """Predicated global loads of 16, 8, 4, 2 and 1 bytes (the last through a 16-bit register)
    and predicated stores back, 32 bytes per thread, in a serial loop."""
    x = ir.GlobalBuffer("X", dt.f8e4m3, (1000,), (1,), role="in")
    y = ir.GlobalBuffer("Y", dt.f8e4m3, (1000,), (1,), role="out")
    r = ir.RegBuffer("v", dt.f8e4m3, 32)
    tid, bx = ir.tid(64), ir.bid(0, 8)
    t = ex.Var("t", 3)
    base = (bx * 3 + t) * 64 * 32 + tid * 32
    ok = ex.lt(base, 1000 - 32)
    pieces = ((0, 16), (16, 8), (24, 4), (28, 2), (30, 1), (31, 1))
    loads = [ir.AtomCall(catalog.copy_atom("GL", "RF", w), (("dst", ir.RegRef(r, o)), ("src", ir.MemRef(x, base + o))),
                         pred=ok) for o, w in pieces]
    stores = [ir.AtomCall(catalog.copy_atom("RF", "GL", w), (("dst", ir.MemRef(y, base + o)), ("src", ir.RegRef(r, o))),
                          pred=ok) for o, w in pieces]
    return ir.Kernel("masked_bytes", params=(x, y), grid=(8, 1, 1), threads=64, regs=(r,),
                     body=ir.For(t, 3, ir.Seq(loads + stores)))


def epilogue_kernel() -> ir.Kernel:
    """Accumulators plus an f16 bias, gelu, a scale, converted to f16 and stored (predicated)."""
    bias = ir.GlobalBuffer("bias", dt.f16, (256,), (1,), role="in")
    out = ir.GlobalBuffer("C", dt.f16, (250, 256), (256, 1), role="out")
    acc = ir.RegBuffer("acc", dt.f32, 8)
    bv = ir.RegBuffer("bias_r", dt.f16, 8)
    o = ir.RegBuffer("out_r", dt.f16, 8)
    tid, bx = ir.tid(32), ir.bid(0, 250)
    e = ex.Var("e", 8)
    body = ir.Seq([
        ir.RegFill(ir.RegRef(acc, 0), 8, 0.25),
        ir.AtomCall(sm70.ld_global_16, (("dst", ir.RegRef(bv, 0)), ("src", ir.MemRef(bias, tid * 8)))),
        ir.For(e, 8, ir.Seq([
            ir.Pointwise("add", ir.RegRef(acc, e), (ir.RegRef(acc, e), ir.RegRef(bv, e))),
            ir.Pointwise("gelu", ir.RegRef(acc, e), (ir.RegRef(acc, e),)),
            ir.Pointwise("mul", ir.RegRef(acc, e), (ir.RegRef(acc, e), -0.5)),
            ir.Pointwise("max", ir.RegRef(acc, e), (ir.RegRef(acc, e), -1e-3)),
            ir.Pointwise("cvt", ir.RegRef(o, e), (ir.RegRef(acc, e),)),
        ]), unroll=True),
        ir.AtomCall(sm70.st_global_16, (("dst", ir.MemRef(out, bx * 256 + tid * 8)), ("src", ir.RegRef(o, 0))),
                    pred=ex.lt(bx, 250), comment="C row, 8 f16 per thread"),
    ])
    return ir.Kernel("epilogue_f16", params=(bias, out), grid=(250, 1, 1), threads=32,
                     regs=(acc, bv, o), body=body)


def conversions_kernel() -> ir.Kernel:
    """Every register dtype the printer converts to and from, through Pointwise."""
    src = ir.GlobalBuffer("src", dt.f32, (32, 4), (4, 1), role="in")
    dst = ir.GlobalBuffer("dst", dt.f32, (32, 4), (4, 1), role="out")
    x = ir.RegBuffer("x", dt.f32, 4)
    y = ir.RegBuffer("y", dt.f32, 4)
    tid = ir.tid(32)
    stmts = [ir.AtomCall(sm70.ld_global_16, (("dst", ir.RegRef(x, 0)), ("src", ir.MemRef(src, tid * 4))))]
    regs = [x, y]
    for d in (dt.f16, dt.bf16, dt.tf32, dt.f8e4m3, dt.f8e5m2, dt.i8, dt.u8, dt.i32, dt.i4, dt.u4, dt.f64):
        t = ir.RegBuffer(f"t_{d.name}", d, 4)
        regs.append(t)
        for k in range(4):
            stmts.append(ir.Pointwise("cvt", ir.RegRef(t, k), (ir.RegRef(x, k),)))
        stmts.append(ir.Pointwise("add", ir.RegRef(t, 1), (ir.RegRef(t, 1), ir.RegRef(t, 2))))
        stmts.append(ir.Pointwise("relu", ir.RegRef(t, 3), (ir.RegRef(t, 3),)))
        for k in range(4):
            stmts.append(ir.Pointwise("add", ir.RegRef(y, k), (ir.RegRef(y, k), ir.RegRef(t, k))))
        stmts.append(ir.RegFill(ir.RegRef(t, 0), 2, -3.0))
        stmts.append(ir.Pointwise("sigmoid", ir.RegRef(y, 0), (ir.RegRef(t, 0),)))
    stmts.insert(0, ir.RegFill(ir.RegRef(y, 0), 4, 0.0))
    stmts.append(ir.AtomCall(sm70.st_global_16, (("dst", ir.MemRef(dst, tid * 4)), ("src", ir.RegRef(y, 0)))))
    return ir.Kernel("conversions", params=(src, dst), grid=(1, 1, 1), threads=32, regs=tuple(regs),
                     body=ir.Seq(stmts))


ROUNDTRIP_DTYPES = (dt.f16, dt.bf16, dt.tf32, dt.f8e4m3, dt.f8e5m2, dt.i8, dt.u8, dt.i32, dt.i4, dt.u4, dt.f64)


def roundtrip_kernel() -> ir.Kernel:
    """``y[n, i] = f32(dtype_n(x[i]))`` for each dtype the printer converts to: 32 threads, 4
    values each."""
    x = ir.GlobalBuffer("x", dt.f32, (128,), (1,), role="in")
    y = ir.GlobalBuffer("y", dt.f32, (len(ROUNDTRIP_DTYPES), 128), (128, 1), role="out")
    xr = ir.RegBuffer("xr", dt.f32, 4)
    yr = ir.RegBuffer("yr", dt.f32, 4)
    tid = ir.tid(32)
    regs = [xr, yr]
    stmts = [ir.AtomCall(sm70.ld_global_16, (("dst", ir.RegRef(xr, 0)), ("src", ir.MemRef(x, tid * 4))))]
    for n, d in enumerate(ROUNDTRIP_DTYPES):
        t = ir.RegBuffer(f"t_{d.name}", d, 4)
        regs.append(t)
        stmts.append(ir.Comment(f"f32 -> {d} -> f32"))
        for k in range(4):
            stmts.append(ir.Pointwise("cvt", ir.RegRef(t, k), (ir.RegRef(xr, k),)))
            stmts.append(ir.Pointwise("cvt", ir.RegRef(yr, k), (ir.RegRef(t, k),)))
        stmts.append(ir.AtomCall(sm70.st_global_16, (("dst", ir.MemRef(y, n * 128 + tid * 4)),
                                                     ("src", ir.RegRef(yr, 0)))))
    return ir.Kernel("roundtrip", params=(x, y), grid=(1, 1, 1), threads=32, regs=tuple(regs),
                     body=ir.Seq(stmts))


def roundtrip_inputs() -> np.ndarray:
    """Ties, overflows, subnormals and specials of every dtype, then random values."""
    special = [
        0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5, 3.5, 7.49, 7.5, 8.5, -8.5, 15.5, 16.5, 127.5, 128.5,
        -128.5, -129.0, 255.5, 256.0, 300.0, -300.0, 448.0, 449.0, 464.0, 465.0, 470.0, 480.0, -500.0,
        57344.0, 61439.0, 61440.0, 65504.0, 65519.0, 65520.0, 1e5, 3e9, -3e9, 3.4e38, np.inf, -np.inf,
        np.nan, 1e-40, 2.0 ** -6, 2.0 ** -7, 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -9, 2.5 * 2.0 ** -9,
        2.0 ** -14, 2.0 ** -16, 2.0 ** -17, 3 * 2.0 ** -17, 2.0 ** -24, 2.0 ** -25, 1 + 2.0 ** -11,
        1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -4, 1 + 3 * 2.0 ** -4,
        1 + 2.0 ** -3, 1 + 3 * 2.0 ** -3, -(1 + 3 * 2.0 ** -3),
    ]
    rng = np.random.default_rng(7)
    rest = rng.standard_normal(128 - len(special)) * np.exp2(rng.integers(-20, 20, 128 - len(special)))
    return np.concatenate([np.array(special), rest]).astype(np.float32)


def roundtrip_reference(x: np.ndarray) -> np.ndarray:
    rows = []
    with np.errstate(invalid="ignore", over="ignore"):
        for d in ROUNDTRIP_DTYPES:
            if d.kind in ("int", "uint"):
                lo, hi = ((-(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1) if d.kind == "int"
                          else (0, (1 << d.bits) - 1))
                v = np.clip(np.rint(x.astype(np.float64)), lo, hi)
                rows.append(np.where(np.isnan(x), 0.0, v).astype(np.float32))
            else:
                rows.append(dt.round_to(d, x).astype(np.float32))
    return np.stack(rows)


def mma_kernel() -> ir.Kernel:
    """One warp: A (16x16 f16, row-major) and B (8x16 f16, n-major) to shared memory by cp.async,
    ldmatrix x4 / x2 into fragments, one m16n8k16 mma, C stored as f32 and as f16."""
    A = ir.GlobalBuffer("A", dt.f16, (16, 16), (16, 1), role="in")
    B = ir.GlobalBuffer("B", dt.f16, (8, 16), (16, 1), role="in")
    C = ir.GlobalBuffer("C", dt.f32, (16, 8), (8, 1), role="out")
    C16 = ir.GlobalBuffer("C16", dt.f16, (16, 8), (8, 1), role="out")
    As = ir.SharedBuffer("A_s", dt.f16, 256)
    Bs = ir.SharedBuffer("B_s", dt.f16, 128)
    a = ir.RegBuffer("a_frag", dt.f16, 8)
    b = ir.RegBuffer("b_frag", dt.f16, 4)
    acc = ir.RegBuffer("acc", dt.f32, 4)
    h = ir.RegBuffer("acc_h", dt.f16, 4)
    lane = ir.tid(32)
    group, tig = lane // 4, lane % 4
    half = ex.Var("half", 2)
    body = ir.Seq([
        ir.AtomCall(sm80.cp_async_16, (("dst", ir.MemRef(As, lane * 8)), ("src", ir.MemRef(A, lane * 8)))),
        ir.If(ex.lt(lane, 16), ir.AtomCall(
            sm80.cp_async_16, (("dst", ir.MemRef(Bs, lane * 8)), ("src", ir.MemRef(B, lane * 8))))),
        ir.AsyncCommit(),
        ir.AsyncWait(0),
        ir.Barrier(),
        ir.AtomCall(sm80.ldmatrix_x4, (("dst", ir.RegRef(a, 0)), ("src", ir.MemRef(As, (lane % 16) * 16 + (lane // 16) * 8))),
                    comment="A fragment"),
        ir.AtomCall(sm80.ldmatrix_x2, (("dst", ir.RegRef(b, 0)),
                                       ("src", ir.MemRef(Bs, (lane % 8) * 16 + ((lane // 8) % 2) * 8))),
                    comment="B fragment"),
        ir.RegFill(ir.RegRef(acc, 0), 4, 0.0),
        ir.AtomCall(sm80.mma_m16n8k16_f16_f32, (("d", ir.RegRef(acc, 0)), ("a", ir.RegRef(a, 0)),
                                                ("b", ir.RegRef(b, 0)), ("c", ir.RegRef(acc, 0)))),
        ir.For(half, 2, ir.Seq([
            ir.AtomCall(sm70.st_global_8, (("dst", ir.MemRef(C, (group + half * 8) * 8 + tig * 2)),
                                           ("src", ir.RegRef(acc, half * 2)))),
            ir.Pointwise("cvt", ir.RegRef(h, half * 2), (ir.RegRef(acc, half * 2),)),
            ir.Pointwise("cvt", ir.RegRef(h, half * 2 + 1), (ir.RegRef(acc, half * 2 + 1),)),
            ir.AtomCall(sm70.st_global_4, (("dst", ir.MemRef(C16, (group + half * 8) * 8 + tig * 2)),
                                           ("src", ir.RegRef(h, half * 2)))),
        ]), unroll=True),
    ])
    return ir.Kernel("mma_one_warp", params=(A, B, C, C16), grid=(1, 1, 1), threads=32,
                     shared=(As, Bs), regs=(a, b, acc, h), body=body, header="mma 16x8x16, one warp")


HAND_BUILT = {
    "copy": copy_kernel,
    "masked_bytes": masked_load_kernel,
    "epilogue": epilogue_kernel,
    "conversions": conversions_kernel,
    "mma": mma_kernel,
    "roundtrip": roundtrip_kernel,
}


# --------------------------------------------------------------------------- text

def test_printing_is_deterministic():
    for make in HAND_BUILT.values():
        k1, k2 = make(), make()
        assert cuda.emit_kernel(k1) == cuda.emit_kernel(k2)
        assert cuda.emit(program_of(k1)) == cuda.emit(program_of(k2))


def test_program_holds_every_kernel_once_with_one_prelude():
    src = cuda.emit(program_of(copy_kernel(), epilogue_kernel()))
    assert src.count("#define FIRESCHED_PRELUDE") == 1
    assert src.index("copy_tile(") < src.index("epilogue_f16(")
    assert "#include" not in src


def test_copy_kernel_text():
    src = kernel_text(copy_kernel())
    assert 'extern "C" __global__ void __launch_bounds__(128, 1) copy_tile(' in src
    assert "const unsigned short* __restrict__ A" in src
    assert "unsigned short* __restrict__ B)" in src
    assert "// copy(A -> B)\n//   tile 32x64 per block" in src
    assert "extern __shared__ __align__(128) unsigned char fs_smem[];" in src
    assert "const unsigned A_s_base = (unsigned)__cvta_generic_to_shared(A_s);" in src
    assert "alignas(16) unsigned short frag[8] = {};" in src
    # predicated cp.async: zero-fill through src_size, and the base address when disabled
    assert "? 16 : 0" in src
    assert ") ? A + (" in src and ": A)" in src
    assert "cp.async.commit_group;" in src and "cp.async.wait_group 0;" in src
    assert "__syncthreads();" in src
    assert "#pragma unroll\n" in src
    assert src.count('"memory"') >= 5
    # a disabled store writes nothing: no else branch
    assert "} else {" not in src


def test_masked_loads_zero_their_registers():
    src = kernel_text(masked_load_kernel())
    assert "#pragma unroll 1\n" in src
    assert "} else {" in src
    assert "*reinterpret_cast<unsigned*>(&v[0]) = 0;" in src
    # one byte through a 16-bit register: a temporary, copied back
    assert "unsigned short fs_t0;" in src and "v[30] = (unsigned char)fs_t0;" in src
    assert '"h"((unsigned short)(v[31]))' in src


def test_epilogue_text():
    src = kernel_text(epilogue_kernel())
    assert "acc[e] = acc[e] + fs_f16_to_f32(bias_r[e]);" in src
    assert "acc[e] = acc[e] * (-0.5f);" in src
    assert "out_r[e] = fs_f32_to_f16(acc[e]);" in src
    assert "acc[0] = 0.25f;" in src


def test_mma_text():
    src = kernel_text(mma_kernel())
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src
    assert '"=f"(acc[0])' in src and '"f"(acc[3])' in src
    assert '"r"(*reinterpret_cast<unsigned*>(&a_frag[6]))' in src
    assert "// sm80.ldmatrix_x4: A fragment" in src


def test_large_global_offsets_are_computed_in_64_bits():
    big = ir.GlobalBuffer("W", dt.f16, (65536, 65536), (65536, 1), role="in")
    out = ir.GlobalBuffer("o", dt.f16, (65536, 8), (8, 1), role="out")
    r = ir.RegBuffer("r", dt.f16, 8)
    tid, bx = ir.tid(128), ir.bid(0, 512)
    row = bx * 128 + tid
    body = ir.Seq([
        ir.AtomCall(sm70.ld_global_16, (("dst", ir.RegRef(r, 0)), ("src", ir.MemRef(big, row * 65536 + 8)))),
        ir.AtomCall(sm70.st_global_16, (("dst", ir.MemRef(out, row * 8)), ("src", ir.RegRef(r, 0)))),
    ])
    k = ir.Kernel("big", params=(big, out), grid=(512, 1, 1), threads=128, regs=(r,), body=body)
    src = kernel_text(k)
    assert '"l"(W + ((long long)bid_x * 8388608 + (long long)tid * 65536 + 8))' in src
    assert '"l"(o + (bid_x * 1024 + tid * 8))' in src
    compile_ok(cuda.emit_kernel(k), "sm_80", ["big"])


def test_integer_pointwise_saturates():
    a = ir.RegBuffer("a", dt.i8, 2)
    k = tiny_kernel(ir.Seq([
        ir.RegFill(ir.RegRef(a, 0), 2, 300.0),
        ir.Pointwise("add", ir.RegRef(a, 0), (ir.RegRef(a, 0), ir.RegRef(a, 1))),
    ]))
    k = ir.Kernel("tiny", params=k.params, grid=k.grid, threads=32, regs=(a,), body=k.body)
    src = kernel_text(k)
    assert "a[0] = 127;" in src
    assert "a[0] = (signed char)fs_sat((long long)a[0] + (long long)a[1], (-128LL), 127LL);" in src


# --------------------------------------------------------------------------- errors

class NotANode:
    pass


def tiny_kernel(body) -> ir.Kernel:
    out = ir.GlobalBuffer("out", dt.f32, (32,), (1,), role="out")
    r = ir.RegBuffer("r", dt.f32, 4)
    return ir.Kernel("tiny", params=(out,), grid=(1, 1, 1), threads=32, regs=(r,), body=body)


def test_unknown_node_is_an_internal_error():
    with pytest.raises(InternalError, match="NotANode"):
        cuda.emit_kernel(tiny_kernel(ir.Seq([ir.Comment("ok"), NotANode()])))


def test_a_lookalike_of_an_ir_class_is_rejected():
    Seq = type("Seq", (), {"body": ()})
    with pytest.raises(InternalError, match="Seq"):
        cuda.emit_kernel(tiny_kernel(Seq()))


def test_unbound_index_variable_is_an_internal_error():
    stray = ex.Var("k", 4)
    with pytest.raises(InternalError, match="'k' is not bound"):
        cuda.emit_kernel(tiny_kernel(ir.If(ex.lt(stray, 2), ir.Comment("unreachable"))))


def test_register_index_that_is_not_constant_is_an_internal_error():
    r = ir.RegBuffer("r", dt.f32, 4)
    i = ex.Var("i", 4)
    serial = ir.For(i, 4, ir.RegFill(ir.RegRef(r, i), 1, 0.0), unroll=False)
    with pytest.raises(InternalError, match="not variables of enclosing unrolled loops"):
        cuda.emit_kernel(tiny_kernel(serial))
    with pytest.raises(InternalError, match=r"\['tid'\]"):
        cuda.emit_kernel(tiny_kernel(ir.RegFill(ir.RegRef(r, ir.tid(32) % 4), 1, 0.0)))
    assert "r[i] = 0.0f;" in kernel_text(tiny_kernel(ir.For(i, 4, serial.body, unroll=True)))


def test_register_out_of_range_is_an_internal_error():
    r = ir.RegBuffer("r", dt.f32, 4)
    with pytest.raises(InternalError, match="register buffer r"):
        cuda.emit_kernel(tiny_kernel(ir.RegFill(ir.RegRef(r, 2), 4, 0.0)))


def test_buffer_not_in_kernel_is_an_internal_error():
    other = ir.RegBuffer("other", dt.f32, 4)
    with pytest.raises(InternalError, match="not one of the kernel's register buffers"):
        cuda.emit_kernel(tiny_kernel(ir.RegFill(ir.RegRef(other, 0), 1, 0.0)))


def test_unsubstituted_immediate_is_an_internal_error():
    with pytest.raises(InternalError, match=r"\$n"):
        cuda.emit_kernel(tiny_kernel(ir.AtomCall(sm80.cp_async_wait, ())))
    text = cuda.emit_kernel(tiny_kernel(ir.AtomCall(catalog.with_immediates(sm80.cp_async_wait, n=2), ())))
    assert "cp.async.wait_group 2;" in text


# --------------------------------------------------------------------------- NVRTC

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(HAND_BUILT))
def test_hand_built_kernel_compiles(name, arch):
    kernel = HAND_BUILT[name]()
    compile_ok(cuda.emit_kernel(kernel), arch, [kernel.name])


def test_program_compiles_as_one_unit():
    kernels = [make() for make in HAND_BUILT.values()]
    compile_ok(cuda.emit(program_of(*kernels)), "sm_80", [k.name for k in kernels])


def test_sm70_atoms_compile_on_later_targets():
    """Volta's quad-pair HMMA and the shuffles, bound by hand (NVRTC 13 has no sm_70)."""
    a = ir.RegBuffer("a", dt.f16, 4)
    b = ir.RegBuffer("b", dt.f16, 4)
    c = ir.RegBuffer("c", dt.f32, 8)
    v = ir.RegBuffer("v", dt.f32, 2)
    lane = ir.RegBuffer("lane", dt.i32, 1)
    out = ir.GlobalBuffer("out", dt.f32, (32, 8), (8, 1), role="out")
    tid = ir.tid(32)
    body = ir.Seq([
        ir.RegFill(ir.RegRef(a, 0), 4, 1.0),
        ir.RegFill(ir.RegRef(b, 0), 4, 2.0),
        ir.RegFill(ir.RegRef(c, 0), 8, 0.0),
        ir.AtomCall(sm70.mma_m8n8k4_f16_f32, (("d", ir.RegRef(c, 0)), ("a", ir.RegRef(a, 0)),
                                              ("b", ir.RegRef(b, 0)), ("c", ir.RegRef(c, 0)))),
        ir.RegFill(ir.RegRef(lane, 0), 1, 3),
        ir.AtomCall(sm70.shfl_sync_idx_b32, (("dst", ir.RegRef(v, 0)), ("src", ir.RegRef(c, 0)),
                                             ("lane", ir.RegRef(lane, 0)))),
        ir.AtomCall(sm70.shfl_sync_bfly_b32, (("dst", ir.RegRef(v, 1)), ("src", ir.RegRef(c, 1)),
                                              ("lane_mask", ir.RegRef(lane, 0)))),
        ir.Pointwise("add", ir.RegRef(c, 0), (ir.RegRef(c, 0), ir.RegRef(v, 0))),
        ir.Pointwise("add", ir.RegRef(c, 1), (ir.RegRef(c, 1), ir.RegRef(v, 1))),
        ir.AtomCall(sm70.st_global_16, (("dst", ir.MemRef(out, tid * 8)), ("src", ir.RegRef(c, 0)))),
        ir.AtomCall(sm70.st_global_16, (("dst", ir.MemRef(out, tid * 8 + 4)), ("src", ir.RegRef(c, 4)))),
    ])
    k = ir.Kernel("volta_atoms", params=(out,), grid=(1, 1, 1), threads=32, regs=(a, b, c, v, lane), body=body)
    compile_ok(cuda.emit_kernel(k), "sm_80", [k.name])


# --------------------------------------------------------------------------- microkernels

def _atom_program():
    try:
        return importlib.import_module("firesched.testing.microkernel").atom_program
    except (ImportError, AttributeError):
        return None


def _compiled_archs(atom) -> list[str]:
    """The archs of firesched's targets that can issue ``atom`` and that NVRTC can compile for."""
    from firesched.cuda.nvrtc import _nvrtc_archs

    have = set(_nvrtc_archs())
    return [t.arch for t in TARGETS.values()
            if t.supports(atom) and int(t.arch[3:].rstrip("a")) in have]


MOVE_DTYPES = (dt.u8, dt.f8e4m3, dt.f16, dt.bf16, dt.f32, dt.i32)


def _microkernel_cases():
    """(atom, dtype) pairs: every atom with its default dtype, and the moves with each dtype
    that fills their width."""
    cases = []
    for a in catalog.ALL_ATOMS:
        cases.append(pytest.param(a, None, id=a.name))
        if a.family in ("copy", "cp_async"):
            cases += [pytest.param(a, d, id=f"{a.name}-{d}") for d in MOVE_DTYPES if a.values_for(d)]
    return cases


needs_microkernels = pytest.mark.skipif(
    _atom_program() is None, reason="firesched.testing.microkernel.atom_program is not there")


def _renamed(program, src: str, tag: str) -> tuple[str, list[str]]:
    """``src`` with each kernel of ``program`` renamed ``<name>__<tag>`` (a dtype variant's
    kernels carry the atom's name, and so do atoms of one name in two catalogs), and the new
    names."""
    names = [k.name for k in program.kernels]
    for n in names:
        src = re.sub(rf"\b{re.escape(n)}\b", f"{n}__{tag}", src)
    return src, [f"{n}__{tag}" for n in names]


@functools.lru_cache(maxsize=None)
def _microkernels_together(arch: str) -> frozenset:
    """The (atom, dtype) cases whose microkernels compile for ``arch`` without spills, compiled as
    one NVRTC program (each program's prelude is guarded; one compile instead of one a case);
    empty where that program fails to compile, so that each case then compiles on its own and a
    failure names its kernel."""
    parts, names = [], {}
    for i, case in enumerate(_microkernel_cases()):
        atom, dtype = case.values
        if arch not in _compiled_archs(atom):
            continue
        program = _atom_program()(atom, dtype)[0]
        src, kernels = _renamed(program, cuda.emit(program), f"case{i}")
        parts.append(src)
        names[(atom, dtype)] = kernels
    try:
        mod = compile_cuda("\n".join(parts), arch=arch)
    except Exception:
        return frozenset()
    ok = set()
    for case, kernels in names.items():
        res = [mod.resources_of(k) for k in kernels]
        if all(r.spill_store_bytes == 0 and r.spill_load_bytes == 0 for r in res):
            ok.add(case)
    return frozenset(ok)


@needs_microkernels
@pytest.mark.parametrize("atom, dtype", _microkernel_cases())
def test_atom_microkernel_compiles(atom, dtype):
    program = _atom_program()(atom, dtype)[0]
    src = cuda.emit(program)
    assert src == cuda.emit(_atom_program()(atom, dtype)[0])
    archs = _compiled_archs(atom)
    assert archs, f"no target NVRTC can compile for issues {atom.name}"
    for arch in archs:
        if (atom, dtype) not in _microkernels_together(arch):
            compile_ok(src, arch, [k.name for k in program.kernels])


# --------------------------------------------------------------------------- on a GPU

def _nibbles(values: np.ndarray) -> np.ndarray:
    """4-bit values packed two a byte, low nibble first."""
    v = (values.astype(np.int64) & 0xF).astype(np.uint8)
    if v.size % 2:
        v = np.append(v, np.uint8(0))
    return (v[0::2] | (v[1::2] << 4)).astype(np.uint8)


class Device:
    """The first GPU through the driver API: runs a printed Program on numpy arrays."""

    def __init__(self):
        from cuda.bindings import driver

        self.cu = driver
        self.ok(driver.cuInit(0))
        dev = self.ok(driver.cuDeviceGet(0))
        attr = driver.CUdevice_attribute
        major = self.ok(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
        self.arch = "sm_90a" if major == 9 else "sm_80"
        self.ok(driver.cuCtxSetCurrent(self.ok(driver.cuDevicePrimaryCtxRetain(dev))))

    def ok(self, result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        assert err == self.cu.CUresult.CUDA_SUCCESS, err
        return rest[0] if len(rest) == 1 else (tuple(rest) or None)

    def run(self, program: ir.Program, arrays: dict) -> dict:
        """Launch every kernel of ``program``; global buffers start as ``arrays[name]`` (zeros where
        absent); returns every buffer a kernel may write, as numpy arrays of its dtype."""
        cu = self.cu
        mod = compile_cuda(cuda.emit(program), arch=self.arch, use_cache=False)
        module = self.ok(cu.cuModuleLoadData(mod.cubin))
        buffers = {b.name: b for k in program.kernels for b in k.params}
        ptrs, host = {}, {}
        try:
            for name, b in buffers.items():
                h = np.zeros(b.size, dtype=b.dtype.np)
                if name in arrays:
                    h[:] = np.asarray(arrays[name]).astype(b.dtype.np).reshape(-1)
                # 4-bit elements live two a byte on the device, low nibble first (the printer's
                # fs_u4_get / fs_i4_get and the dequantising atoms read them so)
                h = _nibbles(h) if b.dtype.bits == 4 else h
                host[name] = h
                ptrs[name] = self.ok(cu.cuMemAlloc(max(h.nbytes, 16)))
                self.ok(cu.cuMemcpyHtoD(ptrs[name], h.ctypes.data, h.nbytes))
            for k in program.kernels:
                func = self.ok(cu.cuModuleGetFunction(module, k.name.encode()))
                if k.shared_bytes > 48 * 1024:
                    self.ok(cu.cuFuncSetAttribute(
                        func, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        k.shared_bytes))
                args = [np.array([int(ptrs[b.name])], dtype=np.uint64) for b in k.params]
                argv = np.array([a.ctypes.data for a in args], dtype=np.uint64)
                self.ok(cu.cuLaunchKernel(func, *k.grid, k.threads, 1, 1, k.shared_bytes, 0, argv.ctypes.data, 0))
                self.ok(cu.cuCtxSynchronize())
            out = {}
            for name, b in buffers.items():
                if b.role != "in":
                    self.ok(cu.cuMemcpyDtoH(host[name].ctypes.data, ptrs[name], host[name].nbytes))
                    out[name] = host[name].reshape(b.shape) if b.size == int(np.prod(b.shape)) else host[name]
            return out
        finally:
            for p in ptrs.values():
                self.ok(cu.cuMemFree(p))
            self.ok(cu.cuModuleUnload(module))


@pytest.fixture(scope="module")
def device():
    return Device()


def assert_same(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@needs_microkernels
@pytest.mark.parametrize("atom, dtype", _microkernel_cases())
def test_atom_microkernel_runs(atom, dtype, device):
    if atom.min_target == "sm_90a" and device.arch != "sm_90a":
        pytest.skip(f"{atom.name} needs sm_90a")
    program, inputs, expected = _atom_program()(atom, dtype)
    out = device.run(program, inputs)
    assert_same(out[program.output.name], expected(inputs))


def _f16_grid(rng, shape):
    return (rng.integers(-8, 9, size=shape) / 4.0).astype(np.float16)


@pytest.mark.gpu
def test_copy_kernel_runs(device):
    k = copy_kernel()
    a = np.random.default_rng(1).standard_normal((100, 64)).astype(np.float16)
    out = device.run(program_of(k), {"A": a})
    assert_same(out["B"], a)


@pytest.mark.gpu
def test_masked_bytes_run(device):
    k = masked_load_kernel()
    x = np.random.default_rng(2).integers(0, 256, size=1000).astype(np.uint8).view(dt.f8e4m3.np)
    want = np.zeros(1000, dtype=np.uint8)
    for chunk in range(8 * 3 * 64):
        base = chunk * 32
        if base < 1000 - 32:
            want[base:base + 32] = x.view(np.uint8)[base:base + 32]
    out = device.run(program_of(k), {"X": x})
    np.testing.assert_array_equal(out["Y"].view(np.uint8), want)


@pytest.mark.gpu
def test_epilogue_runs(device):
    from math import erf, sqrt

    k = epilogue_kernel()
    bias = _f16_grid(np.random.default_rng(3), 256)
    x = 0.25 + bias.astype(np.float64)
    x = np.array([0.5 * v * (1.0 + erf(v / sqrt(2.0))) for v in x]) * -0.5
    x = np.maximum(x, np.float32(-1e-3))
    out = device.run(program_of(k), {"bias": bias})
    np.testing.assert_allclose(out["C"].astype(np.float64), np.broadcast_to(x.astype(np.float16), (250, 256)),
                               rtol=2e-3, atol=1e-6)


@pytest.mark.gpu
def test_mma_kernel_runs(device):
    rng = np.random.default_rng(4)
    a, b = _f16_grid(rng, (16, 16)), _f16_grid(rng, (8, 16))
    out = device.run(program_of(mma_kernel()), {"A": a, "B": b})
    c = a.astype(np.float64) @ b.astype(np.float64).T
    assert_same(out["C"], c)
    assert_same(out["C16"], c.astype(np.float16))


@pytest.mark.gpu
def test_conversions_round_like_numpy(device):
    x = roundtrip_inputs()
    out = device.run(program_of(roundtrip_kernel()), {"x": x})
    want = roundtrip_reference(x)
    for n, d in enumerate(ROUNDTRIP_DTYPES):
        np.testing.assert_array_equal(out["y"][n], want[n], err_msg=f"f32 -> {d} -> f32")


POINTWISE_DTYPES = (dt.f32, dt.f16, dt.bf16, dt.f8e4m3, dt.i8, dt.u8, dt.i32, dt.i4)


def pointwise_kernel() -> ir.Kernel:
    """Exact element-wise ops into each register dtype, and integer ops on integer registers;
    each case stored as f32 to one row of ``out``."""
    x = ir.GlobalBuffer("x", dt.f32, (128,), (1,), role="in")
    y = ir.GlobalBuffer("y", dt.f32, (128,), (1,), role="in")
    cases = [(d, op) for d in POINTWISE_DTYPES for op in ("copy", "add", "mul", "max", "relu", "int_add")]
    out = ir.GlobalBuffer("out", dt.f32, (len(cases), 128), (128, 1), role="out")
    xr, yr, res = (ir.RegBuffer(n, dt.f32, 4) for n in ("xr", "yr", "res"))
    tid = ir.tid(32)
    regs = [xr, yr, res]
    stmts = [
        ir.AtomCall(sm70.ld_global_16, (("dst", ir.RegRef(xr, 0)), ("src", ir.MemRef(x, tid * 4)))),
        ir.AtomCall(sm70.ld_global_16, (("dst", ir.RegRef(yr, 0)), ("src", ir.MemRef(y, tid * 4)))),
    ]
    for n, (d, op) in enumerate(cases):
        t = ir.RegBuffer(f"t{n}", d, 4)
        regs.append(t)
        for k in range(4):
            xs, ys = ir.RegRef(xr, k), ir.RegRef(yr, k)
            if op == "int_add":      # both sources of the destination's dtype
                stmts.append(ir.Pointwise("cvt", ir.RegRef(t, k), (xs,)))
                stmts.append(ir.Pointwise("add", ir.RegRef(t, k), (ir.RegRef(t, k), ir.RegRef(t, k))))
            elif op in ("copy", "relu"):
                stmts.append(ir.Pointwise(op, ir.RegRef(t, k), (xs,)))
            else:
                stmts.append(ir.Pointwise(op, ir.RegRef(t, k), (xs, ys)))
            stmts.append(ir.Pointwise("cvt", ir.RegRef(res, k), (ir.RegRef(t, k),)))
        stmts.append(ir.AtomCall(sm70.st_global_16, (("dst", ir.MemRef(out, n * 128 + tid * 4)),
                                                     ("src", ir.RegRef(res, 0)))))
    return ir.Kernel("pointwise", params=(x, y, out), grid=(1, 1, 1), threads=32, regs=tuple(regs),
                     body=ir.Seq(stmts))


HAND_BUILT["pointwise"] = pointwise_kernel


@pytest.mark.gpu
def test_pointwise_matches_the_interpreter(device):
    """Values are multiples of 1/4 up to +-200: every f32 result is exact, so the GPU (f32 math)
    and the interpreter (f64 math) round the same value once to the destination dtype."""
    from firesched.simulate.interp import run_program

    rng = np.random.default_rng(11)
    arrays = {n: (rng.integers(-800, 801, size=128) / 4.0).astype(np.float32) for n in ("x", "y")}
    program = program_of(pointwise_kernel())
    want = run_program(program, arrays)["out"]
    got = device.run(program, arrays)["out"]
    np.testing.assert_array_equal(got, want)


def _gemm_cases():
    from firesched import ops

    return [
        pytest.param(dict(M=250, N=200, K=100), id="f16-ragged"),
        pytest.param(dict(M=256, N=128, K=64, dtype="bf16", layout="CC",
                          epilogue_ops=(ops.bias("bias"), ops.relu())), id="bf16-CC-bias-relu"),
        pytest.param(dict(M=128, N=128, K=128, split_k_blocks=2, out_dtype="f32"), id="split-k-blocks"),
        pytest.param(dict(M=128, N=256, K=256, split_k_warps=2, prologue_ops=(ops.relu(),)), id="split-k-warps"),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("case", _gemm_cases())
def test_lowered_gemm_matches_the_interpreter(case, device):
    """A GEMM schedule lowered to IR computes the same bits printed on the GPU as interpreted:
    inputs are multiples of 1/4 in [-2, 2], so every f32 sum is exact in any order."""
    from firesched.recipes.gemm import gemm
    from firesched.simulate.interp import run_program

    program = gemm(**case, arch="sm_80").lower("sm_80")
    rng = np.random.default_rng(5)
    arrays = {b.name: (rng.integers(-8, 9, size=b.shape) / 4.0).astype(b.dtype.np) for b in program.inputs}
    want = run_program(program, arrays)[program.output.name]
    got = device.run(program, arrays)[program.output.name]
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_wgmma_registers_wider_than_128_bytes_print_in_16_byte_pieces():
    """The 64-float attention scores and output of head dim 128 are cut into arrays of four
    floats (NVVM optimizes an array in time its size times its accesses); every wgmma, fence
    and loop binds the pieces by constant indices; the f16 P fragment (64 halves, 128 bytes),
    the scores of head dim 256 (32 floats), its output (128 floats) where 8 wgmmas bind it (12
    with a causal mask: cut) and every non-wgmma buffer stay whole."""
    import firesched as fs

    def source(arch, d, causal=False):
        # the printed text is what is checked: lowered and printed, not compiled
        return cuda.emit(fs.recipes.fmha(1, 2, 300, 300, d, dtype="f16", causal=causal, arch=arch).lower(arch))

    src = source("sm_90a", 128)
    assert "alignas(16) float S_acc_0[4] = {}" in src and "S_acc_15[" in src and "S_acc_16[" not in src
    assert "O_acc_15[" in src and "alignas(16) unsigned short P_frag[64] = {}" in src
    code = "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith("//"))
    assert not re.search(r"\b(S_acc|O_acc)\[", code), "a cut buffer indexed whole"
    assert "alignas(16) float m_acc[2]" in code                    # not a wgmma operand
    # an unrolled loop indexing a cut buffer is unrolled in the text, its variable a constant
    assert "[[maybe_unused]] const int e0 = 7;" in code and "for (int e0" not in code
    wide = source("sm_90a", 256)
    assert "alignas(16) float S_acc[32] = {}" in wide and "alignas(16) float O_acc[128] = {}" in wide
    # with the causal mask's steps 12 wgmmas bind the output of head dim 256: cut
    masked = source("sm_90a", 256, causal=True)
    assert "alignas(16) float S_acc[32] = {}" in masked and "O_acc_31[" in masked
    sm80 = source("sm_80", 128)
    assert "S_acc_1[" not in sm80 and "maybe_unused" not in sm80
