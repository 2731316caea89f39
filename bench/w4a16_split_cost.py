"""What the K split of a small-M W4A16 kernel costs: the default plan's two launches (the main
kernel writing f32 partial sums, a second kernel adding them, launched programmatically: see
``lower.transforms.launches``) against the same two launched the ordinary way, the main kernel
alone, and the parts added in the main kernel instead (``split_k(..., combine="fixup")``), next to
cuBLAS on the fp16 weights, in one process, interleaved (``firesched.timing.interleaved``: CUDA
graphs, weights rotated past L2).

    PYTHONPATH=. python bench/w4a16_split_cost.py                  # M = 1, 16, 64 at 4096; M = 1 at 8192
    PYTHONPATH=. python bench/w4a16_split_cost.py --shapes 1x8192 --out results/x.json
    PYTHONPATH=. python bench/w4a16_split_cost.py --smoke          # no GPU: build and compile

Variants (the middle two are measuring devices, not kernels to use):

* ``plan``: ``recipes.gemm_w4a16`` as a user calls it (where its parts add up in a thread-block
  cluster, ``w4a16.CLUSTER_SPLITS``, it is one launch, and the next two variants are not timed);
* ``ordinary``: the same program with the second kernel launched without the programmatic
  attribute (its ``griddepcontrol.wait`` is then a no-op: it starts after the first completes);
* ``main only``: the plan's first launch alone: the product's time without its reduction (C is
  not written);
* ``fixup``: the plan's tiles with ``fixup=True`` (one launch);
* ``same bytes``: not a GEMM: torch's elementwise ``neg`` over half of the packed codes (as f16),
  which reads and writes as many bytes as the product reads of codes; what one memory-bound
  launch of that traffic takes on this GPU in this timing.  It is timed apart, interleaved with
  cuBLAS alone (its writes would cost whatever replayed after it).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import attrs  # noqa: E402
import numpy as np  # noqa: E402

import firesched as fs  # noqa: E402
from bench.gemm import write_results  # noqa: E402

SHAPES = ((1, 4096), (16, 4096), (64, 4096), (1, 8192))
GROUP = 128


def schedules(M: int, nk: int, params=None):
    """(plan, fixup) schedules of one shape; ``params`` (a ``W4A16Params`` or ``W4A16WgmmaParams``)
    instead of the plan's tiles."""
    plan = params if params is not None else fs.recipes.w4a16.plan(M, nk, nk, wgmma=True)
    base = fs.recipes.gemm_w4a16(M, nk, nk, group_size=GROUP, arch="sm_90a", params=params)
    fixup = fs.recipes.gemm_w4a16(M, nk, nk, group_size=GROUP, arch="sm_90a",
                                  params=attrs.evolve(plan, fixup=True, cluster_combine=False))
    return base, fixup


class _Variant:
    """Stands in for a program's last kernel: launches it the ordinary way (``ordinary``) or not
    at all (``skip``).  Kernels are shared between programs of one module, so the variant wraps
    the launch of one program instead of changing the kernel."""

    def __init__(self, kernel, mode: str):
        self.kernel, self.mode = kernel, mode

    def launch(self, grid, block, args, *, shared_bytes: int = 0, stream=0, programmatic: bool = False):
        if self.mode != "skip":
            self.kernel.launch(grid, block, args, shared_bytes=shared_bytes, stream=stream, programmatic=False)


def _replace_last(program, mode: str) -> None:
    launches = program._load(0)
    program._loaded = (0, launches[:-1] + [attrs.evolve(launches[-1], kernel=_Variant(launches[-1].kernel, mode))])


def gpu_row(torch, M: int, nk: int, rounds: int, params=None) -> dict:
    from firesched import timing
    from firesched.quant import dequantize_int4, quantize_int4

    w = np.random.default_rng(nk).standard_normal((nk, nk)).astype(np.float32) * 0.05
    q, s, _ = quantize_int4(w, GROUP, signed=False, scale_dtype="f16")
    deq = torch.from_numpy(dequantize_int4(q, s.astype(np.float32), None, GROUP)).cuda()
    base, fixup = schedules(M, nk, params)
    compiled = fs.compile(base, arch="sm_90a")
    # one program object each (compile hands back the same one for the same schedule): each keeps
    # its own launch list
    progs = {name: copy.copy(compiled) for name in ("plan", "ordinary", "main only")}
    for p in progs.values():
        p._loaded, p._workspace = None, {}
    progs["fixup"] = fs.compile(fixup, arch="sm_90a")
    two = len(progs["plan"].program.kernels) == 2
    for name, p in progs.items():
        p.prepare(0)
        if two and name in ("ordinary", "main only"):
            _replace_last(p, "skip" if name == "main only" else "ordinary")
    packs = [torch.from_numpy(fs.recipes.pack_weights(q, base)).cuda()
             for _ in range(max(2, math.ceil(100e6 / (nk * nk // 2))))]
    S = torch.from_numpy(np.asarray(s).astype(np.float32)).half().cuda()
    a = torch.randn(M, nk, device="cuda", dtype=torch.float16)
    outs = {name: torch.empty(M, nk, device="cuda", dtype=torch.float16) for name in progs}
    w16 = deq.t().contiguous().half()
    w16s = [w16] + [w16.clone() for _ in range(max(1, math.ceil(100e6 / (nk * nk * 2))))]
    ref = a.float() @ deq.float()
    errors = {}
    for name, p in progs.items():
        p(a, packs[0], S, C=outs[name])
        torch.cuda.synchronize()
        errors[name] = (outs[name].float() - ref).abs().max().item()

    def call(name):
        return lambda i: progs[name](a, packs[i % len(packs)], S, C=outs[name])

    fns = {name: call(name) for name in (progs if two else ("plan", "fixup"))}
    fns["cublas"] = lambda i: torch.nn.functional.linear(a, w16s[i % len(w16s)])
    t = timing.interleaved(fns, reps=20, rounds=rounds)
    # apart, against cuBLAS alone: its writes leave L2 dirty for whatever replays after it
    halves = [p.view(-1)[:p.numel() // 2].view(torch.float16) for p in packs]
    moved = [torch.empty_like(h) for h in halves]              # rotated too: the writes reach DRAM
    t2 = timing.interleaved({"same bytes": lambda i: torch.neg(halves[i % len(halves)], out=moved[i % len(moved)]),
                             "cublas": fns["cublas"]}, reps=20, rounds=rounds)
    p = params if params is not None else fs.recipes.w4a16.plan(M, nk, nk, wgmma=True)
    return dict(M=M, N=nk, K=nk, params=repr(p), us=t,
                x_cublas={n: t["cublas"] / v for n, v in t.items() if n != "cublas"}, max_error=errors,
                same_bytes={"us": t2, "x_cublas": t2["cublas"] / t2["same bytes"]})


def smoke() -> list:
    """CPU: the schedules of a small shape build and compile; the plan's second launch is programmatic."""
    rows = []
    for M, nk in ((1, 1024), (16, 1024)):
        base, fixup = schedules(M, nk)
        kb, kf = fs.compile(base, arch="sm_90a"), fs.compile(fixup, arch="sm_90a")
        rows.append(dict(M=M, N=nk, kernels=len(kb.program.kernels), fixup_kernels=len(kf.program.kernels),
                         programmatic=[k.programmatic for k in kb.program.kernels],
                         spills=kb.spills + kf.spills))
    return rows


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in SHAPES), help="MxNK,... (N = K)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--params", default="", help="W4A16Params(...) or W4A16WgmmaParams(...) for every shape "
                                                 "instead of the plan's tiles")
    args = ap.parse_args(argv)
    if args.smoke:
        rows = smoke()
        print(json.dumps(rows))
        return rows
    import torch

    from bench.gemm_w4a16 import parse_params

    given = parse_params(args.params)
    if len(given) > 1:
        raise SystemExit("--params: one parameter record (it applies to every shape)")
    rows = []
    for item in args.shapes.split(","):
        M, nk = (int(x) for x in item.split("x"))
        r = gpu_row(torch, M, nk, args.rounds, given[0] if given else None)
        rows.append(r)
        print(f"M={M} N=K={nk}: " + ", ".join(f"{n} {v:.2f} us" for n, v in r["us"].items()) + " | x cuBLAS: "
              + ", ".join(f"{n} {v:.2f}" for n, v in r["x_cublas"].items())
              + f" | apart: same bytes {r['same_bytes']['us']['same bytes']:.2f} us, cuBLAS "
                f"{r['same_bytes']['us']['cublas']:.2f} us, x {r['same_bytes']['x_cublas']:.2f}", flush=True)
    if args.out:
        meta = dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(),
                    torch=torch.__version__, firesched=fs.version.__version__,
                    command="bench/w4a16_split_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]))
        write_results(args.out, meta, rows)
    return rows


if __name__ == "__main__":
    main()
