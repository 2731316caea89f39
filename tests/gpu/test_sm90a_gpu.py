"""The sm_90a microkernels on a Hopper GPU: the programs the interpreter tests run
(``tests/test_sm90a_interp.py``), printed, compiled for sm_90a, launched through
``firesched.runtime`` on real buffers (tensor maps from ``encode_tensor_map``, of rank 2 or 3) and
compared with numpy bit for bit (the inputs are small multiples of 1/4, so every sum is exact).

What a failure here points at:
* ``test_dynamic_shared_memory_is_1024_aligned`` — the swizzle model assumes the dynamic shared
  window starts on a 1024-byte boundary; every swizzled case depends on it;
* wgmma ss/rs with ``swizzle=0`` only — the interleaved (core-matrix) LBO/SBO convention;
* one swizzle mode only — its XOR pattern or its descriptor mode code;
* ``_tnspb`` only — the MN-major canonical layouts;
* everything wgmma — the D fragment layout or the descriptor bit fields;
* TMA load/store — the box layout in shared memory, the coordinate order, the tensor-map encoding;
* rank-3 TMA only — the (column, row, batch) coordinate order, the driver's dims/strides order for
  rank 3, or the out-of-bounds rule along the batch (a box past the last matrix, rows past a
  matrix that must not reach the next one).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from firesched import ir
from firesched.cuda import printer as cuda
from firesched.cuda.nvrtc import compile_cuda
from firesched.hardware import sm90a
from firesched.runtime import device_info, encode_tensor_map, encode_tensor_map_2d, load_module
from firesched.testing import microkernel as mk

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module", autouse=True)
def hopper():
    major, minor = device_info(0).compute_capability
    if (major, minor) != (9, 0):
        pytest.skip(f"needs an sm_90 device (H100/H200); device 0 is compute capability {major}.{minor}")


def _buffers(program: ir.Program) -> dict[str, ir.GlobalBuffer]:
    out: dict[str, ir.GlobalBuffer] = {}
    for b in (*program.inputs, program.output):
        out.setdefault(b.name, b)
    for k in program.kernels:
        for p in k.params:
            b = p.buffer if isinstance(p, ir.TensorMapParam) else p
            out.setdefault(b.name, b)
    return out


def run_gpu(program: ir.Program, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Launch every kernel of ``program`` on buffers holding ``inputs`` (zeros elsewhere, as the
    interpreter starts them); return the output buffer."""
    module = load_module(compile_cuda(cuda.emit(program), arch="sm_90a"))
    dev: dict[str, torch.Tensor] = {}
    for name, b in _buffers(program).items():
        assert b.strides == tuple(int(np.prod(b.shape[i + 1:])) for i in range(len(b.shape))), \
            f"{name}: the harness handles row-major buffers"
        host = np.zeros(b.size, dtype=b.dtype.np)
        if name in inputs:
            host[:] = np.asarray(inputs[name]).astype(b.dtype.np).reshape(-1)
        dev[name] = torch.from_numpy(host.view(np.uint8).copy()).to("cuda")
    for k in program.kernels:
        args = []
        for p in k.params:
            if isinstance(p, ir.TensorMapParam):
                g = p.buffer
                eb = g.dtype.bits // 8
                blob = encode_tensor_map(dev[g.name].data_ptr(), g.dtype, g.shape, tuple(x * eb for x in g.strides),
                                         p.box, p.swizzle)
                args.append((blob, None))
            else:
                args.append((dev[p.name].data_ptr(), ctypes.c_void_p))
        module.kernel(k.name).launch(tuple(k.grid), (k.threads, 1, 1), args, shared_bytes=k.shared_bytes)
    torch.cuda.synchronize()
    out = program.output
    return dev[out.name].cpu().numpy().view(out.dtype.np).reshape(out.shape)


def check(prog):
    program, inputs, expected = prog
    got = run_gpu(program, inputs)
    want = expected(inputs)
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))
    return got


# =========================================================================== the environment

SMEM_BASE = r"""
extern "C" __global__ void smem_base(unsigned* out) {
    extern __shared__ __align__(1024) unsigned char smem[];
    smem[threadIdx.x] = 0;
    out[0] = (unsigned)__cvta_generic_to_shared(smem);
}
"""


def test_dynamic_shared_memory_is_1024_aligned():
    module = load_module(compile_cuda(SMEM_BASE, arch="sm_90a"))
    out = torch.zeros(4, dtype=torch.int32, device="cuda")
    module.kernel("smem_base").launch((1, 1, 1), (32, 1, 1), [(out.data_ptr(), ctypes.c_void_p)],
                                      shared_bytes=9216)
    torch.cuda.synchronize()
    base = int(out[0].item())
    assert base % 1024 == 0, f"dynamic shared memory starts at shared address {base:#x}"


def test_encode_tensor_map_is_128_bytes():
    x = torch.zeros(40 * 72, dtype=torch.float16, device="cuda")
    blob = encode_tensor_map_2d(x.data_ptr(), "f16", (40, 72), (144, 2), (16, 64), 128)
    assert isinstance(blob, bytes) and len(blob) == 128 and any(blob)
    with pytest.raises(ValueError, match="multiple of 16"):
        encode_tensor_map_2d(x.data_ptr(), "f16", (40, 72), (146, 2), (16, 64), 128)


# =========================================================================== wgmma

@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("n", [8, 64, 256])
@pytest.mark.parametrize("ab", ["f16", "bf16"])
def test_wgmma_ss(ab, n, swizzle):
    check(mk.wgmma_program(sm90a.wgmma_atom(n, ab), swizzle=swizzle))


@pytest.mark.parametrize("n, swizzle", [(8, 0), (16, 0), (64, 0), (64, 32), (64, 64), (64, 128), (256, 128),
                                        (256, 32)])
def test_wgmma_ss_with_mn_major_b(n, swizzle):
    check(mk.wgmma_program(sm90a.wgmma_atom(n, "f16", b_mn_major=True), swizzle=swizzle))


@pytest.mark.parametrize("n, ab, swizzle, tnsp", [
    (8, "f16", 0, False), (64, "bf16", 128, False), (256, "f16", 64, False), (24, "bf16", 32, False),
    (64, "f16", 128, True), (16, "bf16", 0, True),
])
def test_wgmma_rs(n, ab, swizzle, tnsp):
    check(mk.wgmma_program(sm90a.wgmma_atom(n, ab, a_in_registers=True, b_mn_major=tnsp), swizzle=swizzle))


def test_wgmma_scale_d_zero():
    check(mk.wgmma_program(sm90a.wgmma_m64n32k16_f16_f32_ss, scale_d=0))


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("ab", ["f16", "bf16"])
def test_tma_then_wgmma_with_k_steps(ab, swizzle):
    check(mk.tma_wgmma_program(64, ab, swizzle=swizzle))


@pytest.mark.parametrize("n", [8, 256])
def test_tma_then_wgmma_extreme_n(n):
    check(mk.tma_wgmma_program(n, "f16", swizzle=128))


# =========================================================================== TMA, stmatrix

BOXES = {0: (16, 64), 32: (16, 16), 64: (16, 32), 128: (16, 64)}


# Boxes over every edge of the tensor.  Measured on an H100 (tests/gpu/tma_edges.py, 2026-11-23):
# a box that does not start on a 16-byte boundary of the row, and a store at a negative
# coordinate, stop the kernel with "an illegal instruction was encountered" (which poisons the
# CUDA context); firesched refuses them (hardware.tma.tma_coordinate_problems) and
# test_refused_boxes_fault runs each in its own process to keep that refusal honest.
@pytest.mark.parametrize("coords", [(0, 0), (16, 32), (-8, -3), (64, 39)])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_load(swizzle, coords):
    check(mk.tma_load_program(swizzle=swizzle, box=BOXES[swizzle], coords=coords))


@pytest.mark.parametrize("dtype, shape, box, swizzle, coords", [("f32", (40, 72), (8, 32), 128, (-4, 36)),
                                                               ("u8", (40, 80), (16, 64), 64, (-16, 36)),
                                                               ("bf16", (40, 72), (8, 16), 32, (-8, 36))])
def test_tma_load_other_dtypes(dtype, shape, box, swizzle, coords):
    check(mk.tma_load_program(dtype, shape=shape, box=box, swizzle=swizzle, coords=coords))


def test_tma_load_with_every_thread_arriving():
    check(mk.tma_load_program(arrivals="all"))


@pytest.mark.parametrize("coords", [(16, 32), (56, 30), (8, 39)])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_store(swizzle, coords):
    check(mk.tma_store_program(swizzle=swizzle, box=BOXES[swizzle], coords=coords))


def _refused(case) -> bool:
    from firesched.hardware.tma import tma_coordinate_problems

    kind, dtype, _, _, _, coords = case
    return bool(tma_coordinate_problems({"f16": 2, "bf16": 2, "u8": 1, "f32": 4}[dtype], coords, store=kind == "store"))


def _edge_cases(refused: bool):
    from tma_edges import CASES

    return [pytest.param(c, id=f"{c[0]}-{c[1]}-sw{c[4]}-at{c[5][0]}_{c[5][1]}") for c in CASES if _refused(c) == refused]


@pytest.mark.parametrize("case", _edge_cases(refused=True))
def test_refused_boxes_fault(case):
    """Each box firesched refuses does fault on the GPU (run in its own process): if one ever
    runs correctly, the refusal is stricter than the hardware and can be relaxed."""
    from tma_edges import in_subprocess

    rc, last = in_subprocess(case)
    assert rc == 2, f"expected an illegal instruction, got exit {rc}: {last}"


@pytest.mark.parametrize("case", _edge_cases(refused=False))
def test_accepted_edge_boxes_run(case):
    from tma_edges import in_subprocess

    rc, last = in_subprocess(case)
    assert rc == 0, f"exit {rc}: {last}"


def test_encode_rank_3_tensor_map_is_128_bytes():
    x = torch.zeros(3 * 40 * 72, dtype=torch.float16, device="cuda")
    blob = encode_tensor_map(x.data_ptr(), "f16", (3, 40, 72), (5760, 144, 2), (1, 16, 64), 128)
    assert isinstance(blob, bytes) and len(blob) == 128 and any(blob)
    assert blob != encode_tensor_map_2d(x.data_ptr(), "f16", (120, 72), (144, 2), (16, 64), 128)


# --------------------------------------------------------------------------- rank 3: (batch, rows, cols)
# The same programs as tests/test_sm90a_interp.py, against numpy references written here.

def _overlap(c: int, n: int, extent: int):
    lo, hi = max(c, 0), min(c + n, extent)
    hi = max(hi, lo)
    return slice(lo, hi), slice(lo - c, hi - c)


def _box_of(x: np.ndarray, box, coords) -> np.ndarray:
    """numpy: the box of x at (column, row, batch) = coords, zeros wherever it leaves x."""
    out = np.zeros(box, dtype=x.dtype)
    cuts = [_overlap(c, n, e) for c, n, e in zip(coords[::-1], box, x.shape)]
    out[tuple(b for _, b in cuts)] = x[tuple(t for t, _ in cuts)]
    return out


def _stored(shape, tile: np.ndarray, coords) -> np.ndarray:
    """numpy: zeros of ``shape`` after writing tile at (column, row, batch), dropping the outside."""
    out = np.zeros(shape, dtype=tile.dtype)
    cuts = [_overlap(c, n, e) for c, n, e in zip(coords[::-1], tile.shape, shape)]
    out[tuple(t for t, _ in cuts)] = tile[tuple(b for _, b in cuts)]
    return out


def _check_against(prog, reference):
    program, inputs, _ = prog
    got = run_gpu(program, inputs)
    want = reference(inputs)
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))
    return got, inputs


SHAPE3 = (3, 40, 72)


# over the bottom-right of matrix 1 (its rows 40.. must not come from matrix 2), the top-left of
# matrix 0, the far corner of the last matrix, before the first matrix, past the last one
@pytest.mark.parametrize("coords", [(0, 0, 0), (16, 32, 1), (-8, -3, 0), (64, 39, 2), (8, 4, -1), (0, 0, 3)])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_load_3d(swizzle, coords):
    box = (1, *BOXES[swizzle])
    got, inputs = _check_against(mk.tma_load_3d_program(shape=SHAPE3, box=box, swizzle=swizzle, coords=coords),
                                 lambda inputs: _box_of(np.asarray(inputs["x"]).astype(np.float16), box, coords))
    if coords == (16, 32, 1):
        assert np.all(got[0, 8:] == 0) and np.any(np.asarray(inputs["x"])[2, :8, :64] != 0), \
            "rows past matrix 1 came from matrix 2"


@pytest.mark.parametrize("box, coords, swizzle", [((2, 16, 64), (8, 24, 2), 128), ((2, 16, 64), (8, 24, -1), 128),
                                                  ((2, 16, 32), (32, 30, 0), 64), ((3, 8, 16), (-8, 36, 1), 32),
                                                  ((2, 8, 64), (56, -4, 1), 0)])
def test_tma_load_3d_boxes_of_several_matrices(box, coords, swizzle):
    _check_against(mk.tma_load_3d_program(shape=SHAPE3, box=box, swizzle=swizzle, coords=coords),
                   lambda inputs: _box_of(np.asarray(inputs["x"]).astype(np.float16), box, coords))


@pytest.mark.parametrize("dtype, shape, box, swizzle, coords", [("f32", (2, 40, 72), (1, 8, 32), 128, (-4, 36, 1)),
                                                               ("u8", (2, 40, 80), (1, 16, 64), 64, (-16, 36, 1)),
                                                               ("bf16", (3, 40, 72), (2, 8, 16), 32, (-8, 36, 2))])
def test_tma_load_3d_other_dtypes(dtype, shape, box, swizzle, coords):
    from firesched import dtypes as dt

    npd = dt.dtype(dtype).np
    _check_against(mk.tma_load_3d_program(dtype, shape=shape, box=box, swizzle=swizzle, coords=coords),
                   lambda inputs: _box_of(np.asarray(inputs["x"]).astype(npd), box, coords))


# rank 4 and 5 (attention's (batch, heads, keys, head dim) K and V): an inner matrix's box hanging
# over its far edges, a box of two matrices of the second dim, and one past the outermost dim
@pytest.mark.parametrize("shape, box, coords", [((2, 3, 40, 72), (1, 1, 16, 64), (16, 32, 2, 1)),
                                                ((2, 3, 40, 72), (1, 2, 8, 64), (8, 36, 1, 0)),
                                                ((2, 3, 40, 72), (1, 1, 16, 64), (0, 0, 0, 2)),
                                                ((2, 2, 3, 40, 72), (1, 1, 2, 8, 64), (8, 36, 1, 1, 1))])
def test_tma_load_rank_4_and_5(shape, box, coords):
    from firesched.ir.rewrite import walk

    rank = len(shape)
    prog, inputs, expected = mk.tma_load_nd_program(shape=shape, box=box, coords=coords)
    assert any(isinstance(st, ir.AtomCall) and st.atom.name == f"tma_load_{rank}d"
               for st in walk([prog.kernels[0].body]))
    np.testing.assert_array_equal(run_gpu(prog, inputs), expected(inputs))


# stores at non-negative coordinates only (negative ones fault in 2-D: see tma_edges.py); a box
# wholly past the last matrix is not here, it runs in its own process below
@pytest.mark.parametrize("coords", [(0, 0, 0), (16, 32, 1), (56, 30, 2), (8, 39, 0)])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_store_3d(swizzle, coords):
    box = (1, *BOXES[swizzle])
    got, _ = _check_against(mk.tma_store_3d_program(shape=SHAPE3, box=box, swizzle=swizzle, coords=coords),
                            lambda inputs: _stored(SHAPE3, np.asarray(inputs["tile"]).astype(np.float16), coords))
    if coords == (16, 32, 1):
        assert np.all(got[2] == 0), "rows past matrix 1 reached matrix 2"


@pytest.mark.parametrize("box, coords, swizzle", [((2, 16, 64), (8, 24, 2), 128), ((2, 16, 32), (48, 30, 1), 64),
                                                  ((3, 8, 16), (64, 36, 0), 32)])
def test_tma_store_3d_boxes_of_several_matrices(box, coords, swizzle):
    _check_against(mk.tma_store_3d_program(shape=SHAPE3, box=box, swizzle=swizzle, coords=coords),
                   lambda inputs: _stored(SHAPE3, np.asarray(inputs["tile"]).astype(np.float16), coords))


_WHOLLY_PAST = r"""
import sys
import numpy as np
sys.path.insert(0, {here!r})
from test_sm90a_gpu import run_gpu
from firesched.testing import microkernel as mk
program, inputs, _ = mk.tma_store_3d_program(coords=(0, 0, 3))
try:
    got = run_gpu(program, inputs)
except Exception as e:  # a fault surfaces at the launch or the synchronize
    print(f"fault: {{type(e).__name__}}: {{e}}")
    sys.exit(2)
sys.exit(0 if not np.any(np.asarray(got, np.float64)) else 1)
"""


def test_tma_store_3d_wholly_past_the_last_matrix():
    """A store whose box lies entirely past the last matrix writes nothing (the interpreter's
    model).  Run in its own process: a TMA fault would poison this process's CUDA context."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _WHOLLY_PAST.format(here=here)], capture_output=True, text=True,
                       timeout=120, cwd=root, env=env)
    assert r.returncode == 0, f"exit {r.returncode} (1: data written, 2: a fault): {r.stdout}{r.stderr}"


@pytest.mark.parametrize("wait", ["read", "all"])
def test_tma_store_waits(wait):
    check(mk.tma_store_program(wait=wait))


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_multicast_in_a_cluster_of_two(swizzle):
    """__cluster_dims__, a TMA multicast from each block into both, mapa + remote mbarrier
    arrivals and barrier.cluster: both blocks must hold the whole box."""
    got = check(mk.cluster_multicast_program(swizzle=swizzle, box=BOXES[swizzle]))
    np.testing.assert_array_equal(got[:16], got[16:])


@pytest.mark.parametrize("atom", [pytest.param(a, id=a.name) for a in sm90a.STMATRIX_ATOMS])
def test_stmatrix(atom):
    check(mk.stmatrix_program(atom))
