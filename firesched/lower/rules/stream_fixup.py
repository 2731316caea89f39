"""Stream-K's fix-up: a tile that several blocks share (``strategies.stream_k``, the walk in
``transforms.blocks.StreamK``) is added up by the block that holds its top chunk.

The accumulator starts at zero where a block's work on a tile starts (``first``), and where that
work ends (``last``) the block either stores a partial tile or finishes the tile::

    last, not top:  acc -> partials[bid]             every thread its own registers, 16 B at a time
                    barrier                          (the writes happen before the release)
                    thread 0: flags[bid] = 1         st.release.gpu
    last, top:      for p < partners:                blocks bid-1, bid-2, ... hold the lower chunks
                        wait flags[bid-1-p] != 0     ld.acquire.gpu spin, every thread
                        acc += partials[bid-1-p]
                    barrier                          (every thread is past its waits)
                    thread 0: flags[bid-1-p] = 0     ready for the next launch
                    the accumulator's store (epilogue ops, TMA store, ...) as without stream-K

A partial tile is kept in the order of the registers, not of the tile: the block that adds it
has the same fragment layout, so thread t's vector j sits at ``((j * threads) + t) * 4`` of the
block's slot — consecutive threads write consecutive 16-byte vectors, whatever the layout.  The
additions happen in a fixed order (the partners from ``bid - 1`` down), so the result is the same
bits run to run.
"""

from __future__ import annotations

from ... import ir
from ...dtypes import f32, i32
from ...hardware.atoms import catalog, sm70
from ...ir.expr import Var, lt
from ..context import err, scope_barrier

#: vectors of a partner's partial tile a thread loads before adding them (registers in flight)
LOAD_BATCH = 8


def starts_tile(ctx, name: str, stmts: list) -> list:
    """``stmts`` (the Init of accumulator ``name``) only where a stream-K block starts a tile."""
    sk = ctx.stream
    if sk is None or name != sk.acc:
        return stmts
    return [ir.If(sk.first, ir.Seq(tuple(stmts)))]


def fixup(lw, node, ctx, acc: ir.RegBuffer, size: int, store: list, reduce_vars=()) -> list:
    """The accumulator store ``store`` of a stream-K launch, with the partial tiles handed
    between blocks (see the module docstring)."""
    sk = ctx.stream
    if reduce_vars:
        raise err(node, "stream_k with split_k(..., across=WARP): the partial tiles are exchanged per register, "
                        "before the warps' parts are combined", strategy=node.strategy,
                  fix="drop one of stream_k and split_k(across=WARP)")
    scope = ctx.scope
    T = scope.threads
    w = 4 if size % 4 == 0 else 1                 # f32 values a thread moves at once
    V = size // w
    slot = V * T * w
    part = lw.pb.workspace(ir.GlobalBuffer(f"{sk.acc}_partials", f32, (sk.blocks, slot), (slot, 1), "workspace",
                                           exchange=True))
    flags = lw.pb.workspace(ir.GlobalBuffer(f"{sk.acc}_flags", i32, (sk.blocks,), (1,), "workspace", zeroed=True))
    lw.kb.param(part, write=True)
    lw.kb.param(flags, write=True)
    tid = scope.tid
    lead = lt(tid, 1)
    j = Var("sk_j", V)

    def vec(block):
        return ir.MemRef(part, block * slot + (j * T + tid) * w)

    st = catalog.copy_atom("RF", "GL", 4 * w)
    ld = catalog.copy_atom("GL", "RF", 4 * w)
    partial = [
        ir.Comment(f"stream-K: this block holds the tile's lower chunks: its partial sums -> {part.name}[bid]"),
        ir.For(j, V, ir.AtomCall(st, (("dst", vec(sk.bid)), ("src", ir.RegRef(acc, j * w))), 1,
                                 "partial sums, in register order"), unroll=True),
        scope_barrier(ctx, "the partial tile is written"),
        ir.If(lead, ir.AtomCall(sm70.flag_store, (("flag", ir.MemRef(flags, sk.bid)), ("value", ir.Scalar(1))), 1,
                                "release: the partial tile is ready")),
    ]
    # a partner's vectors are loaded a batch at a time into registers of their own, then added:
    # one buffer reused per vector would serialise every load behind the previous add (a full L2
    # round trip each)
    batch = max(b for b in range(1, min(V, LOAD_BATCH) + 1) if V % b == 0)
    tmp = lw.kb.reg("sk_part", f32, w * batch)
    p = Var("sk_p", sk.max_partners)
    src = sk.bid - 1 - p
    jb = Var("sk_b", V // batch)
    add = [ir.AtomCall(ld, (("dst", ir.RegRef(tmp, i * w)), ("src", ir.MemRef(
        part, src * slot + ((jb * batch + i) * T + tid) * w))), 1, "a partner's partial sums") for i in range(batch)]
    add += [ir.Pointwise("add", ir.RegRef(acc, jb * batch * w + i), (ir.RegRef(acc, jb * batch * w + i),
                                                                    ir.RegRef(tmp, i)))
            for i in range(batch * w)]
    finish = [
        ir.Comment("stream-K: this block holds the tile's top chunk: add the lower blocks' partial sums, "
                   "block bid-1 first"),
        ir.For(p, sk.max_partners, ir.Seq((
            ir.AtomCall(sm70.flag_wait, (("flag", ir.MemRef(flags, src)),), 1, "acquire the partner's partial tile"),
            ir.For(jb, V // batch, ir.Seq(tuple(add)), unroll=True),
        )), stop=sk.partners),
        scope_barrier(ctx, "every thread is past its waits"),
        ir.If(lead, ir.For(p, sk.max_partners, ir.AtomCall(
            sm70.flag_store, (("flag", ir.MemRef(flags, src)), ("value", ir.Scalar(0))), 1,
            "reset the partner's flag for the next launch"), stop=sk.partners)),
        *store,
    ]
    return [ir.If(sk.last, ir.Seq((
        ir.If(sk.partial, ir.Seq(tuple(partial))),
        ir.If(sk.top, ir.Seq(tuple(finish))),
    )))]
