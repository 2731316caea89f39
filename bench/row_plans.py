"""Time alternative row plans (threads per block, elements per thread, cluster size) of one row
recipe at one shape, interleaved with torch's peer: the measurements behind ``rows.row_plan``.

    PYTHONPATH=. python bench/row_plans.py --op softmax --shape 4096x65536
    PYTHONPATH=. python bench/row_plans.py --op rmsnorm --shape 1024x262144 --threads 512,1024 --values 16,32
    PYTHONPATH=. python bench/row_plans.py --op layernorm --shape 4096x65536 --row-memory RF,SH --occupancy 0,4,6
    PYTHONPATH=. python bench/row_plans.py --op layernorm --shape 16384x1024 --plan 128,8,1,1 --plan 32,8,4,4
    PYTHONPATH=. python bench/row_plans.py --op layernorm --shape 16384x2560 --together --plan default --plan 128,8,3,1
    PYTHONPATH=. python bench/row_plans.py --op layernorm --shape 4096x16383 --together --plan default --passes 544x4,704x3

Each plan splits the row over a thread-block cluster of the fewest blocks (2, 4 or 8) whose
``threads x values`` elements hold their part, or one block when it fits.  Timing as in
``bench/rows.py`` (``firesched.timing.interleaved``: ours, peer, ours, peer ... through CUDA graphs,
inputs rotated past L2, median of rounds).  ``--row-memory RF,SH`` times each plan with the row
held in registers and in shared memory (``RowPlan.row_memory``); ``--occupancy`` the blocks per
SM to ask for; ``--exchange`` how a cluster's blocks combine (``push`` by default, as the recipes);
``--passes LANESxREPS`` the recipe's own plan on other threads a row and passes (any whole number
of warps: e.g. 544 threads x 4 passes where 512 x 5 would leave most of a fifth pass idle).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import attrs

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import firesched as fs  # noqa: E402
from bench.gemm import L2_BYTES  # noqa: E402
from bench.rows import _inputs, _outputs, _peer, bytes_moved  # noqa: E402
from firesched import timing  # noqa: E402
from firesched.recipes import norms, rows  # noqa: E402


def plans(cols: int, threads_opts, values_opts, vec: int = 8):
    """``RowPlan`` values for rows of ``cols`` elements: each (threads, values) that some cluster
    size of ``rows.CLUSTERS`` (or one block) can hold; accesses of ``vec`` elements, or fewer
    where the row length is not a multiple."""
    while cols % vec:
        vec //= 2
    out = []
    for threads in threads_opts:
        for values in values_opts:
            hold = threads * values
            vectors = -(-cols // vec)
            for C in (1,) + rows.CLUSTERS:
                part = -(-vectors // C) * vec
                if part <= hold:
                    reps = -(-part // (threads * vec))
                    out.append(rows.RowPlan(threads, vec, reps, 1, cluster=C, part=part if C > 1 else 0))
                    break
    return out


def _with_memory(plan, memory: str):
    """``plan`` with its row in ``memory``; a row part in shared memory is rounded up to whole
    passes of the block's threads (as ``rows.row_plan`` stages it)."""
    if memory == "SH" and plan.cluster > 1:
        part = -(-plan.part // plan.span) * plan.span
        return attrs.evolve(plan, part=part, reps=part // plan.span, row_memory=memory)
    return attrs.evolve(plan, row_memory=memory)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="rmsnorm", choices=["rmsnorm", "layernorm", "add_rmsnorm", "softmax", "softmax_causal"])
    p.add_argument("--shape", default="1024x262144")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--threads", default="256,512,1024")
    p.add_argument("--values", default="16,32")
    p.add_argument("--occupancy", default="0", help="blocks per SM to ask for (0: the plan's default)")
    p.add_argument("--row-memory", default="RF", help="where the row waits: RF, SH or both (RF,SH)")
    p.add_argument("--exchange", default="push", choices=["push", "barrier"])
    p.add_argument("--plan", action="append", default=[],
                   help="a plan of one block per rows: LANES,VEC,REPS,ROWS (RowPlan's first four fields; "
                        "repeatable), or 'default' (the recipe's own), instead of --threads / --values")
    p.add_argument("--together", action="store_true",
                   help="time every plan and the peer in one interleaved set (default: each plan with the peer)")
    p.add_argument("--tuple-stats", default="default", choices=["default", "on", "off", "both"],
                   help="softmax and LayerNorm: statistics in one tuple reduction (on), two (off) or each plan both ways (both); default: "
                        "one where the row is split over a cluster")
    p.add_argument("--passes", default="",
                   help="LANESxREPS,...: the recipe's own plan with these threads a row and passes (its other "
                        "fields, occupancy and row memory included, kept), timed beside the other plans")
    p.add_argument("--with-default", action="store_true",
                   help="time the recipe's own plan beside the --threads / --values grid")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    passes = []
    for v in filter(None, args.passes.split(",")):
        lanes, sep, reps = v.partition("x")
        if not (sep and lanes.isdigit() and reps.isdigit()):
            p.error(f"--passes {v!r}: LANESxREPS, e.g. 544x4 (threads a row x passes)")
        passes.append((int(lanes), int(reps)))
    R, C = (int(v) for v in args.shape.split("x"))
    import torch

    kind = "softmax" if args.op == "softmax_causal" else args.op
    extra = {"causal": True} if args.op == "softmax_causal" else {}
    stats = [None]
    if args.tuple_stats != "default" and kind in ("softmax", "layernorm"):
        stats = [True, False] if args.tuple_stats == "both" else [args.tuple_stats == "on"]
    dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    nbytes = bytes_moved(args.op, R, C, dt.itemsize)
    nsets = max(1, math.ceil(2 * L2_BYTES / nbytes))
    sets = [(_inputs(torch, args.op, R, C, dt), _outputs(torch, args.op, R, C, dt)) for _ in range(nsets)]
    peer = _peer(torch, args.op, C)
    base = [_plan(p) for p in args.plan] or \
        plans(C, [int(t) for t in args.threads.split(",")], [int(v) for v in args.values.split(",")])
    if args.with_default and None not in base:
        base.insert(0, None)
    todo = [plan if plan is None else
            _with_memory(attrs.evolve(plan, blocks_per_sm=o, exchange=args.exchange), m) for plan in base
            for o in (int(x) for x in args.occupancy.split(",")) for m in args.row_memory.split(",")]
    if passes:
        own = norms.recipe_plan("causal" if args.op == "softmax_causal" else args.op, R, C, args.dtype, "sm_90a")
        todo += [attrs.evolve(own, lanes=lanes, reps=reps) for lanes, reps in passes]
    todo = list(dict.fromkeys(todo))
    kernels = []
    for plan in todo:
        for one in stats:
            kw = dict(extra, **({} if one is None else {"tuple_stats": one}))
            try:
                sched = getattr(fs.recipes, kind)(R, C, dtype=args.dtype, arch="sm_90a", plan=plan, **kw)
                kernels.append(((plan, one), fs.compile(sched, arch="sm_90a")))
            except fs.ScheduleError as e:
                print(f"{plan}: refused: {str(e).splitlines()[0]}")
    groups = [kernels] if args.together else [[pk] for pk in kernels]
    for group in groups:
        fns = {j: (lambda i, k=k: k(*sets[i % nsets][0], *sets[i % nsets][1])) for j, (_, k) in enumerate(group)}
        fns["peer"] = lambda i: peer(*sets[i % nsets][0])
        us = timing.interleaved(fns, rounds=args.rounds)
        q = us["peer"] * 1e-3
        for j, ((plan, one), k) in enumerate(group):
            o = us[j] * 1e-3
            what = "the recipe's plan" if plan is None else (
                f"threads {plan.lanes:4d} x rows {plan.rows} values {plan.reps * plan.vec:3d} cluster {plan.cluster} "
                f"occupancy {plan.occupancy} row in {plan.row_memory}{' aligned' if plan.aligned else ''}"
                f"{' persistent' if plan.persistent else ''}"
                f"{f' {plan.tile_stages} rows in flight' if plan.tile_stages > 1 else ''}")
            what += "" if one is None else (" tuple statistics" if one else " two reductions")
            print(f"{args.op} {args.dtype} {R}x{C} {what}: ours {nbytes / o / 1e9:5.2f} TB/s  torch "
                  f"{nbytes / q / 1e9:5.2f} TB/s  registers {max(r.registers for r in k.resources.values())}  "
                  f"spills {k.spills}", flush=True)


def _plan(text: str):
    """``--plan lanes,vec,reps,rows[,cluster,part][,a][,p][,sN]``: a ``RowPlan``; an ``a`` makes it an
    aligned row's (``RowPlan.aligned``: the window of ``align(c=vec)``), a ``p`` a persistent
    grid's (``RowPlan.persistent``), ``sN`` a persistent block's rows N in flight
    (``RowPlan.tile_stages``); ``default``: None, the recipe's own plan."""
    if text == "default":
        return None
    parts = text.split(",")
    flags = set()
    stages = 1
    while parts and (parts[-1] in ("a", "p") or parts[-1].startswith("s")):
        flag = parts.pop()
        if flag.startswith("s"):
            stages = int(flag[1:])
        else:
            flags.add(flag)
    return rows.RowPlan(*(int(v) for v in parts), aligned="a" in flags, persistent="p" in flags,
                        tile_stages=stages)


if __name__ == "__main__":
    main()
