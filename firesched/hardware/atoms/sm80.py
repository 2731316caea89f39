"""Ampere (sm_80) atoms: mma.sync m16n8k16 / m16n8k8, ldmatrix, cp.async and its group sync.

Families (``Atom.family``) and records:

* ``mma`` — ``mma_m16n8k16_f16_f32``, ``mma_m16n8k16_bf16_f32``, ``mma_m16n8k16_f16_f16``,
  ``mma_m16n8k8_tf32_f32`` (``mma.sync.aligned``, issued by a warp, operands in registers);
* ``ldmatrix`` — ``ldmatrix_x1/x2/x4`` and ``ldmatrix_x1/x2/x4_trans`` (shared -> register
  fragments of 8x8 16-bit matrices, one 16-byte row address per thread), and
  ``ldmatrix_x2_cols``, ``ldmatrix_x4_cols``, ``ldmatrix_x4_trans_cols``, whose lanes address the
  matrices along the tile's columns first (x2 with .trans that way would make 8x16 fragments of
  k = 8, which no 16-bit MMA of the table reads);
* ``cp_async`` — ``cp_async_4``, ``cp_async_8``, ``cp_async_16`` (global -> shared, asynchronous;
  16 bytes bypass L1 with ``.cg``), ``cp_async_16_ca`` (16 bytes cached in L1 too);
* ``sync`` — ``cp_async_commit``, ``cp_async_wait`` (``cp.async.commit_group``,
  ``cp.async.wait_group $n``).

Everything here also runs on sm_90a.  ldmatrix exists from sm_75 on, but firesched's oldest
target after sm_70 is sm_80, so that is its ``min_target``.

TV layout convention (see ``firesched.layout.TVLayout``): the codomain is the column-major index
``row + rows*col`` of the operand's tile in its natural orientation: A is (m, k), B is (k, n),
C and D are (m, n).  For ldmatrix the tile is in *memory* coordinates of the shared-memory source,
(rows, cols) with cols contiguous.  The lane roles below follow the PTX ISA's fragment figures:
``group = lane // 4`` and ``tig = lane % 4`` ("threadID_in_group").
"""

from __future__ import annotations

from ... import dtypes as dt
from ...layout import Layout, TVLayout
from .base import CP_ASYNC, LDMATRIX, MMA, SYNC, THREAD, WARP, Atom, Operand
from .sm70 import identity, matmul_semantics

CATALOG = "sm80"


# --------------------------------------------------------------------------- mma.sync m16n8k16

# C/D 16x8: lane holds rows group and group+8, cols 2*tig and 2*tig+1 (values c0..c3).
TV_C_16x8 = TVLayout(Layout(((4, 8), (2, 2)), ((32, 1), (16, 8))), (16, 8))
# A 16x16 (16-bit types): rows group / group+8, cols 2*tig+{0,1} and those plus 8 (a0..a7).
TV_A_16x16 = TVLayout(Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128))), (16, 16))
# B 16x8 (k, n), 16-bit types: k = 2*tig+{0,1} and those plus 8, n = group (b0..b3).
TV_B_16x8 = TVLayout(Layout(((4, 8), (2, 2)), ((2, 16), (1, 8))), (16, 8))


def _mma_16bit(name: str, ab: dt.DType, acc: dt.DType, doc: str) -> Atom:
    f32_acc = acc.bits == 32
    acc_regs = 4 if f32_acc else 2       # f16 accumulators pack two per b32 register
    ptx_types = f"{acc}.{ab}.{ab}.{acc}"
    return Atom(
        name=name, family=MMA, group=WARP, kind="MatMul", shape=(16, 8, 16),
        dtypes=(("d", acc), ("a", ab), ("b", ab), ("c", acc)),
        operands=(
            Operand("d", "out", "RF", regs=acc_regs, values=4, float_regs=f32_acc, tv=TV_C_16x8),
            Operand("a", "in", "RF", regs=4, values=8, tv=TV_A_16x16),
            Operand("b", "in", "RF", regs=2, values=4, tv=TV_B_16x8),
            Operand("c", "in", "RF", regs=acc_regs, values=4, float_regs=f32_acc, tv=TV_C_16x8),
        ),
        ptx=f"mma.sync.aligned.m16n8k16.row.col.{ptx_types} $d, $a, $b, $c;",
        min_target="sm_80",
        semantics=matmul_semantics(ab, ab, acc),
        catalog=CATALOG, doc=doc,
    )


mma_m16n8k16_f16_f32 = _mma_16bit(
    "mma_m16n8k16_f16_f32", dt.f16, dt.f32,
    "Warp MMA 16x8x16: f16 A (row) and B (col), f32 accumulators.")
mma_m16n8k16_bf16_f32 = _mma_16bit(
    "mma_m16n8k16_bf16_f32", dt.bf16, dt.f32,
    "Warp MMA 16x8x16: bf16 A (row) and B (col), f32 accumulators.")
mma_m16n8k16_f16_f16 = _mma_16bit(
    "mma_m16n8k16_f16_f16", dt.f16, dt.f16,
    "Warp MMA 16x8x16: f16 A (row) and B (col), f16 accumulators packed two per register.")


# --------------------------------------------------------------------------- mma.sync m16n8k8 tf32

# A 16x8 tf32: a0 (group, tig), a1 (group+8, tig), a2 (group, tig+4), a3 (group+8, tig+4).
TV_A_16x8_TF32 = TVLayout(Layout(((4, 8), (2, 2)), ((16, 1), (8, 64))), (16, 8))
# B 8x8 (k, n) tf32: b0 (k=tig, n=group), b1 (k=tig+4, n=group).
TV_B_8x8_TF32 = TVLayout(Layout(((4, 8), 2), ((1, 8), 4)), (8, 8))

mma_m16n8k8_tf32_f32 = Atom(
    name="mma_m16n8k8_tf32_f32", family=MMA, group=WARP, kind="MatMul", shape=(16, 8, 8),
    dtypes=(("d", dt.f32), ("a", dt.tf32), ("b", dt.tf32), ("c", dt.f32)),
    operands=(
        Operand("d", "out", "RF", regs=4, values=4, float_regs=True, tv=TV_C_16x8),
        Operand("a", "in", "RF", regs=4, values=4, tv=TV_A_16x8_TF32),
        Operand("b", "in", "RF", regs=2, values=2, tv=TV_B_8x8_TF32),
        Operand("c", "in", "RF", regs=4, values=4, float_regs=True, tv=TV_C_16x8),
    ),
    ptx="mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 $d, $a, $b, $c;",
    min_target="sm_80",
    semantics=matmul_semantics(dt.tf32, dt.tf32, dt.f32),
    catalog=CATALOG,
    doc="Warp MMA 16x8x8: tf32 A (row) and B (col) in b32 registers (convert with cvt.rna.tf32.f32 "
        "first), f32 accumulators.",
)


# --------------------------------------------------------------------------- ldmatrix
#
# ldmatrix moves 8x8 matrices of 16-bit elements from shared memory to registers.  Threads
# 8i..8i+7 supply the addresses of the 8 rows (16 contiguous bytes each) of matrix i; lane l
# receives, in destination register i, the elements (l // 4, 2*(l % 4) + {0, 1}) of matrix i,
# or with .trans the elements (2*(l % 4) + {0, 1}, l // 4).  Matrix i sits in the tile at
#   x1: the 8x8 tile;  x2: rows 8i..8i+7 of 16x8;  x4: rows 8*(i%2).., cols 8*(i//2).. of 16x16.
# The value index is (element within the register) + 2*(register), so for x4 without .trans the
# destination is exactly an m16n8k16 A fragment, and with .trans registers {0,1} and {2,3} are
# the B fragments of n-columns 0-7 and 8-15 of a row-major (k, n) tile.
#
# Which lanes address which matrix is the program's choice, not the instruction's: the ``_cols``
# variants put the matrices along the columns first.
#   x2_cols: matrix i at cols 8i of 8x16;  x4_cols: rows 8*(i//2), cols 8*(i%2) of 16x16.
#
#      x4                     x4_cols
#      +------+------+        +------+------+
#      |  m0  |  m2  |        |  m0  |  m1  |      x4_cols without .trans: registers {0,1} and
#      +------+------+        +------+------+      {2,3} are the B fragments of n-rows 0-7 and
#      |  m1  |  m3  |        |  m2  |  m3  |      8-15 of an n-major (n, k) tile (attention's K,
#      +------+------+        +------+------+      a column-major B); with .trans, an A fragment
#                                                  of a k-major (k, m) tile (a column-major A).

_LDSM_TILE = {(1, False): (8, 8), (2, False): (16, 8), (4, False): (16, 16), (2, True): (8, 16), (4, True): (16, 16)}
_LDSM_ADDR = {(1, False): Layout(8, 1), (2, False): Layout(16, 1), (4, False): Layout((16, 2), (1, 128)),
              (2, True): Layout((8, 2), (1, 64)), (4, True): Layout((8, 2, 2), (1, 128, 8))}
_LDSM_TV = {   # (num, trans, cols)
    (1, False, False): Layout(((4, 8), 2), ((16, 1), 8)),
    (2, False, False): Layout(((4, 8), (2, 2)), ((32, 1), (16, 8))),
    (4, False, False): Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128))),
    (1, True, False): Layout(((4, 8), 2), ((2, 8), 1)),
    (2, True, False): Layout(((4, 8), (2, 2)), ((2, 16), (1, 8))),
    (4, True, False): Layout(((4, 8), (2, 2, 2)), ((2, 16), (1, 8, 128))),
    (2, False, True): Layout(((4, 8), (2, 2)), ((16, 1), (8, 64))),
    (4, False, True): Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 128, 8))),
    (4, True, True): Layout(((4, 8), (2, 2, 2)), ((2, 16), (1, 128, 8))),
}


def _ldmatrix(num: int, trans: bool, cols: bool = False) -> Atom:
    tile = _LDSM_TILE[num, cols]
    suffix = f"x{num}" + (".trans" if trans else "")
    dst = "{$dst}" if num == 1 else "$dst"     # a one-register vector still needs its braces
    what = "transposed " if trans else ""
    order = ", matrices along the columns first" if cols else ""
    return Atom(
        name=f"ldmatrix_x{num}" + ("_trans" if trans else "") + ("_cols" if cols else ""),
        family=LDMATRIX, group=WARP, kind="Move", shape=tile,
        dtypes=(("dst", dt.f16), ("src", dt.f16)),
        operands=(
            Operand("dst", "out", "RF", regs=num, values=2 * num, tv=TVLayout(_LDSM_TV[num, trans, cols], tile)),
            Operand("src", "in", "SH", values=8, addr=_LDSM_ADDR[num, cols]),
        ),
        ptx=f"ldmatrix.sync.aligned.m8n8.{suffix}.shared.b16 {dst}, [$src];",
        min_target="sm_80", alignment=16, src_memory="SH", dst_memory="RF", trans=trans,
        semantics=identity, catalog=CATALOG,
        doc=f"Warp load of {num} {what}8x8 matrices of any 16-bit type (f16 nominal) from shared "
            f"memory into a {tile[0]}x{tile[1]} register fragment{order}.",
    )


ldmatrix_x1 = _ldmatrix(1, False)
ldmatrix_x2 = _ldmatrix(2, False)
ldmatrix_x4 = _ldmatrix(4, False)
ldmatrix_x1_trans = _ldmatrix(1, True)
ldmatrix_x2_trans = _ldmatrix(2, True)
ldmatrix_x4_trans = _ldmatrix(4, True)
ldmatrix_x2_cols = _ldmatrix(2, False, cols=True)
ldmatrix_x4_cols = _ldmatrix(4, False, cols=True)
ldmatrix_x4_trans_cols = _ldmatrix(4, True, cols=True)


# --------------------------------------------------------------------------- cp.async

def _cp_async(width: int, cache: str | None = None) -> Atom:
    # .cg (bypass L1) only exists for 16-byte copies; smaller ones must use .ca.
    name = f"cp_async_{width}" if cache is None else f"cp_async_{width}_{cache}"
    cache = cache or ("cg" if width == 16 else "ca")
    return Atom(
        name=name, family=CP_ASYNC, group=THREAD, kind="Move", shape=(1, width),
        dtypes=(("dst", dt.u8), ("src", dt.u8)),
        operands=(
            Operand("dst", "in", "SH", values=width, addr=Layout(1, 0)),
            Operand("src", "in", "GL", values=width, addr=Layout(1, 0)),
        ),
        ptx=f"cp.async.{cache}.shared.global [$dst], [$src], {width}, $src_size;",
        min_target="sm_80", alignment=width, src_memory="GL", dst_memory="SH", width=width,
        semantics=identity, catalog=CATALOG,
        doc=f"Asynchronous {width}-byte global->shared copy (.{cache}); $src_size bytes are read "
            f"and the rest zero-filled (0 disables the read: predication).",
    )


cp_async_4 = _cp_async(4)
cp_async_8 = _cp_async(8)
cp_async_16 = _cp_async(16)
#: a 16-byte copy cached in L1 too (``.ca``): what every block of an SM reads alike, such as a
#: row operand's raw vectors for its persistent window (``lower.rules.threads``), reaches L2 once
#: an SM instead of once a block
cp_async_16_ca = _cp_async(16, "ca")

cp_async_commit = Atom(
    name="cp_async_commit", family=SYNC, group=THREAD, kind="Sync", shape=(), dtypes=(), operands=(),
    ptx="cp.async.commit_group;", min_target="sm_80", catalog=CATALOG,
    doc="Close the calling thread's open group of cp.async copies.",
)

cp_async_wait = Atom(
    name="cp_async_wait", family=SYNC, group=THREAD, kind="Sync", shape=(), dtypes=(), operands=(),
    ptx="cp.async.wait_group $n;", min_target="sm_80", catalog=CATALOG,
    doc="Wait until at most $n committed cp.async groups are pending; $n must be an immediate, so "
        "the printer substitutes it as text (catalog.with_immediates) instead of binding a register.",
)


ATOMS: tuple[Atom, ...] = (
    mma_m16n8k16_f16_f32, mma_m16n8k16_bf16_f32, mma_m16n8k16_f16_f16, mma_m16n8k8_tf32_f32,
    ldmatrix_x1, ldmatrix_x2, ldmatrix_x4, ldmatrix_x1_trans, ldmatrix_x2_trans, ldmatrix_x4_trans,
    ldmatrix_x2_cols, ldmatrix_x4_cols, ldmatrix_x4_trans_cols,
    cp_async_4, cp_async_8, cp_async_16, cp_async_16_ca, cp_async_commit, cp_async_wait,
)
