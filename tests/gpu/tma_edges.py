"""TMA boxes at the edges of their tensor, run on a Hopper GPU one case per process.

A TMA fault ("an illegal instruction was encountered") poisons the CUDA context of the process
for every later launch, so each case runs in a fresh interpreter::

    python tests/gpu/tma_edges.py                 # every case, a table of outcomes
    python tests/gpu/tma_edges.py load f16 70 39  # one case: exit 0 correct, 1 wrong data, 2 fault

The programs are ``firesched.testing.microkernel``'s TMA load / store kernels.  Coordinates the
microkernels refuse (a box that does not start on a 16-byte boundary of the row) are patched
into the IR after building, so that the fault itself can be observed; the expected data are
computed here with numpy.
"""

from __future__ import annotations

import os
import subprocess
import sys

import attrs
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

#: (kind, dtype, shape, box, swizzle, coords): the cases an H100 was asked about
CASES = [
    ("load", "f16", (40, 72), (16, 64), 128, (16, 32)),
    ("load", "f16", (40, 72), (16, 64), 128, (-8, -3)),
    ("load", "f16", (40, 72), (16, 64), 128, (70, 39)),
    ("load", "f16", (40, 72), (16, 64), 128, (64, 39)),
    ("load", "f16", (40, 72), (16, 64), 0, (70, 39)),
    ("load", "f16", (40, 72), (16, 64), 0, (64, 39)),
    ("load", "f16", (40, 72), (16, 16), 32, (4, 0)),
    ("load", "f16", (40, 72), (16, 16), 32, (8, 0)),
    ("load", "u8", (40, 80), (16, 64), 64, (-4, 36)),
    ("load", "u8", (40, 80), (16, 64), 64, (-16, 36)),
    ("load", "bf16", (40, 72), (8, 16), 32, (-4, 36)),
    ("load", "bf16", (40, 72), (8, 16), 32, (-8, 36)),
    ("load", "f32", (40, 72), (8, 32), 128, (-4, 36)),
    ("load", "f32", (40, 72), (8, 32), 128, (-2, 36)),
    ("store", "f16", (40, 72), (16, 64), 128, (16, 32)),
    ("store", "f16", (40, 72), (16, 64), 128, (-8, -4)),
    ("store", "f16", (40, 72), (16, 64), 128, (-8, 0)),
    ("store", "f16", (40, 72), (16, 64), 128, (0, -4)),
    ("store", "f16", (40, 72), (16, 64), 128, (56, 30)),
    ("store", "f16", (40, 72), (16, 64), 128, (60, 30)),
    ("store", "f16", (40, 72), (16, 64), 0, (-8, -4)),
    ("store", "f16", (40, 72), (16, 16), 32, (-8, -4)),
]


def _patched(kind, dtype, shape, box, swizzle, coords):
    """The microkernel with its TMA coordinates replaced by ``coords`` (unchecked)."""
    from firesched import ir
    from firesched.testing import microkernel as mk

    build = mk.tma_load_program if kind == "load" else mk.tma_store_program
    program, inputs, _ = build(dtype, shape=shape, box=box, swizzle=swizzle, coords=(0, 0))

    def fix(s):
        if isinstance(s, ir.Seq):
            return ir.Seq(tuple(fix(x) for x in s.body))
        if isinstance(s, ir.If):
            return attrs.evolve(s, then=fix(s.then))
        if isinstance(s, ir.For):
            return attrs.evolve(s, body=fix(s.body))
        if isinstance(s, ir.AtomCall) and s.atom.name in ("tma_load_2d", "tma_store_2d"):
            args = tuple((n, ir.Scalar(coords[0]) if n == "c0" else ir.Scalar(coords[1]) if n == "c1" else v)
                         for n, v in s.args)
            return attrs.evolve(s, args=args)
        return s

    k = program.kernels[0]
    return attrs.evolve(program, kernels=(attrs.evolve(k, body=fix(k.body)),)), inputs


def expected(kind, dtype, shape, box, coords, inputs):
    """numpy: the box of x at (column, row) zero-filled outside (load); the tile written into a
    zero tensor, dropping what falls outside (store)."""
    br, bc = box
    c0, c1 = coords
    if kind == "load":
        x = np.asarray(inputs["x"])
        out = np.zeros((br, bc), x.dtype)
        for i in range(br):
            for j in range(bc):
                if 0 <= c1 + i < shape[0] and 0 <= c0 + j < shape[1]:
                    out[i, j] = x[c1 + i, c0 + j]
        return out
    t = np.asarray(inputs["tile"])
    out = np.zeros(shape, t.dtype)
    for i in range(br):
        for j in range(bc):
            if 0 <= c1 + i < shape[0] and 0 <= c0 + j < shape[1]:
                out[c1 + i, c0 + j] = t[i, j]
    return out


def run_case(kind, dtype, shape, box, swizzle, coords) -> int:
    """0: the GPU's data match numpy; 1: they do not; 2: the launch failed."""
    sys.path.insert(0, HERE)
    from test_sm90a_gpu import run_gpu

    program, inputs = _patched(kind, dtype, shape, box, swizzle, coords)
    try:
        got = run_gpu(program, inputs)
    except Exception as e:  # the fault surfaces at the launch or the synchronize
        print(f"fault: {type(e).__name__}: {e}")
        return 2
    want = expected(kind, dtype, shape, box, coords, inputs)
    ok = np.array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))
    print("correct" if ok else "wrong data")
    return 0 if ok else 1


def in_subprocess(case, timeout: float = 120) -> tuple[int, str]:
    """Run one case in a fresh interpreter: (exit code, its last output line)."""
    kind, dtype, shape, box, swizzle, coords = case
    cmd = [sys.executable, os.path.abspath(__file__), kind, dtype, *map(str, shape), *map(str, box), str(swizzle),
           *map(str, coords)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    lines = (r.stdout + r.stderr).strip().splitlines()
    return r.returncode, lines[-1] if lines else ""


def main(argv) -> int:
    if argv:
        kind, dtype, r, c, br, bc, sw, c0, c1 = argv
        return run_case(kind, dtype, (int(r), int(c)), (int(br), int(bc)), int(sw), (int(c0), int(c1)))
    worst = 0
    for case in CASES:
        rc, last = in_subprocess(case)
        eb = {"f16": 2, "bf16": 2, "u8": 1, "f32": 4}[case[1]]
        aligned = (case[5][0] * eb) % 16 == 0
        print(f"{case[0]:5s} {case[1]:4s} box {case[3]} swizzle {case[4]:3d} at {str(case[5]):10s} "
              f"column byte {case[5][0] * eb:5d} ({'aligned' if aligned else 'MISALIGNED'}): rc {rc} {last}",
              flush=True)
        worst = max(worst, rc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
