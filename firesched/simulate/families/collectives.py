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
from ..convert import to_dtype
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
    flat_who = who.ravel()
    first = ctx.per_thread(src.offset)[flat_who]               # [G * lanes]: a row of per each
    mem.check_bounds_rows(src, first, tab.per, flat_who, "read")
    mem.check_align(atom, src, first, flat_who)
    data = mem.read_rows(src, first, flat_who, tab.per)      # [G * lanes, per]
    if tab.tile_from_memory is not None:
        # np.take keeps the tiles in C order (fancy indexing along axis 1 would not)
        tile = np.take(data.reshape(G, -1), tab.tile_from_memory, axis=1).reshape(G, rows, cols)
    else:
        tile = np.zeros((G, rows * cols), dtype=data.dtype)
        tile[:, tab.addr.ravel()] = data.reshape(G, -1)
        tile = tile.reshape(G, cols, rows).transpose(0, 2, 1)
    out = np.asarray(atom.semantics(tile)) if atom.semantics is not None else tile
    if out.shape[1:] != tab.tile[tab.dst]:
        raise InternalError(f"{atom.name}: semantics returned {out.shape[1:]} tiles; the destination "
                            f"layout expects {tab.tile[tab.dst]}")
    rdt = dst.buffer.dtype.np
    if out.dtype != rdt:
        if out.dtype.itemsize != rdt.itemsize:
            raise InternalError(f"{describe(s)}: ldmatrix moves {src.buffer.dtype} into {dst.buffer.dtype} "
                                f"registers of another width")
        out = out.view(rdt)                                   # a move: bits, not values
    where = k.regs.tile_index(dst, groups, tab.tile_regs[tab.dst]) if tab.dst in tab.tile_regs else None
    if where is not None:
        flat, idx = where                                     # the tiles scattered straight into registers
        flat[idx] = out.reshape(G, -1)
        return
    k.regs.write_group(dst, groups, _fragments(out, tab.to_fragment[tab.dst]))   # [G, 32, V]


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
    check_mma_operands(k, s, tab)
    if _mma_tiles(k, s, atom, tab, groups):
        return
    ins = {}
    for name in tab.inputs:
        ins[name] = regs.read_group(s.arg(name), groups, tab.tv[name].shape[1])     # [G, n, V]
    regs.write_group(s.arg(tab.output), groups, _mma_compute(atom, tab, ins))


def check_mma_operands(k, s, tab):
    """The register widths of the inputs of MMA statement ``s``, checked once per statement."""
    if k.memo.get(id(s)) is not s:
        for name in tab.inputs:
            _check_width(s, tab, name, s.arg(name))
        k.memo[id(s)] = s


def _mma_tiles(k, s, atom, tab, groups) -> bool:
    """The MMA with each operand's tiles gathered from (and D's scattered into) the register file
    in one indexing each (``Registers.tile_index``); False where that does not apply."""
    regs = k.regs
    names = (*tab.inputs, tab.output)
    where = {n: regs.tile_index(s.arg(n), groups, tab.tile_regs[n]) if n in tab.tile_regs else None
             for n in names}
    if any(w is None for w in where.values()):
        return False
    G = groups.shape[0]
    tiles = []
    for name in tab.inputs:
        flat, idx = where[name]
        t = flat[idx]
        want = tab.dtypes[name].np
        tiles.append((t if t.dtype == want else t.astype(want)).reshape(G, *tab.tile[name]))
    d = np.asarray(atom.semantics(*tiles)).reshape(G, -1)
    flat, idx = where[tab.output]
    dt = s.arg(tab.output).buffer.dtype
    flat[idx] = d if d.dtype == dt.np else to_dtype(d, dt)
    return True


def _check_width(s, tab, name, ref):
    want = tab.dtypes[name]
    if ref.buffer.dtype.bits != want.bits:
        raise InternalError(f"{describe(s)}: operand {name} wants {want} registers, "
                            f"{ref.buffer.name!r} holds {ref.buffer.dtype}")


def _mma_compute(atom, tab, ins):
    """The ``[G, n, V]`` D fragments of G issues from their ``[G, n, V]`` input fragments."""
    tiles = []
    for name in tab.inputs:
        vals = ins[name]
        G = vals.shape[0]
        want = tab.dtypes[name]
        if vals.dtype != want.np:
            vals = vals.astype(want.np)
        rows, cols = tab.tile[name]
        inv = tab.from_fragment.get(name)
        if inv is not None:
            tiles.append(vals.reshape(G, -1)[:, inv].reshape(G, rows, cols))
            continue
        t = np.zeros((G, rows * cols), dtype=vals.dtype)
        t[:, tab.tv[name].ravel()] = vals.reshape(G, -1)
        tiles.append(t.reshape(G, cols, rows).transpose(0, 2, 1))
    d = np.asarray(atom.semantics(*tiles))                  # every issue's tile at once
    return _fragments(d, tab.to_fragment[tab.output])


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
    out = np.asarray(atom.semantics(vals, lanes))             # [G, 32], every warp at once
    regs.write_group(dst, groups, out[..., None])


def _fragments(tiles: np.ndarray, to_fragment: np.ndarray) -> np.ndarray:
    """``[G, threads, values]`` fragments of a stack of ``[G, rows, cols]`` tiles; ``to_fragment``
    holds each (thread, value)'s row-major tile index (``AtomTables.to_fragment``)."""
    return tiles.reshape(tiles.shape[0], -1)[:, to_fragment]
