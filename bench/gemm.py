"""GEMM benchmark: firesched's sm_80-atom recipe next to cuBLAS, in one process, same inputs.

    PYTHONPATH=. python bench/gemm.py            # the ANCHORS.md shapes, fp16 and bf16, plus fused
    PYTHONPATH=. python bench/gemm.py --quick    # a few small shapes

For each shape: TFLOP/s of ours and of ``torch.matmul`` (cuBLAS), and their ratio (ours / peer);
for the fused cases, ours (GEMM + bias + ReLU in one kernel) against the unfused torch path
(matmul, then + bias, then relu) and against ``torch._addmm_activation`` (cuBLASLt's fused
epilogue).  Timing: ``reps`` back-to-back launches between two CUDA events, median of ``samples``
such measurements after warm-up; inputs random (never zeros), rotated between several copies
when they fit in L2.  A table is printed and the numbers are written to ``bench/results/``.
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
from firesched import ops  # noqa: E402

SHAPES = [
    (8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048), (5376, 5376, 2048), (3968, 1664, 2816),
    (128, 8192, 8192), (1000, 1000, 1000), (4095, 4097, 1023),
]
QUICK = [(1024, 1024, 1024), (1000, 1000, 1000), (257, 383, 129)]
FUSED = [(4096, 4096, 4096), (2048, 2048, 1024), (8192, 8192, 1024)]
L2_BYTES = 50 * 2 ** 20


SMS = 132


def params_for(M: int, N: int, K: int) -> dict:
    """The sm_80-atom recipe's parameters per shape: the library's tile model
    (``firesched.recipes.tiles.params_sm80``)."""
    return fs.recipes.tiles.params_sm80(M, N, K, sms=SMS)


def time_ms(torch, fn, reps: int, samples: int) -> float:
    for _ in range(3):
        fn(0)
    torch.cuda.synchronize()
    out = []
    i = 0
    for _ in range(samples):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn(i)
            i += 1
        e1.record()
        torch.cuda.synchronize()
        out.append(e0.elapsed_time(e1) / reps)
    out.sort()
    return out[len(out) // 2]


def params_sm90(M: int, N: int, K: int) -> dict:
    """The Hopper recipe's parameters per shape: the library's tile model
    (``firesched.recipes.tiles.params_sm90``)."""
    return fs.recipes.tiles.params_sm90(M, N, K, sms=SMS)


def bench_shape(torch, M, N, K, dt_name, fused, reps, samples, check=True, atoms="sm80"):
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt_name]
    epi = (ops.bias("bias"), ops.relu()) if fused else ()
    kw = params_sm90(M, N, K) if atoms == "sm90a" else params_for(M, N, K)
    try:
        sched = fs.recipes.gemm(M, N, K, dtype=dt_name, arch="sm_90a", epilogue_ops=epi, **kw)
    except fs.ScheduleError as e:
        if atoms != "sm90a":
            raise
        # TMA needs 16-byte row strides: unaligned shapes take the sm_80 recipe (recorded per row)
        print(f"     {M}x{N}x{K}: sm90a refuses ({str(e).splitlines()[0][:90]}...); sm_80 recipe instead")
        kw = params_for(M, N, K)
        sched = fs.recipes.gemm(M, N, K, dtype=dt_name, arch="sm_90a", epilogue_ops=epi, **kw)
    k = fs.compile(sched, arch="sm_90a")
    per_set = (M * K + K * N + M * N) * 2
    nsets = max(1, min(8, math.ceil(2 * L2_BYTES / per_set)))
    sets = []
    for _ in range(nsets):
        A = torch.randn(M, K, device="cuda", dtype=tdt)
        B = torch.randn(K, N, device="cuda", dtype=tdt)
        bias = torch.randn(N, device="cuda", dtype=tdt)
        C = torch.empty(M, N, device="cuda", dtype=tdt)
        sets.append((A, B, bias, C))
    A, B, bias, C = sets[0]
    C.fill_(float("nan"))
    k(A, B, bias, C) if fused else k(A, B, C)
    ref = (A.float() @ B.float())
    if fused:
        ref = torch.relu(ref + bias.float())
    err = ((C.float() - ref).norm() / ref.norm()).item()
    if check and not err < 2e-2:
        raise SystemExit(f"{M}x{N}x{K} {dt_name}: wrong result, relative error {err:.3e}")

    def ours(i):
        a, b, bb, c = sets[i % nsets]
        k(a, b, bb, c) if fused else k(a, b, c)

    def cublas(i):
        a, b, _, _ = sets[i % nsets]
        torch.matmul(a, b)

    def unfused(i):
        a, b, bb, _ = sets[i % nsets]
        torch.relu(torch.matmul(a, b) + bb)

    def lt_fused(i):
        a, b, bb, _ = sets[i % nsets]
        torch._addmm_activation(bb, a, b, use_gelu=False)

    flops = 2.0 * M * N * K
    row = dict(M=M, N=N, K=K, dtype=dt_name, fused=fused, params=kw, rel_err=err,
               registers=max(r.registers for r in k.resources.values()), spills=k.spills)
    t_ours = time_ms(torch, ours, reps, samples)
    row["ours_tflops"] = flops / t_ours / 1e9
    if fused:
        t_un = time_ms(torch, unfused, reps, samples)
        t_lt = time_ms(torch, lt_fused, reps, samples)
        row["unfused_tflops"] = flops / t_un / 1e9
        row["cublaslt_tflops"] = flops / t_lt / 1e9
        row["ratio_vs_unfused"] = t_un / t_ours
        row["ratio_vs_cublaslt"] = t_lt / t_ours
    else:
        t_cb = time_ms(torch, cublas, reps, samples)
        row["cublas_tflops"] = flops / t_cb / 1e9
        row["ratio"] = t_cb / t_ours
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few small shapes, fewer repetitions")
    p.add_argument("--dtypes", default="f16,bf16")
    p.add_argument("--no-fused", dest="fused", action="store_false")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--atoms", default="sm80", choices=("sm80", "sm90a"),
                   help="recipe family: sm_80 atoms (mma.sync) or the Hopper path (wgmma + TMA)")
    p.add_argument("--only", default="", help="comma-separated MxNxK shapes to run instead of the table")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/gemm-<date>.json)")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench/gemm.py needs a CUDA GPU and torch")
    shapes = QUICK if args.quick else SHAPES
    fused_shapes = QUICK[:1] if args.quick else FUSED
    if args.only:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.only.split(",")]
        fused_shapes = [s for s in fused_shapes if s in shapes]
    reps, samples = (5, 5) if args.quick else (args.reps, args.samples)
    rows = []
    for dt_name in args.dtypes.split(","):
        for (M, N, K) in shapes:
            try:
                rows.append(bench_shape(torch, M, N, K, dt_name, False, reps, samples, atoms=args.atoms))
            except fs.ScheduleError as e:
                print(f"{dt_name:4s} {M:5d}x{N:5d}x{K:5d}  not schedulable with {args.atoms}: {str(e).splitlines()[0]}")
                continue
            r = rows[-1]
            print(f"{dt_name:4s} {M:5d}x{N:5d}x{K:5d}  ours {r['ours_tflops']:6.1f}  cuBLAS {r['cublas_tflops']:6.1f}"
                  f"  ratio {r['ratio']:.2f}  err {r['rel_err']:.1e}", flush=True)
    if args.fused:
        for (M, N, K) in fused_shapes:
            rows.append(bench_shape(torch, M, N, K, "f16", True, reps, samples, atoms=args.atoms))
            r = rows[-1]
            print(f"f16  {M:5d}x{N:5d}x{K:5d} +bias+relu  ours {r['ours_tflops']:6.1f}  unfused "
                  f"{r['unfused_tflops']:6.1f} ({r['ratio_vs_unfused']:.2f}x)  cuBLASLt {r['cublaslt_tflops']:6.1f} "
                  f"({r['ratio_vs_cublaslt']:.2f}x)", flush=True)
    meta = dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(),
                torch=torch.__version__, cuda=torch.version.cuda, nvrtc=".".join(map(str, fs.cuda.nvrtc.nvrtc_version())),
                python=platform.python_version(), method=f"{reps} back-to-back launches between CUDA events, "
                f"median of {samples}; inputs rotated when they fit in L2", command=" ".join(sys.argv))
    try:
        import cuda.bindings

        meta["cuda_bindings"] = cuda.bindings.__version__
    except Exception:
        pass
    meta["atoms"] = args.atoms
    write_results(args.out or os.path.join(HERE, "results", f"gemm-{args.atoms}-{meta['date']}"
                                                             f"{'-quick' if args.quick else ''}.json"), meta, rows)
    return rows


def write_results(path: str, meta: dict, rows: list, **extra) -> None:
    """Write ``{"meta": meta, **extra, "rows": rows}`` as JSON to ``path`` (creating its folder)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(meta=meta, **extra, rows=rows), f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
