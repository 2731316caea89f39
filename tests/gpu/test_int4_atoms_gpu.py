"""The ``convert`` atoms (int4 dequantisation, f16x2 / bf16x2 group scales, shifted halves, f32 pairs
rounded into f16x2 / bf16x2) on a GPU, bit for bit.

Each atom's one-atom microkernel (``testing.microkernel.atom_program``: a warp loads one source
word per thread, issues the atom once, stores the destination registers) is printed, compiled
by NVRTC for the device and launched on batches of 32 inputs; the registers it stores are
compared with the atom's numpy semantics and, for the dequantisation atoms, with the meaning
written here from the definition (destination value ``v`` = nibble ``ORDER[v]``, converted).

What a failure points at:
* one dequant form only (u4 / u4z8 / i4) — its lop3 function or magic constants;
* every f16 dequant atom — the 1/16 fma of the nibbles in bits 4..7, or the ``>> 8``;
* every bf16 dequant atom — the shifts by 4, 8, 12 or the bf16 fma constants;
* a scale atom on finite inputs — the rounding model of ``convert.fma16`` (subnormals, ties,
  overflow), or ``fma.rn.bf16x2`` with a -0 addend not being a multiply;
* ``test_scale_nan_is_canonical`` only — the NaN the instruction returns is not ``0x7fff``;
* ``test_pair_conversion_on_gpu`` — the halves swapped (cvt's first source is the high half), or
  ``convert._round_f32_to_16``'s model of ``cvt.rn`` (ties, subnormals, overflow).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from firesched import dtypes as dt
from firesched.cuda import printer as cuda
from firesched.cuda.nvrtc import compile_cuda
from firesched.hardware.atoms import convert as cv
from firesched.runtime import device_info
from firesched.testing.microkernel import atom_program

pytestmark = pytest.mark.gpu

ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
_ARCH = {(8, 0): "sm_80", (8, 6): "sm_86", (8, 9): "sm_89", (9, 0): "sm_90a"}


class _Device:
    """Device 0's primary context, and a launcher for one-kernel programs of global buffers."""

    def __init__(self):
        from cuda.bindings import driver

        self.cu = driver
        cap = device_info(0).compute_capability
        if cap not in _ARCH:
            pytest.skip(f"no firesched target for compute capability {cap[0]}.{cap[1]}")
        self.arch = _ARCH[cap]
        self._ok(driver.cuInit(0))
        dev = self._ok(driver.cuDeviceGet(0))
        self._ok(driver.cuCtxSetCurrent(self._ok(driver.cuDevicePrimaryCtxRetain(dev))))

    def _ok(self, result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        assert err == self.cu.CUresult.CUDA_SUCCESS, err
        return rest[0] if len(rest) == 1 else tuple(rest)

    def load(self, program):
        """Compile and load ``program``'s kernel; returns (function, module, kernel)."""
        (kernel,) = program.kernels
        mod = compile_cuda(cuda.emit(program), arch=self.arch)
        res = mod.resources_of(kernel.name)
        assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0, res
        module = self._ok(self.cu.cuModuleLoadData(mod.cubin))
        return self._ok(self.cu.cuModuleGetFunction(module, kernel.name.encode())), module, kernel

    def launch(self, loaded, host: dict[str, bytes], out_name: str) -> bytes:
        """Run the kernel once on buffers holding ``host`` (bytes by parameter name; the output
        starts zeroed) and return the output buffer's bytes."""
        cu = self.cu
        func, _, kernel = loaded
        ptrs, sizes = [], {}
        for p in kernel.params:
            data = host[p.name]
            p_dev = self._ok(cu.cuMemAlloc(max(len(data), 4)))
            buf = np.frombuffer(data, np.uint8).copy()
            self._ok(cu.cuMemcpyHtoD(p_dev, buf.ctypes.data, buf.nbytes))
            ptrs.append(p_dev)
            sizes[p.name] = (p_dev, len(data))
        args = [np.array([int(p)], dtype=np.uint64) for p in ptrs]
        argv = np.array([a.ctypes.data for a in args], dtype=np.uint64)
        gx, gy, gz = kernel.grid
        self._ok(cu.cuLaunchKernel(func, gx, gy, gz, kernel.threads, 1, 1, 0, 0, argv.ctypes.data, 0))
        self._ok(cu.cuCtxSynchronize())
        p_out, n = sizes[out_name]
        out = np.zeros(n, np.uint8)
        self._ok(cu.cuMemcpyDtoH(out.ctypes.data, p_out, n))
        for p in ptrs:
            self._ok(cu.cuMemFree(p))
        return out.tobytes()

    def unload(self, loaded):
        self._ok(self.cu.cuModuleUnload(loaded[1]))


@pytest.fixture(scope="module")
def gpu():
    return _Device()


def _run(gpu, atom, inputs: list[np.ndarray]) -> np.ndarray:
    """The destination words of ``atom`` on the GPU for each row of the input words (one
    ``[n, regs]`` uint32 array per input operand), 32 rows a launch."""
    program = atom_program(atom)[0]
    ins = [o for o in atom.operands if o.role == "in"]
    dst = next(o for o in atom.operands if o.role == "out")
    loaded = gpu.load(program)
    n = inputs[0].shape[0]
    out = np.zeros((n, dst.regs), np.uint32)
    try:
        for start in range(0, n, 32):
            host = {"out": bytes(32 * dst.regs * 4)}
            for o, words in zip(ins, inputs):
                chunk = np.zeros((32, o.regs), np.uint32)
                part = words[start:start + 32]
                chunk[:part.shape[0]] = part
                # the buffer holds the operand's values row by row: exactly these little-endian words
                host[o.name] = chunk.astype("<u4").tobytes()
            got = np.frombuffer(gpu.launch(loaded, host, "out"), "<u4").reshape(32, dst.regs)
            out[start:start + 32] = got[: min(32, n - start)]
    finally:
        gpu.unload(loaded)
    return out


def _mismatches(got, want, inputs, limit=8) -> str:
    bad = np.flatnonzero((got != want).any(axis=1))
    lines = [f"{bad.size} of {got.shape[0]} differ"]
    for i in bad[:limit]:
        lines.append(f"  in {[hex(int(w[i, 0])) for w in inputs]}: gpu {[hex(int(x)) for x in got[i]]}, "
                     f"numpy {[hex(int(x)) for x in want[i]]}")
    return "\n".join(lines)


# =========================================================================== dequantisation

def _words(rng) -> np.ndarray:
    """Every nibble value in every position (on three random backgrounds), special words and 256
    random words."""
    words = [0, 0xFFFFFFFF, 0x76543210, 0xFEDCBA98, 0x88888888, 0x77777777]
    for _ in range(3):
        bg = int(rng.integers(0, 2 ** 32))
        for p in range(8):
            for v in range(16):
                words.append((bg & ~(0xF << (4 * p))) | (v << (4 * p)))
    words += [int(x) for x in rng.integers(0, 2 ** 32, size=256, dtype=np.uint64)]
    return np.array(words, dtype=np.uint64).astype(np.uint32)


def _definition(atom, words: np.ndarray) -> np.ndarray:
    form, kind = atom.name.split("_")[1], str(atom.dtype_of("dst"))
    t = np.float16 if kind == "f16" else ml_dtypes.bfloat16
    nib = (words[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    val = nib.astype(np.int64)
    if form == "u4z8":
        val = val - 8
    elif form == "i4":
        val = np.where(val >= 8, val - 16, val)
    return cv.to_words(val[:, ORDER].astype(t), dt.f16 if kind == "f16" else dt.bf16)


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in cv.DEQUANT_ATOMS])
def test_dequant_on_gpu(atom, gpu):
    words = _words(np.random.default_rng(11))
    got = _run(gpu, atom, [words[:, None]])
    want = atom.semantics(words[:, None])
    assert np.array_equal(got, want), _mismatches(got, want, [words[:, None]])
    np.testing.assert_array_equal(got, _definition(atom, words))


# =========================================================================== scales

def _scale_inputs(atom, rng, n: int = 1024) -> list[np.ndarray]:
    """Per input operand ``n`` words of two halves: finite halves of every exponent (subnormals
    included), specials (±0, ±inf, NaN, the largest finite, the smallest subnormal), products at
    a tie (1.5 * (1 + k ulp)), and cancellations z = -round(q * s)."""
    kind = str(atom.dtype_of("d"))
    t = np.float16 if kind == "f16" else ml_dtypes.bfloat16
    inf_exp = 0x7C00 if kind == "f16" else 0x7F80
    big = int(np.array([np.finfo(np.float16).max if kind == "f16" else ml_dtypes.finfo(t).max],
                       t).view(np.uint16)[0])
    specials = np.array([0x0000, 0x8000, inf_exp, inf_exp | 0x8000, 0x7FFF, 0x0001, 0x8001, big, big | 0x8000,
                         int(np.array([1.0], t).view(np.uint16)[0])], np.uint16)
    ins = [o.name for o in atom.operands if o.role == "in"]
    cols = {}
    for name in ins:
        bits = rng.integers(0, 1 << 16, size=4 * n).astype(np.uint16)
        finite = bits[(bits & inf_exp) != inf_exp][: 2 * n]
        spec = rng.choice(specials, size=2 * n // 8)
        finite[: spec.size] = spec
        cols[name] = finite
    ulp = 2.0 ** (-10 if kind == "f16" else -7)
    k = 2 * n // 4
    cols["q"][-k:] = (1.0 + rng.integers(0, 64, size=k) * ulp).astype(t).view(np.uint16)
    cols["s"][-k:] = int(np.array([1.5], t).view(np.uint16)[0])
    if "z" in cols:
        with np.errstate(over="ignore", invalid="ignore"):
            prod = (cols["q"][-2 * k:-k].view(t).astype(np.float64) * cols["s"][-2 * k:-k].view(t).astype(np.float64))
            cols["z"][-2 * k:-k] = (-prod).astype(t).view(np.uint16)
    return [(cols[name][0::2].astype(np.uint32) | (cols[name][1::2].astype(np.uint32) << 16))[:, None]
            for name in ins]


def _is_nan(words: np.ndarray, kind: str) -> np.ndarray:
    inf_exp = 0x7C00 if kind == "f16" else 0x7F80
    mant = 0x03FF if kind == "f16" else 0x007F
    halves = np.stack([words & 0xFFFF, words >> 16], axis=-1)
    return ((halves & inf_exp) == inf_exp) & ((halves & mant) != 0)


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in cv.SCALE_ATOMS])
def test_scale_on_gpu(atom, gpu):
    """Every half that is not NaN, bit for bit; NaN where the semantics say NaN."""
    kind = str(atom.dtype_of("d"))
    inputs = _scale_inputs(atom, np.random.default_rng(12))
    got = _run(gpu, atom, inputs)
    want = atom.semantics(*inputs)
    nan_got, nan_want = _is_nan(got, kind), _is_nan(want, kind)
    assert np.array_equal(nan_got, nan_want), "NaN results differ"
    halves_got = np.stack([got & 0xFFFF, got >> 16], axis=-1)
    halves_want = np.stack([want & 0xFFFF, want >> 16], axis=-1)
    same = (halves_got == halves_want) | nan_want
    assert same.all(), _mismatches(np.where(same.all(axis=-1), want, got), want, inputs)


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in cv.SCALE_ATOMS])
def test_scale_nan_is_canonical(atom, gpu):
    """inf * 0, NaN inputs, inf - inf: the semantics return 0x7fff; so must the instruction."""
    kind = str(atom.dtype_of("d"))
    inf = 0x7C00 if kind == "f16" else 0x7F80
    one = 0x3C00 if kind == "f16" else 0x3F80
    q = np.array([inf, 0x7FFF, inf, 0x7E01 if kind == "f16" else 0x7FC1], np.uint32)
    s = np.array([0, one, one, one], np.uint32)
    z = np.array([0, 0, inf | 0x8000, 0], np.uint32)
    words = [(x | (x << 16))[:, None] for x in (q, s, z)][: len([o for o in atom.operands if o.role == "in"])]
    got = _run(gpu, atom, words)
    want = atom.semantics(*words)
    nan = _is_nan(want, kind).all(axis=-1)[:, 0]
    assert nan[:2].all()
    assert np.array_equal(got[nan], want[nan]), _mismatches(got[nan], want[nan], [w[nan] for w in words])


# =========================================================================== shifted halves

def test_shift_halves_on_gpu(gpu):
    """``shift_halves_b16x8``'s microkernel (lane ``l`` shifts by ``l``: every shift, four lanes
    each) on random words, bit for bit against its semantics."""
    program, _, expected = atom_program(cv.shift_halves_b16x8)
    loaded = gpu.load(program)
    try:
        rng = np.random.default_rng(13)
        for _ in range(4):
            words = {n: rng.integers(0, 1 << 16, size=(32, 8)).astype(np.uint16) for n in ("lo", "hi")}
            host = {n: w.astype("<u2").tobytes() for n, w in words.items()}
            host["out"] = bytes(32 * 8 * 2)
            got = np.frombuffer(gpu.launch(loaded, host, "out"), "<u2").reshape(32, 8)
            want = expected({n: w.view(np.float16) for n, w in words.items()}).view(np.uint16)
            np.testing.assert_array_equal(got, want)
    finally:
        gpu.unload(loaded)


# =========================================================================== f32 pairs rounded

def _pair_inputs(rng) -> np.ndarray:
    """f32 words: ties and near-ties of both 16-bit types, their subnormals and overflow, signed
    zeros, infinities, NaNs, and random words."""
    special = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
               0x00000001, 0x807FFFFF, 0x477FF000, 0x477FEFFF, 0x477FF001, 0x7F7FFFFF, 0x33800000,
               0x33000000, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F800001, 0x387FE000, 0x38800000]
    ties = [(int(rng.integers(0, 1 << 32)) & 0xFFFF0000) | 0x8000 for _ in range(96)]
    ties += [(int(rng.integers(0, 1 << 32)) & 0xFFFFE000) | 0x1000 for _ in range(96)]
    words = np.array(special + ties, np.uint64).astype(np.uint32)
    words = np.concatenate([words, rng.integers(0, 1 << 32, size=1024, dtype=np.uint64).astype(np.uint32)])
    return np.stack([words, np.roll(words, 7)], axis=-1)


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in cv.PAIR_ATOMS])
def test_pair_conversion_on_gpu(atom, gpu):
    """``cvt.rn.{f16x2,bf16x2}.f32`` against its semantics, bit for bit (NaN as NaN): value 0 in the
    low half, ties to even, subnormals kept, overflow to infinity."""
    kind = str(atom.dtype_of("d"))
    src = _pair_inputs(np.random.default_rng(14))
    got = _run(gpu, atom, [src])
    want = atom.semantics(src)
    nan_got, nan_want = _is_nan(got, kind), _is_nan(want, kind)
    assert np.array_equal(nan_got, nan_want), "NaN results differ"
    halves_got = np.stack([got & 0xFFFF, got >> 16], axis=-1)
    halves_want = np.stack([want & 0xFFFF, want >> 16], axis=-1)
    same = (halves_got == halves_want) | nan_want
    assert same.all(), _mismatches(np.where(same.all(axis=-1), want, got), want, [src])
