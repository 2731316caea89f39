"""The memory-bound stock recipes ``fs.recipes.transpose`` and ``fs.recipes.cast``: exact against
numpy and ml_dtypes in the interpreter on small and odd shapes, free of shared-memory bank
conflicts (addresses evaluated per thread), and compiled by NVRTC without spills, with 16-byte
accesses on both sides where the rows allow them."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ir
from firesched.errors import ScheduleError
from firesched.ir.expr import evaluate, free_vars

SHAPES = [(1, 1), (1, 7), (33, 65), (100, 3), (64, 64), (130, 257)]
NP = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f8e4m3": ml_dtypes.float8_e4m3fn,
      "f8e5m2": ml_dtypes.float8_e5m2}
RNG = np.random.default_rng(5)


def _data(shape, scale=3.0):
    return RNG.standard_normal(shape) * scale


def _same(got, want):
    """Equal element by element, NaNs where NaNs are, in the same dtype (bit patterns of -0)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(w))
    ok = ~np.isnan(w)
    assert np.array_equal(g[ok], w[ok]) and np.array_equal(np.signbit(g[ok]), np.signbit(w[ok]))


# --------------------------------------------------------------------------- transpose


@pytest.mark.parametrize("rows, cols", SHAPES)
@pytest.mark.parametrize("dt", ["f16", "f32"])
def test_transpose_is_exact(rows, cols, dt):
    sched = fs.recipes.transpose(rows, cols, dt)
    X = _data((rows, cols))
    _same(fs.interpret(sched, X), X.astype(NP[dt]))
    prog = sched.lower("sm_90a")
    assert prog.output.shape == (cols, rows)             # Y is stored column by column


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 70), cols=st.integers(1, 70), dt=st.sampled_from(["f16", "bf16", "f32", "f8e4m3"]))
def test_transpose_any_shape(rows, cols, dt):
    sched = fs.recipes.transpose(rows, cols, dt)
    X = _data((rows, cols))
    _same(fs.interpret(sched, X), X.astype(NP[dt]))


def test_transpose_keeps_the_bits_of_special_values():
    """A transpose of equal dtypes moves bits: infinities, NaN, -0 and subnormals arrive as such."""
    X = np.array([[np.inf, -np.inf, np.nan, -0.0, 6e-8, 65504.0, -1.5, 0.0]] * 8, dtype=np.float16)
    _same(fs.interpret(fs.recipes.transpose(8, 8, "f16"), X), X)


def test_transpose_params_follow_the_shape():
    tp = fs.recipes.copies.transpose_params
    # up to 64 MiB moved: straight through registers, 256-thread blocks
    assert tp(4096, 4096, "f16") == dict(block_r=256, block_c=64, thread_r=8, thread_c=8, swizzle=None,
                                         persistent=False, occupancy=1, stages=1, staged=False)
    # above: through shared memory, 128-thread blocks eight an SM
    assert tp(4096, 4097, "f16") == dict(block_r=128, block_c=64, thread_r=8, thread_c=8, swizzle=None,
                                         persistent=False, occupancy=8, stages=1, staged=True)
    assert tp(4096, 4096, "f32")["occupancy"] == 8 and tp(2048, 4096, "f32")["staged"] is False
    # rows or cols not whole 16-byte vectors, and one-byte elements: through shared memory, 256 threads
    assert tp(4096, 4092, "f16")["staged"] and tp(4092, 4096, "f16")["staged"]
    assert tp(4096, 4096, "f8e4m3")["staged"] and tp(8192, 8192, "f8e4m3")["occupancy"] == 1
    assert fs.recipes.copies.transpose_params(4096, 4096, "f32")["block_c"] == 32      # 128-byte rows
    # too few tiles for the SMs: shorter block tiles; tiny problems: one clamped tile
    assert fs.recipes.copies.transpose_params(4096, 256, "f16")["block_r"] == 64
    assert fs.recipes.copies.transpose_params(1, 7, "f16") == dict(block_r=8, block_c=8, thread_r=8, thread_c=8,
                                                                   swizzle=None, persistent=False, occupancy=1,
                                                                   stages=1, staged=True)
    # one-byte elements: 8 x 8 per thread (the leaf holds at most 64 elements)
    assert fs.recipes.copies.transpose_params(4096, 4096, "f8e4m3")["thread_r"] == 8


def test_transpose_params_override_and_refusals():
    s = fs.recipes.transpose(64, 64, params=dict(block_r=32, block_c=32, thread_r=4, thread_c=8))
    assert "tile(r=32, c=32) >> to_blocks()" in str(s) and "tile(r=4, c=8) >> to_threads()" in str(s)
    with pytest.raises(ScheduleError, match="unknown transpose parameters"):
        fs.recipes.transpose(64, 64, params=dict(block_m=64))
    with pytest.raises(ScheduleError, match="positive int"):
        fs.recipes.transpose(0, 64)
    with pytest.raises(ScheduleError, match="packed"):
        fs.recipes.transpose(64, 64, "i4")
    with pytest.raises(ScheduleError, match="only a persistent block") as e:
        fs.recipes.transpose(64, 64, params=dict(stages=2))
    assert e.value.field == "stages"
    with pytest.raises(ScheduleError, match="staged=False leaves out") as e:
        fs.recipes.transpose(64, 64, params=dict(staged=False, persistent=True, stages=2))
    assert e.value.field == "stages"
    with pytest.raises(ScheduleError, match="staged=False leaves out"):
        fs.recipes.transpose(64, 64, params=dict(staged=False, swizzle=fs.layout.Swizzle(3, 3, 3)))
    with pytest.raises(ScheduleError, match="is a bool"):
        fs.recipes.transpose(64, 64, params=dict(staged=1))
    for bad in ("2", True, 0):
        with pytest.raises(ScheduleError, match="an int >= 1") as e:
            fs.recipes.transpose(64, 64, params=dict(persistent=True, stages=bad))
        assert e.value.field == "stages"
    # a row of 91 f16 is not whole 16-byte chunks: its copy goes through registers, which a
    # pipeline cannot keep in flight
    with pytest.raises(ScheduleError, match="copied one tile ahead"):
        fs.recipes.transpose(77, 91, "f16", "sm_90a", params=dict(block_r=32, persistent=True, stages=2))


@pytest.mark.parametrize("rows, cols", [(37, 96), (300, 72), (9, 1000), (513, 64)])
@pytest.mark.parametrize("dt", ["f16", "f32"])
@pytest.mark.parametrize("params", [dict(staged=False), dict(staged=False, block_r=16, persistent=True, occupancy=2),
                                    dict(block_r=32, persistent=True, occupancy=2, stages=2),
                                    dict(block_r=16, persistent=True, stages=3)])
def test_transpose_other_schedules_are_exact(rows, cols, dt, params):
    """The transpose through registers, and on persistent blocks copying their next tiles while
    they store one: exact in the interpreter (which also finds no hazard on the ring of tiles)."""
    sched = fs.recipes.transpose(rows, cols, dt, "sm_90a", params=params)
    X = _data((rows, cols))
    _same(fs.interpret(sched, X), X.astype(NP[dt]))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 80), cols=st.integers(1, 80), dt=st.sampled_from(["f16", "bf16", "f32", "f8e4m3"]),
       block_r=st.sampled_from([8, 16, 32, 64]), block_c=st.sampled_from([8, 16, 32, 64, 128]),
       staged=st.booleans(), persistent=st.booleans(), occupancy=st.integers(1, 3), stages=st.integers(1, 3))
def test_transpose_params_a_user_writes(rows, cols, dt, block_r, block_c, staged, persistent, occupancy, stages):
    """Any tiles and schedule flags a user passes: refused with a ScheduleError, or exact."""
    params = dict(block_r=block_r, block_c=block_c, staged=staged, persistent=persistent, occupancy=occupancy,
                  stages=stages)
    try:
        sched = fs.recipes.transpose(rows, cols, dt, "sm_90a", params=params)
    except ScheduleError:
        return
    X = _data((rows, cols))
    _same(fs.interpret(sched, X), X.astype(NP[dt]))


# --------------------------------------------------------------------------- cast

PAIRS = [("f32", "bf16"), ("f32", "f16"), ("f16", "f32"), ("bf16", "f16"), ("f16", "f16"), ("f32", "f8e4m3")]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("src, dst", PAIRS)
def test_cast_rounds_to_nearest_even(shape, src, dst):
    sched = fs.recipes.cast(shape, src, dst)
    X = _data(shape).astype(NP[src])
    _same(fs.interpret(sched, X), X.astype(NP[dst]))


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_cast_special_values_and_ties():
    """Ties round to even, overflow goes to infinity, NaN stays NaN, -0 and subnormals survive."""
    bits = np.array([0x3F808000, 0x3F818000, 0x3F80C000, 0x80000000, 0x7F800000, 0x7FC00000, 0x00000001,
                     0x7F7FFFFF, 0x33800000, 0xC7800000, 0x38000000, 0x477FF000, 0x477FF001, 0x3F800001,
                     0x00800000, 0xFF800000], dtype=np.uint32)
    X = np.tile(bits.view(np.float32), (3, 1))
    for dst in ("bf16", "f16"):
        _same(fs.interpret(fs.recipes.cast(X.shape, "f32", dst), X), X.astype(NP[dst]))


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple),
       pair=st.sampled_from(PAIRS + [("bf16", "f32"), ("f16", "bf16"), ("f8e4m3", "f32")]))
def test_cast_any_shape(shape, pair):
    src, dst = pair
    sched = fs.recipes.cast(shape, src, dst)
    X = _data(shape).astype(NP[src])
    _same(fs.interpret(sched, X), X.astype(NP[dst]))


def test_cast_params_make_both_sides_sixteen_bytes():
    cp = fs.recipes.copies.cast_params
    assert cp((4096, 4096), "f32", "bf16") == dict(thread=8, block={"r": 1, "c": 2048})
    assert cp((4096, 4096), "f16", "f32")["thread"] == 8
    assert cp((4096, 4096), "f32", "f8e4m3")["thread"] == 16
    assert cp((4096, 64), "f32", "bf16") == dict(thread=8, block={"r": 32, "c": 64})   # rows share a block
    assert cp({"n": 5}, "f32", "f32") == dict(thread=4, block={"n": 8})


# --------------------------------------------------------------------------- bank conflicts

def _shared_accesses(prog):
    """(atom, byte width, per-thread byte addresses) of every shared-memory access of the first
    kernel, for every value of the loops around it (block 0)."""
    k = prog.kernels[0]
    base = k.shared_offsets()
    tid = np.arange(k.threads)
    out = []

    def walk(s, loops):
        if isinstance(s, ir.Seq):
            for c in s.body:
                walk(c, loops)
        elif isinstance(s, ir.For):
            walk(s.body, loops + [s])
        elif isinstance(s, ir.If):
            walk(s.then, loops)
        elif isinstance(s, ir.AtomCall):
            for _, ref in s.args:
                if isinstance(ref, ir.MemRef) and isinstance(ref.buffer, ir.SharedBuffer):
                    for vals in itertools.product(*[range(lp.var.extent) for lp in loops]):
                        env = {v.name: 0 for v in free_vars(ref.offset)}
                        env.update({lp.var.name: x for lp, x in zip(loops, vals)})
                        env["tid"] = tid
                        off = np.broadcast_to(np.asarray(evaluate(ref.offset, env)), tid.shape)
                        eb = ref.buffer.dtype.bits // 8
                        out.append((s.atom, s.atom.width, base[ref.buffer.name] + off * eb))

    walk(k.body, [])
    return out


@pytest.mark.parametrize("dt", ["f16", "f32", "f8e4m3"])
def test_transpose_shared_accesses_are_bank_conflict_free(dt):
    """A warp's accesses of W bytes are served in phases of 128 / W threads; each phase must touch
    distinct W-byte slots of the 128-byte bank line (the cp.async stores and the thread reads)."""
    prog = fs.recipes.transpose(512, 512, dt, params=dict(staged=True)).lower("sm_90a")
    acc = _shared_accesses(prog)
    assert {a.family for a, _, _ in acc} >= {"cp_async", "copy"}
    for atom, w, addr in acc:
        assert w >= 8, atom.name
        per = 128 // w
        for q in range(0, len(addr), per):
            slots = {(int(a) // w) % per for a in addr[q:q + per]}
            assert len(slots) == len(addr[q:q + per]), (atom.name, q, addr[q:q + per])


# --------------------------------------------------------------------------- NVRTC

def _counts(src: str) -> dict:
    keys = ["cp.async.cg.shared.global", "ld.global.v4", "st.global.v4", "ld.shared.v4", "ld.shared.v2",
            "st.global.v2", "ld.global.v2", "ld.global.b", "st.global.b", "ld.shared.b", "ld.global.v4.b32"]
    return {k: src.count(k) for k in keys}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dt", ["f16", "bf16", "f32", "f8e4m3"])
@pytest.mark.parametrize("rows, cols", [(4096, 4096), (130, 257)])
def test_transpose_compiles_without_spills(arch, dt, rows, cols):
    k = fs.compile(fs.recipes.transpose(rows, cols, dt, arch), arch=arch)
    assert k.spills == 0
    c = _counts(k.source)
    if (rows, cols) == (4096, 4096):
        # through shared memory (f32 at 128 MiB, one-byte elements): 16-byte cp.async loads, then
        # the register transpose reads and stores 16 bytes (8 for one-byte elements) per access;
        # through registers (16-bit at 64 MiB) 16-byte global loads; nothing narrower either way
        wide = "v2" if dt == "f8e4m3" else "v4"
        if fs.recipes.copies.transpose_params(rows, cols, dt)["staged"]:
            assert c["cp.async.cg.shared.global"] and "16, " in k.source
            assert c[f"ld.shared.{wide}"], c
        else:
            assert c[f"ld.global.{wide}"] and not (c["cp.async.cg.shared.global"] or "ld.shared" in k.source), c
        assert c[f"st.global.{wide}"], c
        assert not (c["st.global.b"] or c["ld.shared.b"] or c["ld.global.b"]), c
    else:
        # 257 columns: no 16-byte chunk of X is whole; 130 rows: nor is one of Y (narrower accesses,
        # predicated element by element)
        assert not (c["cp.async.cg.shared.global"] or c["st.global.v4"]), c


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("src, dst", PAIRS)
@pytest.mark.parametrize("shape", [(4096, 4096), (4096, 64), (130, 257)])
def test_cast_compiles_with_sixteen_byte_accesses(arch, src, dst, shape):
    k = fs.compile(fs.recipes.cast(shape, src, dst, arch), arch=arch)
    assert k.spills == 0
    c = _counts(k.source)
    if shape[1] % 16 == 0:
        assert c["ld.global.v4"] and c["st.global.v4"], c
        assert not (c["ld.global.b"] or c["st.global.b"] or c["ld.global.v2"] or c["st.global.v2"]), c
