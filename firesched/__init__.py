"""firesched: a Fireiron-style scheduling language for NVIDIA GPU kernels.

Write a kernel-level spec, refine it with strategies until every leaf is a hardware atom, then
``interpret`` it on the CPU (race- and bounds-checked) or ``compile`` it to CUDA through NVRTC::

    import firesched as fs
    sched = fs.recipes.gemm(1024, 1024, 1024, dtype="f16")
    print(sched)                      # the decomposition tree
    C = fs.interpret(sched, A, B)     # numpy, on the CPU
    k = fs.compile(sched, arch="sm_90a")

``fs.matmul(a, b, bias=None, activation=None)`` runs the GEMM recipe on torch tensors (a
``torch.library`` custom op; torch is imported on its first call).
"""

from . import (
    cuda,
    dtypes,
    ir,
    lower,
    ops,
    recipes,  # noqa: E402  (recipes build on everything above)
    runtime,
    simulate,
)
from .api import CompiledProgram, compile, interpret
from .errors import CompileError, FireschedError, HazardError, LaunchError, ScheduleError
from .layout import Layout, Swizzle, TVLayout
from .schedule import Schedule
from .spec import Attention, Fused, Init, MatMul, Move, Pointwise, Reduce, ScaleAdd
from .tensor import BLOCK, CLUSTER, GL, KERNEL, RF, SH, THREAD, WARP, WARPGROUP, Level, Memory, Tensor, Tile
from .torch_ops import matmul  # torch is imported on the first call, not here
from .tuner import tune
from .version import __version__

__all__ = [
    "dtypes", "ops", "recipes", "ir", "lower", "cuda", "simulate", "runtime", "compile", "interpret", "CompiledProgram",
    "FireschedError", "ScheduleError", "CompileError", "HazardError", "LaunchError",
    "Layout", "Swizzle", "TVLayout", "Schedule", "MatMul", "Move", "Init", "Pointwise", "Reduce", "ScaleAdd", "Fused", "Attention",
    "Level", "Memory", "Tensor", "Tile", "GL", "SH", "RF", "KERNEL", "CLUSTER", "BLOCK", "WARPGROUP", "WARP",
    "THREAD", "matmul", "tune", "__version__",
]
