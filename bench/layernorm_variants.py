"""LayerNorm at one shape in several variants of its schedule, all timed interleaved with torch's
``layer_norm`` in one process — the measurements behind keeping the one-block plan's two
reductions and the early-load budget:

    PYTHONPATH=. python bench/layernorm_variants.py 4096x4096 bf16 --rounds 9

Variants (each on the recipe's own plan unless it names an occupancy):

* ``plan``: the recipe's default (one-block rows: the mean, then the mean of squared deviations);
* ``tuple``: the statistics in one Welford tuple reduction (``tuple_stats=True``);
* ``tuple_early2``: the tuple, and up to 16 registers a thread of weight and bias loads issued at
  the kernel's start (``lower.transforms.early_loads.EARLY_SHARE = 2``; the library takes 8);
* ``tuple_early2_occ5``: the same at five blocks an SM (``RowPlan.blocks_per_sm``);
* ``tuple_occ6``: the tuple at six blocks an SM;
* ``two_early2_occ5``: the two reductions with the larger early-load budget, five blocks an SM.

Each kernel is checked against torch (the largest error is printed) before the timing.  Results
go to ``--out`` (JSON: device, times in us, effective TB/s)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings

import attrs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import firesched as fs  # noqa: E402
import firesched.lower.transforms.early_loads as early  # noqa: E402
from bench.gemm import L2_BYTES  # noqa: E402
from bench.rows import _inputs, _outputs, _peer, bytes_moved  # noqa: E402
from firesched import timing  # noqa: E402
from firesched.errors import PerformanceWarning  # noqa: E402
from firesched.recipes.norms import plan_rows  # noqa: E402

#: name -> (early-load share, blocks an SM (0: the plan's), statistics in one tuple)
VARIANTS = {
    "plan": (early.EARLY_SHARE, 0, None),
    "tuple": (early.EARLY_SHARE, 0, True),
    "tuple_early2": (2, 0, True),
    "tuple_early2_occ5": (2, 5, True),
    "tuple_occ6": (early.EARLY_SHARE, 6, True),
    "two_early2_occ5": (2, 5, False),
}


def kernels(rows: int, cols: int, dtype: str, names=None) -> dict:
    """The compiled variants (name -> CompiledProgram) of LayerNorm at ``rows`` x ``cols``; a
    variant the schedule refuses (too many threads an SM) is left out with a line printed."""
    base = plan_rows(rows, cols, dtype, "sm_90a", what="layernorm", odd_values=20, aligned_values=24,
                     op="layernorm")
    keep = early.EARLY_SHARE
    out = {}
    try:
        for name in names or VARIANTS:
            share, occ, one = VARIANTS[name]
            early.EARLY_SHARE = share
            plan = attrs.evolve(base, blocks_per_sm=occ) if occ else base
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", PerformanceWarning)
                    sched = fs.recipes.layernorm(rows, cols, dtype=dtype, arch="sm_90a", plan=plan, tuple_stats=one)
                    out[name] = fs.compile(sched, arch="sm_90a", use_cache=False)
            except fs.ScheduleError as e:
                print(f"{name}: refused: {str(e).splitlines()[0][:120]}")
    finally:
        early.EARLY_SHARE = keep
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", help="ROWSxCOLS")
    p.add_argument("dtype", choices=["f16", "bf16"])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--smoke", action="store_true", help="compile only (no GPU): print registers and spills")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    try:
        R, C = (int(v) for v in args.shape.split("x"))
    except ValueError:
        raise SystemExit(f"shape {args.shape!r}: expected ROWSxCOLS, e.g. 4096x4096") from None
    names = [n for n in args.variants.split(",") if n]
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants {bad}: allowed {', '.join(VARIANTS)}")
    ks = kernels(R, C, args.dtype, names)
    for name, k in ks.items():
        r = max(k.resources.values(), key=lambda r: r.registers)
        print(f"{name:20s} registers {r.registers}  spills {k.spills}  weight early {'x_W_early' in k.source}  "
              f"bias early {'x_B_early' in k.source}")
    if args.smoke:
        return {"kernels": ks}
    import torch

    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    nbytes = bytes_moved("layernorm", R, C, dt.itemsize)
    nsets = max(1, math.ceil(2 * L2_BYTES / nbytes))
    sets = [(_inputs(torch, "layernorm", R, C, dt), _outputs(torch, "layernorm", R, C, dt)) for _ in range(nsets)]
    peer = _peer(torch, "layernorm", C)
    (x, w, b), (y,) = sets[0]
    ref = torch.nn.functional.layer_norm(x.float(), (C,), w.float(), b.float(), 1e-5)
    fns = {}
    for name, k in ks.items():
        k(x, w, b, y)
        print(f"{name:20s} max error against torch in f32 {(y.float() - ref).abs().max().item():.3g}")
        fns[name] = lambda i, k=k: k(*sets[i % nsets][0], *sets[i % nsets][1])
    fns["torch"] = lambda i: peer(*sets[i % nsets][0])
    us = timing.interleaved(fns, rounds=args.rounds)
    tbs = {n: nbytes / (t * 1e-6) / 1e12 for n, t in us.items()}
    for n in fns:
        print(f"{args.dtype} {args.shape} {n:20s} {us[n]:8.2f} us  {tbs[n]:.3f} TB/s", flush=True)
    res = dict(shape=args.shape, dtype=args.dtype, us=us, tbs=tbs, device=torch.cuda.get_device_name(),
               torch=torch.__version__, command="python bench/layernorm_variants.py " + " ".join(argv or sys.argv[1:]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
