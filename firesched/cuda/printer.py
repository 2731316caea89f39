"""Print the kernel IR as self-contained CUDA C++ with inline PTX.

``emit(program)`` returns one translation unit holding every kernel of a ``Program``;
``emit_kernel(kernel)`` returns one holding a single kernel.  Both compile with NVRTC alone: no
CUDA, CUTLASS or CuTe header is included.  Element storage uses raw integer types (``unsigned
short`` for f16 and bf16, ``unsigned char`` for 8- and 4-bit floats), and the few conversions an
epilogue needs are defined in a small prelude, in PTX or in integer code.

The printer is a visitor with one method per IR statement (``visit_Seq``, ``visit_For``, ...); a
node it has no rule for raises ``InternalError``.  Hardware instructions come from the atom
records: an ``AtomCall`` binds each operand group of its atom to C lvalues (registers) or
addresses (memory) and ``asm_node`` expands the atom's PTX template.  Its output is
deterministic: the same Program always prints the same text.

Storage conventions
  * global buffers are ``__restrict__`` kernel parameters, ``const`` for role "in"; an address
    operand gets ``ptr + offset`` (a 64-bit generic address, constraint ``"l"``);
  * shared buffers are typed pointers into one dynamic ``extern __shared__`` array at
    ``Kernel.shared_offsets()``; an address operand gets ``name_base + offset * element bytes``,
    ``name_base`` being the 32-bit shared-window address of the buffer computed once;
  * register buffers are ``alignas(16)`` local arrays of their storage type, zeroed at the start
    as the interpreter's registers are; large wgmma accumulators many wgmmas bind are cut into
    arrays of 16 bytes (``_register_pieces``: element 4k + j of a float accumulator ``S`` is ``S_k[j]``),
    since NVVM's optimizer takes time in an array's size times its accesses.  Pieces need every
    index known when the source is printed, so an unrolled loop whose variable indexes a cut
    buffer is unrolled in the printed text (``{ const int k = 3; ... }``), its expressions left
    as they were.  A register operand of ``reg_bits`` bits binds ``name[i]`` when one element
    fills it, and ``*reinterpret_cast<unsigned*>(&name[i])`` when it carries several elements
    (likewise for 16- and 64-bit registers); a register wider than its data (a one-byte copy
    through a 16-bit register) goes through a temporary.  Sub-byte types are packed two per
    byte, low nibble first.  Global offsets that may not fit an ``int`` are computed in 64
    bits.

Pointwise ops compute in f32 (``SCALAR_OPS[op].c``) on sources converted exactly to f32 and round
once to the destination dtype: to nearest even for floats (ties away for tf32, as
``dtypes.round_to``), to nearest and saturated for integers.  Ops whose sources and destination
are all integers compute in 64-bit integers, saturated when stored; a copy between equal dtypes
moves the bits.

Predication (``AtomCall.pred``): a disabled COPY load writes zeros to its registers (an ``if``
with an ``else`` of zeros, or with ``AtomCall.guard == "predicate"`` one asm statement, the zeros
and ``@p ld``: ``catalog.predicated``), a disabled store writes nothing, a disabled cp.async
reads 0 bytes (``$src_size`` is 0, so it zero-fills) from the buffer's base address (so no
out-of-range address is ever formed), and MMA/LDMATRIX are branched over.

Hopper (sm_90a).  A unit that uses an sm_90a atom, a ``TensorMapParam`` or an ``MBarrier`` gets
``PRELUDE_SM90`` too: an ``#error`` unless it is compiled for sm_90a (so compiling it for sm_80
fails with a clear message), ``struct CUtensorMap`` (128 opaque bytes, 64-byte aligned, since no
header is included), ``fs_smem_desc``, which builds a wgmma matrix descriptor from a shared
address, and ``fs_desc_add``, which moves a descriptor's start by 16-byte units.  A ``TensorMapParam`` is declared ``const __grid_constant__ CUtensorMap name`` and binds
as ``reinterpret_cast<unsigned long long>(&name)``; an ``MBarrier`` is a shared buffer of
``unsigned long long``; a ``DescRef`` operand binds ``fs_desc_add(fs_smem_desc(buffer base, lbo,
sbo, mode), offset / 16 bytes)`` and a ``Scalar`` operand ``(int)(expression)``.  The spin loop of
``mbarrier.try_wait.parity`` gets labels numbered per call site (``$uid``; PTX braces scope them
too, so an unrolled copy is legal).  Around wgmma, the accumulator (and A-fragment) registers
are pinned with empty ``asm volatile`` register fences before each ``wgmma.fence`` and after each
``wgmma.wait_group``, so that the compiler moves no access of them across those points.
"""

from __future__ import annotations

import re

import numpy as np

from .. import ir
from ..dtypes import DType
from ..errors import InternalError
from ..hardware.atoms import sm90a
from ..hardware.atoms.base import COPY, CP_ASYNC, LDMATRIX, SYNC, Asm, Atom, Operand, asm_node
from ..hardware.descriptors import DESCRIPTOR_MODE
from ..ir import expr as ex
from ..ir.rewrite import register_refs, walk
from ..ops import SCALAR_OPS

__all__ = ["emit", "emit_kernel", "PRELUDE", "PRELUDE_SM90", "c_type", "required_arch"]

INDENT = "    "

#: Defined once per translation unit; every helper is ``static __forceinline__`` so unused ones
#: cost nothing.  Guarded so that several printed units can be concatenated.
PRELUDE = r"""// ---- firesched prelude: raw storage types, conversions in PTX or integer code ----
#ifndef FIRESCHED_PRELUDE
#define FIRESCHED_PRELUDE

// 2^x in one MUFU.EX2 (ex2.approx.ftz: 2 ulp; results below 2^-126 flush to 0). exp2f would
// also scale subnormal results, three more instructions an element of a softmax.
static __device__ __forceinline__ float fs_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// f16 <-> f32 (round to nearest even)
static __device__ __forceinline__ float fs_f16_to_f32(unsigned short x)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}

static __device__ __forceinline__ unsigned short fs_f32_to_f16(float f)
{
    unsigned short x;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f));
    return x;
}

// bf16 <-> f32: a bf16 is the high half of an f32
static __device__ __forceinline__ float fs_bf16_to_f32(unsigned short x)
{
    return __uint_as_float((unsigned)x << 16);
}

// element i of a register array of bf16 pairs (alignas(16), an even length) as f32, read from
// the 32-bit word that holds it: one shift or one mask, where extracting the 16-bit element
// first takes a byte permute besides
//     word i/2:  [ hi = element 2k+1 | lo = element 2k ]
//     2k   -> lo << 16            2k+1 -> word & 0xffff0000
static __device__ __forceinline__ float fs_bf16_at(const unsigned short* p, int i)
{
    unsigned w;
    memcpy(&w, p + (i & ~1), 4);        // the pair's word, without reading a short as an unsigned
    return __uint_as_float((i & 1) ? (w & 0xffff0000u) : (w << 16));
}

static __device__ __forceinline__ unsigned short fs_f32_to_bf16(float f)
{
#if __CUDA_ARCH__ >= 800
    unsigned short x;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(x) : "f"(f));
    return x;
#else
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)((u >> 16) | 0x40u);  // a NaN stays a (quiet) NaN
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return (unsigned short)(u >> 16);
#endif
}

// f32 -> tf32 (kept in an f32): 10 mantissa bits, ties away from zero, as cvt.rna.tf32.f32
static __device__ __forceinline__ float fs_f32_to_tf32(float f)
{
    return __uint_as_float((__float_as_uint(f) + 0x1000u) & 0xffffe000u);
}

// 8-bit floats.  e4m3 has no infinities (S.1111.111 is NaN), e5m2 is the high byte of an f16.
static __device__ __forceinline__ float fs_e4m3_to_f32(unsigned char x)
{
    const unsigned sign = (unsigned)(x & 0x80u) << 24;
    const unsigned e = (x >> 3) & 0xfu;
    const unsigned m = x & 0x7u;
    if (e == 0xfu && m == 0x7u) {
        return __uint_as_float(sign | 0x7fc00000u);
    }
    if (e == 0u) {
        return __uint_as_float(sign | __float_as_uint((float)m * 0.001953125f));  // m * 2^-9
    }
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

static __device__ __forceinline__ float fs_e5m2_to_f32(unsigned char x)
{
    return fs_f16_to_f32((unsigned short)((unsigned)x << 8));
}

// f32 -> an 8-bit float with `mbits` mantissa bits and exponent bias `bias`, rounding to nearest
// even; `maxcode` is the largest finite code, `overflow` the code of anything rounding past it.
static __device__ __forceinline__ unsigned char fs_f32_to_f8(float f, unsigned mbits, unsigned bias,
                                                             unsigned maxcode, unsigned overflow,
                                                             unsigned nan)
{
    const unsigned u = __float_as_uint(f);
    const unsigned sign = (u >> 24) & 0x80u;
    unsigned a = u & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return (unsigned char)(sign | nan);
    }
    unsigned code;
    if (a < ((128u - bias) << 23)) {
        // below the smallest normal: count subnormal steps of 2^(1 - bias - mbits)
        const float scale = __uint_as_float((bias + mbits - 1u + 127u) << 23);
        code = __float2uint_rn(__uint_as_float(a) * scale);
    } else {
        a += (1u << (22u - mbits)) - 1u + ((a >> (23u - mbits)) & 1u);
        code = (a >> (23u - mbits)) - ((127u - bias) << mbits);
    }
    return (unsigned char)(sign | (code > maxcode ? overflow : code));
}

static __device__ __forceinline__ unsigned char fs_f32_to_e4m3(float f)
{
    return fs_f32_to_f8(f, 3u, 7u, 0x7eu, 0x7fu, 0x7fu);
}

static __device__ __forceinline__ unsigned char fs_f32_to_e5m2(float f)
{
    return fs_f32_to_f8(f, 2u, 15u, 0x7bu, 0x7cu, 0x7eu);
}

// f32 -> integers: round to nearest even, saturate (NaN gives 0)
static __device__ __forceinline__ signed char fs_f32_to_i8(float f)
{
    const int v = __float2int_rn(f);
    return (signed char)(v < -128 ? -128 : v > 127 ? 127 : v);
}

static __device__ __forceinline__ unsigned char fs_f32_to_u8(float f)
{
    const unsigned v = __float2uint_rn(f);
    return (unsigned char)(v > 255u ? 255u : v);
}

static __device__ __forceinline__ int fs_f32_to_i4(float f)
{
    const int v = __float2int_rn(f);
    return v < -8 ? -8 : v > 7 ? 7 : v;
}

static __device__ __forceinline__ int fs_f32_to_u4(float f)
{
    const unsigned v = __float2uint_rn(f);
    return (int)(v > 15u ? 15u : v);
}

// integer arithmetic of integer registers: in 64 bits, saturated when stored
static __device__ __forceinline__ long long fs_max_ll(long long a, long long b)
{
    return a > b ? a : b;
}

static __device__ __forceinline__ long long fs_sat(long long v, long long lo, long long hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

// 4-bit elements, two per byte, low nibble first
static __device__ __forceinline__ int fs_i4_get(const unsigned char* p, int i)
{
    const int v = (p[i >> 1] >> ((i & 1) * 4)) & 0xf;
    return v >= 8 ? v - 16 : v;
}

static __device__ __forceinline__ int fs_u4_get(const unsigned char* p, int i)
{
    return (p[i >> 1] >> ((i & 1) * 4)) & 0xf;
}

static __device__ __forceinline__ void fs_4bit_set(unsigned char* p, int i, int v)
{
    const int s = (i & 1) * 4;
    p[i >> 1] = (unsigned char)((p[i >> 1] & ~(0xf << s)) | ((v & 0xf) << s));
}

#endif  // FIRESCHED_PRELUDE
"""

#: Emitted after ``PRELUDE`` in units that use sm_90a features (see the module docstring).
PRELUDE_SM90 = r"""// ---- firesched sm_90a prelude: arch check, tensor maps, wgmma descriptors ----
#ifndef FIRESCHED_PRELUDE_SM90
#define FIRESCHED_PRELUDE_SM90

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "firesched: this unit uses sm_90a instructions (wgmma, TMA, mbarrier, stmatrix, setmaxnreg); compile it with arch='sm_90a'"
#endif

// A TMA descriptor as cuTensorMapEncodeTiled writes it: 128 opaque bytes, 64-byte aligned.
struct alignas(64) CUtensorMap {
    unsigned long long opaque[16];
};

// wgmma shared-memory matrix descriptor: start address >> 4 in bits 0-13, leading byte offset
// >> 4 in 16-29, stride byte offset >> 4 in 32-45, base offset 0, swizzle mode in 62-63
// (0 none, 1 128B, 2 64B, 3 32B).
static __device__ __forceinline__ unsigned long long fs_smem_desc(unsigned addr, unsigned lbo, unsigned sbo,
                                                                  unsigned mode)
{
    return (unsigned long long)((addr & 0x3FFFFu) >> 4)
        | ((unsigned long long)((lbo >> 4) & 0x3FFFu) << 16)
        | ((unsigned long long)((sbo >> 4) & 0x3FFFu) << 32)
        | ((unsigned long long)(mode & 3u) << 62);
}

// The descriptor ``units`` x 16 bytes past ``desc``'s start: the start field (bits 0-13, the
// address >> 4) takes the sum without a carry, a shared address being below 2^18.
static __device__ __forceinline__ unsigned long long fs_desc_add(unsigned long long desc, unsigned units)
{
    return (desc & 0xFFFFFFFF00000000ull) | (unsigned)((unsigned)desc + units);
}

// Register fences: the compiler may not move accesses of the register across them.
static __device__ __forceinline__ void fs_fence_reg(float& r)
{
    asm volatile("" : "+f"(r) : : "memory");
}

static __device__ __forceinline__ void fs_fence_reg(unsigned short& r)
{
    asm volatile("" : "+h"(r) : : "memory");
}

#endif  // FIRESCHED_PRELUDE_SM90
"""

# --------------------------------------------------------------------------- types

_C_TYPES = {
    "f16": "unsigned short", "bf16": "unsigned short",
    "f32": "float", "tf32": "float", "f64": "double",
    "f8e4m3": "unsigned char", "f8e5m2": "unsigned char",
    "i8": "signed char", "u8": "unsigned char", "i32": "int",
}

# The C type an inline-asm constraint reads or writes.
_CONSTRAINT_TYPES = {"h": "unsigned short", "r": "unsigned", "l": "unsigned long long",
                     "f": "float", "d": "double"}

# Element -> f32 (an expression on the storage value) and f32 -> element (a function name).
_TO_F32 = {"f16": "fs_f16_to_f32({})", "bf16": "fs_bf16_to_f32({})",
           "f8e4m3": "fs_e4m3_to_f32({})", "f8e5m2": "fs_e5m2_to_f32({})",
           "f32": "{}", "tf32": "{}", "f64": "(float){}",
           "i8": "(float){}", "u8": "(float){}", "i32": "(float){}"}
_FROM_F32 = {"f16": "fs_f32_to_f16", "bf16": "fs_f32_to_bf16", "f8e4m3": "fs_f32_to_e4m3",
             "f8e5m2": "fs_f32_to_e5m2", "tf32": "fs_f32_to_tf32", "f64": "(double)",
             "i8": "fs_f32_to_i8", "u8": "fs_f32_to_u8", "i32": "__float2int_rn",
             "i4": "fs_f32_to_i4", "u4": "fs_f32_to_u4"}

_INT_NAMES = ("i8", "u8", "i32", "i4", "u4")


def c_type(dt: DType) -> str:
    """The C type one element of ``dt`` is stored as (sub-byte types: the packed byte)."""
    if dt.bits < 8:
        return "unsigned char"
    try:
        return _C_TYPES[dt.name]
    except KeyError:
        raise InternalError(f"CUDA printer: no storage type for dtype {dt}") from None


def _int_range(dt: DType) -> tuple[int, int]:
    if dt.kind == "int":
        return -(1 << (dt.bits - 1)), (1 << (dt.bits - 1)) - 1
    return 0, (1 << dt.bits) - 1


def _ll(v: int) -> str:
    return f"{v}LL" if v >= 0 else f"({v}LL)"


def _array_len(dt: DType, size: int) -> int:
    """C array elements needed for ``size`` elements of ``dt``."""
    return size if dt.bits >= 8 else -(-size * dt.bits // 8)


def _binds_directly(ctype: str, rtype: str) -> bool:
    return ctype == rtype or (ctype == "int" and rtype == "unsigned")


def _float_lit(x: float) -> str:
    """A C ``float`` literal for ``x`` (the float32 nearest to it, shortest round-trip digits)."""
    with np.errstate(over="ignore"):
        f = np.float32(x)
    if np.isnan(f):
        return "__uint_as_float(0x7fc00000u)"
    if np.isinf(f):
        return "__uint_as_float(0x7f800000u)" if f > 0 else "__uint_as_float(0xff800000u)"
    s = str(f)
    if not any(c in s for c in ".en"):
        s += ".0"
    s += "f"
    return f"({s})" if s.startswith("-") else s


def _double_lit(x: float) -> str:
    x = float(x)
    if x != x:
        return "__longlong_as_double(0x7ff8000000000000ll)"
    if x in (float("inf"), float("-inf")):
        return "__longlong_as_double(0x7ff0000000000000ll)" if x > 0 else "(-__longlong_as_double(0x7ff0000000000000ll))"
    s = repr(x)
    return f"({s})" if s.startswith("-") else s


def _storage_literal(dt: DType, value: float) -> str:
    """The stored form of ``value`` rounded to ``dt``, as a C constant of ``c_type(dt)``."""
    if dt.name in ("f32", "tf32"):
        from ..dtypes import round_to

        return _float_lit(float(round_to(dt, np.float64(value))))
    if dt.name == "f64":
        return _double_lit(value)
    if dt.kind in ("int", "uint"):
        # round to nearest even and saturate, as a float -> integer conversion does
        lo, hi = _int_range(dt)
        v = 0 if value != value else int(min(max(np.rint(np.float64(value)), lo), hi))
        if dt.bits < 8:
            return str(v & 0xF)
        return str(v) if v >= 0 else f"({v})"
    with np.errstate(invalid="ignore", over="ignore"):
        arr = np.asarray([value], dtype=np.float64).astype(dt.np)
    bits = int(arr.view({16: np.uint16, 8: np.uint8}[dt.bits])[0])
    return f"0x{bits:0{dt.bits // 4}x}"


def _comment(text: str, prefix: str = "// ") -> list[str]:
    """``text`` as ``//`` comment lines; a trailing backslash (a line splice in C) is defused."""
    out = []
    for ln in str(text).splitlines() or [""]:
        ln = ln.rstrip()
        if ln.endswith("\\"):
            ln += " (end of line)"
        out.append((prefix + ln).rstrip())
    return out


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CXX_WORDS = frozenset("""
    alignas alignof asm auto bool break case catch char class const constexpr continue decltype
    default delete do double else enum explicit extern false float for friend goto if inline int
    long mutable namespace new noexcept nullptr operator private protected public register return
    short signed sizeof static struct switch template this throw true try typedef typename union
    unsigned using virtual void volatile while threadIdx blockIdx blockDim gridDim warpSize
    min max
""".split())

_TEMPLATE_NAME = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def _needs_64bit(offset, buf) -> bool:
    """Whether a global element offset may leave the range of a 32-bit int (then it is computed
    in 64 bits); disabled threads may form offsets past the buffer, hence the margin."""
    _, hi = ex.bounds(offset)
    if hi is None:
        return buf.size >= 2 ** 30
    return hi >= 2 ** 31 - 1


def _is_ir_node(node) -> bool:
    return getattr(ir, type(node).__name__, None) is type(node)


# --------------------------------------------------------------------------- the kernel printer

class _KernelPrinter:
    """Prints one ``Kernel``: validates names, renders the body, then its declarations."""

    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.lines: list[str] = []
        self.depth = 1
        self.loop_vars: dict[str, ex.Var] = {}
        self.unrolled: set[str] = set()          # variables of enclosing unrolled loops
        self.used_indices: set[str] = set()
        self.used_shared: set[str] = set()
        self.used_regs: set[str] = set()
        self.globals = self._table(kernel.params, "parameter")
        self.tmaps = {n: b for n, b in self.globals.items() if isinstance(b, ir.TensorMapParam)}
        self.shared = self._table(kernel.shared, "shared buffer")
        self.regs = self._table(kernel.regs, "register buffer")
        self.wait_labels = 0                     # try_wait loops printed so far
        self.acc_regs, self.frag_regs = _wgmma_registers(kernel.body)
        self.pieces = _register_pieces(kernel)   # buffers printed in pieces: units a piece
        self.env: dict[str, int] = {}            # variables of loops unrolled in the text
        names = list(self.globals) + list(self.shared) + list(self.regs)
        names += [f"{n}_base" for n in self.shared]
        names += [f"{n}_{q}" for n, per in self.pieces.items()
                  for q in range(-(-_array_len(self.regs[n].dtype, self.regs[n].size) // per))]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InternalError(f"CUDA printer: kernel {kernel.name}: names used twice: {dup}")
        self.names = set(names)

    # ------------------------------------------------------------------ helpers

    def _where(self) -> str:
        return f"CUDA printer, kernel {self.kernel.name}"

    def _check_name(self, name: str, what: str) -> None:
        if not isinstance(name, str) or not _IDENT.match(name) or name in _CXX_WORDS:
            raise InternalError(f"{self._where()}: {what} name {name!r} is not a usable C identifier")
        if name.startswith("fs_") or name in (ir.TID_NAME, ir.ROLE_TID_NAME, *ir.BID_NAMES):
            raise InternalError(f"{self._where()}: {what} name {name!r} is reserved by the printer")

    def _table(self, buffers, what: str) -> dict:
        out = {}
        for b in buffers:
            self._check_name(b.name, what)
            if b.name in out:
                raise InternalError(f"{self._where()}: two {what}s are named {b.name!r}")
            out[b.name] = b
        return out

    def emit(self, text: str = "") -> None:
        self.lines.append((INDENT * self.depth + text) if text else "")

    def emit_block(self, text: str) -> None:
        for ln in text.split("\n"):
            self.emit(ln.rstrip())

    def c(self, e, prec: int = 0) -> str:
        """C text of index expression ``e``, checking that its variables are bound here."""
        if isinstance(e, bool):
            e = int(e)
        if not isinstance(e, (int, ex.Expr)):
            raise InternalError(f"{self._where()}: not an index expression: {e!r}")
        for v in sorted(ex.free_vars(e), key=lambda v: v.name):
            if v.name in self.loop_vars:
                continue
            if v.name == ir.TID_NAME or v.name in ir.BID_NAMES:
                self.used_indices.add(v.name)
                continue
            raise InternalError(
                f"{self._where()}: index variable {v.name!r} is not bound here (it is neither "
                f"{ir.TID_NAME}, {'/'.join(ir.BID_NAMES)} nor the variable of an enclosing loop)")
        return ex.to_c(e, prec)

    def _reg_buffer(self, buf) -> ir.RegBuffer:
        if not isinstance(buf, ir.RegBuffer) or self.regs.get(buf.name) != buf:
            raise InternalError(f"{self._where()}: {buf!r} is not one of the kernel's register buffers")
        self.used_regs.add(buf.name)
        return buf

    def _check_reg_range(self, buf: ir.RegBuffer, offset, count: int, what: str) -> None:
        """Reject register indices that are not compile-time constants once unrolled loops are
        unrolled (the array would live in local memory), or that are certainly outside ``buf``
        (exact for affine offsets)."""
        if not isinstance(offset, (int, ex.Expr)) or isinstance(offset, bool):
            raise InternalError(f"{self._where()}: {what}: register offset {offset!r} is not an index expression")
        varying = sorted(v.name for v in ex.free_vars(offset) if v.name not in self.unrolled)
        if varying:
            raise InternalError(
                f"{self._where()}: {what} indexes register buffer {buf.name} with {varying}, which "
                f"are not variables of enclosing unrolled loops: register indices must be "
                f"compile-time constants once unrolled loops are unrolled")
        affine = isinstance(offset, (int, ex.Var)) or (
            isinstance(offset, ex.Sum) and all(isinstance(t, ex.Var) for t, _ in offset.terms))
        if not affine:
            return
        lo, hi = ex.bounds(offset)
        if (lo is not None and lo < 0) or (hi is not None and hi + count > buf.size):
            raise InternalError(
                f"{self._where()}: {what} reaches elements [{lo}, {hi} + {count}) of register "
                f"buffer {buf.name} of {buf.size} elements")

    def _known(self, index) -> int:
        """``index`` as a number, the variables of the loops unrolled in the text substituted."""
        v = ex.substitute(index, self.env)
        if not isinstance(v, int):
            raise InternalError(f"{self._where()}: register index {index!r} of a buffer printed in pieces "
                                f"is not known when printing (unrolled in the text: {sorted(self.env)})")
        return v

    def _elem(self, buf: ir.RegBuffer, index) -> str:
        """The lvalue of storage unit ``index`` of ``buf`` (an element, or a sub-byte type's byte)."""
        return "{}[{}]".format(*self._from(buf, index, 1))

    def _from(self, buf: ir.RegBuffer, index, per_unit: int) -> tuple[str, str]:
        """(array, index in it) of element ``index`` of ``buf``, ``per_unit`` elements a storage
        unit: the array is the buffer, or the 16-byte piece holding the element."""
        per = self.pieces.get(buf.name)
        if per is None:
            return buf.name, self.c(index)
        q, r = divmod(self._known(index), per * per_unit)
        return f"{buf.name}_{q}", str(r)

    def _nibbles(self, buf: ir.RegBuffer, index) -> tuple[str, str]:
        """(byte array, element index in it) of 4-bit element ``index`` for fs_u4_get and the like."""
        return self._from(buf, index, 8 // buf.dtype.bits)

    def _read_f32(self, src) -> str:
        """A float expression for one Pointwise source (a RegRef element or a constant)."""
        if isinstance(src, ir.RegRef):
            buf = self._reg_buffer(src.buffer)
            self._check_reg_range(buf, src.offset, 1, "a pointwise source")
            name = buf.dtype.name
            if buf.dtype.bits < 8:
                fn = "fs_i4_get" if buf.dtype.kind == "int" else "fs_u4_get"
                return f"(float){fn}({', '.join(self._nibbles(buf, src.offset))})"
            if name not in _TO_F32:
                raise InternalError(f"{self._where()}: cannot read {buf.dtype} registers as float")
            if name == "bf16" and buf.size % 2 == 0:
                return f"fs_bf16_at({', '.join(self._from(buf, src.offset, 1))})"
            return _TO_F32[name].format(self._elem(buf, src.offset))
        if isinstance(src, (int, float)) and not isinstance(src, bool):
            return _float_lit(src)
        raise InternalError(f"{self._where()}: a Pointwise source must be a RegRef or a number, not {src!r}")

    def _read_int(self, src) -> str:
        """A ``long long`` expression for one Pointwise source of an integer op."""
        if isinstance(src, ir.RegRef):
            buf = self._reg_buffer(src.buffer)
            self._check_reg_range(buf, src.offset, 1, "a pointwise source")
            if buf.dtype.bits < 8:
                fn = "fs_i4_get" if buf.dtype.kind == "int" else "fs_u4_get"
                return f"(long long){fn}({', '.join(self._nibbles(buf, src.offset))})"
            return f"(long long){self._elem(buf, src.offset)}"
        v = int(src)
        return f"{v}LL" if v >= 0 else f"({v}LL)"

    def _store(self, ref: ir.RegRef, value: str, *, is_int: bool) -> str:
        """The statement writing ``value`` to ``ref``: a float rounded to the register's dtype,
        or (``is_int``) a ``long long`` saturated to its range."""
        buf = self._reg_buffer(ref.buffer)
        self._check_reg_range(buf, ref.offset, 1, "a pointwise destination")
        dt = buf.dtype
        if is_int:
            lo, hi = _int_range(dt)
            value = f"({c_type(dt) if dt.bits >= 8 else 'int'})fs_sat({value}, {_ll(lo)}, {_ll(hi)})"
        elif dt.name != "f32":
            if dt.name not in _FROM_F32:
                raise InternalError(f"{self._where()}: cannot write float values to {dt} registers")
            value = f"{_FROM_F32[dt.name]}({value})"
        if dt.bits < 8:
            return f"fs_4bit_set({', '.join(self._nibbles(buf, ref.offset))}, {value});"
        return f"{self._elem(buf, ref.offset)} = {value};"

    # ------------------------------------------------------------------ dispatch

    def visit(self, node) -> None:
        if node is None:    # an empty body, as the interpreter reads it
            return
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is None or not _is_ir_node(node):
            raise InternalError(
                f"{self._where()}: no printing rule for IR node {type(node).__name__} ({node!r})")
        method(node)

    def visit_Seq(self, node: ir.Seq) -> None:
        for stmt in node.body:
            self.visit(stmt)

    def visit_For(self, node: ir.For) -> None:
        var = node.var
        if not isinstance(var, ex.Var):
            raise InternalError(f"{self._where()}: loop variable {var!r} is not a Var")
        self._check_name(var.name, "loop variable")
        if var.name in self.loop_vars or var.name in self.names:
            raise InternalError(f"{self._where()}: loop variable {var.name!r} shadows a name in scope")
        if var.extent is not None and var.extent != node.extent:
            raise InternalError(
                f"{self._where()}: loop over {var.name} has extent {node.extent} but its variable "
                f"ranges over {var.extent}")
        bound = str(int(node.extent))
        if node.stop is not None:
            if node.unroll:
                raise InternalError(f"{self._where()}: loop over {var.name} is unrolled but stops early")
            # the early stop is the same for every thread of the block (loop-invariant)
            bound = f"min({bound}, {self.c(node.stop)})"
        if node.unroll and self._indexes_pieces(node.body, var):
            self._unroll_in_text(node)
            return
        self.emit("#pragma unroll" if node.unroll else "#pragma unroll 1")
        self.emit(f"for (int {var.name} = 0; {var.name} < {bound}; ++{var.name}) {{")
        self.loop_vars[var.name] = var
        if node.unroll:
            self.unrolled.add(var.name)
        self.depth += 1
        try:
            self.visit(node.body)
        finally:
            self.depth -= 1
            del self.loop_vars[var.name]
            self.unrolled.discard(var.name)
        self.emit("}")

    def _indexes_pieces(self, body, var: ex.Var) -> bool:
        """Whether ``var`` reaches the index of a register buffer printed in pieces in ``body``
        (every register operand of every statement, ``ir.rewrite.register_refs``)."""
        return any(r.buffer.name in self.pieces and var in ex.free_vars(r.offset) for r in register_refs(body))

    def _unroll_in_text(self, node: ir.For) -> None:
        """An unrolled loop as its iterations, each a block binding the variable to a constant
        (what NVVM's unroller would make of it), so that register indices are known here."""
        var = node.var
        self.loop_vars[var.name] = var
        self.unrolled.add(var.name)
        try:
            for j in range(int(node.extent)):
                self.env[var.name] = j
                self.emit(f"{{  // {var.name} = {j}")
                self.depth += 1
                self.emit(f"[[maybe_unused]] const int {var.name} = {j};")
                self.visit(node.body)
                self.depth -= 1
                self.emit("}")
        finally:
            del self.loop_vars[var.name]
            self.unrolled.discard(var.name)
            self.env.pop(var.name, None)

    def visit_If(self, node: ir.If) -> None:
        self.emit(f"if ({self.c(node.cond)}) {{")
        self.depth += 1
        self.visit(node.then)
        self.depth -= 1
        self.emit("}")

    def visit_Comment(self, node: ir.Comment) -> None:
        for ln in _comment(node.text):
            self.emit(ln)

    def visit_Roles(self, node: ir.Roles) -> None:
        if not node.roles:
            raise InternalError(f"{self._where()}: Roles without a role")
        tid = ir.TID_NAME
        for i, r in enumerate(node.roles):
            lo, n = int(r.first), int(r.count)
            cond = f"{tid} < {lo + n}" if lo == 0 else f"{tid} >= {lo} && {tid} < {lo + n}"
            self.emit(f"{'if' if i == 0 else '} else if'} ({cond}) {{  // role {r.name}: threads {lo}..{lo + n - 1}")
            self.depth += 1
            self.emit(f"const int {ir.ROLE_TID_NAME} = {tid} - {lo};  // thread index within the role")
            self.used_indices.add(tid)
            self.loop_vars[ir.ROLE_TID_NAME] = ir.role_tid(n)
            try:
                self.visit(r.body)
            finally:
                del self.loop_vars[ir.ROLE_TID_NAME]
                self.depth -= 1
        self.emit("}")

    def visit_Barrier(self, node: ir.Barrier) -> None:
        if node.comment:
            for ln in _comment(node.comment):
                self.emit(ln)
        if not node.threads:
            self.emit("__syncthreads();")
            return
        bid, n = node.bar_id, int(node.threads)
        if (isinstance(bid, int) and not 1 <= bid < 16) or n % 32 or n <= 0:
            raise InternalError(f"{self._where()}: named barrier {bid} with {n} threads: the id must be in "
                                f"1..15 and the count a positive multiple of 32")
        # bar.sync id, count: only these threads wait for each other; the id may be computed (one
        # barrier per warpgroup), the count is an immediate.  bar.arrive counts the threads
        # without waiting (a signal to those that bar.sync on the id)
        ident = ("n", str(bid)) if isinstance(bid, int) else ("r", self.c(bid))
        op = "bar.arrive" if node.arrive else "bar.sync"
        self.emit_block(Asm(op + " %0, %1;", (), (ident, ("n", str(n))), ("memory",)).to_c())

    def _emit_sync(self, name: str, immediates: dict[str, int], comment: str) -> None:
        from ..hardware.atoms import catalog

        atom = catalog.by_name(name)
        if immediates:
            atom = catalog.with_immediates(atom, **immediates)
        asm = asm_node(atom, {}, clobbers=("memory",))
        self.emit(f"// {atom!r}: {comment}" if comment else f"// {atom!r}")
        self.emit_block(asm.to_c())

    def visit_AsyncCommit(self, node: ir.AsyncCommit) -> None:
        self._emit_sync("cp_async_commit", {}, "")

    def visit_AsyncWait(self, node: ir.AsyncWait) -> None:
        n = node.pending
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InternalError(f"{self._where()}: AsyncWait pending must be a non-negative int, not {n!r}")
        self._emit_sync("cp_async_wait", {"n": n},
                        f"at most {n} cp.async group{'s' if n != 1 else ''} still pending")

    def visit_RegFill(self, node: ir.RegFill) -> None:
        ref = node.ref
        if not isinstance(ref, ir.RegRef):
            raise InternalError(f"{self._where()}: RegFill needs a RegRef, not {ref!r}")
        buf = self._reg_buffer(ref.buffer)
        count = int(node.count)
        self._check_reg_range(buf, ref.offset, count, "RegFill")
        lit = _storage_literal(buf.dtype, node.value)
        self.emit(f"// {buf.name}[{self.c(ref.offset)} .. +{count}] = {node.value!r}")
        if buf.name in self.pieces:
            # a buffer in pieces: each element by name, eight to a line
            first = self._known(ref.offset)
            if buf.dtype.bits < 8:
                sets = [f"fs_4bit_set({', '.join(self._nibbles(buf, first + j))}, {lit});" for j in range(count)]
            else:
                sets = [f"{self._elem(buf, first + j)} = {lit};" for j in range(count)]
            for j in range(0, count, 8):
                self.emit(" ".join(sets[j:j + 8]))
            return
        if count > 16:
            i = "fs_r"
            self.emit("#pragma unroll")
            self.emit(f"for (int {i} = 0; {i} < {count}; ++{i}) {{")
            index = i if isinstance(ref.offset, int) and ref.offset == 0 else f"{self.c(ref.offset, 9)} + {i}"
            if buf.dtype.bits < 8:
                self.emit(f"{INDENT}fs_4bit_set({buf.name}, {index}, {lit});")
            else:
                self.emit(f"{INDENT}{buf.name}[{index}] = {lit};")
            self.emit("}")
            return
        for j in range(count):
            index = ex.add(ref.offset, j)
            if buf.dtype.bits < 8:
                self.emit(f"fs_4bit_set({buf.name}, {self.c(index)}, {lit});")
            else:
                self.emit(f"{self._elem(buf, index)} = {lit};")

    def visit_Pointwise(self, node: ir.Pointwise) -> None:
        op = SCALAR_OPS.get(node.op)
        if op is None:
            raise InternalError(f"{self._where()}: unknown scalar op {node.op!r}; known: {sorted(SCALAR_OPS)}")
        if len(node.srcs) != op.arity:
            raise InternalError(
                f"{self._where()}: op {node.op} takes {op.arity} source(s), got {len(node.srcs)}")
        if not isinstance(node.dst, ir.RegRef):
            raise InternalError(f"{self._where()}: Pointwise writes a RegRef, not {node.dst!r}")
        dst_dt = node.dst.buffer.dtype
        srcs = node.srcs
        reg_srcs = [s for s in srcs if isinstance(s, ir.RegRef)]
        # A copy between equal dtypes moves the stored bits (NaN payloads, -0 and all).
        if (node.op in ("copy", "cvt") and reg_srcs and reg_srcs[0].buffer.dtype == dst_dt
                and dst_dt.bits >= 8):
            src = srcs[0]
            buf = self._reg_buffer(src.buffer)
            self._check_reg_range(buf, src.offset, 1, "a pointwise source")
            dst = self._reg_buffer(node.dst.buffer)
            self._check_reg_range(dst, node.dst.offset, 1, "a pointwise destination")
            self.emit(f"{self._elem(dst, node.dst.offset)} = {self._elem(buf, src.offset)};")
            return
        # Integer destinations keep integer math where every source is an integer.
        int_ops = {"copy": "{}", "cvt": "{}", "add": "{} + {}", "mul": "{} * {}",
                   "max": "fs_max_ll({}, {})", "relu": "fs_max_ll({}, 0LL)"}
        if (dst_dt.name in _INT_NAMES and node.op in int_ops
                and all((isinstance(s, ir.RegRef) and s.buffer.dtype.name in _INT_NAMES)
                        or (isinstance(s, (int, float)) and not isinstance(s, bool) and float(s).is_integer())
                        for s in srcs)):
            value = int_ops[node.op].format(*(self._read_int(s) for s in srcs))
            self.emit(self._store(node.dst, value, is_int=True))
            return
        args = [self._read_f32(s) for s in srcs]
        value = args[0] if node.op == "cvt" else op.c(*args)
        self.emit(self._store(node.dst, value, is_int=False))

    # ------------------------------------------------------------------ atoms

    def _payload_bits(self, o: Operand, atom: Atom) -> int:
        """Data bits one register of ``o`` carries: less than ``reg_bits`` only where PTX has no
        register as narrow as the data (a one-byte copy goes through a 16-bit register)."""
        try:
            nominal = atom.dtype_of(o.name).bits
        except KeyError:
            return o.reg_bits
        bits = nominal * o.values // max(o.regs, 1)
        return bits if 0 < bits < o.reg_bits else o.reg_bits

    def _reg_group(self, ref, o: Operand, atom: Atom, temps: list[str]) -> _Group:
        if not isinstance(ref, ir.RegRef):
            raise InternalError(
                f"{self._where()}: atom {atom.name} operand {o.name} is a register operand; it needs a "
                f"RegRef, not {ref!r}")
        buf = self._reg_buffer(ref.buffer)
        eb, rb = buf.dtype.bits, o.reg_bits
        pb = self._payload_bits(o, atom)
        if pb < eb or pb % eb:
            raise InternalError(
                f"{self._where()}: atom {atom.name} operand {o.name} carries {pb} bits per register; "
                f"register buffer {buf.name} holds {buf.dtype} ({eb} bits), which does not pack into them")
        k = pb // eb
        self._check_reg_range(buf, ref.offset, o.regs * k, f"operand {o.name} of {atom.name}")
        if isinstance(ref.offset, int) and (ref.offset * eb) % max(pb, 8):
            raise InternalError(
                f"{self._where()}: atom {atom.name} operand {o.name} starts at element {ref.offset} "
                f"of {buf.name}, which is not aligned to its {pb}-bit registers")
        rtype = _CONSTRAINT_TYPES[o.constraint]
        ctype = c_type(buf.dtype)
        group = _Group()
        for r in range(o.regs):
            i = ex.add(ref.offset, r * k)
            # the lvalue holding this register's data, its C type and its address
            if eb >= 8 and k == 1:
                lv, lv_type = self._elem(buf, i), ctype
                addr = f"&{lv}"
            else:
                ptype = _CONSTRAINT_TYPES[{16: "h", 32: "r", 64: "l"}[pb]] if pb >= 16 else "unsigned char"
                at = i if eb >= 8 else ex.floordiv(ex.mul(i, eb), 8)   # sub-byte: the packed byte
                addr = f"&{self._elem(buf, at)}"
                lv, lv_type = f"*reinterpret_cast<{ptype}*>({addr})", ptype
            group.zero.append(lv)
            if pb == rb:
                group.bind.append(lv if _binds_directly(lv_type, rtype)
                                  else f"*reinterpret_cast<{rtype}*>({addr})")
                continue
            # a register wider than its data: go through a temporary
            if o.role == "in":
                group.bind.append(f"({rtype})({lv})")
                continue
            t = f"fs_t{len(temps)}"
            init = f" = ({rtype})({lv})" if o.role == "inout" else ""
            temps.append(f"{rtype} {t}{init};")
            group.bind.append(t)
            group.copy_out.append(f"{lv} = ({lv_type}){t};")
        return group

    def _address(self, ref, o: Operand, atom: Atom) -> tuple[str, str]:
        """(address expression, buffer base expression) of a memory operand."""
        if not isinstance(ref, ir.MemRef):
            raise InternalError(
                f"{self._where()}: atom {atom.name} operand {o.name} is an address operand; it needs a "
                f"MemRef, not {ref!r}")
        buf = ref.buffer
        if o.memory == "GL":
            if isinstance(buf, ir.TensorMapParam) or not isinstance(buf, ir.GlobalBuffer) \
                    or self.globals.get(buf.name) != buf:
                raise InternalError(
                    f"{self._where()}: atom {atom.name} operand {o.name} reads global memory; "
                    f"{buf!r} is not a parameter of this kernel")
            off = ref.offset if buf.dtype.bits >= 8 else ex.floordiv(ex.mul(ref.offset, buf.dtype.bits), 8)
            if isinstance(off, int) and off == 0:
                return buf.name, buf.name
            text = self.c(off, 10)
            if _needs_64bit(off, buf):
                # every variable widened first, so no partial sum is formed in 32 bits
                wide = ex.substitute(off, {v: ex.Var(f"(long long){v.name}", v.extent) for v in ex.free_vars(off)})
                text = ex.to_c(wide, 10)
            return f"{buf.name} + {text}", buf.name
        if o.memory == "SH":
            if not isinstance(buf, ir.SharedBuffer) or self.shared.get(buf.name) != buf:
                raise InternalError(
                    f"{self._where()}: atom {atom.name} operand {o.name} addresses shared memory; "
                    f"{buf!r} is not a shared buffer of this kernel")
            self.used_shared.add(buf.name)
            base = f"{buf.name}_base"
            off = ex.floordiv(ex.mul(ref.offset, buf.dtype.bits), 8)
            addr = base if isinstance(off, int) and off == 0 else f"{base} + {self.c(off, 10)}"
            return addr, base
        raise InternalError(f"{self._where()}: atom {atom.name} operand {o.name}: unknown memory {o.memory!r}")

    def visit_AtomCall(self, call: ir.AtomCall) -> None:
        atom = call.atom
        if not isinstance(atom, Atom):
            raise InternalError(f"{self._where()}: AtomCall of {atom!r}, which is not an Atom")
        operand_names = [o.name for o in atom.operands]
        arg_names = [n for n, _ in call.args]
        extra = sorted(set(arg_names) - set(operand_names))
        if extra or len(set(arg_names)) != len(arg_names):
            raise InternalError(
                f"{self._where()}: AtomCall of {atom.name} binds {arg_names}; the atom's operands "
                f"are {operand_names}")
        pred = int(call.pred) if isinstance(call.pred, bool) else call.pred
        predicated = not (isinstance(pred, int) and pred == 1)
        cond = self.c(pred) if predicated else None

        bindings: dict[str, list[str]] = {}
        temps: list[str] = []
        copy_out: list[str] = []
        zero: list[str] = []
        described: list[str] = []
        gl_operand: tuple[str, str, str] | None = None   # (operand name, address, base)
        for o in atom.operands:
            if o.name not in arg_names:
                raise InternalError(f"{self._where()}: AtomCall of {atom.name} leaves operand {o.name!r} unbound")
            ref = call.arg(o.name)
            if isinstance(ref, (ir.DescRef, ir.Scalar, ir.TensorMapParam)):
                bindings[o.name], text = self._sm90_operand(ref, o, atom)
                described.append(f"{o.name} = {text}")
                continue
            if o.memory == "RF" and (sm90a.is_descriptor(o) or (atom.min_target == "sm_90a" and sm90a.is_scalar(o))):
                raise InternalError(
                    f"{self._where()}: atom {atom.name} operand {o.name} takes an ir."
                    f"{'DescRef' if sm90a.is_descriptor(o) else 'Scalar'}, not {ref!r}")
            if o.memory == "RF":
                group = self._reg_group(ref, o, atom, temps)
                bindings[o.name] = group.bind
                if o.role in ("out", "inout"):
                    zero += group.zero
                    copy_out += group.copy_out
                n = o.regs * (self._payload_bits(o, atom) // ref.buffer.dtype.bits)
                described.append(f"{o.name} = {ref.buffer.name}[{self.c(ref.offset)} .. +{n}]")
            else:
                addr, base = self._address(ref, o, atom)
                bindings[o.name] = [addr]
                if o.memory == "GL":
                    gl_operand = (o.name, addr, base)
                described.append(f"{o.name} = &{ref.buffer.name}[{self.c(ref.offset)}]")

        if "$uid" in atom.ptx:
            # labels of a spin loop, numbered per call site
            from ..hardware.atoms import catalog

            atom = catalog.with_immediates(atom, uid=self.wait_labels)
            self.wait_labels += 1
        # a guarded load written as one statement under a PTX predicate (AtomCall.guard)
        under_predicate = predicated and call.guard == "predicate"
        if call.guard != "branch":
            if atom.family != COPY or not zero:
                raise InternalError(f"{self._where()}: {atom.name} takes guard={call.guard!r}; only a COPY load into "
                                    f"registers can be written under a predicate")
            if under_predicate:
                from ..hardware.atoms import catalog

                atom = catalog.predicated(atom)
                bindings["guard"] = [f"(int)({cond})"]
        if call.src_bytes is not None and atom.family != CP_ASYNC:
            raise InternalError(f"{self._where()}: {atom.name} takes no src_bytes (a cp.async's partial read)")
        template_names = sorted(set(_TEMPLATE_NAME.findall(atom.ptx)) - set(operand_names))
        for name in template_names:
            if name == "src_size" and atom.family == CP_ASYNC:
                # the bytes read, the rest of the chunk zero-filled (AtomCall.src_bytes)
                size = str(atom.width) if call.src_bytes is None else f"({self.c(call.src_bytes)})"
                bindings[name] = [f"({cond}) ? {size} : 0" if predicated else size]
            elif name == "guard" and under_predicate:
                pass
            else:
                raise InternalError(
                    f"{self._where()}: atom {atom.name} names ${name} in its PTX, which is neither an "
                    f"operand nor an immediate the printer knows how to supply (immediates such as "
                    f"cp.async.wait_group's $n are substituted first: catalog.with_immediates)")

        cp_async = atom.family == CP_ASYNC
        if cp_async and predicated:
            if "src_size" not in template_names or gl_operand is None:
                raise InternalError(
                    f"{self._where()}: predicated {atom.name} needs a $src_size operand and a global "
                    f"source to zero-fill when the predicate is off")
            name, addr, base = gl_operand
            if addr != base:
                bindings[name] = [f"({cond}) ? {addr} : {base}"]

        touches_memory = any(o.memory != "RF" for o in atom.operands) or atom.family in (
            CP_ASYNC, SYNC, LDMATRIX, *sm90a.FAMILIES)
        clobbers = ("memory",) if touches_memory else ()
        try:
            asm = asm_node(atom, bindings, clobbers=clobbers, comment=call.comment)
        except KeyError as e:
            raise InternalError(f"{self._where()}: {e.args[0] if e.args else e}") from None

        head = _comment(call.comment) if call.comment else []
        self.emit(f"// {atom!r}" + (f": {head[0][3:]}" if head else ""))
        for ln in head[1:]:
            self.emit("//   " + ln[3:])
        if described:
            self.emit("//   " + ", ".join(described))

        def issue():
            for t in temps:
                self.emit(t)
            if atom.name == "wgmma_fence":
                self._fence_registers(self.acc_regs + self.frag_regs)
            self.emit_block(asm.to_c())
            if atom.name == "wgmma_wait":
                self._fence_registers(self.acc_regs)
            for c in copy_out:
                self.emit(c)

        if not predicated or cp_async or under_predicate:
            if temps:
                self.emit("{")
                self.depth += 1
            issue()
            if temps:
                self.depth -= 1
                self.emit("}")
            return
        self.emit(f"if ({cond}) {{")
        self.depth += 1
        issue()
        self.depth -= 1
        # A disabled COPY load leaves zeros in its registers; nothing else writes on a false pred.
        if atom.family == COPY and zero:
            self.emit("} else {")
            self.depth += 1
            for lv in zero:
                self.emit(f"{lv} = 0;")
            self.depth -= 1
        self.emit("}")

    def _sm90_operand(self, ref, o: Operand, atom: Atom) -> tuple[list[str], str]:
        """(bindings, description) of an operand bound to a DescRef, a Scalar or a tensor map."""
        if isinstance(ref, ir.DescRef):
            if not sm90a.is_descriptor(o):
                raise InternalError(f"{self._where()}: atom {atom.name} operand {o.name} is no matrix "
                                    f"descriptor; a DescRef cannot bind it")
            _, base = self._address(ir.MemRef(ref.buffer, ref.offset), Operand(o.name, "in", "SH"), atom)
            mode = DESCRIPTOR_MODE[ref.swizzle]
            # the buffer's descriptor (the same expression everywhere: computed once) plus the
            # start's offset in 16-byte units (descriptor starts are 16-byte aligned): one add per
            # wgmma operand instead of a mask, a shift and three ors
            desc = f"fs_smem_desc({base}, {ref.lbo}u, {ref.sbo}u, {mode}u)"
            units = ex.floordiv(ex.mul(ref.offset, ref.buffer.dtype.bits), 128)
            if not (isinstance(units, int) and units == 0):
                desc = f"fs_desc_add({desc}, {self.c(units, 10)})"
            return ([desc],
                    f"desc(&{ref.buffer.name}[{self.c(ref.offset)}], swizzle {ref.swizzle}, lbo {ref.lbo}, "
                    f"sbo {ref.sbo})")
        if isinstance(ref, ir.Scalar):
            if o.memory != "RF" or o.tv is not None or o.reg_bits != 32:
                raise InternalError(f"{self._where()}: atom {atom.name} operand {o.name} is no 32-bit value "
                                    f"operand; a Scalar cannot bind it")
            text = self.c(ref.value)
            return [f"(int)({text})"], text
        if o.memory != "GL" or self.tmaps.get(ref.name) != ref:
            raise InternalError(f"{self._where()}: atom {atom.name} operand {o.name}: tensor map {ref.name!r} "
                                f"is not a parameter of this kernel, or the operand takes no tensor map")
        return [f"reinterpret_cast<unsigned long long>(&{ref.name})"], f"&{ref.name}"

    def _fence_registers(self, names: list[str]) -> None:
        for name in names:
            buf = self.regs.get(name)
            if buf is None:
                continue
            self.used_regs.add(name)
            if buf.dtype.bits not in (16, 32) or buf.dtype.kind != "float":
                raise InternalError(f"{self._where()}: cannot fence wgmma register buffer {name} of {buf.dtype}")
            if name in self.pieces:
                # one empty asm pins eight registers
                c = "f" if buf.dtype.bits == 32 else "h"
                regs = [f'"+{c}"({self._elem(buf, j)})' for j in range(int(buf.size))]
                for j in range(0, len(regs), 8):
                    self.emit(f'asm volatile("" : {", ".join(regs[j:j + 8])} : : "memory");')
                continue
            self.emit("#pragma unroll")
            self.emit(f"for (int fs_i = 0; fs_i < {int(buf.size)}; ++fs_i) {{")
            self.emit(f"{INDENT}fs_fence_reg({name}[fs_i]);")
            self.emit("}")

    # ------------------------------------------------------------------ the whole kernel

    def render(self) -> str:
        k = self.kernel
        self._check_name(k.name, "kernel")
        body_lines: list[str] = []
        if k.body is not None:
            self.visit(k.body)
            body_lines = self.lines
        self.lines = []

        out: list[str] = []
        if k.header:
            out += _comment(k.header)
        grid = tuple(int(g) for g in k.grid)
        out.append(f"// {k.name}: grid ({', '.join(map(str, grid))}) x {k.threads} threads, "
                   f"{k.shared_bytes} bytes of dynamic shared memory")
        bounds = f"{int(k.threads)}, {int(k.min_blocks_per_sm)}" if k.min_blocks_per_sm > 0 else f"{int(k.threads)}"
        params = []
        for b in k.params:
            if isinstance(b, ir.TensorMapParam):
                params.append(f"{INDENT}const __grid_constant__ CUtensorMap {b.name}")
                continue
            const = "const " if b.role == "in" else ""
            params.append(f"{INDENT}{const}{c_type(b.dtype)}* __restrict__ {b.name}")
        cluster = int(k.cluster)
        if cluster > 1:
            if grid[0] % cluster:
                raise InternalError(f"kernel {k.name}: grid x = {grid[0]} is not a multiple of the cluster size {cluster}")
            out.append(f"// thread-block clusters of {cluster} blocks along x (rank = blockIdx.x % {cluster})")
        dims = f" __cluster_dims__({cluster}, 1, 1)" if cluster > 1 else ""
        sig = f'extern "C" __global__ void __launch_bounds__({bounds}){dims} {k.name}('
        if params:
            out.append(sig)
            out.append(",\n".join(params) + ")")
        else:
            out.append(sig + ")")
        out.append("{")

        decl: list[str] = []
        if ir.TID_NAME in self.used_indices:
            decl.append(f"const int {ir.TID_NAME} = threadIdx.x;")
        for axis, name in zip("xyz", ir.BID_NAMES):
            if name in self.used_indices:
                decl.append(f"const int {name} = blockIdx.{axis};")
        if k.shared:
            align = max([128] + [int(b.align) for b in k.shared])
            decl.append(f"extern __shared__ __align__({align}) unsigned char fs_smem[];")
            offsets = k.shared_offsets()
            for b in k.shared:
                note = f", {b.note}" if b.note else ""
                alias = f" (in {b.alias}'s bytes)" if b.alias else ""
                where = f"{b.name}: {b.dtype}[{b.size}] at byte {offsets[b.name]}{alias}{note}"
                if b.name not in self.used_shared:
                    decl += _comment(f"{where} (not addressed)")
                    continue
                ct = "unsigned long long" if isinstance(b, ir.MBarrier) else c_type(b.dtype)
                decl += _comment(where)
                decl.append(f"{ct}* const {b.name} = reinterpret_cast<{ct}*>(fs_smem + {offsets[b.name]});")
                decl.append(f"const unsigned {b.name}_base = (unsigned)__cvta_generic_to_shared({b.name});")
        for b in k.regs:
            if b.name not in self.used_regs:
                decl += _comment(f"register buffer {b.name} ({b.dtype} x {b.size}) is not used")
                continue
            if b.size <= 0:
                raise InternalError(f"{self._where()}: register buffer {b.name} has size {b.size}")
            # zeroed like the interpreter's registers; stores the program overwrites are dead code
            units = _array_len(b.dtype, b.size)
            per = self.pieces.get(b.name)
            if per is None:
                decl.append(f"alignas(16) {c_type(b.dtype)} {b.name}[{units}] = {{}};  // {b.dtype} x {b.size}")
                continue
            count = -(-units // per)
            what = "byte" if b.dtype.bits < 8 else "element"
            decl += _comment(f"{b.name}: {b.dtype} x {b.size} in {count} arrays of 16 bytes: "
                             f"{b.name}_k[j] is {what} {per}k + j")
            names = [f"{b.name}_{q}[{per}] = {{}}" for q in range(count)]
            rows = [", ".join(names[j:j + 8]) for j in range(0, count, 8)]
            decl.append(f"alignas(16) {c_type(b.dtype)} " + (",\n" + INDENT * 2).join(rows) + ";")
        out += [INDENT + d if d else "" for d in decl]
        if decl and body_lines:
            out.append("")
        out += body_lines
        out.append("}")
        return "\n".join(out) + "\n"


class _Group:
    """The C side of one register operand group."""

    def __init__(self):
        self.bind: list[str] = []       # one expression per register, for asm_node
        self.zero: list[str] = []       # the lvalues a disabled load zeroes
        self.copy_out: list[str] = []   # statements moving temporaries back into the buffer


# --------------------------------------------------------------------------- entry points

def _kernel_text(kernel: ir.Kernel) -> str:
    if not isinstance(kernel, ir.Kernel):
        raise InternalError(f"CUDA printer: expected a Kernel, got {type(kernel).__name__}")
    return _KernelPrinter(kernel).render()


def _walk_calls(body):
    return (s for s in walk([body]) if isinstance(s, ir.AtomCall))


def _wgmma_registers(body) -> tuple[list[str], list[str]]:
    """Names of the register buffers wgmma uses as accumulators and as A fragments."""
    acc: list[str] = []
    frag: list[str] = []
    for call in _walk_calls(body):
        if call.atom.family != sm90a.WGMMA:
            continue
        for name, ref in call.args:
            if isinstance(ref, ir.RegRef):
                lst = acc if name == "d" else frag
                if ref.buffer.name not in lst:
                    lst.append(ref.buffer.name)
    return acc, frag


#: a wgmma accumulator wider than this many bytes, bound by at least ``PIECES_FROM_WGMMAS`` wgmma
#: statements, is printed in 16-byte pieces
PIECES_ABOVE_BYTES = 128
PIECES_FROM_WGMMAS = 12


def _register_pieces(kernel: ir.Kernel) -> dict[str, int]:
    """The register buffers the printer cuts into 16-byte pieces, each to its storage units (C
    array elements) a piece: wgmma accumulators wider than ``PIECES_ABOVE_BYTES`` that
    ``PIECES_FROM_WGMMAS`` or more wgmma statements bind.

    NVVM's optimizer takes time in an array's size times its accesses, and wgmma binds every
    register of its operands: a 64-float accumulator bound whole by each of 32 wgmmas costs 2.4
    s to optimize, 0.26 s as 16 arrays of 4.  The sm_90a attention kernels of head dim 128, whose
    scores and output 16 – 24 wgmmas bind, compile in 1.5 – 3.3 s instead of 3.7 – 8.2; the
    causal ones of head dim 256, whose 128-float output 12 bind, in 4.6 – 6.2 s instead of 6.9 –
    10.4.  No access straddles two pieces: a register is at most 8 bytes, aligned to its width.

    The limits are measured, not arbitrary: the text differs, so ptxas allocates differently, and
    where little is to gain that is a risk.  Cut into single variables, or with the 32-float
    scores of head dim 256 cut, four planned attention kernels spilled 8 bytes; the GEMM's
    128-float accumulator, bound by 4 or 8 wgmmas a K step (1.0 – 1.5 s compiles either way),
    spilled 16 bytes at 128 x 256 tiles with edge guards when cut.  A fragments stay whole: the
    dequantised weights of W4A16's small-M plans (256 bf16 a thread, 32 wgmmas) compiled in 4.2 s
    cut against 2.2 s whole, the loops that fill them unrolled in the text.  With these limits none of
    92 sm_90a attention kernels (``bench/fmha_spills.py``: the planned ones and the unit tests'
    1,000-key ones) spills, and the GEMMs, the W4A16 kernels and attention of head dim 64, and of
    256 without a mask (8 wgmmas bind its output), print as before::

        S_acc: f32 x 64, 16 wgmmas      ->  alignas(16) float S_acc_0[4], ..., S_acc_15[4]
        O_acc: f32 x 128, 12 wgmmas     ->  alignas(16) float O_acc_0[4], ..., O_acc_31[4]
        S_acc: f32 x 32, 48 wgmmas      ->  alignas(16) float S_acc[32]   (128 bytes: whole)
        C_acc: f32 x 128, 8 wgmmas      ->  alignas(16) float C_acc[128]  (few bindings: whole)
    """
    counts: dict[str, int] = {}
    for call in _walk_calls(kernel.body):
        if call.atom.family == sm90a.WGMMA:
            for name, ref in call.args:
                if name == "d" and isinstance(ref, ir.RegRef):
                    counts[ref.buffer.name] = counts.get(ref.buffer.name, 0) + 1
    out = {}
    for b in kernel.regs:
        if counts.get(b.name, 0) < PIECES_FROM_WGMMAS:
            continue
        if _array_len(b.dtype, b.size) * max(b.dtype.bits, 8) > 8 * PIECES_ABOVE_BYTES:
            out[b.name] = 16 if b.dtype.bits < 8 else 128 // b.dtype.bits
    return out


def _uses_sm90(kernel: ir.Kernel) -> bool:
    if any(isinstance(p, ir.TensorMapParam) for p in kernel.params):
        return True
    if any(isinstance(b, ir.MBarrier) for b in kernel.shared):
        return True
    return any(c.atom.min_target == "sm_90a" for c in _walk_calls(kernel.body))


def required_arch(program: ir.Program | ir.Kernel) -> str | None:
    """``"sm_90a"`` when the program (or kernel) uses sm_90a atoms, tensor maps or mbarriers and
    only compiles for that arch; None otherwise."""
    kernels = (program,) if isinstance(program, ir.Kernel) else program.kernels
    return "sm_90a" if any(_uses_sm90(k) for k in kernels) else None


def emit_kernel(kernel: ir.Kernel) -> str:
    """One kernel as a self-contained CUDA C++ translation unit (the prelude, then the kernel)."""
    text = _kernel_text(kernel)
    return PRELUDE + "\n" + (PRELUDE_SM90 + "\n" if _uses_sm90(kernel) else "") + text


def _describe(b: ir.GlobalBuffer) -> str:
    return f"{b.name} {b.dtype}[{', '.join(map(str, b.shape))}]"


def emit(program: ir.Program) -> str:
    """Every kernel of ``program`` in one self-contained CUDA C++ translation unit, in launch
    order, each ``extern "C"`` so that it is found by its plain name."""
    if not isinstance(program, ir.Program):
        raise InternalError(f"CUDA printer: expected a Program, got {type(program).__name__}")
    names = [k.name for k in program.kernels]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InternalError(f"CUDA printer: kernels named twice in one program: {dup}")
    head = ["// Generated by firesched. Compiles with NVRTC alone (no headers).",
            "// kernels, in launch order: " + (", ".join(names) or "none")]
    if program.inputs:
        head.append("// inputs: " + "; ".join(_describe(b) for b in program.inputs))
    if program.output is not None:
        head.append("// output: " + _describe(program.output))
    if program.workspaces:
        head.append("// workspaces: " + "; ".join(_describe(b) for b in program.workspaces))
    parts = ["\n".join(head) + "\n", PRELUDE]
    if required_arch(program):
        parts.append(PRELUDE_SM90)
    parts += [_kernel_text(k) for k in program.kernels]
    return "\n".join(parts)
