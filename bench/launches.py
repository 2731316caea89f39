"""How a program's launches are chained, timed: each schedule compiled three ways and timed
interleaved with cuBLAS in one process (``firesched.timing.interleaved``: CUDA graphs of calls one
after another, inputs rotated past L2).

    PYTHONPATH=. python bench/launches.py                         # W4A16 M = 1, 16, 128, 256 at 4096; GEMM 2048³, 8192³
    PYTHONPATH=. python bench/launches.py --w4a16 256x4096 --gemm 8192 --rounds 15
    PYTHONPATH=. python bench/launches.py --smoke                 # CPU: compile each way, print the launches

The three ways (``compile(..., programmatic=...)``, ``lower.transforms.launches``):

* ``plain`` (False): the program's first kernel launched the ordinary way (a program's later
  kernels are programmatic on sm_90a in any case);
* ``default`` (None): the first kernel chained to the launch before it (it waits with
  ``griddepcontrol.wait``) unless the grid is sized to the SMs; the last kernel lets the next
  launch start only in a program of one kernel;
* ``chained`` (True): both, on every program.

W4A16 shapes are ``MxNK`` (N = K, ``bench.gemm_w4a16``'s weights: group 128, f16, unsigned codes;
the peer is cuBLAS on the fp16 weights), GEMM shapes ``N`` (N³, f16, row-major, ``bench.gemm.params_sm90``'s tiles; the peer is
``torch.matmul``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import firesched as fs  # noqa: E402

WAYS = {"plain": False, "default": None, "chained": True}


def _compiled(sched) -> dict:
    return {way: fs.compile(sched, arch="sm_90a", programmatic=p) for way, p in WAYS.items()}


def _launches(k) -> list:
    """Per kernel: (name, launched programmatically, lets the next launch start)."""
    return [(kern.name, kern.programmatic, "griddep_launch_dependents" in str(kern.body)) for kern in k.program.kernels]


def _caller(kernel, inputs, out):
    """``fn(i)`` for ``timing.interleaved``: ``kernel`` on the ``i``-th inputs, into ``out``."""
    return lambda i: kernel(*inputs(i), C=out)


def w4a16_row(torch, M: int, nk: int, rounds: int) -> dict:
    from bench.gemm_w4a16 import GROUP, _weights
    from firesched import timing

    q, s, deq = _weights(nk, nk, "f16")
    deq = torch.from_numpy(deq).cuda()
    sched = fs.recipes.gemm_w4a16(M, nk, nk, group_size=GROUP, arch="sm_90a")
    ks = _compiled(sched)
    packs = [torch.from_numpy(fs.recipes.pack_weights(q, sched)).cuda()
             for _ in range(max(2, math.ceil(100e6 / (nk * nk // 2))))]
    S = torch.from_numpy(np.asarray(s).astype(np.float32)).half().cuda()
    a = torch.randn(M, nk, device="cuda", dtype=torch.float16)
    outs = {way: torch.empty(M, nk, device="cuda", dtype=torch.float16) for way in ks}
    for way, k in ks.items():
        k(a, packs[0], S, C=outs[way])
    torch.cuda.synchronize()
    ref = a.float() @ deq.float()
    errors = {way: (o.float() - ref).abs().max().item() for way, o in outs.items()}
    w16 = deq.t().contiguous().half()
    w16s = [w16] + [w16.clone() for _ in range(max(1, math.ceil(100e6 / (nk * nk * 2))))]
    fns = {way: _caller(k, lambda i: (a, packs[i % len(packs)], S), outs[way]) for way, k in ks.items()}
    fns["cublas"] = lambda i: torch.nn.functional.linear(a, w16s[i % len(w16s)])
    us = timing.interleaved(fns, reps=20, rounds=rounds)
    return dict(kind="w4a16", M=M, N=nk, K=nk, us=us, max_error=errors,
                launches={way: _launches(k) for way, k in ks.items()})


def gemm_row(torch, n: int, rounds: int) -> dict:
    from bench.gemm import params_sm90
    from firesched import timing

    sched = fs.recipes.gemm(n, n, n, "f16", "sm_90a", **params_sm90(n, n, n))
    ks = _compiled(sched)
    sets = max(2, math.ceil(100e6 / (4 * n * n)))
    a = [torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(sets)]
    b = [torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(sets)]
    c = torch.empty(n, n, device="cuda", dtype=torch.float16)
    ref = a[0].float() @ b[0].float()
    errors = {}
    for way, k in ks.items():
        k(a[0], b[0], C=c)
        torch.cuda.synchronize()
        errors[way] = ((c.float() - ref).abs().max() / ref.abs().max()).item()
    fns = {way: _caller(k, lambda i: (a[i % sets], b[i % sets]), c) for way, k in ks.items()}
    fns["cublas"] = lambda i: torch.matmul(a[i % sets], b[i % sets])
    us = timing.interleaved(fns, reps=max(3, min(40, int(2e9 / n ** 3))), rounds=rounds)
    return dict(kind="gemm", M=n, N=n, K=n, us=us, tflops={w: 2 * n ** 3 / t / 1e6 for w, t in us.items()},
                max_rel_error=errors, launches={way: _launches(k) for way, k in ks.items()})


def smoke() -> list:
    """CPU: a split W4A16 program and a one-kernel GEMM, compiled each way; their launches."""
    rows = []
    for name, sched in (("w4a16 1x1024", fs.recipes.gemm_w4a16(1, 1024, 1024, arch="sm_90a")),
                        ("gemm 256", fs.recipes.gemm(256, 256, 256, "f16", "sm_90a", atoms="sm80"))):
        rows.append(dict(name=name, launches={way: _launches(k) for way, k in _compiled(sched).items()}))
    return rows


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--w4a16", default="1x4096,16x4096,128x4096,256x4096", help="MxNK,... (N = K)")
    ap.add_argument("--gemm", default="2048,8192", help="N,... (N³)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        rows = smoke()
        print(json.dumps(rows))
        return rows
    import torch

    rows = []
    for item in filter(None, args.w4a16.split(",")):
        M, nk = (int(x) for x in item.split("x"))
        r = w4a16_row(torch, M, nk, args.rounds)
        rows.append(r)
        print(f"W4A16 M={M} N=K={nk}: " + ", ".join(f"{w} {t:.2f} us" for w, t in r["us"].items())
              + " | time / plain: " + ", ".join(f"{w} {r['us'][w] / r['us']['plain']:.3f}" for w in WAYS), flush=True)
    for item in filter(None, args.gemm.split(",")):
        r = gemm_row(torch, int(item), args.rounds)
        rows.append(r)
        print(f"GEMM {item}^3: " + ", ".join(f"{w} {t:.1f} TFLOP/s" for w, t in r["tflops"].items())
              + " | time / plain: " + ", ".join(f"{w} {r['us'][w] / r['us']['plain']:.3f}" for w in WAYS), flush=True)
    if args.out:
        meta = dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(),
                    torch=torch.__version__, firesched=fs.version.__version__,
                    command="bench/launches.py " + " ".join(argv if argv is not None else sys.argv[1:]))
        from bench.gemm import write_results

        write_results(args.out, meta, rows)
    return rows


if __name__ == "__main__":
    main()
