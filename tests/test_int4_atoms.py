"""The int4 weight-only GEMM foundation: the ``convert`` atoms (int4 dequantisation, group
scales) and the host-side quantisation helpers.  CPU only; ``tests/gpu/test_int4_atoms_gpu.py``
runs the same atoms on a device.

Three independent witnesses are checked against each record's numpy semantics, bit for bit:

* what the atoms *mean*, written here from the definition: destination value ``v`` is nibble
  ``ORDER[v]`` of the source word, converted exactly (u4: ``n``; u4z8: ``n - 8``; i4: the two's
  complement value);
* what the PTX templates *do*, run by a small stepper that executes ``mov``, ``shr``, ``lop3``
  (its truth table, bit by bit) and the f16x2 / bf16x2 ``sub``, ``mul`` and ``fma`` (exact
  rational arithmetic rounded once to nearest even, by a rounding written here);
* the interpreter running the one-atom microkernel, and NVRTC compiling it with no spills.
"""

from __future__ import annotations

import re
from fractions import Fraction

import attrs
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firesched import dtypes as dt
from firesched import ir
from firesched.cuda import printer as cuda
from firesched.cuda.nvrtc import compile_cuda
from firesched.errors import InternalError
from firesched.hardware import SM70, SM80, SM90A, catalog
from firesched.hardware.atoms import convert as cv
from firesched.hardware.atoms.base import CONVERT, asm_node
from firesched.ir.expr import binop
from firesched.quant import dequantize_int4, num_groups, quantize_int4
from firesched.simulate.interp import run_program
from firesched.testing.microkernel import UNDER_TEST, atom_program, random_inputs
from firesched.testing.reference import w4a16_reference

DEQUANT = cv.DEQUANT_ATOMS
SCALES = cv.SCALE_ATOMS
RNG = np.random.default_rng(20261124)

# Destination value v holds source nibble ORDER[v]: register j = (nibble j, nibble j + 4).
ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def _params(atoms):
    return [pytest.param(a, id=a.name) for a in atoms]


def _form(atom) -> str:
    return re.fullmatch(r"dequant_(u4|u4z8|i4)_(f16|bf16)", atom.name).group(1)


def _value(form: str, n: int) -> int:
    """The weight a nibble ``n`` (0..15) stands for."""
    if form == "u4":
        return n
    if form == "u4z8":
        return n - 8
    return n - 16 if n >= 8 else n


def _half_bits(x: float, kind: str) -> int:
    t = np.float16 if kind == "f16" else ml_dtypes.bfloat16
    return int(np.array([x], dtype=t).view(np.uint16)[0])


def _reference_words(atom, word: int) -> list[int]:
    """The destination registers of ``atom`` on ``word``, from the definition."""
    form, kind = _form(atom), str(atom.dtype_of("dst"))
    nib = [(word >> (4 * i)) & 0xF for i in range(8)]
    halves = [_half_bits(float(_value(form, nib[ORDER[v]])), kind) for v in range(8)]
    return [halves[2 * j] | (halves[2 * j + 1] << 16) for j in range(4)]


def _exhaustive_words(rng, backgrounds: int = 3) -> np.ndarray:
    """Every nibble value in every position (on random other nibbles), 0, all ones, and random
    words."""
    words = [0, 0xFFFFFFFF, 0x76543210, 0xFEDCBA98, 0x88888888, 0x77777777]
    for _ in range(backgrounds):
        bg = int(rng.integers(0, 2 ** 32))
        for p in range(8):
            for n in range(16):
                words.append((bg & ~(0xF << (4 * p))) | (n << (4 * p)))
    words += [int(x) for x in rng.integers(0, 2 ** 32, size=512, dtype=np.uint64)]
    return np.array(words, dtype=np.uint64).astype(np.uint32)


# =========================================================================== the records

def test_catalog_lists_the_convert_table():
    assert set(cv.ATOMS) <= set(catalog.ALL_ATOMS)
    assert all(a.family == CONVERT and a.catalog == "convert" for a in cv.ATOMS)
    for a in cv.ATOMS:
        assert catalog.by_name(a.name) is a
        assert SM80.supports(a) and SM90A.supports(a) and not SM70.supports(a)
    assert {a.name for a in DEQUANT} == {f"dequant_{f}_{t}" for f in ("u4", "u4z8", "i4") for t in ("f16", "bf16")}


@pytest.mark.parametrize("atom", _params(DEQUANT))
def test_dequant_record_shape(atom):
    src, dst = atom.operand("src"), atom.operand("dst")
    assert (src.regs, src.values, dst.regs, dst.values) == (1, 8, 4, 8)
    assert atom.dtype_of("src") == (dt.i4 if _form(atom) == "i4" else dt.u4)
    assert atom.dtype_of("dst") in (dt.f16, dt.bf16)
    assert (atom.kind, atom.src_memory, atom.dst_memory, atom.shape) == ("Move", "RF", "RF", (1, 8))


@pytest.mark.parametrize("atom", _params(DEQUANT))
def test_value_order_is_data_on_the_layouts(atom):
    """The destination TV layout puts value h + 2j at tile column 4h + j, the source's is the
    identity: so value v holds nibble ORDER[v], and ``arrange_for`` inverts it."""
    src, dst = atom.operand("src").tv, atom.operand("dst").tv
    assert [src.coord(0, i) for i in range(8)] == [(0, i) for i in range(8)]
    assert [dst.coord(0, v) for v in range(8)] == [(0, ORDER[v]) for v in range(8)]
    assert cv.source_index(atom).tolist() == ORDER
    vals = RNG.integers(0, 100, size=(5, 8))
    arranged = cv.arrange_for(atom, vals)
    np.testing.assert_array_equal(arranged[:, ORDER], vals)
    with pytest.raises(ValueError, match="converts 8 at a time"):
        cv.arrange_for(atom, np.zeros(6))
    with pytest.raises(ValueError, match="no dequantisation atom"):
        cv.source_index(cv.scale_f16x2)


# =========================================================================== semantics

@pytest.mark.parametrize("atom", _params(DEQUANT))
def test_dequant_semantics_match_the_definition(atom):
    """All 16 values in every nibble position, and random words, bit for bit."""
    words = _exhaustive_words(RNG)
    got = atom.semantics(words[:, None])
    assert got.shape == (words.size, 4) and got.dtype == np.uint32
    want = np.array([_reference_words(atom, int(w)) for w in words], dtype=np.uint32)
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, [(hex(words[i]), [hex(x) for x in got[i]], [hex(x) for x in want[i]]) for i in bad[:4]]


@pytest.mark.parametrize("atom", _params(DEQUANT))
def test_dequant_is_the_tile_converted_in_place(atom):
    """Through the TV layouts: gather the destination registers' values into the 1 x 8 tile and
    it is the source tile's weights, converted."""
    form = _form(atom)
    src_vals = RNG.integers(-8, 8, size=(64, 8)) if form == "i4" else RNG.integers(0, 16, size=(64, 8))
    src_dt, dst_dt = atom.dtype_of("src"), atom.dtype_of("dst")
    words = cv.to_words(src_vals.astype(src_dt.np), src_dt)
    out = cv.from_words(atom.semantics(words), dst_dt)                   # [64, 8] in value order
    tile_in = np.stack([atom.operand("src").tv.gather(v[None, :]) for v in src_vals])
    tile_out = np.stack([atom.operand("dst").tv.gather(v[None, :]) for v in out])
    expect = tile_in.astype(np.float64) - (8 if form == "u4z8" else 0)
    np.testing.assert_array_equal(tile_out.astype(np.float64), expect)


@pytest.mark.parametrize("atom", _params(cv.ATOMS))
def test_semantics_stack_along_any_leading_axes(atom):
    ins = [o for o in atom.operands if o.role == "in"]
    words = [RNG.integers(0, 2 ** 32, size=(3, 5, o.regs), dtype=np.uint64).astype(np.uint32) for o in ins]
    stacked = atom.semantics(*words)
    one_by_one = np.stack([np.stack([atom.semantics(*(w[i, j] for w in words)) for j in range(5)])
                           for i in range(3)])
    assert stacked.dtype == one_by_one.dtype == np.uint32
    np.testing.assert_array_equal(stacked, one_by_one)


def test_words_round_trip():
    for d, lo, hi in ((dt.u4, 0, 16), (dt.i4, -8, 8)):
        v = RNG.integers(lo, hi, size=(7, 16)).astype(d.np)
        w = cv.to_words(v, d)
        assert w.shape == (7, 2) and w.dtype == np.uint32
        np.testing.assert_array_equal(cv.from_words(w, d), v)
        # the same nibbles dtypes.pack writes (low nibble first), read as little-endian words
        np.testing.assert_array_equal(dt.pack(d, v).view("<u4"), w)
    for d in (dt.f16, dt.bf16):
        v = RNG.standard_normal((4, 6)).astype(d.np)
        np.testing.assert_array_equal(cv.from_words(cv.to_words(v, d), d).view(np.uint16), v.view(np.uint16))
    with pytest.raises(ValueError, match="whole 32-bit registers"):
        cv.to_words(np.zeros(3, np.float16), dt.f16)


# ----------------------------------------------------------------- exact rounding, from scratch

_FMT = {"f16": (10, 5), "bf16": (7, 8)}      # (mantissa bits, exponent bits)


def _decode(bits: int, kind: str):
    """A 16-bit pattern as a Fraction (with its sign, for zeros), or None for inf / NaN."""
    mb, eb = _FMT[kind]
    bias = (1 << (eb - 1)) - 1
    sign = bits >> 15
    e = (bits >> mb) & ((1 << eb) - 1)
    m = bits & ((1 << mb) - 1)
    if e == (1 << eb) - 1:
        return None, sign
    mag = Fraction(m, 1 << mb) * Fraction(2) ** (1 - bias) if e == 0 else \
        Fraction((1 << mb) + m, 1 << mb) * Fraction(2) ** (e - bias)
    return (-mag if sign else mag), sign


def _encode(x: Fraction, kind: str, zero_sign: int = 0) -> int:
    """``x`` rounded to nearest (ties to even) in ``kind``: subnormals, overflow to infinity."""
    mb, eb = _FMT[kind]
    bias = (1 << (eb - 1)) - 1
    if x == 0:
        return zero_sign << 15
    sign = 1 if x < 0 else 0
    m = -x if x < 0 else x
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1
    e = max(e, 1 - bias)                               # below the normal range: subnormal ulp
    ulp = Fraction(2) ** (e - mb)
    q, r = divmod(m, ulp)
    n = int(q)
    if r > ulp / 2 or (r == ulp / 2 and n % 2):
        n += 1
    if n == 1 << (mb + 1):                             # rounded up into the next binade
        n, e = 1 << mb, e + 1
    if e > bias:
        return (sign << 15) | (((1 << eb) - 1) << mb)  # infinity
    if n < (1 << mb):
        return (sign << 15) | n                        # subnormal (or the largest subnormal)
    return (sign << 15) | ((e + bias) << mb) | (n - (1 << mb))


def _exact_fma(a: int, b: int, c: int, kind: str):
    """``a * b + c`` on 16-bit patterns, exactly rounded; None when an input is inf / NaN."""
    (fa, sa), (fb, sb), (fc, sc) = _decode(a, kind), _decode(b, kind), _decode(c, kind)
    if fa is None or fb is None or fc is None:
        return None
    p = fa * fb
    total = p + fc
    # an exact zero is -0 only when both addends are -0 (round to nearest)
    zero_sign = int(p == 0 and (sa ^ sb) == 1 and fc == 0 and sc == 1)
    return _encode(total, kind, zero_sign)


def test_exact_rounding_helper_agrees_with_numpy_conversions():
    """The rounding written above, on f64 values, against numpy / ml_dtypes (which convert one
    float64 to f16 and, through f32 here only for values f32 holds exactly, to bf16)."""
    xs = np.concatenate([RNG.standard_normal(300) * 10.0 ** RNG.integers(-9, 6, 300),
                         [0.5 + 2 ** -12, 65504.0, 65519.0, 65520.0, 1e-8, 2 ** -25, 3 * 2 ** -26]])
    for x in xs:
        with np.errstate(over="ignore"):
            want16 = int(np.array([x]).astype(np.float16).view(np.uint16)[0])
        assert _encode(Fraction(float(x)), "f16") == want16, x
        x32 = float(np.float32(x))
        assert _encode(Fraction(x32), "bf16") == _half_bits(x32, "bf16"), x32


# ----------------------------------------------------------------- the PTX stepper

def _lop3_bits(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for k in range(32):
        idx = (((a >> k) & 1) << 2) | (((b >> k) & 1) << 1) | ((c >> k) & 1)
        out |= ((lut >> idx) & 1) << k
    return out


def _half_op(name: str, kind: str, args: list[int]):
    """One half of an f16x2 / bf16x2 ``sub``, ``mul`` or ``fma``, exactly rounded."""
    if name == "fma":
        return _exact_fma(*args, kind)
    if name == "mul":                                     # a * b + (-0)
        return _exact_fma(args[0], args[1], 0x8000, kind)
    return _exact_fma(args[0], _half_bits(1.0, kind), args[1] ^ 0x8000, kind)   # a * 1 + (-b)


def _pairwise(name: str, kind: str, *words):
    halves = []
    for h in (0, 16):
        r = _half_op(name, kind, [(w >> h) & 0xFFFF for w in words])
        if r is None:
            return None
        halves.append(r)
    return halves[0] | (halves[1] << 16)


def _run_template(atom, inputs: dict[str, list[int]]) -> list[int] | None:
    """Execute ``atom``'s PTX on 32-bit words: ``inputs`` by operand name; returns the output
    operand's registers (None when an f16x2 input is inf or NaN: the Fraction rounding only
    handles finite values)."""
    out = next(o for o in atom.operands if o.role == "out")
    names = {o.name: [f"${o.name}[{i}]" for i in range(o.regs)] for o in atom.operands}
    env: dict[str, int] = {}
    for name, words in inputs.items():
        for i, w in enumerate(words):
            env[f"${name}[{i}]"] = int(w)

    def ref(tok: str) -> str:
        tok = tok.strip()
        m = re.fullmatch(r"\$(\w+)(\[\d+\])?", tok)
        if m:
            return tok if m.group(2) else names[m.group(1)][0]
        return tok

    def val(tok: str) -> int:
        tok = ref(tok)
        return int(tok, 0) if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", tok) else env[tok]

    body = atom.ptx.strip()
    if body.startswith("{"):
        body = body[1:-1]
    for stmt in (s.strip() for s in body.split(";")):
        if not stmt or stmt.startswith(".reg"):
            continue
        op, _, rest = stmt.partition(" ")
        args = [a.strip() for a in rest.split(",")]
        dst = ref(args[0])
        xs = [val(a) for a in args[1:]]
        if op == "mov.b32":
            r = xs[0]
        elif op == "shr.u32":
            r = xs[0] >> xs[1]
        elif op == "lop3.b32":
            r = _lop3_bits(*xs)
        else:
            m = re.fullmatch(r"(sub|mul|fma)\.rn\.(f16|bf16)x2", op)
            assert m, f"the stepper does not know {op!r}"
            r = _pairwise(m.group(1), m.group(2), *xs)
            if r is None:
                return None
        env[dst] = r & 0xFFFFFFFF
    return [env[f"${out.name}[{i}]"] for i in range(out.regs)]


def test_the_stepper_reads_what_asm_node_expands():
    """``$name[i]`` is register i of a group (asm_node), the whole group without an index."""
    atom = cv.dequant_u4_f16
    asm = asm_node(atom, {"dst": ["d0", "d1", "d2", "d3"], "src": ["s"]})
    assert "lop3.b32 %0," in asm.template and "lop3.b32 %3," in asm.template and "%4" in asm.template
    assert [c for c, _ in asm.outputs] == ["=r"] * 4 and asm.inputs == (("r", "s"),)
    with pytest.raises(KeyError, match=r"\$dst\[4\]; the group has 4 registers"):
        asm_node(attrs.evolve(atom, ptx="mov.b32 $dst[4], $src;"), {"dst": ["a", "b", "c", "d"], "src": ["s"]})


@pytest.mark.parametrize("atom", _params(DEQUANT))
def test_dequant_templates_compute_the_semantics(atom):
    """The PTX itself, stepped: every nibble value in every position and random words."""
    words = _exhaustive_words(RNG, backgrounds=1)[:300]
    want = atom.semantics(words[:, None])
    for w, expect in zip(words, want):
        got = _run_template(atom, {"src": [int(w)]})
        assert got == [int(x) for x in expect], (hex(int(w)), [hex(x) for x in got], [hex(x) for x in expect])


def _finite_halves(rng, kind: str, n: int) -> np.ndarray:
    """Random finite 16-bit patterns of every exponent (subnormals and zeros included)."""
    bits = rng.integers(0, 1 << 16, size=4 * n).astype(np.uint16)
    exp_all_ones = (0x7C00 if kind == "f16" else 0x7F80)
    return bits[(bits & exp_all_ones) != exp_all_ones][:n]


def _scale_cases(atom, rng, n: int = 400) -> list[np.ndarray]:
    """Per input operand, ``n`` words: random finite halves, products near a tie, exact
    cancellations (z = -round(q * s)) and moderate magnitudes."""
    kind = str(atom.dtype_of("d"))
    t = np.float16 if kind == "f16" else ml_dtypes.bfloat16
    add = len([o for o in atom.operands if o.role == "in"]) == 3
    halves = {name: _finite_halves(rng, kind, 2 * n) for name in ("q", "s", "z")}
    moderate = (rng.integers(-64, 65, size=(3, 2 * n)) / 16.0).astype(t).view(np.uint16)
    # 1.5 * (1 + k ulp) lands halfway between two values for odd k: ties to even
    ulp = 2.0 ** (-10 if kind == "f16" else -7)
    ties = (1.0 + rng.integers(0, 64, size=2 * n) * ulp).astype(t).view(np.uint16)
    q = np.concatenate([halves["q"][: n], moderate[0][: n // 2], ties[: n // 2]])
    s = np.concatenate([halves["s"][: n], moderate[1][: n // 2], np.full(n // 2, _half_bits(1.5, kind), np.uint16)])
    if add:
        with np.errstate(over="ignore"):
            prod = (q.view(t).astype(np.float64) * s.view(t).astype(np.float64)).astype(t)
        z = np.concatenate([halves["z"][: n], moderate[2][: n // 4], (-prod[n + n // 4:]).view(np.uint16)])
        z = z[: q.size]
    ins = [q, s] + ([z] if add else [])
    # pair neighbours into words: low half i, high half i + 1
    return [(x.astype(np.uint32) | (np.roll(x, 1).astype(np.uint32) << 16)) for x in ins]


@pytest.mark.parametrize("atom", _params(SCALES))
def test_scale_templates_and_semantics_round_once(atom):
    """Random finite halves (every exponent, subnormals), ties and cancellations: the semantics
    equal the stepped PTX with exact rational arithmetic rounded once to nearest even."""
    cases = _scale_cases(atom, RNG)
    names = [o.name for o in atom.operands if o.role == "in"]
    got = atom.semantics(*(c[:, None] for c in cases))[:, 0]
    for i in range(cases[0].size):
        ins = {n: [int(c[i])] for n, c in zip(names, cases)}
        want = _run_template(atom, ins)
        assert want is not None
        assert int(got[i]) == want[0], (atom.name, {n: hex(v[0]) for n, v in ins.items()}, hex(int(got[i])),
                                        hex(want[0]))


def test_fma_rounds_once_not_twice():
    """(1 + 2^-10)(1 - 2^-11) + 9 * 2^-24 = 1 + 2^-11 + 2^-24: just above the midpoint of 1 and
    1 + 2^-10, so it rounds up; rounding to f32 first would land on the midpoint and round to
    even, down to 1."""
    q, s, z = 0x3C01, 0x3BFF, 0x0009
    want = 0x3C01
    assert _run_template(cv.scale_add_f16x2, {"q": [q], "s": [s], "z": [z]}) == [want]
    got = cv.scale_add_f16x2.semantics(np.array([[q]], np.uint32), np.array([[s]], np.uint32),
                                       np.array([[z]], np.uint32))
    assert int(got[0, 0]) & 0xFFFF == want


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_scale_special_values(kind):
    t = np.float16 if kind == "f16" else ml_dtypes.bfloat16
    inf, nan, one, zero = (_half_bits(x, kind) for x in (np.inf, np.nan, 1.0, 0.0))
    nzero = 0x8000
    mul = cv.scale_f16x2 if kind == "f16" else cv.scale_bf16x2
    fma = cv.scale_add_f16x2 if kind == "f16" else cv.scale_add_bf16x2

    def w(lo, hi=None):
        return np.array([[lo | ((lo if hi is None else hi) << 16)]], np.uint32)

    def halves(x):
        x = int(np.asarray(x).reshape(-1)[0])
        return x & 0xFFFF, x >> 16

    assert halves(mul.semantics(w(inf), w(zero))) == (0x7FFF, 0x7FFF)          # inf * 0: canonical NaN
    assert halves(mul.semantics(w(nan), w(one))) == (0x7FFF, 0x7FFF)
    assert halves(mul.semantics(w(inf, nzero), w(one, one))) == (inf, nzero)
    assert halves(mul.semantics(w(zero, nzero), w(nzero, nzero))) == (nzero, zero)   # signs of zero products
    # -0 + -0 stays -0; x * 0 + -0 with a +0 product is +0; inf - inf is NaN
    assert halves(fma.semantics(w(nzero), w(one), w(nzero))) == (nzero, nzero)
    assert halves(fma.semantics(w(zero), w(one), w(nzero))) == (zero, zero)
    assert halves(fma.semantics(w(inf), w(one), w(inf | 0x8000))) == (0x7FFF, 0x7FFF)
    big = _half_bits(float(np.finfo(t).max) if kind == "f16" else float(ml_dtypes.finfo(t).max), kind)
    assert halves(mul.semantics(w(big), w(_half_bits(2.0, kind))))[0] == inf              # overflow


# =========================================================================== the interpreter

def _microkernel_inputs(atom) -> dict[str, np.ndarray]:
    """Inputs of the one-atom kernel where thread t's nibble p is (t + 3p) % 16 (threads 0..15)
    and (5t + p) % 16 (threads 16..31): every value in every position, twice."""
    t = np.arange(32)[:, None]
    p = np.arange(8)[None, :]
    nib = np.where(t < 16, (t + 3 * p) % 16, (5 * t + p) % 16)
    vals = np.array([[_value("i4" if _form(atom) == "i4" else "u4", int(n)) for n in row] for row in nib])
    return {"src": vals.astype(atom.dtype_of("src").np)}


@pytest.mark.parametrize("atom", _params(DEQUANT))
def test_interpreter_runs_the_microkernel_bit_exactly(atom):
    prog, _, expected = atom_program(atom)
    calls = [s for s in prog.kernels[0].body.body if isinstance(s, ir.AtomCall) and s.comment == UNDER_TEST]
    assert [c.atom for c in calls] == [atom]
    inputs = _microkernel_inputs(atom)
    got = run_program(prog, inputs)["out"]
    assert got.dtype == atom.dtype_of("dst").np and got.shape == (32, 8)
    words = cv.to_words(inputs["src"], atom.dtype_of("src"))
    want = np.array([_reference_words(atom, int(w)) for w in words[:, 0]], np.uint32)
    np.testing.assert_array_equal(cv.to_words(got, atom.dtype_of("dst")), want)
    np.testing.assert_array_equal(got.view(np.uint16), expected(inputs).view(np.uint16))


@pytest.mark.parametrize("atom", _params(SCALES))
def test_interpreter_runs_the_scale_microkernels(atom):
    prog, _, expected = atom_program(atom)
    for seed in range(3):
        inputs = random_inputs(atom, seed)
        if seed == 2:    # arbitrary finite bit patterns, not only multiples of 1/4
            kind = str(atom.dtype_of("d"))
            inputs = {k: _finite_halves(RNG, kind, v.size).reshape(v.shape).view(v.dtype) for k, v in inputs.items()}
        got = run_program(prog, inputs)["out"]
        np.testing.assert_array_equal(got.view(np.uint16), expected(inputs).view(np.uint16))


def _one_call_program(atom, src_dtype, dst_dtype, pred=1):
    """One warp: ld.global the source word, the atom (with ``pred``), st.global 16 bytes."""
    t = ir.tid(32)
    inp = ir.GlobalBuffer("src", src_dtype, (32, 8), (8, 1), "in")
    out = ir.GlobalBuffer("out", dst_dtype, (32, 8), (8, 1), "out")
    rs, rd = ir.RegBuffer("rs", src_dtype, 8), ir.RegBuffer("rd", dst_dtype, 8)
    ld, stg = catalog.copy_atom("GL", "RF", 4), catalog.copy_atom("RF", "GL", 16)
    body = [ir.AtomCall(ld, (("src", ir.MemRef(inp, t * 8)), ("dst", ir.RegRef(rs, 0))), 1, ""),
            ir.AtomCall(atom, (("dst", ir.RegRef(rd, 0)), ("src", ir.RegRef(rs, 0))), pred, ""),
            ir.AtomCall(stg, (("dst", ir.MemRef(out, t * 8)), ("src", ir.RegRef(rd, 0))), 1, "")]
    k = ir.Kernel("k", (inp, out), (1, 1, 1), 32, (), (rs, rd), ir.Seq(body))
    return ir.Program((k,), (inp,), out)


def test_interpreter_predication_and_reinterpretation():
    """A predicated-off thread keeps its (zero) registers; an i4 atom reads a u4 buffer's nibbles
    and its f16 result may land in a bf16-typed buffer, bits unchanged."""
    atom = cv.dequant_i4_f16
    t = ir.tid(32)
    prog = _one_call_program(atom, dt.u4, dt.bf16, pred=binop("==", t % 2, 0))
    vals = RNG.integers(0, 16, size=(32, 8))
    got = run_program(prog, {"src": vals.astype(dt.u4.np)})["out"]
    words = cv.to_words(vals.astype(dt.u4.np), dt.u4)
    want = atom.semantics(words)
    want[1::2] = 0
    np.testing.assert_array_equal(cv.to_words(got, dt.bf16), want)
    # the CUDA printer takes the same program (compiled below for every atom's own microkernel)
    assert "lop3.b32" in cuda.emit(prog)


def test_interpreter_rejects_a_register_buffer_of_the_wrong_width():
    prog = _one_call_program(cv.dequant_u4_f16, dt.u4, dt.f32)
    with pytest.raises(InternalError, match="wants f16 registers"):
        run_program(prog, {"src": np.zeros((32, 8), dt.u4.np)})


# =========================================================================== NVRTC

@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("atom", _params(cv.ATOMS))
def test_microkernel_compiles_without_spills(atom, arch):
    prog = atom_program(atom)[0]
    mod = compile_cuda(cuda.emit(prog), arch=arch, use_cache=False)
    res = mod.resources_of(prog.kernels[0].name)
    assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0 and res.stack_frame_bytes == 0, res
    # the conversion stays integer and half-precision work: no per-element int -> float cvt
    if atom in DEQUANT:
        assert "lop3.b32" in mod.ptx and "cvt.rn.f16.s32" not in mod.ptx and "cvt.rn.bf16.s32" not in mod.ptx


# =========================================================================== quantisation

def _weights(draw, k, n, lo=1e-3, hi=1e3):
    mag = draw(st.lists(st.floats(lo, hi), min_size=k * n, max_size=k * n))
    sign = draw(st.lists(st.sampled_from([-1.0, 0.0, 1.0]), min_size=k * n, max_size=k * n))
    return (np.array(mag) * np.array(sign)).reshape(k, n)


@st.composite
def quant_cases(draw):
    group = draw(st.sampled_from([32, 64, 128, None]))
    k = draw(st.integers(1, 300))
    n = draw(st.integers(1, 4))
    w = _weights(draw, k, n)
    return w, group, draw(st.booleans()), draw(st.booleans()), draw(st.sampled_from(["f32", "f16", "bf16"]))


@settings(max_examples=60, deadline=None)
@given(quant_cases())
def test_quantize_round_trip(case):
    """Codes in range, one scale (and zero) per group of rows (a partial last group when the
    group size does not divide K), and each weight within half a step of its dequantised value
    (a little more where the scale was rounded to f16 / bf16)."""
    w, group, signed, zp, sdt = case
    K, N = w.shape
    q, s, z = quantize_int4(w, group, signed=signed, zero_point=zp, scale_dtype=sdt)
    G = num_groups(K, group)
    assert G == (1 if group is None else -(-K // group))
    assert q.shape == (K, N) and q.dtype == (dt.i4.np if signed else dt.u4.np)
    assert s.shape == (G, N) and s.dtype == dt.dtype(sdt).np
    assert (z is None) == (not zp)
    if zp:
        assert z.shape == (G, N) and z.dtype == q.dtype
    codes = q.astype(np.int64)
    assert codes.min() >= (-8 if signed else 0) and codes.max() <= (7 if signed else 15)
    back = dequantize_int4(q, s, z, group)
    assert back.shape == (K, N) and back.dtype == np.float32
    rows = np.arange(K) // (K if group is None else group)
    step = s.astype(np.float64)[rows]
    slack = 0.5 if sdt == "f32" else 0.6
    err = np.abs(back.astype(np.float64) - w)
    assert np.all(err <= slack * step + 1e-6 * np.abs(w) + 1e-30), float((err - slack * step).max())
    # each group's scale comes from its own rows only (the last one too)
    gs = K if group is None else group
    for g in range(G):
        part = w[g * gs:(g + 1) * gs]
        want = (part.max(0).clip(0) - part.min(0).clip(None, 0)) / 15 if zp else np.abs(part).max(0) / 7
        np.testing.assert_array_equal(s[g], want.astype(s.dtype))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_representable_weights_round_trip_exactly(data):
    """Weights that are (code - zero) * 2^e, with each group holding the extreme codes, come back
    exactly: same scale, same codes."""
    group = data.draw(st.sampled_from([32, 64, 128]))
    G, N = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    K = G * group - data.draw(st.integers(0, group - 2))      # a partial last group of >= 2 rows
    e = data.draw(st.integers(-10, 10))
    codes = np.array(data.draw(st.lists(st.integers(-7, 7), min_size=K * N, max_size=K * N))).reshape(K, N)
    for g in range(G):           # the extremes in every group: max |w| is exactly 7 * 2^e
        codes[g * group, :] = 7
        codes[g * group + 1, :] = -7
    w = codes * 2.0 ** e
    for signed in (True, False):
        q, s, z = quantize_int4(w, group, signed=signed)
        assert z is None and np.all(s == np.float32(2.0 ** e * 1.0))
        np.testing.assert_array_equal(q.astype(np.int64), codes + (0 if signed else 8))
        np.testing.assert_array_equal(dequantize_int4(q, s, None, group), w)


def test_unsigned_codes_are_the_signed_ones_plus_8():
    """Zero point 8 is offset binary: u4 codes = i4 codes + 8, which is why ``dequant_u4z8`` on the
    unsigned codes equals ``dequant_i4`` on the signed ones."""
    w = RNG.standard_normal((256, 16))
    qi, si, _ = quantize_int4(w, 64, signed=True)
    qu, su, _ = quantize_int4(w, 64, signed=False)
    np.testing.assert_array_equal(si, su)
    np.testing.assert_array_equal(qu.astype(np.int64), qi.astype(np.int64) + 8)
    for kind in ("f16", "bf16"):
        zi = catalog.by_name(f"dequant_i4_{kind}").semantics(cv.to_words(qi[:8].T, dt.i4))
        zu = catalog.by_name(f"dequant_u4z8_{kind}").semantics(cv.to_words(qu[:8].T, dt.u4))
        np.testing.assert_array_equal(zi, zu)


def test_all_zero_groups_and_tiny_weights():
    w = np.zeros((64, 3))
    w[32:, 1] = 1e-30                          # below any f16 scale: rounds to a zero scale
    for sdt in ("f32", "f16", "bf16"):
        q, s, z = quantize_int4(w, 32, signed=False, zero_point=True, scale_dtype=sdt)
        back = dequantize_int4(q, s, z, 32)
        assert np.isfinite(back).all() and np.all(np.abs(back) <= 1e-29)
        assert s[0, 0] == 0 and np.all(q[:32, 0].astype(int) == z[0, 0].astype(int))


def t_d(kind: str) -> dt.DType:
    return dt.f16 if kind == "f16" else dt.bf16


def test_the_atoms_dequantise_quantized_weights():
    """The pieces together: codes of 8 consecutive k of a column, arranged for the atom's value
    order and packed into a word; dequant then scale (with the zero point folded into z) give the
    reference's weights to within f16 / bf16 rounding."""
    w = RNG.standard_normal((128, 8))
    for signed, zp in ((True, False), (False, False), (False, True)):
        q, s, z = quantize_int4(w, 32, signed=signed, zero_point=zp, scale_dtype="f16")
        ref = dequantize_int4(q, s, z, 32)
        for kind, t in (("f16", np.float16), ("bf16", ml_dtypes.bfloat16)):
            form = "i4" if signed else "u4"
            atom = catalog.by_name(f"dequant_{form}_{kind}")
            codes = q.T.reshape(8, 16, 8)                       # [n, k // 8, 8 consecutive k]
            words = cv.to_words(cv.arrange_for(atom, codes), dt.i4 if signed else dt.u4)    # [8, 16, 1]
            halves = cv.from_words(atom.semantics(words), atom.dtype_of("dst"))   # value order = k order
            scale = s.astype(t)[np.arange(128) // 32].T.reshape(8, 16, 8)
            if zp or not signed:
                zero = (z.astype(np.float64) if zp else np.full(s.shape, 8.0))[np.arange(128) // 32].T.reshape(8, 16, 8)
                offset = (-zero * scale.astype(np.float64)).astype(t)
                out = cv.scale_add_f16x2 if kind == "f16" else cv.scale_add_bf16x2
                got = cv.from_words(out.semantics(cv.to_words(halves, t_d(kind)), cv.to_words(scale, t_d(kind)),
                                                  cv.to_words(offset, t_d(kind))), t_d(kind))
            else:
                out = cv.scale_f16x2 if kind == "f16" else cv.scale_bf16x2
                got = cv.from_words(out.semantics(cv.to_words(halves, t_d(kind)), cv.to_words(scale, t_d(kind))),
                                    t_d(kind))
            want = ref.T.reshape(8, 16, 8)
            # |q - zero| <= 15 and three roundings (scale to bf16, product, offset) of half an ulp
            tol = 32 * 2.0 ** -(11 if kind == "f16" else 8) * np.abs(s.astype(np.float64)).max()
            np.testing.assert_allclose(got.astype(np.float64), want, atol=tol, rtol=0)


def test_w4a16_reference_is_a_matmul_with_dequantised_weights():
    a = RNG.standard_normal((5, 96)).astype(np.float16)
    w = RNG.standard_normal((96, 7))
    q, s, z = quantize_int4(w, 32, signed=False, zero_point=True)
    c = w4a16_reference(a, q, s, z, 32)
    assert c.shape == (5, 7) and c.dtype == np.float32
    np.testing.assert_allclose(c, a.astype(np.float64) @ dequantize_int4(q, s, z, 32).astype(np.float64), rtol=1e-6)
    with pytest.raises(ValueError, match=r"a has shape \(5, 95\).*K = 96"):
        w4a16_reference(a[:, :95], q, s, z, 32)


@pytest.mark.parametrize("kwargs, match", [
    (dict(group_size=48), r"group_size=48 is not supported; allowed: 32, 64, 128 or None"),
    (dict(group_size=0), r"group_size=0 is not supported"),
    (dict(group_size=True), r"group_size=True"),
    (dict(signed="yes"), r"signed='yes'; allowed: True"),
    (dict(zero_point=1), r"zero_point=1; allowed: True"),
    (dict(scale_dtype="f8e4m3"), r"scale_dtype='f8e4m3'; allowed: f32, f16, bf16"),
])
def test_quantize_errors_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize_int4(np.ones((64, 2)), **kwargs)


def test_quantize_rejects_bad_weights():
    with pytest.raises(ValueError, match=r"w has shape \(64,\); it must be 2-D \(K, N\)"):
        quantize_int4(np.ones(64))
    with pytest.raises(ValueError, match="infinite or NaN"):
        quantize_int4(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="overflows f16"):
        quantize_int4(np.full((32, 1), 1e6), 32, scale_dtype="f16")


def test_dequantize_errors():
    q, s, z = quantize_int4(RNG.standard_normal((64, 3)), 32)
    with pytest.raises(ValueError, match=r"scales has shape \(2, 3\); 64 rows in groups of 64 .* need \(1, 3\)"):
        dequantize_int4(q, s, None, 64)
    with pytest.raises(ValueError, match="pass zeros= explicitly"):
        dequantize_int4(q.astype(np.int8), s, None, 32)
    with pytest.raises(ValueError, match=r"zeros has shape \(1, 3\)"):
        dequantize_int4(q, s, np.zeros((1, 3)), 32)


def test_quantize_takes_torch_tensors():
    torch = pytest.importorskip("torch")
    w = RNG.standard_normal((64, 4)).astype(np.float32)
    a = quantize_int4(torch.from_numpy(w), 32)
    b = quantize_int4(w, 32)
    np.testing.assert_array_equal(a[0].astype(int), b[0].astype(int))
    np.testing.assert_array_equal(a[1], b[1])
