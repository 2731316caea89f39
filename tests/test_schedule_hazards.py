"""Planted hazards in lowered GEMM programs.

Each test lowers a small GEMM schedule, breaks one thing in the kernel IR (drops a barrier, drops
or loosens a cp.async wait, pushes a global address past the end of its buffer) and checks that
the interpreter raises ``HazardError`` naming the buffer, the threads and the statement.  The
unmodified programs run clean and match numpy, so every planted failure is caused by the plant.
"""

from __future__ import annotations

import itertools

import attrs
import numpy as np
import pytest

import firesched as fs
from firesched import ir
from firesched.errors import HazardError
from firesched.simulate.interp import run_program

# --------------------------------------------------------------------------- the programs

SCHEDULES = {
    "3-stage": dict(M=64, N=64, K=128, block_m=32, block_n=32, block_k=32, warps_m=2, warps_n=1, stages=3),
    "2-stage-odd": dict(M=40, N=48, K=96, block_m=32, block_n=32, block_k=32, warps_m=1, warps_n=2, stages=2),
    "1-stage": dict(M=64, N=32, K=96, block_m=32, block_n=32, block_k=32, warps_m=2, warps_n=1, stages=1),
    "4-stage-split-k-warps": dict(M=32, N=32, K=256, block_m=32, block_n=32, block_k=32, warps_m=2, warps_n=1,
                                  stages=4, split_k_warps=2),
}


def make(name):
    p = dict(SCHEDULES[name])
    M, N, K = p.pop("M"), p.pop("N"), p.pop("K")
    sched = fs.recipes.gemm(M, N, K, arch="sm_80", **p)
    rng = np.random.default_rng(7)
    A = rng.standard_normal((M, K))
    B = rng.standard_normal((K, N))
    return sched, sched.lower(), A, B


def reference(A, B):
    return A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)


def run(prog, A, B):
    return run_program(prog, {"A": A, "B": B})


# --------------------------------------------------------------------------- IR surgery

def rewrite(stmt, fn):
    """Rebuild ``stmt`` bottom-up; ``fn(s)`` returns a replacement statement, or None to drop it."""
    if isinstance(stmt, ir.Seq):
        body = []
        for c in stmt.body:
            c = rewrite(c, fn)
            if c is not None:
                body.append(c)
        return fn(attrs.evolve(stmt, body=tuple(body)))
    if isinstance(stmt, ir.For):
        return fn(attrs.evolve(stmt, body=rewrite(stmt.body, fn)))
    if isinstance(stmt, ir.If):
        return fn(attrs.evolve(stmt, then=rewrite(stmt.then, fn)))
    return fn(stmt)


def rewrite_kernel(prog, fn, kernel=0):
    ks = list(prog.kernels)
    ks[kernel] = attrs.evolve(ks[kernel], body=rewrite(ks[kernel].body, fn))
    return attrs.evolve(prog, kernels=tuple(ks))


def walk(stmt, loops=()):
    """(statement, enclosing For loops) for every statement, in program order."""
    yield stmt, loops
    if isinstance(stmt, ir.Seq):
        for c in stmt.body:
            yield from walk(c, loops)
    elif isinstance(stmt, ir.For):
        yield from walk(stmt.body, loops + (stmt,))
    elif isinstance(stmt, ir.If):
        yield from walk(stmt.then, loops)


def k_loop(prog):
    """The serial (not unrolled) K loop of the main kernel."""
    loops = [s for s, _ in walk(prog.kernels[0].body) if isinstance(s, ir.For) and not s.unroll]
    assert len(loops) == 1, loops
    return loops[0]


def count(stmt, cls, pred=lambda s: True):
    return sum(1 for s, _ in walk(stmt) if isinstance(s, cls) and pred(s))


def drop_nth(prog, pred, n):
    """Drop the ``n``-th statement (program order, counting inside the K loop only) matching ``pred``."""
    loop = k_loop(prog)
    targets = [s for s, _ in walk(loop.body) if pred(s)]
    victim = targets[n]
    return rewrite_kernel(prog, lambda s: None if s is victim else s), victim


def expect_hazard(prog, A, B, *words):
    with pytest.raises(HazardError) as info:
        run(prog, A, B)
    msg = str(info.value)
    for w in ("kernel 'firesched_matmul'", "block (", "thread", *words):
        assert w in msg, f"{w!r} not in the message:\n{msg}"
    return msg


# --------------------------------------------------------------------------- (d) the programs are clean

@pytest.mark.parametrize("name", SCHEDULES)
def test_unmodified_program_runs_clean_and_matches_numpy(name):
    _, prog, A, B = make(name)
    C = run(prog, A, B)["C"]
    ref = reference(A, B)
    np.testing.assert_allclose(np.asarray(C, dtype=np.float64), ref, rtol=0, atol=2e-2 * np.abs(ref).max())


def test_surgery_without_changes_is_the_identity():
    _, prog, A, B = make("3-stage")
    same = rewrite_kernel(prog, lambda s: s)
    assert same == prog
    np.testing.assert_array_equal(run(same, A, B)["C"], run(prog, A, B)["C"])


# --------------------------------------------------------------------------- (a) a missing barrier

@pytest.mark.parametrize("name", ["3-stage", "2-stage-odd", "4-stage-split-k-warps"])
def test_missing_k_loop_barrier_is_a_read_after_write_race_on_shared_memory(name):
    _, prog, A, B = make(name)
    assert count(k_loop(prog).body, ir.Barrier) == 1
    bad, _ = drop_nth(prog, lambda s: isinstance(s, ir.Barrier), 0)
    assert count(k_loop(bad).body, ir.Barrier) == 0
    msg = expect_hazard(bad, A, B, "race (read after write)", "SH buffer 'A_smem'", "ldmatrix", "k0=0")
    assert "cp_async" in msg  # the racing write (the landing of the copy) is named too


def test_missing_barrier_before_the_refill_is_a_write_after_read_race():
    """Single-stage: the barrier that waits for the previous tile's readers protects the refill."""
    _, prog, A, B = make("1-stage")
    barriers = [s for s, _ in walk(k_loop(prog).body) if isinstance(s, ir.Barrier)]
    assert len(barriers) == 2
    bad, victim = drop_nth(prog, lambda s: isinstance(s, ir.Barrier), 0)
    assert "readers" in victim.comment
    msg = expect_hazard(bad, A, B, "race (write after read)", "SH buffer 'A_smem'", "cp_async", "k0=1")
    assert "ldmatrix" in msg  # the racing read is named too


def test_missing_barrier_after_the_landing_is_a_read_after_write_race():
    _, prog, A, B = make("1-stage")
    bad, victim = drop_nth(prog, lambda s: isinstance(s, ir.Barrier), 1)
    assert "shared memory" in victim.comment
    expect_hazard(bad, A, B, "race (read after write)", "SH buffer 'A_smem'", "ldmatrix", "k0=0")


def test_missing_split_k_reduction_barrier_is_a_race_on_the_partials():
    _, prog, A, B = make("4-stage-split-k-warps")
    after = [s for s, loops in walk(prog.kernels[0].body) if isinstance(s, ir.Barrier) and not loops]
    assert len(after) == 1 and "partials" in after[0].comment
    bad = rewrite_kernel(prog, lambda s: None if s is after[0] else s)
    expect_hazard(bad, A, B, "race (read after write)", "SH buffer 'splitk_smem'", "thread")


# --------------------------------------------------------------------------- (b) async waits

@pytest.mark.parametrize("name", ["3-stage", "2-stage-odd", "1-stage", "4-stage-split-k-warps"])
def test_missing_async_wait_in_the_k_loop_reads_in_flight_data(name):
    _, prog, A, B = make(name)
    assert count(k_loop(prog).body, ir.AsyncWait) == 1
    bad, _ = drop_nth(prog, lambda s: isinstance(s, ir.AsyncWait), 0)
    expect_hazard(bad, A, B, "in-flight", "SH buffer 'A_smem'", "cp.async by thread", "k0=0")


@pytest.mark.parametrize("name", ["3-stage", "4-stage-split-k-warps"])
def test_async_wait_one_group_too_loose_reads_in_flight_data(name):
    _, prog, A, B = make(name)
    loop = k_loop(prog)
    (wait,) = [s for s, _ in walk(loop.body) if isinstance(s, ir.AsyncWait)]
    assert wait.pending == SCHEDULES[name]["stages"] - 2
    bad = rewrite_kernel(prog, lambda s: attrs.evolve(s, pending=s.pending + 1) if s is wait else s)
    expect_hazard(bad, A, B, "read of in-flight async data", "SH buffer 'A_smem'", "ldmatrix")


def test_async_copies_never_waited_for_are_reported_at_the_end_of_the_block():
    """Drop every wait: the copies are still in flight when the block ends (or are read first)."""
    _, prog, A, B = make("3-stage")
    bad = rewrite_kernel(prog, lambda s: None if isinstance(s, ir.AsyncWait) else s)
    expect_hazard(bad, A, B, "in-flight", "SH buffer 'A_smem'")


def test_tightening_a_wait_is_harmless():
    """The converse: waiting for everything is slower but correct, and the checker agrees."""
    _, prog, A, B = make("3-stage")
    strict = rewrite_kernel(prog, lambda s: attrs.evolve(s, pending=0) if isinstance(s, ir.AsyncWait) else s)
    np.testing.assert_array_equal(run(strict, A, B)["C"], run(prog, A, B)["C"])


# --------------------------------------------------------------------------- (c) out of bounds

def _shift_first_load(prog, buffer, delta, *, family=None):
    """Add ``delta`` to the source offset of the first global load of ``buffer`` (cp.async or
    synchronous copy) anywhere in the main kernel."""
    hit = itertools.count()

    def fn(s):
        if not isinstance(s, ir.AtomCall):
            return s
        args = dict(s.args)
        src = args.get("src")
        if not (isinstance(src, ir.MemRef) and src.buffer.name == buffer):
            return s
        if family is not None and s.atom.family != family:
            return s
        if next(hit):
            return s
        args["src"] = attrs.evolve(src, offset=src.offset + delta)
        return attrs.evolve(s, args=tuple(args.items()))

    bad = rewrite_kernel(prog, fn)
    assert next(hit) >= 1, "no load was shifted"
    return bad


@pytest.mark.parametrize("name", ["3-stage", "1-stage"])
@pytest.mark.parametrize("buffer", ["A", "B"])
def test_global_load_past_the_end_is_out_of_bounds(name, buffer):
    _, prog, A, B = make(name)
    size = {b.name: b.size for b in prog.inputs}[buffer]
    bad = _shift_first_load(prog, buffer, size)
    msg = expect_hazard(bad, A, B, "out-of-bounds", f"GL buffer '{buffer}'", f"(size {size})", "cp_async")
    assert "offset" in msg


def test_global_load_before_the_start_is_out_of_bounds():
    _, prog, A, B = make("2-stage-odd")
    bad = _shift_first_load(prog, "B", -10**6)
    expect_hazard(bad, A, B, "out-of-bounds", "GL buffer 'B'", "offset -")


def test_synchronous_copy_past_the_end_is_out_of_bounds():
    """K odd: rows are not 16-byte aligned, A is staged by synchronous element copies."""
    sched = fs.recipes.gemm(40, 32, 45, block_m=32, block_n=32, block_k=16, warps_m=2, warps_n=1, stages=2, arch="sm_80")
    prog = sched.lower()
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((40, 45)), rng.standard_normal((45, 32))
    C = run(prog, A, B)["C"]
    ref = reference(A, B)
    np.testing.assert_allclose(np.asarray(C, dtype=np.float64), ref, rtol=0, atol=2e-2 * np.abs(ref).max())
    loads = [s for s, _ in walk(prog.kernels[0].body)
             if isinstance(s, ir.AtomCall) and s.atom.family != "cp_async"
             and isinstance(dict(s.args).get("src"), ir.MemRef) and dict(s.args)["src"].buffer.name == "A"]
    assert loads, "expected a synchronous copy of A"
    bad = _shift_first_load(prog, "A", 40 * 45, family=loads[0].atom.family)
    expect_hazard(bad, A, B, "out-of-bounds", "GL buffer 'A'", "(size 1800)")


def test_shared_store_past_the_end_is_out_of_bounds():
    _, prog, A, B = make("3-stage")
    hit = itertools.count()

    def fn(s):
        if isinstance(s, ir.AtomCall) and s.atom.family == "cp_async" and not next(hit):
            args = dict(s.args)
            args["dst"] = attrs.evolve(args["dst"], offset=args["dst"].offset + args["dst"].buffer.size)
            return attrs.evolve(s, args=tuple(args.items()))
        return s

    bad = rewrite_kernel(prog, fn)
    expect_hazard(bad, A, B, "out-of-bounds", "SH buffer 'A_smem'", "cp_async")
