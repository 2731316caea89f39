"""Programmatic dependent launches (``lower.transforms.launches``): on sm_90a a program's later
kernels launch programmatically, each kernel but the last lets the next start
(``griddep_launch_dependents``) and each but the first waits for the one before
(``griddep_wait``); chained (the default there, ``programmatic=None``) the first kernel too waits,
for whatever launch came before the program, and the last lets the next launch start.  The
interpreter reports a programmatic kernel touching an earlier kernel's buffers — or, the first,
any buffer — before its wait."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import firesched as fs
from firesched import ir
from firesched import simulate as interp
from firesched.errors import HazardError, ScheduleError
from firesched.hardware.target import SM80, SM90A
from firesched.lower.transforms.launches import programmatic_launches
from firesched.testing import assert_schedule_correct


def _head(kernel, n=2):
    return [s.atom.name for s in kernel.body.body[:n] if isinstance(s, ir.AtomCall)]


def _split(arch="sm_90a", **kw):
    return fs.recipes.gemm(100, 136, 1000, "f16", arch, split_k_blocks=3, **kw)


def test_split_k_reduction_launches_programmatically():
    prog = _split(block_m=64, block_n=64).lower(SM90A, programmatic=False)
    first, second = prog.kernels
    assert (first.programmatic, second.programmatic) == (False, True)
    assert _head(first) == ["griddep_launch_dependents"]
    assert _head(second) == ["griddep_wait"]
    src = fs.compile(_split(block_m=64, block_n=64), arch="sm_90a", programmatic=False).source
    assert "griddepcontrol.launch_dependents;" in src and "griddepcontrol.wait;" in src


def test_chained_by_default_on_sm90a():
    """The first kernel waits for the launch before the program; a program of one kernel lets the
    next launch start, a program of several only when asked (programmatic=True)."""
    prog = _split(block_m=64, block_n=64, atoms="sm80").lower(SM90A)
    first, second = prog.kernels
    assert (first.programmatic, second.programmatic) == (True, True)
    assert _head(first) == ["griddep_launch_dependents", "griddep_wait"]    # the reduction may start
    assert _head(second) == ["griddep_wait"]                                # the next call: at its end
    asked = _split(block_m=64, block_n=64, atoms="sm80").lower(SM90A, programmatic=True)
    assert _head(asked.kernels[0]) == ["griddep_launch_dependents", "griddep_wait"]
    assert _head(asked.kernels[1]) == ["griddep_wait", "griddep_launch_dependents"]   # the next call once it runs
    one = fs.recipes.gemm(256, 256, 256, "f16", "sm_90a", atoms="sm80").lower(SM90A)
    assert len(one.kernels) == 1 and one.kernels[0].programmatic
    assert _head(one.kernels[0]) == ["griddep_wait", "griddep_launch_dependents"]
    rows = fs.recipes.layernorm(4, 4096, dtype="bf16", arch="sm_90a")
    k = fs.compile(rows, arch="sm_90a")
    assert k.program.kernels[0].programmatic and "griddepcontrol.wait;" in k.source
    plain = fs.compile(rows, arch="sm_90a", programmatic=False)
    assert not plain.program.kernels[0].programmatic and "griddepcontrol" not in plain.source


def test_a_grid_sized_to_the_sms_is_not_chained_by_default():
    """A persistent or stream-K grid holds the GPU for its whole life: launched the ordinary way
    unless asked (its later kernels stay programmatic)."""
    for sched in (fs.recipes.gemm(2048, 2048, 2048, "f16", "sm_90a", warp_specialized=True, persistent=True),
                  fs.recipes.gemm(512, 512, 4096, "f16", "sm_90a", stream_k_parts=2)):
        assert any(lp.persistent or lp.stream for n in sched.nodes() for lp in n.loops)
        assert not sched.lower(SM90A).kernels[0].programmatic
        assert sched.lower(SM90A, programmatic=True).kernels[0].programmatic


def test_programmatic_needs_griddepcontrol():
    with pytest.raises(ScheduleError, match="a programmatic launch needs griddepcontrol, which sm_80 lacks"):
        _split(atoms="sm80").lower(SM80, programmatic=True)
    with pytest.raises(ScheduleError, match="programmatic is None, True or False"):
        _split().lower(SM90A, programmatic="yes")
    with pytest.raises(ScheduleError, match="programmatic is None, True or False"):
        fs.compile(_split(), arch="sm_90a", programmatic=["yes"])       # unhashable: before the memo
    # None on a target without it: the ordinary launches
    assert not any(k.programmatic for k in _split(atoms="sm80").lower(SM80).kernels)


def test_three_kernels_chain():
    """A padded A (K not a multiple of 8), a split product, its reduction: the middle kernel
    both waits and triggers."""
    sched = fs.recipes.gemm(100, 136, 1001, "f16", "sm_90a", split_k_blocks=2, block_m=64, block_n=64)
    prog = sched.lower(SM90A, programmatic=False)
    assert [k.programmatic for k in prog.kernels] == [False, True, True]
    assert _head(prog.kernels[1]) == ["griddep_wait", "griddep_launch_dependents"]
    assert [k.programmatic for k in sched.lower(SM90A, programmatic=True).kernels] == [True, True, True]
    assert_schedule_correct(sched, examples=1, arch="sm_90a")


def test_untouched_where_it_cannot_or_need_not():
    prog = _split(atoms="sm80").lower(SM80)              # sm_80 has no griddepcontrol
    assert not any(k.programmatic for k in prog.kernels)
    assert "griddep" not in str(prog.kernels[1].body)
    one = fs.recipes.gemm(256, 256, 256, "f16", "sm_90a").lower(SM90A, programmatic=False)
    assert len(one.kernels) == 1 and not one.kernels[0].programmatic
    assert programmatic_launches(one, SM90A) is one


def test_the_wait_is_checked():
    prog = _split(block_m=64, block_n=64).lower(SM90A, programmatic=False)
    rng = np.random.default_rng(0)
    feed = {"A": rng.standard_normal((100, 1000)), "B": rng.standard_normal((1000, 136))}
    interp.run_program(prog, dict(feed))                     # as lowered: clean
    k = prog.kernels[1]
    body = ir.Seq(tuple(s for s in k.body.body if not (isinstance(s, ir.AtomCall) and s.atom.name == "griddep_wait")))
    planted = attrs.evolve(prog, kernels=(prog.kernels[0], attrs.evolve(k, body=body)))
    with pytest.raises(HazardError, match="launched programmatically"):
        interp.run_program(planted, dict(feed))
    # the same kernel launched the ordinary way needs no wait
    ordinary = attrs.evolve(planted, kernels=(prog.kernels[0], attrs.evolve(planted.kernels[1], programmatic=False)))
    interp.run_program(ordinary, dict(feed))


def _drop_wait(k):
    body = ir.Seq(tuple(s for s in k.body.body if not (isinstance(s, ir.AtomCall) and s.atom.name == "griddep_wait")))
    return attrs.evolve(k, body=body)


@pytest.mark.parametrize("recipe", ["gemm", "layernorm"])
def test_the_first_kernels_wait_is_checked(recipe):
    """Chained, the first kernel may touch no buffer before its wait — not even an input, which the
    launch before it may still be writing (LayerNorm's weight loads come first in its kernel)."""
    if recipe == "gemm":
        prog = fs.recipes.gemm(256, 256, 256, "f16", "sm_90a").lower(SM90A, programmatic=True)
        feed = {"A": np.ones((256, 256)), "B": np.ones((256, 256))}
    else:
        prog = fs.recipes.layernorm(3, 4096, dtype="bf16", arch="sm_90a").lower(SM90A)
        feed = {b.name: np.ones(b.shape) for b in prog.inputs}
    interp.run_program(prog, dict(feed))
    planted = attrs.evolve(prog, kernels=(_drop_wait(prog.kernels[0]),))
    with pytest.raises(HazardError, match="launched programmatically"):
        interp.run_program(planted, dict(feed))


def test_a_wait_after_a_tma_load_is_too_late():
    """The product after a padding copy reads the padded A by TMA: the check covers tensor maps."""
    prog = fs.recipes.gemm(100, 136, 1001, "f16", "sm_90a", block_m=64, block_n=64).lower(SM90A, programmatic=False)
    assert [k.name for k in prog.kernels] == ["firesched_pad_A", "firesched_matmul"]
    k = prog.kernels[1]
    wait, rest = k.body.body[0], k.body.body[1:]
    assert wait.atom.name == "griddep_wait"
    planted = attrs.evolve(prog, kernels=(prog.kernels[0], attrs.evolve(k, body=ir.Seq((*rest, wait)))))
    rng = np.random.default_rng(1)
    feed = {"A": rng.standard_normal((100, 1001)), "B": rng.standard_normal((1001, 136))}
    interp.run_program(prog, dict(feed))
    with pytest.raises(HazardError, match="griddep_wait"):
        interp.run_program(planted, dict(feed))
