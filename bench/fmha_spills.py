"""Compile ``recipes.fmha``'s planned kernels over the bench shapes and list those that spill
registers: the check behind "every attention variant compiles without spills" (no GPU needed:
NVRTC and ptxas report the spills).

    PYTHONPATH=. python bench/fmha_spills.py                        # sm_90a and sm_80 plans
    PYTHONPATH=. python bench/fmha_spills.py --archs sm_90a --shapes 4x16x4096x256 --workers 4

Each shape (batch x heads x seq x head_dim, seq_q = seq_kv) with and without a causal mask, f16
without and bf16 with the row log-sum-exp, with the plan ``recipes.fmha`` picks for the arch.
The plan's tiles follow the shape: 128-query tiles where they fill the GPU (e.g. 16 heads of
1,024 keys), 64 elsewhere, and whole tiles (no edge guards) where the tiles divide the sequence,
so each design is compiled at a shape that selects it — the 1,000-key variants of the unit tests
do not reach the 128-query designs at every head dim.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: whole-tile and odd shapes that select each planned design at every head dim
SHAPES = ("4x16x4096x64,4x16x4096x96,4x16x4096x128,4x16x4096x256,16x16x1024x64,16x16x1024x96,16x16x1024x128,"
          "16x16x1024x256,32x16x512x64,32x16x512x128,32x16x512x256,32x16x384x64,8x16x2048x64,8x16x2048x128,"
          "4x16x4000x128,4x16x4000x256,2x16x1000x96")
ARCHS = ("sm_90a", "sm_80")


def _compile(job) -> tuple:
    """(job, spill bytes) for one planned kernel; a refusal comes back as its message."""
    import warnings

    import firesched as fs
    from firesched.errors import PerformanceWarning

    (b, h, s, d), causal, arch, dtype, lse = job
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PerformanceWarning)
        try:
            k = fs.compile(fs.recipes.fmha(b, h, s, s, d, causal=causal, arch=arch, dtype=dtype, lse=lse), arch=arch)
        except (ValueError, fs.ScheduleError) as e:
            return job, str(e).splitlines()[0][:100]
    return job, k.spills


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=SHAPES, help="comma-separated BxHxSxD")
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--workers", type=int, default=1, help="compiles in parallel (processes)")
    args = p.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s]
    if any(len(s) != 4 for s in shapes):
        raise SystemExit(f"--shapes {args.shapes!r}: each is BxHxSxD")
    archs = [a for a in args.archs.split(",") if a]
    bad = [a for a in archs if a not in ARCHS]
    if bad:
        raise SystemExit(f"--archs {bad}: allowed {', '.join(ARCHS)}")
    jobs = [(shp, c, arch, dt, lse) for shp, c, arch, (dt, lse)
            in itertools.product(shapes, (False, True), archs, (("f16", False), ("bf16", True)))]
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as ex:
            results = list(ex.map(_compile, jobs))
    else:
        results = [_compile(j) for j in jobs]
    spilling = [(job, sp) for job, sp in results if isinstance(sp, int) and sp]
    refused = [(job, sp) for job, sp in results if isinstance(sp, str)]
    compiled = len(results) - len(refused)
    print(f"{compiled} kernels compiled, {len(refused)} refused, spilling: {spilling or 'none'}")
    for job, why in refused:
        print(f"  refused {job}: {why}")
    return dict(compiled=compiled, refused=refused, spilling=spilling)


if __name__ == "__main__":
    main()
