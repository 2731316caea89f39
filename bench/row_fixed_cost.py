"""What a row recipe pays once a launch, and how fast it streams after that: each kernel timed at
several row counts (interleaved through CUDA graphs, ``firesched.timing.interleaved``), and a line
fitted through the times against the rows — its intercept the fixed cost, its slope the rate::

    PYTHONPATH=. python bench/row_fixed_cost.py --cols 4095
    PYTHONPATH=. python bench/row_fixed_cost.py --cols 3583 --rows 2048,4096,8192 --dtype f16
    PYTHONPATH=. python bench/row_fixed_cost.py --smoke        # compiles them, no GPU (the tests)

The kernels: LayerNorm with its weight and bias (``ln_wb``), with its weight only (``ln_w``), with
neither (``ln``), RMSNorm and softmax — what each operand along the row (staged into a persistent
block's window once, read from it every row) adds to both."""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import firesched as fs  # noqa: E402

#: name -> (recipe, its keyword arguments, the operands along the row it takes)
KERNELS = {"ln_wb": ("layernorm", {}, 2), "ln_w": ("layernorm", {"bias": False}, 1),
           "ln": ("layernorm", {"weight": False, "bias": False}, 0), "rms": ("rmsnorm", {}, 1),
           "softmax": ("softmax", {}, 0)}


def kernels(rows: int, cols: int, dtype: str, arch: str = "sm_90a") -> dict:
    """The compiled kernels of ``KERNELS`` for ``rows`` x ``cols`` of ``dtype``."""
    return {n: fs.compile(getattr(fs.recipes, op)(rows, cols, dtype=dtype, arch=arch, **kw), arch=arch)
            for n, (op, kw, _) in KERNELS.items()}


def fit(times: dict[int, float], cols: int, eb: int) -> tuple[float, float]:
    """(fixed µs, TB/s after it) of a line through ``times`` (rows -> µs) of rows of ``cols``
    elements of ``eb`` bytes, read and written once."""
    r = np.array(sorted(times), dtype=float)
    t = np.array([times[int(x)] for x in r])
    slope, fixed = np.polyfit(r, t, 1)
    return float(fixed), cols * eb * 2 / (slope * 1e-6) / 1e12


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cols", type=int, default=4095)
    p.add_argument("--rows", default="2048,4096,8192,16384")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--smoke", action="store_true", help="compile the kernels of the first row count only")
    args = p.parse_args(argv)
    try:
        counts = [int(v) for v in args.rows.split(",")]
    except ValueError:
        counts = []
    if len(counts) < 2 or min(counts) < 1:
        raise SystemExit(f"--rows {args.rows!r}: at least two positive row counts, e.g. 2048,4096,8192")
    if args.smoke:
        return {"kernels": kernels(counts[0], args.cols, args.dtype)}
    import torch

    from firesched import timing

    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    times: dict[str, dict[int, float]] = {n: {} for n in KERNELS}
    for rows in counts:
        ks = kernels(rows, args.cols, args.dtype)
        sets = max(2, -(-100 * 2**20 // (rows * args.cols * 4)))          # inputs rotated past L2
        xs = [torch.randn(rows, args.cols, device="cuda", dtype=tdt) for _ in range(sets)]
        ys = [torch.empty_like(x) for x in xs]
        w, b = (torch.randn(args.cols, device="cuda", dtype=tdt) for _ in range(2))
        fns = {n: (lambda i, k=ks[n], ops=(w, b)[:KERNELS[n][2]], xs=xs, ys=ys: k(xs[i % len(xs)], *ops,
                                                                               ys[i % len(xs)]))
               for n in KERNELS}
        us = timing.interleaved(fns, rounds=args.rounds)
        for n, t in us.items():
            times[n][rows] = t
        print(f"{rows} x {args.cols} {args.dtype}: " + "  ".join(f"{n} {t:.1f} us" for n, t in us.items()),
              flush=True)
    fits = {n: fit(t, args.cols, 2) for n, t in times.items()}
    for n, (fixed, rate) in fits.items():
        print(f"{n}: fixed {fixed:.2f} us, {rate:.2f} TB/s after it")
    return {"times": times, "fits": fits}


if __name__ == "__main__":
    main()
