"""Attention forward benchmark: ``recipes.fmha`` next to torch's scaled_dot_product_attention with
the cuDNN backend and with the flash (FlashAttention-2) backend, in one process, same inputs.

    PYTHONPATH=. python bench/fmha.py                       # the ANCHORS.md shapes, fp16 and bf16
    PYTHONPATH=. python bench/fmha.py --shapes 4x16x4096x128 --causal both --dtypes f16
    PYTHONPATH=. python bench/fmha.py --smoke               # CPU: a tiny instance, interpreted
    PYTHONPATH=. python bench/fmha.py --old ../other        # also that checkout's kernels, same rounds
    PYTHONPATH=. python bench/fmha.py --arch sm_80          # the sm_80 schedule (mma.sync), run on this GPU
    PYTHONPATH=. python bench/fmha.py --shapes 1x32x4096x128 --kv-heads 8   # grouped-query heads

Shapes are batch x heads x seq x head_dim (seq_q = seq_kv).  For each: TFLOP/s of ours, cuDNN and
flash (4 * batch * heads * seq^2 * head_dim flops, half of that when causal), and the ratios.
Timing is ``firesched.timing.interleaved``: each callable's ``reps`` launches captured in a CUDA
graph, the graphs replayed in turn (ours, cuDNN, flash, ours, ...), median of rounds; inputs
random and rotated between copies that together exceed L2.  Before timing, ours is checked
against the float32 math backend.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import attrs  # noqa: E402
import numpy as np  # noqa: E402

import firesched as fs  # noqa: E402
from bench.gemm import L2_BYTES, write_results  # noqa: E402
from bench.membound import driver_version  # noqa: E402
from firesched import timing  # noqa: E402

SHAPES = [(4, 16, 4096, 128), (16, 16, 1024, 128), (32, 16, 384, 64), (8, 16, 2048, 64)]


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    return [tuple(int(x) for x in s.split("x")) for s in text.split(",") if s]


def flops(b, h, s, d, causal) -> float:
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


def gpu_row(torch, b, h, s, d, dt_name, causal, rounds, params=None, other=None, arch="sm_90a", kv=None) -> dict:
    """One shape timed: ours (the schedule ``recipes.fmha`` gives for ``arch``, compiled for this
    GPU, an sm_90a one), cuDNN, flash and, with ``other``, that checkout's kernel; ``kv``: key /
    value heads (grouped-query attention; None: ``h``), given to SDPA as ``enable_gqa``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt_name]
    kv = kv or h
    gqa = {"enable_gqa": True} if kv != h else {}
    sched = fs.recipes.fmha(b, h, s, s, d, dtype=dt_name, arch=arch, causal=causal, kv_heads=kv, params=params)
    k = fs.compile(sched, arch="sm_90a")
    per_set = 2 * (b * h + b * kv) * s * d * 2
    nsets = max(1, min(8, math.ceil(2 * L2_BYTES / per_set)))
    sets = [tuple(torch.randn(b, n, s, d, device="cuda", dtype=tdt) for n in (h, kv, kv)) for _ in range(nsets)]
    outs = [torch.empty(b, h, s, d, device="cuda", dtype=tdt) for _ in range(nsets)]

    def view(x):
        return x.view(b, kv, h // kv, s, d)

    q, kk, v = sets[0]
    k(view(q), kk, v, view(outs[0]))
    with sdpa_kernel(SDPBackend.MATH):
        ref = sdpa(q.float(), kk.float(), v.float(), is_causal=causal, **gqa)
    err = (outs[0].float() - ref).abs().max().item()
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        err_cudnn = (sdpa(q, kk, v, is_causal=causal, **gqa).float() - ref).abs().max().item()

    def ours(i):
        q, kk, v = sets[i % nsets]
        k(view(q), kk, v, view(outs[i % nsets]))

    def peer(backend):
        def fn(i):
            q, kk, v = sets[i % nsets]
            with sdpa_kernel(backend):
                sdpa(q, kk, v, is_causal=causal, **gqa)
        return fn

    fns = {"ours": ours, "cudnn": peer(SDPBackend.CUDNN_ATTENTION), "flash": peer(SDPBackend.FLASH_ATTENTION)}
    if other is not None:
        # the other checkout's kernel for the same call (its own plan when params is None)
        # the fields that checkout's FmhaParams knows (an older one lacks the newer fields)
        known = {f.name for f in attrs.fields(other.recipes.FmhaParams)}
        ko = other.compile(other.recipes.fmha(b, h, s, s, d, dtype=dt_name, arch=arch, causal=causal, kv_heads=kv,
                                              params=None if params is None else other.recipes.FmhaParams(
                                                  **{k: v for k, v in attrs.asdict(params).items() if k in known})),
                           arch="sm_90a")
        ko(view(sets[0][0]), sets[0][1], sets[0][2], view(outs[0]))
        err_old = (outs[0].float() - ref).abs().max().item()
        if not err_old <= max(2 * err, 2e-2):
            raise SystemExit(f"fmha {b}x{h}x{s}x{d} {dt_name}: --old's kernel differs from the reference by {err_old:.3e}")

        def old(i):
            q, kk, v = sets[i % nsets]
            ko(view(q), kk, v, view(outs[i % nsets]))
        fns["old"] = old
    f = flops(b, h, s, d, causal)
    reps = max(3, min(200, int(2e12 / f)))
    us = timing.interleaved(fns, reps=reps, rounds=rounds)
    t = {n: v / 1e3 for n, v in us.items()}                 # milliseconds
    res = k.resources
    row = dict(batch=b, heads=h, seq=s, head_dim=d, dtype=dt_name, causal=causal, kv_heads=kv,
               arch=arch,
               params=str(fs.recipes.fmha_plan(b, h, s, s, d, arch=arch, causal=causal) if params is None else params),
               max_abs_err=err, cudnn_max_abs_err=err_cudnn,
               registers=max(r.registers for r in res.values()), spills=k.spills)
    for n, ms in t.items():
        row[f"{n}_ms"] = ms
        row[f"{n}_tflops"] = f / ms / 1e9
    row["ratio_cudnn"] = t["cudnn"] / t["ours"]
    row["ratio_flash"] = t["flash"] / t["ours"]
    if "old" in t:
        row["new_vs_old"] = t["ours"] / t["old"]
    return row


def plot(rows: list, path: str) -> str | None:
    """TFLOP/s against sequence length, ours, cuDNN and flash, one panel per (head dim, causal);
    None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    groups = sorted({(r["head_dim"], r["causal"], r["dtype"]) for r in rows})
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, (d, c, dt) in zip(axes[0], groups):
        sel = sorted((r for r in rows if (r["head_dim"], r["causal"], r["dtype"]) == (d, c, dt)),
                     key=lambda r: r["seq"])
        for name in ("ours", "cudnn", "flash"):
            ax.plot([r["seq"] for r in sel], [r[f"{name}_tflops"] for r in sel], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"head dim {d}, {dt}{', causal' if c else ''}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def variants(b, h, s, d, causal, vary: dict, arch: str = "sm_90a", kv=None) -> list:
    """The plan's parameters (None) and each combination of ``vary`` (``FmhaParams`` field ->
    values) over them that builds a schedule (with ``kv`` key / value heads); with wgmma,
    ``warps`` follows ``block_q``."""
    import itertools

    base = fs.recipes.fmha_plan(b, h, s, s, d, arch=arch, causal=causal)
    out = [None]
    for combo in itertools.product(*vary.values()):
        over = dict(zip(vary, combo))
        if base.mma == "wgmma" and "block_q" in over and "warps" not in over:
            over["warps"] = 4 * over["block_q"] // 64
        try:
            p = attrs.evolve(base, **over)
            if p == base:
                continue
            fs.recipes.fmha(b, h, s, s, d, arch=arch, causal=causal, kv_heads=kv, params=p).check(arch)
        except (ValueError, fs.ScheduleError) as e:
            print(f"{b}x{h}x{s}x{d} {over}: refused ({str(e).splitlines()[0][:90]})")
            continue
        out.append(p)
    return out


def parse_vary(items) -> dict:
    """``["block_q=64,128", "warp_specialized=True,False"]`` -> field -> values, over
    ``FmhaParams``'s fields."""
    from bench.gemm_variants import parse_vary as parse

    return parse(items, fields=tuple(f.name for f in attrs.fields(fs.recipes.FmhaParams)))


def smoke() -> dict:
    """A tiny causal, grouped-query instance through the interpreter against numpy."""
    b, h, kvh, s, d = 1, 2, 1, 37, 64
    sched = fs.recipes.fmha(b, h, s, s, d, kv_heads=kvh, causal=True)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, kvh, h // kvh, s, d))
    k = rng.standard_normal((b, kvh, s, d))
    v = rng.standard_normal((b, kvh, s, d))
    o = fs.interpret(sched, q, k, v)
    r = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    sc = np.einsum("bhgqd,bhkd->bhgqk", r(q), r(k)) / math.sqrt(d)
    sc = np.where(np.arange(s)[None, :] > np.arange(s)[:, None], -np.inf, sc)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    ref = np.einsum("bhgqk,bhkd->bhgqd", p / p.sum(-1, keepdims=True), r(v))
    err = float(np.abs(o - ref).max())
    if not err < 2e-2:
        raise SystemExit(f"smoke: interpreter result differs from numpy by {err}")
    return dict(shape=(b, h, kvh, s, d), max_abs_err=err)


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    ap.add_argument("--dtypes", default="f16,bf16")
    ap.add_argument("--causal", default="both", choices=("no", "yes", "both"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="CPU only: one tiny instance through the interpreter")
    ap.add_argument("--sweep", action="store_true",
                    help="sequence lengths 512..16384 at 16k tokens a batch (the plot), instead of --shapes")
    ap.add_argument("--vary", action="append", default=[],
                    help="FIELD=V1,V2: also time the plan with these FmhaParams values (repeatable)")
    ap.add_argument("--old", default="", help="another checkout whose kernels are timed in the same rounds")
    ap.add_argument("--arch", default="sm_90a", choices=("sm_90a", "sm_80"),
                    help="whose schedule to time: sm_90a's (wgmma) or sm_80's (mma.sync), either run on this GPU")
    ap.add_argument("--kv-heads", type=int, default=0,
                    help="key / value heads of every shape (grouped-query attention; SDPA with enable_gqa); 0: the heads")
    ap.add_argument("--out", default=os.path.join(HERE, "results", f"fmha-{datetime.date.today()}.json"))
    args = ap.parse_args(argv)
    if args.smoke:
        row = smoke()
        print(row)
        return [row]
    import torch

    causal = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    rows = []
    print(f"{'shape':>18} {'dt':>4} {'causal':>6} {'ours':>7} {'cudnn':>7} {'flash':>7} {'/cudnn':>7} {'/flash':>7}  regs  err")
    shapes = parse_shapes(args.shapes)
    if args.sweep:
        d = shapes[0][3] if shapes else 128
        shapes = [(max(1, 16384 // s), 16, s, d) for s in (512, 1024, 2048, 4096, 8192, 16384)]
    vary = parse_vary(args.vary)
    other = None
    if args.old:
        from bench.ab_versions import load_other

        other = load_other(args.old)
    for shp in shapes:
        for dt in args.dtypes.split(","):
            for c in causal:
                for params in (variants(*shp, c, vary, args.arch, args.kv_heads or None) if vary else [None]):
                    row = gpu_row(torch, *shp, dt, c, args.rounds, params, other, args.arch, kv=args.kv_heads or None)
                    rows.append(row)
                    print(f"{'x'.join(map(str, shp)):>18} {dt:>4} {str(c):>6} {row['ours_tflops']:7.1f} "
                          f"{row['cudnn_tflops']:7.1f} {row['flash_tflops']:7.1f} {row['ratio_cudnn']:7.2f} "
                          f"{row['ratio_flash']:7.2f}  {row['registers']:4d}  {row['max_abs_err']:.1e}"
                          + (f"  SPILLS {row['spills']} bytes" if row["spills"] else "")
                          + (f"  {params}" if params is not None else "  plan")
                          + (f"  new / old time {row['new_vs_old']:.3f}" if "new_vs_old" in row else ""), flush=True)
    meta = dict(date=str(datetime.date.today()), device=torch.cuda.get_device_name(), driver=driver_version(),
                torch=torch.__version__, python=platform.python_version(), command=" ".join(sys.argv))
    write_results(args.out, meta, rows)
    png = plot(rows, args.out.replace(".json", ".png"))
    if png:
        print(f"wrote {png}")
    return rows


if __name__ == "__main__":
    main()
