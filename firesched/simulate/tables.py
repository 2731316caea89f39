"""Index tables of atoms and thread groups, computed once and cached.

An atom's thread-value layouts say which tile element each (thread, value) of a fragment holds;
executing a collective atom (ldmatrix, stmatrix, mma, shuffle, wgmma) scatters registers into a
tile and gathers them back through these tables.  Evaluating the layouts is slow and the atoms
are module constants, so the tables are computed once per atom; likewise the thread ids of each
thread group (warp, quad pair, warpgroup) once per block size.
"""

from __future__ import annotations

import numpy as np

from ..errors import InternalError
from ..hardware.atoms import base as atoms
from ..hardware.atoms import sm90a


def tv_index(tv) -> np.ndarray:
    """``[threads, values]`` column-major tile index of each (thread, value) of a TV layout."""
    t = np.arange(tv.num_threads, dtype=np.int64)[:, None]
    v = np.arange(tv.num_values, dtype=np.int64)[None, :]
    idx = np.asarray(tv.layout(t, v), dtype=np.int64)
    return np.ascontiguousarray(np.broadcast_to(idx, (tv.num_threads, tv.num_values)))


def _groups(group: str, threads: int) -> np.ndarray:
    """``[groups, group_threads]`` thread ids of each thread group of a block."""
    t = np.arange(threads, dtype=np.int64)
    if group == atoms.THREAD:
        return t[:, None]
    if group == atoms.BLOCK:
        return t[None, :]
    if group == atoms.QUADPAIR:
        if threads % 32:
            raise InternalError(f"quad-pair atoms need whole warps; the block has {threads} threads")
        w = np.arange(threads // 32)[:, None, None]
        p = np.arange(4)[None, :, None]
        q = np.arange(8)[None, None, :]
        return (32 * w + 4 * p + q % 4 + 16 * (q // 4)).reshape(-1, 8)
    n = atoms.GROUP_THREADS.get(group)
    if n is None:
        raise InternalError(f"unknown thread group {group!r}")
    if threads % n:
        raise InternalError(f"{group} atoms need a multiple of {n} threads; the block has {threads}")
    return t.reshape(-1, n)


class AtomTables:
    """What executing one atom needs, computed once per atom (see ``atom_tables``)."""

    def __init__(self, atom: atoms.Atom):
        self.atom = atom
        self.tv: dict[str, np.ndarray] = {}
        self.tile: dict[str, tuple[int, int]] = {}
        for o in atom.operands:
            if o.tv is not None:
                self.tv[o.name] = tv_index(o.tv)
                self.tile[o.name] = tuple(int(n) for n in o.tv.tile)
        self.addr = None
        if atom.family in (atoms.LDMATRIX, sm90a.STMATRIX):
            # ldmatrix reads the memory operand into registers, stmatrix (its inverse) writes it
            load = atom.family == atoms.LDMATRIX
            mem = mem_operand(atom)
            reg = reg_operand(atom, "out" if load else "in")
            rows, cols = (int(n) for n in atom.shape[:2])
            per = rows * cols // int(mem.addr.size())
            first = np.asarray(mem.addr.offsets(), dtype=np.int64)
            # each address supplies `per` contiguous elements along the columns of its tile row
            self.addr = first[:, None] + rows * np.arange(per)[None, :]
            self.src, self.dst = (mem.name, reg.name) if load else (reg.name, mem.name)
            self.mem_tile = (rows, cols)
            self.per = per
            # the [rows, cols] tile, row-major, gathered from the [lanes, per] memory elements
            # (when they cover it once each)
            rm = (self.addr % rows) * cols + self.addr // rows
            self.tile_from_memory = None
            if np.array_equal(np.sort(rm.ravel()), np.arange(rows * cols)):
                inv = np.empty(rows * cols, dtype=np.int64)
                inv[rm.ravel()] = np.arange(rm.size)
                self.tile_from_memory = inv
        if atom.family == atoms.MMA:
            ins = [o for o in atom.operands if o.memory == "RF" and o.role == "in"]
            outs = [o for o in atom.operands if o.memory == "RF" and o.role in ("out", "inout")]
            names = [o.name for o in ins] + [o.name for o in outs if o.role == "inout"]
            self.inputs = tuple(n for n in ("a", "b", "c") if n in names) or tuple(names)
            self.output = "d" if any(o.name == "d" for o in outs) else outs[0].name
            self.dtypes = {n: atom.dtype_of(n) for n in (*self.inputs, self.output)}
        # row-major gathers: ``fragment.reshape(G, -1)[:, from_fragment[n]]`` is the stack of
        # [rows, cols] tiles of operand n (when its layout holds each element exactly once), and
        # ``tiles.reshape(G, -1)[:, to_fragment[n]]`` the [G, threads, values] fragments
        self.from_fragment: dict[str, np.ndarray] = {}
        self.to_fragment: dict[str, np.ndarray] = {}
        self.tile_regs: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
        for name, idx in self.tv.items():
            rows, cols = self.tile[name]
            rm = (idx % rows) * cols + idx // rows
            self.to_fragment[name] = rm
            if np.array_equal(np.sort(rm.ravel()), np.arange(rows * cols)):
                inv = np.empty(rows * cols, dtype=np.int64)
                inv[rm.ravel()] = np.arange(rm.size)
                self.from_fragment[name] = inv
                # the same as (thread of the group, register) of each row-major tile element
                lanes, regs = np.divmod(inv, idx.shape[1])
                self.tile_regs[name] = (lanes, regs, int(regs.max()))


# Atoms are long-lived module constants; their tables are kept by identity (with the atom itself,
# so that an id is never reused while its entry lives).
_TABLES: dict[int, tuple[atoms.Atom, AtomTables]] = {}
_GROUPS: dict[tuple[str, int], np.ndarray] = {}


def atom_tables(atom: atoms.Atom) -> AtomTables:
    entry = _TABLES.get(id(atom))
    if entry is None or entry[0] is not atom:
        if len(_TABLES) > 4096:
            _TABLES.clear()
        entry = _TABLES[id(atom)] = (atom, AtomTables(atom))
    return entry[1]


def thread_groups(group: str, threads: int) -> np.ndarray:
    """``[groups, group_threads]`` thread ids of each ``group`` of ``threads`` threads (read-only,
    shared between runs)."""
    key = (group, threads)
    g = _GROUPS.get(key)
    if g is None:
        g = _GROUPS[key] = _groups(group, threads)
        g.setflags(write=False)
    return g


def mem_operand(atom):
    """The memory (SH or GL) operand of ``atom``."""
    for o in atom.operands:
        if o.memory in ("SH", "GL"):
            return o
    raise InternalError(f"atom {atom.name} has no memory operand")


def reg_operand(atom, role):
    """A register operand of ``atom`` with ``role`` (``inout`` counts as either)."""
    for o in atom.operands:
        if o.memory == "RF" and (o.role == role or o.role == "inout"):
            return o
    raise InternalError(f"atom {atom.name} has no register operand with role {role!r}")
