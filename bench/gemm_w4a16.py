"""Weight-only int4 GEMM benchmark: ``recipes.gemm_w4a16`` next to cuBLAS on the unquantised fp16
weights and next to torch's unpack + scale + matmul, in one process, same inputs.

    PYTHONPATH=. python bench/gemm_w4a16.py                 # M = 1, 16, 64, 4096 at N = K = 4096, 8192
    PYTHONPATH=. python bench/gemm_w4a16.py --m 1,16 --nk 8192 --dtypes f16,bf16
    PYTHONPATH=. python bench/gemm_w4a16.py --m 1,16 --nk 11008x4096,4096x11008   # N x K
    PYTHONPATH=. python bench/gemm_w4a16.py --smoke         # CPU: a small instance, interpreted
    PYTHONPATH=. python bench/gemm_w4a16.py --old ../other  # also that checkout's kernel, same rounds
    PYTHONPATH=. python bench/gemm_w4a16.py --launches plain --old .   # ours launched plainly, against ours (chained)

For each shape: microseconds of ours (the recipe's default schedule, group size 128, unsigned codes
with zero point 8), of ``torch.nn.functional.linear`` on the fp16/bf16 weights (cuBLAS), and of the
eager torch path (unpack the nibbles of the plain two-per-byte weights, subtract 8, scale per group,
matmul); the speedups over both; and the weight bandwidth (packed weights and scales read, divided
by our time).  Timing: each candidate's ``reps`` launches are captured in a CUDA graph (so that
host launch overhead, which exceeds these kernels' run time at small M, is not what is timed);
the graphs replay interleaved (ours, cuBLAS, ours, cuBLAS, ...; then ours and the torch path the
same way, apart: the torch path leaves L2 full of dirty lines that cost whatever follows it),
median of ``rounds``; the
weights rotate between copies that together exceed L2, so every launch reads them from DRAM.
Before timing, ours is checked against float32 math on the dequantised weights.
"""

from __future__ import annotations

import argparse
import datetime
import functools
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
from firesched.quant import dequantize_int4, quantize_int4  # noqa: E402
from firesched.testing.reference import w4a16_reference  # noqa: E402

MS = (1, 16, 64, 4096)
NKS = (4096, 8192)
GROUP = 128


# --launches: what compile(..., programmatic=) is asked
LAUNCHES = {"default": None, "chained": True, "plain": False}


def torch_dequant_matmul(torch, a, plain, scales, group: int):
    """The eager torch path: ``plain`` is ``(N, K / 2)`` bytes, code ``k`` of row ``n`` in the low
    (even ``k``) or high (odd ``k``) nibble of byte ``k / 2``; weights ``(code - 8) * scale``."""
    lo = (plain & 0xF).to(a.dtype)
    hi = (plain >> 4).to(a.dtype)
    codes = torch.stack((lo, hi), dim=-1).reshape(plain.shape[0], -1)          # (N, K)
    w = (codes - 8) * scales.t().repeat_interleave(group, dim=1)[:, :codes.shape[1]]
    return torch.nn.functional.linear(a, w)


def plain_bytes(q) -> np.ndarray:
    """``(N, K / 2)`` bytes of the ``(K, N)`` uint4 codes in logical order, two a byte."""
    return fs.dtypes.pack(fs.dtypes.u4, np.ascontiguousarray(np.asarray(q).T))


@functools.lru_cache(maxsize=2)
def _weights(N: int, K: int, dt_name: str):
    """Random weights of one shape, quantised and dequantised once for every row that times it."""
    w = np.random.default_rng(N + K).standard_normal((K, N)).astype(np.float32) * 0.05
    q, s, _ = quantize_int4(w, GROUP, signed=False, scale_dtype=dt_name)
    return q, s, dequantize_int4(q, s.astype(np.float32), None, GROUP)


def gpu_row(torch, M, N, K, dt_name, rounds, params=None, other=None, programmatic: bool | None = None) -> dict:
    """One shape timed: ours, cuBLAS, the torch path and, with ``other`` (another version's
    ``firesched`` package, ``ab_versions.load_other``), that version's kernel for the same shape."""
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt_name]
    q, s, deq = _weights(N, K, dt_name)
    sched = fs.recipes.gemm_w4a16(M, N, K, group_size=GROUP, dtype=dt_name, arch="sm_90a", params=params)
    k = fs.compile(sched, arch="sm_90a", programmatic=programmatic)
    k.prepare(torch.cuda.current_device())
    wdq = torch.from_numpy(deq).cuda()                                                    # (K, N) f32
    packed = torch.from_numpy(fs.recipes.pack_weights(q, sched)).cuda()
    plain = torch.from_numpy(plain_bytes(q)).cuda()
    S = torch.from_numpy(np.asarray(s).astype(np.float32)).to(tdt).cuda()
    w16 = wdq.t().contiguous().to(tdt)                                                      # (N, K): nn.Linear
    copies = max(2, math.ceil(2 * L2_BYTES / (N * K * 2)))          # the fp16 weights: the largest
    packs = [packed] + [packed.clone() for _ in range(max(2, math.ceil(2 * L2_BYTES / (N * K // 2))) - 1)]
    plains = [plain] + [plain.clone() for _ in range(len(packs) - 1)]
    w16s = [w16] + [w16.clone() for _ in range(copies - 1)]
    a = torch.randn(M, K, device="cuda", dtype=tdt)
    c = torch.empty(M, N, device="cuda", dtype=tdt)

    k(a, packed, S, C=c)
    ref = a.float() @ wdq
    err = (c.float() - ref).abs().max().item()
    scale = ref.abs().max().item()
    if not err <= 2e-2 * (1 + scale):
        raise SystemExit(f"gemm_w4a16 {M}x{N}x{K} {dt_name}: max error {err:.3g} against |ref| {scale:.3g}")
    err_torch = (torch_dequant_matmul(torch, a, plain, S, GROUP).float() - ref).abs().max().item()

    def ours(i):
        k(a, packs[i % len(packs)], S, C=c)

    fns = {"ours": ours}
    if other is not None:
        so = other.recipes.gemm_w4a16(M, N, K, group_size=GROUP, dtype=dt_name, arch="sm_90a",
                                      params=_other_params(other, params))
        ko = other.compile(so, arch="sm_90a")
        ko.prepare(torch.cuda.current_device())
        opacks = [torch.from_numpy(other.recipes.pack_weights(q, so)).cuda() for _ in packs]
        ko(a, opacks[0], S, C=c)
        err_o = (c.float() - ref).abs().max().item()
        if not err_o <= 2e-2 * (1 + scale):
            raise SystemExit(f"--old gemm_w4a16 {M}x{N}x{K} {dt_name}: max error {err_o:.3g} against |ref| {scale:.3g}")

        def old(i):
            ko(a, opacks[i % len(opacks)], S, C=c)

        fns["old"] = old

    def cublas(i):
        torch.nn.functional.linear(a, w16s[i % len(w16s)])

    def torch_path(i):
        torch_dequant_matmul(torch, a, plains[i % len(plains)], S, GROUP)

    reps = 20 if M <= 64 else 5
    # ours against cuBLAS in one interleaved set, against the torch path in another: the torch
    # path writes its dequantised weights (more than L2 holds), and whichever graph replays after
    # it starts by writing those dirty lines back (measured on an H100: M = 1, N = K = 4096, ours
    # 7.8 us right after the torch path against 6.1-6.2 us in pairs with cuBLAS)
    t = timing.interleaved({**fns, "cublas": cublas}, reps=reps, rounds=rounds)
    t["torch"] = timing.interleaved({"ours": ours, "torch": torch_path}, reps=reps, rounds=rounds)["torch"]
    weight_bytes = N * K // 2 + S.numel() * S.element_size()
    res = k.resources
    p = fs.recipes.w4a16.plan(M, N, K, wgmma=True, dtype=dt_name) if params is None else params
    return dict(M=M, N=N, K=K, dtype=dt_name, group_size=GROUP, params=str(p),
                ours_us=t["ours"], cublas_us=t["cublas"], torch_us=t["torch"],
                speedup_cublas=t["cublas"] / t["ours"], speedup_torch=t["torch"] / t["ours"],
                weight_tbps=weight_bytes / t["ours"] / 1e6, tflops=2 * M * N * K / t["ours"] / 1e6,
                max_abs_err=err, ref_max=scale, torch_path_max_abs_err=err_torch,
                registers=max(r.registers for r in res.values()), spills=k.spills,
                **({"old_us": t["old"], "speedup_old": t["old"] / t["ours"]} if other is not None else {}))


def sweep_candidates(M: int, N: int, K: int, deep: bool = False, family: str = "mma") -> list:
    """Tile variants around the plan for ``--sweep``: block shapes, warp splits, K steps, stages
    and K splits; invalid ones are dropped when the recipe refuses them.  ``deep``: only the plan's
    tiles with deeper rings (4 to 16 stages) and each K split, to see whether more weights in
    flight per block beat more blocks.  ``family="wgmma"``: the sm_90a family's producer-fed tiles
    instead (``wgmma_candidates``)."""
    from firesched.recipes.w4a16 import W4A16Params, plan

    if family == "wgmma":
        return wgmma_candidates(M, N, K)
    out = [plan(M, N, K)]
    if deep:
        for st in (4, 6, 8, 12, 16):
            for sp in (1, 2, 4, 8):
                p = attrs.evolve(out[0], stages=st, split_k=sp)
                if p != out[0]:
                    out.append(p)
        return out
    for bm, wm in ((16, 1), (32, 1), (32, 2), (64, 1), (64, 2), (64, 4), (128, 2), (128, 4)):
        if bm > max(16, 2 * M):
            continue
        for bn, wn in ((64, 4), (128, 4), (128, 8), (256, 4), (256, 8)):
            for bk, wk in ((64, 32), (64, 64), (128, 32), (128, 64), (128, 128)):
                for st in (3, 4):
                    for sp in (1, 2, 4, 8):
                        try:
                            p = W4A16Params(block_m=bm, block_n=bn, block_k=bk, warps_m=wm, warps_n=wn, warp_k=wk,
                                            stages=st, split_k=sp)
                        except ValueError:
                            continue
                        tiles = -(-M // bm) * -(-N // bn) * sp
                        if tiles < 100 or tiles > 2000 or (wm > 1 and wk == 128) or (bm // wm) * wk > 64 * 64:
                            continue
                        out.append(p)
    # at most 120, drawn reproducibly: each compiles and runs in about a second
    import random

    return out[:1] + (random.Random(0).sample(out[1:], 120) if len(out) > 121 else out[1:])


def wgmma_candidates(M: int, N: int, K: int, sms: int = 132) -> list:
    """The sm_90a family's producer-fed tiles for ``--sweep --family wgmma``, the default plan
    first: 64 or 128 weight columns a block, activation rows M rounded to 8 (at most 64, and 128
    above M = 64), 128, 256 or 512 k a stage, 4 stages (fewer where shared memory runs out), and
    each K split whose grid is between half a wave and one wave."""
    from firesched.recipes.w4a16 import RING_BYTES, SPLIT_UNIT, W4A16WgmmaParams, plan

    out = [plan(M, N, K, wgmma=True)]
    r8 = -(-M // 8) * 8
    for bm in sorted({min(64, r8)} | ({min(128, r8)} if M > 64 else set())):
        for bn in (64, 128):
            for bk in (128, 256, 512):
                stage = bm * bk * 2 + bn * bk // 2
                st = min(4, RING_BYTES // stage)
                for sp in (1, 2, 4, 8):
                    blocks = -(-M // bm) * -(-N // bn) * sp
                    if st < 2 or K % (sp * bk) or (K // sp) % SPLIT_UNIT or not sms // 2 <= blocks <= sms:
                        continue
                    p = W4A16WgmmaParams(block_m=bm, block_n=bn, block_k=bk, stages=st, split_k=sp, producer=True)
                    if p not in out:
                        out.append(p)
    return out


def _compile_one(args):
    M, N, K, dt, p = args
    try:
        sched = fs.recipes.gemm_w4a16(M, N, K, group_size=GROUP, dtype=dt, arch="sm_90a", params=p)
        return fs.compile(sched, arch="sm_90a").spills
    except fs.ScheduleError:
        return -1


def sweep(torch, M, N, K, dt_name, rounds, deep: bool = False, family: str = "mma") -> list:
    """Every ``sweep_candidates`` variant that compiles without spills, timed against cuBLAS
    (compiled in parallel processes first; NVRTC's cache then serves the timing loop)."""
    from concurrent.futures import ProcessPoolExecutor

    cands = sweep_candidates(M, N, K, deep, family)
    with ProcessPoolExecutor(max(1, (os.cpu_count() or 2) - 2)) as ex:
        spills = list(ex.map(_compile_one, [(M, N, K, dt_name, p) for p in cands]))
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt_name]
    rng = np.random.default_rng(0)
    q, s, _ = quantize_int4(rng.standard_normal((K, N)).astype(np.float32) * 0.05, GROUP, signed=False,
                            scale_dtype=dt_name)
    wdq = torch.from_numpy(dequantize_int4(q, s.astype(np.float32), None, GROUP)).cuda()
    w16 = wdq.t().contiguous().to(tdt)
    w16s = [w16] + [w16.clone() for _ in range(max(2, math.ceil(2 * L2_BYTES / (N * K * 2))) - 1)]
    S = torch.from_numpy(np.asarray(s).astype(np.float32)).to(tdt).cuda()
    a = torch.randn(M, K, device="cuda", dtype=tdt)
    ref = a.float() @ wdq
    packed: dict = {}
    rows = []
    for p, sp in zip(cands, spills):
        if sp != 0:
            continue
        sched = fs.recipes.gemm_w4a16(M, N, K, group_size=GROUP, dtype=dt_name, arch="sm_90a", params=p)
        pk = sched.spec.operand("B").tensor.packing
        if pk not in packed:
            b = torch.from_numpy(fs.recipes.pack_weights(q, sched)).cuda()
            packed[pk] = [b] + [b.clone() for _ in range(max(2, math.ceil(2 * L2_BYTES / (N * K // 2))) - 1)]
        bs = packed[pk]
        k = fs.compile(sched, arch="sm_90a")
        k.prepare(torch.cuda.current_device())
        c = torch.empty(M, N, device="cuda", dtype=tdt)
        k(a, bs[0], S, C=c)
        if not (c.float() - ref).abs().max().item() <= 2e-2 * (1 + ref.abs().max().item()):
            raise SystemExit(f"sweep: {p} is wrong at {M}x{N}x{K}")
        t = timing.interleaved({"ours": lambda i, k=k, bs=bs, c=c: k(a, bs[i % len(bs)], S, C=c),
                                "cublas": lambda i: torch.nn.functional.linear(a, w16s[i % len(w16s)])},
                               reps=20 if M <= 64 else 3, rounds=rounds)
        rows.append(dict(M=M, N=N, K=K, dtype=dt_name, params=str(p), ours_us=t["ours"], cublas_us=t["cublas"],
                         speedup_cublas=t["cublas"] / t["ours"]))
    rows.sort(key=lambda r: r["ours_us"])
    return rows


def shapes_nk(text: str) -> list[tuple[int, int]]:
    """``--nk``: comma-separated ``N`` (N = K) or ``NxK`` entries -> ``[(N, K), ...]``."""
    out = []
    for entry in text.split(","):
        n, _, k = entry.partition("x")
        if not n.isdigit() or not (k or n).isdigit():
            raise SystemExit(f"--nk: {entry!r} is neither N (N = K) nor NxK, e.g. 4096 or 11008x4096")
        out.append((int(n), int(k or n)))
    return out


def _nk_label(N: int, K: int) -> str:
    return f"N = K = {N}" if N == K else f"N x K = {N} x {K}"


def plot(rows: list, path: str) -> str | None:
    """Speedup over cuBLAS fp16 against M, one line per (N, K, dtype); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for N, K, dt in sorted({(r["N"], r["K"], r["dtype"]) for r in rows}):
        sel = sorted((r for r in rows if (r["N"], r["K"], r["dtype"]) == (N, K, dt)), key=lambda r: r["M"])
        ax.plot([r["M"] for r in sel], [r["speedup_cublas"] for r in sel], marker="o", label=f"{_nk_label(N, K)}, {dt}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("speedup over cuBLAS on fp16 weights")
    ax.set_title("gemm_w4a16, group size 128")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _other_params(other, params):
    """``params`` as the other checkout's record of the same class (its ``gemm_w4a16`` checks the
    class it knows), with the fields that checkout has (an older one lacks the newer fields)."""
    if params is None:
        return None
    cls = getattr(other.recipes.w4a16, type(params).__name__)
    known = {f.name for f in attrs.fields(cls)}
    return cls(**{k: v for k, v in attrs.asdict(params).items() if k in known})


def parse_vary(items) -> dict:
    """``["cluster_combine=True", "stages=3,4"]`` -> field -> values, over the fields of either
    parameter record."""
    from bench.gemm_variants import parse_vary as parse

    fields = {f.name for cls in (fs.recipes.W4A16Params, fs.recipes.W4A16WgmmaParams) for f in attrs.fields(cls)}
    return parse(items, fields=tuple(sorted(fields)))


def plan_variants(M: int, N: int, K: int, dt: str, vary: dict) -> list:
    """The plan for one shape with each combination of ``vary`` (fields its record has) replaced;
    combinations that change nothing, or that the record refuses, are left out."""
    import itertools

    if not vary:
        return []
    base = fs.recipes.w4a16.plan(M, N, K, wgmma=True, group_size=GROUP, dtype=dt)
    have = {f.name for f in attrs.fields(type(base))}
    out = []
    for combo in itertools.product(*vary.values()):
        over = {k: v for k, v in zip(vary, combo) if k in have}
        try:
            p = attrs.evolve(base, **over)
        except ValueError as e:
            print(f"{M}x{N}x{K} {over}: refused ({str(e).splitlines()[0][:90]})")
            continue
        if p != base and p not in out:
            out.append(p)
    return out


def parse_params(text: str) -> list:
    """The parameter records of ``--params``: each the repr of a ``W4A16Params`` or a
    ``W4A16WgmmaParams`` (their reprs round-trip), ``;``-separated."""
    from firesched.recipes.w4a16 import W4A16Params, W4A16WgmmaParams

    names = {"W4A16Params": W4A16Params, "W4A16WgmmaParams": W4A16WgmmaParams}
    out = []
    for part in filter(None, (t.strip() for t in text.split(";"))):
        head = part.split("(", 1)[0]
        if head not in names or not part.endswith(")"):
            raise SystemExit(f"--params: {part!r} is no W4A16Params(...) or W4A16WgmmaParams(...)")
        kw = {}
        for item in filter(None, (x.strip() for x in part[len(head) + 1:-1].split(","))):
            key, _, val = item.partition("=")
            val = val.strip()
            kw[key.strip()] = {"True": True, "False": False}[val] if val in ("True", "False") else int(val)
        out.append(names[head](**kw))
    return out


def smoke() -> dict:
    """A small odd instance through the interpreter against the numpy reference."""
    M, N, K = 5, 72, 256
    sched = fs.recipes.gemm_w4a16(M, N, K, group_size=GROUP, arch="sm_80")
    rng = np.random.default_rng(0)
    q, s, _ = quantize_int4(rng.standard_normal((K, N)), GROUP, signed=False, scale_dtype="f16")
    a = rng.standard_normal((M, K)).astype(np.float16)
    got = fs.interpret(sched, a, q, s)
    ref = w4a16_reference(a, q, s, None, GROUP)
    err = float(np.abs(got.astype(np.float64) - ref).max())
    if not err <= 1e-2 * (1 + np.abs(ref).max()):
        raise SystemExit(f"smoke: interpreter result differs from numpy by {err}")
    # the torch path's unpacking is checked against the codes where torch is installed
    plain = plain_bytes(q)
    assert plain.shape == (N, K // 2)
    return dict(shape=(M, N, K), max_abs_err=err)


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default=",".join(map(str, MS)))
    ap.add_argument("--nk", default=",".join(map(str, NKS)))
    ap.add_argument("--dtypes", default="f16")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--smoke", action="store_true", help="CPU only: a small instance through the interpreter")
    ap.add_argument("--sweep", action="store_true",
                    help="time the tile variants of sweep_candidates against cuBLAS instead (first dtype)")
    ap.add_argument("--family", choices=("mma", "wgmma"), default="mma",
                    help="with --sweep: the mma.sync family's tiles or the sm_90a family's producer-fed ones")
    ap.add_argument("--deep", action="store_true", help="with --sweep: the plan's tiles at 4-16 stages and each K split")
    ap.add_argument("--params", default="",
                    help="';'-separated parameter records (their repr: W4A16Params(...), W4A16WgmmaParams(...)) "
                         "timed next to the plan at each shape")
    ap.add_argument("--vary", action="append", default=[],
                    help="FIELD=V1,V2: the plan at each shape with the field replaced (each combination; "
                         "fields of its W4A16Params or W4A16WgmmaParams), timed next to it")
    ap.add_argument("--old", default="", help="another checkout whose kernel is timed in the same rounds")
    ap.add_argument("--launches", choices=("default", "chained", "plain"), default="default",
                    help="ours as compile(..., programmatic=None / True / False) launches it: the default "
                         "(chained on sm_90a unless the grid is sized to the SMs), chained, or plainly")
    ap.add_argument("--out", default=os.path.join(HERE, "results", f"w4a16-{datetime.date.today()}.json"))
    args = ap.parse_args(argv)
    other = None
    if args.old:
        from bench.ab_versions import load_other

        other = load_other(args.old)
    extra = parse_params(args.params)
    vary = parse_vary(args.vary)
    if args.smoke:
        row = smoke()
        print(row)
        return [row]
    import torch

    if args.sweep:
        rows = []
        for N, K in shapes_nk(args.nk):
            for M in (int(x) for x in args.m.split(",")):
                best = sweep(torch, M, N, K, args.dtypes.split(",")[0], args.rounds, args.deep, args.family)
                rows += best
                print(f"M={M} N={N} K={K}: {len(best)} variants; plan "
                      f"{next((r['ours_us'] for r in best if r['params'] == str(fs.recipes.w4a16.plan(M, N, K, wgmma=True))), 0):.1f} us")
                for r in best:
                    print(f"   {r['ours_us']:8.1f} us {r['speedup_cublas']:5.2f}x  {r['params']}", flush=True)
        write_results(args.out.replace(".json", "-sweep.json"), dict(date=str(datetime.date.today()),
                      device=torch.cuda.get_device_name(), command=" ".join(sys.argv)), rows)
        return rows
    rows = []
    print(f"{'M':>5} {'N x K':>11} {'dt':>4} {'ours us':>8} {'cuBLAS':>8} {'torch':>8} {'/cuBLAS':>8} {'/torch':>7} "
          f"{'TB/s':>5} regs")
    for N, K in shapes_nk(args.nk):
        nk = f"{N}x{K}"
        for M in (int(x) for x in args.m.split(",")):
            for dt in args.dtypes.split(","):
                for p in [None, *extra, *plan_variants(M, N, K, dt, vary)]:
                    try:
                        r = gpu_row(torch, M, N, K, dt, args.rounds, params=p, other=other,
                                    programmatic=LAUNCHES[args.launches])
                    except fs.ScheduleError as e:
                        print(f"{M:5d} {nk:>11} {dt:>4} refused: {p}: {str(e).splitlines()[0]}")
                        continue
                    except SystemExit as e:          # a wrong --params candidate: say so, time the rest
                        if p is None:
                            raise
                        print(f"{M:5d} {nk:>11} {dt:>4} WRONG: {e}", flush=True)
                        continue
                    rows.append(r)
                    print(f"{M:5d} {nk:>11} {dt:>4} {r['ours_us']:8.1f} {r['cublas_us']:8.1f} {r['torch_us']:8.1f} "
                          f"{r['speedup_cublas']:8.2f} {r['speedup_torch']:7.1f} {r['weight_tbps']:5.2f} "
                          f"{r['registers']:4d} {r['spills']} {'plan' if p is None else r['params']}"
                          + (f"  old {r['old_us']:.1f} us, ours/old {r['speedup_old']:.3f}x" if other else ""),
                          flush=True)
    meta = dict(date=str(datetime.date.today()), device=torch.cuda.get_device_name(), driver=driver_version(),
                torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version(),
                command=" ".join(sys.argv), timing="CUDA graphs of reps launches, interleaved, median of rounds")
    write_results(args.out, meta, rows)
    png = plot(rows, args.out.replace(".json", ".png"))
    if png:
        print(f"wrote {png}")
    return rows


if __name__ == "__main__":
    main()
