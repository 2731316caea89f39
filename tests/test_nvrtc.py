"""NVRTC compilation, the kernel cache, and the GPU-free half of the runtime (array description,
argument checks, parameter packing, the no-GPU error).  Nothing here needs a GPU."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import attrs
import numpy as np
import pytest

from firesched import runtime
from firesched.cuda import nvrtc
from firesched.cuda.nvrtc import (
    SUPPORTED_ARCHS,
    KernelResources,
    cache_dir,
    clear_cache,
    compile_cuda,
    nvrtc_version,
    parse_ptxas_resources,
)
from firesched.errors import CompileError, LaunchError
from firesched.runtime import ArgSpec, DeviceArray, as_device_array, check_args

REPO = Path(__file__).resolve().parents[1]

AXPY = r"""
extern "C" __global__ void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  __shared__ float stage[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  stage[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  if (i < n) y[i] = a * stage[threadIdx.x] + y[i];
}
"""

# 48 live accumulators squeezed into 24 registers must spill.
SPILLY = r"""
extern "C" __global__ void spilly(const float* x, float* y) {
  float acc[48];
  #pragma unroll
  for (int i = 0; i < 48; ++i) acc[i] = x[threadIdx.x + i * 1024];
  #pragma unroll
  for (int k = 0; k < 8; ++k) {
    #pragma unroll
    for (int i = 0; i < 48; ++i) acc[i] = acc[i] * acc[(i + k + 1) % 48] + 1.0f;
  }
  float s = 0.f;
  #pragma unroll
  for (int i = 0; i < 48; ++i) s += acc[i];
  y[threadIdx.x] = s;
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A private, empty cache directory, so that the user's own cache is never touched."""
    d = tmp_path / "fscache"
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(d))
    return d


def _entries(cache_root: Path) -> list[Path]:
    return sorted((cache_root / "cubin").glob("*.cubin"))


# ---------------------------------------------------------------------------------------------
# Compiling


def test_nvrtc_version():
    major, minor = nvrtc_version()
    assert (major, minor) >= (12, 0)


@pytest.mark.parametrize("arch", [pytest.param("sm_80", id="ampere"), pytest.param("sm_90a", id="hopper")])
def test_compile_gives_cubin_and_resources(cache, arch):
    m = compile_cuda(AXPY, arch=arch)
    assert m.cubin[:4] == b"\x7fELF"
    assert m.arch == arch
    assert f"--gpu-architecture={arch}" in m.options
    assert "--ptxas-options=-v" in m.options and "-lineinfo" in m.options
    assert not any("fast" in o for o in m.options)
    assert m.kernel_names == ("axpy",)
    r = m.resources_of("axpy")
    assert r.registers > 0
    assert r.spills == 0
    assert r.static_smem_bytes == 256 * 4
    assert not m.from_cache and m.compile_seconds > 0


def test_spills_are_reported(cache):
    m = compile_cuda(SPILLY, arch="sm_80", options=("-maxrregcount=24",))
    r = m.resources_of("spilly")
    assert r.registers <= 24
    assert r.spill_store_bytes > 0 and r.spill_load_bytes > 0
    assert r.spills == r.spill_store_bytes + r.spill_load_bytes
    assert r.stack_frame_bytes > 0


def test_resources_of_unknown_kernel_lists_known_names(cache):
    m = compile_cuda(AXPY, arch="sm_80")
    with pytest.raises(ValueError, match=r"no kernel named 'gemm'.*axpy.*extern \"C\""):
        m.resources_of("gemm")


PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k3' for 'sm_80'
ptxas info    : Function properties for k3
ptxas         .     16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 10.647 ms
ptxas info    : Function properties for _Z1ff
ptxas         .     64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 8192 bytes smem, 360 bytes cmem[0]
"""


def test_parse_ptxas_log():
    res = parse_ptxas_resources(PTXAS_LOG)
    assert set(res) == {"k3", "k"}  # the device function _Z1ff is not a kernel
    assert res["k3"] == KernelResources("k3", registers=32, spill_store_bytes=4, spill_load_bytes=8,
                                        stack_frame_bytes=16, static_smem_bytes=0)
    assert res["k3"].spills == 12
    assert res["k"] == KernelResources("k", registers=10, static_smem_bytes=8192)
    assert parse_ptxas_resources("") == {}


SYNTAX_ERROR = """\
extern "C" __global__ void broken(float* x, int n) {
  int i = threadIdx.x;
  if (i < n) {
    x[i] = undefined_thing * 2.0f;
  }
}
"""


def test_syntax_error_shows_line_and_context(cache):
    with pytest.raises(CompileError) as info:
        compile_cuda(SYNTAX_ERROR, arch="sm_90a", filename="gen.cu")
    e = info.value
    msg = str(e)
    assert "gen.cu(4): error" in msg
    assert "undefined_thing" in msg
    assert ">" in msg and " 4 | " in msg  # the offending line, numbered and marked
    assert "if (i < n) {" in msg and "  }" in msg  # two lines of context either side
    assert e.source == SYNTAX_ERROR
    assert "undefined_thing" in e.log
    assert _entries(cache) == []  # failures are not cached


def test_ptxas_error_points_at_the_inline_asm(cache):
    src = ('extern "C" __global__ void k(int* x) {\n'
           '  int i = threadIdx.x;\n'
           '  asm volatile("bogus.op.s32 %0;" :: "r"(i));\n'
           '}\n')
    with pytest.raises(CompileError) as info:
        compile_cuda(src, arch="sm_90a")
    msg = str(info.value)
    assert "ptxas" in msg and "bogus.op.s32" in msg
    assert "line 3" in msg and 'asm volatile("bogus.op.s32' in msg


@pytest.mark.parametrize("arch", [
    pytest.param("sm_75", id="turing"),
    pytest.param("sm_100a", id="blackwell"),
    pytest.param("compute_90", id="virtual"),
    pytest.param("90", id="bare-number"),
])
def test_unknown_arch_is_rejected(cache, arch):
    with pytest.raises(ValueError, match="sm_80.*sm_90a"):
        compile_cuda(AXPY, arch=arch)


def test_arch_in_options_is_rejected(cache):
    with pytest.raises(ValueError, match="arch="):
        compile_cuda(AXPY, arch="sm_80", options=("--gpu-architecture=sm_90",))


def test_options_must_be_a_tuple_of_strings(cache):
    with pytest.raises(TypeError, match="tuple of strings"):
        compile_cuda(AXPY, arch="sm_80", options="-O3")


def test_bad_option_reports_the_log(cache):
    with pytest.raises(CompileError, match="unrecognized option"):
        compile_cuda(AXPY, arch="sm_80", options=("--no-such-option",))


# ---------------------------------------------------------------------------------------------
# Cache


def test_second_compile_is_a_cache_hit(cache):
    first = compile_cuda(AXPY, arch="sm_90a")
    assert not first.from_cache
    assert len(_entries(cache)) == 1
    second = compile_cuda(AXPY, arch="sm_90a")
    assert second.from_cache
    assert second.cubin == first.cubin
    assert second.resources == first.resources
    assert second.log == first.log
    assert second.options == first.options
    assert second == first  # from_cache and timing are not part of a module's identity


@pytest.mark.parametrize("change", [
    pytest.param({"arch": "sm_80"}, id="arch"),
    pytest.param({"options": ("-DTILE=64",)}, id="options"),
    pytest.param({"filename": "other.cu"}, id="filename"),
    pytest.param({"source": AXPY + "\n// edited\n"}, id="source"),
])
def test_anything_that_changes_the_cubin_misses(cache, change):
    compile_cuda(AXPY, arch="sm_90a")
    kwargs = {"arch": "sm_90a", **change}
    source = kwargs.pop("source", AXPY)
    assert not compile_cuda(source, **kwargs).from_cache
    assert len(_entries(cache)) == 2


def test_use_cache_false_neither_reads_nor_writes(cache):
    compile_cuda(AXPY, arch="sm_80", use_cache=False)
    assert _entries(cache) == []
    compile_cuda(AXPY, arch="sm_80")
    assert not compile_cuda(AXPY, arch="sm_80", use_cache=False).from_cache


def _truncate(b: bytes) -> bytes:
    return b[: len(b) // 2]


def _flip_last(b: bytes) -> bytes:
    return b[:-1] + bytes([b[-1] ^ 0xFF])


def _flip_middle(b: bytes) -> bytes:
    i = len(b) // 2
    return b[:i] + bytes([b[i] ^ 0x01]) + b[i + 1:]


def _bad_magic(b: bytes) -> bytes:
    return b"XXXXXXXX" + b[8:]


@pytest.mark.parametrize("corrupt", [
    pytest.param(_truncate, id="truncated"),
    pytest.param(lambda b: b[:10], id="header-cut"),
    pytest.param(lambda b: b"", id="empty"),
    pytest.param(_flip_last, id="cubin-byte-flipped"),
    pytest.param(_flip_middle, id="middle-byte-flipped"),
    pytest.param(_bad_magic, id="bad-magic"),
    pytest.param(lambda b: b + b"trailing", id="trailing-garbage"),
    pytest.param(lambda b: os.urandom(len(b)), id="random"),
])
def test_corrupt_entry_is_recompiled_and_rewritten(cache, corrupt):
    good = compile_cuda(AXPY, arch="sm_90a")
    (entry,) = _entries(cache)
    entry.write_bytes(corrupt(entry.read_bytes()))
    again = compile_cuda(AXPY, arch="sm_90a")
    assert not again.from_cache  # never trusted
    assert again.cubin == good.cubin
    decoded = nvrtc._decode_entry(entry.read_bytes(), entry.stem)  # rewritten whole
    assert decoded is not None and decoded[0] == good.cubin
    assert compile_cuda(AXPY, arch="sm_90a").from_cache


def test_entry_with_valid_checksum_but_wrong_key_is_ignored(cache):
    compile_cuda(AXPY, arch="sm_90a")
    compile_cuda(AXPY, arch="sm_80")
    a, b = _entries(cache)
    a.write_bytes(b.read_bytes())  # a well-formed entry, filed under the wrong name
    for arch in ("sm_90a", "sm_80"):
        m = compile_cuda(AXPY, arch=arch)
        assert m.cubin[:4] == b"\x7fELF"
    # whichever was overwritten is recompiled, not served with the other arch's cubin
    hits = [compile_cuda(AXPY, arch=x) for x in ("sm_90a", "sm_80")]
    assert all(h.from_cache for h in hits)
    assert hits[0].cubin != hits[1].cubin


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("FIRESCHED_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "firesched"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "firesched"
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


def test_firesched_cache_dir_is_used(cache):
    compile_cuda(AXPY, arch="sm_80")
    assert len(_entries(cache)) == 1
    assert cache_dir() == cache


def test_clear_cache(cache):
    compile_cuda(AXPY, arch="sm_80")
    compile_cuda(AXPY, arch="sm_90a")
    assert clear_cache() == 2
    assert _entries(cache) == []
    assert not compile_cuda(AXPY, arch="sm_80").from_cache


def test_unwritable_cache_warns_once_and_still_compiles(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(RuntimeWarning, match="FIRESCHED_CACHE_DIR"):
        m = compile_cuda(AXPY, arch="sm_80")
    assert m.cubin[:4] == b"\x7fELF" and not m.from_cache
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m2 = compile_cuda(AXPY, arch="sm_80")
    assert not m2.from_cache


def test_cache_hit_is_fast(cache):
    big = AXPY + "".join(f"// generated line {i:05d} {'-' * 80}\n" for i in range(1100))
    assert len(big) > 100_000
    compile_cuda(big, arch="sm_90a")
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        m = compile_cuda(big, arch="sm_90a")
        best = min(best, time.perf_counter() - t)
        assert m.from_cache
    assert best < 5e-3, f"a cache hit took {best * 1e3:.2f} ms"


_CHILD = r"""
import sys, time
from pathlib import Path
from firesched.cuda.nvrtc import compile_cuda
go = Path(sys.argv[1])
source = Path(sys.argv[2]).read_text()
print("ready", flush=True)
while not go.exists():
    time.sleep(0.0005)
m = compile_cuda(source, arch="sm_90a")
print(len(m.cubin), m.from_cache, flush=True)
"""


def test_two_processes_compiling_the_same_source(cache, tmp_path):
    src_file = tmp_path / "k.cu"
    src_file.write_text(SPILLY)  # a few tens of ms of ptxas: the two compiles overlap
    go = tmp_path / "go"
    env = dict(os.environ, FIRESCHED_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(go), str(src_file)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        size, _ = out.split()
        assert int(size) > 0
    (entry,) = _entries(cache)
    assert not [p for p in (cache / "cubin").iterdir() if p.name.startswith(".tmp-")]
    m = compile_cuda(SPILLY, arch="sm_90a")
    assert m.from_cache
    assert m.cubin == compile_cuda(SPILLY, arch="sm_90a", use_cache=False).cubin


def test_supported_archs_listed():
    assert SUPPORTED_ARCHS == ("sm_70", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a")


# ---------------------------------------------------------------------------------------------
# Runtime without a GPU


def test_numpy_array_is_host_memory():
    a = np.zeros((64, 32), np.float32)
    d = as_device_array(a, "A")
    assert d.device is None and d.kind == "numpy"
    assert d.shape == (64, 32) and d.strides == (32, 1) and d.dtype == "f32"
    assert d.ptr == a.ctypes.data
    t = as_device_array(a.T, "A")
    assert t.shape == (32, 64) and t.strides == (1, 32)


def test_numpy_array_is_rejected_as_on_the_cpu():
    a = np.zeros((64, 32), np.float32)
    spec = ArgSpec("A", (64, 32), "f32", (32, 1))
    with pytest.raises(ValueError, match="A is on the CPU; move it to the GPU"):
        check_args([spec], [as_device_array(a, "A")], "gemm")


@pytest.mark.parametrize("np_dtype,name", [
    pytest.param(np.float16, "f16", id="f16"),
    pytest.param(np.float64, "f64", id="f64"),
    pytest.param(np.int8, "i8", id="i8"),
    pytest.param(np.uint8, "u8", id="u8"),
    pytest.param(np.int32, "i32", id="i32"),
    pytest.param(np.int64, "i64", id="i64"),
])
def test_numpy_dtypes(np_dtype, name):
    assert as_device_array(np.zeros(4, np_dtype), "x").dtype == name


def test_ml_dtypes_bf16_and_fp8():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert as_device_array(np.zeros(4, ml_dtypes.bfloat16), "x").dtype == "bf16"
    assert as_device_array(np.zeros(4, ml_dtypes.float8_e4m3fn), "x").dtype == "f8e4m3"
    assert as_device_array(np.zeros(4, ml_dtypes.float8_e5m2), "x").dtype == "f8e5m2"


def test_unsupported_objects_are_named():
    with pytest.raises(ValueError, match=r"argument X is a builtins.list; expected a torch tensor"):
        as_device_array([1.0, 2.0], "X")
    with pytest.raises(ValueError, match="argument X has dtype"):
        as_device_array(np.zeros(3, np.complex64), "X")


class _FakeCAI:
    def __init__(self, typestr: str):
        self.__cuda_array_interface__ = {
            "shape": (4,), "typestr": typestr, "data": (0x1000, False), "strides": None,
            "version": 3,
        }


def test_cuda_array_interface_without_a_standard_typestr_is_rejected():
    with pytest.raises(ValueError, match="DLPack"):
        as_device_array(_FakeCAI("<V2"), "B")


class _DLPackOnly:
    """Exposes nothing but the DLPack protocol of the array it wraps."""

    def __init__(self, a, *, legacy: bool):
        self._a = a
        self._legacy = legacy

    def __dlpack__(self, **kwargs):
        if self._legacy:
            if kwargs:
                raise TypeError("legacy producer: no keywords")
            return self._a.__dlpack__()
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@pytest.mark.parametrize("legacy", [pytest.param(True, id="dltensor"), pytest.param(False, id="versioned")])
def test_dlpack_host_array_is_read_without_consuming(legacy):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    d = as_device_array(_DLPackOnly(a, legacy=legacy), "C")
    assert d.kind == "dlpack" and d.device is None
    assert d.shape == (4, 3) and d.strides == (6, 2) and d.dtype == "f32"
    assert d.ptr == a.ctypes.data
    assert d.keepalive is not None
    del d  # the capsule's own destructor frees the managed tensor
    assert a.sum() == np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2].sum()


def _arr(**kw) -> DeviceArray:
    base = dict(ptr=0x7F0000001000, shape=(128, 64), strides=(64, 1), dtype="f16", device=0,
                kind="torch", stream=0)
    base.update(kw)
    return DeviceArray(**base)


SPEC_A = ArgSpec("A", (128, 64), "f16", (64, 1), align_bytes=16)
SPEC_B = ArgSpec("B", (64, 4096), "f16", (4096, 1), align_bytes=16)
SPEC_C = ArgSpec("C", (128, 4096), "f32", (4096, 1), align_bytes=16, writable=True)


def _good():
    return [_arr(),
            _arr(shape=(64, 4096), strides=(4096, 1)),
            _arr(shape=(128, 4096), strides=(4096, 1), dtype="f32")]


@pytest.mark.parametrize("index,change,expected", [
    pytest.param(0, {"dtype": "f32"}, r"A has dtype f32, expected f16; convert it, e\.g\. A\.to\(torch\.float16\)",
                 id="dtype"),
    pytest.param(1, {"shape": (64, 2048), "strides": (2048, 1)},
                 r"B has shape \(64, 2048\), expected \(64, 4096\)", id="shape"),
    pytest.param(1, {"strides": (1, 64)},
                 r"B is not row-major contiguous: strides \(1, 64\), expected \(4096, 1\).*"
                 r"pass B\.contiguous\(\).*layout=", id="strides"),
    pytest.param(0, {"ptr": 0x7F0000001002},
                 r"A's data pointer 0x7f0000001002 is not aligned to 16 bytes.*A\.clone\(\)",
                 id="alignment"),
    pytest.param(2, {"device": None}, r"C is on the CPU; move it to the GPU, e\.g\. C\.cuda\(\)",
                 id="cpu"),
    pytest.param(2, {"device": 1}, r"different devices \(A, B on cuda:0, C on cuda:1\)",
                 id="devices"),
    pytest.param(2, {"readonly": True}, r"C is read-only, but kernel gemm writes it", id="readonly"),
    pytest.param(0, {"dtype": "bf16", "kind": "cupy"}, r"A has dtype bf16, expected f16.*astype\('float16'\)",
                 id="dtype-cupy"),
])
def test_check_args_messages(index, change, expected):
    arrays = _good()
    arrays[index] = attrs.evolve(arrays[index], **change)
    with pytest.raises(ValueError, match=expected):
        check_args([SPEC_A, SPEC_B, SPEC_C], arrays, "gemm")


def test_check_args_wrong_count():
    with pytest.raises(ValueError, match=r"kernel gemm takes 3 array argument\(s\) \(A, B, C\) but 2"):
        check_args([SPEC_A, SPEC_B, SPEC_C], _good()[:2], "gemm")


def test_check_args_reports_every_problem_at_once():
    arrays = _good()
    arrays[0] = attrs.evolve(arrays[0], dtype="f32", ptr=0x7F0000001004)
    with pytest.raises(ValueError, match="2 argument problems") as info:
        check_args([SPEC_A, SPEC_B, SPEC_C], arrays, "gemm")
    assert "dtype f32" in str(info.value) and "not aligned" in str(info.value)


def test_check_args_passes_and_returns_the_device():
    assert check_args([SPEC_A, SPEC_B, SPEC_C], _good(), "gemm") == 0
    on1 = [attrs.evolve(a, device=1) for a in _good()]
    assert check_args([SPEC_A, SPEC_B, SPEC_C], on1, "gemm") == 1


def test_strides_of_unit_dimensions_do_not_matter():
    spec = ArgSpec("v", (1, 64), "f32", (64, 1))
    assert check_args([spec], [_arr(shape=(1, 64), strides=(1, 1), dtype="f32")], "k") == 0
    empty = ArgSpec("e", (0, 64), "f32", (64, 1))
    assert check_args([empty], [_arr(shape=(0, 64), strides=(1, 7), dtype="f32")], "k") == 0


def test_column_major_expectation_is_named():
    spec = ArgSpec("B", (64, 32), "f16", (1, 64))
    with pytest.raises(ValueError, match="B is not column-major contiguous"):
        check_args([spec], [_arr(shape=(64, 32), strides=(32, 1))], "k")


def test_argspec_validates_itself():
    with pytest.raises(ValueError, match="unknown dtype 'f17'"):
        ArgSpec("A", (4,), "f17", (1,))
    with pytest.raises(ValueError, match="1 strides for a 2-d shape"):
        ArgSpec("A", (4, 4), "f32", (1,))


def test_parameter_layout_packs_scalars_pointers_and_blobs():
    blob = bytes(range(128))
    layout = runtime._ParamLayout((ctypes.c_void_p, ctypes.c_int, ctypes.c_float, 128, ctypes.c_int64))
    addr = layout.pack([0x1234, -5, 1.5, blob, 2**40])
    ptrs = (ctypes.c_void_p * 5).from_address(addr)
    assert ctypes.c_uint64.from_address(ptrs[0]).value == 0x1234
    assert ctypes.c_int.from_address(ptrs[1]).value == -5
    assert ctypes.c_float.from_address(ptrs[2]).value == 1.5
    assert ctypes.string_at(ptrs[3], 128) == blob
    assert ptrs[3] % 64 == 0
    assert ctypes.c_int64.from_address(ptrs[4]).value == 2**40
    # DeviceArray, ctypes values and None are accepted where a pointer goes
    addr = layout.pack([_arr(ptr=0xABC0), ctypes.c_int(7), 2.0, bytearray(blob), 1])
    ptrs = (ctypes.c_void_p * 5).from_address(addr)
    assert ctypes.c_uint64.from_address(ptrs[0]).value == 0xABC0
    assert ctypes.c_int.from_address(ptrs[1]).value == 7


@pytest.mark.parametrize("values,match", [
    pytest.param([0, 2**40, 1.0, bytes(128), 0], "parameter 1", id="int-overflow"),
    pytest.param([0, 1, 1.0, bytes(64), 0], "128-byte blob", id="short-blob"),
    pytest.param(["ptr", 1, 1.0, bytes(128), 0], "parameter 0 is a pointer", id="bad-pointer"),
])
def test_parameter_layout_rejects_bad_values(values, match):
    layout = runtime._ParamLayout((ctypes.c_void_p, ctypes.c_int, ctypes.c_float, 128, ctypes.c_int64))
    with pytest.raises(ValueError, match=match):
        layout.pack(values)


def test_parameter_layout_rejects_unsupported_types():
    with pytest.raises(TypeError, match="unsupported type"):
        runtime._ParamLayout((str,))


@pytest.mark.skipif(runtime.gpu_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("action", [
    pytest.param(lambda: runtime.load_module(b"\x7fELF"), id="load"),
    pytest.param(lambda: runtime.launch(None, (1, 1, 1), (32, 1, 1), 0, [(0, ctypes.c_void_p)]),
                 id="launch"),
])
def test_without_a_gpu_launching_says_why(action):
    with pytest.raises(LaunchError, match=r"no usable CUDA device/driver.*Compiling still works"):
        action()
    assert runtime.gpu_unavailable_reason()


def test_without_a_gpu_a_compiled_module_still_exists(cache):
    m = compile_cuda(AXPY, arch="sm_90a")
    assert isinstance(m, nvrtc.CompiledModule) and m.cubin
