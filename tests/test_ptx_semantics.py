"""What the emitted PTX and the CUDA prelude *mean*, checked without golden snapshots.

Golden files (``test_golden.py``) only say that the text did not change; ``--update-golden``
re-blesses any change.  These tests state the facts the text must keep, from the PTX ISA and
the C/CUDA semantics, and check them on the templates of the atom tables, on the prelude and on
the CUDA printed for real schedules:

* the prelude's conversion helpers, *run* on the CPU by a small C interpreter (``cmini``) whose
  ``cvt`` follows the ISA's rounding modifiers, against numpy / ml_dtypes conversions; the wgmma
  descriptor helper against the ISA's bit layout;
* descriptor bit fields (``hardware.descriptors``) against the ISA's "Matrix Descriptor Format";
* instruction templates: operand order, shapes and types spelled in the names, immediates, the
  ``try_wait`` spin loop and the wgmma ``scale-d`` predicate executed by a tiny PTX stepper;
* printed kernels: every loop header against the IR's loop extents, every asynchronous
  ``arrive``/``commit`` with its ``wait``, every cluster barrier arrival with its wait, each
  descriptor argument against the ISA's swizzle-mode code.

Expected values are written here from the ISA / C; nothing is derived from the code under test.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter

import cmini
import ml_dtypes
import numpy as np
import pytest

import firesched as fs
from firesched import ir, ops
from firesched.cuda.printer import PRELUDE, PRELUDE_SM90
from firesched.hardware import catalog, sm90a
from firesched.hardware import descriptors as desc

RNG = np.random.default_rng(20261123)

# =========================================================================== the prelude, executed


@pytest.fixture(scope="module", params=[750, 800, 900], ids=lambda a: f"arch{a}")
def prelude(request):
    """The prelude as compiled for one ``__CUDA_ARCH__`` (its bf16 helper has two branches)."""
    return cmini.Program(PRELUDE + PRELUDE_SM90, request.param)


@pytest.fixture(scope="module")
def prelude90():
    return cmini.Program(PRELUDE + PRELUDE_SM90, 900)


def _f32_samples(n: int = 400) -> np.ndarray:
    """Normal and subnormal floats of every magnitude, both signs, zeros, infinities, NaN, and
    values exactly halfway between neighbouring f16 / bf16 numbers (where rounding modes differ)."""
    bits = RNG.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    f16 = RNG.integers(0, 0x7C00, size=60).astype(np.uint16).view(np.float16).astype(np.float64)
    halfway_f16 = (f16 + np.nextafter(f16.astype(np.float16), np.float16(np.inf)).astype(np.float64)) / 2
    bf = RNG.integers(0, 0x7F80, size=60).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    halfway_bf = (bf + np.nextafter(bf.astype(ml_dtypes.bfloat16),
                                    ml_dtypes.bfloat16(np.inf)).astype(np.float64)) / 2
    special = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 70000.0, 1e-8, 6e-8, 3.3, -2.5,
                        np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1.1754944e-38])
    with np.errstate(over="ignore", invalid="ignore"):
        return np.concatenate([x, halfway_f16, -halfway_f16, halfway_bf, -halfway_bf, special]).astype(np.float32)


def _same_bits(got: int, want: int, nan: bool, what: str):
    if nan:
        return
    assert got == want, f"{what}: got {got:#x}, want {want:#x}"


def _is_nan16(bits: int, kind: str) -> bool:
    return bool(np.isnan(np.array([bits], np.uint16).view(np.float16 if kind == "f16" else ml_dtypes.bfloat16)[0]))


def test_f32_to_f16_rounds_to_nearest_even(prelude):
    for x in _f32_samples():
        got = prelude.call("fs_f32_to_f16", cmini.f32_val(x)).v
        with np.errstate(over="ignore"):
            want = int(np.array([x], np.float32).astype(np.float16).view(np.uint16)[0])
        if np.isnan(x):
            assert _is_nan16(got, "f16")
        _same_bits(got, want, np.isnan(x), f"fs_f32_to_f16({x!r})")


def test_f16_to_f32_is_exact(prelude90):
    for b in list(RNG.integers(0, 2 ** 16, size=300)) + [0, 0x8000, 0x7C00, 0xFC00, 0x3C00, 0x0001, 0x03FF]:
        got = prelude90.call("fs_f16_to_f32", cmini.u_val("unsigned short", int(b))).v
        want = np.array([b], np.uint16).view(np.float16).astype(np.float32)[0]
        assert (np.isnan(got) and np.isnan(want)) or (got == want and np.signbit(got) == np.signbit(want)), hex(b)


def test_f32_to_bf16_rounds_to_nearest_even(prelude):
    for x in _f32_samples():
        got = prelude.call("fs_f32_to_bf16", cmini.f32_val(x)).v
        want = int(np.array([x], np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)[0])
        if np.isnan(x):
            assert _is_nan16(got, "bf16"), f"NaN became {got:#x}"
        _same_bits(got, want, np.isnan(x), f"fs_f32_to_bf16({x!r})")


def test_bf16_to_f32_is_exact(prelude90):
    for b in list(RNG.integers(0, 2 ** 16, size=300)) + [0, 0x8000, 0x7F80, 0x3F80, 0x0001]:
        got = prelude90.call("fs_bf16_to_f32", cmini.u_val("unsigned short", int(b))).v
        want = np.array([b], np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)[0]
        assert (np.isnan(got) and np.isnan(want)) or got == want, hex(b)


def _tf32_reference(x: float) -> float:
    """x rounded to 10 explicit mantissa bits, ties away from zero (cvt.rna.tf32.f32), from the
    definition: scale the significand to an 11-bit integer and round it."""
    if not math.isfinite(x) or x == 0:
        return x
    m, e = math.frexp(abs(x))                  # abs(x) = m * 2**e, 0.5 <= m < 1
    scaled = m * 2 ** 11
    r = math.floor(scaled + 0.5)               # halves go up: away from zero for the magnitude
    return math.copysign(r * 2.0 ** (e - 11), x)


def test_f32_to_tf32_rounds_to_nearest_away(prelude90):
    xs = [float(x) for x in _f32_samples() if np.isfinite(x) and abs(x) < 3e38 and abs(x) > 1.2e-38]
    # exact ties: 10 mantissa bits, then a single 1 bit right below them
    xs += [float(np.float32(1 + 2 ** -11)), float(np.float32(-(1 + 3 * 2 ** -11))), float(np.float32(1.5 + 2 ** -11))]
    for x in xs:
        got = float(prelude90.call("fs_f32_to_tf32", cmini.f32_val(x)).v)
        assert got == _tf32_reference(x), (x, got, _tf32_reference(x))


F8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


@pytest.mark.parametrize("kind", sorted(F8))
def test_f8_to_f32_decodes_every_code(prelude90, kind):
    for code in range(256):
        got = prelude90.call(f"fs_{kind}_to_f32", cmini.u_val("unsigned char", code)).v
        want = np.array([code], np.uint8).view(F8[kind]).astype(np.float32)[0]
        assert (np.isnan(got) and np.isnan(want)) or (got == want and np.signbit(got) == np.signbit(want)), \
            (kind, hex(code), got, want)


@pytest.mark.parametrize("kind", sorted(F8))
def test_f32_to_f8_rounds_to_nearest_even(prelude90, kind):
    t = F8[kind]
    finite_max = float(ml_dtypes.finfo(t).max)
    xs = list(_f32_samples(200))
    # every code, and the midpoints between neighbouring codes
    vals = np.arange(256, dtype=np.uint8).view(t).astype(np.float64)
    vals = np.sort(vals[np.isfinite(vals) & (vals >= 0)])
    xs += list(vals) + list((vals[1:] + vals[:-1]) / 2) + list(-(vals[1:] + vals[:-1]) / 2)
    for x in xs:
        x = np.float32(x)
        got = prelude90.call(f"fs_f32_to_{kind}", cmini.f32_val(x)).v
        if np.isnan(x):
            assert np.isnan(np.array([got], np.uint8).view(t)[0])
            continue
        if abs(float(x)) > finite_max:
            # past the largest finite value: e4m3 (no infinities) gives NaN, e5m2 infinity
            dec = np.array([got], np.uint8).view(t).astype(np.float64)[0]
            rounds_back = abs(float(x)) < finite_max + (finite_max - float(vals[-2])) / 2
            if rounds_back:
                assert dec == math.copysign(finite_max, float(x)), (kind, x, dec)
            elif kind == "e4m3":
                assert np.isnan(dec), (kind, x, dec)
            else:
                assert dec == math.copysign(math.inf, float(x)), (kind, x, dec)
            continue
        want = int(np.array([x], np.float32).astype(t).view(np.uint8)[0])
        assert got == want, (kind, float(x), hex(got), hex(want))


INTS = {"i8": (-128, 127), "u8": (0, 255), "i4": (-8, 7), "u4": (0, 15)}


@pytest.mark.parametrize("kind", sorted(INTS))
def test_f32_to_integers_round_to_nearest_even_and_saturate(prelude90, kind):
    lo, hi = INTS[kind]
    xs = [np.nan, np.inf, -np.inf, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, lo - 0.5, hi + 0.5, lo - 0.51, hi + 0.49,
          1e9, -1e9, 3.7, -3.7] + list(RNG.uniform(2 * lo - 3, 2 * hi + 3, size=60))
    for x in xs:
        got = prelude90.call(f"fs_f32_to_{kind}", cmini.f32_val(x)).v
        xf = float(np.float32(x))
        want = 0 if math.isnan(xf) else int(min(max(np.rint(xf), lo), hi)) if math.isfinite(xf) else (hi if xf > 0 else lo)
        assert got == want, (kind, x, got, want)


def test_4bit_pack_and_unpack(prelude90):
    cells = [cmini.Val("unsigned char", 0) for _ in range(4)]
    p = cmini.Ptr("unsigned char", cells)
    vals = [3, -8, 7, -1, 0, 5, -2, 6]
    for i, v in enumerate(vals):
        prelude90.call("fs_4bit_set", p, cmini.Val("int", i), cmini.Val("int", v))
    # two per byte, low nibble first
    assert [c.v for c in cells] == [((vals[2 * j + 1] & 15) << 4) | (vals[2 * j] & 15) for j in range(4)]
    assert [prelude90.call("fs_i4_get", p, cmini.Val("int", i)).v for i in range(8)] == vals
    assert [prelude90.call("fs_u4_get", p, cmini.Val("int", i)).v for i in range(8)] == [v & 15 for v in vals]


def test_integer_helpers(prelude90):
    ll = lambda v: cmini.Val("long long", v)  # noqa: E731
    assert prelude90.call("fs_sat", ll(300), ll(-128), ll(127)).v == 127
    assert prelude90.call("fs_sat", ll(-300), ll(-128), ll(127)).v == -128
    assert prelude90.call("fs_sat", ll(127), ll(-128), ll(127)).v == 127
    assert prelude90.call("fs_sat", ll(-128), ll(-128), ll(127)).v == -128
    assert prelude90.call("fs_max_ll", ll(-3), ll(2)).v == 2 and prelude90.call("fs_max_ll", ll(5), ll(2)).v == 5


def test_narrowing_cvts_in_the_prelude_round_to_nearest_even():
    """Every f32 -> 16-bit float cvt the prelude issues names .rn (round to nearest even, the
    rounding numpy, the interpreter and cuBLAS use); widening cvts name no rounding mode."""
    cvts = re.findall(r'asm\("(cvt[.\w]*) ', PRELUDE + PRELUDE_SM90)
    assert cvts, "the prelude issues no cvt"
    for c in cvts:
        parts = c.split(".")
        dst, src = parts[-2], parts[-1]
        if (dst, src) in (("f16", "f32"), ("bf16", "f32")):
            assert parts[1] == "rn", c
        else:
            assert src in ("f16", "bf16") and dst == "f32" and len(parts) == 3, c


# =========================================================================== descriptors

def _isa_descriptor(addr: int, lbo: int, sbo: int, mode: int) -> int:
    """The PTX ISA's matrix descriptor: start address >> 4 in bits 0-13, leading byte offset >> 4
    in 16-29, stride byte offset >> 4 in 32-45, base offset (0) in 49-51, swizzle mode in 62-63."""
    field = lambda v, lo, width: ((v >> 4) & ((1 << width) - 1)) << lo  # noqa: E731
    return field(addr & 0x3FFFF, 0, 14) | field(lbo, 16, 14) | field(sbo, 32, 14) | (mode << 62)


#: the ISA's swizzle-mode codes: 0 none, 1 128-byte, 2 64-byte, 3 32-byte
ISA_MODE = {0: 0, 128: 1, 64: 2, 32: 3}


def _desc_fields(n=200):
    for _ in range(n):
        yield (int(RNG.integers(0, 1 << 14)) * 16, int(RNG.integers(0, 1 << 14)) * 16,
               int(RNG.integers(0, 1 << 14)) * 16, int(RNG.choice([0, 32, 64, 128])))
    yield (0x3FFF0, 0x3FFF0, 0x3FFF0, 32)
    yield (16, 16, 16, 128)


def test_smem_descriptor_bits_follow_the_isa():
    for addr, lbo, sbo, sw in _desc_fields():
        assert desc.smem_descriptor(addr, lbo, sbo, sw) == _isa_descriptor(addr, lbo, sbo, ISA_MODE[sw])
        d = desc.decode_smem_descriptor(_isa_descriptor(addr, lbo, sbo, ISA_MODE[sw]))
        assert (d.addr, d.lbo, d.sbo, d.swizzle, d.base_offset) == (addr, lbo, sbo, sw, 0)
    assert desc.DESCRIPTOR_MODE == ISA_MODE


def test_prelude_descriptor_helper_follows_the_isa(prelude90):
    u = lambda v: cmini.u_val("unsigned", v)  # noqa: E731
    for addr, lbo, sbo, sw in _desc_fields(80):
        # the shared window address may have bits above 18 set: the ISA keeps 18
        full = addr | (int(RNG.integers(0, 4)) << 18)
        got = prelude90.call("fs_smem_desc", u(full), u(lbo), u(sbo), u(ISA_MODE[sw])).v
        assert got == _isa_descriptor(full, lbo, sbo, ISA_MODE[sw]), (hex(full), lbo, sbo, sw)


# =========================================================================== instruction templates

def _operands(instr: str) -> list[str]:
    """The comma-separated operands of one PTX instruction, braces kept together."""
    _, _, rest = instr.strip().partition(" ")
    out, depth, cur = [], 0, ""
    for ch in rest:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch in "{["
        depth -= ch in "}]"
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _instructions(template: str) -> list[str]:
    """The instructions of a template, labels and braces and .reg declarations dropped."""
    out = []
    for part in template.replace("{ ", "").replace(" }", "").split(";"):
        part = re.sub(r"^\s*[A-Za-z_$][\w$]*:\s*", "", part).strip(" {}")
        if part and not part.startswith(".reg"):
            out.append(part)
    return out


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in sm90a.WGMMA_ATOMS])
def test_wgmma_template(atom):
    """m64nNk16, f32 accumulators, the types and transposes the name says; the operands in the
    ISA's order d, a, b-desc, scale-d, imm-scale-a, imm-scale-b[, imm-trans-a], imm-trans-b, with
    scale-d the predicate (scale_d != 0) and every immediate scale +1."""
    m = re.fullmatch(r"wgmma_m64n(\d+)k16_(f16|bf16)_f32_(ss|rs)(_tnspa)?(_tnspb)?", atom.name)
    n, ab, kind, tnsp_a, tnsp = int(m.group(1)), m.group(2), m.group(3), bool(m.group(4)), bool(m.group(5))
    instrs = _instructions(atom.ptx)
    setp, mma = instrs
    assert mma.split()[0] == f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab}"
    ops_ = _operands(mma)
    assert ops_[0] == "$d" and ops_[1] == ("$a" if kind == "rs" else "$desc_a") and ops_[2] == "$desc_b"
    imms = ops_[4:]
    assert imms == (["1", "1", str(int(tnsp))] if kind == "rs" else ["1", "1", str(int(tnsp_a)), str(int(tnsp))])
    # the scale-d predicate is true exactly when $scale_d is non-zero
    assert _run_setp(setp, {"$scale_d": 0}) == {ops_[3]: False}
    assert _run_setp(setp, {"$scale_d": 5}) == {ops_[3]: True}
    assert atom.operand("d").regs == n // 2 and atom.shape == (64, n, 16)


def _run_setp(instr: str, values: dict) -> dict:
    op, *_ = instr.split()
    parts = op.split(".")
    assert parts[0] == "setp"
    cmp = parts[1]
    dst, a, b = _operands(instr)
    x, y = values.get(a, None), int(b, 0)
    return {dst: {"ne": x != y, "eq": x == y}[cmp]}


def _step_ptx(template: str, try_wait_results: list[bool], limit: int = 100) -> tuple[int, bool]:
    """Run a spin-loop template: each ``mbarrier.try_wait`` sets its predicate to the next value
    of ``try_wait_results`` (False once they run out); returns (try_waits executed, whether control
    left the template)."""
    body = template.strip()
    assert body.startswith("{") and body.endswith("}")
    stmts = [s.strip() for s in body[1:-1].split(";")]
    labels, code = {}, []
    for s in stmts:
        while True:
            m = re.match(r"^([A-Za-z_]\w*):\s*(.*)$", s)
            if not m:
                break
            labels[m.group(1)] = len(code)
            s = m.group(2)
        if s:
            code.append(s)
    preds, waits, pc, steps = {}, 0, 0, 0
    results = list(try_wait_results)
    while pc < len(code) and steps < limit:
        steps += 1
        s = code[pc]
        pc += 1
        if s.startswith(".reg"):
            continue
        guard = None
        m = re.match(r"^@(!?)(\w+)\s+(.*)$", s)
        if m:
            guard = (m.group(1) == "", m.group(2))
            s = m.group(3)
        if guard is not None and preds.get(guard[1]) != guard[0]:
            continue
        op = s.split()[0]
        if op.startswith("mbarrier.try_wait"):
            preds[_operands(s)[0]] = results.pop(0) if results else False
            waits += 1
        elif op == "bra" or op.startswith("bra."):
            pc = labels[_operands(s)[0]]
        else:
            raise AssertionError(f"unexpected instruction {s!r}")
    return waits, pc >= len(code)


def test_try_wait_spin_loop_waits_until_the_phase_completes():
    """The loop leaves exactly when try_wait reports completion, and spins while it does not."""
    t = catalog.with_immediates(sm90a.mbarrier_try_wait, uid=7).ptx
    assert "$" not in t.replace("$bar", "").replace("$parity", "")
    for k in (0, 1, 5):
        waits, left = _step_ptx(t, [False] * k + [True])
        assert left and waits == k + 1, (k, waits, left)
    waits, left = _step_ptx(t, [], limit=60)
    assert not left and waits > 5
    # the ISA's operand order: waitComplete, [addr], phaseParity
    (tw,) = [i for i in _instructions(t) if i.startswith("mbarrier.try_wait")]
    assert tw.split()[0] == "mbarrier.try_wait.parity.shared::cta.b64"
    assert _operands(tw)[1:] == ["[$bar]", "$parity"]


def test_cluster_barrier_arrives_then_waits():
    instrs = _instructions(sm90a.barrier_cluster.ptx)
    assert [i.split(".")[:3] for i in instrs] == [["barrier", "cluster", "arrive"], ["barrier", "cluster", "wait"]]
    assert all(i.endswith(".aligned") for i in instrs)


def test_remote_arrive_uses_the_mapped_address():
    mapa, arrive = _instructions(sm90a.mbarrier_arrive_cluster.ptx)
    assert mapa.split()[0] == "mapa.shared::cluster.u32"
    reg, bar, cta = _operands(mapa)
    assert (bar, cta) == ("$bar", "$cta")
    assert arrive.split()[0].startswith("mbarrier.arrive") and "shared::cluster" in arrive.split()[0]
    assert _operands(arrive)[1] == f"[{reg}]"


def test_multicast_mask_is_the_16_bit_cta_mask():
    cvt, load = _instructions(sm90a.tma_load_2d_multicast.ptx)
    dst, src = _operands(cvt)
    assert cvt.split()[0] == "cvt.u16.u32" and src == "$mask"
    assert load.split()[0].endswith(".multicast::cluster") and _operands(load)[-1] == dst


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in (sm90a.tma_load_2d, sm90a.tma_store_2d)])
def test_tma_templates_put_the_column_first(atom):
    """The tensor coordinates are innermost first: {$c0 (column), $c1 (row)}."""
    (instr,) = _instructions(atom.ptx)
    assert "{$c0, $c1}" in instr and instr.split()[0].startswith("cp.async.bulk.tensor.2d.")


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name)
                                  for a in (*[x for x in catalog.ALL_ATOMS if x.family == "ldmatrix"],
                                            *sm90a.STMATRIX_ATOMS)])
def test_ldmatrix_and_stmatrix_templates(atom):
    m = re.fullmatch(r"(ldmatrix|stmatrix)_x(\d)(_trans)?(_cols)?", atom.name)
    kind, num, trans = m.group(1), int(m.group(2)), bool(m.group(3))
    (instr,) = _instructions(atom.ptx)
    want = f"{kind}.sync.aligned.m8n8.x{num}" + (".trans" if trans else "") + ".shared.b16"
    assert instr.split()[0] == want
    regs = [o for o in atom.operands if o.memory == "RF"]
    assert len(regs) == 1 and regs[0].regs == num
    mem = "[$src]" if kind == "ldmatrix" else "[$dst]"
    assert mem in _operands(instr)


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in catalog.ALL_ATOMS if a.family == "cp_async"])
def test_cp_async_template(atom):
    m = re.fullmatch(r"cp_async_(\d+)(_ca)?", atom.name)
    width = int(m.group(1))
    (instr,) = _instructions(atom.ptx)
    # .cg (L2 only) exists for 16-byte copies alone; cp_async_16_ca caches them in L1 too
    assert instr.split()[0] == f"cp.async.{'cg' if width == 16 and not m.group(2) else 'ca'}.shared.global"
    assert _operands(instr) == ["[$dst]", "[$src]", str(width), "$src_size"]


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in catalog.ALL_ATOMS if a.family == "mma"])
def test_mma_template(atom):
    m = re.fullmatch(r"mma_m(\d+)n(\d+)k(\d+)_(\w+?)_(\w+)", atom.name)
    shape = f"m{m.group(1)}n{m.group(2)}k{m.group(3)}"
    ab, acc = m.group(4), m.group(5)
    (instr,) = _instructions(atom.ptx)
    assert instr.split()[0] == f"mma.sync.aligned.{shape}.row.col.{acc}.{ab}.{ab}.{acc}"
    assert _operands(instr) == ["$d", "$a", "$b", "$c"]


def test_shuffles_span_the_full_warp():
    for a in (catalog.by_name("shfl_sync_idx_b32"), catalog.by_name("shfl_sync_bfly_b32")):
        (instr,) = _instructions(a.ptx)
        assert _operands(instr)[-2:] == ["0x1f", "0xffffffff"]


SYNC_TEMPLATES = {
    # atom name -> the instruction its template must issue (PTX ISA spelling)
    "wgmma_fence": "wgmma.fence.sync.aligned",
    "wgmma_commit": "wgmma.commit_group.sync.aligned",
    "wgmma_wait": "wgmma.wait_group.sync.aligned",
    "tma_commit": "cp.async.bulk.commit_group",
    "tma_wait": "cp.async.bulk.wait_group",
    "tma_wait_read": "cp.async.bulk.wait_group.read",
    "mbarrier_init": "mbarrier.init.shared::cta.b64",
    "mbarrier_arrive": "mbarrier.arrive.shared::cta.b64",
    "mbarrier_arrive_expect_tx": "mbarrier.arrive.expect_tx.shared::cta.b64",
    "fence_proxy_async": "fence.proxy.async.shared::cta",
    "fence_mbarrier_init": "fence.mbarrier_init.release.cluster",
    "setmaxnreg_inc": "setmaxnreg.inc.sync.aligned.u32",
    "setmaxnreg_dec": "setmaxnreg.dec.sync.aligned.u32",
    "cp_async_commit": "cp.async.commit_group",
    "cp_async_wait": "cp.async.wait_group",
    "bar_sync": "bar.sync",
}


@pytest.mark.parametrize("name", sorted(SYNC_TEMPLATES))
def test_synchronisation_templates_issue_what_their_names_say(name):
    atom = catalog.by_name(name)
    instrs = _instructions(atom.ptx)
    assert len(instrs) == 1, atom.ptx
    assert instrs[0].split()[0] == SYNC_TEMPLATES[name], atom.ptx


def test_arrive_expect_tx_operands():
    (i,) = _instructions(sm90a.mbarrier_arrive_expect_tx.ptx)
    assert _operands(i) == ["_", "[$bar]", "$bytes"]
    (i,) = _instructions(sm90a.mbarrier_init.ptx)
    assert _operands(i) == ["[$bar]", "$count"]


def test_interpreter_tf32_rounding_is_the_isa_one():
    """dtypes.round_to(tf32) (what the interpreter feeds tf32 MMAs) rounds as cvt.rna.tf32.f32."""
    from firesched import dtypes

    xs = [float(x) for x in _f32_samples(300) if np.isfinite(x) and 1.2e-38 < abs(x) < 3e38]
    xs += [float(np.float32(1 + 2 ** -11)), float(np.float32(-(1 + 3 * 2 ** -11)))]
    got = dtypes.round_to(dtypes.tf32, np.array(xs, np.float32))
    assert [float(g) for g in got] == [_tf32_reference(x) for x in xs]


# =========================================================================== printed kernels

SM80_CASES = {
    "plain": ((200, 136, 304), dict(block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2, stages=3)),
    "splitk-blocks": ((256, 128, 1024), dict(block_m=64, block_n=64, block_k=32, split_k_blocks=4, stages=2)),
    "splitk-warps-bias-gelu": ((128, 128, 256), dict(block_m=64, block_n=64, block_k=64, split_k_warps=2, stages=2,
                                                     epilogue_ops=(ops.bias("bias"), ops.gelu()))),
    "CC-prologue-f32": ((96, 80, 72), dict(block_m=32, block_n=32, block_k=32, warps_m=2, warps_n=1, stages=4,
                                           layout="CC", out_dtype="f32", prologue_ops=(ops.relu(),))),
    "one-stage": ((64, 64, 64), dict(block_m=64, block_n=64, block_k=64, stages=1)),
}
SM90_CASES = {
    "plain": ((256, 512, 192), dict(block_m=128, block_n=256, stages=3, warp_specialized=False)),
    "ws-persistent-bias-relu": ((512, 512, 512), dict(block_m=128, block_n=128,
                                                      epilogue_ops=(ops.bias("bias"), ops.relu()))),
    "cluster": ((512, 512, 256), dict(block_m=128, block_n=256, cluster=2)),
    "bf16-RC-64B": ((300, 256, 200), dict(dtype="bf16", layout="RC", block_m=64, block_n=128, block_k=32,
                                           out_dtype="f32")),
    "padded": ((200, 136, 300), dict(block_m=128, block_n=64, warp_specialized=False)),
}


def _program(arch: str, name: str) -> ir.Program:
    (M, N, K), kw = (SM80_CASES if arch == "sm_80" else SM90_CASES)[name]
    kw = dict(kw)
    sched = fs.recipes.gemm(M, N, K, kw.pop("dtype", "f16"), arch="sm_90a" if arch == "sm_90a" else "sm_80",
                            **({"atoms": "sm80"} if arch == "sm_80" else {}), **kw)
    return sched.lower("sm_90a" if arch == "sm_90a" else "sm_80")


PROGRAMS = [pytest.param("sm_80", n, id=f"sm80-{n}") for n in SM80_CASES] + \
           [pytest.param("sm_90a", n, id=f"sm90a-{n}") for n in SM90_CASES]


def _walk(stmt):
    if stmt is None:
        return
    yield stmt
    if isinstance(stmt, ir.Seq):
        for s in stmt.body:
            yield from _walk(s)
    elif isinstance(stmt, ir.For):
        yield from _walk(stmt.body)
    elif isinstance(stmt, ir.If):
        yield from _walk(stmt.then)
    elif isinstance(stmt, ir.Roles):
        for r in stmt.roles:
            yield from _walk(r.body)


def _kernel_sources(program: ir.Program) -> dict[str, str]:
    return {k.name: fs.cuda.emit_kernel(k) for k in program.kernels}


def _body_of(src: str, kernel: str) -> str:
    """The text of one kernel's definition (the preludes cut off)."""
    i = src.index(f" {kernel}(")
    return src[src.rfind("\n", 0, i):]


_FOR = re.compile(r"for \((?P<init>[^;]*);(?P<cond>[^;]*);(?P<inc>[^)]*)\)")


_UNROLLED = re.compile(r"\[\[maybe_unused\]\] const int (?P<v>\w+) = (?P<j>\d+);")


def _printed_loops(body: str) -> Counter:
    """(variable, extent) of every loop in a kernel's text, each copy counted: ``for`` headers,
    which must read ``for (int v = 0; v < N; ++v)``, and loops unrolled in the text, whose
    iterations must be blocks binding ``v`` to 0, 1, ..., N - 1 in turn."""
    printed = Counter()
    for m in _FOR.finditer(body):
        init, cond, inc = (m.group(g).strip() for g in ("init", "cond", "inc"))
        mi = re.fullmatch(r"int (\w+) = 0", init)
        assert mi, f"loop does not start at 0: {m.group()}"
        v = mi.group(1)
        # a loop that stops early at run time: v < min(N, stop)
        mc = re.fullmatch(rf"{v} < (\d+)", cond) or re.fullmatch(rf"{v} < min\((\d+), .+\)", cond)
        assert mc, f"loop condition is not '{v} < N' or '{v} < min(N, stop)': {m.group()}"
        assert inc == f"++{v}", f"loop does not step by one: {m.group()}"
        if not v.startswith("fs_"):
            printed[(v, int(mc.group(1)))] += 1
    runs: dict[str, list[int]] = {}
    for m in _UNROLLED.finditer(body):
        v, j = m.group("v"), int(m.group("j"))
        run = runs.setdefault(v, [])
        if j == 0 and run:
            printed[(v, len(run))] += 1
            run.clear()
        assert j == len(run), f"iteration {j} of {v} follows {run}: not 0, 1, 2, ... in turn"
        run.append(j)
    for v, run in runs.items():
        printed[(v, len(run))] += 1
    return printed


def _ir_loops(stmt, textual: set, mult: int = 1, out: Counter | None = None) -> Counter:
    """(variable, extent) of every IR loop, counted as often as the loops unrolled in the text
    around it print it."""
    out = Counter() if out is None else out
    if stmt is None:
        return out
    if isinstance(stmt, ir.For):
        out[(stmt.var.name, int(stmt.extent))] += mult
        inner = mult * int(stmt.extent) if stmt.var.name in textual else mult
        _ir_loops(stmt.body, textual, inner, out)
    elif isinstance(stmt, ir.Seq):
        for s in stmt.body:
            _ir_loops(s, textual, mult, out)
    elif isinstance(stmt, ir.If):
        _ir_loops(stmt.then, textual, mult, out)
    elif isinstance(stmt, ir.Roles):
        for r in stmt.roles:
            _ir_loops(r.body, textual, mult, out)
    return out


@pytest.mark.parametrize("arch, name", PROGRAMS)
def test_loop_headers_run_exactly_their_extents(arch, name):
    """Every printed loop is ``for (int v = 0; v < N; ++v)`` or, unrolled in the text, the
    blocks ``v = 0 .. N - 1``: N iterations, and the N of the IR's loops are exactly the printed
    ones (loops the printer adds itself use fs_ names)."""
    program = _program(arch, name)
    for k in program.kernels:
        body = _body_of(fs.cuda.emit_kernel(k), k.name)
        printed = _printed_loops(body)
        want = _ir_loops(k.body, {m.group("v") for m in _UNROLLED.finditer(body)})
        assert printed == want, (k.name, printed - want, want - printed)


@pytest.mark.parametrize("causal", [False, True])
def test_loops_unrolled_in_the_text_run_exactly_their_extents(causal):
    """Attention's epilogue loops index its output in 16-byte pieces, so the printer unrolls them
    in the text: each such loop prints as N blocks binding its variable to 0 .. N - 1."""
    (k,) = fs.recipes.fmha(1, 2, 1000, 1000, 128, dtype="f16", causal=causal, arch="sm_90a").lower("sm_90a").kernels
    body = _body_of(fs.cuda.emit_kernel(k), k.name)
    textual = {m.group("v") for m in _UNROLLED.finditer(body)}
    assert textual
    assert _printed_loops(body) == _ir_loops(k.body, textual)


def _asm_templates(text: str) -> list[str]:
    return [t.replace('\\"', '"').replace("\\\\", "\\")
            for t in re.findall(r'asm volatile\("((?:[^"\\]|\\.)*)"', text)]


def _ops_in(text: str) -> list[str]:
    out = []
    for t in _asm_templates(text):
        out += [i.split()[0] for i in _instructions(t) if i.split()]
    return out


@pytest.mark.parametrize("arch, name", PROGRAMS)
def test_every_asynchronous_start_has_its_wait(arch, name):
    """In each printed kernel: cp.async groups are waited for, wgmma groups are waited for, bulk
    (TMA store) groups are waited for, mbarriers that are arrived on are waited on and were
    initialised (and the init fenced), and every cluster barrier arrival has its wait."""
    program = _program(arch, name)
    for kname, src in _kernel_sources(program).items():
        body = _body_of(src, kname)
        seq = _ops_in(body)
        has = lambda prefix, seq=seq: any(o.startswith(prefix) for o in seq)  # noqa: E731
        pairs = [("cp.async.commit_group", "cp.async.wait_group"),
                 ("wgmma.commit_group", "wgmma.wait_group"),
                 ("cp.async.bulk.commit_group", "cp.async.bulk.wait_group"),
                 ("mbarrier.arrive", "mbarrier.try_wait"),
                 ("mbarrier.init", "fence.mbarrier_init"),
                 ("cp.async.bulk.tensor.2d.shared::cluster", "mbarrier.try_wait")]
        for start, wait in pairs:
            if has(start):
                assert has(wait), f"{kname}: {start} without {wait}"
        if has("mbarrier.try_wait") or has("mbarrier.arrive"):
            assert has("mbarrier.init"), f"{kname}: mbarriers used without mbarrier.init"
        arrivals = [i for i, o in enumerate(seq) if o.startswith("barrier.cluster.arrive")]
        for i in arrivals:
            assert i + 1 < len(seq) and seq[i + 1].startswith("barrier.cluster.wait"), \
                f"{kname}: barrier.cluster.arrive not followed by its wait"
        assert len(arrivals) == sum(o.startswith("barrier.cluster.wait") for o in seq)
        if program.kernels[0].cluster > 1 and kname == program.kernels[-1].name:
            assert arrivals, "a cluster kernel meets its blocks at barrier.cluster"


@pytest.mark.parametrize("name", list(SM90_CASES))
def test_printed_descriptors_name_the_isa_swizzle_mode(name):
    """Each ``fs_smem_desc(address, lbo, sbo, mode)`` the printer writes carries the IR
    descriptor's byte offsets and the ISA's mode code for its swizzle."""
    program = _program("sm_90a", name)
    for k in program.kernels:
        body = _body_of(fs.cuda.emit_kernel(k), k.name)
        printed = Counter((int(a), int(b), int(c)) for a, b, c in
                          re.findall(r"fs_smem_desc\(.*?, (\d+)u, (\d+)u, (\d+)u\)", body))
        refs = [arg for s in _walk(k.body) if isinstance(s, ir.AtomCall) for _, arg in s.args
                if isinstance(arg, ir.DescRef)]
        want = Counter((r.lbo, r.sbo, ISA_MODE[r.swizzle]) for r in refs)
        assert set(printed) == set(want), (printed, want)
        assert sum(printed.values()) >= len(set(want))


@pytest.mark.parametrize("name", list(SM90_CASES))
def test_printed_try_waits_are_the_spin_loop(name):
    """The spin loops as printed (labels numbered per call site) still leave only on completion."""
    program = _program("sm_90a", name)
    found = 0
    labels = set()
    for k in program.kernels:
        for t in _asm_templates(_body_of(fs.cuda.emit_kernel(k), k.name)):
            if "mbarrier.try_wait" not in t:
                continue
            found += 1
            t = re.sub(r"%\d+", "R", t)
            waits, left = _step_ptx(t, [False, False, True])
            assert left and waits == 3
            lab = re.findall(r"(?:^|[;{])\s*([A-Za-z_]\w*):(?!:)", t)
            assert not labels & set(lab), "labels of two spin loops collide"
            labels |= set(lab)
    assert found


def test_wgmma_waits_keep_one_group_in_flight_at_most():
    """Inside the K loop the consumer waits with ``wgmma.wait_group 1`` (or 0); after the loop and
    before the epilogue reads the accumulators it waits with 0."""
    program = _program("sm_90a", "ws-persistent-bias-relu")
    (k,) = program.kernels
    body = _body_of(fs.cuda.emit_kernel(k), k.name)
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", "\n".join(_asm_templates(body)))
    assert waits and set(waits) <= {"0", "1"} and "0" in waits


# =========================================================================== index expressions as C

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from firesched.ir import expr as ex  # noqa: E402

_VARS = [ex.Var("v0", 7), ex.Var("v1", 33), ex.Var("v2", 128)]


def _leaf():
    return st.one_of(st.integers(0, 40).map(lambda c: ("const", c)), st.sampled_from([("var", i) for i in range(3)]))


def _node(children):
    c = st.integers(1, 17)
    return st.one_of(
        st.tuples(st.just("+"), children, children),
        st.tuples(st.just("*"), children, c.map(lambda k: ("const", k))),
        st.tuples(st.just("mul2"), children, children),
        st.tuples(st.just("//"), children, c),
        st.tuples(st.just("%"), children, c),
        st.tuples(st.just("&"), children, st.sampled_from([1, 3, 7, 15, 31, 12])),
        st.tuples(st.just(">>"), children, st.integers(0, 4)),
        st.tuples(st.just("^"), children, children),
        st.tuples(st.just("<"), children, children),
        st.tuples(st.just("sel"), children, children, children),
    )


_TREES = st.recursive(_leaf(), _node, max_leaves=12)


def _py(t, env):
    """The value of tree ``t``, computed directly (all values stay non-negative)."""
    k = t[0]
    if k == "const":
        return t[1]
    if k == "var":
        return env[t[1]]
    a = _py(t[1], env)
    if k == "+":
        return a + _py(t[2], env)
    if k == "*":
        return a * t[2][1]
    if k == "mul2":
        return a * _py(t[2], env)
    if k == "-":
        return a - _py(t[2], env)
    if k == "//":
        return a // t[2]
    if k == "%":
        return a % t[2]
    if k == "&":
        return a & t[2]
    if k == ">>":
        return a >> t[2]
    if k == "^":
        return a ^ _py(t[2], env)
    if k == "<":
        return int(a < _py(t[2], env))
    if k == "sel":
        return _py(t[2], env) if a else _py(t[3], env)
    raise AssertionError(k)


def _ir(t):
    k = t[0]
    if k == "const":
        return t[1]
    if k == "var":
        return _VARS[t[1]]
    a = _ir(t[1])
    if k == "+":
        return ex.add(a, _ir(t[2]))
    if k == "*":
        return ex.mul(a, t[2][1])
    if k == "mul2":
        return ex.mul(a, _ir(t[2]))
    if k == "-":
        return ex.add(a, ex.mul(-1, _ir(t[2])))
    if k == "//":
        return ex.floordiv(a, t[2])
    if k == "%":
        return ex.mod(a, t[2])
    if k in ("&", ">>"):
        return ex.binop(k, a, t[2])
    if k == "^":
        return ex.binop("^", a, _ir(t[2]))
    if k == "<":
        return ex.lt(a, _ir(t[2]))
    if k == "sel":
        return ex.select(a, _ir(t[2]), _ir(t[3]))
    raise AssertionError(k)


V0, V1, V2 = ("var", 0), ("var", 1), ("var", 2)


@settings(max_examples=150 if settings().max_examples >= 500 else 40, deadline=None)
@given(tree=_TREES, env=st.tuples(st.integers(0, 6), st.integers(0, 32), st.integers(0, 127)))
@example(tree=("mul2", V0, ("//", V2, 3)), env=(5, 0, 100))               # a * (b / 3), not a * b / 3
@example(tree=("mul2", V1, ("%", V2, 7)), env=(0, 3, 100))
@example(tree=("<", V0, ("<", V1, V2)), env=(0, 5, 3))                      # a < (b < c)
@example(tree=("%", ("%", V2, 3), 6), env=(0, 0, 100))                      # (x % 3) % 6 == x % 3
@example(tree=("//", ("//", V2, 3), 5), env=(0, 0, 100))
@example(tree=("&", V2, 7), env=(0, 0, 100))
def test_index_expressions_print_as_c_that_computes_them(tree, env):
    """The simplified IR expression, evaluated as the interpreter does and printed as C and run by
    the C interpreter, both equal the tree's value computed directly."""
    e = _ir(tree)
    want = _py(tree, env)
    assert ex.evaluate(e, {v.name: x for v, x in zip(_VARS, env)}) == want
    lo, hi = ex.bounds(e)
    assert (lo is None or lo <= want) and (hi is None or want <= hi), (ex.to_c(e), lo, hi, want)
    if isinstance(e, int):
        return
    prog = cmini.Program(f"static __device__ int f(int v0, int v1, int v2) {{ return {ex.to_c(e)}; }}")
    got = prog.call("f", *(cmini.Val("int", x) for x in env)).v
    assert got == want, (ex.to_c(e), env, got, want)


# =========================================================================== addressing and register pinning

def test_large_offsets_are_computed_in_64_bits():
    """A global offset that may pass 2**31 - 1 is formed in 64-bit arithmetic: a 46341 x 46341
    f16 operand has 2**31 + 2**16 elements."""
    big = fs.recipes.gemm(46341, 46341, 64, atoms="sm80", block_k=64, arch="sm_80")
    small = fs.recipes.gemm(4096, 4096, 64, atoms="sm80", block_k=64, arch="sm_80")
    (kb,) = big.lower("sm_80").kernels
    (ks,) = small.lower("sm_80").kernels
    assert "(long long)" in _body_of(fs.cuda.emit_kernel(kb), kb.name)
    assert "(long long)" not in _body_of(fs.cuda.emit_kernel(ks), ks.name)


_FENCE_LINE = re.compile(r'^\s*(asm volatile\("" :|fs_fence_reg\(|#pragma unroll|for \(int fs_i|\})')


def _pinned(lines: list[str], regs: dict) -> dict:
    """The elements of each register buffer in ``regs`` (name -> buffer) that the empty asm
    fences of ``lines`` pin: a loop of ``fs_fence_reg`` pins a whole array, an operand
    ``"+f"(name_k[j])`` element per x k + j of a buffer printed in pieces of ``per`` elements
    (16 bytes)."""
    text = "\n".join(lines)
    out = {n: set() for n in regs}
    for n, buf in regs.items():
        if re.search(rf"fs_fence_reg\({n}\[fs_i\]\)", text):
            out[n] |= set(range(buf.size))
        per = 128 // buf.dtype.bits
        for m in re.finditer(rf'"\+[fh]"\({n}_(\d+)\[(\d+)\]\)', text):
            out[n].add(per * int(m.group(1)) + int(m.group(2)))
    return out


@pytest.mark.parametrize("what", ["gemm", "attention"])
def test_accumulators_are_pinned_around_wgmma_fence_and_wait(what):
    """The compiler may not move accumulator accesses across wgmma.fence / wgmma.wait_group: the
    printer fences every accumulator register right before each fence and right after each wait
    (the GEMM's accumulator as one array, attention's scores and output in 16-byte pieces)."""
    if what == "gemm":
        program = _program("sm_90a", "plain")
    else:
        program = fs.recipes.fmha(1, 2, 300, 300, 128, dtype="f16", arch="sm_90a").lower("sm_90a")
    (k,) = program.kernels
    lines = _body_of(fs.cuda.emit_kernel(k), k.name).splitlines()
    acc = {ref.buffer.name: ref.buffer for s in _walk(k.body) if isinstance(s, ir.AtomCall)
           and s.atom.family == "wgmma" for name, ref in s.args if name == "d"}
    assert acc and any(f"{n}_1[" in "\n".join(lines) for n in acc) == (what == "attention")
    whole = {n: set(range(b.size)) for n, b in acc.items()}
    fences = waits = 0
    for i, ln in enumerate(lines):
        if "wgmma.fence.sync.aligned" in ln:
            j = i
            while j > 0 and _FENCE_LINE.match(lines[j - 1]):
                j -= 1
            assert _pinned(lines[j:i], acc) == whole, "\n".join(lines[j:i])
            fences += 1
        if "wgmma.wait_group.sync.aligned" in ln:
            j = i + 4                       # the wait's asm statement: template, outputs, inputs, clobbers
            while j < len(lines) and _FENCE_LINE.match(lines[j]):
                j += 1
            assert _pinned(lines[i + 4:j], acc) == whole, "\n".join(lines[i:j])
            waits += 1
    assert fences and waits


@pytest.mark.parametrize("name", [n for n in SM90_CASES if n != "plain"])
def test_named_barriers_wait(name):
    """Warpgroup barriers are bar.sync (arrive and wait), never a bare bar.arrive."""
    program = _program("sm_90a", name)
    for k in program.kernels:
        body = _body_of(fs.cuda.emit_kernel(k), k.name)
        ops_ = _ops_in(body)
        assert not any(o.startswith("bar.arrive") for o in ops_)
        named = [s for s in _walk(k.body) if isinstance(s, ir.Barrier) and s.threads]
        assert len(named) <= sum(o.startswith("bar.sync") for o in ops_)


_SIGNED = st.recursive(_leaf(), lambda ch: st.one_of(_node(ch), st.tuples(st.just("-"), ch, ch)), max_leaves=10)


def _grid():
    v0, v1, v2 = np.meshgrid(np.arange(7), np.arange(33), np.arange(128), indexing="ij")
    return {"v0": v0.ravel(), "v1": v1.ravel(), "v2": v2.ravel()}


_ALL = _grid()


@settings(max_examples=100 if settings().max_examples >= 500 else 30, deadline=None)
@given(tree=_SIGNED)
@example(tree=("-", V0, V2))
@example(tree=("//", ("-", ("+", V2, ("const", 200)), V1), 4))
@example(tree=("%", ("-", ("+", V2, ("const", 40)), V0), 8))
def test_simplified_expressions_keep_their_values_and_bounds(tree):
    """Over every point of the variables' ranges (negative values included): the simplified IR
    expression evaluates to the tree's value (floor division, as the interpreter's), and lies
    within the bounds the simplifier assumed."""
    e = _ir(tree)
    n = _ALL["v0"].size
    want = np.array([_py(tree, (int(a), int(b), int(c))) for a, b, c in
                     zip(_ALL["v0"][::97], _ALL["v1"][::97], _ALL["v2"][::97])])
    got = np.broadcast_to(ex.evaluate(e, {k: v[::97] for k, v in _ALL.items()}), want.shape)
    assert np.array_equal(got, want), ex.to_c(e)
    full = np.broadcast_to(ex.evaluate(e, _ALL), (n,))
    lo, hi = ex.bounds(e)
    assert lo is None or full.min() >= lo, (ex.to_c(e), lo, full.min())
    assert hi is None or full.max() <= hi, (ex.to_c(e), hi, full.max())


@pytest.mark.parametrize("a", range(1, 13))
@pytest.mark.parametrize("b", range(1, 13))
def test_nested_division_and_modulo_simplify_exactly(a, b):
    """(x % a) % b, (x // a) // b, (x // a) % b and (x % a) // b for every small a, b, over x in
    0..299 and over x - 150 (whose sign the simplifier cannot know), with floor semantics."""
    x = ex.Var("x", 300)
    xs = np.arange(300)
    for inner, vals in ((x, xs), (ex.add(x, -150), xs - 150)):
        for e, want in ((ex.mod(ex.mod(inner, a), b), vals % a % b),
                        (ex.floordiv(ex.floordiv(inner, a), b), vals // a // b),
                        (ex.mod(ex.floordiv(inner, a), b), vals // a % b),
                        (ex.floordiv(ex.mod(inner, a), b), vals % a // b)):
            got = np.broadcast_to(ex.evaluate(e, {"x": xs}), xs.shape)
            assert np.array_equal(got, want), (a, b, ex.to_c(e))


# =========================================================================== predication, as printed

def _asm_statements(text: str) -> list[tuple[str, list[str], list[str], int, int]]:
    """(template, output expressions, input expressions, start, end) of every ``asm volatile``."""
    out = []
    for m in re.finditer(r'asm volatile\("((?:[^"\\]|\\.)*)"', text):
        i, depth, j = m.end(), 1, m.end()
        while depth:                                # to the closing parenthesis of asm(
            ch = text[j]
            depth += ch == "("
            depth -= ch == ")"
            j += 1
        groups = [g.strip() for g in _split_top(text[i:j - 1], ":")][1:]
        outs = [re.sub(r'^"[^"]*"\(', "", e.strip())[:-1] for e in _split_top(groups[0], ",") if e.strip()]
        ins = [re.sub(r'^"[^"]*"\(', "", e.strip())[:-1] for e in _split_top(groups[1], ",") if e.strip()] \
            if len(groups) > 1 else []
        out.append((m.group(1), outs, ins, m.start(), j))
    return out


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, cur, quote = [], 0, "", False
    for ch in text:
        if ch == '"':
            quote = not quote
        if not quote:
            depth += ch in "(["
            depth -= ch in ")]"
        if ch == sep and depth == 0 and not quote:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    parts.append(cur)
    return parts


def _c_int(expr: str, **values) -> int:
    """An integer C expression over ``values`` (pointers as integers: element offsets)."""
    names = sorted(values)
    prog = cmini.Program(f"static __device__ long long f({', '.join(f'long long {n}' for n in names)}) "
                         f"{{ return {expr}; }}")
    return prog.call("f", *(cmini.Val("long long", values[n]) for n in names)).v


def test_predicated_cp_async_zero_fills_from_the_base_address():
    """A disabled cp.async reads 0 bytes (src-size 0: the destination is zero-filled) from the
    buffer's base address; an enabled one reads its full width from its own address."""
    T = ir.tid(8)
    a = ir.GlobalBuffer("A", fs.dtypes.f16, (64,), (1,), "in")
    sh = ir.SharedBuffer("S", fs.dtypes.f16, 64)
    atom = catalog.by_name("cp_async_16")
    body = [ir.AtomCall(atom, (("dst", ir.MemRef(sh, T * 8)), ("src", ir.MemRef(a, T * 8))), ex.lt(T, 5)),
            ir.AsyncCommit(), ir.AsyncWait(0)]
    k = ir.Kernel("k", (a,), (1, 1, 1), 8, (sh,), (), ir.Seq(body))
    (stmt,) = [s for s in _asm_statements(fs.cuda.emit_kernel(k)) if s[0].startswith("cp.async.cg")]
    template, outs, ins, _, _ = stmt
    ops_ = _operands(_instructions(template)[0])
    # %i numbers the outputs first, then the inputs
    size = ins[int(ops_[3].lstrip("%")) - len(outs)]
    src = ins[int(ops_[1].strip("[]").lstrip("%")) - len(outs)]
    for tid in range(8):
        enabled = tid < 5
        assert _c_int(size, threadIdx_x=tid, tid=tid) == (16 if enabled else 0), size
        assert _c_int(src.replace("A", "0"), tid=tid) == (tid * 8 if enabled else 0), src


def test_disabled_loads_zero_every_register_they_would_write():
    T = ir.tid(32)
    a = ir.GlobalBuffer("A", fs.dtypes.f16, (256,), (1,), "in")
    out = ir.GlobalBuffer("O", fs.dtypes.f16, (256,), (1,), "out")
    v = ir.RegBuffer("v", fs.dtypes.f16, 8)
    ld, st_ = catalog.copy_atom("GL", "RF", 16), catalog.copy_atom("RF", "GL", 16)
    body = [ir.AtomCall(ld, (("src", ir.MemRef(a, T * 8)), ("dst", ir.RegRef(v, 0))), ex.lt(T, 20)),
            ir.AtomCall(st_, (("dst", ir.MemRef(out, T * 8)), ("src", ir.RegRef(v, 0))))]
    k = ir.Kernel("k", (a, out), (1, 1, 1), 32, (), (v,), ir.Seq(body))
    text = _body_of(fs.cuda.emit_kernel(k), "k")
    (load,) = [s for s in _asm_statements(text) if s[0].startswith("ld.global")]
    _, outs, _, _, end = load
    rest = text[end:]
    m = re.match(r"\s*;\s*}\s*else\s*{(.*?)}", rest, re.S)
    assert m, "a predicated load has no else branch"
    zeroed = {z.strip() for z in re.findall(r"([^;{}]+?)\s*=\s*0\s*;", m.group(1))}
    assert set(outs) <= zeroed, (outs, zeroed)


@functools.cache
def _prelude90():
    return cmini.Program(PRELUDE + PRELUDE_SM90, 900)


@settings(max_examples=60, deadline=None)
@given(base=st.integers(0, (228 * 1024) // 128 - 1), units=st.integers(0, 4095),
       lbo=st.sampled_from([16, 128, 1024]), sbo=st.sampled_from([256, 512, 1024]), mode=st.integers(0, 3))
def test_a_moved_descriptor_is_the_descriptor_of_the_moved_address(base, units, lbo, sbo, mode):
    """``fs_desc_add(fs_smem_desc(base), units)`` (one add, what the printer binds) equals
    ``fs_smem_desc(base + 16 * units)`` for every 128-byte-aligned buffer of the shared window and
    every 16-byte-aligned start inside it."""
    prog = _prelude90()
    u = lambda v: cmini.u_val("unsigned", v)  # noqa: E731
    addr = base * 128
    units = min(units, (228 * 1024 - 16 - addr) // 16)
    moved = prog.call("fs_desc_add", prog.call("fs_smem_desc", u(addr), u(lbo), u(sbo), u(mode)), u(units)).v
    assert moved == prog.call("fs_smem_desc", u(addr + 16 * units), u(lbo), u(sbo), u(mode)).v
