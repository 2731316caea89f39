"""torch entry points: ``firesched.matmul(a, b, bias=None, activation=None, out=None)``.

A torch user calls ``firesched.matmul`` as they would ``torch.nn.functional.linear``'s cousin
``a @ b (+ bias) (then activation)``: the GEMM recipe for the tensors' shapes, dtypes, strides and
GPU is built, compiled (NVRTC) and cached the first time, and launched on the current torch
stream after that.  It is a ``torch.library`` custom op, ``torch.ops.firesched.matmul`` (and
``firesched::matmul_out`` when ``out=`` is given), with a fake (meta) implementation, so
``torch.compile`` keeps it in its graph, and it can be captured in a CUDA graph.

torch is optional: it is imported when ``matmul`` is first called, never by ``import firesched``
(where torch was imported first, the ops are registered when firesched is imported; otherwise at
the first call, which must then come before a ``torch.compile`` trace with ``fullgraph=True``).

What it does with the tensors it is given (``plan``):

* ``a`` (M, K) and ``b`` (K, N) may be any strided views: a row-major or column-major operand is
  read in place (``layout`` of the recipe; the Hopper recipe reads A row-major only), anything else
  (a slice with a leading dimension larger than the matrix, a broadcast) is copied with
  ``.contiguous()`` first, as is an operand whose data pointer is not 16-byte aligned.
* ``bias`` (N,) is added to every row, in the output's dtype; ``activation`` is ``None``,
  ``"relu"``, ``"gelu"`` (erf), ``"gelu_tanh"``, ``"sigmoid"`` or ``"tanh"``.
* The output (M, N) is row-major, of ``a``'s dtype; ``out=`` receives it (written in place when
  it is row-major contiguous and aligned, copied into otherwise).
* Inputs are f16 or bf16 (both the same), accumulation is f32.  ``K = 0`` gives the bias (or
  zeros) through the activation, as ``torch.matmul`` would, computed by torch.

Compiled kernels are kept per (shapes, dtypes, majorness, bias, activation, device, target)
(``MatmulKey``) in this process, and on disk by NVRTC's cache.  A kernel holds per-device
workspaces (the split-K partial sums, padded rows), so two launches of the same key on two
streams at once would share them: order them on one stream.
"""

import sys
import threading

import attrs

from . import api, ops
from .hardware.target import target as get_target
from .hardware.target import target_for_capability
from .recipes import gemm

#: activation name -> the epilogue op it adds after the bias
ACTIVATIONS = {
    "relu": ops.relu,
    "gelu": ops.gelu,
    "gelu_tanh": lambda: ops.gelu("tanh"),
    "sigmoid": ops.sigmoid,
    "tanh": ops.tanh,
}

#: torch dtype names -> firesched dtypes the recipe takes
DTYPES = {"torch.float16": "f16", "torch.bfloat16": "bf16"}

ALIGN = 16


@attrs.frozen
class TensorInfo:
    """What ``plan`` needs of one tensor: shape, strides in elements, firesched dtype name (None for
    a dtype the recipe does not take, with ``torch_dtype`` its torch name), CUDA device index (None
    off the GPU) and data pointer."""

    shape: tuple = attrs.field(converter=tuple)
    strides: tuple = attrs.field(converter=tuple)
    dtype: str | None
    device: int | None
    ptr: int = 0
    torch_dtype: str = ""

    @classmethod
    def of(cls, t) -> "TensorInfo":
        """The description of torch tensor ``t``."""
        dev = t.device
        index = None
        if dev.type == "cuda":
            index = dev.index
            if index is None:
                import torch

                index = torch.cuda.current_device()
        return cls(tuple(t.shape), tuple(t.stride()), DTYPES.get(str(t.dtype)), index, int(t.data_ptr()),
                   str(t.dtype))


@attrs.frozen
class MatmulKey:
    """Everything a compiled ``matmul`` kernel depends on: one kernel per value."""

    M: int
    N: int
    K: int
    dtype: str
    layout: str               # A's then B's majorness, "R" or "C" each
    bias: bool
    activation: str | None
    device: int
    arch: str


@attrs.frozen
class MatmulPlan:
    """How ``matmul`` runs on given tensors: the kernel's key, and whether each of ``a``, ``b``,
    ``bias`` is copied (``.contiguous()``) before the launch."""

    key: MatmulKey
    copy_a: bool
    copy_b: bool
    copy_bias: bool


def _majorness(info: TensorInfo, rows: int, cols: int) -> str | None:
    """"R" for a row-major (rows, cols) matrix, "C" for column-major, None for anything else
    (strides of extent-1 dimensions do not matter)."""
    s0, s1 = info.strides
    if (cols == 1 or s1 == 1) and (rows == 1 or s0 == cols):
        return "R"
    if (rows == 1 or s0 == 1) and (cols == 1 or s1 == rows):
        return "C"
    return None


def _fail(msg: str, field: str, value, allowed: str, fix: str) -> ValueError:
    return ValueError(f"firesched.matmul: {msg}\n  field: {field} = {value!r}\n  allowed: {allowed}\n  fix: {fix}")


def plan(a: TensorInfo, b: TensorInfo, bias: TensorInfo | None = None, activation: str | None = None,
         capability: tuple[int, int] | None = None, smem_optin: int | None = None) -> MatmulPlan:
    """Validate the arguments of ``matmul`` (described by ``TensorInfo``) and say how to run it on a
    GPU of compute capability ``capability`` (with ``smem_optin`` bytes of shared memory per block;
    None: the default target):
    the kernel's ``MatmulKey`` and which tensors are copied first.  Raises ``ValueError`` naming
    the argument, what is allowed and a fix.  Needs neither torch nor a GPU."""
    for name, t, rank in (("a", a, 2), ("b", b, 2), ("bias", bias, 1)):
        if t is None:
            continue
        if len(t.shape) != rank:
            shape = "(M, K)" if name == "a" else "(K, N)" if name == "b" else "(N,)"
            raise _fail(f"{name} has {len(t.shape)} dimensions", f"{name}.shape", t.shape, f"a {rank}-d tensor {shape}",
                        "use torch.bmm / firesched.recipes.bmm for batches" if name != "bias" else
                        "pass a bias of shape (N,)")
        if t.device is None:
            raise _fail(f"{name} is not on a CUDA device", f"{name}.device", "cpu", "a CUDA tensor",
                        f"pass {name}.cuda()")
        if t.dtype is None:
            raise _fail(f"{name} has dtype {t.torch_dtype}", f"{name}.dtype", t.torch_dtype,
                        "torch.float16, torch.bfloat16", f"pass {name}.half() or {name}.bfloat16()")
    M, K = a.shape
    K2, N = b.shape
    if K2 != K:
        raise _fail(f"a is {M}x{K} and b is {K2}x{N}: the inner dimensions differ", "b.shape", b.shape,
                    f"({K}, N)", "pass b of K rows, as in torch.matmul(a, b)")
    if b.dtype != a.dtype:
        raise _fail(f"a is {a.torch_dtype} and b is {b.torch_dtype}", "b.dtype", b.torch_dtype, a.torch_dtype,
                    f"pass b.to({a.torch_dtype})")
    devices = {a.device, b.device} | ({bias.device} if bias is not None else set())
    if len(devices) != 1:
        raise _fail("the tensors are on different devices", "device", sorted(devices), "one CUDA device",
                    f"move them to cuda:{a.device}")
    if bias is not None:
        if bias.shape != (N,):
            raise _fail(f"bias has shape {bias.shape}, the output has {N} columns", "bias.shape", bias.shape,
                        f"({N},)", "pass a bias of one value per output column")
        if bias.dtype != a.dtype:
            raise _fail(f"bias is {bias.torch_dtype} and a is {a.torch_dtype}", "bias.dtype", bias.torch_dtype,
                        a.torch_dtype, f"pass bias.to({a.torch_dtype})")
    if activation is not None and activation not in ACTIVATIONS:
        raise _fail("unknown activation", "activation", activation, "None, " + ", ".join(map(repr, ACTIVATIONS)),
                    "pass one of them, or apply the activation with torch afterwards")
    arch = (target_for_capability(*capability, smem_optin) if capability is not None else get_target(None)).name
    la = _majorness(a, M, K)
    lb = _majorness(b, K, N)
    copy_a = la is None or a.ptr % ALIGN != 0 or (la == "C" and arch == "sm_90a")   # the Hopper recipe: A row-major
    copy_b = lb is None or b.ptr % ALIGN != 0
    copy_bias = bias is not None and ((N > 1 and bias.strides[0] != 1) or bias.ptr % ALIGN != 0)
    layout = ("R" if copy_a else la) + ("R" if copy_b else lb)
    key = MatmulKey(M, N, K, a.dtype, layout, bias is not None, activation, a.device, arch)
    return MatmulPlan(key, copy_a, copy_b, copy_bias)


_KERNELS: dict = {}
_LOCK = threading.Lock()


def kernel(key: MatmulKey) -> api.CompiledProgram:
    """The compiled kernel of ``key`` (built, compiled and loaded on its device the first time)."""
    k = _KERNELS.get(key)
    if k is not None:
        return k
    with _LOCK:
        k = _KERNELS.get(key)
        if k is None:
            epi = ((ops.bias("bias"),) if key.bias else ()) + \
                ((ACTIVATIONS[key.activation](),) if key.activation else ())
            sched = gemm(key.M, key.N, key.K, key.dtype, key.arch, layout=key.layout, epilogue_ops=epi)
            k = api.compile(sched, arch=key.arch).prepare(key.device)
            _KERNELS[key] = k
    return k


def _device_caps(index: int) -> tuple[tuple[int, int], int]:
    import torch

    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), int(getattr(props, "shared_memory_per_block_optin", 0)) or None


def _run(a, b, bias, activation, out):
    """Compute ``matmul`` into ``out`` (allocated when None) and return it."""
    import torch

    ia, ib = TensorInfo.of(a), TensorInfo.of(b)
    ibias = TensorInfo.of(bias) if bias is not None else None
    dev = ia.device if ia.device is not None else 0
    cap, smem = _device_caps(dev) if ia.device is not None else (None, None)
    p = plan(ia, ib, ibias, activation, cap, smem)
    key = p.key
    M, N = key.M, key.N
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if key.M == 0 or key.N == 0:
        return out
    if key.K == 0:             # an empty sum: the bias (or zeros) through the activation, as torch gives
        r = torch.zeros((M, N), dtype=torch.float32, device=a.device)
        if bias is not None:
            r = r + bias.float()
        if activation is not None:
            r = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
                 "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}[activation](r)
        out.copy_(r)
        return out
    a = a.clone(memory_format=torch.contiguous_format) if p.copy_a else a
    b = b.clone(memory_format=torch.contiguous_format) if p.copy_b else b
    if bias is not None and p.copy_bias:
        bias = bias.clone(memory_format=torch.contiguous_format)
    direct = tuple(out.stride()) == (N, 1) or M == 1 or N == 1
    target = out if direct and out.data_ptr() % ALIGN == 0 and out.dtype == a.dtype else \
        torch.empty((M, N), dtype=a.dtype, device=a.device)
    k = kernel(key)
    args = {"A": a, "B": b, "bias": bias, "C": target}
    k(*(args[n] for n in k.arg_names))
    if target is not out:
        out.copy_(target)
    return out


_OPS: dict = {}


def _ops():
    """``torch.ops.firesched.matmul`` and ``matmul_out``, registered on first use."""
    if _OPS:
        return _OPS["matmul"], _OPS["matmul_out"]
    with _LOCK:
        if not _OPS:
            import torch

            ns = getattr(torch.ops, "firesched", None)
            if ns is not None and hasattr(ns, "matmul") and hasattr(ns, "matmul_out"):
                _OPS.update(matmul=ns.matmul, matmul_out=ns.matmul_out)   # registered by an earlier import
            else:
                _OPS.update(_register(torch))
    return _OPS["matmul"], _OPS["matmul_out"]


def _register(torch) -> dict:
    """Define the custom ops (their schema comes from these annotations, evaluated now)."""
    from typing import Optional

    Tensor = torch.Tensor

    @torch.library.custom_op("firesched::matmul", mutates_args=())
    def matmul_op(a: Tensor, b: Tensor, bias: Optional[Tensor], activation: Optional[str]) -> Tensor:
        return _run(a, b, bias, activation, None)

    @matmul_op.register_fake
    def _(a, b, bias, activation):
        return a.new_empty((a.shape[0], b.shape[1]))

    @torch.library.custom_op("firesched::matmul_out", mutates_args=("out",))
    def matmul_out_op(a: Tensor, b: Tensor, bias: Optional[Tensor], activation: Optional[str],
                      out: Tensor) -> None:
        _run(a, b, bias, activation, out)

    @matmul_out_op.register_fake
    def _(a, b, bias, activation, out):
        return None

    return dict(matmul=torch.ops.firesched.matmul.default, matmul_out=torch.ops.firesched.matmul_out.default)


if "torch" in sys.modules:      # torch is already here: register now, so that torch.compile's first trace
    _ops()                      # finds the ops (registering cannot be traced)


def matmul(a, b, bias=None, activation: str | None = None, out=None):
    """``activation(a @ b + bias)`` for torch tensors ``a`` (M, K) and ``b`` (K, N) on one GPU,
    f16 or bf16, accumulated in f32, returned as an (M, N) tensor of ``a``'s dtype (``out`` when
    given).  See the module docstring for the strides, dtypes and activations it takes; it raises
    ``ValueError`` (naming the argument, what is allowed and a fix) before any work.  Runs on the
    current torch stream, under ``torch.compile`` (a custom op) and in CUDA-graph capture."""
    import torch

    for name, t in (("a", a), ("b", b), ("bias", bias), ("out", out)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise _fail(f"{name} is a {type(t).__name__}", name, type(t).__name__, "a torch.Tensor",
                        f"pass torch.as_tensor({name}, device='cuda')")
    if activation is not None and activation not in ACTIVATIONS:
        raise _fail("unknown activation", "activation", activation, "None, " + ", ".join(map(repr, ACTIVATIONS)),
                    "pass one of them, or apply the activation with torch afterwards")
    if a.dim() == 2 and b.dim() == 2:
        M, N = a.shape[0], b.shape[1]
        if out is not None and (tuple(out.shape) != (M, N) or out.dtype != a.dtype or out.device != a.device):
            raise _fail(f"out is {tuple(out.shape)} {out.dtype} on {out.device}", "out", tuple(out.shape),
                        f"a ({M}, {N}) {a.dtype} tensor on {a.device}", "pass out=None to allocate it")
    else:       # the ranks: plan() words the error
        plan(TensorInfo.of(a), TensorInfo.of(b))
    op, op_out = _ops()
    if out is None:
        return op(a, b, bias, activation)
    op_out(a, b, bias, activation, out)
    return out


__all__ = ["matmul", "plan", "kernel", "MatmulKey", "MatmulPlan", "TensorInfo", "ACTIVATIONS"]
