"""Run one attention shape's kernels a few times each — ours (the plan, or ``--persistent``) and
SDPA's cuDNN backend — for a profiler to read, e.g. the instruction counts and durations quoted in
bench/README.md::

    ncu --clock-control none -k regex:firesched --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats --metrics smsp__inst_executed.sum \\
        python bench/profile_fmha.py --shape 16x16x1024x128
    ncu ... -k regex:cudnn ... python bench/profile_fmha.py --shape 16x16x1024x128

``--arch sm_80 --peer flash`` runs the mma.sync design beside SDPA's flash backend instead.
``--smoke`` compiles our kernel only (no GPU needed).
"""

from __future__ import annotations

import argparse
import os
import sys

import attrs

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import firesched as fs  # noqa: E402


def kernel(b: int, h: int, s: int, d: int, causal: bool, persistent: bool, arch: str = "sm_90a"):
    """Our compiled kernel for a (b, h, s, s, d) problem, with the plan's parameters for ``arch``
    (compiled for this GPU, an sm_90a one)."""
    params = fs.recipes.fmha_plan(b, h, s, s, d, arch=arch, causal=causal)
    if persistent:
        params = attrs.evolve(params, persistent=True)
    return fs.compile(fs.recipes.fmha(b, h, s, s, d, causal=causal, params=params, arch=arch), arch="sm_90a")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4x16x4096x128", help="batch x heads x seq x head_dim")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--persistent", action="store_true", help="FmhaParams(persistent=True)")
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--arch", default="sm_90a", choices=("sm_90a", "sm_80"), help="whose plan: sm_80 is the mma.sync design")
    ap.add_argument("--peer", default="cudnn", choices=("cudnn", "flash"), help="SDPA's backend to run beside ours")
    ap.add_argument("--smoke", action="store_true", help="compile ours only, no GPU")
    args = ap.parse_args(argv)
    b, h, s, d = (int(x) for x in args.shape.split("x"))
    k = kernel(b, h, s, d, args.causal, args.persistent, args.arch)
    if args.smoke:
        print(f"compiled, {k.spills} spill bytes")
        return
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.float16)
    kk = torch.randn(b, h, s, d, device="cuda", dtype=torch.float16)
    v = torch.randn(b, h, s, d, device="cuda", dtype=torch.float16)
    for _ in range(args.launches):
        k(q.view(b, h, 1, s, d), kk, v)
    backend = SDPBackend.CUDNN_ATTENTION if args.peer == "cudnn" else SDPBackend.FLASH_ATTENTION
    with sdpa_kernel(backend):
        for _ in range(args.launches):
            torch.nn.functional.scaled_dot_product_attention(q, kk, v, is_causal=args.causal)
    torch.cuda.synchronize()
    print(f"ran ours and {args.peer}'s", args.launches, "times each")


if __name__ == "__main__":
    main()
