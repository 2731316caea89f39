"""Loading and launching compiled kernels on a real GPU, with torch, CuPy and DLPack arrays."""

from __future__ import annotations

import ctypes
import statistics
import time

import attrs
import pytest

from firesched.cuda.nvrtc import SUPPORTED_ARCHS, compile_cuda
from firesched.errors import LaunchError
from firesched.runtime import (
    ArgSpec,
    as_device_array,
    check_args,
    contiguous_strides,
    device_info,
    launch,
    load_module,
)

pytestmark = pytest.mark.gpu

AXPY = r"""
extern "C" __global__ void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""

# Every thread writes its slice of a large dynamic shared buffer, then reads a neighbour's.
BIG_SMEM = r"""
extern "C" __global__ void smem_roll(const float* __restrict__ x, float* __restrict__ y, int words) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < words; i += blockDim.x) buf[i] = x[i];
  __syncthreads();
  for (int i = threadIdx.x; i < words; i += blockDim.x) y[i] = buf[(i + 1) % words];
}
"""

BLOB = r"""
struct __align__(64) Blob { unsigned char b[128]; };
extern "C" __global__ void copy_blob(const __grid_constant__ Blob p, unsigned char* out, int scale) {
  out[threadIdx.x] = (unsigned char)(p.b[threadIdx.x] * scale);
}
"""


def _arch() -> str:
    major, minor = device_info(0).compute_capability
    arch = "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
    if arch not in SUPPORTED_ARCHS:
        pytest.skip(f"no firesched arch for compute capability {major}.{minor}")
    return arch


@pytest.fixture(scope="module")
def axpy():
    m = compile_cuda(AXPY, arch=_arch(), use_cache=False)
    return load_module(m, device=0).kernel("axpy")


def _axpy_specs(n: int):
    return [ArgSpec("x", (n,), "f32", (1,)), ArgSpec("y", (n,), "f32", (1,), writable=True)]


def _run_axpy(kernel, x, y, a: float, n: int) -> None:
    dx, dy = as_device_array(x, "x"), as_device_array(y, "y")
    check_args(_axpy_specs(n), [dx, dy], "axpy")
    launch(kernel, ((n + 255) // 256, 1, 1), (256, 1, 1), 0,
           [(a, ctypes.c_float), (dx, ctypes.c_void_p), (dy, ctypes.c_void_p), (n, ctypes.c_int)],
           stream=dy.stream if dy.stream is not None else 0)


def test_axpy_on_torch_tensors(axpy):
    torch = pytest.importorskip("torch")
    n = 10_000
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    want = 2.5 * x + y
    dy = as_device_array(y, "y")
    assert dy.kind == "torch" and dy.device == 0
    assert dy.stream == torch.cuda.current_stream().cuda_stream
    _run_axpy(axpy, x, y, 2.5, n)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, want)


def test_axpy_on_a_side_stream(axpy):
    torch = pytest.importorskip("torch")
    n = 4096
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.ones(n, device="cuda")
        y = torch.full((n,), 3.0, device="cuda")
        assert as_device_array(y, "y").stream == s.cuda_stream
        _run_axpy(axpy, x, y, 2.0, n)
        s.synchronize()
    assert torch.all(y == 5.0)


def test_axpy_with_a_stream_object(axpy):
    torch = pytest.importorskip("torch")
    n = 1000
    x = torch.ones(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    s = torch.cuda.current_stream()
    axpy.launch((4, 1, 1), (256, 1, 1), [(3.0, ctypes.c_float), (x.data_ptr(), ctypes.c_void_p),
                                         (y, ctypes.c_void_p), (n, ctypes.c_int)], stream=s)
    s.synchronize()
    assert torch.all(y == 3.0)


def test_axpy_on_cupy_arrays(axpy):
    cupy = pytest.importorskip("cupy")
    n = 5000
    x = cupy.arange(n, dtype=cupy.float32)
    y = cupy.ones(n, dtype=cupy.float32)
    dx = as_device_array(x, "x")
    assert dx.kind == "cupy" and dx.device == 0 and dx.ptr == x.data.ptr
    assert dx.stream == cupy.cuda.get_current_stream().ptr
    _run_axpy(axpy, x, y, 0.5, n)
    cupy.cuda.get_current_stream().synchronize()
    assert cupy.allclose(y, 0.5 * cupy.arange(n, dtype=cupy.float32) + 1)


def test_launch_of_a_raw_cufunction(axpy):
    torch = pytest.importorskip("torch")
    n = 256
    x = torch.ones(n, device="cuda")
    y = torch.ones(n, device="cuda")
    launch(axpy.handle, (1, 1, 1), (256, 1, 1), 0,
           [(4.0, ctypes.c_float), (x, ctypes.c_void_p), (y, ctypes.c_void_p), (n, ctypes.c_int)],
           stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.all(y == 5.0)


class _DLPackOnly:
    """An array seen only through DLPack."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kwargs):
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


class _CAIOnly:
    """An array seen only through __cuda_array_interface__."""

    def __init__(self, t):
        self.__cuda_array_interface__ = t.__cuda_array_interface__


@pytest.mark.parametrize("wrap,kind", [
    pytest.param(_DLPackOnly, "dlpack", id="dlpack"),
    pytest.param(_CAIOnly, "cai", id="cuda-array-interface"),
])
def test_axpy_through_array_protocols(axpy, wrap, kind):
    torch = pytest.importorskip("torch")
    n = 3000
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    want = -1.5 * x + y
    wx, wy = wrap(x), wrap(y)
    dx = as_device_array(wx, "x")
    assert dx.kind == kind and dx.device == 0 and dx.ptr == x.data_ptr()
    assert dx.shape == (n,) and dx.strides == (1,) and dx.dtype == "f32"
    dx, dy = as_device_array(wx, "x"), as_device_array(wy, "y")
    check_args(_axpy_specs(n), [dx, dy], "axpy")
    stream = torch.cuda.current_stream().cuda_stream
    axpy.launch(((n + 127) // 128, 1, 1), (128, 1, 1),
                [(-1.5, ctypes.c_float), (dx, ctypes.c_void_p), (dy, ctypes.c_void_p), (n, ctypes.c_int)],
                stream=stream)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, want)


def test_torch_dtypes_and_layouts():
    torch = pytest.importorskip("torch")
    a = torch.zeros(64, 32, device="cuda", dtype=torch.bfloat16)
    d = as_device_array(a, "A")
    assert d.dtype == "bf16" and d.strides == (32, 1)
    t = as_device_array(a.t(), "A")
    assert t.shape == (32, 64) and t.strides == (1, 32)
    assert as_device_array(torch.zeros(4, device="cuda", dtype=torch.float8_e4m3fn), "q").dtype == "f8e4m3"
    cpu = as_device_array(torch.zeros(4), "c")
    assert cpu.device is None and cpu.kind == "torch"


def test_check_args_on_real_tensors():
    torch = pytest.importorskip("torch")
    b = torch.zeros(4096, 64, device="cuda", dtype=torch.float16).t()  # (64, 4096), column-major
    spec = ArgSpec("B", (64, 4096), "f16", contiguous_strides((64, 4096)))
    with pytest.raises(ValueError, match=r"B is not row-major contiguous: strides \(1, 64\), expected \(4096, 1\)"):
        check_args([spec], [as_device_array(b, "B")], "gemm")
    assert check_args([spec], [as_device_array(b.contiguous(), "B")], "gemm") == 0
    with pytest.raises(ValueError, match=r"B is on the CPU; move it to the GPU, e\.g\. B\.cuda\(\)"):
        check_args([spec], [as_device_array(b.cpu().contiguous(), "B")], "gemm")
    flat = torch.zeros(64 * 4096 + 1, device="cuda", dtype=torch.float16)
    off = flat[1:].view(64, 4096)
    with pytest.raises(ValueError, match="not aligned to 16 bytes"):
        check_args([spec], [as_device_array(off, "B")], "gemm")


def test_dynamic_shared_memory_above_48_kib():
    torch = pytest.importorskip("torch")
    kernel = load_module(compile_cuda(BIG_SMEM, arch=_arch(), use_cache=False)).kernel("smem_roll")
    words = 150 * 1024 // 4  # 150 KiB, past the 48 KiB default, within Hopper's/Ampere's opt-in
    if words * 4 > device_info(0).max_shared_per_block_optin:
        pytest.skip("this GPU cannot give a block 150 KiB of shared memory")
    x = torch.arange(words, device="cuda", dtype=torch.float32)
    y = torch.zeros(words, device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream
    kernel.launch((1, 1, 1), (512, 1, 1), [(x, ctypes.c_void_p), (y, ctypes.c_void_p), (words, ctypes.c_int)],
                  shared_bytes=words * 4, stream=stream)
    torch.cuda.synchronize()
    assert torch.equal(y, torch.roll(x, -1))
    too_much = device_info(0).max_shared_per_block_optin + 1024
    with pytest.raises(LaunchError, match="more than the .* bytes device 0"):
        kernel.launch((1, 1, 1), (512, 1, 1), [(x, ctypes.c_void_p), (y, ctypes.c_void_p), (words, ctypes.c_int)],
                      shared_bytes=too_much, stream=stream)


def test_grid_constant_blob():
    torch = pytest.importorskip("torch")
    kernel = load_module(compile_cuda(BLOB, arch=_arch(), use_cache=False)).kernel("copy_blob")
    out = torch.zeros(128, device="cuda", dtype=torch.uint8)
    blob = bytes(range(128))
    kernel.launch((1, 1, 1), (128, 1, 1), [(blob, None), (out, ctypes.c_void_p), (2, ctypes.c_int)],
                  stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert out.cpu().tolist() == [(2 * i) % 256 for i in range(128)]


def test_resource_report_with_a_driver_present():
    """With a driver installed NVRTC may serve CUBINs from the driver's compute cache and skip
    ptxas, whose report we parse; every compile must still report every kernel."""
    for _ in range(3):
        m = compile_cuda(AXPY, arch=_arch(), use_cache=False)
        assert m.resources_of("axpy").registers > 0


def test_modules_and_kernels_are_cached(axpy):
    m = compile_cuda(AXPY, arch=_arch(), use_cache=False)
    a = load_module(m)
    assert load_module(m.cubin) is a
    assert a.kernel("axpy") is a.kernel("axpy")


def test_launch_errors_are_clear(axpy):
    torch = pytest.importorskip("torch")
    module = load_module(compile_cuda(AXPY, arch=_arch(), use_cache=False))
    with pytest.raises(LaunchError, match=r"no kernel named 'saxpy'.*extern \"C\""):
        module.kernel("saxpy")
    y = torch.zeros(16, device="cuda")
    with pytest.raises(LaunchError, match="threads is more than its limit"):
        axpy.launch((1, 1, 1), (2048, 1, 1), [(1.0, ctypes.c_float), (y, ctypes.c_void_p),
                                              (y, ctypes.c_void_p), (16, ctypes.c_int)])
    if axpy._param_sizes is not None:
        with pytest.raises(LaunchError, match="takes 4 parameters but 3 were given"):
            axpy.launch((1, 1, 1), (32, 1, 1), [(1.0, ctypes.c_float), (y, ctypes.c_void_p),
                                                (y, ctypes.c_void_p)])
        with pytest.raises(LaunchError, match="parameter 3 is 4 bytes"):
            axpy.launch((1, 1, 1), (32, 1, 1), [(1.0, ctypes.c_float), (y, ctypes.c_void_p),
                                                (y, ctypes.c_void_p), (16, ctypes.c_int64)])


def test_declared_parameter_count_is_checked_against_the_cubin():
    # a caller that knows the signature asks for exactly its parameters (no probe past the last,
    # which compute-sanitizer reports as an API error); a CUBIN with fewer is refused at load
    module = load_module(compile_cuda(AXPY, arch=_arch(), use_cache=False))
    with pytest.raises(LaunchError, match="takes 4 parameters, not the 5 its signature declared"):
        module.kernel("axpy", params=5)
    k = module.kernel("axpy", params=4)
    if k._param_sizes is not None:
        assert k._param_sizes == (4, 8, 8, 4)


def test_cubin_for_another_arch_is_refused():
    """sm_90a code runs on compute capability 9.0 alone; on a 9.0 GPU, an sm_80 CUBIN without its
    PTX cannot load (with its PTX it does: tests/gpu/test_ptx_fallback_gpu.py)."""
    cc = device_info(0).compute_capability
    if cc != (9, 0):
        m = compile_cuda(AXPY, arch="sm_90a", use_cache=False)
        with pytest.raises(LaunchError, match="compiled for sm_90a, whose CUBIN and PTX run on compute capability "
                                              "9.0 only"):
            load_module(m)
        return
    m = compile_cuda(AXPY, arch="sm_80", use_cache=False)
    with pytest.raises(LaunchError, match="compiled for sm_80, whose CUBIN does not run on compute capability 9.0, "
                                          "and it carries no PTX"):
        load_module(attrs.evolve(m, ptx=""))
    assert load_module(m).from_ptx


def test_cached_launch_overhead(axpy):
    torch = pytest.importorskip("torch")
    n = 1024
    x = torch.ones(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    dx, dy = as_device_array(x, "x"), as_device_array(y, "y")
    stream = dy.stream
    args = [(0.0, ctypes.c_float), (dx.ptr, ctypes.c_void_p), (dy.ptr, ctypes.c_void_p), (n, ctypes.c_int)]
    for _ in range(50):
        axpy.launch((4, 1, 1), (256, 1, 1), args, stream=stream)
    torch.cuda.synchronize()
    samples = []
    clock = time.perf_counter_ns
    for rep in range(1000):
        t0 = clock()
        axpy.launch((4, 1, 1), (256, 1, 1), args, stream=stream)
        samples.append(clock() - t0)
        if rep % 200 == 199:
            torch.cuda.synchronize()  # keep the launch queue from filling up (that blocks)
    torch.cuda.synchronize()
    median_us = statistics.median(samples) / 1e3
    print(f"\ncached launch: median {median_us:.2f} us of host time per launch "
          f"(p10 {statistics.quantiles(samples, n=10)[0] / 1e3:.2f} us)")
    assert median_us < 40.0
