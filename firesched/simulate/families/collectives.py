"""Warp-collective atoms over register fragments: ldmatrix, stmatrix, mma and shuffle.

Each runs for whole thread groups (a warp, a quad pair) or not at all: part of a group issuing it
is a hazard (``Lockstep.issuing_groups``).  The atom's thread-value layouts (``tables``) scatter
the group's registers into a tile, the atom's semantics (a numpy function) computes on the tile,
and the layouts gather the result back into registers.  Memory is accessed on behalf of the
thread whose address each row of the tile uses, so races and bounds are charged to that thread.
ldmatrix and stmatrix move bits (a dtype of the same width is reinterpreted); mma computes.
"""

from __future__ import annotations

import numpy as np

from ... import ir
from ...errors import InternalError
from ..messages import describe
from ..tables import atom_tables, reg_operand


def ldmatrix(k, s):
    """LDMATRIX: shared memory rows (one address per lane) into register fragments."""
    ctx, mem = k.ctx, k.mem
    atom = s.atom
    tab = atom_tables(atom)
    groups = ctx.issuing_groups(s)
    if groups.shape[0] == 0:
        return
    src, dst = s.arg(tab.src), s.arg(tab.dst)
    if not isinstance(src.buffer, ir.SharedBuffer):
        raise InternalError(f"{describe(s)}: ldmatrix reads shared memory")
    lanes = tab.addr.shape[0]
    G = groups.shape[0]
    rows, cols = tab.mem_tile
    who = groups[:, :lanes]                                    # [G, lanes]
    base = ctx.per_thread(src.offset)[who]                     # [G, lanes]
    addr = base[..., None] + np.arange(tab.per)[None, None, :]  # [G, lanes, per]
    flat_who = who.ravel()
    mem.check_bounds(src, addr.reshape(G * lanes, tab.per), flat_who, "read")
    mem.check_align(atom, src, base.ravel(), flat_who)
    data = mem.read(src, addr, np.broadcast_to(who[..., None], addr.shape), flat_who)
    tile = np.zeros((G, rows * cols), dtype=data.dtype)
    tile[:, tab.addr.ravel()] = data.reshape(G, -1)
    tile = tile.reshape(G, cols, rows).transpose(0, 2, 1)
    idx = tab.tv[tab.dst]
    trows, _ = tab.tile[tab.dst]
    outs = []
    for g in range(G):
        out = np.asarray(atom.semantics(tile[g])) if atom.semantics is not None else tile[g]
        if out.shape[0] != trows:
            raise InternalError(f"{atom.name}: semantics returned a {out.shape} tile; the destination "
                                f"layout expects {tab.tile[tab.dst]}")
        outs.append(np.ravel(out, order="F")[idx])
    vals = np.stack(outs)                                     # [G, 32, V]
    rdt = dst.buffer.dtype.np
    if vals.dtype != rdt:
        if vals.dtype.itemsize != rdt.itemsize:
            raise InternalError(f"{describe(s)}: ldmatrix moves {src.buffer.dtype} into {dst.buffer.dtype} "
                                f"registers of another width")
        vals = vals.view(rdt)                                 # a move: bits, not values
    k.regs.write_group(dst, groups, vals)


def stmatrix(k, s):
    """STMATRIX (sm_90a): the inverse of ldmatrix, register fragments into shared memory rows."""
    ctx, mem = k.ctx, k.mem
    atom = s.atom
    tab = atom_tables(atom)
    groups = ctx.issuing_groups(s)
    if groups.shape[0] == 0:
        return
    src, dst = s.arg(tab.src), s.arg(tab.dst)
    if not isinstance(dst, ir.MemRef) or not isinstance(dst.buffer, ir.SharedBuffer):
        raise InternalError(f"{describe(s)}: stmatrix writes shared memory")
    G = groups.shape[0]
    rows, cols = tab.mem_tile
    idx = tab.tv[tab.src]
    vals = k.regs.read_group(src, groups, idx.shape[1])              # [G, 32, V]
    tile = np.zeros((G, rows * cols), dtype=vals.dtype)
    tile[:, idx.ravel()] = vals.reshape(G, -1)
    lanes = tab.addr.shape[0]
    data = tile[:, tab.addr]                                          # [G, lanes, per]
    ddt = dst.buffer.dtype.np
    if data.dtype != ddt:
        if data.dtype.itemsize != ddt.itemsize:
            raise InternalError(f"{describe(s)}: stmatrix moves {src.buffer.dtype} registers into "
                                f"{dst.buffer.dtype} memory of another width")
        data = data.view(ddt)
    who = groups[:, :lanes]
    base = ctx.per_thread(dst.offset)[who]
    addr = base[..., None] + np.arange(tab.per)[None, None, :]
    flat_who = who.ravel()
    mem.check_bounds(dst, addr.reshape(G * lanes, tab.per), flat_who, "write")
    mem.check_align(atom, dst, base.ravel(), flat_who)
    mem.write(dst, addr, np.broadcast_to(who[..., None], addr.shape), flat_who, data)


def mma(k, s):
    """MMA: D = semantics(A, B, C) on register fragments, rounded once into D's dtype."""
    regs = k.regs
    atom = s.atom
    tab = atom_tables(atom)
    groups = k.ctx.issuing_groups(s)
    if groups.shape[0] == 0:
        return
    G, n = groups.shape
    tiles = []
    for name in tab.inputs:
        ref = s.arg(name)
        idx = tab.tv[name]
        rows, cols = tab.tile[name]
        want = atom.dtype_of(name)
        if ref.buffer.dtype.bits != want.bits:
            raise InternalError(f"{describe(s)}: operand {name} wants {want} registers, "
                                f"{ref.buffer.name!r} holds {ref.buffer.dtype}")
        vals = regs.read_group(ref, groups, idx.shape[1])   # [G, n, V]
        if vals.dtype != want.np:
            vals = vals.astype(want.np)
        t = np.zeros((G, rows * cols), dtype=vals.dtype)
        t[:, idx.ravel()] = vals.reshape(G, -1)
        tiles.append(t.reshape(G, cols, rows).transpose(0, 2, 1))
    idx = tab.tv[tab.output]
    outs = []
    for g in range(G):
        d = np.asarray(atom.semantics(*(t[g] for t in tiles)))
        outs.append(np.ravel(d, order="F")[idx])
    regs.write_group(s.arg(tab.output), groups, np.stack(outs))


def shuffle(k, s):
    """SHUFFLE: each lane reads ``src`` of the lane its lane operand names (shfl.sync)."""
    regs = k.regs
    atom = s.atom
    atom_tables(atom)               # built (and its layouts checked) as for every collective atom
    groups = k.ctx.issuing_groups(s)
    if groups.shape[0] == 0:
        return
    dst = s.arg(reg_operand(atom, "out").name)
    ins = [o.name for o in atom.operands if o.role == "in"]
    src = s.arg("src" if "src" in ins else ins[0])
    lane_ref = s.arg(next(n for n in ins if n != ("src" if "src" in ins else ins[0])))
    vals = regs.read_group(src, groups, 1)[..., 0]           # [G, 32]
    if isinstance(lane_ref, ir.RegRef):
        lanes = regs.read_group(lane_ref, groups, 1)[..., 0].astype(np.int64)
    else:
        lanes = k.ctx.per_thread(lane_ref)[groups]
    out = np.stack([np.asarray(atom.semantics(vals[g], lanes[g])) for g in range(groups.shape[0])])
    regs.write_group(dst, groups, out[..., None])
