"""Run ``recipes.fmha`` kernels once each (odd lengths, causal with seq_q != seq_kv, grouped-query
heads, the log-sum-exp, every head dim; the mma.sync and the wgmma schedules, and above head dim 64
the warp-specialized one with ping-pong consumers, and with the producer loading each query tile
by TMA in a persistent grid, in a persistent grid whose consumers load Q and stage the output in
its rows, with two query buffers (``q_stages``), with K and V on rings of their own
(``separate``), two blocks of one consumer warpgroup an SM, and the plans at head dims 96 and 256
(``plan96``, ``plan256``)),
for compute-sanitizer:

    compute-sanitizer --tool memcheck  python bench/sanitize_fmha.py
    compute-sanitizer --tool racecheck python bench/sanitize_fmha.py
    compute-sanitizer --tool synccheck python bench/sanitize_fmha.py
    compute-sanitizer --tool memcheck  python bench/sanitize_fmha.py pingpong persistent   # those designs
    python bench/sanitize_fmha.py --check        # CPU only: build and check() every design, no launch
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import attrs  # noqa: E402

import firesched as fs  # noqa: E402

CASES = [  # batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal
    (1, 2, 1, 17, 1000, 64, True), (2, 4, 2, 130, 77, 128, False), (1, 1, 1, 1, 1, 64, False),
    (1, 2, 2, 300, 300, 32, True), (1, 2, 1, 65, 129, 256, True), (1, 3, 3, 100, 90, 96, False),
    (2, 2, 1, 512, 512, 128, True),   # 32 query rows a warp, the key loop stopping at the diagonal
    (1, 2, 2, 256, 256, 128, False),  # whole tiles: no edge guards (query fragments 32 columns at a time)
]


def main(argv=None) -> None:
    only = set(sys.argv[1:] if argv is None else argv)
    check_only = "--check" in only
    only.discard("--check")

    designs = [(c, a) for a in ("sm_80", "sm_90a") for c in CASES] + [
        (c, w) for w in ("pingpong", "q_by_producer") for c in CASES if c[5] > 64]
    # 576 query tiles: each persistent block walks four or five, its Q ring wrapping
    designs += [((4, 16, 16, 1100, 300, 128, False), "q_by_producer"),
                ((4, 16, 16, 1100, 1100, 128, True), "q_by_producer")]
    # K and V on rings of their own: two stages in a plain grid; and persistent with two Q buffers
    designs += [((4, 16, 16, 1100, 300, 128, False), "separate"), ((2, 4, 2, 130, 77, 128, True), "separate"),
                ((4, 16, 16, 1100, 1100, 128, True), "separate_persistent")]
    # the plans at head dims 256 (separate rings, a block a query tile; causal: 240-register consumers) and 96
    # (the persistent design with two query buffers)
    designs += [((2, 4, 2, 300, 200, 256, True), "plan256"), ((1, 16, 16, 1100, 300, 256, False), "plan256"),
                ((2, 16, 16, 700, 300, 96, False), "plan96")]
    # the same with two query buffers beside two key stages, the output staged in its own buffer
    designs += [((4, 16, 16, 1100, 300, 128, False), "q_stages"), ((4, 16, 16, 1100, 1100, 128, True), "q_stages"),
                ((2, 4, 2, 130, 77, 128, False), "q_stages")]
    # two blocks of one consumer warpgroup on each SM at once
    designs += [((4, 16, 16, 1100, 300, 128, True), "two_blocks"), ((1, 2, 1, 65, 129, 64, False), "two_blocks")]
    # persistent blocks whose consumers load Q and stage each tile's output in its rows (TMA stores)
    designs += [((4, 16, 16, 1100, 300, 128, False), "persistent"), ((2, 4, 2, 130, 77, 128, False), "persistent")]
    unknown = only - {design for _, design in designs}
    if unknown:
        raise SystemExit(f"sanitize_fmha: no design {', '.join(sorted(unknown))}; the designs are "
                         f"{', '.join(sorted({design for _, design in designs}))}")
    if not check_only:
        import torch

    for (b, h, kvh, sq, skv, d, causal), design in designs:
        if only and design not in only:
            continue
        # the mma.sync schedule (planned for sm_80) and the wgmma one, both run on the H100; and
        # two consumer warpgroups taking turns (128-query tiles, whatever the plan picks)
        params = None
        # the designs below are the plan's with two consumer warpgroups taking turns: one block an
        # SM (a short causal loop plans two blocks of one consumer, which 384 threads cannot be)
        base = attrs.evolve(fs.recipes.fmha_plan(b, h, sq, skv, d, arch="sm_90a", causal=causal), blocks_per_sm=1)
        if design == "pingpong":
            params = attrs.evolve(base, block_q=128, warps=8, pingpong=True)
        if design == "q_by_producer":
            # the producer's own ring for Q; a persistent grid walking the query tiles (causal: the
            # steps past each tile's diagonal pass through the key ring)
            params = attrs.evolve(base, block_q=128, warps=8, pingpong=True, q_by_producer=True, persistent=True)
        if design in ("separate", "separate_persistent"):
            params = attrs.evolve(base, block_q=128, warps=8, pingpong=True, stages=2, separate=True)
            if design == "separate_persistent":
                params = attrs.evolve(params, persistent=True, q_by_producer=True, q_stages=2)
        if design == "q_stages":
            params = attrs.evolve(base, block_q=128, warps=8, pingpong=True, q_by_producer=True, persistent=True,
                                  stages=2, q_stages=2)
        if design == "persistent":
            params = attrs.evolve(base, block_q=128, warps=8, pingpong=True, persistent=True)
        if design == "two_blocks":
            params = fs.recipes.FmhaParams(block_q=64, block_kv=64, warps=4, stages=3, mma="wgmma", tma=True,
                                           warp_specialized=True, overlap=True, blocks_per_sm=2)
        arch = "sm_90a" if params or design.startswith("plan") else design
        sched = fs.recipes.fmha(b, h, sq, skv, d, kv_heads=kvh, causal=causal, lse=True, arch=arch, params=params)
        if check_only:
            sched.check("sm_90a")
            print(f"{design} {b}x{h}({kvh})x{sq}x{skv}x{d} causal={causal}: checks")
            continue
        k = fs.compile(sched, arch="sm_90a")
        g = h // kvh
        q = torch.randn(b, kvh, g, sq, d, device="cuda", dtype=torch.float16)
        kk = torch.randn(b, kvh, skv, d, device="cuda", dtype=torch.float16)
        v = torch.randn(b, kvh, skv, d, device="cuda", dtype=torch.float16)
        o, lse = k(q, kk, v)
        torch.cuda.synchronize()
        print(f"{design} {b}x{h}({kvh})x{sq}x{skv}x{d} causal={causal}: ok, finite={bool(torch.isfinite(o).all())}")


if __name__ == "__main__":
    main()
