"""Volta (sm_70) atoms, also valid on every later target: the quad-pair HMMA mma.m8n8k4,
per-thread global/shared loads and stores, warp shuffles and the block barrier.

Families (``Atom.family``) and records:

* ``mma`` — ``mma_m8n8k4_f16_f32``, ``mma_m8n8k4_f16_f16`` (issued by a warp, computed per
  quad-pair: see below);
* ``copy`` — ``ld_global_W``, ``st_global_W``, ``ld_shared_W``, ``st_shared_W`` for ``W`` = 1, 2,
  4, 8, 16 bytes per thread;
* ``shuffle`` — ``shfl_sync_idx_b32``, ``shfl_sync_bfly_b32`` (the butterflies of reductions);
* ``sync`` — ``bar_sync`` (``bar.sync 0``, the block barrier);
* ``flag`` — ``flag_store`` (``st.release.gpu`` of a 32-bit flag in global memory) and
  ``flag_wait`` (an ``ld.acquire.gpu`` spin loop until the flag is non-zero; its labels are
  numbered per call site through ``$uid``): how one block hands data in global memory to another
  (stream-K's partial tiles); ``flag_add`` (``red.release.gpu.add``) and ``flag_wait_count`` (a
  spin until the counter reaches a value): several blocks hand data to one through one counter
  (split-K's fix-up).

mma.m8n8k4 is issued by a whole warp but computes four independent 8x8x4 products, one per
quad-pair: quad-pair p is lanes 4p..4p+3 and 4p+16..4p+19.  Its TV layouts therefore range over
the 8 threads of one quad-pair (``atom.threads == 8``), numbered locally
``q = lane % 4 + 4 * (lane >= 16)``; ``QUADPAIR_LANES(q) + 4 * p`` is the lane of local thread q
in quad-pair p.  The tiles are A (m, k) = 8x4, B (k, n) = 4x8, C/D (m, n) = 8x8, column-major
indices ``row + rows*col`` as everywhere.

COPY atoms move ``width`` contiguous bytes per thread.  Their nominal dtype is u8 and their tile
is (1, width) bytes; any element type whose size divides the width can be moved
(``Atom.values_for``).  A one-byte copy goes through a 16-bit register (PTX has no 8-bit
registers): loads zero-extend the byte, stores write its low byte.
"""

from __future__ import annotations

import numpy as np

from ... import dtypes as dt
from ...layout import QUAD_PAIR, Layout, TVLayout
from .base import BLOCK, COPY, FLAG, MMA, QUADPAIR, SHUFFLE, SYNC, THREAD, WARP, Atom, Operand

CATALOG = "sm70"

#: Local quad-pair thread q -> lane of quad-pair 0; add 4*p for quad-pair p.
QUADPAIR_LANES = QUAD_PAIR


# --------------------------------------------------------------------------- semantics

def matmul_semantics(a_dtype: dt.DType, b_dtype: dt.DType, acc_dtype: dt.DType):
    """``d = a @ b + c``: inputs read as their dtypes hold them (tf32 rounded to 10 mantissa bits),
    products summed in float64, the result rounded once to ``acc_dtype``."""

    def semantics(a, b, c):
        d = dt.round_to(a_dtype, np.asarray(a)) @ dt.round_to(b_dtype, np.asarray(b))
        c = np.asarray(c)
        d += c if c.dtype == acc_dtype.np and acc_dtype != dt.tf32 else dt.round_to(acc_dtype, c)
        return d.astype(acc_dtype.np)

    semantics.__name__ = f"mma_{a_dtype}_{b_dtype}_{acc_dtype}"
    return semantics


def identity(tile):
    """Moves do not change data: the destination tile equals the source tile."""
    return np.array(tile, copy=True)


# --------------------------------------------------------------------------- mma.m8n8k4 (HMMA)

# A 8x4 row-major fragment: thread q holds row q, values a0..a3 are k = 0..3.
TV_A_8x4 = TVLayout(Layout((8, 4), (1, 8)), (8, 4))
# B 4x8 col-major fragment (k, n): thread q holds column n = q, values b0..b3 are k = 0..3.
TV_B_4x8 = TVLayout(Layout((8, 4), (4, 1)), (4, 8))
# C/D 8x8 with f32 accumulators: row = (q & 1) + (i & 2) + 4*(q >= 4),
# col = (q & 2) + (i & 1) + (i & 4) for value i.
TV_C_8x8_F32 = TVLayout(Layout(((2, 2, 2), (2, 2, 2)), ((1, 16, 4), (8, 2, 32))), (8, 8))
# C/D 8x8 with f16 accumulators: thread q holds row q, values c0..c7 are columns 0..7.
TV_C_8x8_F16 = TVLayout(Layout((8, 8), (1, 8)), (8, 8))


def _hmma(acc: dt.DType) -> Atom:
    f32_acc = acc.bits == 32
    tv_c = TV_C_8x8_F32 if f32_acc else TV_C_8x8_F16
    regs = 8 if f32_acc else 4
    return Atom(
        name=f"mma_m8n8k4_f16_{acc}", family=MMA, group=QUADPAIR, kind="MatMul", shape=(8, 8, 4),
        dtypes=(("d", acc), ("a", dt.f16), ("b", dt.f16), ("c", acc)),
        operands=(
            Operand("d", "out", "RF", regs=regs, values=8, float_regs=f32_acc, tv=tv_c),
            Operand("a", "in", "RF", regs=2, values=4, tv=TV_A_8x4),
            Operand("b", "in", "RF", regs=2, values=4, tv=TV_B_4x8),
            Operand("c", "in", "RF", regs=regs, values=8, float_regs=f32_acc, tv=tv_c),
        ),
        ptx=f"mma.sync.aligned.m8n8k4.row.col.{acc}.f16.f16.{acc} $d, $a, $b, $c;",
        min_target="sm_70",
        semantics=matmul_semantics(dt.f16, dt.f16, acc),
        catalog=CATALOG,
        doc=f"Volta HMMA 8x8x4 per quad-pair (four per warp issue): f16 A (row) and B (col), "
            f"{acc} accumulators.",
    )


mma_m8n8k4_f16_f32 = _hmma(dt.f32)
mma_m8n8k4_f16_f16 = _hmma(dt.f16)


# --------------------------------------------------------------------------- thread copies

_VEC = {1: "u8", 2: "b16", 4: "b32", 8: "v2.b32", 16: "v4.b32"}
_MEM_PTX = {"GL": "global", "SH": "shared"}


def _reg_operand(name: str, role: str, width: int) -> Operand:
    tv = TVLayout(Layout((1, width), (0, 1)), (1, width))
    if width <= 2:
        return Operand(name, role, "RF", regs=1, reg_bits=16, values=width, tv=tv)
    return Operand(name, role, "RF", regs=width // 4, reg_bits=32, values=width, tv=tv)


def _copy(op: str, mem: str, width: int) -> Atom:
    space = _MEM_PTX[mem]
    mem_operand = Operand("src" if op == "ld" else "dst", "in", mem, values=width, addr=Layout(1, 0))
    if op == "ld":
        operands = (_reg_operand("dst", "out", width), mem_operand)
        ptx = f"ld.{space}.{_VEC[width]} $dst, [$src];"
        src, dst = mem, "RF"
        doc = f"Thread load of {width} contiguous bytes from {_MEM_PTX[mem]} memory into registers."
    else:
        operands = (mem_operand, _reg_operand("src", "in", width))
        ptx = f"st.{space}.{_VEC[width]} [$dst], $src;"
        src, dst = "RF", mem
        doc = f"Thread store of {width} contiguous bytes from registers to {_MEM_PTX[mem]} memory."
    return Atom(
        name=f"{op}_{space}_{width}", family=COPY, group=THREAD, kind="Move", shape=(1, width),
        dtypes=(("dst", dt.u8), ("src", dt.u8)), operands=operands, ptx=ptx,
        min_target="sm_70", alignment=width, src_memory=src, dst_memory=dst, width=width,
        semantics=identity, catalog=CATALOG, doc=doc,
    )


ld_global_1 = _copy("ld", "GL", 1)
ld_global_2 = _copy("ld", "GL", 2)
ld_global_4 = _copy("ld", "GL", 4)
ld_global_8 = _copy("ld", "GL", 8)
ld_global_16 = _copy("ld", "GL", 16)
st_global_1 = _copy("st", "GL", 1)
st_global_2 = _copy("st", "GL", 2)
st_global_4 = _copy("st", "GL", 4)
st_global_8 = _copy("st", "GL", 8)
st_global_16 = _copy("st", "GL", 16)
ld_shared_1 = _copy("ld", "SH", 1)
ld_shared_2 = _copy("ld", "SH", 2)
ld_shared_4 = _copy("ld", "SH", 4)
ld_shared_8 = _copy("ld", "SH", 8)
ld_shared_16 = _copy("ld", "SH", 16)
st_shared_1 = _copy("st", "SH", 1)
st_shared_2 = _copy("st", "SH", 2)
st_shared_4 = _copy("st", "SH", 4)
st_shared_8 = _copy("st", "SH", 8)
st_shared_16 = _copy("st", "SH", 16)


# --------------------------------------------------------------------------- shuffles

def shfl_idx(values, src_lane):
    """``out[l] = values[src_lane[l] % 32]`` (shfl.sync.idx over the full warp, c = 0x1f), for
    each warp of a stack ``values[..., 32]``."""
    values = np.asarray(values)
    src = np.broadcast_to(np.asarray(src_lane, dtype=np.int64) & 31, values.shape)
    return np.take_along_axis(values, src, axis=-1)


def shfl_bfly(values, lane_mask):
    """``out[l] = values[l ^ lane_mask[l]]`` (shfl.sync.bfly over the full warp, c = 0x1f), for
    each warp of a stack ``values[..., 32]``."""
    values = np.asarray(values)
    lanes = np.arange(values.shape[-1], dtype=np.int64)
    src = np.broadcast_to(lanes ^ (np.asarray(lane_mask, dtype=np.int64) & 31), values.shape)
    return np.take_along_axis(values, src, axis=-1)


def _shfl(mode: str, lane_name: str, semantics, doc: str) -> Atom:
    return Atom(
        name=f"shfl_sync_{mode}_b32", family=SHUFFLE, group=WARP, kind="Shuffle", shape=(32,),
        dtypes=(("dst", dt.f32), ("src", dt.f32), (lane_name, dt.i32)),
        operands=(
            Operand("dst", "out", "RF"),
            Operand("src", "in", "RF"),
            Operand(lane_name, "in", "RF"),
        ),
        ptx=f"shfl.sync.{mode}.b32 $dst, $src, ${lane_name}, 0x1f, 0xffffffff;",
        min_target="sm_70", semantics=semantics, catalog=CATALOG, doc=doc,
    )


shfl_sync_idx_b32 = _shfl("idx", "lane", shfl_idx,
                          "Full-warp shuffle of any 32-bit value (f32 nominal) from lane $lane.")
shfl_sync_bfly_b32 = _shfl("bfly", "lane_mask", shfl_bfly,
                           "Full-warp butterfly shuffle of any 32-bit value (f32 nominal) from lane ^ $lane_mask.")


# --------------------------------------------------------------------------- barrier

bar_sync = Atom(
    name="bar_sync", family=SYNC, group=BLOCK, kind="Sync", shape=(), dtypes=(), operands=(),
    ptx="bar.sync 0;", min_target="sm_70", catalog=CATALOG,
    doc="Block-wide barrier 0: every thread waits, and earlier shared-memory writes become visible.",
)


# --------------------------------------------------------------------------- flags between blocks

_FLAG = Operand("flag", "in", "GL", values=1, addr=Layout(1, 0))

flag_store = Atom(
    name="flag_store", family=FLAG, group=THREAD, kind="Sync", shape=(),
    dtypes=(("flag", dt.i32), ("value", dt.i32)),
    operands=(_FLAG, Operand("value", "in", "RF", regs=1, reg_bits=32, values=1)),
    ptx="st.release.gpu.global.b32 [$flag], $value;", min_target="sm_70", alignment=4, catalog=CATALOG,
    doc="Set the 32-bit flag at $flag to $value with release semantics at GPU scope: the caller's earlier "
        "writes, and those of the threads a barrier ordered before it, are visible to a thread of any block "
        "that acquires the flag (flag_wait).  A value of 0 resets the flag for the next launch.")

flag_wait = Atom(
    name="flag_wait", family=FLAG, group=THREAD, kind="Sync", shape=(), dtypes=(("flag", dt.i32),),
    operands=(_FLAG,),
    ptx="{ .reg .pred fs_p; .reg .b32 fs_v; fs_flag_$uid: ld.acquire.gpu.global.b32 fs_v, [$flag]; "
        "setp.eq.u32 fs_p, fs_v, 0; @fs_p bra fs_flag_$uid; }",
    min_target="sm_70", alignment=4, catalog=CATALOG,
    doc="Spin until the 32-bit flag at $flag is non-zero, reading it with acquire semantics at GPU scope: "
        "what the block that set it wrote before its flag_store is then visible to the caller.")


flag_add = Atom(
    name="flag_add", family=FLAG, group=THREAD, kind="Sync", shape=(),
    dtypes=(("flag", dt.i32), ("value", dt.i32)),
    operands=(_FLAG, Operand("value", "in", "RF", regs=1, reg_bits=32, values=1)),
    ptx="red.release.gpu.global.add.u32 [$flag], $value;", min_target="sm_70", alignment=4, catalog=CATALOG,
    doc="Add $value to the 32-bit counter at $flag with release semantics at GPU scope: like flag_store, the "
        "caller's earlier writes (and those a barrier ordered before it) are visible to a thread that reads a "
        "count including this addition with acquire semantics (flag_wait_count).  Several blocks arrive at one "
        "counter; a wait for their total acquires all of them.")

flag_wait_count = Atom(
    name="flag_wait_count", family=FLAG, group=THREAD, kind="Sync", shape=(), dtypes=(("flag", dt.i32),
                                                                                        ("value", dt.i32)),
    operands=(_FLAG, Operand("value", "in", "RF", regs=1, reg_bits=32, values=1)),
    ptx="{ .reg .pred fs_p; .reg .b32 fs_v; fs_count_$uid: ld.acquire.gpu.global.b32 fs_v, [$flag]; "
        "setp.lt.u32 fs_p, fs_v, $value; @fs_p bra fs_count_$uid; }",
    min_target="sm_70", alignment=4, catalog=CATALOG,
    doc="Spin until the 32-bit counter at $flag reaches $value (unsigned), reading it with acquire semantics at "
        "GPU scope: what every block that added to it (flag_add) wrote before its addition is then visible.")


ATOMS: tuple[Atom, ...] = (
    mma_m8n8k4_f16_f32, mma_m8n8k4_f16_f16,
    ld_global_1, ld_global_2, ld_global_4, ld_global_8, ld_global_16,
    st_global_1, st_global_2, st_global_4, st_global_8, st_global_16,
    ld_shared_1, ld_shared_2, ld_shared_4, ld_shared_8, ld_shared_16,
    st_shared_1, st_shared_2, st_shared_4, st_shared_8, st_shared_16,
    shfl_sync_idx_b32, shfl_sync_bfly_b32,
    bar_sync,
    flag_store, flag_wait, flag_add, flag_wait_count,
)
