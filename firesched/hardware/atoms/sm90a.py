"""Hopper (sm_90a) atoms: wgmma, TMA, mbarrier, the async-proxy fence, setmaxnreg, stmatrix.

These instructions exist only on the architecture-specific target ``sm_90a``; a translation unit
that uses them refuses to compile for any other arch (the CUDA printer emits an ``#error``).

Families (``Atom.family``):

* ``wgmma`` — ``wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}``, issued by a warpgroup
  (128 threads, ``WARPGROUP``), for N = 8, 16, ..., 256.  Four variants per (N, type):
  ``_ss`` (A and B in shared memory, both K-major), ``_rs`` (A in registers, B K-major in shared
  memory), and ``_ss_tnspb`` / ``_rs_tnspb`` where B is MN-major (its N elements contiguous, PTX
  ``imm-trans-b = 1``; ``Atom.trans`` is True); ``_ss_tnspa`` reads A MN-major (its M elements
  contiguous, ``imm-trans-a = 1``; ``Atom.trans_a``) with a K-major B — the product
  ``Cᵀ = Bᵀ Aᵀ`` of a row-major B.  Both scale immediates are 1.  Operands: ``d`` (inout, N/2 f32
  registers per thread), ``desc_a`` / ``desc_b`` (64-bit shared-memory matrix descriptors, see
  ``smem_descriptor``), ``a`` (``_rs``: four b32 registers holding 8 elements), ``scale_d``
  (a 32-bit value: 0 computes ``D = A @ B``, anything else ``D = A @ B + D``).
* ``wgmma_sync`` — ``wgmma.fence``, ``wgmma.commit_group``, ``wgmma.wait_group $n``.
* ``tma`` — 2-D to 5-D ``cp.async.bulk.tensor`` loads (global -> shared, completing on an
  mbarrier) and stores (shared -> global, in a bulk async-group), ``cp.async.bulk.commit_group``
  and ``cp.async.bulk.wait_group[.read] $n``.  Issued by one thread.  ``$tmap`` is the 64-bit
  generic address of a ``const __grid_constant__ CUtensorMap`` kernel parameter of the same rank
  as the instruction; the coordinates are innermost first, as the PTX ISA orders tensor
  coordinates: ``$c0`` is the innermost (column) coordinate of the box, ``$c1`` the row, ``$c2``
  (3-D) the outer dimension (the batch of a (batch, rows, cols) tensor).
* ``mbarrier`` — init, arrive, arrive.expect_tx, a ``try_wait.parity`` spin loop (its labels
  are numbered per call site by the printer through the ``$uid`` immediate) and the arrive on
  another block's mbarrier of the cluster.
* ``fence`` — ``fence.proxy.async.shared::cta`` and ``fence.mbarrier_init.release.cluster``.
* ``setmaxnreg`` — ``setmaxnreg.{inc,dec}.sync.aligned.u32 $n`` (warpgroup-wide).
* ``stmatrix`` — ``stmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16``, the inverse of
  ldmatrix with the same TV and address layouts as the ldmatrix records of ``sm80``.
* ``cluster`` — ``barrier.cluster`` arrive + wait.  With it, for thread-block clusters: the
  multicast TMA load (``tma_load_2d_multicast``: one box into the shared memory of several
  blocks of the cluster, completing on each one's mbarrier) and ``mbarrier_arrive_cluster``
  (``mapa`` + a remote ``mbarrier.arrive.release.cluster``).
* ``dsmem`` — ``ld_shared_cluster_4``: a thread's 4-byte load from the shared memory of the
  cluster's block of rank ``$cta`` (distributed shared memory: ``mapa`` + ``ld.shared::cluster``),
  at the offset its own block's copy of the buffer has; ``st_async_cluster_4``: the push the other
  way, a 4-byte ``st.async`` into that block's shared memory completing transaction bytes on its
  mbarrier.
* ``griddep`` — ``griddepcontrol.launch_dependents`` and ``griddepcontrol.wait``: a kernel
  launched programmatically (``ir.Kernel.programmatic``) may start while the one before it in the
  stream finishes; it waits before touching what that one wrote.

Register operands that carry no tile (descriptors, coordinates, counts, ``scale_d``) have no TV
layout; ``is_descriptor`` and ``is_scalar`` tell them apart.

Fragment layouts (column-major tile index ``row + rows*col`` as everywhere), from the PTX ISA's
wgmma register-fragment figures ("Matrix Fragments for wgmma.mma_async.m64nNk16"): with
``w = tid // 32`` (warp of the warpgroup), ``g = lane // 4``, ``q = lane % 4``:

* D (64 x N, f32): value ``i`` of a thread sits at row ``16w + g + 8*((i // 2) % 2)`` and column
  ``8*(i // 4) + 2q + (i % 2)`` — the m16n8 C-fragment of warp ``w`` repeated over N/8 column
  blocks;
* A in registers (64 x 16): value ``i`` at row ``16w + g + 8*((i // 2) % 2)`` and column
  ``2q + (i % 2) + 8*(i // 4)`` — the m16n8k16 A fragment of warp ``w``.

Shared-memory operands are described by matrix descriptors and TMA boxes; their formats live in
``firesched.hardware.descriptors`` and ``firesched.hardware.tma`` (re-exported here).
"""

from __future__ import annotations

from ... import dtypes as dt
from ...layout import Layout, TVLayout
from ..descriptors import (  # noqa: F401  (re-exported: the formats these atoms read)
    DESCRIPTOR_MODE,
    SWIZZLES,
    SmemDescriptor,
    canonical_offset,
    decode_smem_descriptor,
    descriptor_byte_offsets,
    operand_byte_offsets,
    smem_descriptor,
    swizzle_atom_bytes,
)
from ..tma import TMA_DATA_TYPES, TMA_SWIZZLES, box_byte_offsets, box_byte_offsets_nd, tma_box_problems  # noqa: F401
from . import sm80
from .base import (  # noqa: F401  (the family names, re-exported)
    CLUSTER,
    DSMEM,
    FENCE,
    GRIDDEP,
    MBARRIER,
    SETMAXNREG,
    SM90A_FAMILIES,
    STMATRIX,
    THREAD,
    TMA,
    WARP,
    WARPGROUP,
    WGMMA,
    WGMMA_SYNC,
    Atom,
    Operand,
)
from .sm70 import identity, matmul_semantics

CATALOG = "sm90a"

FAMILIES = SM90A_FAMILIES

#: The N extents of wgmma.m64nNk16 with f16/bf16 inputs.
WGMMA_N = tuple(range(8, 257, 8))


# --------------------------------------------------------------------------- operand kinds

def is_descriptor(o: Operand) -> bool:
    """A 64-bit register operand holding a shared-memory matrix descriptor (bound to an
    ``ir.DescRef``)."""
    return o.memory == "RF" and o.reg_bits == 64 and o.name.startswith("desc_")


def is_scalar(o: Operand) -> bool:
    """A 32-bit register operand holding one integer value (a TMA coordinate, an mbarrier count
    or parity, ``scale_d``), bound to an ``ir.Scalar``."""
    return o.memory == "RF" and o.tv is None and not is_descriptor(o)


def _scalar(name: str) -> Operand:
    return Operand(name, "in", "RF", regs=1, reg_bits=32, values=1)


def _desc(name: str) -> Operand:
    return Operand(name, "in", "RF", regs=1, reg_bits=64, values=1)


# --------------------------------------------------------------------------- wgmma

def tv_d(n: int) -> TVLayout:
    """The wgmma D fragment of a 64 x ``n`` tile (see the module docstring)."""
    return TVLayout(Layout(((4, 8, 4), (2, 2, n // 8)), ((128, 1, 16), (64, 8, 512))), (64, n))


def d_coord(lane, pair):
    """(row, col) in the 64 x N D tile of registers ``2 * pair`` and ``2 * pair + 1`` (columns
    ``col`` and ``col + 1``) of warpgroup thread ``lane`` — ``tv_d`` written per mode, so that
    index expressions over ``lane`` and an unrolled ``pair`` stay simple::

        warp w = lane / 32 owns rows 16w .. 16w+15;  pair p: rows + 8 * (p % 2), cols 8 * (p / 2)
                 col: 0  1   2  3   4  5   6  7 | 8 ...
        row 16w+0:  [ t0 ] [ t1 ] [ t2 ] [ t3 ]  | t0 (pair 2) ...
        row 16w+1:  [ t4 ] [ t5 ] [ t6 ] [ t7 ]  |
        ...
        row 16w+8:  [ t0 ] [ t1 ] ...   (pair 1)
    """
    return (lane // 32) * 16 + (lane % 32) // 4 + 8 * (pair % 2), 8 * (pair // 2) + 2 * (lane % 4)


#: The wgmma A-in-registers fragment of the 64 x 16 A tile (16-bit types).
TV_A_RS = TVLayout(Layout(((4, 8, 4), (2, 2, 2)), ((128, 1, 16), (64, 8, 512))), (64, 16))


def _wgmma(n: int, ab: dt.DType, a_regs: bool, tnsp_b: bool, tnsp_a: bool = False) -> Atom:
    tv = tv_d(n)
    d = Operand("d", "inout", "RF", regs=n // 2, values=n // 2, float_regs=True, tv=tv)
    if a_regs:
        a = Operand("a", "in", "RF", regs=4, values=8, tv=TV_A_RS)
        operands = (d, a, _desc("desc_b"), _scalar("scale_d"))
        srcs, imms = "$a, $desc_b", f"1, 1, {int(tnsp_b)}"
        what_a = "A (64x16) in registers"
    else:
        operands = (d, _desc("desc_a"), _desc("desc_b"), _scalar("scale_d"))
        srcs, imms = "$desc_a, $desc_b", f"1, 1, {int(tnsp_a)}, {int(tnsp_b)}"
        what_a = ("A (64x16, MN-major: M contiguous)" if tnsp_a else "A (64x16, K-major)") + " from shared memory"
    kind = ("rs" if a_regs else "ss") + ("_tnspa" if tnsp_a else "") + ("_tnspb" if tnsp_b else "")
    b_major = "MN-major: N contiguous" if tnsp_b else "K-major: N rows of 16 contiguous k"
    ptx = (f"{{ .reg .pred fs_p; setp.ne.b32 fs_p, $scale_d, 0; "
           f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab} $d, {srcs}, fs_p, {imms}; }}")
    return Atom(
        name=f"wgmma_m64n{n}k16_{ab}_f32_{kind}", family=WGMMA, group=WARPGROUP, kind="MatMul",
        shape=(64, n, 16), dtypes=(("d", dt.f32), ("a", ab), ("b", ab), ("scale_d", dt.i32)),
        operands=operands, ptx=ptx, min_target="sm_90a", trans=tnsp_b, trans_a=tnsp_a,
        semantics=matmul_semantics(ab, ab, dt.f32), catalog=CATALOG,
        doc=f"Warpgroup MMA 64x{n}x16, asynchronous: {ab} {what_a} times B (16x{n}, {b_major}) "
            f"from shared memory through matrix descriptors, f32 accumulators "
            f"(D = A @ B + D, or A @ B where scale_d is 0).",
    )


def b_major(atom: Atom) -> str:
    """``"MN"`` for the ``_tnspb`` wgmma variants, ``"K"`` otherwise."""
    return "MN" if atom.trans else "K"


def a_major(atom: Atom) -> str:
    """``"MN"`` for the ``_ss_tnspa`` wgmma variants (A read M-major from shared memory), ``"K"``
    otherwise."""
    return "MN" if atom.trans_a else "K"


_WGMMA_ATOMS: list[Atom] = []
for _ab in (dt.f16, dt.bf16):
    for _a_regs in (False, True):
        for _tnsp in (False, True):
            for _n in WGMMA_N:
                _a = _wgmma(_n, _ab, _a_regs, _tnsp)
                globals()[_a.name] = _a
                _WGMMA_ATOMS.append(_a)
    # A MN-major with a K-major B: C^T = B^T A^T of a row-major B (swap_ab)
    for _n in WGMMA_N:
        _a = _wgmma(_n, _ab, False, False, tnsp_a=True)
        globals()[_a.name] = _a
        _WGMMA_ATOMS.append(_a)
del _ab, _a_regs, _tnsp, _n, _a

WGMMA_ATOMS: tuple[Atom, ...] = tuple(_WGMMA_ATOMS)


def wgmma_atom(n: int, ab: dt.DType | str = "f16", *, a_in_registers: bool = False,
               b_mn_major: bool = False, a_mn_major: bool = False) -> Atom:
    """The wgmma record for ``m64n{n}k16`` with ``ab`` inputs and f32 accumulators (an MN-major A
    from shared memory with a K-major B: ``a_mn_major=True``)."""
    ab = dt.dtype(ab)
    if n not in WGMMA_N or ab not in (dt.f16, dt.bf16):
        raise ValueError(f"wgmma_atom: no m64n{n}k16 record for {ab}; N must be one of 8, 16, ..., 256 "
                         f"and the type f16 or bf16")
    if a_mn_major and (a_in_registers or b_mn_major):
        raise ValueError("wgmma_atom: the MN-major A records read A from shared memory with a K-major B")
    kind = ("rs" if a_in_registers else "ss") + ("_tnspa" if a_mn_major else "") + ("_tnspb" if b_mn_major else "")
    return globals()[f"wgmma_m64n{n}k16_{ab}_f32_{kind}"]


def _sync(name: str, family: str, group: str, ptx: str, doc: str) -> Atom:
    return Atom(name=name, family=family, group=group, kind="Sync", shape=(), dtypes=(), operands=(),
                ptx=ptx, min_target="sm_90a", catalog=CATALOG, doc=doc)


wgmma_fence = _sync(
    "wgmma_fence", WGMMA_SYNC, WARPGROUP, "wgmma.fence.sync.aligned;",
    "Order the warpgroup's earlier register accesses before the wgmma that follow; needed before "
    "the first wgmma and after registers a wgmma uses were touched by other instructions.")
wgmma_commit = _sync(
    "wgmma_commit", WGMMA_SYNC, WARPGROUP, "wgmma.commit_group.sync.aligned;",
    "Close the warpgroup's open group of wgmma operations.")
wgmma_wait = _sync(
    "wgmma_wait", WGMMA_SYNC, WARPGROUP, "wgmma.wait_group.sync.aligned $n;",
    "Wait until at most $n committed wgmma groups are pending ($n an immediate: "
    "catalog.with_immediates); only then may their accumulators and A registers be accessed.")


# --------------------------------------------------------------------------- TMA

tma_load_2d = Atom(
    name="tma_load_2d", family=TMA, group=THREAD, kind="Move", shape=(),
    dtypes=(("dst", dt.u8), ("src", dt.u8)),
    operands=(Operand("dst", "in", "SH"), Operand("tmap", "in", "GL"), _scalar("c0"), _scalar("c1"),
              Operand("mbar", "in", "SH")),
    ptx="cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[$dst], [$tmap, {$c0, $c1}], [$mbar];",
    min_target="sm_90a", alignment=128, src_memory="GL", dst_memory="SH",
    semantics=identity, catalog=CATALOG,
    doc="TMA load of the tensor map's 2-D box at column $c0, row $c1 into shared memory at $dst "
        "(out-of-bounds elements are zeros); its bytes complete a transaction on mbarrier $mbar.",
)

tma_load_2d_multicast = Atom(
    name="tma_load_2d_multicast", family=TMA, group=THREAD, kind="Move", shape=(),
    dtypes=(("dst", dt.u8), ("src", dt.u8), ("mask", dt.i32)),
    operands=(Operand("dst", "in", "SH"), Operand("tmap", "in", "GL"), _scalar("c0"), _scalar("c1"),
              Operand("mbar", "in", "SH"), _scalar("mask")),
    ptx="{ .reg .b16 fs_m; cvt.u16.u32 fs_m, $mask; "
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
        "[$dst], [$tmap, {$c0, $c1}], [$mbar], fs_m; }",
    min_target="sm_90a", alignment=128, src_memory="GL", dst_memory="SH",
    semantics=identity, catalog=CATALOG,
    doc="TMA load of the tensor map's 2-D box at column $c0, row $c1 into the shared memory of every "
        "block of the cluster whose rank is set in the 16-bit $mask, at the same offset $dst in each; "
        "in each, its bytes complete a transaction on the mbarrier at offset $mbar.",
)

tma_store_2d = Atom(
    name="tma_store_2d", family=TMA, group=THREAD, kind="Move", shape=(),
    dtypes=(("dst", dt.u8), ("src", dt.u8)),
    operands=(Operand("tmap", "in", "GL"), _scalar("c0"), _scalar("c1"), Operand("src", "in", "SH")),
    ptx="cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [$tmap, {$c0, $c1}], [$src];",
    min_target="sm_90a", alignment=128, src_memory="SH", dst_memory="GL",
    semantics=identity, catalog=CATALOG,
    doc="TMA store of a 2-D box from shared memory at $src to the tensor map at column $c0, row $c1 "
        "(out-of-bounds elements are dropped), in the issuing thread's bulk async-group.",
)

tma_load_3d = Atom(
    name="tma_load_3d", family=TMA, group=THREAD, kind="Move", shape=(),
    dtypes=(("dst", dt.u8), ("src", dt.u8)),
    operands=(Operand("dst", "in", "SH"), Operand("tmap", "in", "GL"), _scalar("c0"), _scalar("c1"), _scalar("c2"),
              Operand("mbar", "in", "SH")),
    ptx="cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[$dst], [$tmap, {$c0, $c1, $c2}], [$mbar];",
    min_target="sm_90a", alignment=128, src_memory="GL", dst_memory="SH",
    semantics=identity, catalog=CATALOG,
    doc="TMA load of the rank-3 tensor map's box at column $c0, row $c1, outer index $c2 (the batch) into "
        "shared memory at $dst, row-major over the box (out-of-bounds elements of any dimension are zeros); "
        "its bytes (the whole box's) complete a transaction on mbarrier $mbar.",
)

tma_store_3d = Atom(
    name="tma_store_3d", family=TMA, group=THREAD, kind="Move", shape=(),
    dtypes=(("dst", dt.u8), ("src", dt.u8)),
    operands=(Operand("tmap", "in", "GL"), _scalar("c0"), _scalar("c1"), _scalar("c2"), Operand("src", "in", "SH")),
    ptx="cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [$tmap, {$c0, $c1, $c2}], [$src];",
    min_target="sm_90a", alignment=128, src_memory="SH", dst_memory="GL",
    semantics=identity, catalog=CATALOG,
    doc="TMA store of a box from shared memory at $src (row-major over the box) to the rank-3 tensor map at "
        "column $c0, row $c1, outer index $c2 (out-of-bounds elements of any dimension are dropped), in the "
        "issuing thread's bulk async-group.",
)

def _tma_nd(rank: int, load: bool) -> Atom:
    """The TMA load of a rank-``rank`` tensor map's box into shared memory, or the store of a box
    from shared memory into one (rank 4 and 5: tensors with several batch dims, attention's
    (batch, heads, keys, head dim) K and V, and its (batch, kv heads, grouped heads, queries,
    head dim) output)."""
    cs = tuple(f"c{i}" for i in range(rank))
    coords = f"{{{', '.join('$' + c for c in cs)}}}"
    where = (f"coordinates $c0 (column), $c1 (row), {', '.join('$' + c for c in cs[2:])} (outer indices, "
             f"innermost first)")
    if load:
        return Atom(
            name=f"tma_load_{rank}d", family=TMA, group=THREAD, kind="Move", shape=(),
            dtypes=(("dst", dt.u8), ("src", dt.u8)),
            operands=(Operand("dst", "in", "SH"), Operand("tmap", "in", "GL"), *(_scalar(c) for c in cs),
                      Operand("mbar", "in", "SH")),
            ptx=f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes "
                f"[$dst], [$tmap, {coords}], [$mbar];",
            min_target="sm_90a", alignment=128, src_memory="GL", dst_memory="SH",
            semantics=identity, catalog=CATALOG,
            doc=f"TMA load of the rank-{rank} tensor map's box at {where} into shared memory at $dst, "
                f"row-major over the box (out-of-bounds elements are zeros); its bytes complete a "
                f"transaction on mbarrier $mbar.",
        )
    return Atom(
        name=f"tma_store_{rank}d", family=TMA, group=THREAD, kind="Move", shape=(),
        dtypes=(("dst", dt.u8), ("src", dt.u8)),
        operands=(Operand("tmap", "in", "GL"), *(_scalar(c) for c in cs), Operand("src", "in", "SH")),
        ptx=f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group [$tmap, {coords}], [$src];",
        min_target="sm_90a", alignment=128, src_memory="SH", dst_memory="GL",
        semantics=identity, catalog=CATALOG,
        doc=f"TMA store of a box from shared memory at $src (row-major over the box) to the rank-{rank} tensor "
            f"map at {where}; out-of-bounds elements of any dimension are dropped; in the issuing thread's "
            f"bulk async-group.",
    )


tma_load_4d = _tma_nd(4, load=True)
tma_load_5d = _tma_nd(5, load=True)
tma_store_4d = _tma_nd(4, load=False)
tma_store_5d = _tma_nd(5, load=False)

#: The tensor-map loads and stores by rank (their coordinates are ``c0`` .. ``c{rank-1}``).
TMA_LOADS = {2: tma_load_2d, 3: tma_load_3d, 4: tma_load_4d, 5: tma_load_5d}
TMA_STORES = {2: tma_store_2d, 3: tma_store_3d, 4: tma_store_4d, 5: tma_store_5d}

tma_commit = _sync(
    "tma_commit", TMA, THREAD, "cp.async.bulk.commit_group;",
    "Close the calling thread's open bulk async-group (TMA stores).")
tma_wait_read = _sync(
    "tma_wait_read", TMA, THREAD, "cp.async.bulk.wait_group.read $n;",
    "Wait until at most $n bulk async-groups of the thread still read their shared-memory "
    "sources ($n an immediate); the sources may then be overwritten.")
tma_wait = _sync(
    "tma_wait", TMA, THREAD, "cp.async.bulk.wait_group $n;",
    "Wait until at most $n bulk async-groups of the thread are pending, writes included "
    "($n an immediate).")


# --------------------------------------------------------------------------- mbarrier

def _mbar(name: str, ptx: str, extra: tuple[str, ...], doc: str) -> Atom:
    return Atom(
        name=name, family=MBARRIER, group=THREAD, kind="Sync", shape=(),
        dtypes=tuple((e, dt.i32) for e in extra),
        operands=(Operand("bar", "in", "SH"), *(_scalar(e) for e in extra)),
        ptx=ptx, min_target="sm_90a", alignment=8, catalog=CATALOG, doc=doc)


mbarrier_init = _mbar(
    "mbarrier_init", "mbarrier.init.shared::cta.b64 [$bar], $count;", ("count",),
    "Initialise the mbarrier at $bar for $count arrivals per phase (phase 0, no transactions).")
mbarrier_arrive = _mbar(
    "mbarrier_arrive", "mbarrier.arrive.shared::cta.b64 _, [$bar];", (),
    "Arrive on the mbarrier at $bar once.")
mbarrier_arrive_expect_tx = _mbar(
    "mbarrier_arrive_expect_tx", "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$bar], $bytes;",
    ("bytes",),
    "Expect $bytes more transaction bytes in the current phase of the mbarrier at $bar, then arrive.")
mbarrier_try_wait = _mbar(
    "mbarrier_try_wait",
    "{ .reg .pred fs_p; fs_wait_$uid: mbarrier.try_wait.parity.shared::cta.b64 fs_p, [$bar], $parity; "
    "@fs_p bra fs_done_$uid; bra fs_wait_$uid; fs_done_$uid: }",
    ("parity",),
    "Spin until the phase of parity $parity of the mbarrier at $bar has completed (returns at once "
    "when the current phase has the other parity); $uid numbers the loop's labels per call site.")

mbarrier_try_wait_cluster = _mbar(
    "mbarrier_try_wait_cluster",
    "{ .reg .pred fs_p; fs_wait_$uid: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 fs_p, [$bar], "
    "$parity; @fs_p bra fs_done_$uid; bra fs_wait_$uid; fs_done_$uid: }",
    ("parity",),
    "mbarrier_try_wait with acquire semantics at cluster scope: the wait of a block whose mbarrier "
    "other blocks' st.async stores complete (their complete_tx releases at cluster scope), after "
    "which it reads what they stored.")


mbarrier_arrive_cluster = _mbar(
    "mbarrier_arrive_cluster",
    "{ .reg .b32 fs_r; mapa.shared::cluster.u32 fs_r, $bar, $cta; "
    "mbarrier.arrive.shared::cluster.b64 _, [fs_r]; }",
    ("cta",),
    "Arrive once on the mbarrier at offset $bar in the shared memory of the cluster's block of rank "
    "$cta (possibly the caller's own).  The arrival has the default release semantics at CTA scope: "
    "it tells another block that this block is done reading its own shared memory (which that "
    "block's TMA multicast may then overwrite); an explicit .release.cluster fence there measured "
    "twice as slow a GEMM on an H100.")

# --------------------------------------------------------------------------- fences, setmaxnreg

fence_proxy_async = _sync(
    "fence_proxy_async", FENCE, THREAD, "fence.proxy.async.shared::cta;",
    "Order the thread's earlier generic-proxy shared-memory accesses before later async-proxy "
    "accesses (TMA, wgmma operand reads) of the same memory.")
fence_mbarrier_init = _sync(
    "fence_mbarrier_init", FENCE, THREAD, "fence.mbarrier_init.release.cluster;",
    "Make the thread's earlier mbarrier.init visible to the async proxy and to the cluster.")

setmaxnreg_inc = _sync(
    "setmaxnreg_inc", SETMAXNREG, WARPGROUP, "setmaxnreg.inc.sync.aligned.u32 $n;",
    "Raise the warpgroup's per-thread register limit to $n (an immediate in 24..256, a multiple of 8).")
setmaxnreg_dec = _sync(
    "setmaxnreg_dec", SETMAXNREG, WARPGROUP, "setmaxnreg.dec.sync.aligned.u32 $n;",
    "Lower the warpgroup's per-thread register limit to $n (an immediate in 24..256, a multiple of 8).")


# --------------------------------------------------------------------------- clusters

barrier_cluster = Atom(
    name="barrier_cluster", family=CLUSTER, group=THREAD, kind="Sync", shape=(), dtypes=(), operands=(),
    ptx="barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;",
    min_target="sm_90a", catalog=CATALOG,
    doc="Every thread of every block of the cluster arrives, then waits for all the others: the "
        "blocks' earlier accesses (mbarrier initialisation included) are visible cluster-wide after it, "
        "and no block leaves while another may still write its shared memory.")

# --------------------------------------------------------------------------- distributed shared memory

ld_shared_cluster_4 = Atom(
    name="ld_shared_cluster_4", family=DSMEM, group=THREAD, kind="Move", shape=(1, 4),
    dtypes=(("dst", dt.u8), ("src", dt.u8), ("cta", dt.i32)),
    operands=(Operand("dst", "out", "RF", regs=1, reg_bits=32, values=4,
                      tv=TVLayout(Layout((1, 4), (0, 1)), (1, 4))),
              Operand("src", "in", "SH", values=4, addr=Layout(1, 0)), _scalar("cta")),
    ptx="{ .reg .b32 fs_a; mapa.shared::cluster.u32 fs_a, $src, $cta; ld.shared::cluster.b32 $dst, [fs_a]; }",
    min_target="sm_90a", alignment=4, src_memory="SH", dst_memory="RF", width=4,
    semantics=identity, catalog=CATALOG,
    doc="Load 4 bytes from the shared memory of the cluster's block of rank $cta (possibly the "
        "caller's own), at the offset $src has in the caller's block: how the blocks of a cluster "
        "read each other's partial results.  Ordered after the other block's store by a "
        "barrier.cluster between them.")

st_async_cluster_4 = Atom(
    name="st_async_cluster_4", family=DSMEM, group=THREAD, kind="Move", shape=(1, 4),
    dtypes=(("dst", dt.u8), ("src", dt.u8), ("cta", dt.i32)),
    operands=(Operand("dst", "in", "SH", values=4, addr=Layout(1, 0)),
              Operand("src", "in", "RF", regs=1, reg_bits=32, values=4,
                      tv=TVLayout(Layout((1, 4), (0, 1)), (1, 4))),
              Operand("bar", "in", "SH"), _scalar("cta")),
    ptx="{ .reg .b32 fs_a, fs_b; mapa.shared::cluster.u32 fs_a, $dst, $cta; mapa.shared::cluster.u32 fs_b, $bar, $cta; "
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [fs_a], $src, [fs_b]; }",
    min_target="sm_90a", alignment=4, src_memory="RF", dst_memory="SH", width=4,
    semantics=identity, catalog=CATALOG,
    doc="Store 4 bytes into the shared memory of the cluster's block of rank $cta (possibly the "
        "caller's own), at the offset $dst has in the caller's block, asynchronously: the store "
        "completes 4 transaction bytes on that block's mbarrier at the offset $bar has.  The receiver "
        "reads the data after its wait on the mbarrier's phase (no barrier.cluster): how a block "
        "pushes its partial result into every block of its cluster.")

# --------------------------------------------------------------------------- stmatrix

def _stmatrix(ld: Atom, num: int) -> Atom:
    src_tv = ld.operand("dst").tv
    addr = ld.operand("src").addr
    trans = ld.trans
    suffix = f"x{num}" + (".trans" if trans else "")
    src = "{$src}" if num == 1 else "$src"
    tile = tuple(ld.shape)
    what = "transposed " if trans else ""
    return Atom(
        name=f"stmatrix_x{num}" + ("_trans" if trans else ""),
        family=STMATRIX, group=WARP, kind="Move", shape=tile,
        dtypes=(("dst", dt.f16), ("src", dt.f16)),
        operands=(
            Operand("dst", "in", "SH", values=8, addr=addr),
            Operand("src", "in", "RF", regs=num, values=2 * num, tv=src_tv),
        ),
        ptx=f"stmatrix.sync.aligned.m8n8.{suffix}.shared.b16 [$dst], {src};",
        min_target="sm_90a", alignment=16, src_memory="RF", dst_memory="SH", trans=trans,
        semantics=identity, catalog=CATALOG,
        doc=f"Warp store of a {tile[0]}x{tile[1]} register fragment of any 16-bit type (f16 nominal) "
            f"as {num} {what}8x8 matrices to shared memory: the inverse of {ld.name}.",
    )


stmatrix_x1 = _stmatrix(sm80.ldmatrix_x1, 1)
stmatrix_x2 = _stmatrix(sm80.ldmatrix_x2, 2)
stmatrix_x4 = _stmatrix(sm80.ldmatrix_x4, 4)
stmatrix_x1_trans = _stmatrix(sm80.ldmatrix_x1_trans, 1)
stmatrix_x2_trans = _stmatrix(sm80.ldmatrix_x2_trans, 2)
stmatrix_x4_trans = _stmatrix(sm80.ldmatrix_x4_trans, 4)

STMATRIX_ATOMS = (stmatrix_x1, stmatrix_x2, stmatrix_x4, stmatrix_x1_trans, stmatrix_x2_trans,
                  stmatrix_x4_trans)


# --------------------------------------------------------------------------- programmatic launches

griddep_launch_dependents = Atom(
    name="griddep_launch_dependents", family=GRIDDEP, group=THREAD, kind="Sync", shape=(), dtypes=(), operands=(),
    ptx="griddepcontrol.launch_dependents;", min_target="sm_90a", catalog=CATALOG,
    doc="Let the next kernel of the stream, launched programmatically, start once every block of this grid "
        "has issued this (or exited): its blocks become resident while this grid finishes.  It orders no "
        "memory: the dependent kernel must still wait (griddep_wait) before touching what this one writes.")

griddep_wait = Atom(
    name="griddep_wait", family=GRIDDEP, group=THREAD, kind="Sync", shape=(), dtypes=(), operands=(),
    ptx="griddepcontrol.wait;", min_target="sm_90a", catalog=CATALOG,
    doc="In a programmatically launched kernel: wait until the grids it depends on have completed and their "
        "memory operations are visible (a no-op in a kernel launched the ordinary way).")


ATOMS: tuple[Atom, ...] = (
    *WGMMA_ATOMS, wgmma_fence, wgmma_commit, wgmma_wait,
    tma_load_2d, tma_load_2d_multicast, tma_store_2d, tma_load_3d, tma_store_3d, tma_load_4d, tma_load_5d,
    tma_store_4d, tma_store_5d,
    tma_commit, tma_wait_read,
    tma_wait,
    mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_try_wait, mbarrier_try_wait_cluster,
    mbarrier_arrive_cluster,
    fence_proxy_async, fence_mbarrier_init, setmaxnreg_inc, setmaxnreg_dec, barrier_cluster,
    ld_shared_cluster_4, st_async_cluster_4, *STMATRIX_ATOMS, griddep_launch_dependents, griddep_wait,
)

__all__ = ["ATOMS", "WGMMA_ATOMS", "STMATRIX_ATOMS", "TMA_LOADS", "TMA_STORES", "FAMILIES", "SmemDescriptor", "smem_descriptor",
           "decode_smem_descriptor", "descriptor_byte_offsets", "canonical_offset", "operand_byte_offsets", "box_byte_offsets",
           "box_byte_offsets_nd", "tma_box_problems",
           "tv_d", "TV_A_RS", "wgmma_atom", "b_major", "is_descriptor", "is_scalar"]
