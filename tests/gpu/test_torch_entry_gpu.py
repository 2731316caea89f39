"""``firesched.matmul`` on the GPU against torch: shapes, dtypes, bias and activations,
non-contiguous inputs, ``out=``, outputs allocated for named calls, the current stream, inside
``torch.compile`` and inside a captured CUDA graph."""

from __future__ import annotations

import pytest

import firesched as fs
from firesched import torch_ops

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

ACT = {None: lambda x: x, "relu": torch.relu, "gelu": torch.nn.functional.gelu, "sigmoid": torch.sigmoid,
       "tanh": torch.tanh, "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}


def _ref(a, b, bias=None, activation=None):
    r = a.double() @ b.double()
    if bias is not None:
        r = r + bias.double()
    return ACT[activation](r)


def _close(got, want, dtype):
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol)


def _rand(*shape, dtype=torch.float16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("M, N, K", [(128, 128, 64), (1000, 1000, 1000), (256, 512, 128), (77, 131, 40),
                                     (1, 64, 32), (513, 8, 24)])
def test_matmul_matches_torch(M, N, K, dtype):
    a, b = _rand(M, K, dtype=dtype, seed=1), _rand(K, N, dtype=dtype, seed=2)
    c = fs.matmul(a, b)
    assert c.shape == (M, N) and c.dtype == dtype and c.is_contiguous()
    _close(c, _ref(a, b), dtype)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "sigmoid", "tanh"])
def test_bias_and_activations(activation):
    a, b, bias = _rand(200, 96, seed=3), _rand(96, 160, seed=4), _rand(160, seed=5)
    _close(fs.matmul(a, b, bias, activation), _ref(a, b, bias, activation), torch.float16)


@pytest.mark.parametrize("make", [
    lambda: (_rand(64, 256).t(), _rand(64, 128)),                    # column-major A
    lambda: (_rand(256, 64), _rand(128, 64).t()),                    # column-major B (x @ w.t())
    lambda: (_rand(256, 96)[:, :64], _rand(64, 128)),                # a slice: leading dimension 96
    lambda: (_rand(257, 64)[1:], _rand(64, 128)),                    # a view one row (128 bytes) in: aligned
    lambda: (_rand(256, 65)[:, 1:], _rand(64, 128)),                 # misaligned start, strided rows
    lambda: (_rand(256, 64), _rand(64, 1).expand(64, 128)),          # a broadcast B
], ids=["A-col", "B-col", "A-slice", "A-offset-row", "A-offset-col", "B-broadcast"])
def test_non_contiguous_inputs(make):
    a, b = make()
    bias = _rand(256, seed=9)[::2]                                   # a strided bias
    _close(fs.matmul(a, b, bias[: b.shape[1]], "relu"), _ref(a, b, bias[: b.shape[1]], "relu"), torch.float16)


def test_out_is_written_and_returned():
    a, b = _rand(128, 64), _rand(64, 256)
    out = torch.empty(128, 256, dtype=torch.float16, device="cuda")
    assert fs.matmul(a, b, out=out) is out
    _close(out, _ref(a, b), torch.float16)
    wide = torch.zeros(128, 512, dtype=torch.float16, device="cuda")
    view = wide[:, ::2]                                              # a strided out: copied into
    assert fs.matmul(a, b, out=view) is view
    _close(view, _ref(a, b), torch.float16)
    assert wide[:, 1::2].abs().max().item() == 0


def test_kernels_are_cached_per_key():
    a, b = _rand(96, 64), _rand(64, 96)
    fs.matmul(a, b)
    n = len(torch_ops._KERNELS)
    fs.matmul(_rand(96, 64, seed=7), _rand(64, 96, seed=8))
    assert len(torch_ops._KERNELS) == n
    fs.matmul(a, b.t().contiguous().t())                             # another majorness: another kernel
    assert len(torch_ops._KERNELS) == n + 1


def test_runs_on_the_current_stream():
    a, b = _rand(2048, 2048), _rand(2048, 2048)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        c = fs.matmul(a, b)
        d = c.float().sum()                                          # ordered after the kernel on s
    s.synchronize()
    torch.testing.assert_close(d.double(), _ref(a, b).sum(), rtol=1e-2, atol=50.0)


def test_inside_torch_compile():
    a, b, bias = _rand(256, 128), _rand(128, 192), _rand(192)

    def f(x, y, z):
        return fs.matmul(x * 2, y, z, "relu") + 1

    compiled = torch.compile(f, fullgraph=True)
    _close(compiled(a, b, bias), _ref(a * 2, b, bias, "relu") + 1, torch.float16)


def test_inside_a_captured_cuda_graph():
    a, b, bias = _rand(512, 256), _rand(256, 384), _rand(384)
    fs.matmul(a, b, bias)                                            # warm-up: compile and load outside
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = fs.matmul(a, b, bias, "gelu")
    a.copy_(_rand(512, 256, seed=11))
    g.replay()
    torch.cuda.synchronize()
    _close(c, _ref(a, b, bias, "gelu"), torch.float16)


def test_first_call_inside_a_capture():
    """Compiling, loading and allocating workspaces go around the capture (relaxed mode)."""
    a, b = _rand(40, 24, seed=12), _rand(24, 36, seed=13)           # rows of 48 / 72 bytes: padded copies
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = fs.matmul(a, b)
    g.replay()
    torch.cuda.synchronize()
    _close(c, _ref(a, b), torch.float16)


def test_compiled_kernel_allocates_named_outputs():
    sched = fs.recipes.gemm(128, 96, 64, epilogue_ops=(fs.ops.bias("bias"),))
    k = fs.compile(sched)
    a, b, bias = _rand(128, 64), _rand(64, 96), _rand(96)
    c = k(a, b, bias=bias)
    assert c.shape == (128, 96) and c.device == a.device and c.dtype == torch.float16
    _close(c, _ref(a, b, bias), torch.float16)
    c2 = k(A=a, B=b, bias=bias, C=torch.empty_like(c))
    _close(c2, c, torch.float16)
