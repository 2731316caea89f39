"""Time the GEMM kernels of two versions of firesched next to each other and cuBLAS, interleaved.

    PYTHONPATH=. python bench/ab_versions.py --old /path/to/other/checkout [--atoms sm90a] \
        [--only 8192x8192x8192,4096x4096x4096] [--dtypes f16,bf16] [--rounds 7]

The other checkout's ``firesched`` is imported under another name (a copy whose absolute
``firesched`` imports are renamed), so both versions run in this one process, on the same inputs.
Each round times this version, the other and ``torch.matmul`` once each, in reverse order every
other round (``reps`` back-to-back launches between two events, median of ``samples``); the
figures are medians over rounds, so clock drift and a busy GPU hit all three alike.  Both versions build the recipe with the same parameters
(``bench/gemm.py``'s per-shape model of this version).  Prints a table; ``--out`` writes JSON.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import math
import os
import re
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import firesched as fs  # noqa: E402
from bench.gemm import L2_BYTES, params_for, params_sm90, time_ms, write_results  # noqa: E402

_ABS = re.compile(r"\bfiresched(?=[.\s])")


def load_other(path: str, name: str = "firesched_other"):
    """Import the ``firesched`` package of checkout ``path`` as ``name``."""
    src = os.path.join(path, "firesched")
    if not os.path.isdir(src):
        raise SystemExit(f"--old {path}: no firesched/ package there")
    root = tempfile.mkdtemp(prefix="fs-ab-")
    dst = os.path.join(root, name)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for dirpath, _, files in os.walk(dst):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(dirpath, f)
                text = open(p).read()
                # only import statements name the package absolutely
                text = "\n".join(_ABS.sub(name, line) if re.match(r"\s*(from|import)\s+firesched\b", line) else line
                                 for line in text.split("\n"))
                open(p, "w").write(text)
    sys.path.insert(0, root)
    return importlib.import_module(name)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="path of the other checkout (its firesched/ is imported)")
    p.add_argument("--atoms", default="sm90a", choices=("sm80", "sm90a"))
    p.add_argument("--only", default="8192x8192x8192,4096x4096x4096,2048x2048x2048,4095x4097x1023")
    p.add_argument("--dtypes", default="f16")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import torch

    old = load_other(args.old)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.only.split(",")]
    rows = []
    for dt in args.dtypes.split(","):
        tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt]
        for M, N, K in shapes:
            kw = params_sm90(M, N, K) if args.atoms == "sm90a" else params_for(M, N, K)
            kernels = [lib.compile(lib.recipes.gemm(M, N, K, dtype=dt, arch="sm_90a", **kw), arch="sm_90a")
                       for lib in (fs, old)]
            per_set = (M * K + K * N + M * N) * 2
            nsets = max(1, min(8, math.ceil(2 * L2_BYTES / per_set)))
            sets = [(torch.randn(M, K, device="cuda", dtype=tdt), torch.randn(K, N, device="cuda", dtype=tdt),
                     torch.empty(M, N, device="cuda", dtype=tdt)) for _ in range(nsets)]
            a, b, c = sets[0]
            ref = a.float() @ b.float()
            errs = []
            for k in kernels:
                c.fill_(float("nan"))
                k(a, b, c)
                errs.append(((c.float() - ref).norm() / ref.norm()).item())

            def run_k(k, sets=sets, nsets=nsets):
                return lambda i: k(*sets[i % nsets])

            def peer(i, sets=sets, nsets=nsets):
                torch.matmul(*sets[i % nsets][:2])

            fns = [run_k(kernels[0]), run_k(kernels[1]), peer]
            times = [[], [], []]
            for r in range(args.rounds):
                # alternate the order each round: whichever runs first after the previous shape
                # (or after cuBLAS) is not always the same one
                order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
                for j in order:
                    times[j].append(time_ms(torch, fns[j], args.reps, args.samples))
            flops = 2.0 * M * N * K
            new_t, old_t, cb_t = (statistics.median(t) for t in times)
            row = dict(M=M, N=N, K=K, dtype=dt, params=kw, rel_err_new=errs[0], rel_err_old=errs[1],
                       new_tflops=flops / new_t / 1e9, old_tflops=flops / old_t / 1e9, cublas_tflops=flops / cb_t / 1e9,
                       new_vs_cublas=cb_t / new_t, old_vs_cublas=cb_t / old_t, new_vs_old=old_t / new_t,
                       registers_new=max(r.registers for r in kernels[0].resources.values()),
                       registers_old=max(r.registers for r in kernels[1].resources.values()),
                       spills_new=kernels[0].spills, spills_old=kernels[1].spills)
            rows.append(row)
            print(f"{dt:4s} {M:5d}x{N:5d}x{K:5d}  new {row['new_tflops']:6.1f} ({row['new_vs_cublas']:.3f}x)  "
                  f"old {row['old_tflops']:6.1f} ({row['old_vs_cublas']:.3f}x)  cuBLAS {row['cublas_tflops']:6.1f}  "
                  f"new/old {row['new_vs_old']:.3f}  err {errs[0]:.1e}/{errs[1]:.1e}", flush=True)
    meta = dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(), torch=torch.__version__,
                command=" ".join(sys.argv), method=f"rounds of (new, old, cuBLAS), reversed every other round, each {args.reps} launches between "
                f"events, median of {args.samples}; medians over {args.rounds} rounds", atoms=args.atoms)
    if args.out:
        write_results(args.out, meta, rows)
    return rows


if __name__ == "__main__":
    main()
