"""The atom tables, record by record.

Every test that checks a property of an atom is parametrized over ``catalog.ALL_ATOMS`` (or the
part of it the property concerns), so a new record is tested as soon as it is listed.

Thread count convention: a TV layout ranges over the threads of the atom's issuing group,
``atom.threads``.  For the Volta quad-pair MMA that is 8 (the local index ``q`` of a quad-pair),
not the 32 lanes of the warp that issues it; ``sm70.QUADPAIR_LANES`` maps ``q`` to a lane.

The fragment layouts are checked against formulas written from the PTX ISA's own text (the
"row = ... col = ..." rules of the mma fragment figures and ldmatrix's description), which are
independent of how the tables spell them as CuTe layouts; NVRTC then checks that every template
is valid PTX for sm_80 and sm_90a.  The ``gpu`` tests run the atoms on a device and compare the
registers they produce with the tables.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from firesched import dtypes as dt
from firesched.hardware import (
    SM70,
    SM80,
    SM86,
    SM89,
    SM90A,
    TARGETS,
    Target,
    catalog,
    convert,
    sm70,
    sm80,
    target,
)
from firesched.hardware.atoms.base import (
    BLOCK,
    CONVERT,
    COPY,
    CP_ASYNC,
    FLAG,
    GROUP_THREADS,
    LDMATRIX,
    MMA,
    QUADPAIR,
    SHUFFLE,
    SYNC,
    WARP,
    Atom,
    asm_node,
)
from firesched.hardware.target import ORDER

ALL = catalog.ALL_ATOMS
MODULES = {"sm70": sm70, "sm80": sm80, "convert": convert}


def _params(atoms):
    return [pytest.param(a, id=a.name) for a in atoms]


def _of(*families):
    return [a for a in ALL if a.family in families]


MMAS = _of(MMA)
LDSM = _of(LDMATRIX)
SHUFFLES = _of(SHUFFLE)
LOADS = [a for a in _of(COPY) if a.dst_memory == "RF"]

# Template parameters PTX only takes as constants; the printer substitutes them as text.
IMMEDIATES = {"cp_async_wait": {"n": 1}, "flag_wait": {"uid": 0}, "flag_wait_count": {"uid": 0}}


def _ready(atom: Atom) -> Atom:
    return catalog.with_immediates(atom, **IMMEDIATES.get(atom.name, {}))


# =========================================================================== table integrity

@pytest.mark.parametrize("atom", _params(ALL))
def test_record_is_well_formed(atom):
    module = MODULES[atom.catalog]
    assert getattr(module, atom.name) is atom, "module-level name must equal the record's name"
    assert atom in module.ATOMS
    assert repr(atom) == f"{atom.catalog}.{atom.name}"
    assert atom.doc and "\n" not in atom.doc
    assert atom.min_target in ORDER
    assert atom.group in GROUP_THREADS or atom.group == BLOCK
    names = [o.name for o in atom.operands]
    assert len(set(names)) == len(names)
    assert {n for n, _ in atom.dtypes} <= set(names)
    for o in atom.operands:
        assert o.role in ("in", "out", "inout")
        assert o.memory in ("RF", "SH", "GL")
        if o.memory != "RF":
            assert o.role == "in", "address operands are inputs even for stores"
    if atom.kind == "Move":
        assert atom.src_memory in ("RF", "SH", "GL") and atom.dst_memory in ("RF", "SH", "GL")
        if (atom.src_memory, atom.dst_memory) == ("RF", "RF"):
            assert atom.alignment == 0, "a register to register move has no address to align"
        else:
            assert atom.alignment > 0 and atom.alignment & (atom.alignment - 1) == 0
    if atom.family == MMA:
        assert atom.kind == "MatMul" and len(atom.shape) == 3
        assert [o.name for o in atom.operands] == ["d", "a", "b", "c"]
    if atom.family in (MMA, COPY, CP_ASYNC, LDMATRIX, SHUFFLE, CONVERT):
        assert callable(atom.semantics)
    if atom.family == CONVERT:
        assert all(o.memory == "RF" and o.reg_bits == 32 for o in atom.operands)
        assert [o.role for o in atom.operands].count("out") == 1
    if atom.family == SYNC:
        assert atom.operands == () and atom.semantics is None
    if atom.family == FLAG:
        # one 32-bit flag in global memory, and for a store the value: no tile, no numpy meaning
        assert atom.kind == "Sync" and atom.semantics is None and atom.alignment == 4
        assert [o.memory for o in atom.operands][0] == "GL"


def test_every_record_of_a_table_is_listed():
    for name, module in MODULES.items():
        records = {v for v in vars(module).values() if isinstance(v, Atom)}
        assert records == set(module.ATOMS), name
        assert all(a.catalog == name for a in module.ATOMS)
    assert len({a.name for a in ALL}) == len(ALL)
    assert set(ALL) == set(sm70.ATOMS) | set(sm80.ATOMS) | set(convert.ATOMS)


# =========================================================================== layouts

def _tile_of(atom: Atom, operand: str) -> tuple[int, int]:
    if atom.family == MMA:
        m, n, k = atom.shape
        return {"a": (m, k), "b": (k, n), "c": (m, n), "d": (m, n)}[operand]
    return tuple(atom.shape)


@pytest.mark.parametrize("atom", _params(ALL))
def test_register_tv_layouts_are_bijective(atom):
    for o in atom.operands:
        if o.memory != "RF":
            assert o.tv is None
            continue
        if atom.family in (SHUFFLE, FLAG):   # one value per lane, no tile
            assert o.tv is None
            continue
        if atom.family == CONVERT and o.tv is None:     # a run-time scalar (ir.Scalar), no tile
            assert o.role == "in" and (o.regs, o.values, o.reg_bits) == (1, 1, 32), o
            continue
        tv = o.tv
        assert tv is not None, f"{atom.name}.{o.name} has no TV layout"
        assert tv.tile == _tile_of(atom, o.name)
        assert tv.num_threads == atom.threads
        assert tv.num_values == o.values
        assert tv.is_bijective(), f"{atom.name}.{o.name}: {tv} does not cover its tile exactly once"


@pytest.mark.parametrize("atom", _params(_of(MMA, COPY, LDMATRIX, SHUFFLE, CONVERT)))
def test_register_bits_hold_the_values(atom):
    for o in atom.operands:
        if o.memory != "RF":
            continue
        bits = atom.dtype_of(o.name).bits
        if atom.family == COPY and atom.width == 1:
            # one byte zero-extended into a 16-bit register: PTX has no 8-bit registers
            assert (o.regs, o.reg_bits, o.values) == (1, 16, 1)
            continue
        assert o.regs * o.reg_bits == o.values * bits, o
        # f32 values print with the "f" constraint: MMA accumulators, a conversion's f32 source
        assert o.float_regs == (atom.family in (MMA, CONVERT) and atom.dtype_of(o.name) == dt.f32)
        assert o.constraint in ("r", "f", "h")


@pytest.mark.parametrize("atom", _params(_of(COPY, CP_ASYNC, LDMATRIX)))
def test_address_layouts_point_inside_the_tile(atom):
    rows, cols = atom.shape
    mem = [o for o in atom.operands if o.memory != "RF"]
    assert mem, "a move has at least one address operand"
    for o in mem:
        assert o.addr is not None
        offs = o.addr.offsets()
        assert o.addr.size() <= atom.threads
        assert offs.min() >= 0 and offs.max() < rows * cols
        if atom.family == LDMATRIX:
            # each address is the start of an 8-element (16-byte) row of one 8x8 matrix, and the
            # addresses name every such row of the tile exactly once
            r, c = offs % rows, offs // rows
            assert np.all(c % 8 == 0)
            assert len({(int(x), int(y)) for x, y in zip(r, c)}) == rows * cols // 8 == offs.size
            assert o.values == 8 and atom.alignment == 16
        else:
            assert o.addr.size() == 1 and offs.tolist() == [0]
            assert o.values == atom.width == atom.alignment


# =========================================================================== MMA semantics

def _random(rng, d: dt.DType, shape) -> np.ndarray:
    x = rng.standard_normal(shape)
    if d == dt.tf32:
        return dt.round_to(dt.tf32, x).astype(np.float32)
    return x.astype(d.np)


def _tolerance(acc: dt.DType) -> dict:
    return dict(rtol=1e-6, atol=1e-6) if acc == dt.f32 else dict(rtol=2e-3, atol=4e-3)


@pytest.mark.parametrize("atom", _params(MMAS))
def test_mma_semantics_is_a_matmul(atom):
    rng = np.random.default_rng(0)
    m, n, k = atom.shape
    a = _random(rng, atom.dtype_of("a"), (m, k))
    b = _random(rng, atom.dtype_of("b"), (k, n))
    c = _random(rng, atom.dtype_of("c"), (m, n))
    d = atom.semantics(a, b, c)
    assert d.shape == (m, n) and d.dtype == atom.dtype_of("d").np
    ref = a.astype(np.float64) @ b.astype(np.float64) + c.astype(np.float64)
    np.testing.assert_allclose(d.astype(np.float64), ref, **_tolerance(atom.dtype_of("d")))


def test_tf32_mma_rounds_its_inputs():
    atom = sm80.mma_m16n8k8_tf32_f32
    a = np.full((16, 8), 1 + 2.0 ** -20, dtype=np.float32)   # not a tf32 value: rounds to 1
    b = np.eye(8, dtype=np.float32)
    d = atom.semantics(a, b, np.zeros((16, 8), np.float32))
    assert np.all(d == 1.0)


# PTX ISA fragment rules, lane l and element i ("low to high" order of the registers):
# g = l >> 2 (groupID), t = l % 4 (threadID_in_group); Volta's high half h = l >> 4.
def _g(l):
    return l >> 2


def _t(l):
    return l % 4


def _qp_row(l):
    return l % 4 + 4 * (l >> 4)


_C_16x8 = lambda l, i: (_g(l) + 8 * (i >> 1), 2 * _t(l) + (i & 1))  # noqa: E731
PTX_FRAGMENTS = {
    "m16n8k16": {
        "a": lambda l, i: (_g(l) + 8 * ((i >> 1) & 1), 2 * _t(l) + (i & 1) + 8 * (i >> 2)),
        "b": lambda l, i: (2 * _t(l) + (i & 1) + 8 * (i >> 1), _g(l)),
        "c": _C_16x8,
    },
    "m16n8k8.tf32": {
        "a": lambda l, i: (_g(l) + 8 * (i & 1), _t(l) + 4 * (i >> 1)),
        "b": lambda l, i: (_t(l) + 4 * i, _g(l)),
        "c": _C_16x8,
    },
    "m8n8k4.f32": {
        "a": lambda l, i: (_qp_row(l), i),
        "b": lambda l, i: (i, _qp_row(l)),
        "c": lambda l, i: ((l & 1) + (i & 2) + 4 * (l >> 4), (i & 4) + (l & 2) + (i & 1)),
    },
    "m8n8k4.f16": {
        "a": lambda l, i: (_qp_row(l), i),
        "b": lambda l, i: (i, _qp_row(l)),
        "c": lambda l, i: (_qp_row(l), i),
    },
}


def _fragments(atom: Atom) -> dict:
    m, n, k = atom.shape
    if (m, n, k) == (16, 8, 16):
        f = PTX_FRAGMENTS["m16n8k16"]
    elif (m, n, k) == (16, 8, 8):
        f = PTX_FRAGMENTS["m16n8k8.tf32"]
    else:
        f = PTX_FRAGMENTS[f"m8n8k4.{atom.dtype_of('c')}"]
    return {**f, "d": f["c"]}


def _units(atom: Atom) -> list[list[int]]:
    """Lanes of each independent unit of one warp issue, in local thread order."""
    if atom.group == QUADPAIR:
        return [[int(sm70.QUADPAIR_LANES(q)) + 4 * p for q in range(8)] for p in range(4)]
    assert atom.group == WARP
    return [list(range(32))]


@pytest.mark.parametrize("atom", _params(MMAS))
def test_mma_tv_layouts_match_the_ptx_isa(atom):
    units = _units(atom)
    assert sorted(sum(units, [])) == list(range(32))
    frag = _fragments(atom)
    for lanes in units:
        for q, lane in enumerate(lanes):
            for o in atom.operands:
                got = [tuple(int(x) for x in o.tv.coord(q, i)) for i in range(o.values)]
                want = [frag[o.name](lane, i) for i in range(o.values)]
                assert got == want, f"{atom.name}.{o.name}, lane {lane}"


@pytest.mark.parametrize("atom", _params(MMAS))
def test_mma_warp_simulation(atom):
    """Distribute random tiles to the lanes by the PTX ISA's rules, let the record compute the
    warp's result (gather fragments by TV layout, ``semantics``, scatter D), and compare with the
    tile-level result read back through the PTX ISA's rules."""
    rng = np.random.default_rng(1)
    frag = _fragments(atom)
    units = _units(atom)
    tiles = [{o.name: _random(rng, atom.dtype_of(o.name), _tile_of(atom, o.name))
              for o in atom.operands if o.role == "in"} for _ in units]
    regs = {o.name: np.zeros((32, o.values), atom.dtype_of(o.name).np)
            for o in atom.operands if o.role == "in"}
    for tile, lanes in zip(tiles, units):
        for name, r in regs.items():
            for lane in lanes:
                r[lane] = [tile[name][frag[name](lane, i)] for i in range(r.shape[1])]

    dop = atom.operand("d")
    d_regs = np.zeros((32, dop.values), atom.dtype_of("d").np)
    for lanes in units:
        seen = {n: atom.operand(n).tv.gather(regs[n][lanes]) for n in ("a", "b", "c")}
        d_regs[lanes] = dop.tv.scatter(atom.semantics(seen["a"], seen["b"], seen["c"]))

    for tile, lanes in zip(tiles, units):
        want = atom.semantics(tile["a"], tile["b"], tile["c"])
        for lane in lanes:
            expect = [want[frag["d"](lane, i)] for i in range(dop.values)]
            np.testing.assert_array_equal(d_regs[lane], expect)


# =========================================================================== ldmatrix

def _simulate_ldmatrix(smem: np.ndarray, addrs: list[int], num: int, trans: bool) -> np.ndarray:
    """ldmatrix as the PTX ISA describes it: lanes 8i..8i+7 give the row addresses of matrix i;
    lane l receives in register i the elements (l//4, 2*(l%4)+e) of matrix i, e = 0 in the low
    half, 1 in the high half; with .trans the elements (2*(l%4)+e, l//4)."""
    out = np.zeros((32, 2 * num), smem.dtype)
    for lane in range(32):
        for i in range(num):
            for e in range(2):
                r, c = (2 * (lane % 4) + e, lane // 4) if trans else (lane // 4, 2 * (lane % 4) + e)
                out[lane, 2 * i + e] = smem[addrs[8 * i + r] + c]
    return out


def _ldmatrix_case(atom: Atom, rng, base: int, pitch: int):
    """A random shared array, the per-lane addresses (elements) of the tile at ``base`` with row
    pitch ``pitch``, and the tile itself in memory coordinates."""
    rows, cols = atom.shape
    smem = rng.integers(0, 2 ** 16, size=1024, dtype=np.uint64).astype(np.uint16)
    addr = atom.operand("src").addr
    offs = addr.offsets()
    addrs = [base + int(offs[t % offs.size] % rows) * pitch + int(offs[t % offs.size] // rows)
             for t in range(32)]
    tile = np.array([[smem[base + r * pitch + c] for c in range(cols)] for r in range(rows)])
    return smem, addrs, tile


@pytest.mark.parametrize("pitch", [16, 24, 40])
@pytest.mark.parametrize("atom", _params(LDSM))
def test_ldmatrix_tv_layout_matches_the_ptx_isa(atom, pitch):
    rng = np.random.default_rng(pitch)
    smem, addrs, tile = _ldmatrix_case(atom, rng, base=64, pitch=pitch)
    num = atom.operand("dst").regs
    got = _simulate_ldmatrix(smem, addrs, num, atom.trans)
    np.testing.assert_array_equal(got, atom.operand("dst").tv.scatter(atom.semantics(tile)))


def test_ldmatrix_feeds_mma_fragments():
    mma = sm80.mma_m16n8k16_f16_f32
    assert sm80.ldmatrix_x4.operand("dst").tv == mma.operand("a").tv
    assert sm80.ldmatrix_x2_trans.operand("dst").tv == mma.operand("b").tv
    b = mma.operand("b").tv
    x4t = sm80.ldmatrix_x4_trans.operand("dst").tv
    for t in range(32):
        for v in range(8):
            k, n = b.coord(t, v % 4)
            assert x4t.coord(t, v) == (k, n + 8 * (v // 4))


# =========================================================================== shuffles

def test_shuffle_semantics():
    vals = np.arange(32, dtype=np.float32) * 1.5
    src = (np.arange(32) * 7 + 3) % 32
    np.testing.assert_array_equal(sm70.shfl_sync_idx_b32.semantics(vals, src), vals[src])
    np.testing.assert_array_equal(sm70.shfl_sync_idx_b32.semantics(vals, src + 32), vals[src])
    mask = np.full(32, 5)
    np.testing.assert_array_equal(sm70.shfl_sync_bfly_b32.semantics(vals, mask), vals[np.arange(32) ^ 5])


@pytest.mark.parametrize("atom", _params(_of(COPY, CP_ASYNC, LDMATRIX)))
def test_move_semantics_is_identity(atom):
    tile = np.arange(int(np.prod(atom.shape))).reshape(atom.shape)
    out = atom.semantics(tile)
    np.testing.assert_array_equal(out, tile)
    assert out is not tile


# =========================================================================== stacked semantics

def _semantics_inputs(atom: Atom, rng) -> tuple:
    """One issue's random inputs to ``atom.semantics``, by family."""
    if atom.family == SHUFFLE:
        return rng.standard_normal(32).astype(np.float32), rng.integers(0, 64, 32)
    if atom.family == CONVERT:     # register words, one array per input operand
        return tuple(rng.integers(0, 2 ** 32, size=o.regs, dtype=np.uint64).astype(np.uint32)
                     for o in atom.operands if o.role == "in")
    if atom.kind == "MatMul":
        m, n, k = atom.shape[:3]
        acc = atom.dtype_of("c" if "c" in dict(atom.dtypes) else "d")      # wgmma: D accumulates
        return (_random(rng, atom.dtype_of("a"), (m, k)), _random(rng, atom.dtype_of("b"), (k, n)),
                _random(rng, acc, (m, n)))
    rows, cols = (tuple(atom.shape[:2]) + (1,))[:2] if len(atom.shape) else (1, 1)
    return (rng.standard_normal((rows, cols)).astype(np.float32),)


@pytest.mark.parametrize("atom", _params([a for a in catalog.EVERY_ATOM if a.semantics is not None]))
def test_semantics_take_a_stack(atom):
    """The interpreter runs every issuing group of a statement through one semantics call on
    stacked operands (``Atom.semantics``): each catalog atom's result on a stack equals its
    results one issue at a time."""
    rng = np.random.default_rng(7)
    issues = [_semantics_inputs(atom, rng) for _ in range(5)]
    stacked = np.asarray(atom.semantics(*(np.stack(xs) for xs in zip(*issues))))
    one_by_one = np.stack([np.asarray(atom.semantics(*xs)) for xs in issues])
    assert stacked.shape == one_by_one.shape and stacked.dtype == one_by_one.dtype
    np.testing.assert_array_equal(stacked, one_by_one)


# =========================================================================== printing

def _bindings(atom: Atom) -> dict[str, list[str]]:
    b = {o.name: [f"{o.name}{i}" for i in range(o.regs)] if o.memory == "RF" else [f"{o.name}_addr"]
         for o in atom.operands}
    for extra in sorted(set(re.findall(r"\$(\w+)", atom.ptx)) - set(b)):
        b[extra] = [extra]
    return b


@pytest.mark.parametrize("atom", _params(ALL))
def test_asm_node_expansion(atom):
    ready = _ready(atom)
    b = _bindings(ready)
    asm = asm_node(ready, b)
    assert "$" not in asm.template
    count = sum(len(v) for v in b.values())
    assert len(asm.outputs) + len(asm.inputs) == count
    used = {int(x) for x in re.findall(r"%(\d+)", asm.template)}
    assert used == set(range(count))
    n_out = sum(o.regs for o in atom.operands if o.memory == "RF" and o.role != "in")
    assert len(asm.outputs) == n_out
    assert all(c.startswith("=") for c, _ in asm.outputs)
    assert asm.to_c().startswith("asm volatile(")


def test_immediates_are_substituted():
    w = catalog.with_immediates(sm80.cp_async_wait, n=2)
    assert w.ptx == "cp.async.wait_group 2;" and w.name == "cp_async_wait"
    with pytest.raises(ValueError, match=r"no \$m"):
        catalog.with_immediates(sm80.cp_async_wait, m=2)
    with pytest.raises(ValueError, match="not an int"):
        catalog.with_immediates(sm80.cp_async_wait, n="2")


# =========================================================================== NVRTC

_C_TYPE = {"r": "unsigned", "f": "float", "h": "unsigned short"}
_SLOTS = 32    # 32-bit words of gin/gout per lane


def _kernel_source(atom: Atom):
    """A one-warp kernel that issues ``atom`` once.

    Register inputs come from ``gin[lane*32 + slot]`` and register outputs go to
    ``gout[lane*32 + slot]`` (32-bit words; ``h`` registers use the low half).  Shared memory is
    filled from ``gsmem`` first; shared addresses are ``smem + goff[lane]`` bytes, global ones
    ``gin``/``gout`` + ``goff[32 + lane]`` bytes.  Returns (source, input slots, output slots).
    """
    ready = _ready(atom)
    b = _bindings(ready)
    decl, writes, exprs = [], [], {}
    in_slots, out_slots = {}, {}
    n_in = n_out = 0
    for o in ready.operands:
        if o.memory == "SH":
            exprs[o.name] = ["(unsigned)__cvta_generic_to_shared((char*)smem + goff[t])"]
            continue
        if o.memory == "GL":
            buf = "(const char*)gin" if ready.src_memory == "GL" else "(char*)gout"
            exprs[o.name] = [f"(unsigned long long)({buf} + goff[32 + t])"]
            continue
        ctype = _C_TYPE[o.constraint]
        names = b[o.name]
        exprs[o.name] = names
        if o.role == "in":
            in_slots[o.name] = list(range(n_in, n_in + len(names)))
            for name in names:
                word = f"gin[t * {_SLOTS} + {n_in}]"
                init = f"__uint_as_float({word})" if ctype == "float" else f"({ctype}){word}"
                decl.append(f"    {ctype} {name} = {init};")
                n_in += 1
        else:
            out_slots[o.name] = list(range(n_out, n_out + len(names)))
            for name in names:
                decl.append(f"    {ctype} {name};")
                val = f"__float_as_uint({name})" if ctype == "float" else f"(unsigned){name}"
                writes.append(f"    gout[t * {_SLOTS} + {n_out}] = {val};")
                n_out += 1
    for extra in b:
        if extra not in exprs:     # scalar template operands such as src_size
            exprs[extra] = ["(unsigned)goff[64 + t]"]
    assert n_in <= _SLOTS and n_out <= _SLOTS
    asm = asm_node(ready, exprs).to_c().replace("\n", "\n    ")
    src = "\n".join([
        'extern "C" __global__ void atom_kernel(const unsigned* __restrict__ gin,',
        "                                       unsigned* __restrict__ gout,",
        "                                       const unsigned short* __restrict__ gsmem,",
        "                                       const int* __restrict__ goff) {",
        "    __shared__ alignas(128) unsigned short smem[1024];",
        "    const int t = threadIdx.x;",
        "    for (int i = t; i < 1024; i += blockDim.x) smem[i] = gsmem[i];",
        "    __syncthreads();",
        *decl,
        "    " + asm,
        *writes,
        "}",
    ])
    return src + "\n", in_slots, out_slots


@functools.lru_cache(maxsize=None)
def _nvrtc_archs() -> tuple[int, ...]:
    from cuda.bindings import nvrtc

    err, archs = nvrtc.nvrtcGetSupportedArchs()
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    return tuple(int(a) for a in archs)


def _compile(source: str, arch: str) -> tuple[bool, str, bytes]:
    """Compile with NVRTC to a CUBIN for ``arch`` (ptxas runs, so the inline PTX is checked)."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"atom.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        cubin = b""
        ok = res == nvrtc.nvrtcResult.NVRTC_SUCCESS
        if ok:
            _, size = nvrtc.nvrtcGetCUBINSize(prog)
            cubin = b" " * size
            nvrtc.nvrtcGetCUBIN(prog, cubin)
        return ok, log.decode(errors="replace").rstrip("\x00 \n"), cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_COMPILE_CASES = [pytest.param(a, t.name, id=f"{a.name}-{t.name}")
                  for a in ALL for t in (SM70, SM80, SM90A) if t.supports(a)]


@pytest.mark.parametrize("atom, arch", _COMPILE_CASES)
def test_ptx_compiles_with_nvrtc(atom, arch):
    t = target(arch)
    if int(t.arch[3:5]) not in _nvrtc_archs():
        pytest.skip(f"this NVRTC cannot target {t.arch} (supports sm_{min(_nvrtc_archs())} and later)")
    source, _, _ = _kernel_source(atom)
    ok, log, cubin = _compile(source, t.arch)
    assert ok, f"NVRTC rejected {atom.name} for {t.arch}:\n{log}\n--- source ---\n{source}"
    assert cubin


def test_volta_mma_compiles_on_later_targets():
    # mma.m8n8k4 is a Volta instruction that later targets keep (slower, but legal).
    for atom in (sm70.mma_m8n8k4_f16_f32, sm70.mma_m8n8k4_f16_f16):
        for arch in ("sm_80", "sm_90a"):
            ok, log, _ = _compile(_kernel_source(atom)[0], arch)
            assert ok, f"{atom.name} on {arch}:\n{log}"


# =========================================================================== targets and catalog

def test_targets():
    assert TARGETS == {"sm_70": SM70, "sm_80": SM80, "sm_86": SM86, "sm_89": SM89, "sm_90a": SM90A}
    assert [t.sm_count for t in (SM70, SM80, SM86, SM89, SM90A)] == [80, 108, 82, 58, 132]
    assert SM86.smem_per_block_optin == SM89.smem_per_block_optin == 99 * 1024
    assert (SM86.max_threads_per_sm, SM89.max_threads_per_sm) == (1536, 1536)
    assert {LDMATRIX, CP_ASYNC} <= SM86.families == SM89.families
    assert SM70.smem_per_block_optin == 96 * 1024
    assert SM80.smem_per_block_optin == 166912
    assert SM90A.smem_per_block_optin == 232448
    for t in TARGETS.values():
        assert isinstance(t, Target)
        assert (t.regs_per_thread, t.regs_per_sm, t.max_threads_per_block, t.warp_size) == (255, 65536, 1024, 32)
        assert t.smem_per_block_optin <= t.smem_per_sm
    assert SM90A.has_wgmma and SM90A.has_tma and SM90A.has_clusters
    assert not (SM80.has_wgmma or SM80.has_tma or SM80.has_clusters)
    assert LDMATRIX not in SM70.families and {LDMATRIX, CP_ASYNC} <= SM80.families


@pytest.mark.parametrize("spelling, want", [("sm_80", SM80), ("sm80", SM80), ("SM_80", SM80),
                                            ("sm_90a", SM90A), ("sm90a", SM90A), ("sm70", SM70)])
def test_target_lookup(spelling, want):
    assert target(spelling) is want
    assert target(want) is want


def test_target_lookup_errors():
    with pytest.raises(ValueError, match="sm_90a") as e:
        target("sm_90")
    assert "allowed: sm_70 (interpret only), sm_80, sm_86, sm_89, sm_90a" in str(e.value)
    with pytest.raises(ValueError, match="allowed"):
        target("sm_75")


@pytest.mark.parametrize("atom", _params(ALL))
def test_target_supports_by_generation(atom):
    rank = ORDER.index(atom.min_target)
    for t in TARGETS.values():
        assert t.supports(atom) == (t.rank >= rank)


def test_catalog_lookups():
    assert catalog.by_name("ldmatrix_x4") is sm80.ldmatrix_x4
    with pytest.raises(ValueError, match="ldmatrix_x4"):
        catalog.by_name("ldmatrix_4x")
    assert set(catalog.for_target("sm_70")) == set(sm70.ATOMS)
    assert set(catalog.for_target(SM80)) == set(ALL) == set(catalog.for_target("sm_90a"))
    assert catalog.mma_atoms("f16", "f16", "f32", "sm_80") == (sm80.mma_m16n8k16_f16_f32,
                                                               sm70.mma_m8n8k4_f16_f32)
    assert catalog.mma_atoms(dt.f16, dt.f16, dt.f32, SM70) == (sm70.mma_m8n8k4_f16_f32,)
    assert catalog.mma_atoms("bf16", "bf16", "f32") == (sm80.mma_m16n8k16_bf16_f32,)
    assert catalog.mma_atoms("tf32", "tf32", "f32") == (sm80.mma_m16n8k8_tf32_f32,)
    assert catalog.mma_atoms("i8", "i8", "i32") == ()
    assert catalog.copy_atom("GL", "RF", 16) is sm70.ld_global_16
    assert catalog.copy_atom("RF", "SH", 2) is sm70.st_shared_2
    assert catalog.copy_atom("GL", "SH", 8) is sm80.cp_async_8
    assert catalog.copy_atom("GL", "SH", 16) is sm80.cp_async_16        # L2 only; cp_async_16_ca by name
    with pytest.raises(ValueError, match=r"allowed: \[4, 8, 16\]"):
        catalog.copy_atom("GL", "SH", 2)
    with pytest.raises(ValueError, match="SH -> GL"):
        catalog.copy_atom("SH", "GL", 16)


@pytest.mark.parametrize("atom", _params(_of(COPY, CP_ASYNC)))
def test_copy_values_for(atom):
    for d in (dt.u8, dt.f16, dt.f32, dt.f64):
        n = atom.values_for(d)
        assert n == (atom.width * 8 // d.bits if d.bits <= atom.width * 8 else 0)


# =========================================================================== on a GPU

class _Gpu:
    """The first device, its primary context, and a launcher for one-warp atom kernels."""

    def __init__(self):
        from cuda.bindings import driver

        self.cu = driver
        self._ok(driver.cuInit(0))
        self.dev = self._ok(driver.cuDeviceGet(0))
        attr = driver.CUdevice_attribute
        major = self._ok(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev))
        minor = self._ok(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev))
        self.arch = f"sm_{major}{minor}" + ("a" if major == 9 else "")
        self.ctx = self._ok(driver.cuDevicePrimaryCtxRetain(self.dev))
        self._ok(driver.cuCtxSetCurrent(self.ctx))

    def _ok(self, result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        assert err == self.cu.CUresult.CUDA_SUCCESS, err
        return rest[0] if len(rest) == 1 else tuple(rest)

    def run(self, atom: Atom, gin: np.ndarray, gsmem: np.ndarray, goff: np.ndarray) -> np.ndarray:
        cu = self.cu
        source, _, _ = _kernel_source(atom)
        ok, log, cubin = _compile(source, self.arch)
        assert ok, log
        module = self._ok(cu.cuModuleLoadData(cubin))
        try:
            func = self._ok(cu.cuModuleGetFunction(module, b"atom_kernel"))
            host = [np.ascontiguousarray(gin, np.uint32), np.zeros(32 * _SLOTS, np.uint32),
                    np.ascontiguousarray(gsmem, np.uint16), np.ascontiguousarray(goff, np.int32)]
            ptrs = []
            for h in host:
                p = self._ok(cu.cuMemAlloc(max(h.nbytes, 4)))
                self._ok(cu.cuMemcpyHtoD(p, h.ctypes.data, h.nbytes))
                ptrs.append(p)
            args = [np.array([int(p)], dtype=np.uint64) for p in ptrs]
            argv = np.array([a.ctypes.data for a in args], dtype=np.uint64)
            self._ok(cu.cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, 0, argv.ctypes.data, 0))
            self._ok(cu.cuCtxSynchronize())
            self._ok(cu.cuMemcpyDtoH(host[1].ctypes.data, ptrs[1], host[1].nbytes))
            for p in ptrs:
                self._ok(cu.cuMemFree(p))
            return host[1].reshape(32, _SLOTS)
        finally:
            self._ok(cu.cuModuleUnload(module))


@pytest.fixture(scope="module")
def gpu():
    return _Gpu()


def _words(values: np.ndarray) -> np.ndarray:
    """Per-lane values [32, V] packed into 32-bit words, first value in the low bits."""
    v = np.ascontiguousarray(values)
    if v.dtype.itemsize == 4:
        return v.view(np.uint32)
    return v.view(np.uint16).reshape(32, -1, 2).astype(np.uint32) @ np.array([1, 1 << 16], np.uint32)


def _unwords(words: np.ndarray, np_dtype, n: int) -> np.ndarray:
    """Inverse of ``_words``: the first ``n`` values of ``np_dtype`` of each lane."""
    w = np.ascontiguousarray(words.astype(np.uint32))
    if np.dtype(np_dtype).itemsize == 4:
        return w.view(np_dtype)[:, :n]
    halves = np.stack([w & 0xFFFF, w >> 16], axis=-1).reshape(32, -1).astype(np.uint16)
    return halves.view(np_dtype)[:, :n]


_NO_SMEM = np.zeros(1024, np.uint16)
_NO_OFF = np.zeros(96, np.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("atom", _params(MMAS))
def test_mma_on_gpu(atom, gpu):
    rng = np.random.default_rng(3)
    _, in_slots, out_slots = _kernel_source(atom)
    units = _units(atom)
    tiles = [{o.name: _random(rng, atom.dtype_of(o.name), _tile_of(atom, o.name))
              for o in atom.operands if o.role == "in"} for _ in units]
    gin = np.zeros((32, _SLOTS), np.uint32)
    for name, slots in in_slots.items():
        tv = atom.operand(name).tv
        vals = np.zeros((32, tv.num_values), atom.dtype_of(name).np)
        for tile, lanes in zip(tiles, units):
            vals[lanes] = tv.scatter(tile[name])
        gin[:, slots] = _words(vals)
    out = gpu.run(atom, gin, _NO_SMEM, _NO_OFF)
    dop = atom.operand("d")
    d_vals = _unwords(out[:, out_slots["d"]], atom.dtype_of("d").np, dop.values)
    for tile, lanes in zip(tiles, units):
        got = dop.tv.gather(d_vals[lanes]).astype(np.float64)
        want = atom.semantics(tile["a"], tile["b"], tile["c"]).astype(np.float64)
        tol = dict(rtol=1e-5, atol=1e-5) if atom.dtype_of("d") == dt.f32 else dict(rtol=5e-3, atol=1e-2)
        np.testing.assert_allclose(got, want, **tol, err_msg=f"lanes {lanes}")


@pytest.mark.gpu
@pytest.mark.parametrize("atom", _params(LDSM))
def test_ldmatrix_on_gpu(atom, gpu):
    rng = np.random.default_rng(4)
    pitch, base = 40, 64
    smem, addrs, tile = _ldmatrix_case(atom, rng, base=base, pitch=pitch)
    goff = np.zeros(96, np.int32)
    goff[:32] = np.array(addrs) * 2           # bytes
    out = gpu.run(atom, np.zeros((32, _SLOTS), np.uint32), smem, goff)
    dst = atom.operand("dst")
    got = _unwords(out[:, :dst.regs], np.uint16, dst.values)
    np.testing.assert_array_equal(got, dst.tv.scatter(tile).astype(np.uint16))



@pytest.mark.gpu
@pytest.mark.parametrize("atom", _params(SHUFFLES))
def test_shuffle_on_gpu(atom, gpu):
    rng = np.random.default_rng(5)
    vals = rng.standard_normal(32).astype(np.float32)
    lane = rng.integers(0, 64, size=32).astype(np.uint32)
    _, in_slots, out_slots = _kernel_source(atom)
    gin = np.zeros((32, _SLOTS), np.uint32)
    gin[:, in_slots["src"][0]] = vals.view(np.uint32)
    gin[:, [s for n, s in in_slots.items() if n != "src"][0][0]] = lane
    out = gpu.run(atom, gin, _NO_SMEM, _NO_OFF)
    got = out[:, out_slots["dst"][0]].view(np.float32)
    np.testing.assert_array_equal(got, atom.semantics(vals, lane))


@pytest.mark.gpu
@pytest.mark.parametrize("atom", _params(LOADS))
def test_load_on_gpu(atom, gpu):
    rng = np.random.default_rng(6)
    smem = rng.integers(0, 2 ** 16, size=1024, dtype=np.uint64).astype(np.uint16)
    gin = rng.integers(0, 2 ** 32, size=(32, _SLOTS), dtype=np.uint64).astype(np.uint32)
    goff = np.zeros(96, np.int32)
    goff[:64] = np.tile(np.arange(32) * 16 + 16, 2)     # every lane reads its own 16-byte chunk
    out = gpu.run(atom, gin, smem, goff)
    mem = (smem if atom.src_memory == "SH" else gin).reshape(-1).view(np.uint8)
    dst = atom.operand("dst")
    for lane in range(32):
        want = mem[16 * lane + 16: 16 * lane + 16 + atom.width]
        words = out[lane, :dst.regs]
        got = (words & 0xFFFF).astype(np.uint16).view(np.uint8)[:atom.width] if dst.reg_bits == 16 \
            else words.view(np.uint8)
        np.testing.assert_array_equal(got, want, err_msg=f"lane {lane}")
