"""Schedule → kernel IR for the Hopper GEMM: TMA copies into a ring of shared-memory stages guarded
by mbarriers, wgmma from shared memory, register accumulators, and an epilogue.

It reads schedules of this shape (``recipes.gemm(..., arch="sm_90a")`` builds one)::

    tile(m=BM, n=BN) >> to_blocks(group=G[, persistent=True])
    tile(k=64)                                    # one 128-byte swizzle span of 16-bit K
    move_to_smem("A", via=sm90a.tma_load_2d), move_to_smem("B", via=sm90a.tma_load_2d)
    pipeline(stages=S)                            # S shared stages
    [warp_specialize(producer_regs, consumer_regs)]
    tile(m=64) >> to_warpgroups()                 # BM/64 (consumer) warpgroups, each 64 x BN
    tile(k=16) >> done(sm90a.wgmma_m64n{BN}k16_..._ss[_tnspb])
    epilogue(...)

Without ``warp_specialize`` (``_kernel``) every warpgroup computes and thread 0 also issues the
copies, S-1 tiles ahead::

    thread 0: init full[s]; barrier; TMA tiles 0..S-2
    for kt:   wait full[kt % S] (parity (kt / S) % 2)
              wgmma.fence; BK/16 x wgmma; commit; wait 0
              barrier                                   # every warpgroup is done with stage kt-1
              thread 0: TMA tile kt+S-1 -> stage (kt+S-1) % S
    epilogue: D fragments -> ops -> global (predicated)

With it (``_kernel_ws``) warpgroup 0 is the producer and the others consume (see its docstring):
full and empty mbarriers per stage, one wgmma group kept in flight, ``setmaxnreg`` moving
registers to the consumers, optionally persistent blocks (grid = SMs, tiles in grouped order),
and the TMA-store epilogue (``_epilogue_tma``: swizzled staging buffers per warpgroup, named
barriers, ``cp.async.bulk.tensor`` stores) where C's rows are 16-byte multiples.

Shared layouts (16-bit elements, 128-byte swizzle on absolute addresses, stages 1024-aligned):
A is K-major, BM rows of 64 k (one box of BM x 64); B row-major (MN-major for wgmma) is BN/64 boxes
of 64 k-rows x 64 n, each a block of 8 KiB: descriptor LBO = block stride, SBO = 8 rows x 128 B;
B column-major (K-major) is laid out like A.  Operands whose rows are not 16-byte multiples are
copied first into padded workspaces (``_pad_kernel``).

With ``to_blocks(cluster=2)`` (warp-specialized only) pairs of blocks form thread-block clusters
that take two consecutive M tiles of one N tile (``_cluster_tiles``): each block loads its A tile
and multicasts half of the shared B tile into both blocks (``_issue``), each block's empty
barriers count the consumer warpgroups of both blocks (which arrive remotely), and
``barrier.cluster`` follows the mbarrier initialisation and ends the kernel.

Not yet: clusters of more than 2 blocks or along N, split-K, a ping-pong consumer schedule,
column-major A, more than 3 consumer warpgroups with warp specialization.
"""

from __future__ import annotations

import attrs

from .. import ir
from ..dtypes import f32, u8
from ..errors import ScheduleError
from ..hardware.atoms import catalog, sm90a
from ..ir.expr import Var, ge, land, lt
from ..schedule import Node
from ..spec import MatMul, Move
from ..tensor import BLOCK, GL, SH, WARPGROUP
from .gemm_sm80 import Lowering, _div, _err, _min, _mod

SPAN = 128                 # bytes of one 128B-swizzle row (the C staging of the TMA-store epilogue)
STAGE_ALIGN = 1024         # a 128B swizzle pattern repeats every 8 rows of 128 bytes
PAD_CHUNK = 16             # bytes one thread of the row-padding kernel stores
PAD_THREADS = 256
STORE_BUFFERS = 2          # TMA-store staging buffers per consumer warpgroup
EPILOGUE_BARRIER = 1       # named barrier id of consumer warpgroup 0 (warpgroup w uses 1 + w)
MODES = (32, 64, 128)      # swizzle spans (bytes) that wgmma descriptors and TMA share
MAX_CONSUMER_WARPGROUPS = 3   # block_m=256 (4 consumer warpgroups, 640 threads) hangs on the H100


def uses_wgmma(sched) -> bool:
    return any(n.atom is not None and getattr(n.atom, "family", "") == "wgmma" for n in sched.nodes())


def _unsupported(node, what: str, fix: str) -> ScheduleError:
    return _err(node, f"the sm_90a GEMM lowering does not handle {what}", fix=fix)


class HopperGemmLowering(Lowering):
    """See the module docstring."""

    def run(self) -> ir.Program:
        if not self.target.has_wgmma:
            raise _err(self.root, f"wgmma needs sm_90a; the target is {self.target.name}", field="target",
                       value=self.target.name, allowed="sm_90a", fix="check/compile with arch='sm_90a'")
        self.regs, self.shared = {}, {}
        p = self._pattern()
        # TMA needs row strides that are multiples of 16 bytes: an operand whose rows are not is
        # first copied into a workspace with padded rows (one memory-bound pass), and the tensor
        # map reads that; the padding columns lie outside the map's extent, so they are never read
        self.padded: dict[str, ir.GlobalBuffer] = {}
        self.workspaces: list[ir.GlobalBuffer] = []
        for t in (self.spec.a, self.spec.b):
            src = self.gbuf(t)
            eb = src.dtype.bits // 8
            if (src.shape[1] * eb) % 16:
                ld = -(-src.shape[1] * eb // 16) * 16 // eb
                # the workspace holds whole padded rows; the tensor map sees the same memory as
                # rows x cols with a row stride of ld
                store = ir.GlobalBuffer(f"{src.name}_padded", src.dtype, (src.shape[0], ld), (ld, 1), "workspace")
                self.padded[src.name] = attrs.evolve(store, shape=src.shape)
                self.workspaces.append(store)
                self.kernels.append(self._pad_kernel(src, store))
                self.regs = {}
        self.kernels.append(self._kernel(p))
        inputs = [self.gbuf(self.spec.a), self.gbuf(self.spec.b)] + [self.extra_buf(e) for e in self.extras]
        return ir.Program(tuple(self.kernels), tuple(inputs), self.gl[self.spec.c.name], tuple(self.workspaces))

    def _pad_kernel(self, src: ir.GlobalBuffer, dst: ir.GlobalBuffer) -> ir.Kernel:
        """Copy ``src`` into ``dst``, whose rows are padded to a multiple of 16 bytes: each thread
        moves one 16-byte chunk of a padded row (element loads, zeros past the row's end, one
        vector store)."""
        rows, cols = src.shape
        ld = dst.shape[1]
        eb = src.dtype.bits // 8
        v = PAD_CHUNK // eb
        chunks = ld // v
        total = rows * chunks
        T = PAD_THREADS
        blocks = -(-total // T)
        tid = ir.tid(T)
        idx = ir.bid(0, blocks) * T + tid
        row, c0 = idx // chunks, (idx % chunks) * v
        vals = self.reg("chunk", src.dtype, v)
        ld_atom = catalog.copy_atom("GL", "RF", eb)
        st_atom = catalog.copy_atom("RF", "GL", PAD_CHUNK)
        body = [ir.AtomCall(ld_atom, (("dst", ir.RegRef(vals, j)), ("src", ir.MemRef(src, row * cols + c0 + j))),
                            lt(c0 + j, cols), f"element {j} (zero past the row's end)") for j in range(v)]
        body.append(ir.AtomCall(st_atom, (("dst", ir.MemRef(dst, row * ld + c0)), ("src", ir.RegRef(vals, 0))),
                                1, f"{PAD_CHUNK} bytes of the padded row"))
        note = f"{src.name} ({rows}x{cols}, rows of {cols * eb} bytes) -> {dst.name} (rows of {ld * eb} bytes)"
        return ir.Kernel(f"firesched_pad_{src.name}", (src, dst), (blocks, 1, 1), T, (), (vals,),
                         ir.Seq((ir.Comment(note), ir.If(lt(idx, total), ir.Seq(tuple(body))))), header=note)

    # ------------------------------------------------------------------ reading the tree

    def _pattern(self) -> dict:
        root = self.root
        if not root.loops or any(lp.unit != BLOCK for lp in root.loops) or \
                sorted(lp.dim for lp in root.loops) != ["m", "n"]:
            raise _unsupported(root, "this kernel-level refinement (split-K across blocks, or no M x N block "
                                     "tiling)", "start with tile(m=..., n=...) >> to_blocks()")
        block = root.body[-1]
        kl = [lp for lp in block.loops if lp.dim == "k" and lp.unit is None]
        if len(block.loops) != 1 or not kl or len(block.post) != 1 or not isinstance(block.post[0].spec, Move):
            raise _unsupported(block, "a block refinement other than tile(k=...)",
                               "tile(k=64) right after the block mapping")
        kloop = kl[0]
        moves, n = {}, block.body[-1]
        while not n.loops and n.atom is None:
            for c in n.body[:-1]:
                if isinstance(c.spec, Move) and c.spec.src.memory == GL and c.spec.dst.memory == SH:
                    moves[c.spec.dst.name] = c
            n = n.body[-1]
        for name in (self.spec.a.name, self.spec.b.name):
            mv = moves.get(name)
            if mv is None or not mv.via or mv.via[0].family != "tma":
                raise _unsupported(block, f"{name} without a TMA copy",
                                   f"move_to_smem({name!r}, via=(sm90a.tma_load_2d,))")
        wg = n
        if len(wg.loops) != 1 or wg.loops[0].unit != WARPGROUP or wg.loops[0].dim != "m":
            raise _unsupported(wg, "a warpgroup tiling other than tile(m=64) >> to_warpgroups()",
                               "tile(m=64) >> to_warpgroups()")
        ks_node = wg.body[-1]
        if len(ks_node.loops) != 1 or ks_node.loops[0].dim != "k" or ks_node.loops[0].unit is not None:
            raise _unsupported(ks_node, "a warpgroup refinement other than tile(k=16)", "tile(k=16) >> done(wgmma)")
        leaf = ks_node.body[-1]
        atom = leaf.atom
        if atom is None or atom.family != "wgmma" or any(o.name == "a" for o in atom.operands):
            raise _unsupported(leaf, "A from registers (wgmma ..._rs) yet", "use a wgmma ..._ss atom")
        bspec: MatMul = block.spec
        BM, BN = bspec.m, bspec.n
        BK = kloop.step("k")
        A, B = self.spec.a.tensor, self.spec.b.tensor
        eb = A.dtype.bits // 8
        if A.major != "k":
            raise _unsupported(block, "a column-major A", "pass A row-major (layout='R?')")
        b_mn = B.major == "n"
        if b_mn != (sm90a.b_major(atom) == "MN"):
            want = "the _tnspb variant" if b_mn else "the plain _ss variant"
            raise _err(leaf, f"B is {'row' if b_mn else 'column'}-major, so wgmma reads it "
                             f"{'MN' if b_mn else 'K'}-major", field="atom", value=atom, fix=f"use {want}")
        # swizzle modes, from the shared tiles' swizzles (move_to_smem picks them from the tile
        # shape; a user's swizzle= overrides): a K-major operand's K tile is one swizzle span, a
        # row-major B is loaded in boxes one span wide
        an, bn_ = self.spec.a.name, self.spec.b.name
        wa, wb = self._mode(moves, an, eb), self._mode(moves, bn_, eb)
        if wa != BK * eb:
            raise _err(moves[an], f"A's shared swizzle spans {wa} bytes but its K tile is {BK * eb} bytes: wgmma "
                                   f"reads a K-major tile one swizzle span deep", field="swizzle",
                       value=moves[an].spec.dst.tensor.swizzle,
                       allowed=f"a {BK * eb}-byte span ({', '.join(f'{w} B: tile(k={w // eb})' for w in MODES)})",
                       fix="drop swizzle= to let move_to_smem choose, or change tile(k=...)")
        if not b_mn and wb != BK * eb:
            raise _err(moves[bn_], f"B's shared swizzle spans {wb} bytes but its K tile is {BK * eb} bytes",
                       field="swizzle", value=moves[bn_].spec.dst.tensor.swizzle, allowed=f"a {BK * eb}-byte span",
                       fix="drop swizzle= to let move_to_smem choose, or change tile(k=...)")
        if BK * eb not in MODES:
            raise _unsupported(block, f"a K tile of {BK} ({BK * eb} bytes; one swizzle span of "
                                      f"{', '.join(map(str, MODES))} bytes)",
                               ", ".join(f"tile(k={w // eb})" for w in MODES))
        if wg.loops[0].step("m") != 64 or BM % 64 or BM > 256:
            raise _unsupported(wg, f"a block tile of {BM} rows (64 per warpgroup, at most 4 warpgroups)",
                               "block_m in 64, 128, 192, 256")
        if b_mn and BN % (wb // eb):
            raise _unsupported(block, f"BN={BN} with a row-major B (boxes of {wb // eb} columns, one {wb}-byte "
                                      f"swizzle span)", f"a multiple of {wb // eb}")
        persistent = any(lp.persistent for lp in root.loops)
        cluster = max(lp.cluster for lp in root.loops)
        if cluster > 1:
            if not self.target.has_clusters:
                raise _err(root, f"thread-block clusters need sm_90a; the target is {self.target.name}",
                           field="cluster", value=cluster, allowed="1", fix="to_blocks() without cluster=")
            if not kloop.specialize:
                raise _unsupported(root, "clusters without warp specialization",
                                   "add warp_specialize() after pipeline(...), or drop cluster=")
            if b_mn and (BN // (wb // eb)) % cluster:
                raise _unsupported(block, f"a cluster of {cluster} sharing {BN // (wb // eb)} B box(es) of "
                                          f"{wb // eb} columns (each block multicasts an equal share)",
                                   f"block_n a multiple of {cluster * (wb // eb)}, or cluster=1")
            if not b_mn and BN % (8 * cluster):
                raise _unsupported(block, f"a cluster of {cluster} sharing a K-major B tile of {BN} rows",
                                   f"block_n a multiple of {8 * cluster}")
        if persistent and not kloop.specialize:
            raise _unsupported(root, "a persistent block without warp specialization",
                               "add warp_specialize() after pipeline(...), or drop persistent=True")
        if kloop.specialize and BM // 64 > MAX_CONSUMER_WARPGROUPS:
            raise _unsupported(wg, f"{BM // 64} consumer warpgroups with warp specialization (a block tile of "
                                   f"{BM} rows; with 4, the H100 hung in our tests)",
                               f"block_m <= {64 * MAX_CONSUMER_WARPGROUPS} with warp_specialize(), or no "
                               f"warp_specialize() for block_m=256")
        if kloop.specialize:
            regs = 128 * (kloop.specialize[0] + (BM // 64) * kloop.specialize[1])
            if regs > self.target.regs_per_sm:
                raise _err(block, f"setmaxnreg budget: 128 x {kloop.specialize[0]} producer + {BM // 64} x 128 x "
                                  f"{kloop.specialize[1]} consumer registers = {regs}", field="consumer_regs",
                           value=kloop.specialize[1], allowed=f"a total <= {self.target.regs_per_sm}",
                           fix="lower consumer_regs (e.g. 232 for 2 consumer warpgroups, 152 for 3)")
        return dict(root=root, block=block, kloop=kloop, wg=wg, leaf=leaf, atom=atom, BM=BM, BN=BN, BK=BK,
                    S=max(kloop.stages, 2), eb=eb, b_mn=b_mn, store=block.post[0], persistent=persistent,
                    specialize=kloop.specialize, wa=wa, wb=wb, cluster=cluster)

    def _mode(self, moves, name: str, eb: int) -> int:
        """Bytes of the swizzle span of operand ``name``'s shared tile (32, 64 or 128)."""
        node = moves[name]
        sw = node.spec.dst.tensor.swizzle
        w = 16 << sw.bits if sw is not None and sw.bits and (1 << sw.base) * eb == 16 else 0
        if w not in MODES:
            raise _err(node, f"{name}'s shared tile has swizzle {sw}, which is no wgmma/TMA swizzle mode", field="swizzle",
                       value=sw, allowed="Sw<1,M,S>, Sw<2,M,S>, Sw<3,M,S> on 16-byte units (32, 64, 128-byte spans)",
                       fix="drop swizzle= to let move_to_smem choose")
        return w

    # ------------------------------------------------------------------ the kernel

    def _operands(self, p) -> dict:
        """Tensor maps, the shared stage ring and the byte count of one stage."""
        BM, BN, BK, S = p["BM"], p["BN"], p["BK"], p["S"]
        ga, gb = self.gbuf(self.spec.a), self.gbuf(self.spec.b)
        ga, gb = self.padded.get(ga.name, ga), self.padded.get(gb.name, gb)
        dt = ga.dtype
        wa, wb, eb = p["wa"], p["wb"], p["eb"]
        # with a cluster of C, each block multicasts 1/C of B: a K-major B in boxes of BN/C rows
        b_box = (BK, wb // eb) if p["b_mn"] else (BN // p["cluster"], BK)
        o = dict(tm_a=ir.TensorMapParam(f"tmap_{ga.name}", ga, (BM, BK), wa),
                 tm_b=ir.TensorMapParam(f"tmap_{gb.name}", gb, b_box, wb),
                 a_stage=BM * BK, b_stage=BK * BN)
        o["sa"] = ir.SharedBuffer("A_smem", dt, S * o["a_stage"], STAGE_ALIGN,
                                  f"{S} stages x {BM}x{BK} {dt}, K-major, {wa}B swizzle")
        o["sb"] = ir.SharedBuffer("B_smem", dt, S * o["b_stage"], STAGE_ALIGN,
                                  f"{S} stages x {BK}x{BN} {dt}, {'MN' if p['b_mn'] else 'K'}-major, {wb}B swizzle")
        o["stage_bytes"] = (o["a_stage"] + o["b_stage"]) * p["eb"]
        return o

    def _issue(self, p, o, kt, stage, bar, m0, n0, rank=0) -> list:
        """expect_tx on the stage's full barrier, then the TMA boxes of K tile ``kt``.

        In a cluster of C the block of rank ``rank`` loads its own A tile and 1/C of the B tile the
        cluster shares, multicast to every block (each block's full barrier still expects the
        whole stage: its A, and B from all C blocks)::

            row-major B, boxes b0 b1 b2 b3 (one swizzle span wide):   rank 0: b0, b2   rank 1: b1, b3
            K-major B, BN rows:                                        rank r: rows r*BN/C ..
        """
        BM, BN, BK = p["BM"], p["BN"], p["BK"]
        sa, sb, a_stage, b_stage = o["sa"], o["sb"], o["a_stage"], o["b_stage"]
        C = p["cluster"]
        out = [_call(sm90a.mbarrier_arrive_expect_tx, bar=bar, bytes=ir.Scalar(o["stage_bytes"])),
               _call(sm90a.tma_load_2d, dst=ir.MemRef(sa, stage * a_stage), tmap=o["tm_a"],
                     c0=ir.Scalar(kt * BK), c1=ir.Scalar(m0), mbar=bar, comment=f"A tile {BM}x{BK}")]
        if C > 1:
            mask = ir.Scalar((1 << C) - 1)
            if p["b_mn"]:
                bx = p["wb"] // p["eb"]
                for j in range(BN // bx // C):
                    c = j * C + rank
                    out.append(_call(sm90a.tma_load_2d_multicast, dst=ir.MemRef(sb, stage * b_stage + c * BK * bx),
                                     tmap=o["tm_b"], c0=ir.Scalar(n0 + c * bx), c1=ir.Scalar(kt * BK), mbar=bar,
                                     mask=mask, comment=f"B columns ({j * C} + rank) * {bx}..+{bx}, to every block "
                                                        f"of the cluster"))
            else:
                h = BN // C
                out.append(_call(sm90a.tma_load_2d_multicast, dst=ir.MemRef(sb, stage * b_stage + rank * h * BK),
                                 tmap=o["tm_b"], c0=ir.Scalar(kt * BK), c1=ir.Scalar(n0 + rank * h), mbar=bar,
                                 mask=mask, comment=f"B rows rank * {h}..+{h}, to every block of the cluster"))
            return out
        if p["b_mn"]:
            bx = p["wb"] // p["eb"]              # columns per box: one swizzle span
            for c in range(BN // bx):
                out.append(_call(sm90a.tma_load_2d, dst=ir.MemRef(sb, stage * b_stage + c * BK * bx),
                                 tmap=o["tm_b"], c0=ir.Scalar(n0 + c * bx), c1=ir.Scalar(kt * BK), mbar=bar,
                                 comment=f"B columns {c * bx}..+{bx}"))
        else:
            out.append(_call(sm90a.tma_load_2d, dst=ir.MemRef(sb, stage * b_stage), tmap=o["tm_b"],
                             c0=ir.Scalar(kt * BK), c1=ir.Scalar(n0), mbar=bar, comment=f"B tile {BN}x{BK}"))
        return out

    def _mma(self, p, o, stage, wg, acc) -> list:
        """wgmma.fence, the BK/16 wgmma of one K tile (warpgroup ``wg``'s 64 rows), commit."""
        BK, a_stage, b_stage = p["BK"], o["a_stage"], o["b_stage"]
        sa, sb = o["sa"], o["sb"]
        steps = []
        wa, wb = p["wa"], p["wb"]
        for j in range(BK // 16):
            # K-major: rows of one span, 8-row groups SBO apart; MN-major B: boxes one span wide
            # (LBO apart), 8-k-row groups SBO apart
            da = ir.DescRef(sa, stage * a_stage + wg * 64 * BK + j * 16, wa, 16, 8 * wa)
            if p["b_mn"]:
                db = ir.DescRef(sb, stage * b_stage + j * 16 * (wb // p["eb"]), wb, BK * wb, 8 * wb)
            else:
                db = ir.DescRef(sb, stage * b_stage + j * 16, wb, 16, 8 * wb)
            steps.append(_call(p["atom"], d=ir.RegRef(acc, 0), desc_a=da, desc_b=db, scale_d=ir.Scalar(1),
                               comment=f"k step {j}"))
        return [_call(sm90a.wgmma_fence), *steps, _call(sm90a.wgmma_commit)]

    def _kernel(self, p) -> ir.Kernel:
        if p["specialize"]:
            return self._kernel_ws(p)
        BM, BN, BK, S = p["BM"], p["BN"], p["BK"], p["S"]
        M, N, K = self.spec.m, self.spec.n, self.spec.k
        grid, _, _, m0, n0 = self._tiles(p)
        nwg = BM // 64
        self.threads = 128 * nwg
        tid = ir.tid(self.threads)
        wg = tid // 128
        lane = tid % 128
        o = self._operands(p)
        sa, sb = o["sa"], o["sb"]
        full = ir.MBarrier("full", S, note="one per stage: the stage's TMA bytes have landed")
        self.shared = {"A_smem": sa, "B_smem": sb, "full": full}
        acc = self.reg("C_acc", f32, BN // 2)
        nk = -(-K // BK)
        t0 = lt(tid, 1)

        body: list = [ir.Comment(str(p["block"].spec)), ir.RegFill(ir.RegRef(acc, 0), BN // 2, 0.0)]
        init = [_call(sm90a.mbarrier_init, bar=ir.MemRef(full, s), count=ir.Scalar(1)) for s in range(S)]
        body += [ir.If(t0, ir.Seq((*init, _call(sm90a.fence_mbarrier_init)))), ir.Barrier("mbarriers initialised")]
        pro = []
        for s in range(min(S - 1, nk)):
            pro += self._issue(p, o, s, s, ir.MemRef(full, s), m0, n0)
        body.append(ir.If(t0, ir.Seq(tuple(pro))))
        kt = Var(p["kloop"].var, nk)
        stage = kt % S
        ahead = kt + (S - 1)
        loop = [
            _call(sm90a.mbarrier_try_wait, bar=ir.MemRef(full, stage), parity=ir.Scalar((kt // S) % 2),
                  comment="the tile is in shared memory"),
            *self._mma(p, o, stage, wg, acc),
            _call(catalog.with_immediates(sm90a.wgmma_wait, n=0)),
            ir.Barrier("every warpgroup is done with stage kt-1"),
            ir.If(land(t0, lt(ahead, nk)),
                  ir.Seq(tuple(self._issue(p, o, ahead, ahead % S, ir.MemRef(full, ahead % S), m0, n0)))),
        ]
        body.append(ir.Comment(f"K loop over {nk} tiles of {BK}, {S}-stage TMA + mbarrier ring"))
        body.append(ir.For(kt, nk, ir.Seq(tuple(loop))))
        body += self._epilogue(p, acc, lane, wg, m0, n0, M, N)
        params = [o["tm_a"], o["tm_b"]] + [self.extra_buf(e) for e in self.extras] + [self.gl[self.spec.c.name]]
        self._check_resources(p["block"])
        return ir.Kernel("firesched_gemm_sm90", tuple(params), tuple(grid), self.threads,
                         (sa, sb, full), tuple(self.regs.values()), ir.Seq(tuple(body)),
                         header=str(self.sched), min_blocks_per_sm=1)

    def _tiles(self, p):
        """The grid, the per-block tile loop (variable, count, validity) and the tile's (m0, n0).

        Without ``persistent`` each block takes one tile (``_map_blocks``).  With it, the grid is
        one block per SM and block ``b`` takes tiles ``b, b + grid, ...`` in the grouped order of
        ``to_blocks(group=G)``: tile t sits in group ``t // (G * Nt)``, column-major inside it."""
        root, BM, BN = p["root"], p["BM"], p["BN"]
        if p["cluster"] > 1:
            return self._cluster_tiles(p)
        if not p["persistent"]:
            grid = self._map_blocks([(lp, root) for lp in root.loops], root)
            m_var = next(lp.var for lp in root.loops if lp.dim == "m")
            n_var = next(lp.var for lp in root.loops if lp.dim == "n")
            return grid, None, 1, self.var_expr[m_var] * BM, self.var_expr[n_var] * BN
        lm = next(lp for lp in root.loops if lp.dim == "m")
        ln = next(lp for lp in root.loops if lp.dim == "n")
        Mt, Nt, G = lm.count, ln.count, lm.group
        tiles = Mt * Nt
        blocks = min(tiles, self.target.sm_count)
        iters = -(-tiles // blocks)
        ti = Var("tile_i", iters)
        t = ir.bid(0, blocks) + ti * blocks
        if G > 1:
            per_group = G * Nt
            first_m = _div(t, per_group) * G
            size_m = _min(Mt - first_m, G)
            local = _mod(t, per_group)
            mi, ni = first_m + _mod(local, size_m), _div(local, size_m)
        else:
            mi, ni = _div(t, Nt), _mod(t, Nt)
        valid = lt(t, tiles) if iters * blocks > tiles else 1
        return [blocks, 1, 1], (ti, valid), iters, mi * BM, ni * BN

    def _cluster_tiles(self, p):
        """``_tiles`` for clusters of C blocks along x: cluster ``k`` (blocks ``C*k .. C*k + C-1``)
        takes M-tile groups ``k, k + clusters, ...`` of one N tile each, walked in grouped order
        (groups of ``ceil(G / C)`` such M-tile groups); the block of rank r takes M tile
        ``C * mg + r`` of M-tile group ``mg``.  When the M tiles do not fill the last group, its
        missing tiles load a duplicate of the last A tile (so the cluster still shares B) and
        store nothing: the returned tile validity covers the cluster, ``p["m_ok"]`` the block."""
        root, BM, BN, C = p["root"], p["BM"], p["BN"], p["cluster"]
        lm = next(lp for lp in root.loops if lp.dim == "m")
        ln = next(lp for lp in root.loops if lp.dim == "n")
        Mt, Nt = lm.count, ln.count
        Mg = -(-Mt // C)
        G = max(1, -(-lm.group // C))
        tiles = Mg * Nt
        clusters = min(tiles, self.target.sm_count // C) if p["persistent"] else tiles
        iters = -(-tiles // clusters)
        blocks = clusters * C
        bid = ir.bid(0, blocks)
        rank = _mod(bid, C)
        ti = Var("tile_i", iters)
        t = _div(bid, C) + ti * clusters
        if G > 1:
            per_group = G * Nt
            first_m = _div(t, per_group) * G
            size_m = _min(Mg - first_m, G)
            local = _mod(t, per_group)
            mg, ni = first_m + _mod(local, size_m), _div(local, size_m)
        else:
            mg, ni = _div(t, Nt), _mod(t, Nt)
        mi = mg * C + rank
        valid = lt(t, tiles) if iters * clusters > tiles else 1
        p["rank"] = rank
        p["m_ok"] = lt(mi, Mt) if Mt % C else 1
        p["m_load"] = _min(mi, Mt - 1) * BM if Mt % C else mi * BM
        return [blocks, 1, 1], (ti, valid), iters, mi * BM, ni * BN

    def _kernel_ws(self, p) -> ir.Kernel:
        """The warp-specialized kernel: warpgroup 0 produces, warpgroups 1.. consume.

        ::

            producer (thread 0 of warpgroup 0)        consumers (warpgroups 1..W, 64 rows each)
            for tile, for kt:  it = tile * nk + kt    for tile:  acc = 0
              wait empty[it % S] (round it/S - 1)       for kt:  wait full[it % S] (round it/S)
              expect_tx full[it % S]; TMA A, B                   wgmma x BK/16; commit; wait_group 1
                                                                 arrive empty[(it-1) % S]
                                                        wait_group 0; arrive empty[last]; epilogue
        """
        BM, BN, BK, S = p["BM"], p["BN"], p["BK"], p["S"]
        preg, creg = p["specialize"]
        M, N, K = self.spec.m, self.spec.n, self.spec.k
        nwg = BM // 64
        self.threads = 128 * (nwg + 1)
        tid = ir.tid(self.threads)
        grid, tile_loop, iters, m0, n0 = self._tiles(p)
        C = p["cluster"]
        rank, m_ok, m_load = p.get("rank", 0), p.get("m_ok", 1), p.get("m_load", m0)
        o = self._operands(p)
        sa, sb = o["sa"], o["sb"]
        full = ir.MBarrier("full", S, note="one per stage: the stage's TMA bytes have landed")
        empty = ir.MBarrier("empty", S, note=f"one per stage: all {nwg} consumer warpgroups are done reading it"
                                             + (f", in each of the cluster's {C} blocks (their multicasts write it)"
                                                if C > 1 else ""))
        self.shared = {"A_smem": sa, "B_smem": sb, "full": full, "empty": empty}
        acc = self.reg("C_acc", f32, BN // 2)
        nk = -(-K // BK)
        ti = tile_loop[0] if tile_loop else 0

        def per_tile(stmts, comment) -> list:
            if tile_loop is None:
                return stmts
            body = stmts if tile_loop[1] == 1 else [ir.If(tile_loop[1], ir.Seq(tuple(stmts)))]
            return [ir.Comment(comment), ir.For(tile_loop[0], iters, ir.Seq(tuple(body)))]

        init = [_call(sm90a.mbarrier_init, bar=ir.MemRef(full, s), count=ir.Scalar(1)) for s in range(S)]
        init += [_call(sm90a.mbarrier_init, bar=ir.MemRef(empty, s), count=ir.Scalar(nwg * C)) for s in range(S)]
        body: list = [ir.Comment(str(p["block"].spec)),
                      ir.If(lt(tid, 1), ir.Seq((*init, _call(sm90a.fence_mbarrier_init)))),
                      _call(sm90a.barrier_cluster, comment="every block's mbarriers are initialised: the "
                                                           "cluster's multicasts and arrivals may target them")
                      if C > 1 else ir.Barrier("mbarriers initialised")]

        def release(stage, comment):
            """Lane 0 of a consumer warpgroup releases ``stage``: in a cluster, in every block (the
            producers of all of them multicast into this block's stage)."""
            if C == 1:
                return _call(sm90a.mbarrier_arrive, bar=ir.MemRef(empty, stage), comment=comment)
            return ir.Seq(tuple(_call(sm90a.mbarrier_arrive_cluster, bar=ir.MemRef(empty, stage), cta=ir.Scalar(q),
                                      comment=f"{comment} (block rank {q})") for q in range(C)))

        # producer: one thread walks every (tile, K tile) of the block through the ring
        kt = Var(p["kloop"].var, nk)
        it = ti * nk + kt
        stage = it % S
        produce = [
            _call(sm90a.mbarrier_try_wait, bar=ir.MemRef(empty, stage), parity=ir.Scalar((it // S + 1) % 2),
                  comment="the consumers released the stage (the first round returns at once)"),
            *self._issue(p, o, kt, stage, ir.MemRef(full, stage), m_load, n0, rank),
        ]
        producer = [
            _call(catalog.with_immediates(sm90a.setmaxnreg_dec, n=preg), comment="the producer needs few registers"),
            ir.If(lt(tid, 1), ir.Seq(tuple(per_tile([ir.For(kt, nk, ir.Seq(tuple(produce)))],
                                                    f"tiles of this block: {iters}")))),
        ]

        # consumers: warpgroup w = 1.. computes rows (w-1)*64.. of the tile
        ctid = ir.role_tid(128 * nwg)
        wg = ctid // 128
        lane = ctid % 128
        kc = Var(p["kloop"].var + "_c", nk)
        itc = ti * nk + kc
        sc = itc % S
        consume = [
            _call(sm90a.mbarrier_try_wait, bar=ir.MemRef(full, sc), parity=ir.Scalar((itc // S) % 2),
                  comment="the tile is in shared memory"),
            *self._mma(p, o, sc, wg, acc),
            _call(catalog.with_immediates(sm90a.wgmma_wait, n=1), comment="the previous K tile's wgmma are done"),
            ir.If(land(ge(kc, 1), lt(lane, 1)), release((itc + S - 1) % S, "release the previous stage")),
        ]
        last = (ti * nk + nk - 1) % S
        staged = self._staging(p, nwg)
        vec_smem, vec_start, vec_after = (self._vector_prefetch(p, lane, wg, n0, N, nwg) if staged is not None
                                          else ({}, [], []))
        tile_work = [
            *vec_start,
            ir.RegFill(ir.RegRef(acc, 0), BN // 2, 0.0),
            ir.Comment(f"K loop over {nk} tiles of {BK}, one wgmma group in flight"),
            ir.For(kc, nk, ir.Seq(tuple(consume))),
            _call(catalog.with_immediates(sm90a.wgmma_wait, n=0)),
            ir.If(lt(lane, 1), release(last, "release the last stage")),
            *vec_after,
        ]
        if staged is None:
            epi = self._epilogue(p, acc, lane, wg, m0, n0, M, N)
        else:
            epi = self._epilogue_tma(p, staged, acc, lane, wg, m0, n0, M, N, ti, vec_smem)
        # a block of a cluster whose M tile lies past M (the last M-tile group is not full) stores nothing
        tile_work += epi if m_ok == 1 else [ir.If(m_ok, ir.Seq(tuple(epi)))]
        consumer = [
            _call(catalog.with_immediates(sm90a.setmaxnreg_inc, n=creg), comment="the accumulators need registers"),
            *per_tile(tile_work, f"tiles of this block: {iters}"),
        ]
        if staged is not None:
            consumer.append(ir.If(lt(lane, 1), _call(catalog.with_immediates(sm90a.tma_wait, n=0),
                                                     comment="the last TMA stores have completed")))
        body.append(ir.Roles((ir.Role("producer", 0, 128, ir.Seq(tuple(producer))),
                              ir.Role("consumers", 128, 128 * nwg, ir.Seq(tuple(consumer))))))
        if C > 1:
            body.append(_call(sm90a.barrier_cluster, comment="no block leaves while the others may still arrive "
                                                             "on its mbarriers"))
        c_param = self.gl[self.spec.c.name] if staged is None else staged[1]
        params = [o["tm_a"], o["tm_b"]] + [self.extra_buf(e) for e in self.extras] + [c_param]
        if staged is not None:
            self.shared["C_smem"] = staged[0]
        self.shared.update({b.name: b for b in vec_smem.values()})
        self._check_resources(p["block"])
        shared = [sa, sb, full, empty] + ([staged[0]] if staged is not None else []) + list(vec_smem.values())
        have = ir.shared_bytes(shared)
        need = self.target.smem_per_sm // 2 + 1024
        if have < need:
            # setmaxnreg's budget assumes one block per SM: a second resident block could leave a
            # consumer warpgroup waiting for registers forever, so claim more than half the SM
            shared.append(ir.SharedBuffer("one_block_per_sm", u8, need - have, 16,
                                          "unused: keeps a second block off the SM (setmaxnreg budget)"))
        return ir.Kernel("firesched_gemm_sm90_ws", tuple(params), tuple(grid), self.threads,
                         tuple(shared), tuple(self.regs.values()), ir.Seq(tuple(body)),
                         header=str(self.sched), min_blocks_per_sm=1, cluster=C)

    def _staging(self, p, nwg):
        """The shared buffer and tensor map of the TMA-store epilogue, or None where C cannot take
        TMA stores (rows not a multiple of 16 bytes, or an output dtype narrower than 16 bits)."""
        store: Node = p["store"]
        gc = self.gbuf(store.spec.dst)
        ob = gc.dtype.bits // 8
        if gc.dtype.bits < 16 or (gc.shape[-1] * ob) % 16 or len(gc.shape) != 2:
            return None
        cc = SPAN // ob
        if p["BN"] % cc:
            return None
        buf = ir.SharedBuffer("C_smem", gc.dtype, nwg * STORE_BUFFERS * 64 * cc, STAGE_ALIGN,
                              f"{nwg} consumer warpgroups x {STORE_BUFFERS} buffers x 64x{cc} {gc.dtype}, "
                              f"128B swizzle (TMA-store staging)")
        return buf, ir.TensorMapParam(f"tmap_{gc.name}", gc, (64, cc), SPAN), cc

    def _epilogue_tma(self, p, staged, acc, lane, wg, m0, n0, M, N, ti=0, vec_smem=None) -> list:
        """Registers -> swizzled shared memory -> TMA store, 64 rows x one 128-byte span of columns
        at a time, double-buffered per warpgroup::

            for each column chunk c (BN / span of them; counted on across a persistent block's tiles):
              thread 0 of the warpgroup: wait until its store of chunk c-2 has read its buffer
              barrier (the warpgroup's 128 threads)     # the buffer is free
              each thread: ops on its D pairs of chunk c, cvt, st.shared into buffer c % 2
              fence.proxy.async; barrier (warpgroup)   # the tile is visible to the async proxy
              thread 0 of the warpgroup: TMA store of the 64 x span box; commit

        TMA drops the parts of a box outside C, so edge tiles need no predicates.  ``vec_smem`` maps
        a bias over N to the warpgroup's shared copy of the tile's BN values (``_vector_prefetch``),
        read here instead of global memory.
        """
        buf, tmap, cc = staged
        store: Node = p["store"]
        out_dt = buf.dtype
        ob = out_dt.bits // 8
        BN = p["BN"]
        glim = {"m": M, "n": N}
        lead = lt(lane, 1)
        pairs = cc // 8 * 2                       # D pairs of one thread inside one chunk
        work = self.reg("epi", f32, 2)
        outr = self.reg(f"out_{out_dt.name}", out_dt, 2)
        st = catalog.copy_atom("RF", "SH", 2 * ob)
        out = [ir.Comment(f"{store.spec}: D fragments -> C_smem (128B swizzle) -> TMA store, {BN // cc} chunks "
                          f"of 64x{cc}")]
        nc = BN // cc
        ops_ = getattr(store.spec, "ops", ())
        shared_cols = [a for op in ops_ for _, args in op.scalar() for a in args
                       if getattr(a, "kind", None) == "vector_n"]
        for c in range(nc):
            b = (ti * nc + c) % STORE_BUFFERS
            base = (wg * STORE_BUFFERS + b) * 64 * cc
            # pairs 2i and 2i+1 of a thread hold the same two columns in rows r and r + 8: a bias
            # over N is loaded once for both
            q = Var(f"e{c}", pairs // 2)
            body = []
            pre = {}
            _, qcol = sm90a.d_coord(lane, c * pairs + 2 * q)
            for a in shared_cols:
                if a.name in pre:
                    continue
                sbuf = (vec_smem or {}).get(a.name)
                if sbuf is None:
                    pre[a.name], loads = self.load_extra(a, 2, 0, n0 + qcol, glim)
                    body += loads
                    continue
                raw = self.reg(f"x_{a.name}", sbuf.dtype, 2)
                pre[a.name] = self.reg(f"xf_{a.name}", f32, 2)
                body.append(ir.AtomCall(catalog.copy_atom("SH", "RF", 2 * sbuf.dtype.bits // 8),
                                        (("dst", ir.RegRef(raw, 0)), ("src", ir.MemRef(sbuf, wg * BN + qcol))), 1,
                                        f"{a.name} of columns +{2} (shared copy)"))
                body += [ir.Pointwise("cvt", ir.RegRef(pre[a.name], j), (ir.RegRef(raw, j),)) for j in range(2)]
            for h in range(2):
                pair = c * pairs + 2 * q + h
                r, col = sm90a.d_coord(lane, pair)
                cw = col - c * cc                       # column inside the chunk
                byte = cw * ob
                sw = (_xor(byte // 16, r % 8)) * 16 + byte % 16     # Swizzle<3,4,3> on the 128-byte rows
                row_g, col_g = m0 + wg * 64 + r, n0 + col
                body += [ir.Pointwise("copy", ir.RegRef(work, j), (ir.RegRef(acc, 2 * pair + j),)) for j in range(2)]
                body += self.apply_ops(ops_, work, 2, row_g, col_g, glim, preloaded=pre)
                body += [ir.Pointwise("cvt" if out_dt != f32 else "copy", ir.RegRef(outr, j), (ir.RegRef(work, j),))
                         for j in range(2)]
                body.append(ir.AtomCall(st, (("dst", ir.MemRef(buf, base + r * cc + sw // ob)),
                                             ("src", ir.RegRef(outr, 0))), 1, "C pair"))
            out += [
                ir.If(lead, _call(catalog.with_immediates(sm90a.tma_wait_read, n=STORE_BUFFERS - 1),
                                  comment="the store that last used this buffer has read it")),
                ir.Barrier("the C_smem buffer is free", bar_id=EPILOGUE_BARRIER + wg, threads=128),
                ir.For(q, pairs // 2, ir.Seq(tuple(body)), unroll=True),
                _call(sm90a.fence_proxy_async, comment="st.shared -> visible to the TMA store"),
                ir.Barrier(f"chunk {c} is in C_smem", bar_id=EPILOGUE_BARRIER + wg, threads=128),
                ir.If(lead, ir.Seq((
                    _call(sm90a.tma_store_2d, tmap=tmap, c0=ir.Scalar(n0 + c * cc), c1=ir.Scalar(m0 + wg * 64),
                          src=ir.MemRef(buf, base), comment=f"C rows +64, columns {c * cc}..+{cc}"),
                    _call(sm90a.tma_commit)))),
            ]
        return out

    def _vector_prefetch(self, p, lane, wg, n0, N, nwg):
        """Biases over N for the TMA-store epilogue: each is loaded from global memory when a tile
        starts (two elements per consumer thread, in flight during the K loop) and stored after it
        into the warpgroup's shared copy of the tile's BN values, so that the epilogue reads shared
        memory instead of waiting on global loads.  Returns (shared buffers by name, statements at
        the tile's start, statements after its K loop)."""
        store: Node = p["store"]
        BN = p["BN"]
        seen, bufs, start, after = set(), {}, [], []
        glim = {"m": self.spec.m, "n": N}
        mine = lt(lane, BN // 2)
        for op in getattr(store.spec, "ops", ()):
            for _, args in op.scalar():
                for a in args:
                    if getattr(a, "kind", None) != "vector_n" or a.name in seen:
                        continue
                    seen.add(a.name)
                    dt = self.extra_buf(a).dtype
                    sbuf = ir.SharedBuffer(f"{a.name}_smem", dt, nwg * BN, 16,
                                           f"{a.name}[n0 .. n0+{BN}) per consumer warpgroup")
                    raw = self.reg(f"xt_{a.name}", dt, 2)
                    start.append(ir.If(mine, ir.Seq(tuple(self.load_extra_raw(a, 2, 0, n0 + 2 * lane, glim, raw, 0)))))
                    after.append(ir.If(mine, ir.AtomCall(catalog.copy_atom("RF", "SH", 2 * dt.bits // 8),
                                                         (("dst", ir.MemRef(sbuf, wg * BN + 2 * lane)),
                                                          ("src", ir.RegRef(raw, 0))), 1,
                                                         f"{a.name} for this tile's epilogue")))
                    bufs[a.name] = sbuf
        return bufs, start, after

    def _epilogue(self, p, acc, lane, wg, m0, n0, M, N) -> list:
        BN = p["BN"]
        store: Node = p["store"]
        dst = store.spec.dst
        gbuf = self.gbuf(dst)
        i = Var("e0", BN // 4)
        r, c = sm90a.d_coord(lane, i)
        row, col = m0 + wg * 64 + r, n0 + c
        glim = {"m": M, "n": N}
        work = self.reg("epi", f32, 2)
        stmts = [ir.Pointwise("copy", ir.RegRef(work, j), (ir.RegRef(acc, 2 * i + j),)) for j in range(2)]
        stmts += self.apply_ops(getattr(store.spec, "ops", ()), work, 2, row, col, glim)
        stmts += self._store(work, 2, dst.dtype, gbuf, row * N + col, row, col, glim)
        return [ir.Comment(f"{store.spec}: wgmma D fragments, pairs of adjacent columns"),
                ir.For(i, BN // 4, ir.Seq(tuple(stmts)), unroll=True)]


def _xor(a, b):
    from ..ir.expr import binop

    return binop("^", a, b)


def _call(atom, comment="", pred=1, **args):
    return ir.AtomCall(atom, tuple(args.items()), pred, comment)


__all__ = ["HopperGemmLowering", "uses_wgmma"]
