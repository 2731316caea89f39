"""Batched GEMM: ``firesched.recipes.bmm`` next to ``torch.bmm`` (cuBLAS strided batched), in one
process, interleaved.

    PYTHONPATH=. python bench/bmm.py [--dtypes f16,bf16] [--rounds 7] [--only 64x1024x1024x64,...]

For each (batch, M, N, K): ours with the recipe's defaults (no parameters: the tile model in
``firesched.recipes.tiles`` picks them), and ``torch.bmm`` on the same inputs.  Each round times
ours, then the peer (``reps`` back-to-back launches between two events, median of ``samples``);
the figures are medians over rounds, inputs rotated among copies when they fit in L2.  Writes
``bench/results/bmm-<date>.json`` (or ``--out``) and prints the geometric mean of the ratios.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import firesched as fs  # noqa: E402
from bench.gemm import L2_BYTES, time_ms, write_results  # noqa: E402

SUITE = [
    (512, 128, 128, 64), (256, 256, 256, 64), (64, 1024, 1024, 64), (128, 512, 512, 128), (32, 512, 512, 512),
    (8, 2048, 2048, 2048), (4, 4096, 4096, 1024), (16, 1000, 1000, 128), (96, 384, 384, 64), (12, 768, 3072, 768),
]
QUICK = [(8, 128, 128, 64), (3, 100, 72, 40)]


def bench_one(torch, batch, M, N, K, dt, rounds, reps, samples, check=True):
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt]
    sched = fs.recipes.bmm(batch, M, N, K, dtype=dt, arch="sm_90a")
    k = fs.compile(sched, arch="sm_90a")
    per_set = batch * (M * K + K * N + M * N) * 2
    nsets = max(1, min(8, math.ceil(2 * L2_BYTES / per_set)))
    sets = [(torch.randn(batch, M, K, device="cuda", dtype=tdt), torch.randn(batch, K, N, device="cuda", dtype=tdt),
             torch.empty(batch, M, N, device="cuda", dtype=tdt)) for _ in range(nsets)]
    a, b, c = sets[0]
    c.fill_(float("nan"))
    k(a, b, c)
    ref = torch.bmm(a.float(), b.float())
    err = ((c.float() - ref).norm() / ref.norm()).item()
    if check and not err < 2e-2:
        raise SystemExit(f"bmm {batch}x{M}x{N}x{K} {dt}: wrong result, relative error {err:.3e}")

    def ours(i, sets=sets, nsets=nsets):
        k(*sets[i % nsets])

    def peer(i, sets=sets, nsets=nsets):
        torch.bmm(sets[i % nsets][0], sets[i % nsets][1])

    t_ours, t_peer = [], []
    for _ in range(rounds):
        t_ours.append(time_ms(torch, ours, reps, samples))
        t_peer.append(time_ms(torch, peer, reps, samples))
    to, tp = statistics.median(t_ours), statistics.median(t_peer)
    flops = 2.0 * batch * M * N * K
    return dict(batch=batch, M=M, N=N, K=K, dtype=dt, rel_err=err, ours_tflops=flops / to / 1e9,
                torch_tflops=flops / tp / 1e9, ratio=tp / to, spills=k.spills,
                registers=max(r.registers for r in k.resources.values()), schedule=repr(sched))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="f16,bf16")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--only", default="")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench/bmm.py needs a CUDA GPU and torch")
    suite = QUICK if args.quick else SUITE
    if args.only:
        suite = [tuple(int(x) for x in s.split("x")) for s in args.only.split(",")]
    rounds, reps, samples = (2, 3, 3) if args.quick else (args.rounds, args.reps, args.samples)
    rows = []
    for dt in args.dtypes.split(","):
        for shape in suite:
            r = bench_one(torch, *shape, dt, rounds, reps, samples)
            rows.append(r)
            print(f"{dt:4s} {r['batch']:4d} x {r['M']:5d}x{r['N']:5d}x{r['K']:5d}  ours {r['ours_tflops']:6.1f}  "
                  f"torch.bmm {r['torch_tflops']:6.1f}  ratio {r['ratio']:.3f}  err {r['rel_err']:.1e}", flush=True)
    gm = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    print(f"geometric mean of the ratios over {len(rows)} rows: {gm:.3f}")
    meta = dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(), torch=torch.__version__,
                cuda=torch.version.cuda, nvrtc=".".join(map(str, fs.cuda.nvrtc.nvrtc_version())), command=" ".join(sys.argv),
                method=f"rounds of (ours, torch.bmm), each {reps} launches between events, median of {samples}; "
                       f"medians over {rounds} rounds; inputs rotated when they fit in L2", geomean=gm)
    write_results(args.out or os.path.join(HERE, "results", f"bmm-{meta['date']}{'-quick' if args.quick else ''}.json"),
                  meta, rows)
    return rows


if __name__ == "__main__":
    main()
