"""Every register-fragment atom through the interpreter, with data placed and read back by the
PTX ISA's fragment formulas written here, never by the atoms' own TV layouts.

The one-atom microkernels of ``firesched.testing.microkernel`` load fragments with the atom's TV
layout and the interpreter reads them with the same layout, so a wrong (but bijective) layout
cancels out there and only shows on a GPU.  These programs are built from the ISA's text instead
("row = groupID + 8 * (i // 2)", "threads 8i..8i+7 supply the row addresses of matrix i", ...):
each lane loads the elements the ISA says its registers hold, the atom runs in the interpreter,
and each lane stores what the ISA says its result registers hold.  The expected results are
numpy (``a @ b + c`` for the MMAs, the addressed rows for ldmatrix / stmatrix) on the whole tiles.
"""

from __future__ import annotations

import numpy as np
import pytest

from firesched import dtypes as dt
from firesched import ir
from firesched.hardware import catalog, sm70, sm80, sm90a
from firesched.simulate import run_program

T32 = ir.tid(32)
T128 = ir.tid(128)


def _gbuf(name, d, shape, role="in"):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.insert(0, acc)
        acc *= n
    return ir.GlobalBuffer(name, d, tuple(shape), tuple(strides), role)


def _call(atom, **args):
    return ir.AtomCall(atom, tuple(args.items()))


def _ld(nbytes):
    return catalog.copy_atom("GL", "RF", nbytes)


def _st(nbytes):
    return catalog.copy_atom("RF", "GL", nbytes)


def _program(params, out, body, *, threads=32, shared=(), regs=()):
    k = ir.Kernel("oracle", (*params, out), (1, 1, 1), threads, tuple(shared), tuple(regs), ir.Seq(body))
    return ir.Program((k,), tuple(params), out)


def _quarters(rng, shape, np_dtype):
    """Multiples of 1/4 in [-2, 2]: exact in every type, and so are one MMA's products and sums."""
    return (rng.integers(-8, 9, size=shape) / 4.0).astype(np_dtype)


# =========================================================================== mma.sync, the ISA's fragments
#
# lane l, g = l // 4 ("groupID"), q = l % 4 ("threadID_in_group"), i the value index (low to high)

def _g(l):
    return l // 4


def _q(l):
    return l % 4


ISA_MMA = {
    # m16n8k16, 16-bit A / B (PTX ISA "mma.m16n8k16" fragment figures)
    (16, 8, 16): {
        "a": lambda l, i: (_g(l) + 8 * ((i // 2) % 2), 2 * _q(l) + i % 2 + 8 * (i // 4)),
        "b": lambda l, i: (2 * _q(l) + i % 2 + 8 * (i // 2), _g(l)),
        "c": lambda l, i: (_g(l) + 8 * (i // 2), 2 * _q(l) + i % 2),
    },
    # m16n8k8 with .tf32 A / B
    (16, 8, 8): {
        "a": lambda l, i: (_g(l) + 8 * (i % 2), _q(l) + 4 * (i // 2)),
        "b": lambda l, i: (_q(l) + 4 * i, _g(l)),
        "c": lambda l, i: (_g(l) + 8 * (i // 2), 2 * _q(l) + i % 2),
    },
}


def _qp(l):
    """Volta m8n8k4: the quad-pair of lane l (lanes 4p..4p+3 and 4p+16..4p+19) and the row /
    column the lane holds within it."""
    return (l // 4) % 4, l % 4 + 4 * (l // 16)


ISA_M8N8K4 = {
    "a": lambda l, i: (_qp(l)[1], i),                                     # row-major A: lane's row, k = i
    "b": lambda l, i: (i, _qp(l)[1]),                                     # col-major B: lane's column
    "c.f16": lambda l, i: (_qp(l)[1], i),                                 # f16 C: lane's row
    "c.f32": lambda l, i: (l % 2 + (i // 2) % 2 * 2 + 4 * (l // 16),      # f32 C: the ISA's table
                           i // 4 * 4 + (l // 2) % 2 * 2 + i % 2),
}

MMAS = [a for a in catalog.ALL_ATOMS if a.family == "mma"]


def _mma_rules(atom):
    m, n, k = atom.shape
    if (m, n, k) == (8, 8, 4):
        acc = atom.dtype_of("c").name
        rule = dict(a=ISA_M8N8K4["a"], b=ISA_M8N8K4["b"], c=ISA_M8N8K4[f"c.{acc}"])
        return 4, (lambda l: _qp(l)[0]), rule
    return 1, (lambda l: 0), ISA_MMA[(m, n, k)]


def _values(atom, name):
    """Values of operand ``name`` one lane holds, from the ISA: the tile size over the lanes."""
    m, n, k = atom.shape
    tile = {"a": m * k, "b": k * n, "c": m * n, "d": m * n}[name]
    return tile * (4 if atom.shape == (8, 8, 4) else 1) // 32


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in MMAS])
def test_mma_fragments_follow_the_isa(atom):
    groups, group_of, rule = _mma_rules(atom)
    m, n, k = atom.shape
    shapes = {"a": (m, k), "b": (k, n), "c": (m, n)}
    types = {x: atom.dtype_of(x) for x in ("a", "b", "c", "d")}
    bufs = {x: _gbuf(x, types[x], (groups, *shapes[x])) for x in ("a", "b", "c")}
    out = _gbuf("out", types["d"], (groups, m, n), "out")
    regs = {x: ir.RegBuffer(f"r_{x}", types[x], _values(atom, x)) for x in ("a", "b", "c", "d")}
    body = []
    for x in ("a", "b", "c"):
        rows, cols = shapes[x]
        for i in range(_values(atom, x)):
            lane_terms = [(lane, rule[x](lane, i)) for lane in range(32)]
            # the ISA's (row, col) as an index expression of the lane: one unrolled load per value,
            # the address chosen per lane by a select over the 32 lanes' coordinates
            offset = _per_lane([group_of(lane) * rows * cols + r * cols + c for lane, (r, c) in lane_terms])
            body.append(_call(_ld(types[x].bits // 8), src=ir.MemRef(bufs[x], offset), dst=ir.RegRef(regs[x], i)))
    body.append(_call(atom, d=ir.RegRef(regs["d"], 0), a=ir.RegRef(regs["a"], 0), b=ir.RegRef(regs["b"], 0),
                      c=ir.RegRef(regs["c"], 0)))
    for i in range(_values(atom, "d")):
        offset = _per_lane([group_of(lane) * m * n + rule["c"](lane, i)[0] * n + rule["c"](lane, i)[1]
                            for lane in range(32)])
        body.append(_call(_st(types["d"].bits // 8), dst=ir.MemRef(out, offset), src=ir.RegRef(regs["d"], i)))
    program = _program(tuple(bufs.values()), out, body, regs=tuple(regs.values()))
    rng = np.random.default_rng(7)
    feed = {x: _quarters(rng, (groups, *shapes[x]), np.float32) for x in ("a", "b", "c")}
    got = run_program(program, dict(feed))["out"].astype(np.float64)
    want = np.einsum("gmk,gkn->gmn", feed["a"].astype(np.float64), feed["b"].astype(np.float64)) + feed["c"]
    np.testing.assert_array_equal(got, want)


def _per_lane(values: list[int]):
    """An index expression of the lane that takes ``values[lane]``: a table lookup written as
    sums of lane bits, ``values[l] = sum_j [bit j of l] * delta_j`` when the table is linear in
    the lane bits, else a select chain."""
    base = values[0]
    deltas = [values[1 << j] - base for j in range(5)]
    if all(values[l] == base + sum(d for j, d in enumerate(deltas) if l >> j & 1) for l in range(32)):
        e = base
        for j, d in enumerate(deltas):
            if d:
                e = e + d * ((T32 >> j) & 1)
        return e
    e = values[31]
    for lane in range(30, -1, -1):
        e = ir.expr.select(ir.expr.binop("==", T32, lane), values[lane], e)
    return e


# =========================================================================== ldmatrix / stmatrix

LDSM = [a for a in catalog.ALL_ATOMS if a.family == "ldmatrix"]
PITCH = 24          # elements per shared row: rows 48 bytes apart, 16-byte aligned
ROWS = 32


def _row_of_lane(lane):
    """Lane ``lane`` supplies the address of shared row ``(5 * lane + 3) % 32``: any distinct
    rows will do for the hardware, so the test scatters them."""
    return (5 * lane + 3) % ROWS


def _matrix_row(lane, num):
    """The ISA: threads 8i .. 8i+7 give the addresses of the 8 rows of matrix i (x1: threads
    0-7, x2: 0-15, x4: all); the others' addresses are ignored (here they repeat)."""
    lane = lane % (8 * num)
    return lane // 8, lane % 8


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in LDSM])
def test_ldmatrix_follows_the_isa(atom):
    num = int(atom.name.split("_x")[1][0])
    trans = atom.trans
    f16 = dt.f16
    smem_g = _gbuf("smem_in", f16, (ROWS * PITCH,))
    out = _gbuf("out", f16, (32, 2 * num), "out")
    sh = ir.SharedBuffer("smem", f16, ROWS * PITCH)
    stage = ir.RegBuffer("stage", f16, ROWS * PITCH // 32)
    frag = ir.RegBuffer("frag", f16, 2 * num)
    per = ROWS * PITCH // 32
    # stage the whole shared array (per elements per lane, in 2-byte moves to keep it simple)
    body = []
    for j in range(per):
        body.append(_call(_ld(2), src=ir.MemRef(smem_g, T32 * per + j), dst=ir.RegRef(stage, j)))
        body.append(_call(catalog.copy_atom("RF", "SH", 2), dst=ir.MemRef(sh, T32 * per + j),
                          src=ir.RegRef(stage, j)))
    body.append(ir.Barrier("staged"))
    addr = _per_lane([_row_of_lane(8 * _matrix_row(lane, num)[0] + _matrix_row(lane, num)[1]) * PITCH
                      for lane in range(32)])
    body.append(_call(atom, src=ir.MemRef(sh, addr), dst=ir.RegRef(frag, 0)))
    for v in range(2 * num):
        body.append(_call(_st(2), dst=ir.MemRef(out, T32 * (2 * num) + v), src=ir.RegRef(frag, v)))
    program = _program((smem_g,), out, body, shared=(sh,), regs=(stage, frag))
    rng = np.random.default_rng(num + 10 * trans)
    smem = rng.integers(0, 2 ** 16, size=ROWS * PITCH).astype(np.uint16).view(np.float16)
    got = run_program(program, {"smem_in": smem.copy()})["out"].view(np.uint16)
    grid = smem.view(np.uint16).reshape(ROWS, PITCH)
    want = np.zeros((32, 2 * num), np.uint16)
    for lane in range(32):
        for i in range(num):
            for e in range(2):
                r, c = (2 * (lane % 4) + e, lane // 4) if trans else (lane // 4, 2 * (lane % 4) + e)
                want[lane, 2 * i + e] = grid[_row_of_lane(8 * i + r), c]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in sm90a.STMATRIX_ATOMS])
def test_stmatrix_follows_the_isa(atom):
    """stmatrix: register i of lane l holds elements (l // 4, 2 * (l % 4) + e) of matrix i (with
    .trans (2 * (l % 4) + e, l // 4)); row r of matrix i goes to the address of lane 8i + r."""
    num = int(atom.name.split("_x")[1][0])
    trans = atom.trans
    f16 = dt.f16
    vals_g = _gbuf("vals", f16, (32, 2 * num))
    out = _gbuf("out", f16, (ROWS * PITCH,), "out")
    sh = ir.SharedBuffer("smem", f16, ROWS * PITCH)
    frag = ir.RegBuffer("frag", f16, 2 * num)
    per = ROWS * PITCH // 32
    back = ir.RegBuffer("back", f16, per)
    body = [_call(_ld(2), src=ir.MemRef(vals_g, T32 * (2 * num) + v), dst=ir.RegRef(frag, v)) for v in range(2 * num)]
    addr = _per_lane([_row_of_lane(8 * _matrix_row(lane, num)[0] + _matrix_row(lane, num)[1]) * PITCH
                      for lane in range(32)])
    body.append(_call(atom, dst=ir.MemRef(sh, addr), src=ir.RegRef(frag, 0)))
    body.append(ir.Barrier("stored"))
    for j in range(per):
        body.append(_call(catalog.copy_atom("SH", "RF", 2), src=ir.MemRef(sh, T32 * per + j), dst=ir.RegRef(back, j)))
        body.append(_call(_st(2), dst=ir.MemRef(out, T32 * per + j), src=ir.RegRef(back, j)))
    program = _program((vals_g,), out, body, shared=(sh,), regs=(frag, back))
    rng = np.random.default_rng(num)
    vals = (rng.integers(1, 2 ** 15, size=(32, 2 * num)).astype(np.uint16)).view(np.float16)
    got = run_program(program, {"vals": vals.copy()})["out"].view(np.uint16).reshape(ROWS, PITCH)
    want = np.zeros((ROWS, PITCH), np.uint16)         # shared memory starts as zeros
    v16 = vals.view(np.uint16)
    for i in range(num):
        for r in range(8):
            for c in range(8):
                lane, e = ((4 * c + r // 2), r % 2) if trans else ((4 * r + c // 2), c % 2)
                want[_row_of_lane(8 * i + r), c] = v16[lane, 2 * i + e]
    np.testing.assert_array_equal(got, want)


# =========================================================================== shuffles

def test_shuffles_follow_the_isa():
    """shfl.sync.idx: lane l reads lane (src[l] & 31); bfly: lane l ^ (mask[l] & 31)."""
    for atom, rule in ((sm70.shfl_sync_idx_b32, lambda l, x: x & 31), (sm70.shfl_sync_bfly_b32, lambda l, x: l ^ (x & 31))):
        src_g, lane_g = _gbuf("src", dt.f32, (32,)), _gbuf("lane", dt.i32, (32,))
        out = _gbuf("out", dt.f32, (32,), "out")
        rv, rl, ro = ir.RegBuffer("v", dt.f32, 1), ir.RegBuffer("l", dt.i32, 1), ir.RegBuffer("o", dt.f32, 1)
        lane_name = [o.name for o in atom.operands if o.role == "in" and o.name != "src"][0]
        body = [_call(_ld(4), src=ir.MemRef(src_g, T32), dst=ir.RegRef(rv, 0)),
                _call(_ld(4), src=ir.MemRef(lane_g, T32), dst=ir.RegRef(rl, 0)),
                _call(atom, dst=ir.RegRef(ro, 0), src=ir.RegRef(rv, 0), **{lane_name: ir.RegRef(rl, 0)}),
                _call(_st(4), dst=ir.MemRef(out, T32), src=ir.RegRef(ro, 0))]
        program = _program((src_g, lane_g), out, body, regs=(rv, rl, ro))
        rng = np.random.default_rng(3)
        src = rng.standard_normal(32).astype(np.float32)
        lanes = rng.integers(0, 64, size=32).astype(np.int32)
        got = run_program(program, {"src": src.copy(), "lane": lanes.copy()})["out"]
        np.testing.assert_array_equal(got, src[[rule(l, int(lanes[l])) for l in range(32)]])


# =========================================================================== wgmma

def _isa_d(t, i):
    """wgmma D (64 x N, f32): warp w = t // 32 owns rows 16w..16w+15; value i of thread t at row
    16w + t%32 // 4 + 8 * (i // 2 % 2), column 8 * (i // 4) + 2 * (t % 4) + i % 2."""
    return 16 * (t // 32) + (t % 32) // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (t % 4) + i % 2


def _isa_a(t, i):
    """wgmma A in registers (64 x 16, 16-bit): row 16w + t%32 // 4 + 8 * (i // 2 % 2),
    column 2 * (t % 4) + i % 2 + 8 * (i // 4)."""
    return 16 * (t // 32) + (t % 32) // 4 + 8 * ((i // 2) % 2), 2 * (t % 4) + i % 2 + 8 * (i // 4)


def _per_thread128(values):
    """An index expression of the warpgroup thread taking ``values[t]`` (linear in the thread bits)."""
    base = values[0]
    deltas = [values[1 << j] - base for j in range(7)]
    assert all(values[t] == base + sum(d for j, d in enumerate(deltas) if t >> j & 1) for t in range(128)), \
        "not linear in the thread bits"
    e = base
    for j, d in enumerate(deltas):
        if d:
            e = e + d * ((T128 >> j) & 1)
    return e


def _sw128_element(r, k):
    """Element offset of (r, k) of a K-major operand in the ISA's 128-byte-swizzle canonical
    layout: 8 rows of 128 bytes per 1024-byte atom (SBO 1024), k along the row, then the 16-byte
    chunk index XORed with the row within the atom.  Ints or index expressions."""
    byte = (r % 8) * 128 + (r // 8) * 1024 + k * 2
    return (byte ^ (((byte >> 7) & 7) << 4)) // 2


@pytest.mark.parametrize("n, ab, a_regs", [(8, "f16", False), (64, "bf16", False), (256, "f16", False),
                                            (16, "f16", True), (64, "bf16", True)])
def test_wgmma_fragments_follow_the_isa(n, ab, a_regs):
    atom = sm90a.wgmma_atom(n, ab, a_in_registers=a_regs)
    d = dt.dtype(ab)
    a_g, b_g = _gbuf("a", d, (64, 16)), _gbuf("b", d, (16, n))
    c_g, out = _gbuf("c", dt.f32, (64, n)), _gbuf("out", dt.f32, (64, n), "out")
    stage = ir.RegBuffer("stage", d, 1)
    acc = ir.RegBuffer("acc", dt.f32, n // 2)
    regs, shared, body = [stage, acc], [], []

    def staged(src, rows, g_offset, name):
        buf = ir.SharedBuffer(name, d, max(rows // 8, 1) * 512, align=1024)
        shared.append(buf)
        i = ir.expr.Var(f"i_{name}", rows * 16 // 128)
        e = T128 + 128 * i
        r, k = e // 16, e % 16
        body.append(ir.For(i, rows * 16 // 128, ir.Seq([
            _call(_ld(2), src=ir.MemRef(src, g_offset(r, k)), dst=ir.RegRef(stage, 0)),
            _call(catalog.copy_atom("RF", "SH", 2), dst=ir.MemRef(buf, _sw128_element(r, k)), src=ir.RegRef(stage, 0)),
        ])))
        return ir.DescRef(buf, 0, 128, 16, 1024)

    desc_b = staged(b_g, n, lambda r, k: k * n + r, "sB")              # B is (k, n); stored K-major: n rows
    args = {}
    if not a_regs:
        args["desc_a"] = staged(a_g, 64, lambda r, k: r * 16 + k, "sA")
    body.append(_call(sm90a.fence_proxy_async))
    body.append(ir.Barrier("operands staged"))
    for i in range(n // 2):
        body.append(_call(_ld(4), src=ir.MemRef(c_g, _per_thread128([_isa_d(t, i)[0] * n + _isa_d(t, i)[1]
                                                                     for t in range(128)])),
                          dst=ir.RegRef(acc, i)))
    if a_regs:
        frag = ir.RegBuffer("frag_a", d, 8)
        regs.append(frag)
        for i in range(8):
            body.append(_call(_ld(2), src=ir.MemRef(a_g, _per_thread128([_isa_a(t, i)[0] * 16 + _isa_a(t, i)[1]
                                                                         for t in range(128)])),
                              dst=ir.RegRef(frag, i)))
        args["a"] = ir.RegRef(frag, 0)
    body.append(_call(sm90a.wgmma_fence))
    body.append(_call(atom, d=ir.RegRef(acc, 0), desc_b=desc_b, scale_d=ir.Scalar(1), **args))
    body.append(_call(sm90a.wgmma_commit))
    body.append(_call(catalog.with_immediates(sm90a.wgmma_wait, n=0)))
    for i in range(n // 2):
        body.append(_call(_st(4), dst=ir.MemRef(out, _per_thread128([_isa_d(t, i)[0] * n + _isa_d(t, i)[1]
                                                                     for t in range(128)])),
                          src=ir.RegRef(acc, i)))
    program = _program((a_g, b_g, c_g), out, body, threads=128, shared=shared, regs=regs)
    rng = np.random.default_rng(n)
    feed = {"a": _quarters(rng, (64, 16), np.float32), "b": _quarters(rng, (16, n), np.float32),
            "c": _quarters(rng, (64, n), np.float32)}
    got = run_program(program, dict(feed))["out"].astype(np.float64)
    want = feed["a"].astype(np.float64) @ feed["b"].astype(np.float64) + feed["c"]
    np.testing.assert_array_equal(got, want)


def test_the_fragment_formulas_are_bijections():
    """The formulas above cover their tiles exactly once (a typo in them would show here)."""
    assert sorted(_isa_d(t, i) for t in range(128) for i in range(8)) == [(r, c) for r in range(64) for c in range(16)]
    assert sorted(_isa_a(t, i) for t in range(128) for i in range(8)) == [(r, c) for r in range(64) for c in range(16)]
    for rule, (m, n), vals in ((ISA_MMA[(16, 8, 16)]["a"], (16, 16), 8), (ISA_MMA[(16, 8, 16)]["b"], (16, 8), 4),
                               (ISA_MMA[(16, 8, 16)]["c"], (16, 8), 4), (ISA_MMA[(16, 8, 8)]["a"], (16, 8), 4),
                               (ISA_MMA[(16, 8, 8)]["b"], (8, 8), 2)):
        assert sorted(rule(lane, i) for lane in range(32) for i in range(vals)) == \
            [(r, c) for r in range(m) for c in range(n)]
    for key, vals in (("a", 4), ("b", 4), ("c.f16", 8), ("c.f32", 8)):
        for p in range(4):
            lanes = [lane for lane in range(32) if _qp(lane)[0] == p]
            cells = sorted(ISA_M8N8K4[key](lane, i) for lane in lanes for i in range(vals))
            assert len(set(cells)) == len(cells) == 8 * vals, key


def test_mma_atoms_are_the_isa_shapes():
    assert {a.shape for a in MMAS} == {(16, 8, 16), (16, 8, 8), (8, 8, 4)}
    assert sm80.mma_m16n8k16_f16_f32 in MMAS and sm70.mma_m8n8k4_f16_f32 in MMAS
