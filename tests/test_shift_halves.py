"""``convert.shift_halves_b16x8``: eight 16-bit values that start anywhere, from the two aligned
16-byte vectors holding them (an operand along the row of an aligned window).

Its numpy semantics against the definition, its PTX stepped instruction by instruction against
the semantics for every shift and random words, and the interpreter running its one-atom
microkernel (lane ``l`` shifts by ``l``) bit for bit.  ``tests/gpu/test_int4_atoms_gpu.py`` runs
the same microkernel on the GPU."""

from __future__ import annotations

import re

import numpy as np
import pytest

from firesched.hardware.atoms import catalog
from firesched.hardware.atoms import convert as cv
from firesched.simulate.interp import run_program
from firesched.testing.microkernel import atom_program

ATOM = cv.shift_halves_b16x8
RNG = np.random.default_rng(5)


def _halves(words: np.ndarray) -> np.ndarray:
    return np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(*words.shape[:-1], -1)


def test_the_record():
    assert catalog.by_name("shift_halves_b16x8") is ATOM and ATOM in cv.SHIFT_ATOMS
    assert [o.name for o in ATOM.operands] == ["d", "lo", "hi", "q"]
    assert ATOM.operand("q").tv is None


@pytest.mark.parametrize("q", range(16))
def test_semantics_are_the_definition(q):
    lo = RNG.integers(0, 2 ** 32, size=(50, 4), dtype=np.uint64).astype(np.uint32)
    hi = RNG.integers(0, 2 ** 32, size=(50, 4), dtype=np.uint64).astype(np.uint32)
    got = ATOM.semantics(lo, hi, np.full((50, 1), q))
    want = np.concatenate([_halves(lo), _halves(hi)], axis=-1)[:, q % 8: q % 8 + 8]
    np.testing.assert_array_equal(_halves(got), want)


def _step(ptx: str, env: dict[str, int]) -> dict[str, int]:
    """Run the atom's PTX (and, setp.ne, mul.lo, add, selp, prmt on 32-bit words)."""
    body = ptx.strip()[1:-1]
    for stmt in (s.strip() for s in body.split(";")):
        if not stmt or stmt.startswith(".reg"):
            continue
        op, _, rest = stmt.partition(" ")
        args = [a.strip() for a in rest.split(",")]

        def val(tok):
            return int(tok, 0) if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", tok) else env[tok]

        if op == "and.b32":
            r = val(args[1]) & val(args[2])
        elif op == "setp.ne.b32":
            r = int(val(args[1]) != val(args[2]))
        elif op == "mul.lo.u32":
            r = val(args[1]) * val(args[2])
        elif op == "add.u32":
            r = val(args[1]) + val(args[2])
        elif op == "selp.b32":
            r = val(args[1]) if env[args[3]] else val(args[2])
        elif op == "prmt.b32":
            a, b, sel = val(args[1]), val(args[2]), val(args[3])
            data = a | (b << 32)
            r = 0
            for i in range(4):
                byte = (sel >> (4 * i)) & 7        # the default mode (no sign replication asked)
                r |= ((data >> (8 * byte)) & 0xFF) << (8 * i)
        else:
            raise AssertionError(f"the stepper does not know {op!r}")
        env[args[0]] = r & 0xFFFFFFFF
    return env


@pytest.mark.parametrize("q", range(8))
def test_the_ptx_computes_the_semantics(q):
    for _ in range(20):
        lo = RNG.integers(0, 2 ** 32, size=4, dtype=np.uint64).astype(np.uint32)
        hi = RNG.integers(0, 2 ** 32, size=4, dtype=np.uint64).astype(np.uint32)
        env = {f"$lo[{i}]": int(lo[i]) for i in range(4)} | {f"$hi[{i}]": int(hi[i]) for i in range(4)}
        env["$q"] = q
        env = _step(ATOM.ptx, env)
        got = [env[f"$d[{i}]"] for i in range(4)]
        want = ATOM.semantics(lo[None], hi[None], np.array([[q]]))[0]
        assert got == [int(x) for x in want], (q, [hex(x) for x in got], [hex(int(x)) for x in want])


def test_the_interpreter_runs_the_microkernel_bit_exactly():
    prog, inputs, expected = atom_program(ATOM)
    got = run_program(prog, dict(inputs))["out"]
    np.testing.assert_array_equal(got.view(np.uint16), expected(inputs).view(np.uint16))
    # lane l shifts by l mod 8: lanes 0 and 8 take the same values of their own inputs
    lo, hi = inputs["lo"].view(np.uint16), inputs["hi"].view(np.uint16)
    for lane in (0, 3, 7, 8, 13):
        q = lane % 8
        np.testing.assert_array_equal(got.view(np.uint16)[lane], np.concatenate([lo[lane], hi[lane]])[q:q + 8])
