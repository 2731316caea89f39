"""Compile every row recipe over many row lengths and list the kernels that spill registers:
the check behind "every row recipe compiles without spills" (no GPU needed: NVRTC and ptxas
report the spills).

    PYTHONPATH=. python bench/row_spills.py                       # sm_90a, 34 lengths, 3 dtypes
    PYTHONPATH=. python bench/row_spills.py --arch sm_80
    PYTHONPATH=. python bench/row_spills.py --cols 1000,65537 --dtypes bf16

Each of RMSNorm, LayerNorm, add + RMSNorm, softmax and causal softmax, at 4096 rows (the plan
depends on the row length, not the row count) and each length and dtype, with the recipe's own
plan; a length a recipe refuses on that target is skipped and counted.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import firesched as fs  # noqa: E402
from firesched.errors import PerformanceWarning  # noqa: E402

#: row lengths: powers of two, odd lengths, models' hidden sizes whose vectors are not a power of
#: two (passes that fill their threads: rows.FILL_THREADS; 13,312 and 15,360 on 512 threads with
#: a partial last pass), and the staged and cluster ranges up to 262,144
COLS = {"sm_90a": (256, 1000, 1024, 2560, 4096, 4104, 7168, 8190, 8191, 10240, 13312, 14336, 15360, 16384, 16385,
                   20480, 20482, 24576, 32766, 32767, 32768, 36000, 40000, 40961, 50000, 50001, 65536, 65537, 99999,
                   131071, 131072, 200000, 262143, 262144),
        "sm_80": (256, 1001, 2560, 4096, 7168, 8190, 8191, 14336, 15360, 16385, 20479, 20482, 24577, 32767, 32768,
                  40960)}
KINDS = ("rmsnorm", "layernorm", "add_rmsnorm", "softmax", "causal")


def recipe(kind: str, rows: int, cols: int, dtype: str, arch: str):
    if kind == "causal":
        return fs.recipes.softmax(rows, cols, dtype=dtype, arch=arch, causal=True)
    return getattr(fs.recipes, kind)(rows, cols, dtype=dtype, arch=arch)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_90a", choices=sorted(COLS))
    p.add_argument("--cols", default="", help="comma-separated row lengths (default: the arch's list)")
    p.add_argument("--dtypes", default="bf16,f16,f32")
    p.add_argument("--kinds", default=",".join(KINDS))
    args = p.parse_args(argv)
    cols = [int(c) for c in args.cols.split(",") if c] or list(COLS[args.arch])
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise SystemExit(f"--kinds {bad}: allowed {', '.join(KINDS)}")
    compiled, refused, spilling = 0, [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PerformanceWarning)
        for c, kind, dt in itertools.product(cols, kinds, [d for d in args.dtypes.split(",") if d]):
            try:
                sched = recipe(kind, 4096, c, dt, args.arch)
            except ValueError as e:           # a length the recipe refuses on this target
                refused.append((kind, c, dt, str(e).splitlines()[0][:80]))
                continue
            k = fs.compile(sched, arch=args.arch)
            compiled += 1
            if k.spills:
                spilling.append((kind, c, dt, k.spills))
    print(f"{args.arch}: {compiled} kernels compiled, {len(refused)} refused, spilling: {spilling or 'none'}")
    return dict(compiled=compiled, refused=refused, spilling=spilling)


if __name__ == "__main__":
    main()
