"""Strategies are values, schedules are immutable trees, the focus moves as documented, and the
automatic swizzles keep ldmatrix and the cp.async stores free of shared-memory bank conflicts."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

import firesched as fs
from firesched import BLOCK, WARP, Level, Swizzle, ir, ops
from firesched.errors import ScheduleError
from firesched.hardware.atoms import sm80
from firesched.ir.expr import evaluate, free_vars
from firesched.schedule import Schedule
from firesched.strategies import (
    Chain,
    Strategy,
    auto_swizzle,
    done,
    epilogue,
    move_to_regs,
    move_to_smem,
    pipeline,
    prologue,
    split_k,
    tile,
    to,
    to_blocks,
    to_threads,
    to_warpgroups,
    to_warps,
)

MMA = sm80.mma_m16n8k16_f16_f32

# --------------------------------------------------------------------------- strategies are values

VALUES = [
    pytest.param(lambda: tile(m=64, n=32), id="tile-mn"),
    pytest.param(lambda: tile(k=16), id="tile-k"),
    pytest.param(lambda: tile(m=16, n=8, k=16), id="tile-mnk"),
    pytest.param(lambda: to_blocks(), id="to_blocks"),
    pytest.param(lambda: to_blocks(group=4), id="to_blocks-group"),
    pytest.param(lambda: to_warps(2, 1), id="to_warps"),
    pytest.param(lambda: to_threads(4, 8), id="to_threads"),
    pytest.param(lambda: to_warpgroups(), id="to_warpgroups"),
    pytest.param(lambda: to(Level.WARP, (2, 2)), id="to-warp"),
    pytest.param(lambda: split_k(2), id="split_k-warp"),
    pytest.param(lambda: split_k(3, across=Level.BLOCK), id="split_k-block"),
    pytest.param(lambda: move_to_smem("A"), id="move_to_smem"),
    pytest.param(lambda: move_to_smem("B", swizzle=Swizzle(3, 3, 3)), id="move_to_smem-swizzle"),
    pytest.param(lambda: move_to_smem("A", via=(sm80.cp_async_16,)), id="move_to_smem-via"),
    pytest.param(lambda: move_to_regs("A"), id="move_to_regs"),
    pytest.param(lambda: move_to_regs("B", atom=sm80.ldmatrix_x4_trans), id="move_to_regs-atom"),
    pytest.param(lambda: pipeline(stages=3), id="pipeline"),
    pytest.param(lambda: pipeline(stages=4, prefetch=False), id="pipeline-no-prefetch"),
    pytest.param(lambda: done(MMA), id="done"),
    pytest.param(lambda: done(guard="predicate"), id="done-guard"),
    pytest.param(lambda: tile(m=64, n=64) >> to_blocks() >> tile(k=32), id="chain"),
    pytest.param(lambda: epilogue(ops.bias("bias"), ops.relu()), id="epilogue"),
    pytest.param(lambda: epilogue(ops.bias("b", axis="m"), ops.gelu(), ops.scale(0.5), ops.cast("f32")),
                 id="epilogue-bias-m-gelu-scale-cast"),
    pytest.param(lambda: epilogue(ops.residual("r"), ops.gelu(approximate="tanh"), ops.sigmoid(), ops.tanh()),
                 id="epilogue-residual-gelu-tanh"),
    pytest.param(lambda: prologue("A", ops.relu()), id="prologue"),
]


def namespace():
    ns = {name: getattr(fs.strategies, name) for name in fs.strategies.__all__}
    ns.update(Level=Level, sm80=sm80, ops=ops, Swizzle=Swizzle)
    return ns


@pytest.mark.parametrize("make", VALUES)
def test_strategies_are_hashable_values(make):
    a, b = make(), make()
    assert a is not b
    assert a == b and hash(a) == hash(b)
    assert {a: 1}[b] == 1
    assert isinstance(a, Strategy)


@pytest.mark.parametrize("make", VALUES)
def test_repr_round_trips_through_eval(make):
    a = make()
    back = eval(repr(a), namespace())  # noqa: S307 - the point of the test
    assert back == a and hash(back) == hash(a)
    assert repr(back) == repr(a)


def test_unequal_values_differ():
    vals = [tile(m=64), tile(n=64), tile(m=64, n=64), tile(m=32, n=64), to_blocks(), to_warps(),
            to_warps(2, 2), to_blocks(group=2), split_k(2), split_k(2, across=BLOCK), split_k(4), move_to_smem("A"),
            move_to_smem("B"), move_to_regs("A"), pipeline(2), pipeline(3), done(MMA),
            done(sm80.mma_m16n8k16_bf16_f32), epilogue(ops.relu()), epilogue(ops.gelu()), prologue("A", ops.relu())]
    assert len(set(vals)) == len(vals)
    assert len({repr(v) for v in vals}) == len(vals)


def test_chains_flatten_and_print_with_shifts():
    a, b, c = tile(m=64, n=64), to_blocks(), tile(k=32)
    left, right = (a >> b) >> c, a >> (b >> c)
    assert isinstance(left, Chain)
    assert left.parts == right.parts == (a, b, c)
    assert left == right and hash(left) == hash(right)
    assert str(left) == repr(left) == "tile(m=64, n=64) >> to_blocks() >> tile(k=32)"
    assert str(a >> b) == "tile(m=64, n=64) >> to_blocks()"
    assert all(not isinstance(p, Chain) for p in ((a >> b) >> (c >> b)).parts)
    assert len(((a >> b) >> (c >> b)).parts) == 4
    assert (a >> b) != (b >> a)


def test_chain_with_a_non_strategy_is_a_schedule_error():
    with pytest.raises(ScheduleError, match="not a strategy"):
        tile(m=64) >> 3
    with pytest.raises(ScheduleError, match="not a strategy"):
        fs.Schedule.of(fs.MatMul.kernel(64, 64, 64)).apply("tile(m=64)")


def test_chain_applies_its_parts_in_turn():
    spec = fs.MatMul.kernel(128, 128, 128)
    one = Schedule.of(spec).apply(tile(m=64, n=64) >> to_blocks() >> tile(k=32))
    three = Schedule.of(spec).apply(tile(m=64, n=64)).apply(to_blocks()).apply(tile(k=32))
    assert one.root == three.root
    assert str(one) == str(three)


# --------------------------------------------------------------------------- printing

def test_recipe_prints_one_line_per_spec():
    s = fs.recipes.gemm(256, 256, 128, block_m=128, block_n=128, block_k=32, warps_m=2, warps_n=2, stages=3, arch="sm_80")
    text = str(s)
    lines = text.splitlines()
    spec_lines = [ln for ln in lines if re.match(r"\s*(MatMul|Move|Init|Reduce)<", ln)]
    assert len(spec_lines) == len(list(s.nodes()))
    for n in s.nodes():
        assert sum(1 for ln in spec_lines if ln.strip().startswith(str(n.spec))) >= 1, str(n.spec)
    assert lines[0] == str(s.spec)
    for want in ("Move<block>", "MatMul<warp>", "MatMul<block>", "Init<block>", "Move<warp>",
                 "done(sm80.mma_m16n8k16_f16_f32)", "pipelined(3 stages)", "tile(m=128, n=128) >> to_blocks()",
                 "to_warps(2, 2)", "move_to_smem('A')", "move_to_regs('B')", "x3 stages", "Sw<"):
        assert want in text, want
    # a strategy line sits one level below the spec it refines
    i = lines.index(next(ln for ln in lines if ln.strip() == "tile(k=32)"))
    assert lines[i - 1].strip().startswith("MatMul<block>")
    assert len(lines[i]) - len(lines[i].lstrip()) == len(lines[i - 1]) - len(lines[i - 1].lstrip()) + 2
    assert "<- focus" not in text      # everything is atomic


def test_print_marks_the_open_focus():
    s = Schedule.of(fs.MatMul.kernel(128, 128, 128)).apply(tile(m=64, n=64) >> to_blocks())
    marked = [ln for ln in str(s).splitlines() if ln.endswith("<- focus")]
    assert len(marked) == 1 and marked[0].strip().startswith("MatMul<block>")


def test_split_k_and_epilogue_print():
    s = fs.recipes.gemm(96, 80, 200, block_m=64, block_n=32, warps_m=2, warps_n=1, split_k_warps=2, stages=2,
                        epilogue_ops=(ops.bias("bias"), ops.relu()), arch="sm_80")
    text = str(s)
    assert "split_k(2, across=warp)" in text
    assert "Reduce<block>(sum over kp0: C:RF f32[64x32] -> C:GL f16[64x32]) with bias(bias[n]), relu()" in text
    assert "epilogue(" not in text.splitlines()[1]


# --------------------------------------------------------------------------- immutability, equality

SPEC = fs.MatMul.kernel(100, 96, 160)
CHAIN = [tile(m=64, n=32) >> to_blocks(), tile(k=32), move_to_smem("A"), move_to_smem("B"), pipeline(3),
         split_k(2, across=WARP), tile(m=32, n=16) >> to_warps(2, 2), move_to_regs("A"), move_to_regs("B"),
         tile(m=16, n=8, k=16) >> done(MMA), epilogue(ops.relu()), prologue("A", ops.relu())]


def prefixes():
    out = [Schedule.of(SPEC)]
    for st in CHAIN:
        out.append(out[-1].apply(st))
    return out


def test_apply_returns_a_new_schedule_and_leaves_the_old_one_unchanged():
    ps = prefixes()
    for before, st, after in zip(ps, CHAIN, ps[1:]):
        text, root, strategies = str(before), before.root, before.strategies
        again = before.apply(st)
        assert again is not before
        assert str(before) == text and before.root is root and before.strategies == strategies
        assert again == after and again.root == after.root
        assert after.strategies == strategies + (st,)
        assert after != before
    ps[-1].check()


def test_schedules_hash_and_compare_by_value():
    a = fs.recipes.gemm(128, 128, 128, stages=2, arch="sm_80")
    b = fs.recipes.gemm(128, 128, 128, stages=2, arch="sm_80")
    c = fs.recipes.gemm(128, 128, 128, stages=3, arch="sm_80")
    assert a is not b and a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2
    assert a != fs.recipes.gemm(128, 128, 256, stages=2, arch="sm_80")      # same strategies, other spec
    assert a != "not a schedule"


def test_schedules_with_the_same_tree_are_equal():
    s = Schedule.of(fs.MatMul.kernel(128, 128, 128))
    a = s.apply(tile(m=64, n=64) >> to_blocks())
    b = s.apply(tile(m=64, n=64), to_blocks())
    assert a.root == b.root
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != s.apply(tile(m=64, n=32) >> to_blocks())


def test_equal_schedules_from_the_same_steps():
    s = Schedule.of(SPEC)
    a = s.apply(*CHAIN)
    b = s
    for st in CHAIN:
        b = b.apply(st)
    assert a == b and hash(a) == hash(b) and a.root == b.root


# --------------------------------------------------------------------------- the focus

def test_focus_moves_as_documented():
    ps = prefixes()
    f = [p.focus.spec for p in ps]
    assert f[0] == SPEC and f[0].level == fs.KERNEL
    # tile(m, n) >> to_blocks(): the block-sized MatMul, mapped to blocks
    assert f[1].level == BLOCK and (f[1].m, f[1].n, f[1].k) == (64, 32, 160)
    loops = ps[1].root.loops
    assert [(lp.dim, lp.count, lp.unit) for lp in loops] == [("m", 2, BLOCK), ("n", 3, BLOCK)]
    # tile(k): C becomes the register accumulator, the focus is the K step
    assert f[2].k == 32 and f[2].c.memory == fs.RF and f[2].a.memory == fs.GL
    # move_to_smem: the operand is in shared memory in the focus, the move comes before it
    assert f[3].a.memory == fs.SH and f[3].b.memory == fs.GL
    assert f[4].a.memory == f[4].b.memory == fs.SH
    holder = ps[4].focus_path()[-2]
    assert isinstance(holder.body[0].spec, fs.Move) and holder.body[-1] is ps[4].focus
    # pipeline: the focus stays, the shared tensors become 3 deep
    assert (f[5].m, f[5].n, f[5].k) == (f[4].m, f[4].n, f[4].k)
    assert f[5].a.tensor.stages == f[5].b.tensor.stages == 3
    # split_k across warps halves the K step
    assert f[6].k == 16 and f[6].level == BLOCK
    # tile >> to_warps: the warp's tile
    assert f[7].level == WARP and (f[7].m, f[7].n, f[7].k) == (32, 16, 16)
    assert f[8].a.memory == fs.RF and f[9].b.memory == fs.RF
    # done: the focus is the atom-sized leaf and it is closed
    assert (f[10].m, f[10].n, f[10].k) == (16, 8, 16) and ps[10].focus.atom is MMA
    assert not ps[10].focus.is_open
    # epilogue / prologue do not move the focus
    assert ps[11].focus.spec == ps[12].focus.spec == f[10]
    # every focus is the last body child of its parent, down the path
    for p in ps[1:]:
        path = p.focus_path()
        for parent, child in zip(path, path[1:]):
            assert parent.body[-1] is child


def test_nothing_left_to_refine_after_done():
    done_sched = prefixes()[10]
    with pytest.raises(ScheduleError, match="nothing left to refine") as info:
        done_sched.apply(tile(m=8))
    assert "tile(m=8)" in str(info.value) and "MatMul<warp>" in str(info.value)


def test_partial_tiles_are_allowed():
    s = Schedule.of(fs.MatMul.kernel(100, 70, 50)).apply(tile(m=64, n=32) >> to_blocks())
    m0, n0 = s.root.loops
    assert (m0.count, n0.count) == (2, 3)                   # ceil(100/64), ceil(70/32)
    assert (s.focus.spec.m, s.focus.spec.n) == (64, 32)
    s = s.apply(tile(k=32))
    (k0,) = s.focus_path()[-2].loops
    assert k0.count == 2                                     # ceil(50/32)
    full = fs.recipes.gemm(100, 70, 50, block_m=64, block_n=32, block_k=32, warps_m=2, warps_n=1, stages=2, arch="sm_80")
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((100, 50)), rng.standard_normal((50, 70))
    ref = A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)
    C = fs.interpret(full, A, B).astype(np.float64)
    assert np.abs(C - ref).max() <= 2e-2 * np.abs(ref).max()


def test_fresh_loop_variables_never_collide():
    s = prefixes()[-1]
    names = [lp.var for n in s.nodes() for lp in n.loops]
    assert len(names) == len(set(names)), names


# --------------------------------------------------------------------------- swizzles

@pytest.mark.parametrize("cols, bits, want", [
    (32, 16, Swizzle(2, 3, 3)),
    (64, 16, Swizzle(3, 3, 3)),
    (128, 16, Swizzle(3, 3, 4)),
    (256, 16, Swizzle(3, 3, 5)),
    (16, 16, Swizzle(1, 3, 3)),
    (8, 16, Swizzle(0, 0, 0)),
    (64, 32, Swizzle(3, 2, 4)),
])
def test_auto_swizzle_examples(cols, bits, want):
    assert auto_swizzle(cols, bits) == want


def bank_group(byte_addr) -> int:
    """Which of the eight 16-byte groups of the 32 four-byte banks an address falls in."""
    return (byte_addr // 16) % 8


AUTO_COLS = [8, 16, 32, 64, 128, 256]


@pytest.mark.parametrize("cols", AUTO_COLS)
def test_auto_swizzle_is_a_bijection_on_the_tile(cols):
    sw = auto_swizzle(cols, 16)
    rows = 64
    img = sorted(sw(o) for o in range(rows * cols))
    assert img == list(range(rows * cols))
    # and it keeps 16-byte chunks whole (8 f16 elements move together)
    for o in range(0, rows * cols, 8):
        assert [sw(o + i) for i in range(8)] == [sw(o) + i for i in range(8)]


@pytest.mark.parametrize("cols", AUTO_COLS)
def test_auto_swizzle_makes_ldmatrix_phases_bank_conflict_free(cols):
    """ldmatrix reads each 8x8 matrix as 8 rows of 16 bytes (one per lane of an 8-lane phase): in a
    row-major f16 tile ``cols`` wide, rows r0..r0+7 of chunk column c must hit 8 distinct groups."""
    sw = auto_swizzle(cols, 16)
    ident = Swizzle(0, 0, 0)
    conflicts_without = 0
    for r0 in range(0, 64, 8):
        for c in range(cols // 8):
            offs = [(r0 + i) * cols + c * 8 for i in range(8)]
            groups = {bank_group(2 * sw(o)) for o in offs}
            assert len(groups) == 8, (cols, sw, r0, c, sorted(groups))
            conflicts_without += len({bank_group(2 * ident(o)) for o in offs}) < 8
    if cols >= 16:
        assert conflicts_without, "the test would pass without a swizzle"


@pytest.mark.parametrize("cols", AUTO_COLS)
def test_auto_swizzle_keeps_quarter_warp_16_byte_stores_conflict_free(cols):
    """cp.async writes chunks in row-major order, one 16-byte chunk per thread: 8 consecutive
    chunks (a quarter warp) must hit 8 distinct groups."""
    sw = auto_swizzle(cols, 16)
    for first in range(0, 64 * cols // 8, 8):
        groups = {bank_group(2 * sw((first + i) * 8)) for i in range(8)}
        assert len(groups) == 8, (cols, first)


LOWERED = [
    pytest.param(dict(M=128, N=128, K=64, block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2), id="RR-32"),
    pytest.param(dict(M=128, N=128, K=128, block_m=64, block_n=128, block_k=64, warps_m=2, warps_n=2), id="RR-64"),
    pytest.param(dict(M=64, N=64, K=64, block_m=64, block_n=64, block_k=16, warps_m=2, warps_n=2), id="RR-16"),
    pytest.param(dict(M=128, N=128, K=64, block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2, layout="CC"),
                 id="CC-32"),
    pytest.param(dict(M=128, N=128, K=128, block_m=128, block_n=64, block_k=64, warps_m=2, warps_n=2,
                      layout="RC"), id="RC-64"),
]


def _phases(prog, family):
    """(atom call, per-thread byte addresses into shared memory) for each shared access of ``family``."""
    k = prog.kernels[0]
    base = k.shared_offsets()
    tid = np.arange(k.threads)
    out = []

    def walk(s):
        if isinstance(s, ir.Seq):
            for c in s.body:
                walk(c)
        elif isinstance(s, (ir.For,)):
            walk(s.body)
        elif isinstance(s, ir.If):
            walk(s.then)
        elif isinstance(s, ir.AtomCall) and s.atom.family == family:
            for _, ref in s.args:
                if isinstance(ref, ir.MemRef) and isinstance(ref.buffer, ir.SharedBuffer):
                    env = {v.name if hasattr(v, "name") else v: 0 for v in free_vars(ref.offset)}
                    env["tid"] = tid
                    off = np.broadcast_to(np.asarray(evaluate(ref.offset, env)), tid.shape)
                    out.append((s, base[ref.buffer.name] + off * ref.buffer.dtype.bits // 8))

    walk(k.body)
    return out


@pytest.mark.parametrize("params", LOWERED)
def test_lowered_ldmatrix_addresses_are_bank_conflict_free(params):
    p = dict(params)
    sched = fs.recipes.gemm(p.pop("M"), p.pop("N"), p.pop("K"), stages=2, arch="sm_80", **p)
    phases = _phases(sched.lower(), "ldmatrix")
    assert phases
    for call, addr in phases:
        nmat = int(re.search(r"_x(\d)", call.atom.name).group(1))
        for w0 in range(0, len(addr), 32):
            lanes = addr[w0:w0 + 32]
            for m in range(nmat):
                rows = lanes[8 * m:8 * m + 8]
                assert len({bank_group(int(a)) for a in rows}) == 8, (call.atom.name, m, rows)


@pytest.mark.parametrize("params", LOWERED)
def test_lowered_cp_async_stores_are_bank_conflict_free(params):
    p = dict(params)
    sched = fs.recipes.gemm(p.pop("M"), p.pop("N"), p.pop("K"), stages=2, arch="sm_80", **p)
    phases = _phases(sched.lower(), "cp_async")
    assert phases
    for call, addr in phases:
        for q in range(0, len(addr), 8):
            assert len({bank_group(int(a)) for a in addr[q:q + 8]}) == 8, (call.atom.name, q)


def test_every_auto_swizzle_the_recipe_picks_is_listed_above():
    picked = set()
    for bm, bn, bk in itertools.product((32, 64, 128), (32, 64, 128), (16, 32, 64)):
        s = fs.recipes.gemm(256, 256, 256, block_m=bm, block_n=bn, block_k=bk, warps_m=2, warps_n=2, check=False, arch="sm_80")
        for n in s.nodes():
            if isinstance(n.spec, fs.Move) and n.spec.dst.memory == fs.SH:
                picked.add((n.spec.dst.extent(n.spec.dst.tensor.major), n.spec.dst.tensor.swizzle))
    for cols, sw in picked:
        assert cols in AUTO_COLS and sw == auto_swizzle(cols, 16)
