"""Invalid schedules fail with ``ScheduleError`` — and only that — with a message that names the
strategy, the spec, the offending value and what is allowed or how to fix it.

Fixed cases cover each kind of mistake; a property test feeds junk to every strategy constructor
and to the GEMM recipe, applied at a random point of a valid chain.
"""

from __future__ import annotations

import inspect
import math

import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

import firesched as fs
from firesched import BLOCK, WARP, Level, Swizzle, ops
from firesched.errors import ScheduleError
from firesched.hardware.atoms import sm80
from firesched.schedule import Schedule
from firesched.strategies import (
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
SPEC = fs.MatMul.kernel(128, 128, 128)
KERNEL = Schedule.of(SPEC)
BLOCKS = KERNEL.apply(tile(m=64, n=64) >> to_blocks())
KSTEP = BLOCKS.apply(tile(k=32))
SMEM = KSTEP.apply(move_to_smem("A"), move_to_smem("B"))
WARPS = SMEM.apply(tile(m=32, n=32) >> to_warps(2, 2))
REGS = WARPS.apply(move_to_regs("A"), move_to_regs("B"))
DONE = REGS.apply(tile(m=16, n=8, k=16) >> done(MMA))


def gemm(**kw):
    M, N, K = kw.pop("M", 128), kw.pop("N", 128), kw.pop("K", 128)
    return fs.recipes.gemm(M, N, K, **kw)


CASES = [
    # ---------------------------------------------------------------- tiles and mapping
    pytest.param(lambda: BLOCKS.apply(tile(m=128)),
                 ["strategy tile(m=128)", "on spec MatMul<block>(A:GL f16[64x128]", "m = 128", "allowed: 1..64",
                  "fix: use m<=64"], id="tile-larger-than-parent-tile"),
    pytest.param(lambda: BLOCKS.apply(tile(n=128, k=32)),
                 ["tile(n=128, k=32)", "MatMul<block>", "n = 128", "allowed: 1..64"], id="tile-n-larger-than-parent"),
    pytest.param(lambda: KERNEL.apply(tile(m=0)), ["tile(m=0)", "m = 0", "a positive int"], id="tile-zero"),
    pytest.param(lambda: KERNEL.apply(tile()), ["tile()", "give at least one of m=, n=, k=", "fix:"],
                 id="tile-nothing"),
    pytest.param(lambda: KERNEL.apply(tile(k=32)),
                 ["tile(k=32)", "MatMul<kernel>", "k = 32", "to_blocks() first"], id="tile-k-at-kernel-level"),
    pytest.param(lambda: BLOCKS.apply(tile(m=32, k=32)),
                 ["tile(m=32, k=32)", "MatMul<block>", "separate strategies", "fix:"], id="tile-mk-with-C-in-GL"),
    pytest.param(lambda: KSTEP.apply(tile(m=32, n=64) >> to_warps(3, 1)),
                 ["to_warps(3, 1)", "MatMul<block>", "arrangement = (3, 1)", "allowed: (2, 1)",
                  "does not match the tiling (m: 2 tiles, n: 1 tiles)", "fix:"], id="to_warps-3x1-not-dividing"),
    pytest.param(lambda: SMEM.apply(tile(m=8, n=8) >> to_warps()),
                 ["to_warps()", "warps = 64", "allowed: <= 32", "fix: use larger warp tiles"], id="too-many-warps"),
    pytest.param(lambda: KERNEL.apply(to_warps()),
                 ["strategy to_warps()", "MatMul<kernel>", "no loops to map", "fix: write tile(m=..., n=...) >> "
                  "to_warps()"], id="to_warps-right-after-the-kernel-spec"),
    pytest.param(lambda: KERNEL.apply(tile(m=64, n=64) >> to_warps()),
                 ["strategy to_warps()", "MatMul<kernel>", "level = 'warp'", "allowed: block, warpgroup specs",
                  "fix: map the block tiles first"], id="tile-to_warps-at-kernel-level"),
    pytest.param(lambda: BLOCKS.apply(tile(m=32, n=32) >> to_blocks()),
                 ["to_blocks()", "MatMul<block>", "allowed: kernel specs"], id="to_blocks-twice"),
    pytest.param(lambda: KERNEL.apply(tile(m=64, n=64) >> to(Level.KERNEL)),
                 ["cannot map loops onto this level", "field: level", "allowed: Level.BLOCK"], id="to-kernel-level"),
    pytest.param(lambda: KERNEL.apply(tile(m=64, n=64) >> to_blocks(group=0)),
                 ["group = 0", "allowed: >= 1"], id="to_blocks-group-0"),
    pytest.param(lambda: SMEM.apply(tile(m=32, n=32) >> to(WARP, (), 2)),
                 ["group = 2", "grouped block order orders blocks: it belongs to to_blocks()"],
                 id="to_warps-group"),
    # ---------------------------------------------------------------- moves
    pytest.param(lambda: KSTEP.apply(move_to_smem("Q")),
                 ["strategy move_to_smem('Q')", "on spec MatMul<block>", "unknown operand", "operand = 'Q'",
                  "allowed: 'A', 'B', 'C'"], id="move_to_smem-unknown-operand"),
    pytest.param(lambda: WARPS.apply(move_to_regs("Q")),
                 ["strategy move_to_regs('Q')", "MatMul<warp>", "operand = 'Q'", "allowed: 'A', 'B', 'C'"],
                 id="move_to_regs-unknown-operand"),
    pytest.param(lambda: DONE.apply(prologue("Q", ops.relu())),
                 ["prologue(Q, relu())", "operand = 'Q'", "allowed: 'A', 'B'"], id="prologue-unknown-operand"),
    pytest.param(lambda: WARPS.apply(move_to_smem("A")),
                 ["strategy move_to_smem('A')", "MatMul<warp>", "level = 'warp'", "allowed: block",
                  "fix: apply move_to_smem right after tiling to blocks"], id="move_to_smem-at-warp-level"),
    pytest.param(lambda: SMEM.apply(move_to_smem("A")),
                 ["move_to_smem('A')", "operand A is in SH, not global memory", "fix: stage each operand once"],
                 id="move_to_smem-twice"),
    pytest.param(lambda: KSTEP.apply(move_to_smem("C")),
                 ["move_to_smem('C')", "operand C is in RF", "operand = 'C'"], id="move_to_smem-C"),
    pytest.param(lambda: KSTEP.apply(tile(m=32, n=32) >> to_warps(), move_to_regs("A")),
                 ["move_to_regs('A')", "MatMul<warp>", "operand A is in GL", "fix: apply move_to_smem('A')"],
                 id="move_to_regs-before-move_to_smem"),
    pytest.param(lambda: WARPS.apply(move_to_regs("C")),
                 ["move_to_regs('C')", "created by tile(k=...)", "allowed: 'A', 'B'"], id="move_to_regs-C"),
    pytest.param(lambda: WARPS.apply(move_to_regs("A", atom=MMA)),
                 ["move_to_regs('A', atom=sm80.mma_m16n8k16_f16_f32)", "takes an ldmatrix atom",
                  "allowed: sm80.ldmatrix_x1/x2/x4"], id="move_to_regs-non-ldmatrix-atom"),
    pytest.param(lambda: KSTEP.apply(move_to_smem("A", swizzle=Swizzle(3, 1, 3))),
                 ["swizzle=Swizzle(3, 1, 3)", "split 16-byte chunks", "allowed: base >= 3 for f16"],
                 id="swizzle-splits-chunks"),
    pytest.param(lambda: KSTEP.apply(move_to_smem("A", swizzle=Swizzle(3, 3, 10))),
                 ["Swizzle(3, 3, 10)", "more than the 2048-element tile", "fix: use fewer bits"],
                 id="swizzle-larger-than-tile"),
    pytest.param(lambda: KSTEP.apply(move_to_smem("A", swizzle="xor")),
                 ["swizzle = 'xor'", "Swizzle(bits, base, shift) or None"], id="swizzle-not-a-swizzle"),
    pytest.param(lambda: KSTEP.apply(move_to_smem("A", via=(sm80.cp_async_16,)), move_to_smem("B"),
                                     tile(m=32, n=32) >> to_warps(), move_to_regs("A"), move_to_regs("B"),
                                     tile(m=16, n=8, k=16) >> done(MMA)).check(),
                 [], id="via-ok-control"),
    # ---------------------------------------------------------------- split-K, pipeline, fusion
    pytest.param(lambda: BLOCKS.apply(split_k(2, across=BLOCK)),
                 ["strategy split_k(2, across=block)", "MatMul<block>", "level = 'block'", "allowed: kernel",
                  "fix: apply split_k(..., across=BLOCK) before tile(...) >> to_blocks()"],
                 id="split_k-blocks-after-to_blocks"),
    pytest.param(lambda: KERNEL.apply(split_k(4, across=BLOCK)),
                 ["split_k(4, across=block)", "K=128 split in parts of 64", "gives 2 parts, not 4", "parts = 4",
                  "fix: use split_k(2)"], id="split_k-blocks-too-many-parts"),
    pytest.param(lambda: SMEM.apply(split_k(3)),
                 ["split_k(3, across=warp)", "the K tile 32 does not divide into 3 parts", "allowed: divisors of 32"],
                 id="split_k-warps-not-dividing"),
    pytest.param(lambda: BLOCKS.apply(split_k(2)),
                 ["split_k(2, across=warp)", "level/C = 'block/GL'", "allowed: block/RF", "fix:"],
                 id="split_k-warps-before-tile-k"),
    pytest.param(lambda: KERNEL.apply(split_k(2, across=Level.THREAD)),
                 ["across = Level.THREAD", "allowed: Level.BLOCK, Level.WARP"], id="split_k-across-threads"),
    pytest.param(lambda: KSTEP.apply(pipeline(3)),
                 ["strategy pipeline(stages=3)", "MatMul<block>", "moves nothing from global to shared memory",
                  "fix: apply move_to_smem(...) before pipeline(...)"], id="pipeline-without-moves"),
    pytest.param(lambda: BLOCKS.apply(pipeline(3)),
                 ["pipeline(stages=3)", "no sequential K loop", "fix: tile(k=...)"], id="pipeline-without-k-loop"),
    pytest.param(lambda: SMEM.apply(pipeline(17)),
                 ["pipeline(stages=17)", "stages = 17", "allowed: 1..16"], id="pipeline-too-deep"),
    pytest.param(lambda: BLOCKS.apply(epilogue(ops.relu())),
                 ["strategy epilogue(relu())", "MatMul<kernel>", "no accumulator store to fuse into yet",
                  "fix: apply tile(k=...)"], id="epilogue-before-tile-k"),
    pytest.param(lambda: DONE.apply(epilogue(ops.relu()), epilogue(ops.gelu())),
                 ["epilogue(gelu())", "already has an epilogue", "fix: give all ops in one epilogue(...)"],
                 id="epilogue-twice"),
    pytest.param(lambda: DONE.apply(epilogue(ops.bias("A"))),
                 ["epilogue(bias(A[n]))", "extra tensor name 'A' is already used", "name = 'A'"],
                 id="epilogue-name-clash"),
    pytest.param(lambda: DONE.apply(epilogue(ops.cast("f32"), ops.relu())),
                 ["at most one cast, and it comes last"], id="epilogue-cast-not-last"),
    pytest.param(lambda: DONE.apply(epilogue("relu")),
                 ["not an element-wise op", "op = 'relu'", "allowed: firesched.ops."], id="epilogue-not-an-op"),
    pytest.param(lambda: DONE.apply(prologue("A", ops.bias("b"))),
                 ["prologue(A, bias(b[n]))", "cannot read extra tensors", "allowed: relu, gelu"],
                 id="prologue-with-extras"),
    pytest.param(lambda: DONE.apply(prologue("A")), ["give at least one op", "fix: prologue(\"A\", relu())"],
                 id="prologue-no-ops"),
    pytest.param(lambda: SMEM.apply(prologue("A", ops.relu())),
                 ["prologue(A, relu())", "no register move of A", "fix: apply move_to_regs('A')"],
                 id="prologue-before-move_to_regs"),
    # ---------------------------------------------------------------- done(atom)
    pytest.param(lambda: WARPS.apply(tile(m=16, n=16, k=16) >> done(sm80.mma_m16n8k16_bf16_f32)),
                 ["strategy done(sm80.mma_m16n8k16_bf16_f32)", "on spec MatMul<warp>(A:SH f16[16x16]",
                  "does not match the atom's pattern", "n: focus has 16, atom has 8",
                  "a dtype: focus has f16, atom takes bf16", "b dtype: focus has f16, atom takes bf16",
                  "a memory: A is in SH, atom takes RF (add move_to_regs('A'))",
                  "b memory: B is in SH, atom takes RF (add move_to_regs('B'))",
                  "atom = sm80.mma_m16n8k16_bf16_f32", "fix: tile the focus to the atom's shape first: "
                  "tile(m=16, n=8, k=16)"], id="done-pattern-differs-shape-dtype-memory"),
    pytest.param(lambda: REGS.apply(tile(m=16, n=8, k=8) >> done(sm80.mma_m16n8k8_tf32_f32)),
                 ["done(sm80.mma_m16n8k8_tf32_f32)", "a dtype: focus has f16, atom takes tf32"],
                 id="done-tf32-on-f16"),
    pytest.param(lambda: BLOCKS.apply(tile(k=16), done(MMA)),
                 ["done(sm80.mma_m16n8k16_f16_f32)", "level: focus is block, atom runs per warp",
                  "m: focus has 64, atom has 16"], id="done-at-block-level"),
    pytest.param(lambda: REGS.apply(tile(m=16, n=8, k=16) >> done(sm80.ldmatrix_x4)),
                 ["done(sm80.ldmatrix_x4)", "kind: the atom implements"], id="done-non-mma-atom"),
    pytest.param(lambda: REGS.apply(tile(m=16, n=8, k=16) >> done("mma")),
                 ["done('mma')", "atom = 'mma'", "done takes an atom record"], id="done-not-an-atom"),
    pytest.param(lambda: DONE.apply(tile(m=8)),
                 ["strategy tile(m=8)", "nothing left to refine", "fix:"], id="refine-after-done"),
    # ---------------------------------------------------------------- check()
    pytest.param(lambda: REGS.check(),
                 ["on spec MatMul<warp>(A:RF f16[32x32]", "not refined down to an atom",
                  "fix: continue the chain until done(atom)"], id="check-incomplete"),
    pytest.param(lambda: gemm(M=512, N=512, K=512, block_m=256, block_n=256, block_k=64, warps_m=4, warps_n=4,
                              stages=4, check=False, arch="sm_80").check("sm_80"),
                 ["on spec MatMul<block>", "shared memory over the target's limit: 262400 bytes",
                  "A_smem: 131072 B", "shared memory = 262400", "allowed: <= 166912 bytes on sm_80",
                  "fix: use fewer pipeline stages"], id="check-shared-memory-over-limit"),
    pytest.param(lambda: gemm(M=128, N=128, K=128, block_m=128, block_n=128, block_k=64, warps_m=2, warps_n=2,
                              stages=4, check=False, arch="sm_80").check("sm_70"),
                 ["mma needs sm_80: the target sm_70 has no mma_m16n8k16_f16_f32", "field: done"],
                 id="check-atom-sm70"),
    pytest.param(lambda: gemm(M=128, N=256, K=64, block_m=128, block_n=256, warps_m=1, warps_n=1, stages=1,
                              block_k=16, arch="sm_80"),
                 ["on spec MatMul<block>", "registers over budget: about 1160 per thread at the peak", "C_acc: 1024",
                  "registers = 1160", "allowed: <= 255", "fix: use smaller warp tiles"],
                 id="registers-one-warp-for-128x256"),
    # ---------------------------------------------------------------- recipe parameters
    pytest.param(lambda: gemm(warps_m=3, arch="sm_80"),
                 ["the warp arrangement does not divide the block tile", "warps_m x warps_n = '3x2'",
                  "allowed: divisors of 128x128", "fix: choose warps_m | block_m"], id="gemm-warps_m-3"),
    pytest.param(lambda: gemm(block_m="64", arch="sm_80"),
                 ["recipe parameters are positive ints", "block_m = '64'", "fix: pass gemm(..., block_m=<int>)"],
                 id="gemm-block_m-string"),
    pytest.param(lambda: gemm(stages=0, arch="sm_80"), ["stages = 0", "a positive int"], id="gemm-stages-0"),
    pytest.param(lambda: gemm(stages=-2, arch="sm_80"), ["stages = -2"], id="gemm-stages-negative"),
    pytest.param(lambda: gemm(split_k_warps=True, arch="sm_80"), ["split_k_warps = True"], id="gemm-bool"),
    pytest.param(lambda: gemm(block_k=24, arch="sm_80"), ["block_k = 24", "multiples of 16"], id="gemm-block_k-24"),
    pytest.param(lambda: gemm(block_m=48, warps_m=2, arch="sm_80"), ["warp tiles of 24x64", "multiples of 16"],
                 id="gemm-warp-tile-not-16"),
    pytest.param(lambda: gemm(warp_k=24, arch="sm_80"), ["warp_k = 24", "multiples of 16 dividing 32"], id="gemm-warp_k"),
    pytest.param(lambda: gemm(split_k_blocks=4, arch="sm_80"), ["gives 2 parts, not 4"], id="gemm-split_k_blocks"),
    pytest.param(lambda: gemm(dtype="f32", arch="sm_80"), ["16-bit inputs", "dtype = 'f32'", "allowed: f16, bf16"],
                 id="gemm-dtype-f32"),
    pytest.param(lambda: gemm(out_dtype="i8", arch="sm_80"), ["out_dtype = 'i8'", "allowed: f16, bf16, f32"],
                 id="gemm-out_dtype-i8"),
    pytest.param(lambda: gemm(epilogue_ops=(ops.relu, ), arch="sm_80"), ["not an element-wise op"], id="gemm-epilogue-function"),
    pytest.param(lambda: gemm(M=-128, arch="sm_80"), ["M", "-128"], id="gemm-negative-M"),
    pytest.param(lambda: gemm(K=0, arch="sm_80"), ["K", "0"], id="gemm-zero-K"),
    pytest.param(lambda: gemm(M="128", arch="sm_80"), ["M", "'128'"], id="gemm-string-M"),
    pytest.param(lambda: gemm(dtype="junk", arch="sm_80"), ["dtype", "'junk'"], id="gemm-dtype-junk"),
    pytest.param(lambda: gemm(out_dtype="junk", arch="sm_80"), ["out_dtype", "'junk'"], id="gemm-out_dtype-junk"),
    pytest.param(lambda: gemm(layout="XX", arch="sm_80"), ["layout", "'XX'"], id="gemm-layout-junk"),
    pytest.param(lambda: gemm(arch="sm_75"), ["arch", "'sm_75'"], id="gemm-arch-junk"),
    pytest.param(lambda: gemm(epilogue_ops=ops.relu(), arch="sm_80"), ["epilogue_ops"], id="gemm-epilogue_ops-not-a-tuple"),
    pytest.param(lambda: gemm(prologue_ops=5, arch="sm_80"), ["prologue_ops"], id="gemm-prologue_ops-not-a-tuple"),
    # ---------------------------------------------------------------- strategy values that crash
    pytest.param(lambda: KERNEL.apply(tile(m=64, n=64) >> to_blocks(group="2")), ["group = '2'"],
                 id="to_blocks-group-string"),
    pytest.param(lambda: KERNEL.apply(tile(m=64, n=64) >> to(Level.WARP, 2)), ["arrangement = 2"],
                 id="to-arrangement-not-a-tuple"),
    pytest.param(lambda: KERNEL.apply(tile(m=64, n=64) >> to([1])), ["level = [1]"], id="to-unhashable-level"),
    pytest.param(lambda: KSTEP.apply(move_to_smem("A", via=(sm80.cp_async_16, sm80.cp_async_8))), ["via"],
                 id="via-two-atoms"),
    pytest.param(lambda: KSTEP.apply(move_to_smem("A", via="fast")), ["via"], id="via-not-a-tuple"),
    pytest.param(lambda: KSTEP.apply(move_to_smem("A", via=(3,)), move_to_smem("B"),
                                     tile(m=32, n=32) >> to_warps(), move_to_regs("A"), move_to_regs("B"),
                                     tile(m=16, n=8, k=16) >> done(MMA)).check(),
                 ["via"], id="via-not-an-atom"),
    pytest.param(lambda: gemm(M=128 * 70000, N=128, K=64, arch="sm_80", block_m=128, block_n=128).check(), ["grid"],
                 id="grid-over-65535-blocks"),
]


@pytest.mark.parametrize("make, words", CASES)
def test_invalid_schedule_is_a_schedule_error(make, words):
    if not words:                # a valid control case: the same path without the mistake
        make()
        return
    with pytest.raises(Exception) as info:
        make()
    err = info.value
    assert type(err) is ScheduleError, f"{type(err).__name__}: {err}"
    msg = str(err)
    for w in words:
        assert w in msg, f"{w!r} not in the message:\n{msg}"


def test_split_k_across_a_plain_int():
    """``across`` is a Level; a plain int (a count of something?) is refused, naming the levels."""
    with pytest.raises(ScheduleError, match="across blocks, warpgroups or warps") as e:
        KERNEL.apply(split_k(2, across=2))
    assert (e.value.field, e.value.value) == ("across", 2)
    assert e.value.allowed == "Level.BLOCK, Level.WARPGROUP, Level.WARP"


def test_error_fields_are_attributes():
    with pytest.raises(ScheduleError) as info:
        BLOCKS.apply(tile(m=128))
    e = info.value
    assert e.strategy == tile(m=128) and e.spec == BLOCKS.focus_path()[-1].spec
    assert (e.field, e.value, e.allowed) == ("m", 128, "1..64")
    assert e.fix == "use m<=64"
    assert isinstance(e, ValueError) and isinstance(e, fs.FireschedError)


# --------------------------------------------------------------------------- junk everywhere

ODD = [Level.KERNEL, Level.CLUSTER, Level.BLOCK, Level.WARPGROUP, Level.WARP, Level.THREAD, Swizzle(3, 3, 3),
       Swizzle(0, 0, 0), Swizzle(1, 0, 1), MMA, sm80.mma_m16n8k16_bf16_f32, sm80.ldmatrix_x4,
       sm80.ldmatrix_x2_trans, sm80.cp_async_16, sm80.cp_async_4, ops.relu(), ops.bias("bias"), ops.cast("f32"),
       ops.residual("A"), ops.scale(2.0), tile(m=16), fs.ScheduleError, object(), b"A", 1j, math.pi]

ints = st.one_of(st.integers(-3, 300), st.sampled_from([0, -1, 16, 32, 64, 128, 2**31, 2**64, -10**12, 10**12]))
# values that are right somewhere, so that some junk gets deep into the chain and into check()
plausible = st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, "A", "B", Level.WARP, Level.BLOCK, MMA, Swizzle(3, 3, 3),
                             Swizzle(2, 3, 3), sm80.ldmatrix_x4, ops.relu(), ops.bias("bias"), (2, 2), (2,), ()])
hashable_junk = st.one_of(
    plausible,
    ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.sampled_from(["", "A", "B", "C", "Q", "a", "16", "f16", "warp", "RR"]),
    st.text(max_size=3),
    st.lists(st.integers(-2, 70), max_size=3).map(tuple),
    st.sampled_from(ODD),
)
junk = st.one_of(hashable_junk, st.lists(st.integers(0, 4), max_size=2), st.dictionaries(st.text(max_size=1),
                                                                                         st.integers(), max_size=1))
numbers = st.one_of(ints, st.floats(allow_nan=True, allow_infinity=True), st.booleans())


LEVELS = [Level.BLOCK, Level.WARP, Level.THREAD, Level.WARPGROUP, Level.KERNEL]
# per constructor: the values each positional slot takes in a valid chain; every slot is drawn
# either from those or from the junk, so that some junk gets deep into the chain and into check()
SLOTS = {
    "tile": (tile, [[16, 32, 64, 8]] * 3),
    "to": (to, [LEVELS, [(), (2, 2), (2, 1), (1, 3)], [1, 2, 4]]),
    "to_blocks": (to_blocks, [[1, 2, 3]] * 3),
    "to_warps": (to_warps, [[1, 2, 4]] * 3),
    "to_threads": (to_threads, [[1, 2, 32]] * 3),
    "to_warpgroups": (to_warpgroups, [[1, 2]] * 3),
    "split_k": (split_k, [[2, 3, 4], [Level.WARP, Level.BLOCK]]),
    "move_to_smem": (move_to_smem, [["A", "B"], [None, Swizzle(3, 3, 3), Swizzle(2, 3, 3), Swizzle(1, 3, 3)]]),
    "move_to_regs": (move_to_regs, [["A", "B"], [None, sm80.ldmatrix_x4, sm80.ldmatrix_x2_trans, sm80.ldmatrix_x1]]),
    "pipeline": (pipeline, [[2, 3, 8], [True, False]]),
    "epilogue": (epilogue, [[ops.relu(), ops.bias("bias"), ops.cast("f32"), ops.gelu()]] * 3),
    "prologue": (prologue, [["A", "B"], [ops.relu(), ops.tanh()], [ops.scale(2.0)]]),
    "done": (done, [[MMA, sm80.mma_m16n8k16_bf16_f32]]),
}


@st.composite
def junk_strategy(draw):
    """(constructor, args, kwargs), each argument right for its slot (2 in 3) or junk."""
    kind = draw(st.sampled_from(sorted(SLOTS)))
    ctor, slots = SLOTS[kind]
    n = draw(st.integers(0, len(slots) + 1))
    args = []
    for i in range(n):
        right = slots[i] if i < len(slots) else [None]
        wrong = junk
        if kind == "to" and i == 1:     # arrangements: tuples holding junk, or junk
            wrong = st.one_of(st.lists(junk, max_size=3).map(tuple), junk)
        args.append(draw(st.sampled_from(right) if draw(st.integers(0, 2)) else wrong))
    kw = {}
    if kind == "to_blocks" and draw(st.booleans()):
        kw["group"] = draw(st.one_of(st.sampled_from([1, 2, 4]), junk))
    if kind == "tile" and draw(st.booleans()):      # keywords too
        dims = draw(st.lists(st.sampled_from("mnk"), min_size=1, max_size=3, unique=True))
        args, kw = [], {d: draw(st.one_of(st.sampled_from([16, 32, 64]), junk)) for d in dims}
    if kind == "move_to_smem" and len(args) <= 2 and draw(st.booleans()):
        kw["via"] = draw(st.one_of(junk, st.lists(st.sampled_from([sm80.cp_async_16, sm80.cp_async_8,
                                                                    sm80.cp_async_4, None]), max_size=2).map(tuple)))
    return ctor, tuple(args), kw


JUNK_SPEC = fs.MatMul.kernel(100, 96, 160)
JUNK_CHAIN = [tile(m=64, n=32) >> to_blocks(), tile(k=32), move_to_smem("A"), move_to_smem("B"), pipeline(3),
              split_k(2, across=WARP), tile(m=32, n=16) >> to_warps(2, 2), move_to_regs("A"), move_to_regs("B"),
              tile(m=16, n=8, k=16) >> done(MMA), epilogue(ops.bias("bias"), ops.relu()),
              prologue("A", ops.relu())]
JUNK_PREFIXES = [Schedule.of(JUNK_SPEC)]
for _s in JUNK_CHAIN:
    JUNK_PREFIXES.append(JUNK_PREFIXES[-1].apply(_s))


def _construct(ctor, args, kwargs):
    """The strategy, or None when the constructor refused the arguments (only for the wrong arity)."""
    try:
        return ctor(*args, **kwargs)
    except ScheduleError:
        return None
    except TypeError:
        try:
            inspect.signature(ctor).bind(*args, **kwargs)
        except TypeError:
            return None          # wrong arity: a TypeError is fine
        raise


@given(made=junk_strategy(), where=st.integers(0, len(JUNK_CHAIN)), cont=st.sampled_from(["stop", "rest", "skip"]),
       chained=st.booleans())
def test_junk_strategies_fail_only_with_schedule_error(made, where, cont, chained):
    s = _construct(*made)
    assume(s is not None)
    base = JUNK_PREFIXES[where]
    rest = JUNK_CHAIN[where:] if cont == "rest" else JUNK_CHAIN[where + 1:] if cont == "skip" else []
    try:
        out = base.apply(s >> rest[0], *rest[1:]) if chained and rest else base.apply(s, *rest)
        if rest or where == len(JUNK_CHAIN):
            out.check()
        str(out)
        repr(out)
        event("accepted")
    except ScheduleError as e:
        event("ScheduleError")
        msg = str(e)
        assert "strategy " in msg or "on spec " in msg or "\n  field: " in msg, msg


GOOD = dict(M=100, N=96, K=160, dtype="f16", arch="sm_80", out_dtype=None, layout="RR", block_m=64, block_n=32,
            block_k=32, warps_m=2, warps_n=2, stages=2, split_k_blocks=1, split_k_warps=1, swizzle=None, warp_k=16,
            group_m=1, prefetch=True, epilogue_ops=(), prologue_ops=())
JUNK_PARAMS = list(GOOD)
tuple_junk = st.one_of(st.lists(hashable_junk, max_size=3).map(tuple),
                       st.lists(st.sampled_from([ops.relu(), ops.gelu(), ops.bias("bias"), ops.bias("A"),
                                                 ops.residual("r"), ops.cast("f32"), ops.cast("i8"),
                                                 ops.scale(0.5), ops.sigmoid()]), max_size=3).map(tuple))


@given(changes=st.dictionaries(st.sampled_from(JUNK_PARAMS), junk, min_size=1, max_size=3), data=st.data())
def test_junk_recipe_parameters_fail_only_with_schedule_error(changes, data):
    kw = dict(GOOD)
    for k in changes:
        kw[k] = data.draw(tuple_junk) if k.endswith("_ops") else changes[k]
    M, N, K = kw.pop("M"), kw.pop("N"), kw.pop("K")
    try:
        sched = fs.recipes.gemm(M, N, K, **kw)
    except ScheduleError as e:
        event("ScheduleError")
        assert str(e)
        return
    event("accepted")
    sched.check(kw["arch"])
    str(sched)


def test_block_and_k_tiles_may_overhang_a_small_problem():
    """A block tile (or a K tile) larger than the problem is one partial tile, predicated."""
    sched = KERNEL.apply(tile(m=256, n=64) >> to_blocks())
    assert sched.root.loops[0].count == 1
    sched = BLOCKS.apply(tile(k=512))
    assert [lp.count for lp in sched.focus_path()[-2].loops] == [1]
