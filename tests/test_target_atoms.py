"""Targets refuse the atoms they do not have, at ``check()``, before any statement is built.

A schedule uses the atoms its strategies name (``done(atom)``, ``via=``, ``move_to_regs(atom=)``)
and the atoms the lowering picks for it (the cp.async width of a ``move_to_smem``, the ldmatrix
variant a ``move_to_regs`` derives from the consumer's fragments, the commit / wait of a cp.async
ring).  ``checks.atom_uses`` lists them; these tests hold it to what the lowering really emits, and
``check(target)`` to refusing every one the target lacks, naming the atom, the target, the atom's
minimum target and a fix.
"""

from __future__ import annotations

import time

import pytest

import firesched as fs
from firesched import ir
from firesched.errors import ScheduleError
from firesched.hardware import SM70, SM80, SM90A, catalog, sm80, sm90a
from firesched.hardware.atoms import convert as cv
from firesched.hardware.atoms.base import CP_ASYNC, LDMATRIX, MMA, TMA, WGMMA
from firesched.hardware.target import ORDER
from firesched.ir.rewrite import walk
from firesched.lower import checks, driver
from firesched.recipes.rows import RowPlan
from firesched.strategies import (
    done,
    move_to_regs,
    move_to_smem,
    pipeline,
    tile,
    to_blocks,
    to_threads,
    to_warps,
)


def _mma_chain(atom, layout="RR", wm=64, wn=64, a_atom=None, b_atom=None, **dtypes):
    spec = fs.MatMul.kernel(M=256, N=256, K=256, layout=layout, **dtypes)
    return spec.schedule(tile(m=2 * wm, n=2 * wn) >> to_blocks(), tile(k=32), move_to_smem("A"), move_to_smem("B"),
                         pipeline(stages=2), tile(m=wm, n=wn) >> to_warps(2, 2), tile(k=atom.shape[2]),
                         move_to_regs("A", atom=a_atom), move_to_regs("B", atom=b_atom),
                         tile(m=16, n=8, k=atom.shape[2]) >> done(atom))


def _staged_move(cols, src):
    spec = fs.Move.kernel({"r": 32, "c": cols}, src=src, dst_major="r")
    return spec.schedule(tile(r=32, c=cols) >> to_blocks(), move_to_smem("X"), tile(r=8, c=1) >> to_threads(), done())


#: Schedules that between them use every atom of the sm80 table, and the Hopper families; each with
#: the oldest target it lowers on.
SCHEDULES = {
    "gemm-f16": (lambda: fs.recipes.gemm(256, 256, 256, dtype="f16", arch="sm_80"), "sm_80"),
    "gemm-bf16": (lambda: fs.recipes.gemm(256, 256, 256, dtype="bf16", arch="sm_80"), "sm_80"),
    "gemm-f16-acc": (lambda: _mma_chain(sm80.mma_m16n8k16_f16_f16, acc="f16"), "sm_80"),
    "gemm-RR-16x8": (lambda: _mma_chain(sm80.mma_m16n8k16_f16_f32, wm=16, wn=8), "sm_80"),      # x2.trans
    "gemm-CC": (lambda: _mma_chain(sm80.mma_m16n8k16_f16_f32, layout="CC", wm=16, wn=16), "sm_80"),  # x4[.trans]_cols
    "gemm-CC-16x8": (lambda: _mma_chain(sm80.mma_m16n8k16_f16_f32, layout="CC", wm=16, wn=8), "sm_80"),  # x2_cols
    "move-cp-async-8": (lambda: _staged_move(36, "f16"), "sm_80"),
    "move-cp-async-4": (lambda: _staged_move(34, "f16"), "sm_80"),
    "gemm-sm90a": (lambda: fs.recipes.gemm(256, 256, 256, dtype="f16", arch="sm_90a"), "sm_90a"),
    "gemm-sm90a-bf16-plain": (lambda: fs.recipes.gemm(256, 256, 256, dtype="bf16", arch="sm_90a", block_n=128,
                                                      warp_specialized=False, persistent=False), "sm_90a"),
    "gemm-sm90a-cluster": (lambda: fs.recipes.gemm(256, 512, 256, dtype="f16", arch="sm_90a", cluster=2), "sm_90a"),
    "bmm-sm90a": (lambda: fs.recipes.bmm(4, 128, 128, 128, dtype="f16", arch="sm_90a"), "sm_90a"),
}

#: Schedules whose atom the strategies accept but no target lowers (tf32 fragments cannot come
#: through ldmatrix; ldmatrix_x2 and x1 are never the variants the fragments derive, a wider one
#: always fits first): refused on sm_70 all the same, by the atom they name.
NAMED_ONLY = {
    "gemm-tf32": lambda: _mma_chain(sm80.mma_m16n8k8_tf32_f32, a="tf32", b="tf32", c="f32"),
    "ldmatrix-x2": lambda: _mma_chain(sm80.mma_m16n8k16_f16_f32, a_atom=sm80.ldmatrix_x2),
    "ldmatrix-x1": lambda: _mma_chain(sm80.mma_m16n8k16_f16_f32, a_atom=sm80.ldmatrix_x1,
                                      b_atom=sm80.ldmatrix_x1_trans),
}


#: Schedules whose lowering picks an atom of its own where the target has it, and lowers otherwise
#: without it: a persistent row window's raw copy (``cp_async_16_ca``, ``rules.threads``), which
#: ``check()`` need not predict (no target lacks it and takes the schedule anyway).
RULE_PICKED = {
    "layernorm-persistent-window": (lambda: fs.recipes.layernorm(
        16, 1001, dtype="bf16", arch="sm_80",
        plan=RowPlan(64, 8, 2, 1, blocks_per_sm=4, row_memory="SH", aligned=True, persistent=True)), "sm_80"),
}


def _ir_atoms(prog) -> set:
    """The names of the atoms the kernels of ``prog`` issue (cp.async group commits and waits
    included: the printer writes them as the catalog's cp_async_commit / cp_async_wait)."""
    out = set()
    for k in prog.kernels:
        for st in walk([k.body]):
            if isinstance(st, ir.AtomCall):
                out.add(st.atom.name)
            elif isinstance(st, ir.AsyncCommit):
                out.add(sm80.cp_async_commit.name)
            elif isinstance(st, ir.AsyncWait):
                out.add(sm80.cp_async_wait.name)
    return out


@pytest.fixture(scope="module")
def built():
    """name -> (schedule, its target, the atoms its lowering on that target issues)."""
    out = {}
    for name, (make, tgt) in SCHEDULES.items():
        s = make()
        out[name] = (s, tgt, _ir_atoms(s.lower(tgt)))
    return out


# --------------------------------------------------------------------------- the catalog


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in catalog.EVERY_ATOM])
def test_each_target_has_exactly_the_atoms_up_to_its_generation(atom):
    rank = ORDER.index(atom.min_target)
    assert [t.supports(atom) for t in (SM70, SM80, SM90A)] == [rank <= 0, rank <= 1, True]


def test_the_schedules_cover_the_sm80_table(built):
    used = set().union(*(atoms for _, _, atoms in built.values()))
    used |= {u.atom.name for make in NAMED_ONLY.values() for u in checks.atom_uses(make())}
    picked = {name: _ir_atoms(make().lower(tgt)) for name, (make, tgt) in RULE_PICKED.items()}
    assert "cp_async_16_ca" in picked["layernorm-persistent-window"]
    used |= set().union(*picked.values())
    assert {a.name for a in sm80.ATOMS} <= used
    # and every Hopper family the strategies reach
    hopper = {catalog.by_name(n).family for n in used if catalog.by_name(n).min_target == "sm_90a"}
    assert {WGMMA, TMA, "mbarrier", "fence", "setmaxnreg", "cluster", "wgmma_sync"} <= hopper


# --------------------------------------------------------------------------- what check() predicts


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_atoms_check_predicts_are_those_the_lowering_issues(built, name):
    """``atom_uses`` runs the rules' own choices (copy width, ldmatrix variant) on the tree alone:
    for the families it lists, it names exactly what the lowering emits."""
    sched, _, issued = built[name]
    predicted = {u.atom.name for u in checks.atom_uses(sched) if u.exact}
    listed = {MMA, WGMMA, LDMATRIX, CP_ASYNC}
    pick = {n for n in issued if catalog.by_name(n).family in listed}
    assert {n for n in predicted if catalog.by_name(n).family in listed} == pick
    if CP_ASYNC in {catalog.by_name(n).family for n in issued}:
        assert {"cp_async_commit", "cp_async_wait"} <= predicted
    # a via= TMA atom names the family: the TMA rule issues the load of the tensor's rank (3-D for a
    # batch) and, in a cluster, its multicast form
    loads = {n for n in issued if n.startswith("tma_load")}
    assert bool({n for n in predicted if catalog.by_name(n).family == TMA}) == bool(loads)


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("tgt", ORDER)
def test_a_target_lowers_a_schedule_only_with_atoms_it_has(built, name, tgt):
    """Lowered for any target, a schedule either issues only that target's atoms or is refused by
    check(), with every atom it would issue that the target lacks named (the Hopper companions —
    mbarriers, fences, setmaxnreg — through the wgmma and TMA atoms that bring them)."""
    sched, _, issued = built[name]
    t = fs.hardware.target(tgt)
    # (a pass that picks an atom by the target, the paired conversions, is not the schedule's choice)
    lacking = sorted(n for n in issued if not t.supports(catalog.by_name(n)) and catalog.by_name(n) not in cv.PAIR_ATOMS)
    if not lacking:
        prog = sched.lower(tgt)
        assert all(t.supports(catalog.by_name(n)) for n in _ir_atoms(prog))
        return
    with pytest.raises(ScheduleError) as e:
        sched.check(tgt)
    msg = str(e.value)
    named = [n for n in lacking if n in msg]
    for n in lacking:
        a = catalog.by_name(n)
        assert n in msg or (a.min_target == "sm_90a" and any(catalog.by_name(m).family in (WGMMA, TMA)
                                                            for m in named)), (n, msg)
    need = max((catalog.by_name(n).min_target for n in lacking), key=ORDER.index)
    assert f"the target {tgt} has no" in msg and f"needs {need}" in msg
    assert e.value.fix.startswith(f"compile for {need}")


# --------------------------------------------------------------------------- the GEMM recipe on sm_70


def test_the_sm80_gemm_recipe_is_refused_on_sm70_naming_every_atom():
    sched = fs.recipes.gemm(256, 256, 256, dtype="f16", arch="sm_80")
    with pytest.raises(ScheduleError) as e:
        sched.check("sm_70")
    msg = str(e.value)
    assert "mma needs sm_80: the target sm_70 has no mma_m16n8k16_f16_f32" in msg
    for what in ("mma_m16n8k16_f16_f32 (mma, needs sm_80): done(sm80.mma_m16n8k16_f16_f32)",
                 "cp_async_16 (cp_async, needs sm_80): the copy the lowering picks for move_to_smem('A')",
                 "cp_async_16 (cp_async, needs sm_80): the copy the lowering picks for move_to_smem('B')",
                 "ldmatrix_x4 (ldmatrix, needs sm_80): the ldmatrix variant the lowering derives from the "
                 "consumer's fragments for move_to_regs('A')",
                 "ldmatrix_x4_trans (ldmatrix, needs sm_80)",
                 "cp_async_commit (sync, needs sm_80): the cp.async ring of pipeline(stages=",
                 "cp_async_wait (sync, needs sm_80)"):
        assert what in msg, (what, msg)
    assert e.value.fix == "compile for sm_80 or later, or use the sm70 atoms (firesched.hardware.atoms.sm70)"
    assert e.value.field == "done" and e.value.value is sm80.mma_m16n8k16_f16_f32
    assert sched.check("sm_80") is sched and sched.check("sm_90a") is sched


@pytest.mark.parametrize("name", NAMED_ONLY)
def test_an_atom_a_strategy_names_is_refused_on_sm70(name):
    sched = NAMED_ONLY[name]()
    with pytest.raises(ScheduleError) as e:
        sched.check("sm_70")
    for u in checks.atom_uses(sched):
        assert u.label in str(e.value)


def test_an_ldmatrix_that_cannot_be_derived_is_named_by_its_family():
    """tf32 fragments cannot come through ldmatrix: sm_70 still refuses the move, as an ldmatrix."""
    with pytest.raises(ScheduleError, match=r"ldmatrix \(any variant\) \(ldmatrix, needs sm_80\): the ldmatrix "
                                            r"variant the lowering derives"):
        NAMED_ONLY["gemm-tf32"]().check("sm_70")


@pytest.mark.parametrize("name", ["gemm-sm90a", "gemm-sm90a-cluster", "bmm-sm90a"])
def test_hopper_atoms_are_refused_on_sm80_and_sm70(built, name):
    sched, _, issued = built[name]
    wgmma = next(n for n in issued if catalog.by_name(n).family == WGMMA)
    for tgt in ("sm_80", "sm_70"):
        with pytest.raises(ScheduleError) as e:
            sched.check(tgt)
        msg = str(e.value)
        assert f"wgmma needs sm_90a: the target {tgt} has no {wgmma}" in msg
        assert "tma_load_2d (tma, needs sm_90a): move_to_smem('A', via=(sm90a.tma_load_2d,))," in msg
        assert e.value.fix == f"compile for sm_90a, or use the {tgt.replace('_', '')} atoms " \
                              f"(firesched.hardware.atoms.{tgt.replace('_', '')})"
    assert sched.check("sm_90a") is sched


def test_tma_named_by_via_is_refused_on_sm80():
    spec = fs.Move.kernel({"r": 64, "c": 64}, src="f16", dst_major="r")
    sched = spec.schedule(tile(r=64, c=64) >> to_blocks(), move_to_smem("X", via=(sm90a.tma_load_2d,)),
                          tile(r=8, c=1) >> to_threads(), done())
    with pytest.raises(ScheduleError, match=r"tma needs sm_90a: the target sm_80 has no tma_load_2d") as e:
        sched.check("sm_80")
    assert e.value.field == "via"


# --------------------------------------------------------------------------- before any lowering


def test_the_refusal_comes_before_any_statement_is_built(monkeypatch):
    """The copy atom of a move_to_smem is refused by the O(tree) precheck, not by the rule that
    would emit the copies: the program builder is never reached."""
    sched = _staged_move(64, "f16")

    class Unreachable:
        def __init__(self, *a, **k):
            raise AssertionError("lowering started")

    monkeypatch.setattr(driver, "ProgramBuilder", Unreachable)
    with pytest.raises(ScheduleError, match=r"cp_async needs sm_80: the target sm_70 has no cp_async_16") as e:
        sched.check("sm_70")
    assert "the copy the lowering picks for move_to_smem('X')" in str(e.value)
    assert "cp_async_commit (sync, needs sm_80): the wait for the copies of move_to_smem('X')" in str(e.value)
    assert e.value.field == "copy atom"


def test_a_huge_gemm_is_refused_on_sm70_in_milliseconds():
    sched = fs.recipes.gemm(16384, 16384, 16384, dtype="f16", block_m=256, block_n=128, warps_m=4, warps_n=2,
                            check=False, arch="sm_80")
    t0 = time.perf_counter()
    with pytest.raises(ScheduleError, match="the target sm_70 has no"):
        sched.check("sm_70")
    assert time.perf_counter() - t0 < 0.5


# --------------------------------------------------------------------------- what sm_70 keeps


def test_sm70_still_stages_rows_that_take_no_cp_async():
    """Rows that are not 4-byte aligned are staged by element copies through registers, which
    sm_70 has: such a move is accepted and lowers to sm_70 atoms only."""
    sched = _staged_move(129, "f16")
    assert sched.check("sm_70") is sched
    assert not [u for u in checks.atom_uses(sched) if not SM70.supports(u.atom)]
    assert all(SM70.supports(catalog.by_name(n)) for n in _ir_atoms(sched.lower("sm_70")))


def test_elementwise_kernels_still_check_on_sm70():
    spec = fs.Pointwise.kernel("add", {"r": 64, "c": 64})
    sched = spec.schedule(tile(r=8, c=64) >> to_blocks(), tile(r=1, c=8) >> to_threads(), done())
    assert sched.check("sm_70") is sched
    assert all(SM70.supports(catalog.by_name(n)) for n in _ir_atoms(sched.lower("sm_70")))
