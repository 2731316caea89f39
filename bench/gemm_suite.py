"""The GEMM suite: the default ``recipes.gemm`` (and, with ``--tuned``, ``firesched.tune``'s
choice) against cuBLAS on 34 shapes, in one process, interleaved.

    PYTHONPATH=. python bench/gemm_suite.py                     # default recipe, f16 and bf16
    PYTHONPATH=. python bench/gemm_suite.py --tuned --limit 12  # tune each shape first (f16)
    PYTHONPATH=. python bench/gemm_suite.py --fused             # + bias + ReLU vs torch._addmm_activation
    PYTHONPATH=. python bench/gemm_suite.py --smoke             # tiny shapes, no GPU needed: build, check, compile
    PYTHONPATH=. python bench/gemm_suite.py --only 12,23 --old ../other  # also that checkout's kernel, same rounds

Shapes: M from 1 to 16384 (1, 8, 16, 64, 128, primes, a few thousand), N and K from 256 to
16384, skinny both ways, few-tile problems and unaligned leading dimensions.  Timing:
``firesched.timing.interleaved`` (each callable's launches captured in a CUDA graph, replayed in
turn round after round, median of rounds), inputs rotated past L2; ratio = peer time / our
time.  All kernels are compiled in parallel processes first.  Results go to
``bench/results/gemm-suite-<date>.json`` and a plot of the ratios to ``.png`` beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import firesched as fs  # noqa: E402
from bench.gemm import write_results  # noqa: E402
from firesched import ops, timing  # noqa: E402
from firesched.hardware.target import target as get_target  # noqa: E402
from firesched.tuner import compile_jobs  # noqa: E402

#: (M, N, K, what the shape stands for)
SHAPES = [
    (1, 4096, 4096, "decode"), (1, 8192, 8192, "decode"), (1, 16384, 4096, "decode, wide N"),
    (8, 8192, 8192, "decode batch 8"), (8, 4096, 14336, "decode batch 8, MLP"),
    (16, 8192, 8192, "decode batch 16"), (16, 4096, 4096, "decode batch 16"),
    (64, 8192, 8192, "small batch"), (64, 4096, 4096, "small batch"),
    (128, 8192, 8192, "small batch"), (128, 4096, 16384, "small batch, long K"),
    (127, 4096, 4096, "prime M"), (257, 1024, 4096, "prime M"), (1009, 2048, 2048, "prime M"),
    (2048, 2048, 2048, "square"), (3072, 3072, 3072, "square"), (4096, 4096, 4096, "square"),
    (8192, 8192, 8192, "square"), (5376, 5376, 2048, "large"), (3968, 1664, 2816, "fractional wave"),
    (16384, 256, 4096, "skinny N"), (16384, 1024, 1024, "tall"), (256, 16384, 4096, "skinny M"),
    (4096, 256, 16384, "skinny N, long K"), (256, 256, 16384, "few tiles, long K"),
    (512, 512, 8192, "few tiles, long K"), (1024, 1024, 256, "short K"), (16384, 16384, 256, "short K, large"),
    (4095, 4097, 1023, "unaligned"), (1000, 1000, 1000, "unaligned"), (3001, 2999, 1531, "unaligned, primes"),
    (2047, 8191, 4093, "unaligned, odd"), (8192, 1024, 8192, "prefill-like"), (16384, 4096, 1024, "prefill-like"),
]
SMOKE = [(1, 256, 256, "decode"), (64, 128, 256, "small"), (100, 72, 200, "unaligned")]
ARCH = "sm_90a"
EPI = (ops.bias("bias"), ops.relu())


def _jobs(shapes, dtypes, fused: bool):
    kw = dict(out_dtype=None, layout="RR", epilogue_ops=EPI if fused else ())
    return [((M, N, K, dt, ARCH, kw), None) for (M, N, K, _) in shapes for dt in dtypes]


def smoke() -> list:
    """Build, check and compile the default schedule of the smoke shapes (no GPU): what CI runs."""
    rows = []
    for (M, N, K, what) in SMOKE:
        for fused in (False, True):
            sched = fs.recipes.gemm(M, N, K, "f16", ARCH, epilogue_ops=EPI if fused else ())
            k = fs.compile(sched, arch=ARCH)
            rows.append(dict(M=M, N=N, K=K, what=what, fused=fused, spills=k.spills))
    return rows


def gpu_row(torch, M, N, K, what, dt, args) -> dict:
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt]
    epi = EPI if args.fused else ()
    sched = fs.recipes.gemm(M, N, K, dt, ARCH, epilogue_ops=epi)
    k = fs.compile(sched, arch=ARCH)
    k.prepare(torch.cuda.current_device())
    fns = {}
    tuned = None
    if args.tuned:
        tuned = fs.tune("gemm", M, N, K, dtype=dt, arch=ARCH, epilogue_ops=epi, limit=args.limit,
                        rounds=args.tune_rounds, force=args.force, progress=False)
        kt = fs.compile(fs.recipes.gemm(M, N, K, dt, ARCH, epilogue_ops=epi, tuned=True), arch=ARCH)
        kt.prepare(torch.cuda.current_device())
    n = timing.copies((M * K + K * N + M * N) * 2)
    sets = [(torch.randn(M, K, device="cuda").to(tdt), torch.randn(K, N, device="cuda").to(tdt),
             torch.randn(N, device="cuda").to(tdt)) for _ in range(n)]
    C = torch.empty(M, N, device="cuda", dtype=tdt)
    a, b, bias = sets[0]
    want = a.float() @ b.float()
    if args.fused:
        want = torch.relu(want + bias.float())
    C.fill_(float("nan"))
    k(a, b, bias, C=C) if args.fused else k(a, b, C=C)
    err = ((C.float() - want).norm() / want.norm()).item()
    if not err < 2e-2:
        raise SystemExit(f"{M}x{N}x{K} {dt}: the default kernel is wrong (relative error {err:.2e})")

    def call(kern):
        if args.fused:
            return lambda i: kern(sets[i % n][0], sets[i % n][1], sets[i % n][2], C=C)
        return lambda i: kern(sets[i % n][0], sets[i % n][1], C=C)

    fns["ours"] = call(k)
    if tuned is not None:
        fns["tuned"] = call(kt)
    if args.old:
        from bench.ab_versions import load_other

        other = load_other(args.old)
        ko = other.compile(other.recipes.gemm(M, N, K, dt, ARCH, epilogue_ops=epi), arch=ARCH)
        ko.prepare(torch.cuda.current_device())
        C.fill_(float("nan"))
        ko(a, b, bias, C=C) if args.fused else ko(a, b, C=C)
        err_old = ((C.float() - want).norm() / want.norm()).item()
        if not err_old < 2e-2:
            raise SystemExit(f"{M}x{N}x{K} {dt}: --old's default kernel is wrong (relative error {err_old:.2e})")
        fns["old"] = call(ko)
    if args.fused:
        fns["peer"] = lambda i: torch._addmm_activation(sets[i % n][2], sets[i % n][0], sets[i % n][1],
                                                        use_gelu=False)
    else:
        fns["peer"] = lambda i: torch.matmul(sets[i % n][0], sets[i % n][1])
    us = timing.interleaved(fns, rounds=args.rounds)
    flops = 2.0 * M * N * K
    row = dict(M=M, N=N, K=K, what=what, dtype=dt, fused=args.fused, rel_err=err, spills=k.spills,
               ours_us=us["ours"], peer_us=us["peer"], ours_tflops=flops / us["ours"] / 1e6,
               peer_tflops=flops / us["peer"] / 1e6, ratio=us["peer"] / us["ours"],
               default=str(fs.recipes.tiles.default_params(M, N, K, get_target(ARCH))))
    if args.old:
        row.update(old_us=us["old"], old_ratio=us["peer"] / us["old"], new_vs_old=us["old"] / us["ours"])
    if tuned is not None:
        row.update(tuned_us=us["tuned"], tuned_ratio=us["peer"] / us["tuned"], tuned_params=str(tuned.params),
                   tune_seconds=tuned.seconds, tune_from_cache=tuned.from_cache,
                   tune_wrong=[str(c) for c in tuned.wrong])
    return row


def cuda_torch(script: str):
    """torch, where it is installed and sees a CUDA GPU; else a one-line exit naming ``script``."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        raise SystemExit(f"{script} needs a CUDA GPU and torch (or --smoke)")
    return torch


def geomean(xs) -> float:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def plot(rows, path: str) -> str | None:
    """Bars of the ratio to the peer per shape (one colour per dtype; tuned as outlines)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    dts = sorted({r["dtype"] for r in rows})
    shapes = list(dict.fromkeys(f"{r['M']}x{r['N']}x{r['K']}" for r in rows))
    fig, ax = plt.subplots(figsize=(max(10, len(shapes) * 0.45), 5))
    w = 0.8 / len(dts)
    for j, dt in enumerate(dts):
        got = {f"{r['M']}x{r['N']}x{r['K']}": r for r in rows if r["dtype"] == dt}
        xs = [i + j * w for i, s in enumerate(shapes) if s in got]
        ax.bar(xs, [got[s]["ratio"] for s in shapes if s in got], w, label=f"default {dt}")
        if any("tuned_ratio" in r for r in got.values()):
            ax.bar(xs, [got[s].get("tuned_ratio", 0) for s in shapes if s in got], w, fill=False,
                   edgecolor="black", label=f"tuned {dt}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(0.9, color="red", lw=0.8, ls="--")
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(shapes))])
    ax.set_xticklabels(shapes, rotation=70, fontsize=7)
    ax.set_ylabel("time of peer / time of ours")
    ax.set_title("firesched GEMM vs " + ("torch._addmm_activation" if rows[0]["fused"] else "cuBLAS") + " (H100)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="f16,bf16")
    p.add_argument("--fused", action="store_true", help="bias + ReLU epilogue against torch._addmm_activation")
    p.add_argument("--tuned", action="store_true", help="tune each shape first and time the tuned kernel too")
    p.add_argument("--limit", type=int, default=12, help="points of the space each tuning compiles")
    p.add_argument("--force", action="store_true", help="re-tune shapes already in the tuned store")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--tune-rounds", type=int, default=5)
    p.add_argument("--only", default="", help="comma-separated indices into SHAPES")
    p.add_argument("--smoke", action="store_true", help="build and compile tiny shapes; no GPU")
    p.add_argument("--old", default="", help="another checkout whose default kernel is timed in the same rounds")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        rows = smoke()
        print(json.dumps(rows))
        return rows
    torch = cuda_torch("bench/gemm_suite.py")
    shapes = [SHAPES[int(i)] for i in args.only.split(",")] if args.only else SHAPES
    dtypes = args.dtypes.split(",")
    res = compile_jobs(_jobs(shapes, dtypes, args.fused), progress=False)
    bad = [r for r in res if r[1] is not None]
    if bad:
        print(f"{len(bad)} default kernels failed to compile: {bad[:3]}")
    rows = []
    for (M, N, K, what) in shapes:
        for dt in dtypes:
            r = gpu_row(torch, M, N, K, what, dt, args)
            rows.append(r)
            extra = f"  tuned {r['tuned_ratio']:.2f} ({r['tune_seconds']:.0f} s)" if "tuned_ratio" in r else ""
            extra += f"  old {r['old_ratio']:.2f} (new / old time {1 / r['new_vs_old']:.3f})" if "old_ratio" in r else ""
            print(f"{dt:4s} {M:6d}x{N:6d}x{K:6d} {what:22s} ours {r['ours_tflops']:6.1f}  peer {r['peer_tflops']:6.1f}"
                  f"  ratio {r['ratio']:.2f}{extra}", flush=True)
    summary = {dt: dict(geomean=geomean(r["ratio"] for r in rows if r["dtype"] == dt),
                        worst=min(r["ratio"] for r in rows if r["dtype"] == dt),
                        below_0_9=sum(r["ratio"] < 0.9 for r in rows if r["dtype"] == dt))
               for dt in dtypes}
    if args.tuned:
        for dt in dtypes:
            summary[dt]["tuned_geomean"] = geomean(r["tuned_ratio"] for r in rows if r["dtype"] == dt)
    print(json.dumps(summary, indent=1))
    meta = dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(),
                torch=torch.__version__, cuda=torch.version.cuda,
                nvrtc=".".join(map(str, fs.cuda.nvrtc.nvrtc_version())), python=platform.python_version(),
                firesched=fs.__version__, command=" ".join(sys.argv),
                timing="firesched.timing.interleaved: CUDA graphs, interleaved rounds, median; inputs rotated past L2")
    name = f"gemm-suite{'-fused' if args.fused else ''}{'-tuned' if args.tuned else ''}-{meta['date']}"
    out = args.out or os.path.join(HERE, "results", name + ".json")
    write_results(out, meta, rows, summary=summary)
    png = plot(rows, out[:-5] + ".png")
    if png:
        print(f"wrote {png}")
    return rows


if __name__ == "__main__":
    main()
