"""Row kernels (RMSNorm, LayerNorm, residual-add + RMSNorm, softmax) next to torch, in one process.

    PYTHONPATH=. python bench/rows.py                                   # every op, fp16 and bf16
    PYTHONPATH=. python bench/rows.py --ops rmsnorm --dtypes bf16 --shapes 16384x4096 --rounds 9
    PYTHONPATH=. python bench/rows.py --shapes 4096x65536 --exchange barrier,push   # both, one run
    PYTHONPATH=. python bench/rows.py --shapes 4096x65536 --old ../other    # also that checkout's kernels
    PYTHONPATH=. python bench/rows.py --launches plain --old .   # ours launched plainly, against ours (chained)
    PYTHONPATH=. python bench/rows.py --arch sm_80 --old ../other   # the sm_80 plans and kernels, on this GPU
    PYTHONPATH=. python bench/rows.py --shapes odd --old ../other   # rows of odd lengths (ODD_SHAPES)

For each op, dtype and shape (rows x cols): the effective bandwidth of ours and of torch's peer
(``rms_norm``, ``layer_norm``, ``x + r`` then ``rms_norm``, ``softmax``) in TB/s — the bytes the op
must read and write once (input, weights, outputs) divided by the time — and the ratio (ours /
torch's time, > 1 is faster).  Both sides are checked against a float32 torch reference first.
``--exchange barrier,push`` times each row split over a cluster with each way its blocks combine
their statistics (``to_blocks(exchange=...)``: ``barrier.cluster``, or ``st.async`` pushes and an
mbarrier), one row per exchange, in the same run.
Timing (``--timing graphs``, the default): ``firesched.timing.interleaved``, each side's ``reps``
launches captured in a CUDA graph and the graphs replayed in turn (ours, peer, ours, peer ...),
each replay between two CUDA events, the median of the rounds, as the GEMM and attention benches
time; ``--timing events`` launches them back to back instead (``bench.gemm.time_ms``, the
method of the results before 2026-11-26), where each launch's CPU overhead can show on a short
kernel.  The inputs rotate through enough copies to exceed twice the 50 MB L2.  Results go to JSON (device, driver,
torch and NVRTC versions, command) and, with matplotlib, a PNG of bandwidth against cols.

Without a GPU the script compiles every kernel and interprets the smallest shape (a smoke run).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import firesched as fs  # noqa: E402
from bench.gemm import L2_BYTES, time_ms, write_results  # noqa: E402
from bench.membound import plot  # noqa: E402  (bandwidth against cols, a panel per op and dtype)
from firesched import timing  # noqa: E402

SHAPES = [(4096, 256), (4096, 1024), (4096, 4096), (4096, 16384), (8192, 8192), (16384, 1024), (16384, 4096),
          (16384, 16384), (32768, 1024), (32768, 4096), (32768, 8192), (32768, 16384), (32768, 32768),
          (65536, 1024), (8192, 32768),
          # rows of 512 columns (blocks of one such row read 1.66 TB/s on an H200: rows.MIN_BLOCK_THREADS)
          # and of 20,000 (three passes of 1,024 threads, the last partial: rows.HALF_BLOCK_VALUES)
          (65536, 512), (8192, 20000),
          # models' hidden sizes whose vectors are not a power of two (rows.FILL_THREADS: on
          # power-of-two passes 2,560 columns left 3/8 of the slots idle; LayerNorm 3.28 TB/s)
          (32768, 1536), (16384, 2560), (8192, 5120), (4096, 10240), (4096, 14336)]
#: Rows longer than one block holds: thread-block clusters of 2, 4 and 8 blocks.  The 16 GiB
#: case last: shapes timed right after it read about 12 % slower, ours and torch's alike
#: (add + RMSNorm 2048 x 131072 bf16 on an H100: 2.86 -> 2.53 TB/s, torch 1.95 -> 1.72; not
#: explained: the next case's tensors presumably land in the memory the large one freed)
LONG_SHAPES = [(4096, 65536), (2048, 131072), (1024, 262144), (32768, 65536)]
#: ``--shapes odd``: rows whose lengths are not multiples of 8 (accesses narrower than 16 bytes),
#: one or two of each plan family the tile model has for them (rows.row_plan): short rows on a
#: warp or less (SHORT_NARROW_COLS), a warp or two a row (PERSISTENT_WARP_WINDOWS), element plans,
#: prefetching and persistent windows, staged windows on whole warps, a window alone on its SM,
#: element copies on clusters
ODD_SHAPES = [(262144, 101), (131072, 255), (131072, 254), (65536, 767), (65536, 999), (32768, 1023),
              (16384, 1151), (16384, 1535), (16384, 1699), (8192, 2047), (16384, 2559), (4096, 4095),
              (16384, 4097), (8192, 8191), (4096, 16383), (2048, 20479), (1024, 65537), (512, 116009)]
#: Rows the correctness check compares (rows are independent; the f32 reference of a 4 GiB
#: tensor would not fit beside it).
CHECK_ROWS = 2048
OPS = ("rmsnorm", "layernorm", "add_rmsnorm", "softmax", "softmax_causal")
#: ops ``--ops`` also takes, not timed by default: LayerNorm without weight and bias (what the
#: output's two extra loads cost, against ``layernorm``)
EXTRA_OPS = ("layernorm_plain",)


# --launches: what compile(..., programmatic=) is asked
LAUNCHES = {"default": None, "chained": True, "plain": False}


def _recipe(op: str, exchange: str = "default", lib=fs):
    """The recipe of ``op``: ``softmax_causal`` is ``recipes.softmax(..., causal=True)``;
    ``exchange`` as ``to_blocks(exchange=...)`` for rows split over a cluster (``"default"``: the
    recipe's own); ``lib`` the firesched package to take it from (``--old``: another checkout's)."""
    exchange = None if exchange == "default" else exchange
    if op == "softmax_causal":
        return lambda rows, cols, dtype, arch=None: lib.recipes.softmax(rows, cols, dtype=dtype, arch=arch, causal=True,
                                                                       exchange=exchange)
    if op == "layernorm_plain":
        return lambda rows, cols, dtype, arch=None: lib.recipes.layernorm(rows, cols, dtype=dtype, arch=arch,
                                                                         weight=False, bias=False, exchange=exchange)
    return lambda rows, cols, dtype, arch=None: getattr(lib.recipes, op)(rows, cols, dtype=dtype, arch=arch,
                                                                        exchange=exchange)


def _causal(torch, x):
    """torch's causal softmax input: ``x`` with the elements past the diagonal set to -inf (the mask
    is built once per shape, outside the timed region)."""
    key = (tuple(x.shape), x.device)
    m = _MASKS.get(key)
    if m is None:
        m = _MASKS[key] = torch.ones(x.shape, dtype=torch.bool, device=x.device).triu(1)
    return x.masked_fill(m, float("-inf"))


_MASKS: dict = {}


def _peer(torch, op: str, cols: int):
    F = torch.nn.functional
    if op == "rmsnorm":
        return lambda x, w: F.rms_norm(x, (cols,), w, 1e-6)
    if op == "layernorm":
        return lambda x, w, b: F.layer_norm(x, (cols,), w, b, 1e-5)
    if op == "layernorm_plain":
        return lambda x: F.layer_norm(x, (cols,), None, None, 1e-5)
    if op == "add_rmsnorm":
        def f(x, r, w):
            h = x + r
            return F.rms_norm(h, (cols,), w, 1e-6), h
        return f
    if op == "softmax_causal":
        return lambda x: torch.softmax(_causal(torch, x), dim=-1)
    return lambda x: torch.softmax(x, dim=-1)


def _reference(torch, op: str, cols: int, ins):
    """The float32 result (as torch computes it on the rounded inputs)."""
    f = [t.float() for t in ins]
    F = torch.nn.functional
    if op == "rmsnorm":
        return (F.rms_norm(f[0], (cols,), f[1], 1e-6),)
    if op == "layernorm":
        return (F.layer_norm(f[0], (cols,), f[1], f[2], 1e-5),)
    if op == "layernorm_plain":
        return (F.layer_norm(f[0], (cols,), None, None, 1e-5),)
    if op == "add_rmsnorm":
        h = (ins[0] + ins[1]).float()
        return F.rms_norm(h, (cols,), f[2], 1e-6), h
    if op == "softmax_causal":
        return (torch.softmax(_causal(torch, f[0]), dim=-1),)
    return (torch.softmax(f[0], dim=-1),)


def _inputs(torch, op: str, rows: int, cols: int, dt):
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    w = torch.randn(cols, device="cuda", dtype=dt)
    if op == "rmsnorm":
        return [x, w]
    if op == "layernorm":
        return [x, w, torch.randn(cols, device="cuda", dtype=dt)]
    if op == "add_rmsnorm":
        return [x, torch.randn(rows, cols, device="cuda", dtype=dt), w]
    return [x]


def _outputs(torch, op, rows, cols, dt):
    n = 2 if op == "add_rmsnorm" else 1
    return [torch.empty(rows, cols, device="cuda", dtype=dt) for _ in range(n)]


def bytes_moved(op: str, rows: int, cols: int, eb: int) -> int:
    """What the op must read and write, once: row inputs, per-column weights, row outputs."""
    row = rows * cols * eb
    return {"rmsnorm": 2 * row + cols * eb, "layernorm": 2 * row + 2 * cols * eb,
            "add_rmsnorm": 4 * row + cols * eb, "softmax": 2 * row, "softmax_causal": 2 * row,
            "layernorm_plain": 2 * row}[op]


def gpu_row(torch, op, rows, cols, dtype, rounds, timing_mode: str = "graphs", exchange: str = "default",
            other=None, programmatic: bool | None = None, arch: str = "sm_90a") -> dict:
    dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    sched = _recipe(op, exchange)(rows, cols, dtype=dtype, arch=arch)
    k = fs.compile(sched, arch=arch, programmatic=programmatic)
    ko = other.compile(_recipe(op, exchange, other)(rows, cols, dtype=dtype, arch=arch), arch=arch) \
        if other is not None else None
    peer = _peer(torch, op, cols)
    nbytes = bytes_moved(op, rows, cols, dt.itemsize)
    nsets = max(1, math.ceil(2 * L2_BYTES / nbytes))
    sets = [(_inputs(torch, op, rows, cols, dt), _outputs(torch, op, rows, cols, dt)) for _ in range(nsets)]
    ins, outs = sets[0]
    k(*ins, *outs)
    few = [t[:CHECK_ROWS] if t.dim() == 2 else t for t in ins]
    ref = _reference(torch, op, cols, few)
    got_peer = peer(*few)
    got_peer = got_peer if isinstance(got_peer, tuple) else (got_peer,)
    err = max(float((o[:CHECK_ROWS].float() - r).abs().max()) for o, r in zip(outs, ref))
    err_peer = max(float((o.float() - r).abs().max()) for o, r in zip(got_peer, ref))
    scale = max(float(r.abs().max()) for r in ref)
    tol = (1e-2 if dtype == "f16" else 4e-2) * max(1.0, scale)
    if not err <= max(tol, 2 * err_peer):
        raise SystemExit(f"{op} {dtype} {rows}x{cols}: ours differs from the f32 reference by {err:.3e} "
                         f"(torch by {err_peer:.3e})")
    if ko is not None:
        ko(*ins, *outs)
        err_old = max(float((o[:CHECK_ROWS].float() - r).abs().max()) for o, r in zip(outs, ref))
        if not err_old <= max(tol, 2 * err_peer):
            raise SystemExit(f"{op} {dtype} {rows}x{cols}: --old's kernel differs from the f32 reference by {err_old:.3e}")
    del ref, got_peer
    reps = max(3, min(200, math.ceil(2e-3 / (nbytes / 2.5e12))))
    def ours(i):
        xs, ys = sets[i % nsets]
        return k(*xs, *ys)

    def theirs(i):
        return peer(*sets[i % nsets][0])

    if timing_mode == "graphs":
        k.prepare(torch.cuda.current_device())
        fns = {"ours": ours, "peer": theirs}
        if ko is not None:
            ko.prepare(torch.cuda.current_device())
            fns["old"] = lambda i: ko(*sets[i % nsets][0], *sets[i % nsets][1])
        us = timing.interleaved(fns, reps=reps, rounds=rounds)
        t_o, t_p = us["ours"] / 1e3, us["peer"] / 1e3
    else:
        if ko is not None:
            raise SystemExit("--old times through graphs only (--timing graphs)")
        ours_t, peer_t = [], []
        for _ in range(rounds):                       # interleaved: ours, peer, ours, peer ...
            ours_t.append(time_ms(torch, ours, reps, 1))
            peer_t.append(time_ms(torch, theirs, reps, 1))
        t_o, t_p = statistics.median(ours_t), statistics.median(peer_t)
    res = list(k.resources.values())[0]
    row = dict(op=op, dtype=dtype, rows=rows, cols=cols, bytes=nbytes, ours_ms=t_o, peer_ms=t_p,
               ours_tbs=nbytes / t_o / 1e9, peer_tbs=nbytes / t_p / 1e9, ratio=t_p / t_o, max_err=err,
               peer_err=err_peer, registers=res.registers, spills=k.spills, threads=k.program.kernels[0].threads,
               reps=reps, rounds=rounds, sets=nsets, timing=timing_mode, exchange=exchange)
    extra = ""
    if ko is not None:
        t_old = us["old"] / 1e3
        row.update(old_ms=t_old, old_tbs=nbytes / t_old / 1e9, new_vs_old=t_old / t_o)
        extra = f"  old {row['old_tbs']:5.2f} TB/s (new / old time {t_o / t_old:.3f})"
    print(f"{op:14s} {dtype:5s} {rows:6d}x{cols:<6d} {exchange:7s} ours {row['ours_tbs']:5.2f} TB/s  torch {row['peer_tbs']:5.2f} "
          f"TB/s  ratio {row['ratio']:.2f}  err {err:.1e} (torch {err_peer:.1e}){extra}", flush=True)
    sets.clear()
    torch.cuda.empty_cache()
    return row


def cpu_smoke(op: str, dtype: str) -> dict:
    """No GPU: compile at a large shape, interpret a small one against numpy."""
    k = fs.compile(_recipe(op)(4096, 4096, dtype=dtype), arch="sm_90a")
    rng = np.random.default_rng(0)
    sched = _recipe(op)(5, 100, dtype=dtype)
    n_in = len(sched.lower("sm_90a").inputs)
    arrays = [rng.standard_normal((5, 100)) if i == 0 or (op == "add_rmsnorm" and i == 1) else rng.standard_normal(100)
              for i in range(n_in)]
    out = fs.interpret(sched, *arrays)
    out = out if isinstance(out, tuple) else (out,)
    assert all(np.isfinite(o).all() for o in out)
    print(f"{op:14s} {dtype:5s} compiled (spills {k.spills}); interpreted 5x100")
    return dict(op=op, dtype=dtype, spills=k.spills, timing="skipped: no GPU")


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``--shapes``: ``ROWSxCOLS`` values separated by commas, or ``odd`` (``ODD_SHAPES``)."""
    if text == "odd":
        return list(ODD_SHAPES)
    shapes = []
    for s in filter(None, text.split(",")):
        rows, sep, cols = s.partition("x")
        if not (sep and rows.isdigit() and cols.isdigit() and int(rows) > 0 and int(cols) > 0):
            raise SystemExit(f"--shapes {s!r}: ROWSxCOLS of positive ints (e.g. 16384x1535), or 'odd'")
        shapes.append((int(rows), int(cols)))
    return shapes


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtypes", default="f16,bf16")
    p.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in SHAPES + LONG_SHAPES),
                   help="ROWSxCOLS,... or 'odd' (ODD_SHAPES); default: the standard set (SHAPES, LONG_SHAPES)")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--timing", choices=("graphs", "events"), default="graphs",
                   help="CUDA-graph replays (default) or back-to-back launches between events")
    p.add_argument("--exchange", default="default",
                   help="how a cluster's blocks combine a split row: default (the recipe's: push), barrier, push, "
                        "or a comma list (each timed)")
    p.add_argument("--out", default=None)
    p.add_argument("--old", default="", help="another checkout whose recipes are timed in the same rounds")
    p.add_argument("--launches", choices=("default", "chained", "plain"), default="default",
                    help="ours as compile(..., programmatic=None / True / False) launches it: the default "
                         "(chained on sm_90a unless the grid is sized to the SMs), chained, or plainly")
    p.add_argument("--arch", choices=("sm_90a", "sm_80"), default="sm_90a",
                   help="the target the recipes plan and compile for (sm_80: no clusters; run on this GPU)")
    args = p.parse_args(argv)
    exchanges = [e for e in args.exchange.split(",") if e]
    if not exchanges or any(e not in ("default", "barrier", "push") for e in exchanges):
        raise SystemExit(f"--exchange {args.exchange!r}: a comma list of default, barrier, push")
    ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS + EXTRA_OPS]
    if bad:
        raise SystemExit(f"unknown ops {bad}; known: {', '.join(OPS + EXTRA_OPS)}")
    shapes = parse_shapes(args.shapes)
    dtypes = [d for d in args.dtypes.split(",") if d]
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        torch, gpu = None, False
    if not gpu:
        return [cpu_smoke(op, dt) for op in ops for dt in dtypes]
    other = None
    if args.old:
        from bench.ab_versions import load_other

        other = load_other(args.old)
    rows = [gpu_row(torch, op, r, c, dt, args.rounds, args.timing, ex, other, LAUNCHES[args.launches], args.arch)
            for op in ops for dt in dtypes for r, c in shapes for ex in exchanges]
    date = datetime.date.today().isoformat()
    out = args.out or os.path.join(HERE, "results", f"rows-{date}.json")
    from cuda.bindings import nvrtc

    meta = dict(device=torch.cuda.get_device_name(), date=date, torch=torch.__version__,
                nvrtc=".".join(map(str, nvrtc.nvrtcVersion()[1:])), python=platform.python_version(),
                command="PYTHONPATH=. python bench/rows.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    big = [r for r in rows if r["bytes"] >= 64 * 2 ** 20]
    if big:
        meta["min_tbs_at_64MiB_plus"] = min(r["ours_tbs"] for r in big)
        meta["geomean_ratio"] = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
        print(f"ours >= 64 MiB: min {meta['min_tbs_at_64MiB_plus']:.2f} TB/s; geomean ratio over torch "
              f"{meta['geomean_ratio']:.2f}")
    write_results(out, meta, rows)
    png = plot(rows, out[:-5] + ".png")
    if png:
        print(f"wrote {png}")
    return rows


if __name__ == "__main__":
    main()
