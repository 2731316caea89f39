"""The interpreter's models of the sm_90a atoms: one-warpgroup microkernels against numpy, and
planted hazards (each reported, with the fixed program running clean).

The programs come from ``firesched.testing.microkernel`` (the GPU tests run the same ones);
hazards are planted through their keyword arguments or by editing their statement lists.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from firesched import dtypes as dt
from firesched import ir
from firesched.errors import HazardError, InternalError
from firesched.hardware import catalog, sm90a
from firesched.ir import expr as ex
from firesched.simulate.interp import run_program
from firesched.testing import microkernel as mk

T128 = ir.tid(128)


def run(prog):
    program, inputs, expected = prog
    got = run_program(program, inputs)[program.output.name]
    want = expected(inputs)
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))
    return got


def body_of(program) -> list:
    return list(program.kernels[0].body.body)


def with_body(program, body, **kernel_changes):
    k = attrs.evolve(program.kernels[0], body=ir.Seq(body), **kernel_changes)
    return attrs.evolve(program, kernels=(k,))


def index_of(body, name: str) -> int:
    for i, s in enumerate(body):
        if isinstance(s, ir.AtomCall) and s.atom.name == name:
            return i
    raise AssertionError(f"no {name} in the body")


def call(atom, **args):
    return ir.AtomCall(atom, tuple(args.items()))


WAIT0 = catalog.with_immediates(sm90a.wgmma_wait, n=0)


# =========================================================================== wgmma

@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("n", [8, 64, 256])
@pytest.mark.parametrize("ab", ["f16", "bf16"])
def test_wgmma_ss(ab, n, swizzle):
    run(mk.wgmma_program(sm90a.wgmma_atom(n, ab), swizzle=swizzle))


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("n", [8, 64, 256])
def test_wgmma_ss_with_mn_major_b(n, swizzle):
    run(mk.wgmma_program(sm90a.wgmma_atom(n, "f16", b_mn_major=True), swizzle=swizzle))


@pytest.mark.parametrize("n, ab, swizzle, tnsp", [
    (8, "f16", 0, False), (64, "bf16", 128, False), (256, "f16", 64, False), (24, "bf16", 32, False),
    (64, "f16", 128, True), (16, "bf16", 0, True),
])
def test_wgmma_rs(n, ab, swizzle, tnsp):
    run(mk.wgmma_program(sm90a.wgmma_atom(n, ab, a_in_registers=True, b_mn_major=tnsp), swizzle=swizzle))


def test_wgmma_scale_d_zero_ignores_the_accumulators():
    out = run(mk.wgmma_program(sm90a.wgmma_m64n32k16_f16_f32_ss, scale_d=0))
    assert np.any(out != 0)


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("ab", ["f16", "bf16"])
def test_tma_then_wgmma_with_k_steps(ab, swizzle):
    # TMA boxes land in the canonical layout the descriptors name, K-advance moves the start
    run(mk.tma_wgmma_program(64, ab, swizzle=swizzle))


@pytest.mark.parametrize("n", [8, 256])
def test_tma_then_wgmma_extreme_n(n):
    run(mk.tma_wgmma_program(n, "f16", swizzle=128))


def test_wgmma_is_really_computed():
    program, inputs, expected = mk.wgmma_program(sm90a.wgmma_m64n16k16_f16_f32_ss, swizzle=64)
    a, b, c = (np.asarray(inputs[x], np.float64) for x in "abc")
    np.testing.assert_array_equal(expected(inputs), a @ b + c)
    assert np.any(a @ b != 0)


# =========================================================================== TMA

BOXES = {0: (16, 64), 32: (16, 16), 64: (16, 32), 128: (16, 64)}


# boxes over every edge, each starting on a 16-byte boundary of the row (the others fault on a
# GPU and are refused: tests/test_tma_encoding.py)
@pytest.mark.parametrize("coords", [(0, 0), (16, 32), (-8, -3), (64, 39), (8, 4)])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_load(swizzle, coords):
    run(mk.tma_load_program(swizzle=swizzle, box=BOXES[swizzle], coords=coords))


def test_tma_load_box_over_the_edge_is_zero_filled():
    out = run(mk.tma_load_program())        # box rows 32..47 of 40, columns 16..79 of 72
    assert np.all(out[8:, :] == 0) and np.all(out[:, 56:] == 0)
    assert np.any(out[:8, :56] != 0)


@pytest.mark.parametrize("dtype, shape, box, swizzle, coords", [("f32", (40, 72), (8, 32), 128, (-4, 36)),
                                                               ("u8", (40, 80), (16, 64), 64, (-16, 36)),
                                                               ("bf16", (40, 72), (8, 16), 32, (-8, 36))])
def test_tma_load_other_dtypes(dtype, shape, box, swizzle, coords):
    run(mk.tma_load_program(dtype, shape=shape, box=box, swizzle=swizzle, coords=coords))


def test_tensor_maps_reject_rows_that_are_not_16_byte_multiples():
    with pytest.raises(ValueError, match="row stride is 72 bytes"):
        mk.tma_load_program("u8", box=(16, 64), swizzle=64)


def test_tma_load_with_every_thread_arriving():
    run(mk.tma_load_program(arrivals="all"))


# stores may hang over the far edges only, starting on a 16-byte boundary of the row
@pytest.mark.parametrize("coords", [(16, 32), (0, 0), (56, 30), (8, 39)])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_store(swizzle, coords):
    run(mk.tma_store_program(swizzle=swizzle, box=BOXES[swizzle], coords=coords))


@pytest.mark.parametrize("wait", ["read", "all"])
def test_tma_store_waits(wait):
    out = run(mk.tma_store_program(wait=wait))
    assert np.all(out[:32] == 0) and np.any(out[32:, 16:] != 0)


# =========================================================================== TMA, rank 3: (batch, rows, cols)

def _overlap(c: int, n: int, extent: int):
    """(slice of the tensor, slice of the box) where a box of ``n`` elements starting at ``c``
    meets a dimension of ``extent`` elements (empty slices when it misses)."""
    lo, hi = max(c, 0), min(c + n, extent)
    hi = max(hi, lo)
    return slice(lo, hi), slice(lo - c, hi - c)


def box_of(x: np.ndarray, box, coords) -> np.ndarray:
    """numpy: the box of x at (column, row, batch) = coords, zeros wherever it leaves x."""
    out = np.zeros(box, dtype=x.dtype)
    cuts = [_overlap(c, n, e) for c, n, e in zip(coords[::-1], box, x.shape)]
    out[tuple(b for _, b in cuts)] = x[tuple(t for t, _ in cuts)]
    return out


def stored(shape, tile: np.ndarray, coords) -> np.ndarray:
    """numpy: a zero tensor of ``shape`` after writing tile at (column, row, batch) = coords,
    dropping what falls outside it."""
    out = np.zeros(shape, dtype=tile.dtype)
    cuts = [_overlap(c, n, e) for c, n, e in zip(coords[::-1], tile.shape, shape)]
    out[tuple(t for t, _ in cuts)] = tile[tuple(b for _, b in cuts)]
    return out


def run3(prog, reference):
    """Run a rank-3 microkernel in the interpreter and compare with ``reference(inputs)``."""
    program, inputs, _ = prog
    got = run_program(program, inputs)[program.output.name]
    want = reference(inputs)
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))
    return got, inputs


SHAPE3 = (3, 40, 72)
BOXES3 = {sw: (1, *b) for sw, b in BOXES.items()}


# (column, row, batch): inside; over the bottom-right of matrix 1; over the top-left of matrix 0;
# over the far corner of the last matrix; before the first matrix; past the last one
@pytest.mark.parametrize("coords", [(0, 0, 0), (16, 32, 1), (-8, -3, 0), (64, 39, 2), (8, 4, -1), (0, 0, 3)])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_load_3d(swizzle, coords):
    box = BOXES3[swizzle]
    run3(mk.tma_load_3d_program(shape=SHAPE3, box=box, swizzle=swizzle, coords=coords),
         lambda inputs: box_of(np.asarray(inputs["x"]), box, coords))


def test_tma_load_3d_does_not_read_the_next_matrix():
    # rows 32..47 of matrix 1 (of 40): a 2-D view of (3 * 40) x 72 would bring matrix 2's rows 0..7
    got, inputs = run3(mk.tma_load_3d_program(shape=SHAPE3, box=(1, 16, 64), coords=(0, 32, 1)),
                       lambda inputs: box_of(np.asarray(inputs["x"]), (1, 16, 64), (0, 32, 1)))
    x = np.asarray(inputs["x"])
    assert np.all(got[0, 8:] == 0) and np.any(x[2, :8, :64] != 0)
    np.testing.assert_array_equal(got[0, :8], x[1, 32:40, :64])


@pytest.mark.parametrize("box, coords, swizzle", [((2, 16, 64), (8, 24, 2), 128), ((2, 16, 64), (8, 24, -1), 128),
                                                  ((2, 16, 32), (32, 30, 0), 64), ((3, 8, 16), (-8, 36, 1), 32),
                                                  ((2, 8, 64), (56, -4, 1), 0)])
def test_tma_load_3d_boxes_of_several_matrices(box, coords, swizzle):
    """Boxes holding several matrices land row-major: matrix after matrix, each as its 2-D box."""
    run3(mk.tma_load_3d_program(shape=SHAPE3, box=box, swizzle=swizzle, coords=coords),
         lambda inputs: box_of(np.asarray(inputs["x"]), box, coords))


@pytest.mark.parametrize("dtype, shape, box, swizzle, coords", [("f32", (2, 40, 72), (1, 8, 32), 128, (-4, 36, 1)),
                                                               ("u8", (2, 40, 80), (1, 16, 64), 64, (-16, 36, 1)),
                                                               ("bf16", (3, 40, 72), (2, 8, 16), 32, (-8, 36, 2))])
def test_tma_load_3d_other_dtypes(dtype, shape, box, swizzle, coords):
    run3(mk.tma_load_3d_program(dtype, shape=shape, box=box, swizzle=swizzle, coords=coords),
         lambda inputs: box_of(np.asarray(inputs["x"]).astype(dt.dtype(dtype).np), box, coords))


@pytest.mark.parametrize("coords", [(0, 0, 0), (16, 32, 1), (56, 30, 2), (8, 39, 0), (0, 0, 3)])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_store_3d(swizzle, coords):
    box = BOXES3[swizzle]
    run3(mk.tma_store_3d_program(shape=SHAPE3, box=box, swizzle=swizzle, coords=coords),
         lambda inputs: stored(SHAPE3, np.asarray(inputs["tile"]), coords))


def test_tma_store_3d_leaves_the_next_matrix_alone():
    got, inputs = run3(mk.tma_store_3d_program(shape=SHAPE3, coords=(16, 32, 1)),
                       lambda inputs: stored(SHAPE3, np.asarray(inputs["tile"]), (16, 32, 1)))
    assert np.all(got[2] == 0) and np.all(got[0] == 0)
    np.testing.assert_array_equal(got[1, 32:, 16:], np.asarray(inputs["tile"])[0, :8, :56])


@pytest.mark.parametrize("box, coords, swizzle", [((2, 16, 64), (8, 24, 2), 128), ((2, 16, 32), (48, 30, 1), 64),
                                                  ((3, 8, 16), (64, 36, 0), 32)])
def test_tma_store_3d_boxes_of_several_matrices(box, coords, swizzle):
    run3(mk.tma_store_3d_program(shape=SHAPE3, box=box, swizzle=swizzle, coords=coords),
         lambda inputs: stored(SHAPE3, np.asarray(inputs["tile"]), coords))


def test_rank_3_microkernels_refuse_boxes_a_gpu_faults_on():
    with pytest.raises(ValueError, match="16-byte"):
        mk.tma_load_3d_program(coords=(4, 0, 0))
    with pytest.raises(ValueError, match="far"):
        mk.tma_store_3d_program(coords=(0, 0, -1))
    with pytest.raises(ValueError, match="far"):
        mk.tma_store_3d_program(coords=(0, -8, 0))
    with pytest.raises(ValueError, match="batch, rows, cols"):
        mk.tma_load_3d_program(box=(16, 64))


def _replace_tma(program, atom, **changes):
    """The program with its TMA load/store replaced by ``atom`` and the arguments in ``changes``
    (None drops one)."""
    def fix(s):
        if isinstance(s, ir.Seq):
            return ir.Seq(tuple(fix(x) for x in s.body))
        if isinstance(s, ir.If):
            return attrs.evolve(s, then=fix(s.then))
        if isinstance(s, ir.For):
            return attrs.evolve(s, body=fix(s.body))
        if isinstance(s, ir.AtomCall) and s.comment == mk.UNDER_TEST:
            args = {**dict(s.args), **changes}
            return ir.AtomCall(atom, tuple((n, v) for n, v in args.items() if v is not None), 1, s.comment)
        return s
    k = program.kernels[0]
    return attrs.evolve(program, kernels=(attrs.evolve(k, body=fix(k.body)),))


def test_tma_atom_and_map_ranks_must_agree():
    program, inputs, _ = mk.tma_load_3d_program()
    with pytest.raises(HazardError, match="tma_load_2d takes a tensor map of rank 2; tmap_x has rank 3"):
        run_program(_replace_tma(program, sm90a.tma_load_2d, c2=None), inputs)
    program, inputs, _ = mk.tma_store_program()
    with pytest.raises(HazardError, match="tma_store_3d takes a tensor map of rank 3; tmap_out has rank 2"):
        run_program(_replace_tma(program, sm90a.tma_store_3d, c2=ir.Scalar(0)), inputs)


def test_tma_load_3d_completes_the_whole_box_bytes():
    """The mbarrier counts the whole box, out-of-bounds elements included (as the hardware
    does): a box entirely past the last matrix still completes 2048 bytes, and expecting only the
    in-bounds bytes (8 rows x 56 columns of the box at (16, 32, 1)) never completes."""
    run3(mk.tma_load_3d_program(coords=(0, 0, 3)), lambda inputs: np.zeros((1, 16, 64)))
    program, inputs, _ = mk.tma_load_3d_program(coords=(16, 32, 1))
    body = body_of(program)
    issue = body[2]
    expect, load = issue.then.body
    assert expect.arg("bytes").value == 1 * 16 * 64 * 2
    fewer = ir.AtomCall(expect.atom, (("bar", expect.arg("bar")), ("bytes", ir.Scalar(8 * 56 * 2))))
    body[2] = ir.If(issue.cond, ir.Seq([fewer, load]))
    with pytest.raises(HazardError, match="can never complete"):
        run_program(with_body(program, body), inputs)


def test_tma_load_3d_hazards():
    program, inputs, _ = mk.tma_load_3d_program()
    body = body_of(program)
    i = index_of(body, "mbarrier_try_wait")
    wrong = call(sm90a.mbarrier_try_wait, bar=body[i].arg("bar"), parity=ir.Scalar(1))
    with pytest.raises(HazardError, match="parity 1 that can never complete"):
        run_program(with_body(program, body[:i] + [wrong] + body[i + 1:]), inputs)
    early = ir.If(ex.lt(T128, 32), body[i])
    with pytest.raises(HazardError, match="read before mbarrier phase completes"):
        run_program(with_body(program, body[:i] + [early] + body[i + 1:]), inputs)


def test_tma_store_3d_hazards():
    program, inputs, _ = mk.tma_store_3d_program()
    body = body_of(program)
    no_fence = [s for s in body if not (isinstance(s, ir.AtomCall) and s.atom is sm90a.fence_proxy_async)]
    with pytest.raises(HazardError, match="missing fence.proxy.async"):
        run_program(with_body(program, no_fence), inputs)
    issue = body[-1]
    unwaited = ir.If(issue.cond, ir.Seq(issue.then.body[:1]))
    with pytest.raises(HazardError, match="TMA store never waited for"):
        run_program(with_body(program, body[:-1] + [unwaited]), inputs)


# =========================================================================== stmatrix

@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in sm90a.STMATRIX_ATOMS])
def test_stmatrix(atom):
    run(mk.stmatrix_program(atom))


# =========================================================================== clusters

@pytest.mark.parametrize("swizzle, box", [pytest.param(sw, b, id=f"sw{sw}") for sw, b in
                                          ((32, (16, 16)), (64, (16, 32)), (128, (16, 64)))])
def test_multicast_fills_every_block_of_the_cluster(swizzle, box):
    out = run(mk.cluster_multicast_program(swizzle=swizzle, box=box))
    np.testing.assert_array_equal(out[:16], out[16:])


def test_cluster_kernel_prints_its_cluster_dims():
    from firesched.cuda import printer as cuda

    src = cuda.emit(mk.cluster_multicast_program()[0])
    assert "__cluster_dims__(2, 1, 1) micro_tma_multicast(" in src
    assert "multicast::cluster" in src and "mapa.shared::cluster" in src and "barrier.cluster.arrive" in src


def test_an_arrival_on_the_own_block_only_deadlocks_the_cluster():
    with pytest.raises(HazardError, match=r"done\[0\] of block rank 0 .*misses 1 of 2 arrival"):
        run(mk.cluster_multicast_program(remote_arrive=False))


def _replace_atom_args(prog, atom, **new):
    """``prog`` with the arguments ``new`` of every call of ``atom`` replaced."""
    program, inputs, expected = prog

    def walk(s):
        if isinstance(s, ir.Seq):
            return ir.Seq(tuple(walk(x) for x in s.body))
        if isinstance(s, ir.If):
            return attrs.evolve(s, then=walk(s.then))
        if isinstance(s, ir.For):
            return attrs.evolve(s, body=walk(s.body))
        if isinstance(s, ir.AtomCall) and s.atom is atom:
            return attrs.evolve(s, args=tuple((k, new.get(k, v)) for k, v in s.args))
        return s
    k = program.kernels[0]
    return attrs.evolve(program, kernels=(attrs.evolve(k, body=walk(k.body)),)), inputs, expected


def test_a_multicast_mask_outside_the_cluster_is_reported():
    prog = _replace_atom_args(mk.cluster_multicast_program(), sm90a.tma_load_2d_multicast, mask=ir.Scalar(4))
    with pytest.raises(HazardError, match="multicast mask 0x4"):
        run(prog)


def test_a_remote_arrival_outside_the_cluster_is_reported():
    prog = _replace_atom_args(mk.cluster_multicast_program(), sm90a.mbarrier_arrive_cluster, cta=ir.Scalar(2))
    with pytest.raises(HazardError, match="cluster rank 2"):
        run(prog)


def test_a_multicast_to_one_block_leaves_the_other_waiting():
    # each block sends its half to itself only: the other half of every box never lands, so the
    # full barrier keeps waiting for transaction bytes
    prog = mk.cluster_multicast_program()
    program, inputs, expected = prog
    rank = ex.mod(ir.bid(0, 2), 2)
    prog = _replace_atom_args(prog, sm90a.tma_load_2d_multicast, mask=ir.Scalar(ex.binop("<<", 1, rank)))
    with pytest.raises(HazardError, match=r"full\[0\] of block rank 0 .*transaction byte"):
        run(prog)


def test_a_cluster_barrier_in_divergent_code_is_reported():
    program, inputs, expected = mk.cluster_multicast_program()
    k = program.kernels[0]
    body = ir.Seq((ir.If(ex.lt(ir.tid(128), 64), ir.AtomCall(sm90a.barrier_cluster, (), 1, "")),) + k.body.body)
    with pytest.raises(HazardError, match="cluster barrier inside divergent code"):
        run((attrs.evolve(program, kernels=(attrs.evolve(k, body=body),)), inputs, expected))


def test_atom_program_covers_the_table():
    for atom in sm90a.ATOMS:
        if atom.family == sm90a.SETMAXNREG:
            with pytest.raises(ValueError, match="setmaxnreg"):
                mk.atom_program(atom)
            continue
        if atom.family == sm90a.WGMMA and atom.shape[1] not in (8, 256):
            continue
        program, _, _ = mk.atom_program(atom)
        assert any(isinstance(s, ir.AtomCall) and s.atom.name == atom.name
                   for s in _calls(program.kernels[0].body)), atom.name
        run(mk.atom_program(atom))


def _calls(body):
    stack = [body]
    while stack:
        s = stack.pop()
        if isinstance(s, ir.Seq):
            stack.extend(s.body)
        elif isinstance(s, ir.For):
            stack.append(s.body)
        elif isinstance(s, ir.If):
            stack.append(s.then)
        elif isinstance(s, ir.AtomCall):
            yield s


# =========================================================================== planted hazards: wgmma

A8 = sm90a.wgmma_m64n8k16_f16_f32_ss


def test_missing_wgmma_wait_group():
    with pytest.raises(HazardError, match="before wgmma.wait_group") as e:
        run(mk.wgmma_program(A8, wait=False))
    assert "'acc'" in str(e.value) and "st_global" in str(e.value)
    run(mk.wgmma_program(A8))


def test_missing_wgmma_fence():
    with pytest.raises(HazardError, match="missing wgmma.fence"):
        run(mk.wgmma_program(A8, fence=False))
    # registers touched after the fence need another one
    program, inputs, _ = mk.wgmma_program(A8)
    acc = next(b for b in program.kernels[0].regs if b.name == "acc")
    body = body_of(program)
    body.insert(index_of(body, "wgmma_fence") + 1, ir.RegFill(ir.RegRef(acc, 2), 1, 1.0))
    with pytest.raises(HazardError, match="missing wgmma.fence") as e:
        run_program(with_body(program, body), inputs)
    assert "acc[0..3]" in str(e.value) and "RegFill" in str(e.value)


def test_first_wgmma_needs_a_fence_even_on_untouched_registers():
    program, inputs, _ = mk.tma_wgmma_program(8, swizzle=128)
    body = body_of(program)
    del body[index_of(body, "wgmma_fence")]
    with pytest.raises(HazardError, match="first wgmma of the warpgroup"):
        run_program(with_body(program, body), inputs)


def test_missing_proxy_fence_before_wgmma():
    with pytest.raises(HazardError, match="missing fence.proxy.async") as e:
        run(mk.wgmma_program(A8, proxy_fence=False))
    assert "'sA'" in str(e.value) and "st_shared_2" in str(e.value)


def test_rs_fragment_registers_are_in_flight_too():
    program, inputs, _ = mk.wgmma_program(sm90a.wgmma_m64n8k16_f16_f32_rs)
    body = body_of(program)
    frag = next(b for b in program.kernels[0].regs if b.name == "frag_a")
    clobber = ir.RegFill(ir.RegRef(frag, 0), 8, 0.0)
    body.insert(index_of(body, "wgmma_wait"), clobber)
    with pytest.raises(HazardError, match="before wgmma.wait_group"):
        run_program(with_body(program, body), inputs)


def test_overwriting_an_operand_of_an_in_flight_wgmma():
    program, inputs, _ = mk.wgmma_program(A8, swizzle=0)
    sa = program.kernels[0].shared[0]
    stage = program.kernels[0].regs[0]
    body = body_of(program)
    write = call(catalog.copy_atom("RF", "SH", 2), dst=ir.MemRef(sa, T128), src=ir.RegRef(stage, 0))
    body.insert(index_of(body, "wgmma_wait"), write)
    with pytest.raises(HazardError, match="in-flight async operation"):
        run_program(with_body(program, body), inputs)
    body = body_of(program)
    body.insert(index_of(body, "wgmma_wait") + 1, write)   # after the wait: only a WAR race...
    body.insert(index_of(body, "wgmma_wait") + 1, ir.Barrier("operands consumed"))  # ...fixed by a barrier
    run_program(with_body(program, body), inputs)


def test_wgmma_never_waited_for():
    program, inputs, _ = mk.wgmma_program(A8, wait=False)
    body = body_of(program)[:index_of(body_of(program), "wgmma_commit") + 1]
    with pytest.raises(HazardError, match="wgmma never waited for"):
        run_program(with_body(program, body), inputs)


def test_wgmma_from_part_of_a_warpgroup():
    program, inputs, _ = mk.wgmma_program(A8)
    body = body_of(program)
    i = index_of(body, A8.name)
    body[i] = ir.If(ex.lt(T128, 64), body[i])
    with pytest.raises(HazardError, match="part of its thread group"):
        run_program(with_body(program, body), inputs)


def _swap_wgmma(program, **changes):
    body = body_of(program)
    i = index_of(body, A8.name)
    s = body[i]
    args = dict(s.args)
    args.update(changes)
    body[i] = ir.AtomCall(s.atom, tuple(args.items()), s.pred, s.comment)
    return with_body(program, body)


def test_wgmma_descriptor_rules():
    program, inputs, _ = mk.wgmma_program(A8, swizzle=128)
    sa = program.kernels[0].shared[0]
    inside_atom = _swap_wgmma(program, desc_a=ir.DescRef(sa, 64, 128, 16, 1024))     # row 1 of the atom
    with pytest.raises(HazardError, match="swizzle atom"):
        run_program(inside_atom, inputs)
    unaligned = _swap_wgmma(program, desc_a=ir.DescRef(sa, 4, 128, 16, 1024))
    with pytest.raises(HazardError, match="16-byte aligned"):
        run_program(unaligned, inputs)
    outside = _swap_wgmma(program, desc_a=ir.DescRef(sa, 0, 128, 16, 2048))
    with pytest.raises(HazardError, match="outside its buffer"):
        run_program(outside, inputs)
    k_step = _swap_wgmma(program, desc_a=ir.DescRef(sa, 16, 128, 16, 1024))   # +32 bytes: legal
    got = run_program(k_step, inputs)["out"]
    a, b, c = (np.asarray(inputs[x], np.float64) for x in "abc")
    # k 16..31 of each 128-byte row were never written: zeros, so out == c
    np.testing.assert_array_equal(got, c)
    assert not np.array_equal(got, a @ b + c)


def test_wgmma_scale_d_must_be_uniform():
    program, inputs, _ = mk.wgmma_program(A8)
    with pytest.raises(HazardError, match="scale_d differs"):
        run_program(_swap_wgmma(program, scale_d=ir.Scalar(ex.lt(T128, 64))), inputs)


# =========================================================================== planted hazards: mbarrier / TMA

def test_wrong_parity_is_a_deadlock():
    with pytest.raises(HazardError, match="mbarrier wait on parity 1 that can never complete") as e:
        run(mk.tma_load_program(parity=1))
    assert "bar[0]" in str(e.value)
    run(mk.tma_load_program(parity=0))


def test_wait_on_a_stale_phase_then_reading_the_box():
    program, inputs, _ = mk.tma_load_program()
    body = body_of(program)
    wait = body.pop(index_of(body, "mbarrier_try_wait"))
    bar = wait.arg("bar")
    stale = call(sm90a.mbarrier_try_wait, bar=bar, parity=ir.Scalar(1))
    body.insert(2, stale)            # before the TMA is issued: returns at once (phase 0 is open)
    with pytest.raises(HazardError, match="read before mbarrier phase completes") as e:
        run_program(with_body(program, body), inputs)
    assert "parity 0" in str(e.value) and "stale phase" in str(e.value)


def test_only_waiting_threads_may_read():
    program, inputs, _ = mk.tma_load_program()
    body = body_of(program)
    i = index_of(body, "mbarrier_try_wait")
    body[i] = ir.If(ex.lt(T128, 32), body[i])
    with pytest.raises(HazardError, match="read before mbarrier phase completes") as e:
        run_program(with_body(program, body), inputs)
    assert "thread 32" in str(e.value)


def test_missing_proxy_fence_before_tma_store():
    with pytest.raises(HazardError, match="missing fence.proxy.async") as e:
        run(mk.tma_store_program(proxy_fence=False))
    assert "TMA store of thread 0" in str(e.value)


def test_tma_store_never_waited_for():
    with pytest.raises(HazardError, match="TMA store never waited for"):
        run(mk.tma_store_program(wait=None))


def test_tma_store_source_overwritten_before_the_read_wait():
    program, inputs, _ = mk.tma_store_program(wait=None)
    body = body_of(program)
    sm = program.kernels[0].shared[0]
    reg = program.kernels[0].regs[0]
    issue = body[-1]
    overwrite = call(catalog.copy_atom("RF", "SH", 2), dst=ir.MemRef(sm, 0), src=ir.RegRef(reg, 0))
    body[-1] = ir.If(issue.cond, ir.Seq([*issue.then.body, overwrite,
                                         call(catalog.with_immediates(sm90a.tma_wait_read, n=0))]))
    with pytest.raises(HazardError, match="in-flight async operation"):
        run_program(with_body(program, body), inputs)


def _bar_kernel(body, count=1):
    bar = ir.MBarrier("bar", 2)
    out = ir.GlobalBuffer("out", dt.f32, (1,), (1,), "out")
    b = ir.MemRef(bar, 0)
    k = ir.Kernel("bars", params=(out,), grid=(1, 1, 1), threads=128, shared=(bar,),
                  body=ir.Seq(body(b, bar)))
    return ir.Program(kernels=(k,), inputs=(), output=out)


def _init(b, count=1):
    return ir.If(ex.binop("==", T128, 0), call(sm90a.mbarrier_init, bar=b, count=ir.Scalar(count)))


def test_mbarrier_use_before_init():
    p = _bar_kernel(lambda b, bar: [call(sm90a.mbarrier_arrive, bar=b)])
    with pytest.raises(HazardError, match="before mbarrier.init"):
        run_program(p, {})


def test_mbarrier_init_needs_a_barrier_before_other_threads_use_it():
    p = _bar_kernel(lambda b, bar: [_init(b, 128), call(sm90a.mbarrier_arrive, bar=b)])
    with pytest.raises(HazardError, match="not visible yet"):
        run_program(p, {})
    ok = _bar_kernel(lambda b, bar: [_init(b, 128), ir.Barrier(), call(sm90a.mbarrier_arrive, bar=b),
                                     call(sm90a.mbarrier_try_wait, bar=b, parity=ir.Scalar(0))])
    run_program(ok, {})


def test_mbarrier_phases_alternate():
    def body(b, bar):
        out = [_init(b, 128), ir.Barrier()]
        for phase in range(3):
            out += [call(sm90a.mbarrier_arrive, bar=b),
                    call(sm90a.mbarrier_try_wait, bar=b, parity=ir.Scalar(phase % 2))]
        return out
    run_program(_bar_kernel(body), {})

    def wrong(b, bar):
        return [_init(b, 128), ir.Barrier(), call(sm90a.mbarrier_arrive, bar=b),
                call(sm90a.mbarrier_try_wait, bar=b, parity=ir.Scalar(0)),
                call(sm90a.mbarrier_arrive, bar=b),
                call(sm90a.mbarrier_try_wait, bar=b, parity=ir.Scalar(0))]     # phase 1 has parity 1
    with pytest.raises(HazardError, match="parity 0 that can never complete"):
        run_program(_bar_kernel(wrong), {})


def test_arrivals_beyond_the_count():
    def body(b, bar):
        return [_init(b, 1), ir.Barrier(),
                ir.If(ex.binop("==", T128, 0), call(sm90a.mbarrier_arrive_expect_tx, bar=b, bytes=ir.Scalar(64))),
                ir.If(ex.binop("==", T128, 1), call(sm90a.mbarrier_arrive, bar=b))]
    with pytest.raises(HazardError, match="arrival\\(s\\) are all in already"):
        run_program(_bar_kernel(body), {})


def test_tma_load_that_never_completes():
    program, inputs, _ = mk.tma_load_program()
    body = body_of(program)[:3]
    issue = body[2]
    expect = issue.then.body[0]
    more = ir.AtomCall(expect.atom, (("bar", expect.arg("bar")), ("bytes", ir.Scalar(4096))))
    body[2] = ir.If(issue.cond, ir.Seq([more, issue.then.body[1]]))
    with pytest.raises(HazardError, match="TMA load never completed"):
        run_program(with_body(program, body), inputs)
    body.append(call(sm90a.mbarrier_try_wait, bar=expect.arg("bar"), parity=ir.Scalar(0)))
    with pytest.raises(HazardError, match="2048 transaction byte"):
        run_program(with_body(program, body), inputs)


def test_tma_load_into_an_unaligned_destination():
    program, inputs, _ = mk.tma_load_program(swizzle=0)
    body = body_of(program)
    issue = body[2]
    load = issue.then.body[1]
    args = dict(load.args)
    args["dst"] = ir.MemRef(args["dst"].buffer, 8)
    body[2] = ir.If(issue.cond, ir.Seq([issue.then.body[0], ir.AtomCall(load.atom, tuple(args.items()))]))
    with pytest.raises(HazardError, match="misaligned"):
        run_program(with_body(program, body), inputs)


# =========================================================================== setmaxnreg

def _regs_kernel(stmt):
    out = ir.GlobalBuffer("out", dt.f32, (1,), (1,), "out")
    k = ir.Kernel("regs", params=(out,), grid=(1, 1, 1), threads=256, body=ir.Seq([stmt]))
    return ir.Program(kernels=(k,), inputs=(), output=out)


def test_setmaxnreg_by_whole_warpgroups():
    dec = catalog.with_immediates(sm90a.setmaxnreg_dec, n=40)
    inc = catalog.with_immediates(sm90a.setmaxnreg_inc, n=232)
    run_program(_regs_kernel(ir.If(ex.lt(ir.tid(256), 128), ir.AtomCall(dec, ()))), {})
    run_program(_regs_kernel(ir.If(ex.ge(ir.tid(256), 128), ir.AtomCall(inc, ()))), {})
    with pytest.raises(HazardError, match="part of its thread group"):
        run_program(_regs_kernel(ir.If(ex.lt(ir.tid(256), 64), ir.AtomCall(dec, ()))), {})
    with pytest.raises(InternalError, match="24..256"):
        run_program(_regs_kernel(ir.AtomCall(catalog.with_immediates(sm90a.setmaxnreg_inc, n=20), ())), {})
