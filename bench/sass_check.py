"""Compile the main Hopper GEMM variants and count the ``HGMMA`` instructions in their SASS.

    PYTHONPATH=. python bench/sass_check.py [--out DIR]

Writes each variant's CUBIN to ``DIR`` (default: a temporary directory) and, where
``cuobjdump`` is on the PATH, runs ``cuobjdump --dump-sass`` on it and prints the number of
``HGMMA`` (wgmma), ``UTMALDG`` (TMA load) and ``UTMASTG`` (TMA store) instructions.  Exits
non-zero when a variant has no HGMMA.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import firesched as fs  # noqa: E402
from firesched import ops  # noqa: E402

VARIANTS = {
    "plain-128x256": dict(atoms="sm90a", block_m=128, block_n=256, stages=4, group_m=8, warp_specialized=False),
    "ws-persistent-128x256": dict(atoms="sm90a", block_m=128, block_n=256, stages=4, group_m=8,
                                  warp_specialized=True, persistent=True, cluster=1),
    "ws-persistent-bias-relu": dict(atoms="sm90a", block_m=128, block_n=256, stages=3, group_m=8,
                                    warp_specialized=True, persistent=True, cluster=1,
                                    epilogue_ops=(ops.bias("bias"), ops.relu())),
    "ws-persistent-bf16-f32": dict(atoms="sm90a", block_m=128, block_n=128, stages=5, dtype="bf16",
                                   out_dtype="f32", warp_specialized=True, persistent=True, cluster=1),
    "cluster2-persistent-128x256": dict(atoms="sm90a", block_m=128, block_n=256, stages=4, group_m=8,
                                        warp_specialized=True, persistent=True, cluster=2),
}
OPCODES = ("HGMMA", "UTMALDG", "UTMASTG")


def cubins(M: int = 4096, N: int = 4096, K: int = 4096) -> dict[str, bytes]:
    """Each variant's CUBIN (compiled for sm_90a) by name."""
    out = {}
    for name, kw in VARIANTS.items():
        sched = fs.recipes.gemm(M, N, K, arch="sm_90a", **kw)
        out[name] = fs.compile(sched, arch="sm_90a").modules[0].cubin
    return out


_INSN = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def count_opcodes(sass: str) -> dict[str, int]:
    """How many instructions of each of ``OPCODES`` a ``cuobjdump --dump-sass`` listing holds
    (lines such as ``/*0a30*/  HGMMA.64x256x16.F32 R24, gdesc[UR4], R24 ;``)."""
    counts = dict.fromkeys(OPCODES, 0)
    for line in sass.splitlines():
        m = _INSN.match(line)
        if m and m.group(1) in counts:
            counts[m.group(1)] += 1
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="directory for the CUBINs")
    args = p.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="firesched-sass-")
    os.makedirs(out, exist_ok=True)
    tool = shutil.which("cuobjdump")
    bad = 0
    for name, blob in cubins().items():
        path = os.path.join(out, name + ".cubin")
        with open(path, "wb") as f:
            f.write(blob)
        if tool is None:
            print(f"{name}: {len(blob)} bytes -> {path} (no cuobjdump on the PATH: SASS not checked)")
            continue
        sass = subprocess.run([tool, "--dump-sass", path], capture_output=True, text=True, check=True).stdout
        counts = count_opcodes(sass)
        bad += counts["HGMMA"] == 0
        print(f"{name}: " + ", ".join(f"{k} x{v}" for k, v in counts.items()), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
