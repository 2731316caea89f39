"""Hazards name the schedule node at fault.

A lowered schedule is hazard-free by construction, so each test plants a fault in its kernel IR
(drops a barrier, loosens a cp.async wait, pushes an address out of bounds) and checks that the
``HazardError`` starts with one short line naming the kind of hazard, the buffer and the strategy
whose lowering emitted the faulting access (and, for a race, the strategy of the other access),
followed by the schedule nodes, the thread's units and tiles in the schedule's loop names, and the
node whose loop orders the two.  Before statements carried an ``ir.Origin`` none of this was in
the message.
"""

from __future__ import annotations

import itertools

import attrs
import numpy as np
import pytest

import firesched as fs
from firesched import ir
from firesched.errors import HazardError
from firesched.hardware import sm80
from firesched.hardware.atoms import sm70
from firesched.ir import rewrite as ir_rewrite
from firesched.ir.expr import Var
from firesched.simulate import run_program
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


def gemm(stages: int):
    spec = fs.MatMul.kernel(64, 64, 128)
    return spec.schedule(tile(m=32, n=32) >> to_blocks(), tile(k=32), move_to_smem("A"), move_to_smem("B"),
                         pipeline(stages), tile(m=16, n=32) >> to_warps(), tile(k=16), move_to_regs("A"),
                         move_to_regs("B"), tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32))


def inputs():
    rng = np.random.default_rng(0)
    return {"A": rng.standard_normal((64, 128)), "B": rng.standard_normal((128, 64))}


def rewrite(stmt, fn):
    """Rebuild ``stmt`` bottom-up; ``fn(s)`` returns a replacement, or None to drop it."""
    if isinstance(stmt, ir.Seq):
        return fn(attrs.evolve(stmt, body=tuple(c for c in (rewrite(c, fn) for c in stmt.body) if c is not None)))
    if isinstance(stmt, ir.For):
        return fn(attrs.evolve(stmt, body=rewrite(stmt.body, fn)))
    if isinstance(stmt, ir.If):
        return fn(attrs.evolve(stmt, then=rewrite(stmt.then, fn)))
    return fn(stmt)


def planted(prog, fn):
    k = prog.kernels[0]
    return attrs.evolve(prog, kernels=(attrs.evolve(k, body=rewrite(k.body, fn)), *prog.kernels[1:]))


def k_loop_stmts(prog, cls):
    loop = next(s for s in ir_rewrite.walk([prog.kernels[0].body]) if isinstance(s, ir.For) and not s.unroll)
    return [s for s in ir_rewrite.walk([loop.body]) if isinstance(s, cls)]


def hazard(prog, arrays) -> list[str]:
    with pytest.raises(HazardError) as info:
        run_program(prog, arrays)
    return str(info.value).splitlines()


def test_every_leaf_statement_of_a_lowered_kernel_names_its_node():
    prog = gemm(3).lower("sm_80")
    leaves = [s for s in ir_rewrite.walk([prog.kernels[0].body])
              if isinstance(s, (ir.AtomCall, ir.Barrier, ir.AsyncCommit, ir.AsyncWait, ir.RegFill, ir.Pointwise))]
    assert leaves and all(s.origin is not None and s.origin.path for s in leaves)
    by_family = {s.atom.family: type(s.origin.node.spec).__name__ for s in leaves if isinstance(s, ir.AtomCall)}
    # (convert: the epilogue's f32 pairs rounded into f16x2, transforms.pair_conversions)
    assert by_family == {"cp_async": "Move", "ldmatrix": "Move", "mma": "MatMul", "copy": "Move", "convert": "Move"}
    # the ring's barriers belong to the node whose K loop is pipelined
    for b in (s for s in leaves if isinstance(s, ir.Barrier)):
        assert any(lp.stages == 3 for lp in b.origin.node.loops), b


def test_missing_pipeline_barrier_names_both_moves_and_the_pipelined_loop():
    prog = gemm(3).lower("sm_80")
    (barrier,) = k_loop_stmts(prog, ir.Barrier)
    lines = hazard(planted(prog, lambda s: None if s is barrier else s), inputs())
    assert lines[0] == "race (read after write) on SH buffer 'A_smem' in move_to_regs('A'), against move_to_smem('A')"
    text = "\n".join(lines)
    assert "this side: Move<warp>(A:SH" in text and "made by move_to_regs('A')" in text
    assert "other side: Move<block>(A:GL" in text and "made by move_to_smem('A')" in text
    between = next(x for x in lines if "between them:" in x)
    assert "k0 in seq(4) pipelined(3 stages) of tile(k=32)" in between
    # the reader's units in the schedule's loop names, and its tiles
    assert any(x.strip().startswith("thread 1 = block") and "warp m1=0, n1=0" in x and "k0=0" in x for x in lines)
    assert any("tiles A:SH[m 0:16, k 0:16], A:RF[m 0:16, k 0:16]" in x for x in lines)
    # the old facts are still there, after the schedule's
    assert "thread 1 reads SH buffer 'A_smem' offset" in text and "ldmatrix" in text


def test_a_warps_tile_names_the_warps_rows():
    """Warp m1=1 reads rows 16..31 of the block's A tile."""
    prog = gemm(3).lower("sm_80")
    (barrier,) = k_loop_stmts(prog, ir.Barrier)
    bad = planted(prog, lambda s: None if s is barrier else s)
    # only warp 1 (threads 32..63) reads: the others' ldmatrix are predicated off
    ld = [s for s in k_loop_stmts(bad, ir.AtomCall) if s.atom.family == "ldmatrix" and s.arg("src").buffer.name == "A_smem"]
    warp1 = ir.expr.binop(">=", ir.tid(64), 32)
    only1 = planted(bad, lambda s: attrs.evolve(s, pred=warp1) if any(s is x for x in ld) else s)
    lines = hazard(only1, inputs())
    assert lines[0].startswith("race (read after write) on SH buffer 'A_smem' in move_to_regs('A')"), lines[0]
    assert any("warp m1=1, n1=0" in x for x in lines), "\n".join(lines)
    assert any("tiles A:SH[m 16:32, k 0:16]" in x for x in lines), "\n".join(lines)


def test_loosened_wait_is_a_read_of_in_flight_data_named_by_strategy():
    prog = gemm(3).lower("sm_80")
    (wait,) = k_loop_stmts(prog, ir.AsyncWait)
    lines = hazard(planted(prog, lambda s: attrs.evolve(s, pending=s.pending + 1) if s is wait else s), inputs())
    assert lines[0] == ("read of in-flight async data on SH buffer 'A_smem' in move_to_regs('A'), "
                        "against move_to_smem('A')")
    assert any("pipelined(3 stages)" in x for x in lines)


def test_single_stage_refill_without_barrier_is_blamed_on_the_copy():
    prog = gemm(1).lower("sm_80")
    first = k_loop_stmts(prog, ir.Barrier)[0]
    assert "readers" in first.comment
    lines = hazard(planted(prog, lambda s: None if s is first else s), inputs())
    assert lines[0] == "race (write after read) on SH buffer 'A_smem' in move_to_smem('A'), against move_to_regs('A')"


def test_out_of_bounds_copy_names_the_move_and_its_global_tile():
    prog = gemm(3).lower("sm_80")
    hit = itertools.count()

    def shift(s):
        if isinstance(s, ir.AtomCall) and s.atom.family == "cp_async" and s.arg("src").buffer.name == "B" \
                and not next(hit):
            src = s.arg("src")
            return attrs.evolve(s, args=tuple((n, attrs.evolve(src, offset=src.offset + 10**4) if n == "src" else r)
                                             for n, r in s.args))
        return s

    lines = hazard(planted(prog, shift), inputs())
    assert lines[0] == "out-of-bounds read (cp.async source) on GL buffer 'B' in move_to_smem('B')"
    assert any("tiles B:GL[k 0:32, n 0:32]" in x for x in lines)
    assert any("schedule path (from the block): tile(k=32) / move_to_smem('A') / move_to_smem('B')" in x
               for x in lines)


def test_thread_leaf_names_its_mapping_and_element_tile():
    spec = fs.Pointwise.kernel("add", {"r": 8, "c": 64}, inputs=[("r", "c"), ("r", "c")])
    sched = spec.schedule(tile(r=2, c=64) >> to_blocks(), tile(r=1, c=8) >> to_threads(), done())
    prog = sched.lower("sm_80")
    out = prog.output.name
    hit = itertools.count()

    def shift(s):
        # every thread stores one chunk of 8 too far: only the last chunk of the last block leaves O
        if isinstance(s, ir.AtomCall) and isinstance(s.args[0][1], ir.MemRef) and s.args[0][1].buffer.name == out \
                and not next(hit):
            dst = s.args[0][1]
            return attrs.evolve(s, args=((s.args[0][0], attrs.evolve(dst, offset=dst.offset + 8)), *s.args[1:]))
        return s

    X = np.ones((8, 64))
    lines = hazard(planted(prog, shift), {b.name: X for b in prog.inputs})
    assert lines[0] == f"out-of-bounds write on GL buffer {out!r} in done() under tile(r=1, c=8) >> to_threads()"
    # thread 15 of block r0=3 (rows 6, 7) is thread r1=1, c1=7: row 7, columns 56..63
    coords = next(x.strip() for x in lines if x.strip().startswith("thread "))
    assert coords == "thread 15 = block c0=0, r0=3; thread r1=1, c1=7", coords
    assert any(f"{out}:GL[r 7:8, c 56:64]" in x for x in lines), "\n".join(lines)


def test_hand_written_ir_gets_a_short_first_line_too():
    T = 32
    tid = ir.tid(T)
    sh = ir.SharedBuffer("s", fs.dtypes.f32, T)
    x = ir.GlobalBuffer("x", fs.dtypes.f32, (T,), (1,))
    r = ir.RegBuffer("r", fs.dtypes.f32, 1)
    body = ir.Seq((ir.AtomCall(sm70.st_shared_4, (("dst", ir.MemRef(sh, tid)), ("src", ir.RegRef(r, 0)))),
                   ir.AtomCall(sm70.ld_shared_4, (("dst", ir.RegRef(r, 0)), ("src", ir.MemRef(sh, (tid + 1) % T))))))
    prog = ir.Program((ir.Kernel("k", (x,), (1, 1, 1), T, (sh,), (r,), body),), (x,), x)
    lines = hazard(prog, {"x": np.zeros(T)})
    assert lines[0] == "race (read after write) on SH buffer 's'"
    assert "thread 0 reads SH buffer 's' offset 1, written by thread 1" in lines[1]


def test_origins_survive_rewrites_and_do_not_change_equality():
    prog = gemm(3).lower("sm_80")
    mma = next(s for s in ir_rewrite.walk([prog.kernels[0].body])
               if isinstance(s, ir.AtomCall) and s.atom.family == "mma")
    assert attrs.evolve(mma, origin=None) == mma
    n2 = next(v for _, dims in mma.origin.tiles for d, v, _ in dims if isinstance(v, ir.expr.Expr)
              and "n2" in str(v))
    assert "n2" in str(n2)
    fixed = ir_rewrite.substitute_stmt(mma, {Var("n2", 4): 3})
    assert fixed.origin is not None and fixed.origin.path == mma.origin.path
    starts = {name: dict((d, v) for d, v, _ in dims) for name, dims in fixed.origin.tiles}
    assert starts["B:RF"]["n"] == 24 and starts["C:RF"]["n"] == 24
