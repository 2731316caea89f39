"""The Hopper (sm_90a) atom table, record by record.

Fragment layouts are checked against formulas written from the PTX ISA's wgmma register-fragment
text ("row = 16 * warp + groupID (+ 8) ...") independently of how the table spells them as CuTe
layouts; shared-memory matrix descriptors against their bit layout and against the layout
algebra (the canonical K-major / MN-major layouts as ``Layout`` objects composed with
``Swizzle``); TMA boxes against the wgmma canonical layout they must produce.  NVRTC then checks
that every template is valid PTX for sm_90a, in tiny kernels compiled a table slice at a time.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from firesched import dtypes as dt
from firesched import ir
from firesched.cuda import printer as cuda
from firesched.cuda.nvrtc import compile_cuda
from firesched.errors import CompileError, InternalError
from firesched.hardware import SM70, SM80, SM90A, catalog, sm90a
from firesched.hardware.atoms.base import GROUP_THREADS, THREAD, WARP, WARPGROUP, Atom, asm_node
from firesched.layout import SW32, SW64, SW128, Layout, Swizzle, swizzle_for_elements
from firesched.runtime import encode_tensor_map_2d

ALL = sm90a.ATOMS
WGMMAS = sm90a.WGMMA_ATOMS


def _params(atoms):
    return [pytest.param(a, id=a.name) for a in atoms]


# A few wgmma records of every kind for the slower per-record checks.
SOME_WGMMAS = [a for a in WGMMAS if a.shape[1] in (8, 64, 136, 256)]


# =========================================================================== table integrity

@pytest.mark.parametrize("atom", _params(ALL))
def test_record_is_well_formed(atom):
    assert getattr(sm90a, atom.name) is atom
    assert catalog.by_name(atom.name) is atom
    assert repr(atom) == f"sm90a.{atom.name}"
    assert atom.catalog == "sm90a" and atom.min_target == "sm_90a"
    assert atom.family in sm90a.FAMILIES
    assert atom.doc and "\n" not in atom.doc
    assert atom.group in (THREAD, WARP, WARPGROUP)
    names = [o.name for o in atom.operands]
    assert len(set(names)) == len(names)
    for o in atom.operands:
        assert o.role in ("in", "out", "inout") and o.memory in ("RF", "SH", "GL")
        if o.memory != "RF":
            assert o.role == "in"
    used = set(re.findall(r"\$([A-Za-z_]\w*)", atom.ptx))
    assert set(names) <= used, "every operand appears in the template"
    assert used - set(names) <= {"n", "uid"}, "other template names are immediates"
    if atom.family == sm90a.WGMMA:
        m, n, k = atom.shape
        assert (m, k) == (64, 16) and n in sm90a.WGMMA_N and atom.group == WARPGROUP
        assert names[0] == "d" and atom.operand("d").role == "inout"
        assert callable(atom.semantics)
        assert ("_tnspb" in atom.name) == atom.trans == (sm90a.b_major(atom) == "MN")
        assert ("_tnspa" in atom.name) == atom.trans_a == (sm90a.a_major(atom) == "MN")
        assert not (atom.trans_a and (atom.trans or any(o.name == "a" for o in atom.operands)))


def test_table_is_complete_and_listed():
    records = {v for v in vars(sm90a).values() if isinstance(v, Atom)}
    assert records == set(sm90a.ATOMS)
    assert catalog.SM90A_ATOMS == sm90a.ATOMS
    assert set(catalog.EVERY_ATOM) == set(catalog.ALL_ATOMS) | set(sm90a.ATOMS)
    assert not set(catalog.ALL_ATOMS) & set(sm90a.ATOMS)
    assert len(WGMMAS) == 32 * 2 * 5          # ss, rs, ss_tnspb, rs_tnspb, ss_tnspa
    assert len({a.name for a in catalog.EVERY_ATOM}) == len(catalog.EVERY_ATOM)
    for n in (8, 128, 256):
        for ab in ("f16", "bf16"):
            for regs in (False, True):
                for tb in (False, True):
                    a = sm90a.wgmma_atom(n, ab, a_in_registers=regs, b_mn_major=tb)
                    assert a.shape == (64, n, 16) and a.dtype_of("a") == dt.dtype(ab)
                    assert any(o.name == "a" for o in a.operands) == regs and a.trans == tb
    a = sm90a.wgmma_atom(16, "bf16", a_mn_major=True)
    assert a.trans_a and not a.trans and a.name == "wgmma_m64n16k16_bf16_f32_ss_tnspa"
    with pytest.raises(ValueError, match="K-major B"):
        sm90a.wgmma_atom(16, a_mn_major=True, b_mn_major=True)
    with pytest.raises(ValueError, match="N must be"):
        sm90a.wgmma_atom(12)
    with pytest.raises(ValueError, match="f16 or bf16"):
        sm90a.wgmma_atom(8, "f32")


def test_only_sm90a_issues_them():
    for a in ALL:
        assert SM90A.supports(a)
        assert not SM80.supports(a) and not SM70.supports(a)
    assert set(sm90a.FAMILIES) <= SM90A.families
    assert not set(sm90a.FAMILIES) & SM80.families
    assert set(catalog.for_target("sm_90a", every=True)) == set(catalog.EVERY_ATOM)
    assert set(catalog.for_target("sm_80", every=True)) == set(catalog.ALL_ATOMS)
    assert catalog.for_target("sm_90a") == catalog.ALL_ATOMS


# =========================================================================== fragment layouts

@pytest.mark.parametrize("atom", _params([a for a in ALL if any(o.tv for o in a.operands)]))
def test_register_tv_layouts_are_bijective(atom):
    for o in atom.operands:
        if o.memory != "RF":
            assert o.tv is None
            continue
        if sm90a.is_descriptor(o) or sm90a.is_scalar(o):
            assert o.tv is None and o.regs == 1
            assert o.constraint == ("l" if sm90a.is_descriptor(o) else "r")
            continue
        tv = o.tv
        assert tv.num_threads == GROUP_THREADS[atom.group]
        assert tv.num_values == o.values
        assert tv.is_bijective()
        bits = atom.dtype_of(o.name).bits
        assert o.regs * o.reg_bits == o.values * bits
        if atom.family == sm90a.WGMMA:
            m, n, k = atom.shape
            assert tv.tile == ((m, n) if o.name == "d" else (m, k))
            assert o.constraint == ("f" if o.name == "d" else "r")


def _isa_d(t, i):
    """Row and column of value i of thread t in the wgmma D fragment, from the ISA's text (ints
    or numpy arrays)."""
    warp, lane = t // 32, t % 32
    group, tig = lane // 4, lane % 4
    row = 16 * warp + group + 8 * ((i >> 1) & 1)
    col = 8 * (i >> 2) + 2 * tig + (i & 1)
    return row, col


def _isa_a(t: int, i: int) -> tuple[int, int]:
    """Row and column of a_i of thread t in the wgmma A-in-registers fragment (16-bit types)."""
    warp, lane = divmod(t, 32)
    group, tig = divmod(lane, 4)
    row = 16 * warp + group + (8 if i in (2, 3, 6, 7) else 0)
    col = 2 * tig + (i & 1) + (8 if i >= 4 else 0)
    return row, col


@pytest.mark.parametrize("n", sm90a.WGMMA_N)
def test_d_fragment_matches_the_isa(n):
    tv = sm90a.tv_d(n)
    t = np.arange(128)[:, None]
    i = np.arange(n // 2)[None, :]
    got_r, got_c = (np.broadcast_to(x, (128, n // 2)) for x in tv.coord(t, i))
    want_r, want_c = (np.broadcast_to(x, (128, n // 2)) for x in _isa_d(t, i))
    np.testing.assert_array_equal(got_r, want_r)
    np.testing.assert_array_equal(got_c, want_c)
    # warp 1, lane 5 (group 1, tig 1): d5 is row 17, column 8 + 2 + 1; d6 row 17 + 8, column 10
    assert _isa_d(37, 5) == (17, 11) and _isa_d(37, 6) == (25, 10)


def test_a_fragment_matches_the_isa_and_the_mma_a_fragment():
    from firesched.hardware import sm80

    for t in range(128):
        for i in range(8):
            assert tuple(int(x) for x in sm90a.TV_A_RS.coord(t, i)) == _isa_a(t, i)
            # warp w holds rows 16w.. exactly as mma.m16n8k16's A fragment
            r, c = (int(x) for x in sm80.TV_A_16x16.coord(t % 32, i))
            assert (r + 16 * (t // 32), c) == _isa_a(t, i)


@pytest.mark.parametrize("atom", _params(sm90a.STMATRIX_ATOMS))
def test_stmatrix_is_ldmatrix_inverted(atom):
    ld = catalog.by_name(atom.name.replace("stmatrix", "ldmatrix"))
    assert atom.operand("src").tv == ld.operand("dst").tv
    assert atom.operand("dst").addr == ld.operand("src").addr
    assert atom.trans == ld.trans and atom.shape == ld.shape and atom.alignment == 16
    assert atom.ptx.replace("stmatrix", "ldmatrix").split()[0] == ld.ptx.split()[0]


# =========================================================================== matrix descriptors

def test_descriptor_bits_by_hand():
    d = sm90a.smem_descriptor(0x400, 16, 1024, 128)
    assert d == 0x40 | (1 << 16) | (64 << 32) | (1 << 62)
    assert sm90a.smem_descriptor(0x12340, 256, 128, 0) == 0x1234 | (16 << 16) | (8 << 32)
    assert sm90a.smem_descriptor(0, 0, 0, 64) == 2 << 62
    assert sm90a.smem_descriptor(0, 0, 0, 32) == 3 << 62
    assert sm90a.smem_descriptor(0x10, 0, 0, 0, base_offset=5) == 1 | (5 << 49)
    # the address is taken modulo 2**18 (the shared window), as (addr & 0x3FFFF) >> 4
    assert sm90a.smem_descriptor(0x40400, 0, 0) == 0x40


@pytest.mark.parametrize("kwargs, match", [
    (dict(addr_bytes=8, lbo_bytes=0, sbo_bytes=0), "multiple of 16"),
    (dict(addr_bytes=0, lbo_bytes=24, sbo_bytes=0), "lbo_bytes"),
    (dict(addr_bytes=0, lbo_bytes=0, sbo_bytes=1 << 18), "sbo_bytes"),
    (dict(addr_bytes=0, lbo_bytes=0, sbo_bytes=0, swizzle=16), "swizzle"),
    (dict(addr_bytes=0, lbo_bytes=0, sbo_bytes=0, base_offset=8), "base_offset"),
])
def test_descriptor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sm90a.smem_descriptor(**kwargs)


@given(addr=st.integers(0, (1 << 14) - 1), lbo=st.integers(0, (1 << 14) - 1), sbo=st.integers(0, (1 << 14) - 1),
       swizzle=st.sampled_from([0, 32, 64, 128]), base=st.integers(0, 7))
def test_descriptor_round_trip(addr, lbo, sbo, swizzle, base):
    d = sm90a.smem_descriptor(addr * 16, lbo * 16, sbo * 16, swizzle, base)
    assert 0 <= d < 1 << 64
    assert sm90a.decode_smem_descriptor(d) == sm90a.SmemDescriptor(addr * 16, lbo * 16, sbo * 16, swizzle, base)
    # bits outside the fields are zero
    assert d & ~((0x3FFF) | (0x3FFF << 16) | (0x3FFF << 32) | (7 << 49) | (3 << 62)) == 0


@pytest.mark.parametrize("major", ["K", "MN"])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_descriptor_value_names_the_same_elements(swizzle, major):
    d = sm90a.smem_descriptor(0x2400, 2048, 1024, swizzle)
    np.testing.assert_array_equal(sm90a.descriptor_byte_offsets(d, 64, major=major),
                                  sm90a.operand_byte_offsets(0x2400, 2048, 1024, swizzle, 64, major=major))
    with pytest.raises(ValueError, match="base offset"):
        sm90a.descriptor_byte_offsets(sm90a.smem_descriptor(0, 0, 0, 128, base_offset=1), 64)


def _canonical_layout(rows: int, swizzle: int, major: str, lbo: int, sbo: int) -> Layout:
    """CUTLASS's canonical GMMA layouts of a ``rows`` x 16 f16 operand as firesched ``Layout``
    objects, in bytes (``T = 8`` elements of 2 bytes per 16-byte unit):

    K-major  none: ((8,m),(T,2)):((16,SBO),(2,LBO))   swizzled: ((8,m),(T,2)):((S,SBO),(2,16))
    MN-major none: ((T,m),(8,2)):((2,SBO),(16,LBO))   swizzled: ((T,W,m),(8,2)):((2,16,LBO),(S,SBO))
    """
    m = rows // 8
    if major == "K":
        if swizzle == 0:
            return Layout(((8, m), (8, 2)), ((16, sbo), (2, lbo)))
        return Layout(((8, m), (8, 2)), ((swizzle, sbo), (2, 16)))
    if swizzle == 0:
        return Layout(((8, m), (8, 2)), ((2, sbo), (16, lbo)))
    w = swizzle // 16
    blocks = -(-rows // (8 * w))
    return Layout(((8, w, blocks), (8, 2)), ((2, 16, lbo), (swizzle, sbo)))


@pytest.mark.parametrize("major", ["K", "MN"])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("rows", [8, 64, 256])
def test_operand_offsets_agree_with_the_layout_algebra(rows, swizzle, major):
    lbo, sbo = (rows // 8 * 128, 128) if swizzle == 0 else (2 * 8 * swizzle, 8 * swizzle)
    if major == "K" and swizzle:
        lbo = 16
    base = 3 * 1024
    got = sm90a.operand_byte_offsets(base, lbo, sbo, swizzle, rows, major=major)
    layout = _canonical_layout(rows if major == "K" or swizzle == 0 else max(rows, 8 * swizzle // 16), swizzle,
                               major, lbo, sbo)
    sw = {0: Swizzle(0, 0, 0), 32: SW32, 64: SW64, 128: SW128}[swizzle]
    r = np.arange(rows)[:, None]
    k = np.arange(16)[None, :]
    want = sw(base + np.asarray(layout(r, k)))
    np.testing.assert_array_equal(got, want)
    # distinct elements at distinct 2-byte slots
    assert np.unique(got).size == got.size and np.all(got % 2 == 0)


@pytest.mark.parametrize("swizzle", [32, 64, 128])
def test_byte_swizzles_are_the_element_swizzles_of_16_bit_data(swizzle):
    # The descriptor's byte swizzle on K-major rows of `swizzle` bytes is the element swizzle
    # firesched's layouts use for 16-bit data.
    got = sm90a.operand_byte_offsets(0, 16, 8 * swizzle, swizzle, 64)
    per_row = swizzle // 2
    r = np.arange(64)[:, None]
    k = np.arange(16)[None, :]
    el = swizzle_for_elements(swizzle, 2)(r * per_row + k)
    np.testing.assert_array_equal(got, 2 * el)
    # and the 16-byte chunk of row r, chunk c is c ^ (r % 8) restricted to the span, for 128B
    if swizzle == 128:
        np.testing.assert_array_equal((got % 128) // 16, ((k * 2) // 16) ^ (r % 8))


@pytest.mark.parametrize("swizzle", [32, 64, 128])
def test_tma_box_lands_in_the_k_major_canonical_layout(swizzle):
    # A box of rows x (swizzle bytes) written by TMA with that swizzle is the K-major canonical
    # layout with SBO = 8 rows; every 16-column slice is a wgmma operand at start + 32*step.
    rows = 64
    cols = swizzle // 2
    box = sm90a.box_byte_offsets(rows, cols, 2, swizzle, dst=2048)
    for step in range(cols // 16):
        want = sm90a.operand_byte_offsets(2048 + 32 * step, 16, 8 * swizzle, swizzle, rows)
        np.testing.assert_array_equal(box[:, 16 * step:16 * step + 16], want)


def test_no_swizzle_tma_boxes_are_core_matrices():
    # 16-byte-wide boxes, one per k chunk, give the interleaved layout: SBO 128, LBO = box bytes
    rows = 64
    lbo = rows * 16
    want = sm90a.operand_byte_offsets(0, lbo, 128, 0, rows)
    for chunk in range(2):
        box = sm90a.box_byte_offsets(rows, 8, 2, 0, dst=chunk * lbo)
        np.testing.assert_array_equal(box, want[:, 8 * chunk:8 * chunk + 8])


def test_canonical_offset_is_symbolic():
    from firesched.ir import expr as ex

    r, k = ex.Var("r", 64), ex.Var("k", 16)
    e = sm90a.SWIZZLES[128](sm90a.canonical_offset(r, k, 16, 1024, 128))
    for rr in (0, 5, 13, 63):
        for kk in (0, 7, 8, 15):
            assert ex.evaluate(e, {"r": rr, "k": kk}) == sm90a.operand_byte_offsets(0, 16, 1024, 128, 64)[rr, kk]


# =========================================================================== TMA parameters

@pytest.mark.parametrize("args, match", [
    ((2, (40, 72), (144, 2), (16, 64), 128), None),
    ((2, (40, 72), (146, 2), (16, 64), 0), "multiple of 16"),
    ((2, (40, 72), (144, 4), (16, 64), 0), "contiguous"),
    ((2, (40, 72), (128, 2), (16, 64), 0), "smaller than a row"),
    ((2, (40, 72), (144, 2), (257, 64), 0), "box rows=257"),
    ((2, (40, 72), (144, 2), (16, 4), 0), "multiple of 16"),
    ((2, (40, 72), (144, 2), (16, 72), 128), "larger than the 128-byte swizzle"),
    ((2, (40, 72), (144, 2), (16, 32), 48), "swizzle=48"),
    ((4, (0, 8), (32, 4), (1, 4), 0), "rows=0"),
])
def test_tma_box_rules(args, match):
    problems = sm90a.tma_box_problems(*args)
    if match is None:
        assert problems == []
    else:
        assert any(match in p for p in problems), problems


def test_encode_tensor_map_rejects_invalid_parameters_before_the_driver():
    with pytest.raises(ValueError, match="16-byte aligned"):
        encode_tensor_map_2d(0x1008, "f16", (40, 72), (144, 2), (16, 64), 128)
    with pytest.raises(ValueError, match="no TMA data type"):
        encode_tensor_map_2d(0x1000, "i4", (40, 72), (144, 2), (16, 64), 0)
    with pytest.raises(ValueError, match="non-null"):
        encode_tensor_map_2d(0, "f16", (40, 72), (144, 2), (16, 64), 0)
    with pytest.raises(ValueError, match="larger than the 64-byte"):
        encode_tensor_map_2d(0x1000, dt.f16, (40, 72), (144, 2), (16, 64), 64)


def test_ir_validates_tensor_maps_and_descriptors():
    g = ir.GlobalBuffer("x", dt.f16, (40, 72), (72, 1))
    tm = ir.TensorMapParam("tm", g, (16, 64), 128)
    assert tm.box_bytes == 2048 and tm.dtype == dt.f16
    with pytest.raises(ValueError, match="swizzle span"):
        ir.TensorMapParam("tm", g, (16, 72), 128)
    with pytest.raises(ValueError, match="2-D"):
        ir.TensorMapParam("tm", ir.GlobalBuffer("y", dt.f16, (8,), (1,)), (8, 8))
    with pytest.raises(ValueError, match="multiple of 16"):
        ir.TensorMapParam("tm", ir.GlobalBuffer("z", dt.f16, (8, 9), (9, 1)), (8, 8))
    # int4 codes: the hardware sees bytes, and the innermost coordinate counts them
    codes = ir.TensorMapParam("tc", ir.GlobalBuffer("c", dt.u4, (64, 256), (256, 1)), (64, 128))
    assert codes.unit == 2 and codes.box_bytes == 64 * 64
    assert codes.hardware_view() == (dt.u8, (64, 128), (128, 1), (64, 64))
    assert tm.unit == 1 and tm.hardware_view() == (dt.f16, (40, 72), (144, 2), (16, 64))
    with pytest.raises(ValueError, match="as bytes"):
        ir.TensorMapParam("tc", ir.GlobalBuffer("c", dt.u4, (64, 256), (256, 1)), (64, 128), 64)
    with pytest.raises(ValueError, match="multiple of 16"):
        ir.TensorMapParam("tc", ir.GlobalBuffer("c", dt.u4, (64, 256), (256, 1)), (64, 16))
    sh = ir.SharedBuffer("s", dt.f16, 1024)
    with pytest.raises(ValueError, match="swizzle"):
        ir.DescRef(sh, 0, 16)
    with pytest.raises(ValueError, match="lbo"):
        ir.DescRef(sh, 0, 0, lbo=8)
    bar = ir.MBarrier("bar", 3)
    assert isinstance(bar, ir.SharedBuffer) and bar.nbytes == 24 and bar.align == 8


def test_tma_2d_messages_are_unchanged():
    assert sm90a.tma_box_problems(2, (40, 72), (128, 2), (16, 64), 0) == [
        "the row stride (128 bytes) is smaller than a row (72 x 2 bytes)"]
    assert sm90a.tma_box_problems(2, (40, 72), (146, 2), (16, 64), 0) == [
        "the row stride is 146 bytes; it must be a positive multiple of 16 below 2**40"]
    assert sm90a.tma_box_problems(2, (40, 72), (144, 2), (16, 64, 1), 0) == [
        "shape (40, 72), strides (144, 2) and box (16, 64, 1) must each have 2 entries (rows, cols)"]
    assert sm90a.tma_box_problems(2, (0, 72), (144, 2), (300, 64), 0) == [
        "global rows=0 must be in 1..2**32", "box rows=300 must be in 1..256"]


# (batch, rows, cols) views: 3 matrices of 40 rows of 144 bytes, 5760 bytes apart (or padded apart)
@pytest.mark.parametrize("args, match", [
    ((2, (3, 40, 72), (5760, 144, 2), (1, 16, 64), 128), None),
    ((2, (3, 40, 72), (6144, 144, 2), (2, 40, 64), 128), None),           # padded matrices, 2 per box
    ((2, (1, 40, 72), (16, 144, 2), (1, 16, 64), 128), None),             # a batch of one: any stride
    ((2, (40, 3, 72), (144, 5760, 2), (16, 1, 64), 0), None),             # strides in any order
    ((2, (3, 40, 72), (5762, 144, 2), (1, 16, 64), 0), "the stride of dim 0 is 5762 bytes"),
    ((2, (3, 40, 72), (0, 144, 2), (1, 16, 64), 0), "positive multiple of 16"),
    ((2, (3, 40, 72), (5744, 144, 2), (1, 16, 64), 0), "smaller than the 40 x 144 bytes of rows"),
    ((2, (3, 40, 72), (5760, 128, 2), (1, 16, 64), 0), "smaller than a row (72 x 2 bytes)"),
    ((2, (3, 40, 72), (5760, 144, 4), (1, 16, 64), 0), "contiguous"),
    ((2, (0, 40, 72), (5760, 144, 2), (1, 16, 64), 0), "global dim 0=0"),
    ((2, (3, 40, 72), (5760, 144, 2), (0, 16, 64), 0), "box dim 0=0"),
    ((2, (3, 40, 72), (5760, 144, 2), (257, 16, 64), 0), "box dim 0=257"),
    ((2, (3, 40, 72), (5760, 144, 2), (1, 16, 4), 0), "multiple of 16"),
    ((2, (3, 40, 72), (5760, 144, 2), (1, 16, 72), 128), "larger than the 128-byte swizzle"),
    ((2, (3, 40, 72), (5760, 144, 2), (16, 64), 0), "must each have 3 entries (dim 0, rows, cols)"),
    ((2, (2, 2, 2, 2, 2, 8), (512,) * 5 + (2,), (1,) * 5 + (8,), 0), "1 to 5"),
    ((2, (72,), (2,), (64,), 128), None),
    ((2, (2, 2, 2, 40, 72), (23040, 11520, 5760, 144, 2), (1, 1, 2, 16, 64), 128), None),
])
def test_tma_box_rules_of_any_rank(args, match):
    problems = sm90a.tma_box_problems(*args)
    if match is None:
        assert problems == []
    else:
        assert any(match in p for p in problems), problems


def _swizzled(addr, swizzle):
    """The TMA/wgmma byte swizzle written out: bits 4.. of the 16-byte chunk XOR the 128-byte row
    index modulo span / 16 (Swizzle<3,4,3> for 128 bytes, <2,4,3> for 64, <1,4,3> for 32)."""
    if swizzle == 0:
        return addr
    return addr ^ (((addr >> 7) & (swizzle // 16 - 1)) << 4)


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("b, r", [(1, 16), (2, 8), (3, 4)])
def test_rank_3_boxes_land_row_major(b, r, swizzle):
    """A (b, r, c) box lands as its b matrices one after the other, each as the 2-D box; the
    swizzle acts on the absolute byte address."""
    cols = (swizzle or 128) // 2
    box = (b, r, cols)
    dst = 3072
    got = sm90a.box_byte_offsets_nd(box, 2, swizzle, dst=dst)
    assert got.shape == box
    for z in range(b):
        for i in range(r):
            for j in range(cols):
                assert got[z, i, j] == _swizzled(dst + 2 * ((z * r + i) * cols + j), swizzle)
    np.testing.assert_array_equal(sm90a.box_byte_offsets_nd((1, r, cols), 2, swizzle, dst),
                                  sm90a.box_byte_offsets(r, cols, 2, swizzle, dst)[None])
    with pytest.raises(ValueError, match="1 to 5 positive extents"):
        sm90a.box_byte_offsets_nd((1, 0, 8), 2, swizzle)


def test_ir_tensor_maps_of_rank_3():
    g = ir.GlobalBuffer("a", dt.f16, (4, 40, 72), (2880, 72, 1))
    tm = ir.TensorMapParam("tm_a", g, (1, 16, 64), 128)
    assert tm.rank == 3 and tm.box_bytes == 16 * 64 * 2 and tm.box == (1, 16, 64)
    assert ir.TensorMapParam("tm_a2", g, [2, 8, 64], 128).box_bytes == 2 * 8 * 64 * 2
    with pytest.raises(ValueError, match="the box \\(16, 64\\) is 2-D but buffer a is 3-D"):
        ir.TensorMapParam("tm_a", g, (16, 64), 128)
    with pytest.raises(ValueError, match="stride of dim 0"):
        ir.TensorMapParam("tm_a", ir.GlobalBuffer("b", dt.f16, (4, 40, 72), (2881, 72, 1)), (1, 16, 64), 128)
    with pytest.raises(ValueError, match="1 to 5 dimensions"):
        ir.TensorMapParam("tm_a", ir.GlobalBuffer("c", dt.f16, (1,) * 6, (1,) * 6), (1,) * 6)


def test_encode_tensor_map_of_rank_3_rejects_invalid_parameters_before_the_driver():
    from firesched.runtime import encode_tensor_map

    with pytest.raises(ValueError, match="encode_tensor_map: the stride of dim 0 is 5762 bytes"):
        encode_tensor_map(0x1000, "f16", (3, 40, 72), (5762, 144, 2), (1, 16, 64), 128)
    with pytest.raises(ValueError, match="16-byte aligned"):
        encode_tensor_map(0x1008, "f16", (3, 40, 72), (5760, 144, 2), (1, 16, 64), 128)
    # the 2-D encoder keeps its name and its rank
    with pytest.raises(ValueError, match="encode_tensor_map_2d: .* must each have 2 entries"):
        encode_tensor_map_2d(0x1000, "f16", (3, 40, 72), (5760, 144, 2), (1, 16, 64), 128)


@pytest.mark.parametrize("atom, rank", [(sm90a.tma_load_2d, 2), (sm90a.tma_store_2d, 2), (sm90a.tma_load_3d, 3),
                                        (sm90a.tma_store_3d, 3)])
def test_tma_templates_name_their_rank_and_coordinates(atom, rank):
    """cp.async.bulk.tensor.{rank}d with the coordinates innermost first ({$c0, $c1[, $c2]}), a
    load into shared::cluster completing on an mbarrier, a store from shared::cta in a bulk group."""
    (instr,) = [x.strip() for x in atom.ptx.split(";") if x.strip()]
    coords = "{" + ", ".join(f"$c{i}" for i in range(rank)) + "}"
    assert f"[$tmap, {coords}]" in instr
    op = instr.split()[0]
    if atom.src_memory == "GL":
        assert op == f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes"
        assert instr.endswith("[$mbar]") and instr.split()[1] == "[$dst],"
    else:
        assert op == f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group"
        assert instr.endswith("[$src]")
    assert [o.name for o in atom.operands if sm90a.is_scalar(o)] == [f"c{i}" for i in range(rank)]
    assert sm90a.TMA_LOADS.get(rank) is atom or sm90a.TMA_STORES.get(rank) is atom


@pytest.mark.parametrize("build, name", [("tma_load_3d_program", "tma_load_3d"),
                                         ("tma_store_3d_program", "tma_store_3d")])
def test_rank_3_microkernels_print_and_compile(build, name):
    from firesched.testing import microkernel as mk

    program, _, _ = getattr(mk, build)(coords=(16, 32, 1))
    text = cuda.emit(program)
    tmap = program.kernels[0].params[0 if name == "tma_load_3d" else 1]
    assert f"const __grid_constant__ CUtensorMap {tmap.name}" in text
    assert "cp.async.bulk.tensor.3d." in text
    # the coordinates bind in operand order: column, row, batch
    assert '"r"((int)(16)), "r"((int)(32)), "r"((int)(1))' in text
    m = compile_cuda(text, arch="sm_90a")
    assert f"micro_{name}" in m.kernel_names


# =========================================================================== immediates and printing

IMMEDIATES = {"wgmma_wait": {"n": 1}, "tma_wait": {"n": 0}, "tma_wait_read": {"n": 2},
              "setmaxnreg_inc": {"n": 232}, "setmaxnreg_dec": {"n": 40}, "mbarrier_try_wait": {"uid": 3},
              "mbarrier_try_wait_cluster": {"uid": 3}}


def _ready(atom: Atom) -> Atom:
    return catalog.with_immediates(atom, **IMMEDIATES.get(atom.name, {}))


def test_immediates_round_trip():
    for name, values in IMMEDIATES.items():
        atom = catalog.by_name(name)
        assert catalog.immediates_of(catalog.with_immediates(atom, **values)) == values
        assert catalog.immediates_of(atom) == {}
    assert "fs_wait_3:" in _ready(sm90a.mbarrier_try_wait).ptx
    assert "bra fs_done_3;" in _ready(sm90a.mbarrier_try_wait).ptx


@pytest.mark.parametrize("atom", _params([a for a in ALL if a.family != sm90a.WGMMA] + SOME_WGMMAS))
def test_asm_node_expansion(atom):
    ready = _ready(atom)
    b = {o.name: [f"{o.name}{i}" for i in range(o.regs)] if o.memory == "RF" else [f"{o.name}_addr"]
         for o in ready.operands}
    asm = asm_node(ready, b)
    assert "$" not in asm.template
    count = sum(len(v) for v in b.values())
    assert len(asm.outputs) + len(asm.inputs) == count
    assert {int(x) for x in re.findall(r"%(\d+)", asm.template)} == set(range(count))
    if ready.family == sm90a.WGMMA:
        n = ready.shape[1]
        assert asm.outputs == tuple(("+f", f"d{i}") for i in range(n // 2))
        assert ("l", "desc_b0") in asm.inputs and ("r", "scale_d0") in asm.inputs
        assert f"m64n{n}k16.f32.{ready.dtype_of('a')}" in asm.template
        assert asm.template.rstrip(" }").endswith("1;" if ready.trans else "0;")


# --------------------------------------------------------------------------- NVRTC

_C = {"f": "float", "r": "unsigned", "h": "unsigned short", "l": "unsigned long long"}


def _atom_kernel(atom: Atom) -> str:
    """A kernel ``k_<name>`` issuing ``atom`` once: its input registers distinct values derived
    from one word of ``gin``, its results folded into one word of ``gout`` (one load and one
    store a thread: NVVM takes several times as long over a load and a store per register, and
    ptxas checks the same instruction either way), descriptors from ``gdesc``, shared addresses
    ``smem + goff[t]``, scalars ``goff[128 + t]``, the tensor map the kernel's ``__grid_constant__``
    parameter."""
    ready = _ready(atom)
    decl, writes, exprs = [], [], {}
    n_in = 0
    for o in ready.operands:
        if o.memory == "SH":
            exprs[o.name] = ["smem_base + (unsigned)goff[t]"]
        elif o.memory == "GL":
            exprs[o.name] = ["reinterpret_cast<unsigned long long>(&tm)"]
        elif sm90a.is_descriptor(o):
            exprs[o.name] = ["gdesc[t]"]
        elif sm90a.is_scalar(o):
            exprs[o.name] = ["(unsigned)goff[128 + t]"]
        else:
            ctype = _C[o.constraint]
            names = [f"{o.name}{i}" for i in range(o.regs)]
            exprs[o.name] = names
            for nm in names:
                if o.role in ("in", "inout"):
                    word = f"(w ^ {n_in}u)"
                    init = f"__uint_as_float{word}" if ctype == "float" else f"({ctype}){word}"
                    decl.append(f"    {ctype} {nm} = {init};")
                    n_in += 1
                else:
                    decl.append(f"    {ctype} {nm};")
                if o.role in ("out", "inout"):
                    val = f"__float_as_uint({nm})" if ctype == "float" else f"(unsigned){nm}"
                    writes.append(f"    folded ^= {val};")
    asm = asm_node(ready, exprs, clobbers=("memory",)).to_c().replace("\n", "\n    ")
    return "\n".join([
        f'extern "C" __global__ void __launch_bounds__(128, 1) k_{atom.name}(',
        "        const __grid_constant__ CUtensorMap tm, const unsigned* __restrict__ gin,",
        "        unsigned* __restrict__ gout, const unsigned long long* __restrict__ gdesc,",
        "        const int* __restrict__ goff) {",
        "    __shared__ alignas(1024) unsigned char smem[4096];",
        "    const unsigned smem_base = (unsigned)__cvta_generic_to_shared(smem);",
        "    const int t = threadIdx.x;",
        "    const unsigned w = gin[t];",
        "    unsigned folded = 0;",
        *decl,
        "    " + asm,
        *writes,
        "    gout[t] = folded;",
        "}",
    ])


def _slice_key(atom: Atom) -> str:
    if atom.family == sm90a.WGMMA:
        return atom.name.split("_", 2)[2]            # "f16_f32_ss", ...: 32 records per slice
    return "other"


@functools.lru_cache(maxsize=None)
def _compile_slice(key: str) -> tuple[bool, str]:
    atoms = [a for a in ALL if _slice_key(a) == key]
    src = cuda.PRELUDE_SM90 + "\n" + "\n\n".join(_atom_kernel(a) for a in atoms) + "\n"
    try:
        m = compile_cuda(src, arch="sm_90a")
    except CompileError as e:
        return False, str(e)
    return True, m.log


@pytest.mark.parametrize("atom", _params(ALL))
def test_ptx_compiles_with_nvrtc_for_sm90a(atom):
    ok, log = _compile_slice(_slice_key(atom))
    assert ok, f"NVRTC rejected the slice holding {atom.name}:\n{log[:6000]}"
    assert f"Compiling entry function 'k_{atom.name}' for 'sm_90a'" in log
    assert "serialized" not in log


def test_sm90a_atoms_refuse_sm80():
    src = cuda.PRELUDE_SM90 + "\n" + _atom_kernel(sm90a.wgmma_fence) + "\n"
    with pytest.raises(CompileError, match="compile it with arch='sm_90a'"):
        compile_cuda(src, arch="sm_80", use_cache=False)


# --------------------------------------------------------------------------- the CUDA printer

def _tiny(body, shared=(), regs=(), params=()):
    out = ir.GlobalBuffer("out", dt.f32, (128,), (1,), "out")
    return ir.Kernel("tiny", params=(*params, out), grid=(1, 1, 1), threads=128, shared=shared, regs=regs,
                     body=ir.Seq(body))


def test_printer_binds_descriptors_scalars_and_tensor_maps():
    g = ir.GlobalBuffer("x", dt.f16, (64, 64), (64, 1))
    tm = ir.TensorMapParam("tm_x", g, (64, 64), 128)
    sa = ir.SharedBuffer("sa", dt.f16, 4096, align=1024)
    bar = ir.MBarrier("bar", 2)
    acc = ir.RegBuffer("acc", dt.f32, 4)
    wait = catalog.with_immediates(sm90a.wgmma_wait, n=0)
    body = [
        ir.AtomCall(sm90a.mbarrier_init, (("bar", ir.MemRef(bar, 1)), ("count", ir.Scalar(1)))),
        ir.AtomCall(sm90a.tma_load_2d, (("dst", ir.MemRef(sa, 0)), ("tmap", tm), ("c0", ir.Scalar(0)),
                                        ("c1", ir.Scalar(ir.tid(128) // 32)), ("mbar", ir.MemRef(bar, 1)))),
        ir.AtomCall(sm90a.mbarrier_try_wait, (("bar", ir.MemRef(bar, 1)), ("parity", ir.Scalar(0)))),
        ir.AtomCall(sm90a.mbarrier_try_wait, (("bar", ir.MemRef(bar, 1)), ("parity", ir.Scalar(1)))),
        ir.AtomCall(sm90a.wgmma_fence, ()),
        ir.AtomCall(sm90a.wgmma_m64n8k16_f16_f32_ss, (
            ("d", ir.RegRef(acc, 0)), ("desc_a", ir.DescRef(sa, 16, 128, 16, 1024)),
            ("desc_b", ir.DescRef(sa, 2048, 128, 16, 1024)), ("scale_d", ir.Scalar(0)))),
        ir.AtomCall(sm90a.wgmma_commit, ()),
        ir.AtomCall(wait, ()),
    ]
    k = _tiny(body, shared=(sa, bar), regs=(acc,), params=(tm,))
    text = cuda.emit_kernel(k)
    assert text.startswith(cuda.PRELUDE + "\n" + cuda.PRELUDE_SM90)
    assert "const __grid_constant__ CUtensorMap tm_x," in text
    assert "unsigned long long* const bar = " in text
    assert '"l"(reinterpret_cast<unsigned long long>(&tm_x))' in text
    # the buffer's descriptor, moved by the start's offset in 16-byte units (16 and 2048 f16)
    assert '"l"(fs_desc_add(fs_smem_desc(sa_base, 16u, 1024u, 1u), 2))' in text
    assert '"l"(fs_desc_add(fs_smem_desc(sa_base, 16u, 1024u, 1u), 256))' in text
    assert '"r"((int)(tid / 32))' in text and '"r"((int)(0))' in text
    assert "fs_wait_0:" in text and "fs_wait_1:" in text and "fs_wait_2:" not in text
    assert "[%0], [%1, {%2, %3}], [%4];" in text
    # register fences around the asynchronous accumulators
    fence = text.index("wgmma.fence.sync.aligned")
    wait_at = text.index("wgmma.wait_group.sync.aligned 0;")
    assert text.count("fs_fence_reg(acc[fs_i]);") == 2
    assert text.index("fs_fence_reg(acc[fs_i]);") < fence < wait_at < text.rindex("fs_fence_reg(acc[fs_i]);")
    assert cuda.required_arch(k) == "sm_90a"
    m = compile_cuda(text, arch="sm_90a", use_cache=False)
    assert "tiny" in m.kernel_names
    program = ir.Program(kernels=(k,), inputs=(g,), output=k.params[-1])
    assert cuda.emit(program).count("#define FIRESCHED_PRELUDE_SM90") == 1


def test_plain_programs_get_no_sm90_prelude():
    k = _tiny([ir.Barrier()])
    assert cuda.required_arch(k) is None
    assert "FIRESCHED_PRELUDE_SM90" not in cuda.emit_kernel(k)


def test_printer_rejects_wrong_bindings():
    sa = ir.SharedBuffer("sa", dt.f16, 4096, align=1024)
    acc = ir.RegBuffer("acc", dt.f32, 4)
    i32 = ir.RegBuffer("s", dt.i32, 1)
    bad_scale = ir.AtomCall(sm90a.wgmma_m64n8k16_f16_f32_ss, (
        ("d", ir.RegRef(acc, 0)), ("desc_a", ir.DescRef(sa, 0)), ("desc_b", ir.DescRef(sa, 0)),
        ("scale_d", ir.RegRef(i32, 0))))
    with pytest.raises(InternalError, match="takes an ir.Scalar"):
        cuda.emit_kernel(_tiny([bad_scale], shared=(sa,), regs=(acc, i32)))
    bad_desc = ir.AtomCall(sm90a.wgmma_m64n8k16_f16_f32_ss, (
        ("d", ir.RegRef(acc, 0)), ("desc_a", ir.Scalar(0)), ("desc_b", ir.DescRef(sa, 0)),
        ("scale_d", ir.Scalar(1))))
    with pytest.raises(InternalError, match="no 32-bit value"):
        cuda.emit_kernel(_tiny([bad_desc], shared=(sa,), regs=(acc,)))
    g = ir.GlobalBuffer("x", dt.f16, (64, 64), (64, 1))
    tm = ir.TensorMapParam("tm_x", g, (64, 64), 128)
    stranger = ir.AtomCall(sm90a.tma_store_2d, (("tmap", tm), ("c0", ir.Scalar(0)), ("c1", ir.Scalar(0)),
                                                ("src", ir.MemRef(sa, 0))))
    with pytest.raises(InternalError, match="not a parameter"):
        cuda.emit_kernel(_tiny([stranger], shared=(sa,)))
    unsubstituted = ir.AtomCall(sm90a.wgmma_wait, ())
    with pytest.raises(InternalError, match="with_immediates"):
        cuda.emit_kernel(_tiny([unsubstituted]))
