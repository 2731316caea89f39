"""The rule-based lowering: soundness of check(), O(tree) refusals, the rule registry, and the
block orders and layouts that every schedule shares (not only the recipes')."""

from __future__ import annotations

import time

import attrs
import numpy as np
import pytest

import firesched as fs
from firesched import ir
from firesched.errors import ScheduleError
from firesched.hardware import SM80, sm80
from firesched.ir.expr import Var, evaluate
from firesched.lower import lowerer
from firesched.strategies import (
    done,
    move_to_regs,
    move_to_smem,
    pipeline,
    tile,
    to_blocks,
    to_threads,
    to_warpgroups,
    to_warps,
)

MMA = sm80.mma_m16n8k16_f16_f32


def _chain(spec, *, bk=32, wm=64, wn=64, stages=2, block=(128, 128), persistent=False):
    return spec.schedule(tile(m=block[0], n=block[1]) >> to_blocks(persistent=persistent), tile(k=bk),
                         move_to_smem("A"), move_to_smem("B"), pipeline(stages=stages),
                         tile(m=wm, n=wn) >> to_warps(), tile(k=16), move_to_regs("A"), move_to_regs("B"),
                         tile(m=16, n=8, k=16) >> done(MMA))


def _ref(A, B):
    return A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)


# --------------------------------------------------------------------------- check() is sound

def test_k_tile_that_the_atom_does_not_divide_is_refused_at_check():
    """tile(k=24) over an m16n8k16 atom once passed check() and read past the shared tile."""
    sched = _chain(fs.MatMul.kernel(256, 256, 256), bk=24)
    with pytest.raises(ScheduleError) as e:
        sched.check("sm_80")
    msg = str(e.value)
    for words in ("tile(k=16)", "do not divide", "k extent 24", "made by tile(k=24)", "a multiple of 16"):
        assert words in msg, msg


def test_warp_tiles_that_do_not_divide_the_block_are_refused_at_check():
    """Warp tiles of 48 rows in a 128-row block once passed check() and raced past the tile."""
    sched = _chain(fs.MatMul.kernel(256, 256, 256), wm=48)
    with pytest.raises(ScheduleError) as e:
        sched.check("sm_80")
    msg = str(e.value)
    for words in ("tile(m=48, n=64) >> to_warps()", "m warps of 48 do not divide", "m extent 128",
                  "made by tile(m=128, n=128) >> to_blocks()"):
        assert words in msg, msg


def test_partial_tiles_of_global_data_are_still_predicated():
    """The refusal is for on-chip data only: ragged problem edges stay legal and correct."""
    M, N, K = 200, 136, 100
    sched = _chain(fs.MatMul.kernel(M, N, K), bk=32)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    C = fs.interpret(sched, A, B).astype(np.float64)
    ref = _ref(A, B)
    assert np.abs(C - ref).max() <= 2e-2 * np.abs(ref).max()


def test_absurd_tiles_fail_in_milliseconds():
    t0 = time.perf_counter()
    with pytest.raises(ScheduleError, match="shared memory over the target's limit"):
        fs.recipes.gemm(4096, 4096, 4096, block_m=10 ** 6, arch="sm_80")
    assert time.perf_counter() - t0 < 0.5


def test_an_atom_the_target_lacks_is_refused():
    sched = _chain(fs.MatMul.kernel(128, 128, 64))
    with pytest.raises(ScheduleError, match="mma needs sm_80: the target sm_70 has no mma_m16n8k16"):
        sched.check("sm_70")


def test_check_returns_the_schedule_and_lowers_it():
    sched = _chain(fs.MatMul.kernel(128, 128, 64))
    assert sched.check("sm_80") is sched
    prog = sched.lower("sm_80")
    assert [k.name for k in prog.kernels] == ["firesched_matmul"]
    assert [b.name for b in prog.inputs] == ["A", "B"] and prog.output.name == "C"


# --------------------------------------------------------------------------- the registry

def test_every_open_spec_kind_has_a_rule_or_a_clear_refusal():
    """Open nodes dispatch by spec kind and memories; an unknown pair names the known ones."""
    kinds = {(k.__name__, m, v) for k, m, v in lowerer._SPEC_RULES}
    assert ("Move", ("GL", "SH"), None) in kinds and ("Move", ("GL", "SH"), "tma") in kinds
    assert ("Move", ("SH", "RF"), None) in kinds and ("Move", ("RF", "GL"), None) in kinds
    assert ("Init", ("RF",), None) in kinds and ("Reduce", ("RF", "GL"), None) in kinds
    assert {"mma", "wgmma"} <= set(lowerer._ATOM_RULES)


# --------------------------------------------------------------------------- block order

@pytest.mark.parametrize("sms", [1, 3, 5])
def test_persistent_blocks_cover_every_tile_once_on_any_target(sms):
    """A persistent block walks tiles b, b + grid, ...: every C element is written, exactly right."""
    M, N, K = 300, 260, 64
    sched = _chain(fs.MatMul.kernel(M, N, K), block=(64, 64), wm=32, wn=32, persistent=True)
    tgt = attrs.evolve(SM80, sm_count=sms)
    assert sched.lower(tgt).kernels[0].grid == (min(sms, 5 * 5), 1, 1)
    rng = np.random.default_rng(sms)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    C = fs.interpret(sched, A, B, target=tgt).astype(np.float64)
    ref = _ref(A, B)
    assert np.abs(C - ref).max() <= 2e-2 * np.abs(ref).max()


@pytest.mark.parametrize("batch, grid", [((2, 2, 2), (2, 2, 4)), ((2, 3, 2), (2, 2, 12))])
def test_more_than_three_mapped_loops_share_grid_z(batch, grid):
    """Loops of one tile take no grid dimension; beyond three, the outer loops share grid z."""
    import numpy as np

    M = 64 if batch == (2, 2, 2) else 128
    spec = fs.MatMul.kernel(M, 64, 64, batch=batch)
    sched = spec.schedule(tile(b0=1, b1=1, b2=1, m=64, n=32) >> to_blocks(), tile(k=32), move_to_smem("A"),
                          move_to_smem("B"), tile(m=32, n=32) >> to_warps(), tile(k=16), move_to_regs("A"),
                          move_to_regs("B"), tile(m=16, n=8, k=16) >> done(MMA))
    assert sched.lower("sm_80").kernels[0].grid == grid
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((*batch, M, 64)), rng.standard_normal((*batch, 64, 64))
    r = lambda x: x.astype(np.float16).astype(np.float64)  # noqa: E731
    assert np.abs(fs.interpret(sched, a, b) - r(a) @ r(b)).max() < 0.1


# --------------------------------------------------------------------------- index algebra

def test_nested_digit_extraction_simplifies():
    """((x % c) // d) % e == (x // d) % e when d * e divides c (the lane digits of a fragment)."""
    x = Var("x", 4096)
    e = ((x % 128) // 4) % 8
    assert str(e) == "x / 4 % 8"
    xs = np.arange(4096)
    assert (evaluate(e, {"x": xs}) == ((xs % 128) // 4) % 8).all()
    # not when the modulus does not cover the digits kept
    e2 = ((x % 24) // 4) % 8
    assert (evaluate(e2, {"x": xs}) == ((xs % 24) // 4) % 8).all()


def test_statements_of_a_lowered_program_are_kernel_ir():
    prog = _chain(fs.MatMul.kernel(128, 128, 64)).lower("sm_80")
    kinds = set()

    def go(s):
        kinds.add(type(s).__name__)
        for c in (getattr(s, "body", None), getattr(s, "then", None)):
            if isinstance(c, tuple):
                for x in c:
                    go(x)
            elif c is not None:
                go(c)

    go(prog.kernels[0].body)
    assert kinds <= {n for n in ir.__all__}


@pytest.mark.parametrize("C", [33, 100])
def test_more_threads_than_a_warp_holds_are_refused_at_check(C):
    # 64 threads mapped inside a warp-level row: the warp index would cover 32 threads while the
    # thread loop spans 64, so two rows' partial sums would meet (it once returned a wrong sum)
    spec = fs.Reduce.kernel("sum", {"r": 3, "c": C}, "c")
    sched = spec.schedule(tile(r=2) >> to_blocks(), tile(r=1) >> to_warps(), tile(c=64),
                          tile(c=1) >> to_threads(), done())
    with pytest.raises(ScheduleError, match=r"64 threads are mapped inside one warp, which holds 32") as e:
        sched.check("sm_80")
    assert "to_threads()" in str(e.value.strategy) and e.value.allowed == "at most 32 threads per warp"
    # 32 threads per warp is the same reduction, accepted and right
    ok = spec.schedule(tile(r=2) >> to_blocks(), tile(r=1) >> to_warps(), tile(c=64),
                       tile(c=2) >> to_threads(), done())
    X = np.random.default_rng(C).standard_normal((3, C))
    assert np.allclose(fs.interpret(ok, X), X.astype(np.float16).astype(np.float64).sum(1), atol=1e-2)


def test_more_warps_than_a_warpgroup_holds_are_refused_at_check():
    spec = fs.MatMul.kernel(128, 256, 64)
    sched = spec.schedule(tile(m=128, n=256) >> to_blocks(), tile(k=32), move_to_smem("A"), move_to_smem("B"),
                          tile(m=64) >> to_warpgroups(), tile(n=32) >> to_warps(), tile(k=16),
                          move_to_regs("A"), move_to_regs("B"), tile(m=16, n=8, k=16) >> done(MMA))
    with pytest.raises(ScheduleError, match=r"8 warps are mapped inside one warpgroup, which holds 4"):
        sched.check("sm_80")


def test_mma_sync_k_steps_keep_their_loop_so_fragments_load_one_step_ahead():
    # only loops of wgmma issues are written out; the mma.sync K-step loop stays a loop, which the
    # pipeline splits to double-buffer the register fragments (step ks+1 loads while ks computes)
    prog = _chain(fs.MatMul.kernel(128, 128, 128), bk=32).lower("sm_80")
    regs = {r.name: r.size for r in prog.kernels[0].regs}
    # a 64x16 A fragment of a warp is 4 ldmatrix.x4 = 4 x 8 f16 per thread, doubled: 64
    assert regs["A_frag"] == 2 * (64 * 16 // 32), regs
    assert regs["B_frag"] == 2 * (16 * 64 // 32), regs
