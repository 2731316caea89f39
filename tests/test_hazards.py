"""Planted hazards: each is caught by the interpreter with a message naming the buffer, the
threads and the statement, and the same program with the fix applied runs clean."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firesched import dtypes as dt
from firesched import ir
from firesched.errors import HazardError
from firesched.hardware.atoms import catalog, sm70, sm80
from firesched.ir.expr import binop, lt
from firesched.simulate.interp import run_program

T = 64
TID = ir.tid(T)


def call(atom, pred=1, comment="", **args):
    return ir.AtomCall(atom, tuple(args.items()), pred, comment)


def gbuf(name, d, shape, role="in"):
    shape = tuple(shape)
    strides, acc = [], 1
    for n in reversed(shape):
        strides.insert(0, acc)
        acc *= n
    return ir.GlobalBuffer(name, d, shape, tuple(strides), role)


X = gbuf("x", dt.f32, (T, 4))
Y = gbuf("y", dt.f32, (T, 4), "out")
SMEM = ir.SharedBuffer("A_smem", dt.f32, T * 4)
R = ir.RegBuffer("r", dt.f32, 4)
R2 = ir.RegBuffer("r2", dt.f32, 4)


def kernel_program(body, *, grid=(1, 1, 1), shared=(SMEM,), regs=(R, R2)):
    k = ir.Kernel("planted", (X, Y), grid, T, shared, regs, ir.Seq(body))
    return ir.Program((k,), (X,), Y)


def run(body, **kw):
    x = np.arange(T * 4, dtype=np.float32).reshape(T, 4)
    return x, run_program(kernel_program(body, **kw), {"x": x})["y"]


def load_x(offset=TID * 4, pred=1):
    return call(sm70.ld_global_16, pred=pred, src=ir.MemRef(X, offset), dst=ir.RegRef(R, 0))


def store_y(src=R, offset=TID * 4, pred=1):
    return call(sm70.st_global_16, pred=pred, dst=ir.MemRef(Y, offset), src=ir.RegRef(src, 0))


def st_smem(offset, comment="publish"):
    return call(sm70.st_shared_16, dst=ir.MemRef(SMEM, offset), src=ir.RegRef(R, 0), comment=comment)


def ld_smem(offset, comment="consume"):
    return call(sm70.ld_shared_16, src=ir.MemRef(SMEM, offset), dst=ir.RegRef(R2, 0), comment=comment)


NEXT = (TID + 5) % T     # the neighbour whose chunk a thread reads


def expect_hazard(body, *words, **kw):
    with pytest.raises(HazardError) as info:
        run(body, **kw)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in the message:\n{msg}"
    assert "kernel 'planted'" in msg and "block (0, 0, 0)" in msg, msg
    return msg


# --------------------------------------------------------------------------- (a) missing barrier: RAW

def raw_body(fixed):
    return [load_x(), st_smem(TID * 4), *([ir.Barrier()] if fixed else []), ld_smem(NEXT * 4), store_y(R2)]


def test_missing_barrier_between_store_and_load_of_another_thread():
    msg = expect_hazard(raw_body(False), "race (read after write)", "'A_smem'", "thread 0 reads",
                        "offset 20", "written by thread 5", "sm70.ld_shared_16", "consume", "sm70.st_shared_16")
    assert "publish" in msg


def test_missing_barrier_fixed():
    x, y = run(raw_body(True))
    np.testing.assert_array_equal(y, np.roll(x, -5, axis=0))


def test_own_writes_need_no_barrier():
    x, y = run([load_x(), st_smem(TID * 4), ld_smem(TID * 4), store_y(R2)])
    np.testing.assert_array_equal(y, x)


# --------------------------------------------------------------------------- (b) WAR

def war_body(fixed):
    return [load_x(), st_smem(TID * 4), ir.Barrier(), ld_smem(NEXT * 4),
            *([ir.Barrier("reads done")] if fixed else []),
            st_smem(TID * 4, comment="overwrite"), ir.Barrier(), ld_smem(TID * 4), store_y(R2)]


def test_war_overwrite_of_data_another_thread_read():
    expect_hazard(war_body(False), "race (write after read)", "'A_smem'", "thread 0 writes", "offset 0",
                  "read by thread 59", "overwrite", "sm70.st_shared_16")


def test_war_fixed():
    x, y = run(war_body(True))
    np.testing.assert_array_equal(y, x)


def test_waw_two_threads_write_one_element():
    body = [load_x(), st_smem((TID % 32) * 4, comment="collide")]
    expect_hazard(body, "race (write after write)", "'A_smem'", "offset 0", "collide")


def test_waw_across_statements_without_barrier():
    body = [load_x(), st_smem(TID * 4), st_smem(NEXT * 4, comment="second store")]
    expect_hazard(body, "race (write after write)", "'A_smem'", "written by thread", "second store")


def test_broadcast_reads_are_no_race_until_someone_writes():
    ok = [load_x(), st_smem(TID * 4), ir.Barrier(), ld_smem(0), store_y(R2)]
    x, y = run(ok)
    np.testing.assert_array_equal(y, np.broadcast_to(x[0], (T, 4)))
    expect_hazard([*ok[:-1], call(sm70.st_shared_16, pred=lt(TID, 1), dst=ir.MemRef(SMEM, 0),
                                  src=ir.RegRef(R, 0), comment="thread 0 rewrites")],
                  "race (write after read)", "thread 0 writes", "offset 0", "thread 0 rewrites")


# --------------------------------------------------------------------------- (c) cp.async read before wait

def cp_async(dst_offset=NEXT * 4, src_offset=TID * 4, pred=1, comment="prefetch"):
    return call(sm80.cp_async_16, pred=pred, src=ir.MemRef(X, src_offset), dst=ir.MemRef(SMEM, dst_offset),
                comment=comment)


def async_body(fixed):
    return [cp_async(), ir.AsyncCommit(), *([ir.AsyncWait(0)] if fixed else []), ir.Barrier(),
            ld_smem(TID * 4), store_y(R2)]


def test_read_of_cp_async_destination_before_wait():
    expect_hazard(async_body(False), "read of in-flight async data", "'A_smem'", "thread 0 reads", "offset 0",
                  "cp.async by thread 59", "sm80.cp_async_16", "prefetch", "sm70.ld_shared_16")


def test_read_before_wait_fixed():
    x, y = run(async_body(True))
    np.testing.assert_array_equal(y, np.roll(x, 5, axis=0))


def test_wait_group_leaves_the_newest_groups_in_flight():
    SM2 = ir.SharedBuffer("A_smem", dt.f32, 2 * T * 4)

    def body(read_newest):
        return [
            call(sm80.cp_async_16, src=ir.MemRef(X, TID * 4), dst=ir.MemRef(SM2, TID * 4), comment="stage 0"),
            ir.AsyncCommit(),
            call(sm80.cp_async_16, src=ir.MemRef(X, TID * 4), dst=ir.MemRef(SM2, T * 4 + TID * 4),
                 comment="stage 1"),
            ir.AsyncCommit(),
            ir.AsyncWait(1),
            call(sm70.ld_shared_16, src=ir.MemRef(SM2, (T * 4 if read_newest else 0) + TID * 4),
                 dst=ir.RegRef(R2, 0)),
            ir.AsyncWait(0),
            store_y(R2),
        ]
    x, y = run(body(False), shared=(SM2,))
    np.testing.assert_array_equal(y, x)
    expect_hazard(body(True), "read of in-flight async data", "stage 1", shared=(SM2,))


def test_overwrite_of_in_flight_data():
    body = [cp_async(TID * 4), load_x(), st_smem(TID * 4, comment="clobber"), ir.AsyncCommit(), ir.AsyncWait(0)]
    expect_hazard(body, "overwrite of in-flight async data", "'A_smem'", "clobber")


def test_cp_async_into_data_another_thread_read_is_a_war():
    body = [load_x(), st_smem(TID * 4), ir.Barrier(), ld_smem(NEXT * 4), cp_async(TID * 4, comment="refill"),
            ir.AsyncCommit(), ir.AsyncWait(0)]
    expect_hazard(body, "race (write after read)", "'A_smem'", "refill")


def test_landed_copies_count_as_writes_of_the_issuing_thread():
    body = [cp_async(TID * 4), ir.AsyncCommit(), ir.AsyncWait(0), ld_smem(NEXT * 4, comment="no barrier")]
    expect_hazard(body, "race (read after write)", "'A_smem'", "no barrier", "sm80.cp_async_16")


# --------------------------------------------------------------------------- (d) out of bounds

def test_out_of_bounds_global_read():
    msg = expect_hazard([load_x(TID * 4 + 4), store_y()], "out-of-bounds read", "GL buffer 'x'", "offset 256",
                        "thread 63", "sm70.ld_global_16")
    assert "(size 256)" in msg


def test_out_of_bounds_global_write():
    expect_hazard([load_x(), store_y(offset=TID * 4 + 8)], "out-of-bounds write", "GL buffer 'y'",
                  "offset 256", "threads 62, 63", "sm70.st_global_16")


def test_out_of_bounds_shared_read():
    expect_hazard([load_x(), st_smem(TID * 4), ir.Barrier(), ld_smem(TID * 4 + 4)], "out-of-bounds read",
                  "SH buffer 'A_smem'", "offset 256", "thread 63", "consume")


def test_out_of_bounds_shared_write():
    expect_hazard([load_x(), st_smem(TID * 4 - 4)], "out-of-bounds write", "SH buffer 'A_smem'", "offset -4",
                  "thread 0", "publish")


def test_out_of_bounds_cp_async_source():
    expect_hazard([cp_async(TID * 4, TID * 4 + 4)], "out-of-bounds read", "GL buffer 'x'", "thread 63")


def test_out_of_bounds_fixed_by_predication():
    # the guarded version: the last thread neither reads nor writes out of bounds
    guard = lt(TID, T - 1)
    x, y = run([load_x(TID * 4 + 4, pred=guard), store_y(pred=guard),
                cp_async(TID * 4, TID * 4 + 4, pred=guard), ir.AsyncCommit(), ir.AsyncWait(0)])
    np.testing.assert_array_equal(y[:-1], x[1:])
    np.testing.assert_array_equal(y[-1], 0)


def test_out_of_range_registers():
    body = [call(sm70.ld_global_16, src=ir.MemRef(X, TID * 4), dst=ir.RegRef(R, 2), comment="too far")]
    expect_hazard(body, "register buffer 'r'", "offsets 2..5", "too far")
    expect_hazard([ir.Pointwise("relu", ir.RegRef(R, 4), (ir.RegRef(R, 0),))], "register buffer 'r'", "relu")


def test_misaligned_vector_access():
    expect_hazard([load_x(TID * 2 + 2)], "misaligned address", "16-byte", "'x'", "thread 0")


# --------------------------------------------------------------------------- (e) divergent barrier

def divergent_body(fixed):
    then = [load_x(), st_smem(TID * 4)] + ([] if fixed else [ir.Barrier("inside the if")])
    return [ir.If(lt(TID, 40), ir.Seq(then)), *([ir.Barrier("after the if")] if fixed else []),
            ld_smem(NEXT * 4), store_y(R2)]


def test_barrier_in_divergent_code():
    expect_hazard(divergent_body(False), "barrier inside divergent code", "threads 40, 41", "inside the if")


def test_bar_sync_atom_in_divergent_code():
    body = [ir.If(lt(TID, 40), call(sm70.bar_sync, comment="atom barrier"))]
    expect_hazard(body, "barrier inside divergent code", "sm70.bar_sync", "atom barrier")


def test_divergent_barrier_fixed():
    x, y = run(divergent_body(True))
    want = np.roll(x, -5, axis=0)
    want[np.arange(T)[(np.arange(T) + 5) % T >= 40]] = 0   # chunks nobody stored stay zero
    np.testing.assert_array_equal(y, want)


def test_uniform_if_around_a_barrier_is_fine():
    bx = ir.bid(0, 2)
    body = [load_x(), ir.If(lt(bx, 1), ir.Seq([st_smem(TID * 4), ir.Barrier("uniform")])),
            store_y(pred=lt(bx, 1))]
    x, y = run(body, grid=(2, 1, 1))
    np.testing.assert_array_equal(y, x)


def test_collective_atom_issued_by_part_of_a_warp():
    sh = ir.SharedBuffer("A_smem", dt.f16, 16 * 16)
    frag = ir.RegBuffer("frag", dt.f16, 8)
    ld = call(sm80.ldmatrix_x4, src=ir.MemRef(sh, (TID % 32) * 8), dst=ir.RegRef(frag, 0), comment="half warp")
    expect_hazard([ir.If(lt(TID % 32, 16), ld)], "part of its thread group", "threads 16, 17", "half warp",
                  shared=(sh,), regs=(R, R2, frag))


# --------------------------------------------------------------------------- (f) cp.async never waited for

def never_waited_body(commit, wait):
    return [cp_async(TID * 4), *([ir.AsyncCommit()] if commit else []), *([ir.AsyncWait(0)] if wait else [])]


@pytest.mark.parametrize("commit,wait", [(True, False), (False, True), (False, False)])
def test_cp_async_never_waited_for(commit, wait):
    expect_hazard(never_waited_body(commit, wait), "async copies never waited for", "'A_smem'", "thread 0",
                  "sm80.cp_async_16", "prefetch")


def test_cp_async_waited_for_fixed():
    run(never_waited_body(True, True))


def test_wait_inside_if_only_completes_active_threads():
    body = [cp_async(TID * 4), ir.AsyncCommit(), ir.If(lt(TID, 32), ir.AsyncWait(0))]
    expect_hazard(body, "async copies never waited for", "thread 32")


def test_sync_atoms_stand_for_commit_wait_and_barrier():
    wait0 = catalog.with_immediates(sm80.cp_async_wait, n=0)
    body = [cp_async(), call(sm80.cp_async_commit), call(wait0), call(sm70.bar_sync), ld_smem(TID * 4),
            store_y(R2)]
    x, y = run(body)
    np.testing.assert_array_equal(y, np.roll(x, 5, axis=0))


def test_hazards_in_later_blocks_name_the_block():
    bx = ir.bid(0, 3)
    body = [load_x(), ir.If(binop("==", bx, 2), st_smem(TID * 4)),
            ld_smem(NEXT * 4), store_y(R2)]
    with pytest.raises(HazardError, match=r"block \(2, 0, 0\)"):
        run(body, grid=(3, 1, 1))


@settings(max_examples=40, deadline=None)
@given(shift=st.integers(0, T - 1), barrier=st.booleans(), writers=st.integers(1, T))
def test_exchange_races_exactly_when_a_thread_reads_another_threads_chunk(shift, barrier, writers):
    """Threads below `writers` publish their chunk; every thread reads chunk (t + shift) % T."""
    src = (TID + shift) % T
    body = [load_x(), ir.If(lt(TID, writers), st_smem(TID * 4)), *([ir.Barrier()] if barrier else []),
            ld_smem(src * 4), store_y(R2)]
    t = np.arange(T)
    reader_of_foreign = ((t + shift) % T != t) & ((t + shift) % T < writers)
    if not barrier and reader_of_foreign.any():
        with pytest.raises(HazardError, match="race"):
            run(body)
    else:
        x, y = run(body)
        j = (t + shift) % T
        np.testing.assert_array_equal(y, np.where((j < writers)[:, None], x[j], 0))
