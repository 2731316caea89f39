"""Time variations of the tile model's parameters next to cuBLAS, shape by shape (one process,
interleaved): how the numbers in ``firesched/recipes/tiles.py`` are checked.

    PYTHONPATH=. python bench/gemm_variants.py 127x4096x4096 64x4096x4096 --vary stages=6,8,10,12
    PYTHONPATH=. python bench/gemm_variants.py --suite --vary cluster=1,2        # gemm_suite's M > 16
    PYTHONPATH=. python bench/gemm_variants.py --smoke                           # no GPU: build, compile
    PYTHONPATH=. python bench/gemm_variants.py 16x8192x8192 --layout RC --vary swap_ab=True --vary block_m=16

For each shape the model's parameters (``recipes.tiles.default_params``) are one variant, and
every combination of the ``--vary`` values applied over them another (a combination that does
not check, e.g. a ring over shared memory, is listed as refused).  Timing:
``firesched.timing.interleaved``, inputs rotated past L2, ratio = cuBLAS time / ours.  Results go
to ``--out`` (JSON) when given.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import firesched as fs  # noqa: E402
from bench.gemm import write_results  # noqa: E402
from firesched import timing  # noqa: E402
from firesched.hardware.target import target as get_target  # noqa: E402
from firesched.recipes.gemm import SM80_FIELDS, SM90_FIELDS  # noqa: E402
from firesched.tuner import compile_jobs  # noqa: E402

ARCH = "sm_90a"
KW = dict(out_dtype=None, layout="RR", epilogue_ops=())


def parse_vary(items, fields=SM80_FIELDS + SM90_FIELDS + ("atoms",)) -> dict:
    """``["stages=6,8", "cluster=1,2"]`` -> ``{"stages": [6, 8], "cluster": [1, 2]}``: ints, True
    and False are converted, other values kept as strings; a name not in ``fields`` is a one-line
    exit (``bench/fmha.py`` passes ``FmhaParams``'s fields)."""
    out = {}
    for item in items:
        name, _, values = item.partition("=")
        if name not in fields or not values:
            raise SystemExit(f"--vary {item!r}: give FIELD=V1,V2 with FIELD one of {', '.join(sorted(set(fields)))}")
        out[name] = [{"True": True, "False": False}.get(v, v) if not v.lstrip("-").isdigit() else int(v)
                     for v in values.split(",")]
    return out


def variants(M: int, N: int, K: int, vary: dict, kw: dict = KW) -> list[tuple[str, fs.recipes.GemmParams]]:
    """The model's parameters for one shape, then each combination of ``vary`` over them (those
    that build a schedule), named by what differs."""
    base = dict(fs.recipes.tiles.default_params(M, N, K, get_target(ARCH), layout=kw["layout"]))
    out = [("model", fs.recipes.GemmParams(**base))]
    names, values = list(vary), [vary[n] for n in vary]
    for combo in itertools.product(*values):
        over = dict(zip(names, combo))
        if all(base.get(n) == v for n, v in over.items()):
            continue
        p = fs.recipes.GemmParams(**{**base, **over})
        label = " ".join(f"{n}={v}" for n, v in over.items())
        try:
            fs.recipes.gemm(M, N, K, "f16", ARCH, params=p, **kw)
        except fs.ScheduleError as e:
            print(f"{M}x{N}x{K} {label}: refused ({str(e).splitlines()[0][:100]})")
            continue
        out.append((label, p))
    return out


def smoke() -> list:
    """Build and compile the variants of one tiny shape (what CI runs; no GPU)."""
    rows = []
    for label, p in variants(300, 256, 1000, {"stages": [3, 4]}):
        k = fs.compile(fs.recipes.gemm(300, 256, 1000, "f16", ARCH, params=p, **KW), arch=ARCH)
        rows.append(dict(variant=label, spills=k.spills))
    return rows


def time_shape(torch, M, N, K, dt, cands, rounds, kw: dict = KW) -> dict:
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt]
    n = timing.copies((M * K + K * N + M * N) * 2)

    def b_operand():
        # layout "RC": B column-major (an N x K tensor seen as K x N), as nn.Linear keeps its weight
        if kw["layout"][1] == "C":
            return torch.randn(N, K, device="cuda").to(tdt).t()
        return torch.randn(K, N, device="cuda").to(tdt)
    sets = [(torch.randn(M, K, device="cuda").to(tdt), b_operand()) for _ in range(n)]
    C = torch.empty(M, N, device="cuda", dtype=tdt)
    want = sets[0][0].float() @ sets[0][1].float()
    fns = {}
    for label, p in cands:
        k = fs.compile(fs.recipes.gemm(M, N, K, dt, ARCH, params=p, **kw), arch=ARCH)
        k.prepare(torch.cuda.current_device())
        C.fill_(float("nan"))
        k(*sets[0], C=C)
        err = ((C.float() - want).norm() / want.norm()).item()
        if not err < 2e-2:
            raise SystemExit(f"{M}x{N}x{K} {label}: wrong result (relative error {err:.2e})")
        fns[label] = (lambda kk: (lambda i: kk(*sets[i % n], C=C)))(k)
    fns["peer"] = lambda i: torch.matmul(*sets[i % n])
    us = timing.interleaved(fns, rounds=rounds)
    return dict(M=M, N=N, K=K, dtype=dt, peer_us=us["peer"],
                variants={label: dict(params=dict(p), us=us[label], ratio=us["peer"] / us[label])
                          for label, p in cands})


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shapes", nargs="*", help="MxNxK ...")
    p.add_argument("--suite", action="store_true", help="bench/gemm_suite.py's shapes with M > 16")
    p.add_argument("--vary", action="append", default=[], help="FIELD=V1,V2,... (repeatable)")
    p.add_argument("--dtype", default="f16")
    p.add_argument("--layout", default="RR", help="A's then B's majorness: RR (default) or RC")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--smoke", action="store_true", help="build and compile a tiny shape's variants; no GPU")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        rows = smoke()
        print(json.dumps(rows))
        return rows
    from bench.gemm_suite import SHAPES, cuda_torch

    torch = cuda_torch("bench/gemm_variants.py")

    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    if args.suite:
        shapes += [(M, N, K) for (M, N, K, _) in SHAPES if M > 16]
    if not shapes:
        raise SystemExit("give shapes (MxNxK) or --suite")
    vary = parse_vary(args.vary)
    kw = dict(KW, layout=args.layout)
    plan = [((M, N, K), variants(M, N, K, vary, kw)) for (M, N, K) in shapes]
    compile_jobs([((M, N, K, args.dtype, ARCH, kw), q) for (M, N, K), cands in plan for _, q in cands], progress=False)
    rows = []
    for (M, N, K), cands in plan:
        r = time_shape(torch, M, N, K, args.dtype, cands, args.rounds, kw)
        r["layout"] = args.layout
        rows.append(r)
        print(f"{M}x{N}x{K} ({r['peer_us']:.1f} us cuBLAS): "
              + " | ".join(f"{label} {v['ratio']:.3f}" for label, v in r["variants"].items()), flush=True)
    if args.out:
        meta = dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(),
                    torch=torch.__version__, firesched=fs.version.__version__,
                    command="bench/gemm_variants.py " + " ".join(argv if argv is not None else sys.argv[1:]))
        write_results(args.out, meta, rows)
    return rows


if __name__ == "__main__":
    main()
