"""``firesched demo``: schedule, check, interpret, emit and compile a GEMM (+ bias + ReLU unless
``--no-fused``).

On a machine without a GPU it does everything but the launch; with a GPU (and torch) it also runs
the kernel, checks it against torch and times it next to cuBLAS.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

EXAMPLES = """\
examples:
  firesched demo                      # also: python -m firesched demo
  firesched demo --dtype bf16 --size 2048 --no-fused
"""


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``demo`` to the subcommands."""
    d = sub.add_parser("demo", help="schedule, check, interpret, emit and NVRTC-compile a GEMM",
                       description=__doc__, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--dtype", default="f16", choices=("f16", "bf16"))
    d.add_argument("--size", type=int, default=4096, help="M = N = K of the compiled GEMM (default 4096)")
    d.add_argument("--no-fused", dest="fused", action="store_false", help="plain GEMM (no bias+ReLU)")
    return d


def _ref(A, B, dt, bias=None, relu=False):
    r = A.astype(dt.np).astype(np.float64) @ B.astype(dt.np).astype(np.float64)
    if bias is not None:
        r = r + bias.astype(dt.np).astype(np.float64)
    if relu:
        r = np.maximum(r, 0.0)
    return r


def _interpret_and_compare(fs, sched, rng, M, N, K, dt, fused: bool, what: str) -> bool:
    """Run ``sched`` (a GEMM, + bias + ReLU when ``fused``) in the interpreter on random inputs
    against numpy."""
    A, B, bias = rng.standard_normal((M, K)), rng.standard_normal((K, N)), rng.standard_normal(N)
    t0 = time.perf_counter()
    C = fs.interpret(sched, A, B, bias) if fused else fs.interpret(sched, A, B)
    secs = time.perf_counter() - t0
    ref = _ref(A, B, dt, bias if fused else None, relu=fused)
    err = float(np.abs(C.astype(np.float64) - ref).max() / np.abs(ref).max())
    print(f"\n== interpreted {what.format(secs=secs)}: max relative error vs numpy {err:.2e}")
    if not err < 2e-2:
        print("MISMATCH: the interpreter disagrees with numpy", file=sys.stderr)
        return False
    return True


def _big_builds(fs, S: int, dt, epi) -> dict:
    """The two compiled GEMMs of the demo, built (and so checked) before anything runs, so that a
    size the recipes refuse is one error up front rather than a traceback after the demo."""
    from firesched.errors import ScheduleError

    from .recipe_args import CLIError

    try:
        return {
            "sm_80": fs.recipes.gemm(S, S, S, dtype=dt.name, arch="sm_80", block_m=128, block_n=256, block_k=32,
                                     warps_m=2, warps_n=4, stages=4, epilogue_ops=epi),
            "sm_90a": fs.recipes.gemm(S, S, S, dtype=dt.name, arch="sm_90a", epilogue_ops=epi),
        }
    except ScheduleError as e:
        first = str(e).splitlines()[0]
        raise CLIError(f"--size {S}: the demo's GEMM recipes refuse this size ({first}); try --size 4096") from None


def run(args: argparse.Namespace) -> int:
    """The demo: three sections (sm_80 schedule interpreted, Hopper schedule interpreted, the big
    GEMM compiled for both targets), then a launch when a GPU is present."""
    import firesched as fs
    from firesched import ops, runtime

    from .recipe_args import CLIError

    if args.size < 1:
        raise CLIError(f"--size {args.size}: M = N = K of the compiled GEMM must be a positive integer, "
                       "e.g. --size 4096")
    dt = fs.dtypes.dtype(args.dtype)
    fused = args.fused
    epi = (ops.bias("bias"), ops.relu()) if fused else ()
    what = " + bias + ReLU" if fused else ""
    S = args.size
    builds = _big_builds(fs, S, dt, epi)

    # 1. a small GEMM on sm_80 atoms, scheduled, printed, checked and interpreted on the CPU
    M, N, K = 96, 80, 200
    small = fs.recipes.gemm(M, N, K, dtype=dt.name, arch="sm_80", block_m=64, block_n=32, block_k=32, warps_m=2, warps_n=1,
                            stages=3, epilogue_ops=epi)
    print(f"== schedule of a {M}x{N}x{K} {dt} GEMM{what} (partial tiles on every edge)")
    print(small)
    small.check("sm_80")
    print("check(): ok (every leaf atomic, resources within sm_80, fragments consistent)")
    rng = np.random.default_rng(0)
    if not _interpret_and_compare(fs, small, rng, M, N, K, dt, fused, "on the CPU in {secs:.2f} s (race / async / "
                                  "bounds checked)"):
        return 1

    # 2. the Hopper schedule (warp-specialized producer/consumer warpgroups, TMA, wgmma,
    #    persistent blocks, TMA-store epilogue), interpreted: the roles run as coroutines
    M2, N2 = M + 104, N + 56
    hop = fs.recipes.gemm(M2, N2, K, dtype=dt.name, arch="sm_90a", block_m=128, block_n=64, epilogue_ops=epi)
    print(f"\n== the Hopper schedule of a {M2}x{N2}x{K} GEMM{what}")
    print(hop)
    if not _interpret_and_compare(fs, hop, rng, M2, N2, K, dt, fused, "in {secs:.2f} s (producer and consumer "
                                  "roles, mbarrier phases, wgmma / TMA asynchrony checked)"):
        return 1

    # 3. the big ones: emitted as CUDA C++ and compiled by NVRTC (mma.sync for sm_80, the Hopper
    #    recipe for sm_90a)
    ok = True
    compiled = {}
    for arch, sched in builds.items():
        t0 = time.perf_counter()
        k = fs.compile(sched, arch=arch)
        secs = time.perf_counter() - t0
        compiled[arch] = k
        shared = {kern.name: kern.shared_bytes for kern in k.program.kernels}
        for name, r in k.resources.items():
            print(f"== {S}x{S}x{S} {dt} GEMM{what} for {arch}: kernel {name}: {r.registers} registers, "
                  f"{r.spill_store_bytes + r.spill_load_bytes} spill bytes, "
                  f"{shared.get(name, 0)} B dynamic shared memory, "
                  f"{len(k.source.splitlines())} lines of CUDA, {secs:.2f} s "
                  f"({'cache' if all(m.from_cache for m in k.modules) else 'NVRTC'})")
            ok &= (r.spill_store_bytes + r.spill_load_bytes) == 0

    if not runtime.gpu_available():
        print(f"\nno GPU here ({runtime.gpu_unavailable_reason()}): not launching. "
              "The cubins above are cached on disk for the next run.")
        return 0 if ok else 1
    return _run_on_gpu(compiled["sm_90a"], dt, S, fused) if ok else 1


def _run_on_gpu(k, dt, S, fused) -> int:
    """Launch the sm_90a kernel on torch tensors, compare with torch and time it next to cuBLAS."""
    try:
        import torch
    except ImportError:
        print("a GPU is present but torch is not installed: skipping the launch")
        return 0
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt.name]
    dev = torch.device("cuda")
    A = torch.randn(S, S, device=dev, dtype=tdt)
    B = torch.randn(S, S, device=dev, dtype=tdt)
    C = torch.full((S, S), float("nan"), device=dev, dtype=tdt)
    bias = torch.randn(S, device=dev, dtype=tdt)
    args = (A, B, bias, C) if fused else (A, B, C)
    k(*args)
    torch.cuda.synchronize()
    if fused:
        ref = torch.relu(A.float() @ B.float() + bias.float())
    else:
        ref = A.float() @ B.float()
    err = ((C.float() - ref).norm() / ref.norm()).item()
    print(f"\n== on {torch.cuda.get_device_name()}: relative error vs torch {err:.2e}")

    from .gpu import time_ms

    def timeit(fn):
        return time_ms(torch, fn, reps=20, samples=10)

    flops = 2 * S ** 3
    ours = timeit(lambda: k(*args))
    peer = timeit(lambda: torch.matmul(A, B))
    print(f"   firesched {flops / ours / 1e9:.0f} TFLOP/s, cuBLAS (torch.matmul) {flops / peer / 1e9:.0f} TFLOP/s, "
          f"ratio {peer / ours:.2f}x")
    return 0 if err < 2e-2 else 1
