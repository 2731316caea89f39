"""What ``bench`` and ``tune`` need of a GPU: whether there is one, arrays for a compiled kernel's
arguments (torch), and a timer (CUDA events).  Deliberately small: ``bench/`` at the repository
root has the careful benchmarks (L2-defeating input rotation, interleaved peers, CUDA graphs)."""

from __future__ import annotations

import math

from firesched import runtime
from firesched.errors import FireschedError
from firesched.hardware.target import detected_target

TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f8e4m3": "float8_e4m3fn",
                "f8e5m2": "float8_e5m2", "i8": "int8", "u8": "uint8", "i32": "int32"}


class NoGPU(FireschedError):
    """No GPU (or no torch to make arrays on it) to run kernels on; the message says which."""


def require_gpu(what: str):
    """torch, when kernels can run here; NoGPU naming what is missing otherwise."""
    if not runtime.gpu_available():
        raise NoGPU(f"{what} needs an NVIDIA GPU, and there is none usable here "
                    f"({runtime.gpu_unavailable_reason()})")
    try:
        import torch
    except ImportError:
        raise NoGPU(f"{what} makes its GPU arrays with torch, which is not installed: pip install torch") from None
    return torch


def default_arch(arch: str | None) -> str:
    """``arch`` as given, else the target of the GPU present, else sm_90a."""
    if arch:
        return arch
    t = detected_target()
    return t.name if t is not None else "sm_90a"


def _operands(k) -> tuple[list, list]:
    """The tensors of a compiled program's arguments: inputs, then outputs, in launch order."""
    by_name = {t.name: t.tensor for t in k.schedule.spec.operands}
    return [by_name[b.name] for b in k.program.inputs], [by_name[b.name] for b in k.program.outputs]


def _storage(t) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape in storage order, and the permutation giving the logical (dims-order) view."""
    return tuple(t.extent(d) for d in t.storage_dims), tuple(t.storage_dims.index(d) for d in t.dims)


def arrays_for(torch, k) -> tuple[list, list, int]:
    """Random inputs and empty outputs on the GPU for compiled program ``k`` (logical views of
    storage-ordered tensors, as ``k`` expects them), and the bytes they hold together."""
    def tdtype(t):
        try:
            return getattr(torch, TORCH_DTYPES[t.dtype.name])
        except (KeyError, AttributeError):
            raise NoGPU(f"bench: no torch dtype for {t.name}'s {t.dtype}") from None

    ins, outs = _operands(k)
    xs, ys = [], []
    for t in ins:
        shape, perm = _storage(t)
        dt = tdtype(t)
        if dt.is_floating_point:
            x = torch.randn(shape, device="cuda", dtype=torch.float32).to(dt)
        else:
            x = torch.randint(-100, 100, shape, device="cuda").to(dt)
        xs.append(x.permute(perm))
    for t in outs:
        shape, perm = _storage(t)
        ys.append(torch.empty(shape, device="cuda", dtype=tdtype(t)).permute(perm))
    nbytes = sum(math.prod(t.shape) * t.dtype.bits // 8 for t in ins + outs)
    return xs, ys, nbytes


def time_ms(torch, fn, *, reps: int, samples: int, warmup: int = 3) -> float:
    """Median over ``samples`` of the GPU time per call of ``fn``, each sample ``reps`` calls
    back to back between two CUDA events (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / reps)
    times.sort()
    return times[len(times) // 2]


def matmul_flops(schedule) -> int:
    """2 x the product of every extent of a MatMul kernel's spec (batch, M, N, K); 0 for others."""
    spec = schedule.spec
    if type(spec).__name__ != "MatMul":
        return 0
    return 2 * math.prod(spec.extents.values())
