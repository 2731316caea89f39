"""Where an attention block's time goes: our kernel's source with time stamps at its phases.

    PYTHONPATH=. python bench/fmha_timeline.py --shape 16x16x1024x128
    PYTHONPATH=. python bench/fmha_timeline.py --shape 16x16x1024x128 --vary persistent=True --vary q_by_producer=True
    PYTHONPATH=. python bench/fmha_timeline.py --smoke      # CPU: instrument and compile only

The printed kernel gets, before chosen lines of its source (``MARKS``: the consumers' Q load,
the wait for the first K and V tiles, the first step's scores, the end of the key loop, the
output's store, the block's end), a stamp: the leading thread of each warpgroup writes
``%globaltimer`` (ns) and ``clock64`` into a ``__device__`` array, one slot a (block, warpgroup,
mark, visit).  The launch runs once untimed and once traced (with ``--sets N``, N input sets are launched in
turn first, so that the traced one's inputs come from memory, not L2); the script prints, per mark, the
median time since the block's entry, and the gap between one block's end and the next block's
entry on the same SM.  The stamps cost a few instructions each; the numbers show where a
block's time goes, not its exact length.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import attrs  # noqa: E402
import numpy as np  # noqa: E402

import firesched as fs  # noqa: E402
from firesched.cuda import printer as cuda  # noqa: E402

#: (label, regex of the source line the stamp goes before, which match: 0 first, -1 last, None all)
MARKS = [
    ("q_load", r"// Move<block>\(Q:GL", 0),
    ("q_ready", r"// Q_smem is filled", 0),
    ("tile_wait", r"// sm90a\.mbarrier_try_wait: the tile is in shared memory", 0),
    ("kv0_wait", r"// key loop over", 0),
    ("kv0_ready", r"// S_acc\[0 \.\. \+\d+\] = 0\.0", 0),
    ("turn0", r"// sm90a\.wgmma_fence", 0),
    ("s0_done", r"// Pointwise<block>\(copy: S:RF", 0),
    ("loop_done", r"// Pointwise<block>\(rcp: l:RF", 0),
    ("store", r"// Move<block>\(O:RF f32\[[0-9x]+\] -> O:GL", 0),
]
VISITS = 32         # stamps kept a (block, warpgroup, mark): a persistent block's tiles
SLOTS = len(MARKS) + 2   # + the block's entry and end


def instrument(src: str) -> str:
    """``src`` with the stamps of ``MARKS`` (and the kernel's entry and end)."""
    lines = src.split("\n")
    head = [i for i, ln in enumerate(lines) if ln.startswith('extern "C" __global__')]
    if len(head) != 1:
        raise ValueError("instrument: expected one kernel in the source")
    opened = next(i for i in range(head[0], len(lines)) if lines[i].rstrip().endswith("{"))
    stamp = ("fs_stamp({slot}, fs_visit_{slot}++);")
    inserts = {opened + 1: ["    int " + ", ".join(f"fs_visit_{s} = 0" for s in range(SLOTS)) + ";",
                            "    " + stamp.format(slot=0)]}
    for n, (_label, rx, which) in enumerate(MARKS, start=1):
        hits = [i for i, ln in enumerate(lines) if re.search(rx, ln)]
        if not hits:
            continue
        for i in (hits if which is None else [hits[which]]):
            indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
            inserts.setdefault(i, []).append(indent + stamp.format(slot=n))
    # the block's end: before the kernel's closing brace (the last line that is "}")
    end = max(i for i, ln in enumerate(lines) if ln == "}")
    inserts.setdefault(end, []).append("    " + stamp.format(slot=SLOTS - 1))
    out = []
    for i, ln in enumerate(lines):
        out.extend(inserts.get(i, []))
        out.append(ln)
    helper = f"""
extern "C" __device__ unsigned long long fs_trace[{{blocks}} * 4 * {SLOTS} * {VISITS} * 2];
extern "C" __device__ unsigned int fs_trace_sm[{{blocks}}];
__device__ __forceinline__ void fs_stamp(int slot, int visit) {{
    if ((threadIdx.x & 127) != 0 || visit >= {VISITS}) return;
    unsigned long long t, c = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned k = (((b * 4 + threadIdx.x / 128) * {SLOTS} + slot) * {VISITS} + visit) * 2;
    fs_trace[k] = t;
    fs_trace[k + 1] = c;
    if (threadIdx.x == 0 && slot == 0) {{
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        fs_trace_sm[b] = sm;
    }}
}}
"""
    return "\n".join(out[:head[0]]) + helper + "\n".join(out[head[0]:])


def compiled(shape, dtype, causal, vary: dict):
    """The plan's kernel (with ``vary`` over its FmhaParams), instrumented; and its grid size."""
    b, h, s, d = shape
    params = attrs.evolve(fs.recipes.fmha_plan(b, h, s, s, d, arch="sm_90a", causal=causal), **vary)
    sched = fs.recipes.fmha(b, h, s, s, d, dtype=dtype, arch="sm_90a", causal=causal, params=params)
    prog = sched.lower("sm_90a")
    kern = prog.kernels[0]
    blocks = int(np.prod(kern.grid))
    plain = cuda.emit_kernel
    cuda.emit_kernel = lambda k: instrument(plain(k)).replace("{blocks}", str(blocks))
    try:
        k = fs.compile(sched, arch="sm_90a", use_cache=False)
    finally:
        cuda.emit_kernel = plain
    return k, blocks, params


def read_trace(k, blocks: int):
    from cuda.bindings import driver

    from firesched import runtime

    lm = runtime.load_module(k.modules[0], 0)
    out = {}
    for name, count in (("fs_trace", blocks * 4 * SLOTS * VISITS * 2), ("fs_trace_sm", blocks)):
        ptr, _size = runtime._call("cuModuleGetGlobal", driver.cuModuleGetGlobal, lm.handle, name.encode())
        host = np.zeros(count, dtype=np.uint64 if name == "fs_trace" else np.uint32)
        runtime._call("cuMemcpyDtoH", driver.cuMemcpyDtoH, host.ctypes.data, ptr, host.nbytes)
        out[name] = host
    return out["fs_trace"].reshape(blocks, 4, SLOTS, VISITS, 2), out["fs_trace_sm"]


def clear_trace(k, blocks: int):
    from cuda.bindings import driver

    from firesched import runtime

    lm = runtime.load_module(k.modules[0], 0)
    ptr, size = runtime._call("cuModuleGetGlobal", driver.cuModuleGetGlobal, lm.handle, b"fs_trace")
    runtime._call("cuMemsetD8", driver.cuMemsetD8, ptr, 0, int(size))


def report(trace, sms) -> dict:
    """Median ns since the block's entry per (warpgroup, mark), and between blocks on one SM."""
    labels = ["entry"] + [m[0] for m in MARKS] + ["end"]
    t = trace[..., 0].astype(np.int64)          # (blocks, wg, slot, visit) ns
    entry = t[:, 0, 0, 0]
    res = {}
    print(f"{'warpgroup':>9} {'mark':>10} {'visits':>6} {'median ns since entry (first visit)':>36}"
          f" {'median ns a visit after the first':>34}")
    for wg in range(4):
        for s, lab in enumerate(labels):
            seen = t[:, wg, s, :] > 0
            if not seen.any():
                continue
            first = t[:, wg, s, 0]
            ok = first > 0
            since = np.median(first[ok] - entry[ok])
            visits = seen.sum(axis=1)
            later = []
            for bi in np.nonzero(visits > 1)[0]:
                v = t[bi, wg, s, :visits[bi]]
                later.extend(np.diff(v))
            per = np.median(later) if later else float("nan")
            print(f"{wg:>9} {lab:>10} {int(np.median(visits)):>6} {since:>36.0f} {per:>34.0f}")
            res[f"wg{wg}:{lab}"] = {"since_entry_ns": float(since), "per_visit_ns": float(per)}
    # a block that walks several tiles (persistent): each mark of tile v >= 1 against the end of
    # tile v - 1's key loop, the boundary a persistent grid is meant to hide
    done = labels.index("loop_done")
    if (t[:, :, done, 1] > 0).any():
        print(f"{'warpgroup':>9} {'mark':>10} {'median ns after the previous tile loop_done (tiles 2+)':>56}")
        for wg in range(4):
            prev = t[:, wg, done, :-1]
            for s, lab in enumerate(labels):
                cur = t[:, wg, s, 1:]
                ok = (cur > 0) & (prev > 0)
                if s == done or not ok.any():
                    continue
                after = np.median((cur - prev)[ok])
                print(f"{wg:>9} {lab:>10} {after:>56.0f}")
                res[f"wg{wg}:{lab}"]["after_previous_loop_ns"] = float(after)
    ends = t[:, :, -1, :].max(axis=(1, 2))
    gaps = []
    for sm in np.unique(sms):
        idx = np.nonzero(sms == sm)[0]
        order = idx[np.argsort(entry[idx])]
        for a, b in zip(order[:-1], order[1:]):
            gaps.append(entry[b] - ends[a])
    if gaps:
        g = np.array(gaps)
        print(f"entry of the next block on an SM after the last stamp of the one before: median {np.median(g):.0f} ns,"
              f" p10 {np.percentile(g, 10):.0f}, p90 {np.percentile(g, 90):.0f}")
        res["gap_ns"] = {"median": float(np.median(g)), "p10": float(np.percentile(g, 10)),
                         "p90": float(np.percentile(g, 90))}
    span = (ends.max() - entry.min())
    life = np.median(ends - entry)
    print(f"kernel span {span / 1e3:.1f} us, median block life {life / 1e3:.2f} us, blocks {len(entry)}")
    res["span_us"] = float(span / 1e3)
    res["block_life_us"] = float(life / 1e3)
    return res


def parse_vary(items) -> dict:
    """``["persistent=True", "stages=2"]`` -> one value per ``FmhaParams`` field (``bench/fmha.py``'s
    parser, which refuses unknown fields)."""
    from bench.fmha import parse_vary as parse

    out = {}
    for name, values in parse(items or []).items():
        if len(values) != 1:
            raise SystemExit(f"--vary {name}: the timeline traces one kernel; give one value")
        out[name] = values[0]
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="16x16x1024x128", help="batch x heads x seq x head_dim")
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--vary", action="append", help="an FmhaParams field=value")
    ap.add_argument("--smoke", action="store_true", help="instrument and compile only (no GPU)")
    ap.add_argument("--sets", type=int, default=1,
                    help="input sets launched in turn before the traced launch, which takes the first "
                         "(inputs past L2 when their bytes exceed it)")
    args = ap.parse_args(argv)
    shape = tuple(int(x) for x in args.shape.split("x"))
    k, blocks, params = compiled(shape, args.dtype, args.causal, parse_vary(args.vary))
    print(params)
    if args.smoke:
        stamps = k.source.count("fs_stamp(") - 1          # less the helper's definition
        print(f"compiled, {k.spills} spill bytes, {blocks} blocks, {stamps} stamps")
        return {"spills": k.spills, "blocks": blocks, "stamps": stamps}
    import torch

    b, h, s, d = shape
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    sets = [[torch.randn(b, h, s, d, device="cuda", dtype=tdt) for _ in range(4)] for _ in range(max(1, args.sets))]
    for q, kk, v, o in sets[1:] + sets[:1]:
        k(q.view(b, h, 1, s, d), kk, v, o.view(b, h, 1, s, d))
    for q, kk, v, o in sets[1:]:
        k(q.view(b, h, 1, s, d), kk, v, o.view(b, h, 1, s, d))
    torch.cuda.synchronize()
    clear_trace(k, blocks)
    q, kk, v, o = sets[0]
    k(q.view(b, h, 1, s, d), kk, v, o.view(b, h, 1, s, d))
    torch.cuda.synchronize()
    trace, sms = read_trace(k, blocks)
    return report(trace, sms)


if __name__ == "__main__":
    main()
