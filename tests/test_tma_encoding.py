"""The TMA tensor-map encoding on the CPU: the arguments firesched hands ``cuTensorMapEncodeTiled``,
checked against ``cuda.bindings.driver``'s enum members by *name* for every data type and swizzle.

Only the driver call needs a GPU; the argument objects (``CUtensorMapDataType``,
``CUtensorMapSwizzle``, ``cuuint64_t``...) are plain binding values, so a swapped enum (bf16
encoded as FLOAT16, the 64-byte swizzle as 32B), dims given outermost first or a wrong pitch
fail here instead of corrupting data on a device.  The expected names are written from the CUDA
driver API documentation of ``cuTensorMapEncodeTiled``.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda.bindings import driver

import firesched as fs
from firesched import ir
from firesched.hardware import tma
from firesched.runtime import tensor_map_encode_args

#: firesched dtype -> the CU_TENSOR_MAP_DATA_TYPE_* member that carries it.  TMA copies bits:
#: 8-bit types of any kind travel as UINT8, tf32 (an f32 in memory) as FLOAT32.
DATA_TYPE_NAMES = {
    "f16": "FLOAT16", "bf16": "BFLOAT16", "f32": "FLOAT32", "tf32": "FLOAT32", "f64": "FLOAT64",
    "i32": "INT32", "u8": "UINT8", "i8": "UINT8", "f8e4m3": "UINT8", "f8e5m2": "UINT8",
}
#: swizzle span in bytes -> the CU_TENSOR_MAP_SWIZZLE_* member
SWIZZLE_NAMES = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}
ELEM_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "tf32": 4, "f64": 8, "i32": 4, "u8": 1, "i8": 1, "f8e4m3": 1,
              "f8e5m2": 1}

PTR = 0x7F00_0000_1000


def _case(dtype: str, swizzle: int):
    """A valid 2-D view: 40 rows of 200 bytes padded to 256, a box one swizzle span wide."""
    eb = ELEM_BYTES[dtype]
    cols = 200 // eb
    box_cols = (swizzle or 64) // eb
    return (40, cols), (256, eb), (8, box_cols)


@pytest.mark.parametrize("swizzle", sorted(SWIZZLE_NAMES))
@pytest.mark.parametrize("dtype", sorted(DATA_TYPE_NAMES))
def test_encode_arguments(dtype, swizzle):
    shape, strides, box = _case(dtype, swizzle)
    args = tensor_map_encode_args(PTR, dtype, shape, strides, box, swizzle)
    (dt_, rank, addr, dims, gstrides, bdims, estrides, interleave, sw, l2, oob) = args
    assert dt_ == getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{DATA_TYPE_NAMES[dtype]}")
    assert isinstance(dt_, driver.CUtensorMapDataType)
    assert rank == 2 and addr == PTR
    # innermost (contiguous) dimension first: columns, then rows
    assert [int(x) for x in dims] == [shape[1], shape[0]]
    assert all(isinstance(x, driver.cuuint64_t) for x in dims + gstrides)
    # rank - 1 strides, in bytes, of the dimensions above the innermost
    assert [int(x) for x in gstrides] == [strides[0]]
    assert [int(x) for x in bdims] == [box[1], box[0]]
    assert all(isinstance(x, driver.cuuint32_t) for x in bdims + estrides)
    assert [int(x) for x in estrides] == [1, 1]
    assert interleave == driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    assert sw == getattr(driver.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{SWIZZLE_NAMES[swizzle]}")
    assert isinstance(sw, driver.CUtensorMapSwizzle)
    assert l2 == driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B
    # out-of-bounds elements of a box read as zeros (NAN_REQUEST_ZERO_FMA would give NaNs)
    assert oob == driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE


def _case_3d(dtype: str, swizzle: int):
    """A valid (batch, rows, cols) view: 3 matrices of 40 rows of 200 bytes padded to 256, the
    matrices 11264 bytes apart (44 rows: padding between them too, so that no stride is the
    product of the others), a box of one matrix's 8 rows, one swizzle span wide."""
    eb = ELEM_BYTES[dtype]
    return (3, 40, 200 // eb), (11264, 256, eb), (1, 8, (swizzle or 64) // eb)


@pytest.mark.parametrize("swizzle", sorted(SWIZZLE_NAMES))
@pytest.mark.parametrize("dtype", sorted(DATA_TYPE_NAMES))
def test_encode_arguments_of_rank_3(dtype, swizzle):
    shape, strides, box = _case_3d(dtype, swizzle)
    args = tensor_map_encode_args(PTR, dtype, shape, strides, box, swizzle)
    (dt_, rank, addr, dims, gstrides, bdims, estrides, interleave, sw, l2, oob) = args
    assert dt_ == getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{DATA_TYPE_NAMES[dtype]}")
    assert rank == 3 and addr == PTR
    # innermost first: columns, rows, batch
    assert [int(x) for x in dims] == [200 // ELEM_BYTES[dtype], 40, 3]
    assert all(isinstance(x, driver.cuuint64_t) for x in dims + gstrides)
    # rank - 1 = 2 strides in bytes, innermost first: the row pitch, then the matrix pitch
    assert [int(x) for x in gstrides] == [256, 11264]
    assert [int(x) for x in bdims] == [(swizzle or 64) // ELEM_BYTES[dtype], 8, 1]
    assert all(isinstance(x, driver.cuuint32_t) for x in bdims + estrides)
    assert [int(x) for x in estrides] == [1, 1, 1]
    assert interleave == driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    assert sw == getattr(driver.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{SWIZZLE_NAMES[swizzle]}")
    assert l2 == driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B
    assert oob == driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE


@pytest.mark.parametrize("shape, strides, box", [
    ((72,), (2,), (64,)),
    ((40, 72), (144, 2), (16, 64)),
    ((3, 40, 72), (5760, 144, 2), (1, 16, 64)),
    ((2, 3, 40, 72), (17280, 5760, 144, 2), (1, 2, 16, 64)),
    ((2, 2, 3, 40, 72), (69120, 34560, 5760, 144, 2), (2, 1, 1, 16, 64)),
])
def test_encode_arguments_of_every_rank(shape, strides, box):
    """Ranks 1 to 5 (the driver's limit): dims and box reversed, the strides of all but the
    innermost dimension reversed."""
    args = tensor_map_encode_args(PTR, "f16", shape, strides, box, 128)
    r = len(shape)
    assert args[1] == r
    assert [int(x) for x in args[3]] == list(shape)[::-1]
    assert [int(x) for x in args[4]] == list(strides[:-1])[::-1]
    assert [int(x) for x in args[5]] == list(box)[::-1]
    assert [int(x) for x in args[6]] == [1] * r


@pytest.mark.parametrize("kw, match", [
    (dict(strides=(11272, 256, 2)), "stride of dim 0 is 11272 bytes"),
    (dict(strides=(8192, 256, 2)), "smaller than the 40 x 256 bytes of rows"),
    (dict(box=(1, 8, 72)), "larger than the 128-byte swizzle span"),
    (dict(box=(257, 8, 64)), "box dim 0=257"),
    (dict(box=(8, 64)), "must each have 3 entries"),
    (dict(shape=(2, 2, 2, 2, 40, 100), strides=(512,) * 5 + (2,), box=(1,) * 4 + (8, 64)), "1 to 5"),
])
def test_invalid_rank_3_views_are_refused_before_any_driver_call(kw, match):
    args = dict(ptr=PTR, dtype="f16", shape=(3, 40, 100), strides=(11264, 256, 2), box=(1, 8, 64), swizzle=128)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        tensor_map_encode_args(args["ptr"], args["dtype"], args["shape"], args["strides"], args["box"],
                               args["swizzle"])


def test_tables_name_the_driver_members():
    """The codes of ``hardware.tma`` are those of the driver's members of the same meaning."""
    for name, code in tma.TMA_DATA_TYPES.items():
        member = getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{DATA_TYPE_NAMES[name]}")
        assert code == int(member), name
    assert set(tma.TMA_DATA_TYPES) == set(DATA_TYPE_NAMES)
    for span, code in tma.TMA_SWIZZLES.items():
        assert code == int(getattr(driver.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{SWIZZLE_NAMES[span]}"))
    assert set(tma.TMA_SWIZZLES) == set(SWIZZLE_NAMES)


def test_16_bit_types_are_told_apart():
    f16 = tensor_map_encode_args(PTR, "f16", (64, 64), (128, 2), (8, 64), 128)[0]
    bf16 = tensor_map_encode_args(PTR, "bf16", (64, 64), (128, 2), (8, 64), 128)[0]
    assert f16 != bf16
    assert f16.name.endswith("_FLOAT16") and bf16.name.endswith("_BFLOAT16")


@pytest.mark.parametrize("kw, match", [
    (dict(dtype="i4"), "no TMA data type"),
    (dict(ptr=PTR + 8), "16-byte aligned"),
    (dict(ptr=0), "non-null"),
    (dict(strides=(200, 2)), "multiple of 16"),
    (dict(box=(8, 72)), "larger than the 128-byte swizzle span"),
    (dict(box=(257, 64)), "box rows=257"),
])
def test_invalid_views_are_refused_before_any_driver_call(kw, match):
    args = dict(ptr=PTR, dtype="f16", shape=(64, 100), strides=(256, 2), box=(8, 64), swizzle=128)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        tensor_map_encode_args(args["ptr"], args["dtype"], args["shape"], args["strides"], args["box"],
                               args["swizzle"])


def _tensor_maps(program: ir.Program):
    for k in program.kernels:
        for p in k.params:
            if isinstance(p, ir.TensorMapParam):
                yield p


@pytest.mark.parametrize("kw", [
    dict(block_m=128, block_n=256),
    dict(block_m=128, block_n=128, block_k=32, dtype="bf16", layout="RC", out_dtype="f32"),
    dict(block_m=64, block_n=64, block_k=16, warp_specialized=False),
    dict(block_m=128, block_n=256, cluster=2),
])
def test_lowered_tensor_maps_encode(kw):
    """Every tensor map a Hopper program takes encodes: the arguments the runtime would hand the
    driver for its buffer (row-major shape, byte strides) are valid, and swizzled boxes are one
    swizzle span wide, as the shared layouts wgmma reads assume."""
    kw = dict(kw)
    sched = fs.recipes.gemm(1024, 768, 512, kw.pop("dtype", "f16"), arch="sm_90a", **kw)
    maps = list(_tensor_maps(sched.lower("sm_90a")))
    assert maps
    for p in maps:
        b = p.buffer
        eb = b.dtype.bits // 8
        args = tensor_map_encode_args(PTR, b.dtype, b.shape, tuple(x * eb for x in b.strides), p.box, p.swizzle)
        assert [int(x) for x in args[5]] == list(p.box)[::-1]
        if p.swizzle:
            assert p.box[1] * eb == p.swizzle, (p.name, p.box, p.swizzle)
        assert int(args[8]) == int(getattr(driver.CUtensorMapSwizzle,
                                           f"CU_TENSOR_MAP_SWIZZLE_{SWIZZLE_NAMES[p.swizzle]}"))


# --------------------------------------------------------------------------- box coordinates

@pytest.mark.parametrize("dtype, coords, ok", [
    ("f16", (16, 32), True), ("f16", (-8, -3), True), ("f16", (64, 39), True), ("f16", (70, 39), False),
    ("u8", (-4, 36), False), ("u8", (-16, 36), True), ("bf16", (-4, 36), False), ("bf16", (-8, 36), True),
    ("f32", (-4, 36), True), ("f32", (-2, 36), False), ("f16", (8, -3), True), ("f16", (4, 0), False),
    ("f16", (2 ** 31 - 8, 0), True), ("f16", (2 ** 31, 0), False), ("f16", (0, -2 ** 31), True),
    ("f16", (0, -2 ** 31 - 1), False),
])
def test_load_box_must_start_on_a_16_byte_boundary(dtype, coords, ok):
    """A TMA box must start on a 16-byte boundary along the contiguous dimension (column); the
    row coordinate is free, negative included; coordinates are signed 32-bit.  Misaligned boxes
    stopped an H100 with an illegal instruction (tests/gpu/tma_edges.py)."""
    problems = tma.tma_coordinate_problems(ELEM_BYTES[dtype], coords)
    assert (problems == []) == ok, problems


@pytest.mark.parametrize("coords, ok", [((0, 0), True), ((56, 30), True), ((-8, 0), False), ((0, -4), False),
                                        ((-8, -4), False), ((60, 30), False), ((0, -1), False)])
def test_store_box_must_not_start_before_the_tensor(coords, ok):
    """Stores may hang over the far edges only: an aligned store at column -8 or row -4 stopped an
    H100 with an illegal instruction, one at (56, 30) over the far corner ran correctly."""
    problems = tma.tma_coordinate_problems(2, coords, store=True)
    assert (problems == []) == ok, problems


@pytest.mark.parametrize("coords, store, ok", [
    ((16, 32, 1), False, True), ((-8, -3, -1), False, True), ((0, 0, 5), False, True), ((4, 0, 0), False, False),
    ((16, 32, 1), True, True), ((0, 0, 3), True, True), ((0, 0, -1), True, False), ((0, -8, 0), True, False),
    ((0, 0, 2 ** 31), False, False), ((0, 0, -2 ** 31), False, True),
])
def test_rank_3_box_coordinates(coords, store, ok):
    """(column, row, batch): the column alone must be 16-byte aligned, a store starts at no
    negative coordinate of any dimension, every coordinate is signed 32-bit."""
    problems = tma.tma_coordinate_problems(2, coords, store=store)
    assert (problems == []) == ok, problems


def test_coordinates_of_the_wrong_rank():
    assert tma.tma_coordinate_problems(2, (0, 0, 0), rank=2) == ["coordinates (0, 0, 0) must have 2 entries (column, row)"]
    assert tma.tma_coordinate_problems(2, (0, 0), rank=3) == [
        "coordinates (0, 0) must have 3 entries (column, row, dim 0)"]
    assert "1 to 5" in tma.tma_coordinate_problems(2, (0,) * 6)[0]
    assert tma.tma_coordinate_problems(2, (0, 1.5, 0)) == ["the row coordinate 1.5 is not a signed 32-bit integer"]


def test_microkernels_refuse_boxes_a_gpu_faults_on():
    from firesched.testing import microkernel as mk

    with pytest.raises(ValueError, match="16-byte"):
        mk.tma_load_program("f16", coords=(70, 39))
    with pytest.raises(ValueError, match="16-byte"):
        mk.tma_store_program("f16", coords=(4, 0))
    with pytest.raises(ValueError, match="far"):
        mk.tma_store_program("f16", coords=(-8, -4))
    with pytest.raises(ValueError, match="16-byte"):
        mk.cluster_multicast_program("f16", coords=(4, 16))
    program, inputs, expected = mk.tma_load_program("f16", coords=(64, 39))
    got = fs.simulate.run_program(program, inputs)[program.output.name]
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(expected(inputs), np.float64))
