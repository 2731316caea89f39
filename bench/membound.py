"""Memory-bound benchmark: firesched's memory-bound recipes next to torch, in one process, on the
same inputs.

    PYTHONPATH=. python bench/membound.py                                  # every case, the default shapes
    PYTHONPATH=. python bench/membound.py --ops transpose,cast --dtypes f16,bf16 \\
        --shapes 4096x256,8192x8192,32768x65536 --out bench/results/membound-<date>.json
    PYTHONPATH=. python bench/membound.py --ops transpose --old ../other    # also that checkout's kernels

For each op, dtype and shape (rows x cols): the effective bandwidth of ours and of the torch peer
in TB/s (the bytes the op must read and write, once each, divided by the time) and their ratio
(ours / peer, > 1 is faster); with ``--old`` also another checkout's kernel of the same op and its
time against ours (``new_vs_old``: new time / old time).  Timing: ours and the peer interleaved, round after round (ours,
peer, ours, peer ...), each round ``reps`` back-to-back launches between two CUDA events, the
median over rounds; inputs rotated through enough copies to exceed twice the 50 MB L2, so every
launch reads from DRAM.  ``--graph`` captures the ``reps`` launches of each side in a CUDA graph
(small shapes are otherwise limited by the launch rate of Python; every row records the CPU time
per launch so that such rows can be recognised).  Shapes whose buffers (with the rotation) would
not fit in ``--mem-gib`` are skipped.  Results go to JSON (with the device, driver, torch and NVRTC
versions and the command) and, when matplotlib is installed, to a PNG of bandwidth against cols.

Without a GPU (or without torch) the same command compiles every kernel with NVRTC and runs the
small shapes in the CPU interpreter against each case's numpy meaning: timing is skipped.

``--dtypes`` names the tensor's dtype; for ``cast`` it is the destination of a cast from f32, or a
``src:dst`` pair (``f16:f32``).

Adding a case: a function that returns a ``Case`` — firesched's schedule for (rows, cols, dtype),
the torch peer and the numpy meaning — decorated with ``@register("name")``; ``Case.build`` does
the rest (tensors of the schedule's operands, the rotation, the launches, the check).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import firesched as fs  # noqa: E402
from bench.gemm import L2_BYTES, time_ms, write_results  # noqa: E402

DEFAULT_SHAPES = [(4096, 256), (4096, 1024), (4096, 4096), (4096, 16384), (4096, 65536), (8192, 8192),
                  (16384, 4096), (16384, 16384), (32768, 256), (32768, 1024), (32768, 4096), (32768, 16384),
                  (32768, 65536)]
SMOKE_ELEMENTS = 1 << 16          # the CPU interpreter runs shapes up to this many elements
MAX_SETS = 256                    # input sets at most (tiny shapes are launch-bound anyway)
COPY_TBS = 2.97                   # device-to-device copy on the project's H100 (shared/ANCHORS.md)
DEVICE = "cuda"
TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f8e4m3": "float8_e4m3fn",
                "f8e5m2": "float8_e5m2", "i8": "int8", "u8": "uint8", "i32": "int32"}


@dataclasses.dataclass(frozen=True)
class Built:
    """One case at one shape on the GPU: ``ours()`` and ``peer()`` each launch once (on the next
    input set of the rotation), ``bytes_moved`` is what the op must read and write, ``check()``
    runs both on the first set and returns the largest absolute difference."""

    ours: Callable[[], Any]
    peer: Callable[[], Any]
    bytes_moved: int
    check: Callable[[], float]
    sets: int = 1
    old: Callable[[], Any] | None = None


@dataclasses.dataclass(frozen=True)
class Case:
    """A memory-bound op.

    * ``schedule(rows, cols, dtype, lib=fs)``: firesched's schedule (``lib``: the package to take
      it from, another checkout's with ``--old``); its kernel takes the lowered program's inputs,
      then its outputs (``fs.compile``'s order), as logical views.
    * ``peer(torch, out, *inputs)``: torch's result on the same logical inputs, comparable with
      ``out`` (our first output, there for its dtype or shape; a tuple of results is compared
      with our outputs in order).
    * ``reference(*arrays)``: the numpy meaning on float64 inputs (rounded to their dtypes), for
      the CPU run (a tuple for several outputs); rounded to the output's dtype before the
      comparison.
    * ``tol``: the largest absolute difference allowed (0: exact).
    """

    schedule: Callable[[int, int, str], Any]
    peer: Callable[..., Any]
    reference: Callable[..., np.ndarray]
    tol: float = 0.0
    arch: str = "sm_90a"

    def build(self, rows: int, cols: int, dtype: str, *, mem_bytes: int | None = None, other=None) -> Built:
        import torch

        k = fs.compile(self.schedule(rows, cols, dtype), arch=self.arch)
        ko = None if other is None else other.compile(self.schedule(rows, cols, dtype, other), arch=self.arch)
        ins, outs = _operands(k)
        per_set = sum(_nbytes(t) for t in ins + outs)
        nsets = rotation(per_set, mem_bytes)
        sets = [([_gpu_input(torch, t) for t in ins], [_gpu_empty(torch, t) for t in outs]) for _ in range(nsets)]
        i_ours, i_peer, i_old = itertools.count(), itertools.count(), itertools.count()

        def ours():
            xs, ys = sets[next(i_ours) % nsets]
            return k(*xs, *ys)

        def old():
            xs, ys = sets[next(i_old) % nsets]
            return ko(*xs, *ys)

        def peer():
            xs, ys = sets[next(i_peer) % nsets]
            return self.peer(torch, ys[0], *xs)

        def check() -> float:
            xs, ys = sets[0]
            for y in ys:
                if y.is_floating_point():
                    y.fill_(float("nan"))
            # cloned: a peer may write into ys[0] (copy's out.copy_) and return it
            ref = tuple(r.clone() for r in _tuple(self.peer(torch, ys[0], *xs)))
            worst = 0.0
            for kernel in (k, ko) if ko is not None else (k,):
                for y in ys:
                    if y.is_floating_point():
                        y.fill_(float("nan"))
                kernel(*xs, *ys)
                torch.cuda.synchronize()
                worst = max(worst, *(max_abs_diff(torch, y, r) for y, r in zip(ys, ref)))
            return worst

        return Built(ours, peer, per_set, check, nsets, old if ko is not None else None)


CASES: dict[str, Case] = {}


def register(name: str):
    """``@register("rmsnorm")`` on a function returning a ``Case`` adds it to ``CASES``."""
    def deco(fn):
        CASES[name] = fn()
        return fn
    return deco


# --------------------------------------------------------------------------- cases

#: ``--transpose-params``: overrides of ``transpose_params`` (``block_r``, ``block_c``, ...)
TRANSPOSE_OVERRIDES: dict = {}


def _transpose_params(rows: int, cols: int, dt: str):
    if not TRANSPOSE_OVERRIDES:
        return None
    return {**fs.recipes.copies.transpose_params(rows, cols, dt), **TRANSPOSE_OVERRIDES}


@register("transpose")
def _transpose() -> Case:
    """``Y[c, r] = X[r, c]``: ``fs.recipes.transpose`` against ``x.t().contiguous()``."""
    return Case(
        # --transpose-params overrides ours, not --old's
        schedule=lambda rows, cols, dt, lib=fs: lib.recipes.transpose(
            rows, cols, dt, params=_transpose_params(rows, cols, dt) if lib is fs else None),
        # our Y is the logical (rows, cols) view of a (cols, rows) array: compare the same view
        peer=lambda torch, out, x: x.t().contiguous().t(),
        reference=lambda x: x,
    )


def cast_pair(dtype: str) -> tuple[str, str]:
    """``"bf16"`` -> (f32, bf16); ``"f16:f32"`` -> (f16, f32)."""
    src, _, dst = dtype.rpartition(":")
    return (src or "f32", dst)


@register("cast")
def _cast() -> Case:
    """``Y = dst(X)``, X in f32 unless ``--dtypes src:dst``: ``fs.recipes.cast`` against ``x.to(dst)``."""
    return Case(
        schedule=lambda rows, cols, dt, lib=fs: lib.recipes.cast((rows, cols), *cast_pair(dt)),
        peer=lambda torch, out, x: x.to(out.dtype),
        reference=lambda x: x,
    )


@register("copy")
def _copy() -> Case:
    """``Y = X``: ``fs.recipes.cast`` from a dtype to itself against ``out.copy_(x)`` — what moving
    the bytes alone costs at a shape, the ceiling of every row recipe there."""
    return Case(
        schedule=lambda rows, cols, dt, lib=fs: lib.recipes.cast((rows, cols), dt, dt),
        peer=lambda torch, out, x: out.copy_(x),
        reference=lambda x: x,
    )


# --------------------------------------------------------------------------- tensors

def _operands(k) -> tuple[list, list]:
    """The firesched tensors of the kernel's arguments: inputs and outputs, in launch order."""
    by_name = {t.name: t.tensor for t in k.schedule.spec.operands}
    return [by_name[b.name] for b in k.program.inputs], [by_name[b.name] for b in k.program.outputs]


def _tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _nbytes(t) -> int:
    return math.prod(t.shape) * t.dtype.bits // 8


def rotation(per_set: int, mem_bytes: int | None = None) -> int:
    """Input sets to rotate through: enough to exceed twice the L2 (so that no launch finds its
    inputs there), within ``mem_bytes`` with room for the peer's output."""
    n = max(1, min(MAX_SETS, math.ceil(2 * L2_BYTES / per_set)))
    if mem_bytes is not None:
        n = max(1, min(n, mem_bytes // per_set - 1))
    return n


def footprint(per_set: int) -> int:
    """Device bytes a case takes at a shape: its rotation, plus a set's worth for the peer's output."""
    return rotation(per_set) * per_set + per_set


def _storage(t) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape in storage order, and the permutation that gives the logical (dims-order) view."""
    shape = tuple(t.extent(d) for d in t.storage_dims)
    return shape, tuple(t.storage_dims.index(d) for d in t.dims)


def _gpu_input(torch, t):
    shape, perm = _storage(t)
    dt = getattr(torch, TORCH_DTYPES[t.dtype.name])
    if dt.is_floating_point and dt.itemsize >= 2:
        x = torch.randn(shape, device=DEVICE, dtype=dt)
    elif dt.is_floating_point:
        x = torch.randn(shape, device=DEVICE, dtype=torch.float16).to(dt)
    else:
        x = torch.randint(-100, 100, shape, device=DEVICE).to(dt)
    return x.permute(perm)


def _gpu_empty(torch, t):
    shape, perm = _storage(t)
    return torch.empty(shape, device=DEVICE, dtype=getattr(torch, TORCH_DTYPES[t.dtype.name])).permute(perm)


def max_abs_diff(torch, a, b, chunk_elems: int = 1 << 26) -> float:
    """max |a - b| over equal-shaped tensors, in row chunks (no full-size float temporaries);
    equal values (infinities included) count 0, a NaN on one side only counts inf."""
    rows = a.shape[0]
    step = max(1, chunk_elems // max(1, a[0].numel()))
    worst = 0.0
    for i in range(0, rows, step):
        x, y = a[i:i + step].float(), b[i:i + step].float()
        d = torch.where(x == y, torch.zeros_like(x), (x - y).abs())
        d = torch.where(torch.isnan(x) & torch.isnan(y), torch.zeros_like(d), d)
        worst = max(worst, float(torch.nan_to_num(d, nan=float("inf")).max()))
    return worst


# --------------------------------------------------------------------------- timing

def _graph(torch, fn, reps: int):
    """A CUDA graph of ``reps`` calls of ``fn`` (warmed up on a side stream first, as capture asks)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return g


def reps_for(bytes_moved: int, target_ms: float = 2.0, lo: int = 3, hi: int = 2000) -> int:
    """Back-to-back launches per timed round: about ``target_ms`` at ~2.5 TB/s."""
    est_ms = bytes_moved / 2.5e12 * 1e3
    return int(min(hi, max(lo, math.ceil(target_ms / est_ms))))


def measure(torch, built: Built, reps: int, rounds: int, graph: bool = False) -> dict:
    """Per side (ours, peer): the median GPU ms per launch over ``rounds`` interleaved rounds
    (``bench.gemm.time_ms``: ``reps`` launches between two CUDA events), and the median CPU µs
    spent issuing one launch (close to the GPU time, the row measures the launch rate)."""
    sides = {"ours": built.ours, "peer": built.peer}
    if built.old is not None:
        sides["old"] = built.old
    if graph:
        graphs = {name: _graph(torch, fn, reps) for name, fn in sides.items()}
        sides = {name: g.replay for name, g in graphs.items()}
        per_event, per_call = 1, reps          # one replay between the events holds reps launches
    else:
        per_event, per_call = reps, 1
    times = {name: [] for name in sides}
    cpu = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            spent = [0.0, 0]

            def issue(i, fn=fn, spent=spent):
                t0 = time.perf_counter()
                fn()
                spent[0] += time.perf_counter() - t0
                spent[1] += 1

            times[name].append(time_ms(torch, issue, per_event, 1) / per_call)
            cpu[name].append(spent[0] * 1e6 / (spent[1] * per_call))
    return {name: (statistics.median(times[name]), statistics.median(cpu[name])) for name in sides}


# --------------------------------------------------------------------------- runs

def gpu_row(torch, name: str, case: Case, rows: int, cols: int, dtype: str, args) -> dict | None:
    sched = case.schedule(rows, cols, dtype)
    k = fs.compile(sched, arch=case.arch)
    ins, outs = _operands(k)
    per_set = sum(_nbytes(t) for t in ins + outs)
    mem = int(args.mem_gib * 2 ** 30)
    if footprint(per_set) > mem:
        print(f"{name:9s} {dtype:8s} {rows:6d}x{cols:<6d} skipped: {footprint(per_set) / 2**30:.1f} GiB "
              f"with the rotation > {args.mem_gib} GiB")
        return None
    built = case.build(rows, cols, dtype, mem_bytes=mem, other=args.other)
    err = built.check()
    if not err <= case.tol:
        raise SystemExit(f"{name} {dtype} {rows}x{cols}: ours differs from torch by {err:.3e} (> {case.tol})")
    reps = args.reps or reps_for(built.bytes_moved)
    t = measure(torch, built, reps, args.rounds, graph=args.graph)
    (t_ours, cpu_ours), (t_peer, cpu_peer) = t["ours"], t["peer"]
    row = dict(op=name, dtype=dtype, rows=rows, cols=cols, bytes=built.bytes_moved, sets=built.sets, reps=reps,
               rounds=args.rounds, graph=args.graph, max_err=err, spills=k.spills,
               registers=max(r.registers for r in k.resources.values()),
               ours_ms=t_ours, peer_ms=t_peer, ours_tbs=built.bytes_moved / t_ours / 1e9,
               peer_tbs=built.bytes_moved / t_peer / 1e9, ratio=t_peer / t_ours,
               ours_cpu_us=cpu_ours, peer_cpu_us=cpu_peer,
               launch_bound=(not args.graph) and (cpu_ours >= 0.8 * t_ours * 1e3 or cpu_peer >= 0.8 * t_peer * 1e3))
    extra = ""
    if "old" in t:
        t_old = t["old"][0]
        row.update(old_ms=t_old, old_tbs=built.bytes_moved / t_old / 1e9, new_vs_old=t_ours / t_old)
        extra = f"  old {row['old_tbs']:5.2f} TB/s (new / old time {row['new_vs_old']:.3f})"
    del built
    torch.cuda.empty_cache()
    flag = "  (launch-bound)" if row["launch_bound"] else ""
    print(f"{name:9s} {dtype:8s} {rows:6d}x{cols:<6d} ours {row['ours_tbs']:5.2f} TB/s  torch {row['peer_tbs']:5.2f} TB/s"
          f"  ratio {row['ratio']:.2f}{extra}{flag}", flush=True)
    return row


def cpu_row(name: str, case: Case, rows: int, cols: int, dtype: str, rng) -> dict:
    """No GPU: compile with NVRTC, and run small shapes in the interpreter against the reference."""
    sched = case.schedule(rows, cols, dtype)
    k = fs.compile(sched, arch=case.arch)
    ins, outs = _operands(k)
    row = dict(op=name, dtype=dtype, rows=rows, cols=cols, bytes=sum(_nbytes(t) for t in ins + outs),
               spills=k.spills, registers=max(r.registers for r in k.resources.values()), timing="skipped: no GPU")
    if rows * cols <= SMOKE_ELEMENTS:
        xs = [_round(rng.standard_normal(tuple(t.extent(d) for d in t.dims)), t.dtype) for t in ins]
        got = _tuple(fs.interpret(sched, *xs))
        want = _tuple(case.reference(*xs))
        row["max_err"] = max(float(np.max(np.abs(np.asarray(g, np.float64) - _round(np.asarray(w, np.float64), t.dtype)),
                                          initial=0.0)) for g, w, t in zip(got, want, outs))
        if not row["max_err"] <= case.tol:
            raise SystemExit(f"{name} {dtype} {rows}x{cols}: the interpreter differs from the reference by "
                             f"{row['max_err']:.3e} (> {case.tol})")
    print(f"{name:9s} {dtype:8s} {rows:6d}x{cols:<6d} compiled ({row['registers']} registers, {row['spills']} "
          f"spill bytes){'' if 'max_err' not in row else ', interpreter max error ' + format(row['max_err'], '.1e')}")
    return row


def _round(x: np.ndarray, dt) -> np.ndarray:
    return x.astype(dt.np).astype(np.float64)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]


def driver_version() -> str:
    try:
        from cuda.bindings import driver

        err, v = driver.cuDriverGetVersion()
        return f"{v // 1000}.{v % 1000 // 10}" if int(err) == 0 else "unknown"
    except Exception:
        return "unknown"


def plot(rows: list, path: str) -> str | None:
    """Bandwidth against cols, one panel per (op, dtype): ours solid, torch dashed, one colour per
    row count, and the H100's device-to-device copy bandwidth for scale (ANCHORS.md)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    timed = [r for r in rows if "ours_tbs" in r]
    ops = sorted({r["op"] for r in timed})
    if not ops:
        return None
    dts = {op: sorted({r["dtype"] for r in timed if r["op"] == op}) for op in ops}
    ncol = max(len(v) for v in dts.values())
    fig, axes = plt.subplots(len(ops), ncol, figsize=(5 * ncol, 4.2 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j in range(len(dts[op]), ncol):
            axes[i][j].set_visible(False)
    panels = [(axes[i][j], op, dt) for i, op in enumerate(ops) for j, dt in enumerate(dts[op])]
    for ax, op, dt in panels:
        mine = [r for r in timed if (r["op"], r["dtype"]) == (op, dt)]
        for i, nrows in enumerate(sorted({r["rows"] for r in mine})):
            sel = sorted((r for r in mine if r["rows"] == nrows), key=lambda r: r["cols"])
            x = [r["cols"] for r in sel]
            c = f"C{i % 10}"
            ax.plot(x, [r["ours_tbs"] for r in sel], "-o", color=c, label=f"ours, rows={nrows}")
            ax.plot(x, [r["peer_tbs"] for r in sel], "--x", color=c, label=f"torch, rows={nrows}")
        ax.axhline(COPY_TBS, color="grey", lw=0.8, ls=":", label=f"H100 D2D copy {COPY_TBS} TB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("cols")
        ax.set_ylabel("TB/s (bytes read + written / time)")
        ax.set_title(f"{op} {dt}")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    p.add_argument("--dtypes", default="f16,bf16")
    p.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in DEFAULT_SHAPES), help="ROWSxCOLS,...")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds; the median is reported")
    p.add_argument("--reps", type=int, default=0, help="launches per round (default: about 2 ms worth)")
    p.add_argument("--graph", action="store_true", help="time CUDA graphs of the launches")
    p.add_argument("--transpose-params", default="",
                   help='JSON overrides of the transpose\'s tiles, e.g. \'{"block_r": 256}\' (transpose_params)')
    p.add_argument("--mem-gib", type=float, default=60.0, help="skip shapes whose buffers need more")
    p.add_argument("--old", default="", help="another checkout whose kernels are timed in the same rounds (GPU only)")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/membound-<date>.json)")
    args = p.parse_args(argv)
    TRANSPOSE_OVERRIDES.clear()
    if args.transpose_params:
        TRANSPOSE_OVERRIDES.update(json.loads(args.transpose_params))
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in CASES]
    if unknown:
        raise SystemExit(f"unknown ops {unknown}; known: {', '.join(CASES)}")
    shapes = parse_shapes(args.shapes)
    args.other = None
    if args.old:
        from bench.ab_versions import load_other
        args.other = load_other(args.old)
    try:
        import torch
    except ImportError:
        torch = None
    gpu = torch is not None and torch.cuda.is_available()
    date = datetime.date.today().isoformat()
    meta = dict(date=date, nvrtc=".".join(map(str, fs.cuda.nvrtc.nvrtc_version())), python=platform.python_version(),
                torch=getattr(torch, "__version__", None), command=" ".join(sys.argv), driver=driver_version(),
                method=("ours and torch interleaved, each round reps back-to-back launches between CUDA events "
                        f"({'in a CUDA graph' if args.graph else 'plain launches'}), median of {args.rounds} rounds; "
                        "inputs rotated over > 2x the L2; TB/s = bytes read + written / time"))
    if gpu:
        meta.update(device=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    else:
        meta.update(device="none (no GPU: compiled and interpreted only, timing skipped)")
    rows = []
    rng = np.random.default_rng(0)
    for op in ops:
        for dtype in args.dtypes.split(","):
            for (r, c) in shapes:
                try:
                    if gpu:
                        row = gpu_row(torch, op, CASES[op], r, c, dtype, args)
                    else:
                        row = cpu_row(op, CASES[op], r, c, dtype, rng)
                except fs.ScheduleError as e:
                    print(f"{op:9s} {dtype:8s} {r:6d}x{c:<6d} not schedulable: {str(e).splitlines()[0]}")
                    continue
                if row is not None:
                    rows.append(row)
    out = args.out or os.path.join(HERE, "results", f"membound-{date}.json")
    write_results(out, meta, rows)
    png = plot(rows, os.path.splitext(out)[0] + ".png")
    if png:
        print(f"wrote {png}")
    return rows


if __name__ == "__main__":
    main()
