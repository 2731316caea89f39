"""The fix-up of a tile that several blocks of one launch share: stream-K's (``strategies.stream_k``,
the walk in ``transforms.blocks.StreamK``), where the block holding the tile's top chunk adds it
up, and split-K's (``split_k(..., combine="fixup")``, ``transforms.blocks.SplitFixup``), where
the block of the last K part does.

The accumulator starts at zero where a block's work on a tile starts (``first``), and where that
work ends (``last``) the block either stores a partial tile or finishes the tile::

    last, not top:  acc -> partials[slot]            every thread its own registers, 16 B at a time
                    barrier                          (the writes happen before the release)
                    thread 0: flags[slot] = 1        st.release.gpu
    last, top:      for p < partners:                slots slot-1, slot-2, ... hold the lower chunks
                        wait flags[slot-1-p] != 0    ld.acquire.gpu spin, every thread
                        acc += partials[slot-1-p]
                    barrier                          (every thread is past its waits)
                    thread 0: flags[slot-1-p] = 0    ready for the next launch
                    the accumulator's store (epilogue ops, TMA store, ...) as without the split

Stream-K's slot is the block id, and a block's partners vary along the walk.  Split-K's slot
numbers a tile's parts consecutively, and every part below the last is a partner of the last, so
they meet at one counter a tile instead of a flag each (one wait, not one L2 round trip per
partner), and the top block loads several partners' vectors at once::

    last, not top:  acc -> partials[slot]; barrier; thread 0: counter[tile] += 1   red.release.gpu
    last, top:      wait counter[tile] >= parts - 1                         ld.acquire.gpu spin
                    for each chunk of vectors: load it from every partner, then add part -1, -2, ...
                    barrier; thread 0: counter[tile] = 0

Split-K in a cluster (``split_k(..., combine="cluster")``): a tile's parts are the ranks of one
thread-block cluster, and the lower ranks push their partial sums straight into the top rank's
shared memory, where they complete the transaction bytes the top rank's mbarrier expects::

    kernel start:   thread 0: mbarrier.init(landed, 1); expect_tx(landed, (parts-1)·T·n·4)
                    barrier.cluster                     (the mbarrier is initialised cluster-wide)
    rank < top:     acc[j] -> parts[rank][j][tid] of the top rank     st.async, complete_tx
    rank = top:     wait(landed, parity 0)              (acquire.cluster: every push has landed)
                    for q = top-1 .. 0: acc[j] += parts[q][j][tid]    the fix-up's order
                    the accumulator's store

          rank 0            rank 1            rank 2 (top)
        | acc |  --push-> |     |           | parts[0] parts[1] |
                          | acc |  --push-------------^

The lower ranks wait for nothing and leave; the top rank leaves after its wait, when every push
into it has landed.  The additions are in the fix-up's order, so the two give the same bits.

A partial tile is kept in the order of the registers, not of the tile: the block that adds it has
the same fragment layout, so thread t's vector j sits at ``((j * threads) + t) * 4`` of the
block's slot — consecutive threads write consecutive 16-byte vectors, whatever the layout.  The
additions happen in a fixed order (the partners from ``slot - 1`` down), so the result is the same
bits run to run.
"""

from __future__ import annotations

from ... import ir
from ...dtypes import f32, i32
from ...hardware.atoms import catalog, sm70, sm90a
from ...ir.expr import Var, lt
from ..context import err, scope_barrier

#: vectors of a partner's partial tile a thread loads before adding them (registers in flight)
LOAD_BATCH = 8
#: split-K: vectors of all partners' partial tiles a thread loads before adding them
COUNTED_BATCH = 8


def starts_tile(ctx, name: str, stmts: list) -> list:
    """``stmts`` (the Init of accumulator ``name``) only where a stream-K block starts a tile."""
    sk = ctx.stream
    if sk is None or name != sk.acc or sk.first == 1:
        return stmts
    return [ir.If(sk.first, ir.Seq(tuple(stmts)))]


def fixup(lw, node, ctx, acc: ir.RegBuffer, size: int, store: list, reduce_vars=()) -> list:
    """The accumulator store ``store`` of a stream-K or split-K fix-up launch, with the partial
    tiles handed between blocks (see the module docstring)."""
    sk = ctx.stream
    if reduce_vars:
        what = sk.strategy
        raise err(node, f"{what} with split_k(..., across=WARP): the partial tiles are exchanged per register, "
                        "before the warps' parts are combined", strategy=node.strategy,
                  fix=f"drop one of {what} and split_k(across=WARP)")
    if getattr(sk, "via_cluster", False):
        return _cluster_parts(lw, ctx, sk, acc, size, store)
    kind = sk.kind
    scope = ctx.scope
    T = scope.threads
    w = 4 if size % 4 == 0 else 1                 # f32 values a thread moves at once
    V = size // w
    slot = V * T * w
    part = lw.pb.workspace(ir.GlobalBuffer(f"{sk.acc}_partials", f32, (sk.slots, slot), (slot, 1), "workspace",
                                           exchange=True))
    counted = sk.counted
    # split-K: one counter a tile that all its lower parts add to; stream-K: a flag a block
    nflags = sk.tiles if counted else sk.slots
    flags = lw.pb.workspace(ir.GlobalBuffer(f"{sk.acc}_flags", i32, (nflags,), (1,), "workspace", zeroed=True))
    lw.kb.param(part, write=True)
    lw.kb.param(flags, write=True)
    tid = scope.tid
    lead = lt(tid, 1)
    j = Var("sk_j", V)

    def vec(block):
        return ir.MemRef(part, block * slot + (j * T + tid) * w)

    st = catalog.copy_atom("RF", "GL", 4 * w)
    ld = catalog.copy_atom("GL", "RF", 4 * w)
    release = (ir.AtomCall(sm70.flag_add, (("flag", ir.MemRef(flags, sk.tile)), ("value", ir.Scalar(1))), 1,
                           "release: one more partial tile of this tile is ready") if counted else
               ir.AtomCall(sm70.flag_store, (("flag", ir.MemRef(flags, sk.slot)), ("value", ir.Scalar(1))), 1,
                           "release: the partial tile is ready"))
    partial = [
        ir.Comment(f"{kind}: this block holds the tile's lower chunks: its partial sums -> {part.name}[slot]"),
        ir.For(j, V, ir.AtomCall(st, (("dst", vec(sk.slot)), ("src", ir.RegRef(acc, j * w))), 1,
                                 "partial sums, in register order"), unroll=True),
        scope_barrier(ctx, "the partial tile is written"),
        ir.If(lead, release),
    ]
    adds = (_add_counted if counted else _add_flagged)(ctx, sk, lw.kb, acc, part, flags, slot, T, tid, w, V, ld)
    finish = [
        ir.Comment(f"{kind}: this block holds the tile's top chunk: add the lower blocks' partial sums, "
                   "slot - 1 first"),
        *adds,
        *store,
    ]
    ends = [ir.If(sk.partial, ir.Seq(tuple(partial))), ir.If(sk.top, ir.Seq(tuple(finish)))]
    return ends if sk.last == 1 else [ir.If(sk.last, ir.Seq(tuple(ends)))]


def _add_flagged(ctx, sk, kb, acc, part, flags, slot, T, tid, w, V, ld) -> list:
    """Stream-K: for each partner (how many depends on the walk), wait on its flag and add its
    partial tile; then reset the flags."""
    # a partner's vectors are loaded a batch at a time into registers of their own, then added:
    # one buffer reused per vector would serialise every load behind the previous add (a full L2
    # round trip each)
    batch = max(b for b in range(1, min(V, LOAD_BATCH) + 1) if V % b == 0)
    tmp = kb.reg("sk_part", f32, w * batch)
    p = Var("sk_p", sk.max_partners)
    src = sk.partner(p)
    jb = Var("sk_b", V // batch)
    add = [ir.AtomCall(ld, (("dst", ir.RegRef(tmp, i * w)), ("src", ir.MemRef(
        part, src * slot + ((jb * batch + i) * T + tid) * w))), 1, "a partner's partial sums") for i in range(batch)]
    add += [ir.Pointwise("add", ir.RegRef(acc, jb * batch * w + i), (ir.RegRef(acc, jb * batch * w + i),
                                                                    ir.RegRef(tmp, i)))
            for i in range(batch * w)]
    stop = None if sk.partners == sk.max_partners else sk.partners
    return [
        ir.For(p, sk.max_partners, ir.Seq((
            ir.AtomCall(sm70.flag_wait, (("flag", ir.MemRef(flags, src)),), 1, "acquire the partner's partial tile"),
            ir.For(jb, V // batch, ir.Seq(tuple(add)), unroll=True),
        )), stop=stop),
        scope_barrier(ctx, "every thread is past its waits"),
        ir.If(lt(tid, 1), ir.For(p, sk.max_partners, ir.AtomCall(
            sm70.flag_store, (("flag", ir.MemRef(flags, src)), ("value", ir.Scalar(0))), 1,
            "reset the partner's flag for the next launch"), stop=stop)),
    ]


def _add_counted(ctx, sk, kb, acc, part, flags, slot, T, tid, w, V, ld) -> list:
    """Split-K: wait once for the tile's counter to count every lower part, then load their
    partial tiles a chunk of vectors at a time from several partners at once (one L2 round trip
    a chunk, not one a partner) and add them in the fixed order; then reset the counter."""
    P = sk.partners
    # vectors in flight: fewer beside a large accumulator, whose registers stay live meanwhile (an
    # sm_80 64 x 128 tile on 4 warps, 64 accumulators a thread, spilled at 7 partners x 2 vectors)
    budget = COUNTED_BATCH if V * w <= 32 else COUNTED_BATCH // 2
    G = min(P, budget)                           # partners whose loads are in flight together
    # vectors a partner contributes to one chunk: as many as keep G * batch loads in flight
    batch = max(b for b in range(1, V + 1) if V % b == 0 and b * G <= budget)
    tmp = kb.reg("sk_part", f32, w * batch * G)
    out = [ir.AtomCall(sm70.flag_wait_count, (("flag", ir.MemRef(flags, sk.tile)), ("value", ir.Scalar(P))), 1,
                       "acquire: every lower part's partial tile is written")]
    for g0 in range(0, P, G):
        group = range(g0, min(P, g0 + G))
        jb = Var(f"sk_b{g0 // G}" if P > G else "sk_b", V // batch)
        body = [ir.AtomCall(ld, (("dst", ir.RegRef(tmp, ((q - g0) * batch + i) * w)), ("src", ir.MemRef(
            part, sk.partner(q) * slot + ((jb * batch + i) * T + tid) * w))), 1, f"partial sums of part -{q + 1}")
            for q in group for i in range(batch)]
        body += [ir.Pointwise("add", ir.RegRef(acc, jb * batch * w + i),
                              (ir.RegRef(acc, jb * batch * w + i), ir.RegRef(tmp, (q - g0) * batch * w + i)))
                 for q in group for i in range(batch * w)]
        out.append(ir.For(jb, V // batch, ir.Seq(tuple(body)), unroll=True))
    return out + [
        scope_barrier(ctx, "every thread is past its wait"),
        ir.If(lt(tid, 1), ir.AtomCall(sm70.flag_store, (("flag", ir.MemRef(flags, sk.tile)), ("value", ir.Scalar(0))),
                                      1, "reset the tile's counter for the next launch")),
    ]


def _cluster_parts(lw, ctx, sk, acc: ir.RegBuffer, n: int, store: list) -> list:
    """Split-K in a cluster (the module docstring): the lower ranks push their ``n`` accumulator
    values a thread into the top rank's ``parts`` buffer, the top rank waits on its mbarrier and
    adds them, rank ``top - 1`` first."""
    P = sk.parts
    scope = ctx.scope
    T, tid = scope.threads, scope.tid
    parts = lw.kb.shared_buf(f"{sk.acc}_parts", f32, (P - 1) * n * T, 16,
                             f"the lower K parts' partial sums of {sk.acc}, pushed into the top part's block")
    landed = lw.kb.mbarrier(f"{sk.acc}_parts_landed", 1, f"the lower K parts of {sk.acc} have landed")
    bytes_ = (P - 1) * n * T * 4
    # the kernel's first statements, every thread: the top rank's mbarrier is set up and the cluster
    # meets once, before any push can target it
    lead = lt(ir.tid(lw.kb.threads), 1)
    setup = lw.notes.setdefault("setup", [])
    setup += [ir.If(lead, ir.Seq((
        ir.AtomCall(sm90a.mbarrier_init, (("bar", ir.MemRef(landed, 0)), ("count", ir.Scalar(1)))),
        ir.AtomCall(sm90a.mbarrier_arrive_expect_tx, (("bar", ir.MemRef(landed, 0)), ("bytes", ir.Scalar(bytes_))),
                    comment=f"the {P - 1} lower parts of {sk.acc}"),
        ir.AtomCall(sm90a.fence_mbarrier_init, ())))),
        ir.AtomCall(sm90a.barrier_cluster, (), 1, "every block's mbarrier is initialised: the lower K parts may "
                                                  "push into the top one")]

    def slot(q, j):
        return ir.MemRef(parts, (q * n + j) * T + tid)

    push = [ir.Comment(f"split-K in a cluster: this block holds a lower K part: push its partial sums of "
                       f"{sk.acc} into the top part's block (rank {P - 1})")]
    push += [ir.AtomCall(sm90a.st_async_cluster_4, (("dst", slot(sk.kp, j)), ("src", ir.RegRef(acc, j)),
                                                    ("bar", ir.MemRef(landed, 0)), ("cta", ir.Scalar(P - 1))),
                         comment=f"partial sum {j} of {n}")
             for j in range(n)]
    ld = catalog.copy_atom("SH", "RF", 4)
    tmp = lw.kb.reg("kp_part", f32, 1)
    finish = [ir.Comment(f"split-K in a cluster: this block holds the top K part: add the lower parts' partial sums "
                         f"of {sk.acc}, rank {P - 2} first"),
              ir.AtomCall(sm90a.mbarrier_try_wait_cluster, (("bar", ir.MemRef(landed, 0)), ("parity", ir.Scalar(0))),
                          comment="every lower part has landed here")]
    for q in range(P - 2, -1, -1):
        for j in range(n):
            finish += [ir.AtomCall(ld, (("dst", ir.RegRef(tmp, 0)), ("src", slot(q, j))), 1, f"part {q}"),
                       ir.Pointwise("add", ir.RegRef(acc, j), (ir.RegRef(acc, j), ir.RegRef(tmp, 0)))]
    return [ir.If(sk.partial, ir.Seq(tuple(push))), ir.If(sk.top, ir.Seq(tuple(finish + list(store))))]
