"""Random GEMM schedules over the whole space the strategies accept, run in the interpreter and
compared with ``tests/oracles.py``.

``test_gemm_interp.py`` draws the parameters of the fixed ``recipes.gemm`` chain from the values
the recipe was tuned on.  Here hypothesis reaches further:

* the sm_80 recipe with every K tile that is a multiple of 16 up to 128 (those that do not divide
  a split-K part exercise the last tile's limit), split-K across blocks up to 8 parts and across
  warps up to 4, bias along M and N, user swizzles, epilogue chains up to 5 ops, prologues on A
  or B;
* hand-built chains that the recipe never writes: a swizzle per operand, the cp.async width
  (``via=``), the ldmatrix variant for each operand, the MMA atom, the warp K step;
* the Hopper recipe with bias along M, long chains and every swizzle mode;
* random compositions of strategies (steps dropped, repeated, swapped or replaced by a variant):
  every composition the library *accepts* (``check()`` passes) is executed, and must be
  hazard-free and right, not just fail with the right error type.

Refusals (``ScheduleError``) are expected for many draws and counted as hypothesis events.
"""

from __future__ import annotations

import attrs
import numpy as np
import oracles
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import ops
from firesched.hardware import sm80
from firesched.hardware.atoms import sm90a
from firesched.hardware.target import SM90A
from firesched.strategies import (
    Chain,
    done,
    epilogue,
    move_to_regs,
    move_to_smem,
    pipeline,
    prologue,
    split_k,
    tile,
    to_blocks,
    to_warps,
)


def _ci() -> bool:
    return settings().max_examples >= 500


def _examples(dev: int, ci: int):
    return settings(max_examples=ci if _ci() else dev, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


EPILOGUE_POOL = [ops.relu(), ops.gelu(), ops.gelu(approximate="tanh"), ops.sigmoid(), ops.tanh(), ops.scale(-0.75),
                 ops.scale(2.0)]
PROLOGUE_POOL = [ops.relu(), ops.tanh(), ops.scale(0.5), ops.sigmoid()]


@st.composite
def epilogue_chains(draw, max_len: int = 5, bias_m: bool = True):
    """Up to ``max_len`` ops: unary ops, scales, biases along N (and M), a residual, a final cast."""
    n = draw(st.integers(0, max_len))
    chain, used = [], 0
    for _ in range(n):
        kind = draw(st.sampled_from(["unary", "unary", "bias_n", "bias_m", "residual"]))
        if kind == "unary":
            chain.append(draw(st.sampled_from(EPILOGUE_POOL)))
        elif kind == "bias_m" and not bias_m:
            continue
        else:
            name = f"x{used}"
            used += 1
            chain.append(ops.residual(name) if kind == "residual" else ops.bias(name, axis=kind[-1]))
    if chain and draw(st.integers(0, 5)) == 0:
        chain.append(ops.cast(draw(st.sampled_from(["f32", "bf16", "f16"]))))
    return tuple(chain)


def _run_and_compare(sched, M, N, K, *, dtype, out_dtype, chain, seed, prologue_ops=None, target="sm_90a"):
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    by_name, order = oracles.extras_for(chain, M, N, rng)
    C = fs.interpret(sched, A, B, *order, target=target)
    out = oracles.out_type(out_dtype, dtype, chain)
    want = oracles.gemm(A, B, dtype=dtype, out_dtype=out_dtype, ops=chain, extras=by_name, prologue=prologue_ops)
    # a prologue's result is rounded to the input type before the products: allow for it
    oracles.assert_close(C, want, out="bf16" if prologue_ops else out, what=str(sched))


# =========================================================================== the sm_80 recipe, widely

@st.composite
def sm80_recipe_cases(draw):
    bm = draw(st.sampled_from([16, 32, 64]))
    bn = draw(st.sampled_from([16, 32, 64]))
    wm = draw(st.sampled_from([w for w in (1, 2, 4) if bm % (16 * w) == 0]))
    wn = draw(st.sampled_from([w for w in (1, 2, 4) if bn % (16 * w) == 0]))
    bk = draw(st.sampled_from([16, 32, 48, 64, 80, 96, 112, 128]))
    skw = draw(st.sampled_from([s for s in (1, 2, 4) if bk % (16 * s) == 0]))
    wk = draw(st.sampled_from([w for w in (16, 32, 48, 64) if (bk // skw) % w == 0]))
    skb = draw(st.sampled_from([1, 2, 3, 4, 8]))
    # K: enough for skb parts of 64 (the part granule), sometimes a ragged last part
    k_lo = max(bk // 2, 64 * (skb - 1) + 1) if skb > 1 else 1
    K = draw(st.integers(k_lo, max(k_lo, 64 * skb if skb > 1 else 3 * bk)))
    M = draw(st.integers(1, 2 * bm + 3))
    N = draw(st.integers(1, 2 * bn + 3))
    if draw(st.integers(0, 3)):          # mostly 16-byte aligned rows (cp.async 16), sometimes not
        M, N, K = (-(-x // 8) * 8 for x in (M, N, K))
    sw = draw(st.sampled_from([None, None, fs.Swizzle(0, 0, 0), fs.Swizzle(1, 3, 3), fs.Swizzle(2, 3, 3),
                               fs.Swizzle(3, 3, 3), fs.Swizzle(2, 3, 4)]))
    pro = None
    if draw(st.integers(0, 3)) == 0:
        pro = (draw(st.sampled_from(["A", "B"])), tuple(draw(st.lists(st.sampled_from(PROLOGUE_POOL), min_size=1,
                                                                        max_size=2))))
    return dict(M=M, N=N, K=K, dtype=draw(st.sampled_from(["f16", "bf16"])),
                out_dtype=draw(st.sampled_from([None, "f32"])), layout=draw(st.sampled_from(["RR", "RC", "CR", "CC"])),
                block_m=bm, block_n=bn, block_k=bk, warps_m=wm, warps_n=wn, stages=draw(st.integers(1, 4)),
                split_k_blocks=skb, split_k_warps=skw, warp_k=wk, group_m=draw(st.sampled_from([1, 2, 3])),
                prefetch=draw(st.sampled_from([None, True, False])), swizzle=sw,
                epilogue_ops=draw(epilogue_chains()), prologue=pro, seed=draw(st.integers(0, 2 ** 16)))


@_examples(dev=25, ci=100)
@given(sm80_recipe_cases())
def test_sm80_recipe_over_the_whole_space(case):
    case = dict(case)
    M, N, K, seed, pro = (case.pop(k) for k in ("M", "N", "K", "seed", "prologue"))
    if pro is not None:
        case["prologue_ops"] = pro[1] if pro[0] == "A" else ()
        if pro[0] == "B":
            pro = None          # the recipe's prologue_ops apply to A; B prologues are drawn below
    try:
        sched = fs.recipes.gemm(M, N, K, arch="sm_80", atoms="sm80", **case)
    except fs.ScheduleError as e:
        event(f"refused: {e.field}")
        assume(False)
    event(f"block_k={case['block_k']}, split_k_blocks={case['split_k_blocks']}")
    _run_and_compare(sched, M, N, K, dtype=case["dtype"], out_dtype=case["out_dtype"], chain=case["epilogue_ops"],
                     seed=seed, prologue_ops=pro)


def test_split_k_parts_whose_last_k_tile_overhangs():
    """K tiles that do not divide a split-K part (128 over parts of 192): each part's last tile
    must stop at the part's end, or the next part's products are counted twice."""
    for K, bk, skb in ((300, 128, 2), (380, 128, 2), (500, 96, 3), (256, 48, 2)):
        sched = fs.recipes.gemm(48, 40, K, atoms="sm80", block_m=32, block_n=32, block_k=bk, warps_m=2, warps_n=1,
                                stages=2, split_k_blocks=skb, arch="sm_80")
        _run_and_compare(sched, 48, 40, K, dtype="f16", out_dtype=None, chain=(), seed=K)


# =========================================================================== hand-built sm_80 chains

# the ldmatrix variant of each operand: None (derived from the MMA's fragments) most of the time,
# an explicit variant sometimes (test_explicit_ldmatrix_atoms_run_right)
LDSM_A = [None, None, None, sm80.ldmatrix_x4]
LDSM_B = {"R": [None, None, None, sm80.ldmatrix_x2_trans, sm80.ldmatrix_x4_trans],
          "C": [None, None, None, sm80.ldmatrix_x2, sm80.ldmatrix_x4]}
VIA = [None, sm80.cp_async_16, sm80.cp_async_8, sm80.cp_async_4]
SWIZZLES = [None, fs.Swizzle(0, 0, 0), fs.Swizzle(1, 3, 3), fs.Swizzle(2, 3, 3), fs.Swizzle(3, 3, 3),
            fs.Swizzle(2, 3, 4), fs.Swizzle(1, 4, 3)]


@st.composite
def hand_chains(draw):
    dtype = draw(st.sampled_from(["f16", "bf16"]))
    layout = draw(st.sampled_from(["RR", "RC", "CR", "CC"]))
    bm, bn = draw(st.sampled_from([32, 64])), draw(st.sampled_from([16, 32, 64]))
    wm = draw(st.sampled_from([w for w in (1, 2) if bm % (16 * w) == 0]))
    wn = draw(st.sampled_from([w for w in (1, 2) if bn % (16 * w) == 0]))
    bk = draw(st.sampled_from([16, 32, 64]))
    wk = draw(st.sampled_from([w for w in (16, 32) if bk % w == 0]))
    M, N, K = (draw(st.integers(1, 2 * x)) for x in (bm, bn, 2 * bk))
    M, N, K = (-(-x // 8) * 8 for x in (M, N, K))
    mma = sm80.mma_m16n8k16_f16_f32 if dtype == "f16" else sm80.mma_m16n8k16_bf16_f32
    via_a, via_b = draw(st.sampled_from(VIA)), draw(st.sampled_from(VIA))
    chain = [tile(m=bm, n=bn) >> to_blocks(group=draw(st.sampled_from([1, 2]))), tile(k=bk),
             move_to_smem("A", swizzle=draw(st.sampled_from(SWIZZLES)), via=(via_a,) if via_a else ()),
             move_to_smem("B", swizzle=draw(st.sampled_from(SWIZZLES)), via=(via_b,) if via_b else ()),
             pipeline(stages=draw(st.integers(1, 4)), prefetch=draw(st.booleans())),
             tile(m=bm // wm, n=bn // wn) >> to_warps(wm, wn)]
    if wk < bk:
        chain.append(tile(k=wk))
    chain += [move_to_regs("A", draw(st.sampled_from(LDSM_A))),
              move_to_regs("B", draw(st.sampled_from(LDSM_B[layout[1]]))),
              tile(m=16, n=8, k=16) >> done(mma)]
    epi = draw(epilogue_chains(max_len=4))
    if epi:
        chain.append(epilogue(*epi))
    pro = None
    if draw(st.integers(0, 3)) == 0:
        pro = (draw(st.sampled_from(["A", "B"])), (draw(st.sampled_from(PROLOGUE_POOL)),))
        chain.append(prologue(pro[0], *pro[1]))
    return dict(M=M, N=N, K=K, dtype=dtype, layout=layout, chain=chain, epi=epi, pro=pro,
                seed=draw(st.integers(0, 2 ** 16)))


@_examples(dev=20, ci=75)
@given(hand_chains())
def test_hand_built_chains(case):
    spec = fs.MatMul.kernel(case["M"], case["N"], case["K"], a=case["dtype"], b=case["dtype"], c=case["dtype"],
                            layout=case["layout"])
    try:
        sched = spec.schedule(*case["chain"])
        sched.check("sm_80")
    except fs.ScheduleError as e:
        event(f"refused: {e.field}")
        assume(False)
    event("accepted")
    _run_and_compare(sched, case["M"], case["N"], case["K"], dtype=case["dtype"], out_dtype=None, chain=case["epi"],
                     seed=case["seed"], prologue_ops=case["pro"], target="sm_80")


# =========================================================================== the Hopper recipe, widely

@st.composite
def hopper_cases(draw):
    bm = draw(st.sampled_from([64, 128, 192]))
    bn = draw(st.sampled_from([64, 128, 192, 256]))
    bk = draw(st.sampled_from([16, 32, 64]))
    ws = draw(st.booleans())
    return dict(M=draw(st.integers(1, 2 * bm)), N=draw(st.integers(1, 2 * bn)), K=draw(st.integers(1, 3 * bk)),
                dtype=draw(st.sampled_from(["f16", "bf16"])), out_dtype=draw(st.sampled_from([None, "f32"])),
                layout=draw(st.sampled_from(["RR", "RC"])), block_m=bm, block_n=bn, block_k=bk,
                stages=draw(st.integers(2, 4)), group_m=draw(st.sampled_from([1, 2])), warp_specialized=ws,
                persistent=ws and draw(st.booleans()), epilogue_ops=draw(epilogue_chains()),
                sms=draw(st.sampled_from([1, 2, 3])), seed=draw(st.integers(0, 2 ** 16)))


@_examples(dev=8, ci=30)
@given(hopper_cases())
def test_hopper_recipe_with_long_epilogues(case):
    case = dict(case)
    M, N, K, seed, sms = (case.pop(k) for k in ("M", "N", "K", "seed", "sms"))
    try:
        sched = fs.recipes.gemm(M, N, K, arch="sm_90a", atoms="sm90a", **case)
    except fs.ScheduleError as e:
        event(f"refused: {e.field}")
        assume(False)
    _run_and_compare(sched, M, N, K, dtype=case["dtype"], out_dtype=case["out_dtype"], chain=case["epilogue_ops"],
                     seed=seed, target=attrs.evolve(SM90A, sm_count=sms))


# =========================================================================== random compositions, executed

def _canonical(bm=32, bn=32, bk=32):
    mma = sm80.mma_m16n8k16_f16_f32
    return [tile(m=bm, n=bn) >> to_blocks(), tile(k=bk), move_to_smem("A"), move_to_smem("B"), pipeline(2),
            tile(m=16, n=bn) >> to_warps(bm // 16, 1), move_to_regs("A"), move_to_regs("B"),
            tile(m=16, n=8, k=16) >> done(mma)]


VARIANTS = [
    tile(k=16), tile(k=64), tile(m=16, n=16), tile(m=64, n=64) >> to_blocks(), tile(m=16, n=32) >> to_blocks(group=2),
    move_to_smem("A", swizzle=fs.Swizzle(0, 0, 0)), move_to_smem("B", via=(sm80.cp_async_8,)),
    move_to_smem("A", via=(sm80.cp_async_4,)), move_to_smem("B", swizzle=fs.Swizzle(2, 3, 3)), pipeline(1), pipeline(3),
    pipeline(4, prefetch=False), split_k(2, across=fs.WARP), split_k(2, across=fs.BLOCK),
    tile(m=16, n=16) >> to_warps(2, 2), tile(m=32, n=16) >> to_warps(1, 2), move_to_regs("A", sm80.ldmatrix_x4),
    move_to_regs("B", sm80.ldmatrix_x2_trans), move_to_regs("B", sm80.ldmatrix_x4_trans),
    tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32), epilogue(ops.bias("bias"), ops.relu()),
    epilogue(ops.gelu(), ops.scale(0.5)), prologue("A", ops.relu()), prologue("B", ops.tanh()),
]


@st.composite
def compositions(draw):
    chain = list(_canonical(draw(st.sampled_from([32, 64])), draw(st.sampled_from([32, 64])),
                            draw(st.sampled_from([32, 64]))))
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["replace", "insert", "drop", "swap", "repeat"]))
        i = draw(st.integers(0, len(chain) - 1))
        if what == "replace":
            chain[i] = draw(st.sampled_from(VARIANTS))
        elif what == "insert":
            chain.insert(i, draw(st.sampled_from(VARIANTS)))
        elif what == "drop" and len(chain) > 1:
            chain.pop(i)
        elif what == "swap" and i + 1 < len(chain):
            chain[i], chain[i + 1] = chain[i + 1], chain[i]
        elif what == "repeat":
            chain.insert(i, chain[i])
    if draw(st.booleans()):
        chain.append(draw(st.sampled_from(VARIANTS[-4:])))
    M, N, K = (draw(st.integers(8, 100)) for _ in range(3))
    return dict(M=-(-M // 8) * 8, N=-(-N // 8) * 8, K=-(-K // 8) * 8, chain=chain, seed=draw(st.integers(0, 999)))


def _parts(s):
    return s.parts if isinstance(s, Chain) else (s,)


@_examples(dev=40, ci=300)
@given(compositions())
def test_accepted_compositions_run_and_are_right(case):
    """Whatever composition the library accepts must run hazard-free and compute the GEMM."""
    spec = fs.MatMul.kernel(case["M"], case["N"], case["K"])
    try:
        sched = spec.schedule(*case["chain"])
        sched.check("sm_80")
    except fs.ScheduleError:
        event("refused")
        return
    event("accepted and run")
    _run_chain(sched, case["chain"], case["M"], case["N"], case["K"], case["seed"])


def _run_chain(sched, chain, M, N, K, seed):
    """Run an accepted chain against the oracle: its epilogue ops, and its prologues composed in
    the order they were applied (a second prologue on an operand applies after the first)."""
    epi = ()
    pro = []
    for s in chain:
        for p in _parts(s):
            if isinstance(p, epilogue):
                epi = p.ops
            if isinstance(p, prologue):
                pro.append((p.operand, p.ops))
    _run_and_compare(sched, M, N, K, dtype="f16", out_dtype=None, chain=epi, seed=seed, prologue_ops=pro or None,
                     target="sm_80")


def _accepted_and_right(chain, M=64, N=64, K=192, seed=1):
    """True when ``check()`` refuses ``chain`` or its kernel runs hazard-free and right."""
    try:
        sched = fs.MatMul.kernel(M, N, K).schedule(*chain)
        sched.check("sm_80")
    except fs.ScheduleError:
        return True
    _run_chain(sched, chain, M, N, K, seed)
    return True


def _mma():
    return tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32)


# Compositions check() once accepted and lowered wrongly, one reproduction each: each is now
# refused with a ScheduleError that names the fix, or runs right.
def test_move_after_pipeline_is_refused():
    """The ring stages what pipeline() saw: a move added after it would be filled unstaged."""
    with pytest.raises(fs.ScheduleError, match=r"move_to_smem\('B'\) came after pipeline"):
        fs.MatMul.kernel(64, 64, 192).schedule(
            tile(m=64, n=64) >> to_blocks(), tile(k=64), move_to_smem("A"), pipeline(2), move_to_smem("B"),
            tile(m=16, n=64) >> to_warps(4, 1), move_to_regs("A"), move_to_regs("B"), _mma()).check("sm_80")


def test_two_k_tilings_run_right():
    """The outer K loop comes round to a ring the inner loop refills: a barrier now precedes each
    refill, so the last readers of the previous round are done."""
    assert _accepted_and_right([tile(m=32, n=64) >> to_blocks(), tile(k=64), tile(k=64), move_to_smem("A"),
                                move_to_smem("B"), pipeline(2), tile(m=16, n=64) >> to_warps(2, 1),
                                move_to_regs("A"), move_to_regs("B"), _mma()])


def test_k_tiling_between_the_moves_is_refused():
    """A second ring inside the first one's loop would wait on the wrong cp.async groups."""
    with pytest.raises(fs.ScheduleError, match="one pipeline ring per loop nest"):
        fs.MatMul.kernel(16, 64, 192).schedule(
            tile(m=64, n=64) >> to_blocks(), tile(k=32), move_to_smem("A"), tile(k=16), move_to_smem("B"),
            pipeline(2), tile(m=16, n=64) >> to_warps(4, 1), move_to_regs("A"), move_to_regs("B"),
            _mma()).check("sm_80")


def test_split_k_warps_before_the_moves_is_refused():
    """Copies into shared memory are issued by the whole block, not by a group of warps."""
    with pytest.raises(fs.ScheduleError, match="issued by the whole block"):
        fs.MatMul.kernel(96, 96, 96).schedule(
            tile(m=64, n=32) >> to_blocks(), tile(k=64), split_k(2, across=fs.WARP), move_to_smem("A"),
            move_to_smem("B"), pipeline(2), tile(m=16, n=32) >> to_warps(4, 1), move_to_regs("B"),
            move_to_regs("A"), _mma()).check("sm_80")


def test_explicit_ldmatrix_atoms_run_right():
    for la, lb in ((sm80.ldmatrix_x4, None), (None, sm80.ldmatrix_x2_trans)):
        _accepted_and_right_strict([tile(m=64, n=64) >> to_blocks(), tile(k=32), move_to_smem("A"), move_to_smem("B"),
                                    pipeline(2), tile(m=32, n=32) >> to_warps(2, 2), move_to_regs("A", la),
                                    move_to_regs("B", lb), _mma()])


def _accepted_and_right_strict(chain, M=128, N=128, K=64, seed=2):
    """``chain`` must be accepted and right (a refusal raises)."""
    sched = fs.MatMul.kernel(M, N, K).schedule(*chain)
    sched.check("sm_80")
    _run_chain(sched, chain, M, N, K, seed)


def test_compositions_reach_both_outcomes():
    """The generator is not degenerate: the canonical chain is accepted and runs right."""
    sched = fs.MatMul.kernel(64, 64, 64).schedule(*_canonical())
    sched.check("sm_80")
    _run_and_compare(sched, 64, 64, 64, dtype="f16", out_dtype=None, chain=(), seed=0, target="sm_80")
    assert sm90a.tma_load_2d.family == "tma"


