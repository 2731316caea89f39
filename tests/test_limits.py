"""Every resource limit a check enforces, tested exactly at the limit and one past it.

An off-by-one in a limit (``>`` for ``>=``, 65536 for 65535) refuses a legal schedule or lets an
illegal launch through to the driver, where it fails far from its cause.  For limits that are
target properties (shared memory, registers, threads, the setmaxnreg budget) the schedule stays
fixed and the target is made to fit it exactly: the check's own error reports the amount the
schedule needs, a target with exactly that much accepts it and one with a unit less refuses it.
Hardware limits that are constants (grid dimensions, TMA boxes, descriptor fields, setmaxnreg's
range, named barriers, warps per block) are met by schedules or values built to sit on them.
"""

from __future__ import annotations

import attrs
import pytest

import firesched as fs
from firesched import ir
from firesched.errors import LaunchError, ScheduleError
from firesched.hardware import catalog, sm80, tma
from firesched.hardware import descriptors as desc
from firesched.hardware.target import SM80, SM90A
from firesched.runtime import ArgSpec, DeviceArray, check_args, check_block_size
from firesched.strategies import (
    done,
    move_to_regs,
    move_to_smem,
    pipeline,
    tile,
    to_blocks,
    to_warps,
    warp_specialize,
)

SM80_SMALL = dict(block_m=16, block_n=16, block_k=16, warps_m=1, warps_n=1, stages=1, atoms="sm80",
                  arch="sm_80")


def _exact(sched, target, field: str):
    """The least value of target attribute ``field`` that ``sched`` checks against: start from 1
    and raise the limit to what each refusal reports until the check passes (several checks may
    guard one resource; the last to bind decides)."""
    lim = 1
    for _ in range(8):
        try:
            sched.check(attrs.evolve(target, **{field: lim}))
            return lim
        except ScheduleError as e:
            assert isinstance(e.value, int) and e.value > lim, (field, lim, e.value, str(e))
            lim = e.value
    raise AssertionError(f"{field}: no fixed point")


# =========================================================================== target limits

@pytest.mark.parametrize("field, kw", [
    ("smem_per_block_optin", dict(block_m=64, block_n=64, block_k=32, stages=3)),
    ("smem_per_block_optin", dict(block_m=128, block_n=128, block_k=32, stages=4, split_k_warps=2)),
    ("regs_per_thread", dict(block_m=128, block_n=128, block_k=32, stages=3)),
    ("regs_per_thread", dict(block_m=64, block_n=128, block_k=64, warps_m=1, warps_n=2, stages=2)),
    ("max_threads_per_block", dict(block_m=128, block_n=128, block_k=32, warps_m=4, warps_n=2, stages=2)),
])
def test_sm80_resources_at_the_limit(field, kw):
    sched = fs.recipes.gemm(256, 256, 256, atoms="sm80", check=False, **kw)
    need = _exact(sched, SM80, field)
    sched.check(attrs.evolve(SM80, **{field: need}))
    with pytest.raises(ScheduleError) as e:
        sched.check(attrs.evolve(SM80, **{field: need - 1}))
    assert e.value.value == need


@pytest.mark.parametrize("kw", [dict(block_m=128, block_n=128), dict(block_m=64, block_n=256, warp_specialized=False),
                                dict(block_m=128, block_n=256, cluster=2)])
def test_sm90_shared_memory_at_the_limit(kw):
    sched = fs.recipes.gemm(512, 512, 512, arch="sm_90a", stages=3, check=False, **kw)
    need = _exact(sched, SM90A, "smem_per_block_optin")
    sched.check(attrs.evolve(SM90A, smem_per_block_optin=need))
    with pytest.raises(ScheduleError, match="shared memory"):
        sched.check(attrs.evolve(SM90A, smem_per_block_optin=need - 1))


def test_the_staged_tiles_alone_are_checked_exactly():
    """The early estimate (staged tiles only) accepts a target with exactly that much."""
    sched = fs.recipes.gemm(256, 256, 256, atoms="sm80", check=False, block_m=64, block_n=64, block_k=32, stages=3, arch="sm_80")
    with pytest.raises(ScheduleError, match="the staged tiles alone") as e:
        sched.check(attrs.evolve(SM80, smem_per_block_optin=1))
    staged = e.value.value
    try:
        sched.check(attrs.evolve(SM80, smem_per_block_optin=staged))
    except ScheduleError as e2:
        assert "the staged tiles alone" not in str(e2)
    with pytest.raises(ScheduleError, match="the staged tiles alone"):
        sched.check(attrs.evolve(SM80, smem_per_block_optin=staged - 1))


@pytest.mark.parametrize("block_m, producer, most", [(128, 40, 232), (192, 40, 152), (256, 40, 104), (256, 24, 112)])
def test_setmaxnreg_budget_at_the_limit(block_m, producer, most):
    """The consumers may take what the launch gave the block (its threads x the registers ptxas
    compiles each to: the file over the threads, in 8s) less the producer's share; asking for
    more would block setmaxnreg.inc for ever (four consumer warpgroups at 112 hung an H100)."""
    from firesched.lower.transforms.specialize import consumer_regs_for

    assert consumer_regs_for(SM90A, block_m // 64, producer, cap=255) == most
    fs.recipes.gemm(512, 512, 512, arch="sm_90a", block_m=block_m, block_n=128, warp_specialized=True,
                    producer_regs=producer, consumer_regs=most)
    with pytest.raises(ScheduleError, match="setmaxnreg budget") as e:
        fs.recipes.gemm(512, 512, 512, arch="sm_90a", block_m=block_m, block_n=128, warp_specialized=True,
                        producer_regs=producer, consumer_regs=most + 8)
    assert e.value.field == "consumer_regs" and f"<= {most}" in str(e.value)


def test_the_recipe_gives_four_consumer_warpgroups_what_the_launch_holds():
    sched = fs.recipes.gemm(512, 256, 256, arch="sm_90a", block_m=256, block_n=128, warp_specialized=True)
    assert "consumers 104" in str(sched)


# =========================================================================== grid

def _batched(batch):
    spec = fs.MatMul.kernel(16, 16, 16, batch=batch)
    return spec.schedule(tile(b=1, m=16, n=16) >> to_blocks(), tile(k=16), move_to_smem("A"), move_to_smem("B"),
                         pipeline(1), tile(m=16, n=16) >> to_warps(1, 1), move_to_regs("A"), move_to_regs("B"),
                         tile(m=16, n=8, k=16) >> done(sm80.mma_m16n8k16_f16_f32))


def test_grid_y_at_the_limit():
    (k,) = fs.recipes.gemm(16 * 65535, 16, 16, **SM80_SMALL).lower("sm_80").kernels
    assert k.grid == (1, 65535, 1)
    with pytest.raises(ScheduleError, match="grid dimension y") as e:
        fs.recipes.gemm(16 * 65536, 16, 16, **SM80_SMALL)
    assert (e.value.field, e.value.value) == ("gridDim.y", 65536)


def test_grid_z_at_the_limit():
    (k,) = _batched(65535).lower("sm_80").kernels
    assert k.grid == (1, 1, 65535)
    with pytest.raises(ScheduleError, match="grid dimension z"):
        _batched(65536).check("sm_80")


def test_grid_x_at_the_limit():
    (k,) = fs.recipes.gemm(16, 16 * (2 ** 31 - 1), 16, check=False, **SM80_SMALL).lower("sm_80").kernels
    assert k.grid == (2 ** 31 - 1, 1, 1)
    with pytest.raises(ScheduleError, match="grid dimension x"):
        fs.recipes.gemm(16, 16 * 2 ** 31, 16, **SM80_SMALL)


# =========================================================================== strategies

def _block_chain(bm, warps_m, stages=2):
    spec = fs.MatMul.kernel(bm, 64, 64)
    return spec.schedule(tile(m=bm, n=64) >> to_blocks(), tile(k=32), move_to_smem("A"), move_to_smem("B"),
                         pipeline(stages), tile(m=bm // warps_m, n=64) >> to_warps(warps_m, 1))


def test_warps_per_block_at_the_limit():
    _block_chain(16 * 32, 32)
    with pytest.raises(ScheduleError, match="at most 32"):
        _block_chain(16 * 33, 33)


def test_pipeline_stages_at_the_limit():
    from firesched.strategies.pipeline import MAX_STAGES

    _block_chain(64, 2, stages=MAX_STAGES)
    _block_chain(64, 2, stages=1)
    for bad in (MAX_STAGES + 1, 0):
        with pytest.raises(ScheduleError, match="stages"):
            _block_chain(64, 2, stages=bad)


def _ws_chain(producer, consumer):
    from firesched.hardware.atoms import sm90a

    spec = fs.MatMul.kernel(256, 256, 256)
    return spec.schedule(tile(m=128, n=128) >> to_blocks(), tile(k=64),
                         move_to_smem("A", via=(sm90a.tma_load_2d,)), move_to_smem("B", via=(sm90a.tma_load_2d,)),
                         pipeline(stages=3), warp_specialize(producer_regs=producer, consumer_regs=consumer))


@pytest.mark.parametrize("producer, consumer, ok", [
    (24, 24, True), (24, 256, True), (16, 232, False), (24, 264, False), (40, 40, True), (48, 40, False),
    (25, 232, False), (40, 233, False),
])
def test_setmaxnreg_counts_at_the_limits(producer, consumer, ok):
    """setmaxnreg takes 24..256 registers in steps of 8; the producer gives, never takes."""
    if ok:
        _ws_chain(producer, consumer)
    else:
        with pytest.raises(ScheduleError):
            _ws_chain(producer, consumer)


def test_split_k_parts_at_the_limit():
    """Parts are multiples of 64 of K: K = 64 p splits into p parts, one element less does not."""
    from firesched.strategies import split_k

    for parts in (2, 3, 4, 8):
        fs.MatMul.kernel(64, 64, 64 * parts).schedule(split_k(parts, across=fs.BLOCK))
        with pytest.raises(ScheduleError, match="parts"):
            fs.MatMul.kernel(64, 64, 64 * parts - 64).schedule(split_k(parts, across=fs.BLOCK))


def test_tile_as_large_as_the_extent():
    spec = fs.MatMul.kernel(128, 64, 64)
    sched = spec.schedule(tile(m=128, n=64) >> to_blocks(), tile(k=32), move_to_smem("A"), move_to_smem("B"))
    sched.apply(tile(m=128, n=64))
    with pytest.raises(ScheduleError, match="larger than"):
        sched.apply(tile(m=144, n=64))


@pytest.mark.parametrize("sw, ok", [(fs.Swizzle(3, 3, 5), True), (fs.Swizzle(3, 3, 6), False),
                                    (fs.Swizzle(2, 3, 6), True), (fs.Swizzle(2, 3, 7), False),
                                    (fs.Swizzle(3, 3, 3), True), (fs.Swizzle(1, 2, 3), False)])
def test_user_swizzle_limits(sw, ok):
    """A swizzle permutes blocks of 2**(bits+base+shift) elements, at most the tile (64 x 32 f16 =
    2048 = 2**11), and moves whole 16-byte chunks (base >= 3 for f16)."""
    spec = fs.MatMul.kernel(64, 64, 64)
    sched = spec.schedule(tile(m=64, n=64) >> to_blocks(), tile(k=32))
    if ok:
        sched.apply(move_to_smem("A", swizzle=sw))
    else:
        with pytest.raises(ScheduleError, match="swizzle"):
            sched.apply(move_to_smem("A", swizzle=sw))


# =========================================================================== hardware formats

@pytest.mark.parametrize("box, ok", [((256, 64), True), ((257, 64), False), ((1, 64), True), ((0, 64), False),
                                     ((8, 256), True), ((8, 257), False)])
def test_tma_box_extents(box, ok):
    eb = 1                                  # u8: 256 columns is a 256-byte row, no swizzle
    problems = tma.tma_box_problems(eb, (1024, 1024), (1024, eb), box, 0)
    assert (problems == []) == ok, problems


@pytest.mark.parametrize("shape, ok", [((2 ** 32, 8), True), ((2 ** 32 + 1, 8), False), ((8, 2 ** 32), True),
                                       ((0, 8), False)])
def test_tma_dims(shape, ok):
    stride = max(16, shape[1]) if shape[1] < 2 ** 32 else 2 ** 32
    problems = tma.tma_box_problems(1, shape, (stride, 1), (8, 16), 0)
    assert (problems == []) == ok, problems


@pytest.mark.parametrize("stride, ok", [(2 ** 40 - 16, True), (2 ** 40, False), (16, True), (0, False), (24, False)])
def test_tma_row_stride(stride, ok):
    problems = tma.tma_box_problems(2, (8, 8), (stride, 2), (8, 8), 0)
    assert (problems == []) == ok, problems


@pytest.mark.parametrize("swizzle", [32, 64, 128])
def test_tma_box_inner_extent_at_the_swizzle_span(swizzle):
    eb = 2
    assert tma.tma_box_problems(eb, (64, 256), (512, eb), (8, swizzle // eb), swizzle) == []
    assert tma.tma_box_problems(eb, (64, 256), (512, eb), (8, swizzle // eb + 8), swizzle) != []


def test_tma_box_inner_extent_in_16_byte_units():
    assert tma.tma_box_problems(2, (64, 256), (512, 2), (8, 8), 0) == []
    assert tma.tma_box_problems(2, (64, 256), (512, 2), (8, 12), 0) != []


@pytest.mark.parametrize("field", ["addr_bytes", "lbo_bytes", "sbo_bytes"])
def test_descriptor_fields_at_the_limit(field):
    args = dict(addr_bytes=0, lbo_bytes=16, sbo_bytes=16)
    desc.smem_descriptor(**dict(args, **{field: (1 << 18) - 16}))
    if field == "addr_bytes":
        # the shared window address is taken modulo 2**18
        assert desc.smem_descriptor(**dict(args, addr_bytes=1 << 18)) == desc.smem_descriptor(**args)
    else:
        with pytest.raises(ValueError, match="multiple of 16"):
            desc.smem_descriptor(**dict(args, **{field: 1 << 18}))


def test_descriptor_base_offset_at_the_limit():
    assert desc.smem_descriptor(0, 16, 16, 128, base_offset=7) >> 49 & 7 == 7
    with pytest.raises(ValueError, match="base_offset"):
        desc.smem_descriptor(0, 16, 16, 128, base_offset=8)


# =========================================================================== printer and runtime

def _barrier_kernel(bar_id, threads):
    k = ir.Kernel("k", (), (1, 1, 1), 128, (), (), ir.Seq([ir.Barrier("b", bar_id=bar_id, threads=threads)]))
    return fs.cuda.emit_kernel(k)


@pytest.mark.parametrize("bar_id, threads, ok", [(15, 128, True), (16, 128, False), (1, 32, True), (0, 32, False),
                                                 (1, 33, False), (1, 1024, True)])
def test_named_barrier_limits(bar_id, threads, ok):
    """Named barriers 1..15 (0 is __syncthreads'), counts in whole warps."""
    if ok:
        assert "bar.sync %0, %1;" in _barrier_kernel(bar_id, threads)
    else:
        with pytest.raises(fs.errors.InternalError):
            _barrier_kernel(bar_id, threads)


def test_block_size_at_the_launch_limit():
    check_block_size("k", (1024, 1, 1), 1024)
    check_block_size("k", (32, 8, 4), 1024)
    with pytest.raises(LaunchError, match="1025"):
        check_block_size("k", (1025, 1, 1), 1024)
    with pytest.raises(LaunchError, match="more than its limit of 1024"):
        check_block_size("k", (32, 8, 5), 1024)


@pytest.mark.parametrize("offset, ok", [(0, True), (16, True), (8, False), (4, False), (1, False)])
def test_argument_alignment_at_the_limit(offset, ok):
    spec = ArgSpec("A", (4, 4), "f16", (4, 1), 16)
    arr = DeviceArray(0x10000 + offset, (4, 4), (4, 1), "f16", 0, "torch")
    if ok:
        assert check_args([spec], [arr], "k") == 0
    else:
        with pytest.raises(ValueError, match="not aligned to 16 bytes"):
            check_args([spec], [arr], "k")


def test_cp_async_widths_are_the_isa_sizes():
    # (16 bytes twice: .cg, L2 only, and .ca, cached in L1 too)
    assert sorted(a.width for a in catalog.ALL_ATOMS if a.family == "cp_async") == [4, 8, 16, 16]


@pytest.mark.parametrize("rows, ok", [(1, True), (2, False), (3, False)])
def test_only_extent_one_strides_go_unchecked(rows, ok):
    """A dimension of extent 1 is never stepped over, so its stride may be anything; from extent 2
    on, a wrong stride reads the wrong elements."""
    spec = ArgSpec("A", (rows, 8), "f16", (8, 1), 16)
    arr = DeviceArray(0x10000, (rows, 8), (16, 1), "f16", 0, "torch")
    if ok:
        assert check_args([spec], [arr], "k") == 0
    else:
        with pytest.raises(ValueError, match="strides"):
            check_args([spec], [arr], "k")


def test_threads_per_block_at_the_limit():
    """A block maps at most 1024 threads (a Pointwise kernel, one element per thread)."""
    from firesched.strategies import to_threads

    def sched(c):
        spec = fs.Pointwise.kernel("relu", {"r": 4, "c": c})
        return spec.schedule(tile(r=1, c=c) >> to_blocks(), tile(r=1, c=1) >> to_threads(), done())

    (k,) = sched(1024).lower("sm_80").kernels
    assert k.threads == 1024
    with pytest.raises(ScheduleError, match="at most 1024"):
        sched(1025)
