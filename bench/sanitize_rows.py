"""Run every row recipe once per shape on the GPU, for compute-sanitizer:

    compute-sanitizer --tool memcheck  python bench/sanitize_rows.py
    compute-sanitizer --tool racecheck python bench/sanitize_rows.py
    compute-sanitizer --tool synccheck python bench/sanitize_rows.py
    compute-sanitizer --tool racecheck python bench/sanitize_rows.py 3x40000 2x65537   # some shapes
    compute-sanitizer --tool racecheck python bench/sanitize_rows.py --exchange barrier 3x40961 2x100003
    compute-sanitizer --tool racecheck python bench/sanitize_rows.py --dtype f32 2x10240   # bf16 by default

The rows split over clusters combine as the recipes do by default (``rows.cluster_exchange``:
``barrier.cluster`` for RMSNorm's rows of 16-byte vectors, elsewhere ``to_blocks(exchange="push")``,
``st.async`` into each other's shared memory and an mbarrier); ``--exchange barrier`` or ``push``
runs every cluster one way.

Shapes: odd rows and columns (predicated edges, padded registers), rows sharing a warp, a row
per block, the largest plan (1024 threads), rows split over thread-block clusters of 2 and 4
blocks (an odd row included), and cluster parts staged in shared memory (20,480 and 65,536
columns; 50,000: the last block's part shorter than its buffer), rows of 20,000 on half blocks
(512 threads, two an SM: LayerNorm, RMSNorm, causal softmax) and softmax's rows staged on one
block (20,000 to 40,000), and rows whose vectors are not a power of two (2,560, 4,104 and 14,336
columns: passes that fill their threads, ``rows.FILL_THREADS``).  Causal softmax too."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import firesched as fs  # noqa: E402

SHAPES = [(37, 1001), (5, 1), (33, 100), (64, 256), (16, 4096), (3, 32768), (3, 40000), (2, 65537), (3, 20480),
          (3, 20000), (2, 50000), (2, 65536), (5, 2560), (2, 4104), (2, 14336)]


def main(argv=None) -> None:
    """Every op at ``SHAPES``, or at the ``ROWSxCOLS`` shapes given on the command line."""
    import torch

    args = list(sys.argv[1:] if argv is None else argv)
    exchange, dtype = None, "bf16"
    if "--exchange" in args:
        i = args.index("--exchange")
        exchange = args[i + 1]
        del args[i:i + 2]
    if "--dtype" in args:
        i = args.index("--dtype")
        dtype = args[i + 1]
        del args[i:i + 2]
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    shapes = [tuple(int(v) for v in a.split("x")) for a in args] or SHAPES
    for op in ("rmsnorm", "layernorm", "add_rmsnorm", "softmax", "softmax_causal"):
        for rows, cols in shapes:
            kind, kw = ("softmax", {"causal": True}) if op == "softmax_causal" else (op, {})
            sched = getattr(fs.recipes, kind)(rows, cols, dtype=dtype, arch="sm_90a", exchange=exchange, **kw)
            k = fs.compile(sched, arch="sm_90a")
            ins = []
            for b in k.program.inputs:
                ins.append(torch.randn(b.shape, device="cuda", dtype=tdt[dtype]))
            outs = [torch.empty(b.shape, device="cuda", dtype=tdt[b.dtype.name]) for b in k.program.outputs]
            k(*ins, *outs)
            torch.cuda.synchronize()
            assert all(torch.isfinite(o.float()).all() for o in outs), (op, rows, cols)
            print(f"{op} {rows}x{cols} ({exchange or 'default'}): ran", flush=True)


if __name__ == "__main__":
    main()
