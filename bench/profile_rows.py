"""Run row kernels a few times each, for a profiler to pick one launch:

    ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:firesched \\
        --section SpeedOfLight --section WarpStateStats --section InstructionStats \\
        --section LaunchStats --section Occupancy \\
        python bench/profile_rows.py layernorm:4096x50000:bf16

Each argument is ``op:ROWSxCOLS:dtype`` (``op`` one of ``bench/rows.py``'s: rmsnorm, layernorm,
add_rmsnorm, softmax, softmax_causal); each kernel runs three times on random inputs.  ``--arch sm_80`` compiles them for that target instead of sm_90a (what runs on this GPU
too; ``compute-sanitizer`` takes the same command).  ``--smoke`` compiles them without a GPU (what
the tests run)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import firesched as fs  # noqa: E402
from bench.rows import EXTRA_OPS, OPS, _recipe  # noqa: E402


def kernel(spec: str, arch: str = "sm_90a"):
    """The compiled kernel of ``op:ROWSxCOLS:dtype`` for ``arch``."""
    try:
        op, shape, dt = spec.split(":")
        rows, cols = (int(v) for v in shape.split("x"))
    except ValueError:
        raise ValueError(f"profile_rows: {spec!r}; expected op:ROWSxCOLS:dtype, e.g. layernorm:4096x50000:bf16") from None
    if op not in OPS + EXTRA_OPS:
        raise ValueError(f"profile_rows: op {op!r} in {spec!r}; allowed: {', '.join(OPS + EXTRA_OPS)}")
    return fs.compile(_recipe(op)(rows, cols, dtype=dt, arch=arch), arch=arch)


def main(argv=None) -> list:
    args = list(sys.argv[1:] if argv is None else argv)
    smoke = "--smoke" in args
    arch = "sm_90a"
    if "--arch" in args:
        i = args.index("--arch")
        arch = args[i + 1]
        del args[i:i + 2]
    specs = [a for a in args if a != "--smoke"]
    kernels = [kernel(s, arch) for s in specs]
    if smoke:
        return kernels
    import torch

    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    for spec, k in zip(specs, kernels):
        ins = [torch.randn(b.shape, device="cuda", dtype=tdt[b.dtype.name]) for b in k.program.inputs]
        outs = [torch.empty(b.shape, device="cuda", dtype=tdt[b.dtype.name]) for b in k.program.outputs]
        for _ in range(3):
            k(*ins, *outs)
        torch.cuda.synchronize()
        print(spec, "ran", flush=True)
    return kernels


if __name__ == "__main__":
    main()
