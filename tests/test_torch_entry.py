"""``firesched.matmul`` without a GPU: ``import firesched`` leaves torch alone, the argument checks
and the kernel cache key (``torch_ops.plan`` on tensor descriptions, no torch needed), and, where
torch is installed, the errors a torch caller sees."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from firesched.torch_ops import MatmulKey, TensorInfo, plan


def test_import_firesched_does_not_import_torch():
    """Run in a fresh interpreter in which importing torch raises: firesched imports, and
    ``firesched.matmul`` exists, without trying."""
    code = textwrap.dedent("""
        import sys
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch was imported")
        sys.meta_path.insert(0, NoTorch())
        import firesched
        assert callable(firesched.matmul) and firesched.matmul.__doc__
        import firesched.torch_ops
        assert "torch" not in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def T(shape, strides=None, dtype="f16", device=0, ptr=1 << 20, torch_dtype="torch.float16"):
    if strides is None:
        strides = (shape[1], 1) if len(shape) == 2 else (1,) * len(shape)
    return TensorInfo(shape, strides, dtype, device, ptr, torch_dtype)


A = T((100, 40))
B = T((40, 72))
H100 = dict(capability=(9, 0), smem_optin=227 * 1024)
A100 = dict(capability=(8, 0), smem_optin=163 * 1024)


def test_the_key_holds_what_the_kernel_depends_on():
    p = plan(A, B, T((72,)), "relu", **H100)
    assert p.key == MatmulKey(100, 72, 40, "f16", "RR", True, "relu", 0, "sm_90a")
    assert not (p.copy_a or p.copy_b or p.copy_bias)
    assert plan(A, B, **A100).key.arch == "sm_80"
    assert plan(A, B, capability=(8, 9)).key.arch == "sm_89"
    keys = {plan(A, B, **H100).key, plan(A, B, T((72,)), **H100).key, plan(A, B, None, "gelu", **H100).key,
            plan(T((100, 40), dtype="bf16", torch_dtype="torch.bfloat16"),
                 T((40, 72), dtype="bf16", torch_dtype="torch.bfloat16"), **H100).key,
            plan(T((100, 40), device=1), T((40, 72), device=1), **H100).key,
            plan(A, T((40, 72), strides=(1, 40)), **H100).key, plan(A, B, **A100).key}
    assert len(keys) == 7


@pytest.mark.parametrize("a, b, arch, layout, copy_a, copy_b", [
    # a column-major B (b = w.t() of a row-major w) is read in place on both recipes
    (A, T((40, 72), strides=(1, 40)), "sm_90a", "RC", False, False),
    # a column-major A is read in place by the sm_80 recipe; the Hopper recipe copies it
    (T((100, 40), strides=(1, 100)), B, "sm_80", "CR", False, False),
    (T((100, 40), strides=(1, 100)), B, "sm_90a", "RR", True, False),
    # a slice of a wider matrix (leading dimension 64 > K) is copied
    (T((100, 40), strides=(64, 1)), B, "sm_90a", "RR", True, False),
    # a misaligned view (a[1:]) is copied
    (T((100, 40), ptr=(1 << 20) + 2), B, "sm_80", "RR", True, False),
    # a broadcast (stride 0) is copied
    (A, T((40, 72), strides=(0, 1)), "sm_80", "RR", False, True),
    # extent-1 dimensions: any stride
    (T((1, 40), strides=(7, 1)), T((40, 1), strides=(1, 3)), "sm_90a", "RR", False, False),
])
def test_majorness_from_strides(a, b, arch, layout, copy_a, copy_b):
    p = plan(a, b, **(H100 if arch == "sm_90a" else A100))
    assert (p.key.layout, p.copy_a, p.copy_b, p.key.arch) == (layout, copy_a, copy_b, arch)


def test_a_strided_bias_is_copied():
    assert plan(A, B, T((72,), strides=(2,)), **H100).copy_bias
    assert plan(A, B, T((72,), ptr=(1 << 20) + 4), **H100).copy_bias


@pytest.mark.parametrize("args, field, words", [
    ((T((2, 100, 40), strides=(4000, 40, 1)), B), "a.shape", ["3 dimensions", "bmm"]),
    ((A, T((41, 72))), "b.shape", ["inner dimensions differ"]),
    ((A, T((40, 72), dtype=None, torch_dtype="torch.float32")), "b.dtype", ["torch.float16, torch.bfloat16"]),
    ((A, T((40, 72), dtype="bf16", torch_dtype="torch.bfloat16")), "b.dtype", ["b.to(torch.float16)"]),
    ((A, T((40, 72), device=None)), "b.device", ["b.cuda()"]),
    ((A, T((40, 72), device=1)), "device", ["different devices"]),
    ((A, B, T((71,))), "bias.shape", ["(72,)"]),
    ((A, B, T((72,), dtype="bf16", torch_dtype="torch.bfloat16")), "bias.dtype", ["bias.to(torch.float16)"]),
    ((A, B, None, "swish"), "activation", ["'relu', 'gelu', 'gelu_tanh', 'sigmoid', 'tanh'"]),
])
def test_argument_errors(args, field, words):
    with pytest.raises(ValueError) as e:
        plan(*args, **H100)
    msg = str(e.value)
    assert msg.startswith("firesched.matmul: ")
    assert f"field: {field} = " in msg and "allowed: " in msg and "fix: " in msg
    for w in words:
        assert w in msg


# --------------------------------------------------------------------------- with torch (CPU tensors)

def test_torch_callers_errors():
    torch = pytest.importorskip("torch")
    import firesched as fs

    a = torch.zeros((8, 4), dtype=torch.float16)
    b = torch.zeros((4, 8), dtype=torch.float16)
    with pytest.raises(ValueError, match="a is not on a CUDA device"):
        fs.matmul(a, b)
    with pytest.raises(ValueError, match="b is a ndarray"):
        fs.matmul(a, b.numpy())
    with pytest.raises(ValueError, match="unknown activation"):
        fs.matmul(a, b, activation="swish")
    with pytest.raises(ValueError, match=r"out is \(8, 4\)"):
        fs.matmul(a, b, out=torch.zeros((8, 4), dtype=torch.float16))
    assert TensorInfo.of(a.t()) == TensorInfo((4, 8), (1, 4), "f16", None, a.data_ptr(), "torch.float16")
