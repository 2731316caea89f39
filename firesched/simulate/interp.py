"""The CPU interpreter of the kernel IR, and the hazard checker that makes it worth having.

``run_program(program, arrays)`` executes every kernel of a ``Program`` in order on numpy arrays
and returns the final global buffers.  Blocks run one after another (grid x fastest, then y,
then z); the threads of a block run in lockstep, vectorised over numpy: the index variable
``tid`` is ``np.arange(threads)``, every index expression evaluates to one value per thread (or
to an int), registers are ``[threads, size]`` arrays, loop variables are ints and ``If`` is an
active-thread mask.

While it runs, the interpreter checks what the GPU would not tell us, and raises
``HazardError`` with the buffer, the offsets, the threads, the kernel, the block and the
statement involved:

* shared-memory races: a read of an element another thread wrote since the last barrier (RAW), a
  write of an element another thread wrote (WAW) or read (WAR) since the last barrier.  Every
  shared element remembers the barrier epoch and the thread of its last write and of up to two
  distinct readers; a ``Barrier`` starts a new epoch.  Collective atoms (ldmatrix) access memory
  on behalf of the thread whose address they use.
* cp.async: the destination of an issued copy is *in flight* until an ``AsyncWait`` of the
  issuing thread completes its group; any access to it before then is a hazard, and the landing
  counts as a write by the issuing thread at the wait.  Copies still in flight when a block
  ends are a hazard too.
* bounds: global, shared and register offsets outside their buffer; misaligned addresses of
  atoms that declare an alignment.
* divergence: a ``Barrier`` some threads of the block do not reach, a collective atom (warp,
  quad-pair) issued by part of its thread group.

Semantics decided here, beyond what ``ir`` states:

* shared memory and registers start as zeros in every block;
* a statement reads before it writes: within one statement, two threads writing one shared
  element race (WAW), and a write to an element another thread reads in the same statement is a
  WAR; several threads reading one element is fine;
* ``pred`` and the ``If`` mask both disable a thread; a disabled COPY load zeroes its registers
  without reading (or bounds-checking) its source, a disabled CP_ASYNC zero-fills its
  destination (still in flight until waited for), a disabled store does nothing; MMA,
  LDMATRIX and SHUFFLE run for whole thread groups or not at all;
* moves (COPY, CP_ASYNC, LDMATRIX) move bits: buffers of equal width but different dtypes are
  reinterpreted; ``Pointwise`` computes in float64 and rounds once to the destination dtype
  (integers: to nearest, saturated), ``cvt`` likewise;
* SYNC atoms issued as ``AtomCall``: ``cp_async_commit`` is ``AsyncCommit``, a wait whose PTX
  names its count (``catalog.with_immediates``) is ``AsyncWait``, any other (``bar_sync``) is a
  ``Barrier``.

Hopper (sm_90a) atoms, modelled asynchronously (only kernels that use them pay for the tracking):

* wgmma: issued by whole warpgroups.  Its result is computed at issue (D = A @ B + D in float64,
  rounded once to f32; D = A @ B where ``scale_d`` is 0), but its accumulator registers (and the
  A registers of the ``_rs`` form) are *in flight* until a ``wgmma.wait_group`` of the issuing
  threads retires its group: any other access of them before that is a hazard ("... before
  wgmma.wait_group"), and so is a write of shared memory it read.  A warpgroup's first wgmma
  must follow a ``wgmma.fence``, and a register that another instruction accessed since the
  thread's last fence may not be used by a wgmma ("missing wgmma.fence"); wgmma after wgmma on
  the same accumulators needs no fence.  Shared
  operands are read through their descriptors (``descriptors.operand_byte_offsets``, all four swizzle
  modes; the descriptor start must be 16-byte aligned and, swizzled, at an 8-row swizzle-atom
  boundary of the shared window) on behalf of the warpgroup's first thread.
* async proxy: shared memory written by a thread through ordinary stores (st.shared, stmatrix,
  cp.async) must be covered by a ``fence.proxy.async`` of that thread before a wgmma or a TMA
  store reads it ("missing fence.proxy.async"); the usual race rules (a ``Barrier`` between
  other threads' writes and the read) apply on top.
* mbarrier: ``init`` sets the arrival count of each phase; ``arrive`` counts one arrival,
  ``arrive.expect_tx`` adds transaction bytes first; a phase completes when its arrivals and its
  bytes are all in.  Using a barrier before its init, or in the init's barrier epoch by another
  thread, is a hazard.  ``try_wait.parity(P)`` on a barrier whose completed-phase count is ``c``
  returns at once when ``P != c % 2`` (the last phase of parity P is complete; the thread has
  then observed phases ``0..c-1``), and otherwise waits for phase ``c``.  Every asynchronous
  contribution (a TMA's bytes) is accounted at issue, so in lockstep code a phase that is
  incomplete when a wait reaches it can never complete: that wait is reported as a deadlock
  ("mbarrier wait on parity P that can never complete").  Waiting on the wrong parity is thus
  either that deadlock or a wait that returns at once on a stale phase, after which reading the
  data is "read before mbarrier phase completes".
* warp specialization (``ir.Roles``): each role is a lockstep group of its own, run as a
  coroutine (a Python thread holding a baton, so exactly one runs); a role whose mbarrier wait
  cannot return yet hands the baton to the next role that can run, round robin, and when none
  can the block is reported as a deadlock with every role's wait.  A block-wide ``Barrier``
  inside a role is a hazard; named barriers (``Barrier(threads=...)``, an id per group of
  threads) synchronise the threads that reach them with the same id, which must be exactly
  ``threads`` whole warps of one lockstep group.
* happens-before: besides barrier epochs, every thread carries a vector clock.  A barrier (block
  or named) joins the clocks of its threads; an mbarrier arrive releases the thread's clock (and
  the mbarrier phases it has observed) into the phase, and a wait that sees the phase complete
  acquires them.  A shared-memory access by another thread in the same epoch is a race only if
  it is not ordered by these clocks — so a TMA refill after the consumers released the stage
  through an "empty" mbarrier is fine, and one without that release is a race.
* TMA load: the box (zeros outside the tensor) is written at issue, tagged with its barrier and
  the phase its bytes complete; a thread may read (or overwrite) a tagged element only after it
  has observed that phase.  TMA store: reads its box from shared memory at issue (checked like a
  read of the issuing thread, plus the proxy fence), writes the in-bounds elements to global
  memory, and keeps the source in flight until a ``cp.async.bulk.wait_group[.read]`` of the
  thread retires its bulk group.  Swizzled boxes must have an inner extent equal to the swizzle
  span.  A TMA load into memory that other threads read must be ordered after those reads (a
  barrier, or the vector clocks of an "empty" mbarrier); wgmma operand reads count as reads by
  the warpgroup's first thread.
* wgmma operations, TMA stores and TMA loads still outstanding when a block ends are hazards.
* setmaxnreg: a no-op that must be executed by whole warpgroups; stmatrix: the inverse of
  ldmatrix.
"""

from __future__ import annotations

import re
import threading

import numpy as np

from .. import ir
from ..dtypes import DType, round_to
from ..errors import HazardError, InternalError
from ..hardware import descriptors, tma
from ..hardware.atoms import base as atoms
from ..hardware.atoms import catalog, sm90a
from ..ir.expr import BinOp, Select, Sum, Var
from ..ops import SCALAR_OPS

__all__ = ["run_program", "run_kernel", "describe"]

_MAX_LISTED = 4


# --------------------------------------------------------------------------- entry points

def run_program(program: ir.Program, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run every kernel of ``program`` in order; return the final global arrays by name.

    ``arrays`` holds each input (and optionally the output) by buffer name, in the buffer's
    ``shape`` (or already flat, ``buffer.size`` elements); missing outputs and workspaces start
    as zeros.  The result maps every global buffer name to an array of its ``shape``.
    """
    buffers: dict[str, ir.GlobalBuffer] = {}
    for b in (*program.inputs, *((program.output,) if program.output is not None else ()),
              *program.workspaces):
        buffers.setdefault(b.name, b)
    for k in program.kernels:
        for b in k.params:
            b = b.buffer if isinstance(b, ir.TensorMapParam) else b
            buffers.setdefault(b.name, b)
    unknown = sorted(set(arrays) - set(buffers))
    if unknown:
        raise ValueError(f"run_program: no global buffer named {unknown}; the program has {sorted(buffers)}")
    missing = [b.name for b in program.inputs if b.name not in arrays]
    if missing:
        raise ValueError(f"run_program: inputs {missing} are not given")

    memory = {name: _load_global(b, arrays.get(name)) for name, b in buffers.items()}
    for k in program.kernels:
        run_kernel(k, memory)
    return {name: _unload_global(buffers[name], memory[name]) for name in buffers}


def run_kernel(kernel: ir.Kernel, memory: dict[str, np.ndarray]) -> None:
    """Run one kernel launch on flat global arrays (by buffer name), in place."""
    _KernelRun(kernel, memory).run()


def _load_global(buf: ir.GlobalBuffer, value) -> np.ndarray:
    flat = np.zeros(buf.size, dtype=buf.dtype.np)
    if value is None:
        return flat
    value = np.asarray(value)
    if tuple(value.shape) == tuple(buf.shape):
        _strided(buf, flat)[...] = _to_dtype(value, buf.dtype)
    elif value.ndim == 1 and value.size == buf.size:
        flat[...] = _to_dtype(value, buf.dtype)
    else:
        raise ValueError(f"run_program: array for {buf.name!r} has shape {value.shape}; the buffer has "
                         f"shape {buf.shape} (or flat size {buf.size})")
    return flat


def _unload_global(buf: ir.GlobalBuffer, flat: np.ndarray) -> np.ndarray:
    if buf.size == 0:
        return np.zeros(buf.shape, dtype=buf.dtype.np)
    return np.array(_strided(buf, flat))


def _strided(buf: ir.GlobalBuffer, flat: np.ndarray) -> np.ndarray:
    item = flat.dtype.itemsize
    return np.lib.stride_tricks.as_strided(flat, shape=buf.shape, strides=[s * item for s in buf.strides])


def _to_dtype(values, dt: DType) -> np.ndarray:
    """Values converted to ``dt``'s numpy type, rounding to nearest (integers: rint, saturated)."""
    values = np.asarray(values)
    if values.dtype == dt.np:
        return values
    if dt.name == "tf32":
        return round_to(dt, values.astype(np.float32)).astype(np.float32)
    if dt.kind in ("int", "uint") and values.dtype.kind == "f":
        info = _int_range(dt)
        values = np.clip(np.rint(values.astype(np.float64)), info[0], info[1])
    return values.astype(dt.np)


def _int_range(dt: DType) -> tuple[int, int]:
    if dt.kind == "int":
        return -(1 << (dt.bits - 1)), (1 << (dt.bits - 1)) - 1
    return 0, (1 << dt.bits) - 1


# --------------------------------------------------------------------------- index expressions

def _compile(x):
    """A function ``env -> value`` computing ``expr.evaluate(x, env)``, built once per expression."""
    if isinstance(x, (bool, np.bool_)):
        x = int(x)
    if isinstance(x, (int, np.integer)):
        c = int(x)
        return lambda env: c
    if isinstance(x, Var):
        name = x.name

        def var(env):
            try:
                return env[name]
            except KeyError:
                raise InternalError(f"index variable {name!r} is not bound here") from None
        return var
    if isinstance(x, Sum):
        const = x.const
        terms = tuple((_compile(t), c) for t, c in x.terms)
        if len(terms) == 1:
            (f0, c0), = terms
            return lambda env: const + c0 * f0(env)

        def total(env):
            out = const
            for f, c in terms:
                out = out + c * f(env)
            return out
        return total
    if isinstance(x, BinOp):
        fa, fb = _compile(x.a), _compile(x.b)
        op = _BINOPS.get(x.op)
        if op is None:
            raise InternalError(f"unknown index operator {x.op!r} in {x!r}")
        return lambda env: op(fa(env), fb(env))
    if isinstance(x, Select):
        fc, fa, fb = _compile(x.cond), _compile(x.a), _compile(x.b)

        def sel(env):
            c, a, b = fc(env), fa(env), fb(env)
            if np.ndim(c) == 0 and np.ndim(a) == 0 and np.ndim(b) == 0:
                return int(a) if c else int(b)
            return np.where(np.asarray(c) != 0, a, b)
        return sel
    raise InternalError(f"not an index expression: {x!r}")


def _as_int(r):
    return r.astype(np.int64) if isinstance(r, np.ndarray) else int(r)


_BINOPS = {
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "*": lambda a, b: a * b,
    "&": lambda a, b: a & b,
    "^": lambda a, b: a ^ b,
    ">>": lambda a, b: a >> b,
    "<<": lambda a, b: a << b,
    "<": lambda a, b: _as_int(np.less(a, b)),
    ">=": lambda a, b: _as_int(np.greater_equal(a, b)),
    "==": lambda a, b: _as_int(np.equal(a, b)),
    "!=": lambda a, b: _as_int(np.not_equal(a, b)),
    "&&": lambda a, b: _as_int(np.logical_and(a, b)),
    "min": lambda a, b: np.minimum(a, b),
    "max": lambda a, b: np.maximum(a, b),
}


# --------------------------------------------------------------------------- statement descriptions

def describe(stmt) -> str:
    """A one-line description of a statement, for error messages."""
    if isinstance(stmt, ir.AtomCall):
        args = ", ".join(f"{n}={_ref_str(r)}" for n, r in stmt.args)
        pred = "" if isinstance(stmt.pred, int) and stmt.pred == 1 else f" if ({stmt.pred})"
        note = f"  // {stmt.comment}" if stmt.comment else ""
        return f"AtomCall {stmt.atom!r}({args}){pred}{note}"
    if isinstance(stmt, ir.Barrier):
        named = f"({stmt.bar_id}, {stmt.threads} threads)" if stmt.threads else ""
        return "Barrier" + named + (f"  // {stmt.comment}" if stmt.comment else "")
    if isinstance(stmt, ir.Roles):
        return "Roles(" + ", ".join(f"{r.name}: threads {r.first}..{r.first + r.count - 1}" for r in stmt.roles) + ")"
    if isinstance(stmt, ir.AsyncCommit):
        return "AsyncCommit"
    if isinstance(stmt, ir.AsyncWait):
        return f"AsyncWait({stmt.pending})"
    if isinstance(stmt, ir.RegFill):
        return f"RegFill({_ref_str(stmt.ref)} x{stmt.count} = {stmt.value})"
    if isinstance(stmt, ir.Pointwise):
        srcs = ", ".join(_ref_str(s) if isinstance(s, ir.RegRef) else repr(s) for s in stmt.srcs)
        return f"Pointwise({_ref_str(stmt.dst)} = {stmt.op}({srcs}))"
    if isinstance(stmt, ir.For):
        return f"For({stmt.var} < {stmt.extent})"
    if isinstance(stmt, ir.If):
        return f"If({stmt.cond})"
    return type(stmt).__name__


def _ref_str(ref) -> str:
    if isinstance(ref, ir.MemRef):
        kind = "GL" if isinstance(ref.buffer, ir.GlobalBuffer) else "SH"
        return f"{kind} {ref.buffer.name}[{ref.offset}]"
    if isinstance(ref, ir.RegRef):
        return f"{ref.buffer.name}[{ref.offset}]"
    if isinstance(ref, ir.DescRef):
        return f"desc(SH {ref.buffer.name}[{ref.offset}], sw{ref.swizzle}, lbo {ref.lbo}, sbo {ref.sbo})"
    if isinstance(ref, ir.Scalar):
        return str(ref.value)
    if isinstance(ref, ir.TensorMapParam):
        return f"tmap {ref.name}"
    return repr(ref)


def _listing(items) -> str:
    items = list(items)
    s = ", ".join(str(int(i)) for i in items[:_MAX_LISTED])
    return s + (f", ... ({len(items)} in all)" if len(items) > _MAX_LISTED else "")


# --------------------------------------------------------------------------- atom tables

def _tv_index(tv) -> np.ndarray:
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


class _AtomTables:
    """What executing one atom needs, computed once per atom (see ``_atom_tables``)."""

    def __init__(self, atom: atoms.Atom):
        self.atom = atom
        self.tv: dict[str, np.ndarray] = {}
        self.tile: dict[str, tuple[int, int]] = {}
        for o in atom.operands:
            if o.tv is not None:
                self.tv[o.name] = _tv_index(o.tv)
                self.tile[o.name] = tuple(int(n) for n in o.tv.tile)
        self.addr = None
        if atom.family in (atoms.LDMATRIX, sm90a.STMATRIX):
            # ldmatrix reads the memory operand into registers, stmatrix (its inverse) writes it
            load = atom.family == atoms.LDMATRIX
            mem = _mem_operand(atom)
            reg = _reg_operand(atom, "out" if load else "in")
            rows, cols = (int(n) for n in atom.shape[:2])
            per = rows * cols // int(mem.addr.size())
            first = np.asarray(mem.addr.offsets(), dtype=np.int64)
            # each address supplies `per` contiguous elements along the columns of its tile row
            self.addr = first[:, None] + rows * np.arange(per)[None, :]
            self.src, self.dst = (mem.name, reg.name) if load else (reg.name, mem.name)
            self.mem_tile = (rows, cols)
            self.per = per
        if atom.family == atoms.MMA:
            ins = [o for o in atom.operands if o.memory == "RF" and o.role == "in"]
            outs = [o for o in atom.operands if o.memory == "RF" and o.role in ("out", "inout")]
            names = [o.name for o in ins] + [o.name for o in outs if o.role == "inout"]
            self.inputs = tuple(n for n in ("a", "b", "c") if n in names) or tuple(names)
            self.output = "d" if any(o.name == "d" for o in outs) else outs[0].name


# Atoms are long-lived module constants; their tables are kept by identity (with the atom itself,
# so that an id is never reused while its entry lives).
_TABLES: dict[int, tuple[atoms.Atom, _AtomTables]] = {}
_GROUPS: dict[tuple[str, int], np.ndarray] = {}


def _atom_tables(atom: atoms.Atom) -> _AtomTables:
    entry = _TABLES.get(id(atom))
    if entry is None or entry[0] is not atom:
        if len(_TABLES) > 4096:
            _TABLES.clear()
        entry = _TABLES[id(atom)] = (atom, _AtomTables(atom))
    return entry[1]


def _thread_groups(group: str, threads: int) -> np.ndarray:
    key = (group, threads)
    g = _GROUPS.get(key)
    if g is None:
        g = _GROUPS[key] = _groups(group, threads)
        g.setflags(write=False)
    return g


def _mem_operand(atom):
    for o in atom.operands:
        if o.memory in ("SH", "GL"):
            return o
    raise InternalError(f"atom {atom.name} has no memory operand")


def _reg_operand(atom, role):
    for o in atom.operands:
        if o.memory == "RF" and (o.role == role or o.role == "inout"):
            return o
    raise InternalError(f"atom {atom.name} has no register operand with role {role!r}")


# --------------------------------------------------------------------------- shared memory state

class _Shared:
    """One shared buffer of the running block (of each block of a running cluster): data plus the
    access history of each element."""

    __slots__ = ("buf", "n", "data", "w_epoch", "writer", "w_stmt", "r_epoch", "reader", "reader2",
                 "r_stmt", "w_clock", "r_clock", "r_clock2", "inflight", "inflight_stmt", "base", "sm90", "proxy_w", "async_rd",
                 "async_rd_stmt", "tma_bar", "tma_phase")

    def __init__(self, buf: ir.SharedBuffer, base: int, sm90: bool = False, copies: int = 1):
        # one copy per block of a thread-block cluster: block r's element e is entry r * n + e
        self.n = buf.size
        n = buf.size * copies
        self.buf = buf
        self.base = base
        self.data = np.zeros(n, dtype=buf.dtype.np)
        self.w_epoch = np.full(n, -1, dtype=np.int64)
        self.writer = np.full(n, -1, dtype=np.int64)
        self.w_stmt = np.full(n, -1, dtype=np.int64)
        self.r_epoch = np.full(n, -1, dtype=np.int64)
        self.reader = np.full(n, -1, dtype=np.int64)   # first distinct reader this epoch
        self.reader2 = np.full(n, -1, dtype=np.int64)  # a second distinct reader, or -1
        self.r_stmt = np.full(n, -1, dtype=np.int64)
        # the own clock (see _KernelRun.vc) of the writer / the two readers at their access
        self.w_clock = np.full(n, -1, dtype=np.int64)
        self.r_clock = np.full(n, -1, dtype=np.int64)
        self.r_clock2 = np.full(n, -1, dtype=np.int64)
        self.inflight = np.full(n, -1, dtype=np.int64)  # issuing thread of an in-flight cp.async
        self.inflight_stmt = np.full(n, -1, dtype=np.int64)
        # sm_90a tracking: the thread of a generic-proxy write not yet covered by its
        # fence.proxy.async, in-flight async-proxy readers (wgmma, TMA store) and the mbarrier
        # phase a TMA load's data waits for
        self.sm90 = sm90
        if sm90:
            self.proxy_w = np.full(n, -1, dtype=np.int64)
            self.async_rd = np.zeros(n, dtype=np.int64)
            self.async_rd_stmt = np.full(n, -1, dtype=np.int64)
            self.tma_bar = np.full(n, -1, dtype=np.int64)
            self.tma_phase = np.full(n, -1, dtype=np.int64)

    def reset(self):
        self.data[...] = 0
        for a in (self.w_epoch, self.writer, self.w_stmt, self.r_epoch, self.reader, self.reader2,
                  self.r_stmt, self.inflight, self.inflight_stmt, self.w_clock, self.r_clock, self.r_clock2):
            a[...] = -1
        if self.sm90:
            for a in (self.proxy_w, self.async_rd_stmt, self.tma_bar, self.tma_phase):
                a[...] = -1
            self.async_rd[...] = 0


def _by_address(addr: np.ndarray, thr: np.ndarray):
    """Unique addresses with the smallest and largest thread accessing each."""
    if addr.size <= 1:
        return addr, thr, thr
    order = np.argsort(addr, kind="stable")
    sa, st = addr[order], thr[order]
    starts = np.flatnonzero(np.concatenate(([True], sa[1:] != sa[:-1])))
    if starts.size == sa.size:
        return sa, st, st
    return sa[starts], np.minimum.reduceat(st, starts), np.maximum.reduceat(st, starts)


class _Async:
    """The cp.async copies of one statement execution that have not landed yet."""

    __slots__ = ("sh", "addr", "thr", "group", "values", "sid")

    def __init__(self, sh, addr, thr, group, values, sid):
        self.sh, self.addr, self.thr, self.group, self.values, self.sid = sh, addr, thr, group, values, sid


# --------------------------------------------------------------------------- the interpreter

class _KernelRun:
    def __init__(self, kernel: ir.Kernel, memory: dict[str, np.ndarray]):
        self.kernel = kernel
        self.memory = memory
        # A thread-block cluster of C blocks runs as one group of C x Tc threads: thread g is
        # thread g % Tc of the block of rank g // Tc.  Shared buffers and mbarriers have one copy
        # per block, vector clocks span the cluster, barriers synchronise one block.
        self.C = int(getattr(kernel, "cluster", 1) or 1)
        self.Tc = int(kernel.threads)
        self.T = self.C * self.Tc
        self.tid = np.arange(self.T, dtype=np.int64)
        self.rank = self.tid // self.Tc
        self.ltid = self.tid % self.Tc
        self.tmaps = {p.name: p for p in kernel.params if isinstance(p, ir.TensorMapParam)}
        for p in kernel.params:
            b = p.buffer if isinstance(p, ir.TensorMapParam) else p
            if b.name not in memory:
                memory[b.name] = np.zeros(b.size, dtype=b.dtype.np)
        self.globals = {p.name: p for p in kernel.params if not isinstance(p, ir.TensorMapParam)}
        families = _families(kernel.body)
        self.sm90 = bool(families & set(sm90a.FAMILIES)) or bool(self.tmaps) or any(
            isinstance(b, ir.MBarrier) for b in kernel.shared)
        self.track_wgmma = sm90a.WGMMA in families
        offsets = kernel.shared_offsets()
        self.shared = {b.name: _Shared(b, offsets[b.name], self.sm90, self.C) for b in kernel.shared}
        self.bar_base: dict[str, int] = {}
        nbars = 0
        for b in kernel.shared:
            if isinstance(b, ir.MBarrier):
                self.bar_base[b.name] = nbars
                nbars += int(b.size)
        self.nbars = nbars                  # per block; block r's mbarrier i has id r * nbars + i
        self.regs = {r.name: np.zeros((self.T, r.size), dtype=r.dtype.np) for r in kernel.regs}
        self.reg_bufs = {r.name: r for r in kernel.regs}
        self.fns: dict[int, tuple] = {}
        self.stmts: list = []
        self.stmt_ids: dict[int, int] = {}
        self.dispatch = {
            ir.Seq: self.x_seq, tuple: self.x_list, list: self.x_list, ir.For: self.x_for,
            ir.If: self.x_if, ir.Roles: self.x_roles, ir.AtomCall: self.x_atom, ir.Barrier: self.x_barrier,
            ir.AsyncCommit: self.x_commit, ir.AsyncWait: self.x_wait, ir.RegFill: self.x_fill,
            ir.Pointwise: self.x_pointwise, ir.Comment: self.x_nothing, type(None): self.x_nothing,
        }
        if self.C > 1 and int(kernel.grid[0]) % self.C:
            raise InternalError(f"kernel {kernel.name!r}: grid x = {kernel.grid[0]} is not a multiple of its "
                                f"cluster size {self.C}")

    # ----------------------------------------------------------------- driving

    def run(self):
        gx, gy, gz = (int(g) for g in self.kernel.grid)
        for bz in range(gz):
            for by in range(gy):
                for bx in range(0, gx, self.C):
                    self.run_block((bx, by, bz))

    def run_block(self, bid):
        self.bid = bid
        bx = bid[0] + self.rank if self.C > 1 else bid[0]
        self.env = {ir.TID_NAME: self.ltid, ir.BID_NAMES[0]: bx, ir.BID_NAMES[1]: bid[1],
                    ir.BID_NAMES[2]: bid[2]}
        self.loops: list[tuple[str, int]] = []
        self.mask = np.ones(self.T, dtype=bool)
        self.full = True
        self.epoch = 0
        for sh in self.shared.values():
            sh.reset()
        for r in self.regs.values():
            r[...] = 0
        self.open_group = np.zeros(self.T, dtype=np.int64)
        self.pending: list[_Async] = []
        self.stmt = None
        # vector clocks: vc[t, u] is the last clock value of thread u that thread t has synchronised
        # with (through a barrier or an mbarrier phase); vc[t, t] is t's own clock, advanced at each
        # release (barrier arrival, mbarrier arrive).  An access by u at own clock c is ordered
        # before thread t's later access iff vc[t, u] >= c.
        self.vc = np.eye(self.T, dtype=np.int64)
        self.roles = None
        if self.sm90:
            self.reset_sm90()
        self.remote: list[tuple[int, int, int, int, int]] = []
        self.exec(self.kernel.body)
        if self.sm90:
            self.end_sm90()
        if self.remote:
            self.check_remote()
        if self.pending:
            rec = self.pending[0]
            self.stmt = self.stmts[rec.sid]
            self.hazard(
                f"async copies never waited for: thread {int(rec.thr[0])}'s cp.async into SH buffer "
                f"{rec.sh.buf.name!r} offset {int(rec.addr[0])} (group {int(rec.group[0])}) is still in "
                f"flight when the block ends; threads {_listing(np.unique(np.concatenate([p.thr for p in self.pending])))} "
                f"have copies in flight")

    def exec(self, s):
        try:
            handler = self.dispatch[type(s)]
        except KeyError:
            raise InternalError(f"kernel {self.kernel.name!r}: not a statement: {s!r}") from None
        handler(s)

    def sid(self, s) -> int:
        i = self.stmt_ids.get(id(s))
        if i is None:
            i = self.stmt_ids[id(s)] = len(self.stmts)
            self.stmts.append(s)
        return i

    def ev(self, x):
        """Value of index expression ``x`` now (an int or a per-thread array)."""
        if type(x) is int:
            return x
        entry = self.fns.get(id(x))
        if entry is None:
            entry = self.fns[id(x)] = (x, _compile(x))
        return entry[1](self.env)

    def per_thread(self, x) -> np.ndarray:
        v = self.ev(x)
        if np.ndim(v) == 0:
            return np.full(self.T, int(v), dtype=np.int64)
        return np.broadcast_to(np.asarray(v, dtype=np.int64), (self.T,))


    # ----------------------------------------------------------------- errors

    def hazard(self, message: str):
        where = f"kernel {self.kernel.name!r}, block {self.bid}"
        if self.C > 1:
            b = self.bid
            where = (f"kernel {self.kernel.name!r}, cluster of blocks ({b[0]}..{b[0] + self.C - 1}, {b[1]}, "
                     f"{b[2]}) (thread g is thread g % {self.Tc} of the block of rank g // {self.Tc})")
        if self.loops:
            where += ", " + ", ".join(f"{n}={v}" for n, v in self.loops)
        stmt = describe(self.stmt) if self.stmt is not None else "(end of block)"
        raise HazardError(f"{message}\n  in {where}\n  at {stmt}")

    def stmt_str(self, i) -> str:
        return describe(self.stmts[int(i)]) if i >= 0 else "?"

    # ----------------------------------------------------------------- control flow

    def x_nothing(self, s):
        pass

    def x_seq(self, s):
        for c in s.body:
            self.exec(c)

    def x_list(self, s):
        for c in s:
            self.exec(c)

    def x_for(self, s):
        name = s.var.name
        saved = self.env.get(name)
        self.loops.append((name, 0))
        slot = len(self.loops) - 1
        for i in range(int(s.extent)):
            self.env[name] = i
            self.loops[slot] = (name, i)
            self.exec(s.body)
        self.loops.pop()
        if saved is None:
            self.env.pop(name, None)
        else:
            self.env[name] = saved

    def x_if(self, s):
        c = self.ev(s.cond)
        if np.ndim(c) == 0:
            if c:
                self.exec(s.then)
            return
        new = self.mask & (np.broadcast_to(c, (self.T,)) != 0)
        if not new.any():
            return
        saved = (self.mask, self.full)
        self.mask, self.full = new, bool(new.all())
        try:
            self.exec(s.then)
        finally:
            self.mask, self.full = saved

    def x_roles(self, s):
        self.stmt = s
        if self.roles is not None:
            self.hazard("Roles inside a role: warp specialization does not nest")
        if not self.full:
            self.hazard(f"Roles inside divergent code: threads {_listing(np.flatnonzero(~self.mask))} do not "
                        f"reach it; the roles must partition threads of the whole block")
        taken = np.zeros(self.T, dtype=bool)
        for r in s.roles:
            lo, n = int(r.first), int(r.count)
            if lo % 32 or n % 32 or n <= 0 or lo < 0 or lo + n > self.Tc:
                self.hazard(f"role {r.name!r} covers threads {lo}..{lo + n - 1}: roles are whole warps of "
                            f"the block's {self.Tc} threads")
            if taken[lo:lo + n].any():
                self.hazard(f"role {r.name!r} overlaps another role at threads {_listing(np.flatnonzero(taken[lo:lo + n]) + lo)}")
            taken[lo:lo + n] = True
        _RoleScheduler(self, s.roles, self.C, self.Tc).run()

    def x_barrier(self, s):
        self.stmt = s
        threads = int(getattr(s, "threads", 0) or 0)
        if threads:
            self.named_barrier(s, threads)
            return
        if not self.full:
            missing = np.flatnonzero(~self.mask)
            inside = " (a role of a warp-specialized kernel: use a named barrier)" if self.roles else ""
            self.hazard(f"barrier inside divergent code{inside}: threads {_listing(missing)} of the block do "
                        f"not reach it (threads {_listing(np.flatnonzero(self.mask))} do)")
        self.epoch += 1
        if self.C > 1:                  # __syncthreads: each block of the cluster on its own
            for r in range(self.C):
                grp = self.tid[self.rank == r]
                self.join(grp)
            return
        self.vc[...] = self.vc.max(axis=0)
        self.vc[self.tid, self.tid] += 1
        if self.sm90:
            self.bar_obs[...] = self.bar_obs.max(axis=0)

    def join(self, grp: np.ndarray):
        """Threads ``grp`` synchronise (a barrier): each acquires what all have released."""
        self.vc[grp] = self.vc[grp].max(axis=0)
        self.vc[grp, grp] += 1
        if self.sm90:
            self.bar_obs[grp] = self.bar_obs[grp].max(axis=0)

    def x_cluster(self, s):
        """``barrier.cluster`` arrive + wait: every thread of every block of the cluster."""
        self.stmt = s
        if not self.full:
            self.hazard(f"cluster barrier inside divergent code or a role: threads "
                        f"{_listing(np.flatnonzero(~self.mask))} of the cluster do not reach it")
        self.epoch += 1
        self.join(self.tid)

    def named_barrier(self, s, threads: int):
        """``bar.sync id, threads``: the active threads with the same ``id`` (an int, or an index
        expression such as one barrier per warpgroup) must be exactly ``threads`` whole warps (the
        interpreter models a named barrier reached by one lockstep group at once)."""
        act = self.active()
        ids = self.per_thread(getattr(s, "bar_id", 0))[act]
        if threads % 32 or not 0 < threads <= self.Tc:
            self.hazard(f"named barrier with {threads} threads: the thread count must be a multiple of 32, "
                        f"at most the block's {self.Tc}")
        ranks = self.rank[act]
        for bid, r in sorted(set(zip(ids.tolist(), ranks.tolist()))):
            grp = act[(ids == bid) & (ranks == r)]
            if not 1 <= bid < 16:
                self.hazard(f"named barrier id {bid} (threads {_listing(grp)}): ids are 1..15 (0 is the "
                            f"block-wide barrier)")
            warps = np.unique(grp // 32)
            if grp.size != threads or warps.size * 32 != threads:
                self.hazard(f"named barrier {bid} expects {threads} threads (whole warps) but threads "
                            f"{_listing(grp)} ({grp.size}, in {warps.size} warp(s)) reach it")
            self.join(grp)

    def ordered(self, other: np.ndarray, clock: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Whether the accesses of threads ``other`` at their own clocks ``clock`` happen before
        the threads ``t`` now (element-wise; ``other < 0`` means no access)."""
        o = np.maximum(other, 0)
        return (other < 0) | (self.vc[t, o] >= clock)

    # ----------------------------------------------------------------- registers

    def reg_index(self, ref: ir.RegRef, n: int, thr: np.ndarray):
        """``(array, index)`` selecting ``n`` registers from ``ref`` for each thread of ``thr``."""
        buf = ref.buffer
        R = self.regs.get(buf.name)
        if R is None or (self.reg_bufs[buf.name] is not buf and self.reg_bufs[buf.name] != buf):
            self.hazard(f"register buffer {buf.name!r} is not declared by the kernel")
        off = self.ev(ref.offset)
        rows = slice(None) if thr is self.tid else thr
        if np.ndim(off) == 0:
            off = int(off)
            if off < 0 or off + n > buf.size:
                self.hazard(f"register buffer {buf.name!r} (size {buf.size}) accessed at offsets "
                            f"{off}..{off + n - 1}: out of range (threads {_listing(thr)})")
            if self.track_wgmma:
                self.watch_regs(buf.name, (rows, slice(off, off + n)), thr)
            return R, (rows, slice(off, off + n))
        offs = self.per_thread_value(off)[thr]
        cols = offs[:, None] + np.arange(n)[None, :]
        bad = (cols < 0) | (cols >= buf.size)
        if bad.any():
            t = np.flatnonzero(bad.any(axis=1))
            self.hazard(f"register buffer {buf.name!r} (size {buf.size}) accessed at offset "
                        f"{int(cols[t[0]][bad[t[0]]][0])}: out of range (threads {_listing(thr[t])})")
        if self.track_wgmma:
            self.watch_regs(buf.name, (thr[:, None], cols), thr)
        return R, (thr[:, None], cols)

    def per_thread_value(self, v) -> np.ndarray:
        if np.ndim(v) == 0:
            return np.full(self.T, int(v), dtype=np.int64)
        return np.broadcast_to(np.asarray(v, dtype=np.int64), (self.T,))

    def x_fill(self, s):
        self.stmt = s
        thr = self.active()
        if thr.size == 0:
            return
        R, idx = self.reg_index(s.ref, int(s.count), thr)
        R[idx] = _to_dtype(np.float64(s.value), s.ref.buffer.dtype)

    def x_pointwise(self, s):
        self.stmt = s
        thr = self.active()
        if thr.size == 0:
            return
        op = SCALAR_OPS.get(s.op)
        if op is None:
            raise InternalError(f"Pointwise op {s.op!r} is unknown; allowed: {sorted(SCALAR_OPS)}")
        if len(s.srcs) != op.arity:
            raise InternalError(f"Pointwise {s.op} takes {op.arity} sources, got {len(s.srcs)}")
        dt = s.dst.buffer.dtype
        if s.op == "cvt":
            src = s.srcs[0]
            if isinstance(src, ir.RegRef):
                R, idx = self.reg_index(src, 1, thr)
                x = R[idx][:, 0]
            else:
                x = np.full(thr.size, float(src))
            if np.asarray(x).dtype.kind == "f" or dt.kind != "float":
                x = np.asarray(x).astype(np.float64)
            out = _to_dtype(x, dt)
        else:
            args = []
            for src in s.srcs:
                if isinstance(src, ir.RegRef):
                    R, idx = self.reg_index(src, 1, thr)
                    args.append(R[idx][:, 0].astype(np.float64))
                else:
                    args.append(np.float64(src))
            out = _to_dtype(np.broadcast_to(np.asarray(op.np(*args), dtype=np.float64), (thr.size,)), dt)
        R, idx = self.reg_index(s.dst, 1, thr)
        R[idx] = out[:, None]

    def active(self) -> np.ndarray:
        return self.tid if self.full else np.flatnonzero(self.mask)

    # ----------------------------------------------------------------- memory

    def mem_target(self, ref: ir.MemRef):
        buf = ref.buffer
        if isinstance(buf, ir.SharedBuffer):
            sh = self.shared.get(buf.name)
            if sh is None or (sh.buf is not buf and sh.buf != buf):
                self.hazard(f"shared buffer {buf.name!r} is not declared by the kernel")
            return sh
        if isinstance(buf, ir.GlobalBuffer):
            known = self.globals.get(buf.name)
            if known is not buf and known != buf:
                self.hazard(f"global buffer {buf.name!r} is not a parameter of the kernel")
            return None
        raise InternalError(f"MemRef to {buf!r}, which is neither global nor shared")

    def check_bounds(self, ref: ir.MemRef, addr: np.ndarray, thr: np.ndarray, what: str):
        size = ref.buffer.size
        bad = (addr < 0) | (addr >= size)
        if bad.any():
            rows = np.flatnonzero(bad.reshape(addr.shape[0], -1).any(axis=1))
            first = addr.reshape(addr.shape[0], -1)[rows[0]]
            off = int(first[(first < 0) | (first >= size)][0])
            kind = "SH" if isinstance(ref.buffer, ir.SharedBuffer) else "GL"
            self.hazard(f"out-of-bounds {what}: {kind} buffer {ref.buffer.name!r} (size {size}) at offset "
                        f"{off} by thread {int(thr[rows[0]])} (threads {_listing(thr[rows])} are out of bounds)")

    def check_align(self, atom, ref: ir.MemRef, addr0: np.ndarray, thr: np.ndarray):
        align = int(getattr(atom, "alignment", 0) or 0)
        if align <= 1:
            return
        bits = ref.buffer.dtype.bits
        base = self.shared[ref.buffer.name].base if isinstance(ref.buffer, ir.SharedBuffer) else 0
        byte = base * 8 + addr0 * bits
        bad = byte % (8 * align) != 0
        if bad.any():
            i = np.flatnonzero(bad)
            self.hazard(f"misaligned address: {atom.name} needs {align}-byte aligned addresses; buffer "
                        f"{ref.buffer.name!r} offset {int(addr0[i[0]])} by thread {int(thr[i[0]])} "
                        f"(threads {_listing(thr[i])})")

    def sh_read(self, sh: _Shared, addr: np.ndarray, thr: np.ndarray):
        """Check and record reads of ``addr`` (any shape) by ``thr`` (same shape)."""
        a, t = addr.ravel(), thr.ravel()
        if sh.sm90:
            self.sm90_read_check(sh, a, t)
        inf = sh.inflight[a]
        if (inf >= 0).any():
            i = np.flatnonzero(inf >= 0)
            self.hazard(f"read of in-flight async data: thread {int(t[i[0]])} reads SH buffer "
                        f"{sh.buf.name!r} offset {int(a[i[0]])}, whose cp.async by thread {int(inf[i[0]])} "
                        f"({self.stmt_str(sh.inflight_stmt[a[i[0]]])}) has not been completed by an "
                        f"AsyncWait (threads {_listing(np.unique(t[i]))} read in-flight data)")
        E = self.epoch
        bad = (sh.w_epoch[a] == E) & (sh.writer[a] != t)
        if bad.any():
            bad &= ~self.ordered(sh.writer[a], sh.w_clock[a], t)
        if bad.any():
            i = np.flatnonzero(bad)
            j = i[0]
            self.hazard(f"race (read after write): thread {int(t[j])} reads SH buffer {sh.buf.name!r} offset "
                        f"{int(a[j])}, written by thread {int(sh.writer[a[j]])} since the last barrier "
                        f"(at {self.stmt_str(sh.w_stmt[a[j]])}); {i.size} element read(s) race, by threads "
                        f"{_listing(np.unique(t[i]))}")
        u, tmin, tmax = _by_address(a, t)
        cur = sh.r_epoch[u] == E
        r1 = np.where(cur, sh.reader[u], -1)
        r2 = np.where(cur, sh.reader2[u], -1)
        fresh = r1 < 0
        new1 = np.where(fresh, tmin, r1)
        cand = np.where(tmin != new1, tmin, np.where(tmax != new1, tmax, -1))
        new2 = np.where(r2 >= 0, r2, cand)
        c1 = np.where(cur, sh.r_clock[u], -1)
        c2 = np.where(cur, sh.r_clock2[u], -1)
        own1 = self.vc[np.maximum(new1, 0), np.maximum(new1, 0)]
        own2 = self.vc[np.maximum(new2, 0), np.maximum(new2, 0)]
        sh.r_clock[u] = np.where((new1 == tmin) | (new1 == tmax), own1, c1)
        sh.r_clock2[u] = np.where((new2 >= 0) & ((new2 == tmin) | (new2 == tmax)), own2, c2)
        sh.reader[u] = new1
        sh.reader2[u] = new2
        sh.r_epoch[u] = E
        sh.r_stmt[u] = self.sid(self.stmt)

    def sh_write_check(self, sh: _Shared, addr: np.ndarray, thr: np.ndarray, async_issue=False):
        """Check writes of ``addr`` by ``thr``; return (unique addresses, their writer)."""
        a, t = addr.ravel(), thr.ravel()
        if sh.sm90:
            self.sm90_write_check(sh, a, t)
        inf = sh.inflight[a]
        if (inf >= 0).any():
            i = np.flatnonzero(inf >= 0)
            self.hazard(f"overwrite of in-flight async data: thread {int(t[i[0]])} writes SH buffer "
                        f"{sh.buf.name!r} offset {int(a[i[0]])}, whose cp.async by thread {int(inf[i[0]])} "
                        f"({self.stmt_str(sh.inflight_stmt[a[i[0]]])}) has not been completed by an AsyncWait")
        u, tmin, tmax = _by_address(a, t)
        dup = tmin != tmax
        if dup.any():
            j = np.flatnonzero(dup)[0]
            self.hazard(f"race (write after write): threads {int(tmin[j])} and {int(tmax[j])} both write SH "
                        f"buffer {sh.buf.name!r} offset {int(u[j])} in the same statement")
        E = self.epoch
        waw = (sh.w_epoch[u] == E) & (sh.writer[u] != tmin)
        if waw.any():
            waw &= ~self.ordered(sh.writer[u], sh.w_clock[u], tmin)
        if waw.any():
            i = np.flatnonzero(waw)
            j = i[0]
            self.hazard(f"race (write after write): thread {int(tmin[j])} writes SH buffer {sh.buf.name!r} "
                        f"offset {int(u[j])}, written by thread {int(sh.writer[u[j]])} since the last barrier "
                        f"(at {self.stmt_str(sh.w_stmt[u[j]])}); {i.size} element(s) race, written by threads "
                        f"{_listing(np.unique(tmin[i]))}")
        other, war = self.unordered_reader(sh, u, tmin)
        if war.any():
            i = np.flatnonzero(war)
            j = i[0]
            self.hazard(f"race (write after read): thread {int(tmin[j])} writes SH buffer {sh.buf.name!r} "
                        f"offset {int(u[j])}, read by thread {int(other[j])} since the last barrier "
                        f"(at {self.stmt_str(sh.r_stmt[u[j]])}); {i.size} element(s) race, written by threads "
                        f"{_listing(np.unique(tmin[i]))}")
        return u, tmin

    def unordered_reader(self, sh: _Shared, u: np.ndarray, t: np.ndarray):
        """For each element ``u`` written by ``t``: a reader of this epoch other than ``t`` whose read
        is not ordered before ``t`` (or -1), and whether there is one."""
        cur = sh.r_epoch[u] == self.epoch
        r1, r2 = np.where(cur, sh.reader[u], -1), np.where(cur, sh.reader2[u], -1)
        bad1 = (r1 >= 0) & (r1 != t)
        bad2 = (r2 >= 0) & (r2 != t)
        if bad1.any():
            bad1 &= ~self.ordered(r1, sh.r_clock[u], t)
        if bad2.any():
            bad2 &= ~self.ordered(r2, sh.r_clock2[u], t)
        return np.where(bad1, r1, r2), bad1 | bad2

    def sh_write(self, sh: _Shared, addr: np.ndarray, thr: np.ndarray, values: np.ndarray, sid=None):
        u, w = self.sh_write_check(sh, addr, thr)
        sh.writer[u] = w
        sh.w_clock[u] = self.vc[w, w]
        sh.w_epoch[u] = self.epoch
        sh.w_stmt[u] = self.sid(self.stmt) if sid is None else sid
        sh.data[addr.ravel()] = values.ravel()
        if sh.sm90:
            sh.proxy_w[u] = w               # a generic-proxy write, not yet fenced
            sh.tma_bar[u] = -1

    def in_block(self, sh: _Shared, addr: np.ndarray, thr: np.ndarray) -> np.ndarray:
        """Element offsets ``addr`` of ``sh`` in the block of threads ``thr`` (same shape): the
        entries of that block's copy in a cluster."""
        return addr + self.rank[thr] * sh.n if self.C > 1 else addr

    def mem_read(self, ref: ir.MemRef, addr: np.ndarray, thr2d: np.ndarray, thr: np.ndarray) -> np.ndarray:
        """Read memory at ``addr`` (``[k, n]``, bounds already checked) for threads ``thr`` (``[k]``)."""
        sh = self.mem_target(ref)
        if sh is None:
            return self.memory[ref.buffer.name][addr]
        addr = self.in_block(sh, addr, thr2d)
        self.sh_read(sh, addr, thr2d)
        return sh.data[addr]

    def mem_write(self, ref: ir.MemRef, addr: np.ndarray, thr2d: np.ndarray, thr: np.ndarray, values):
        sh = self.mem_target(ref)
        if sh is None:
            self.memory[ref.buffer.name][addr] = values
            return
        self.sh_write(sh, self.in_block(sh, addr, thr2d), thr2d, values)

    # ----------------------------------------------------------------- atoms

    def x_atom(self, s: ir.AtomCall):
        self.stmt = s
        fam = s.atom.family
        if fam == atoms.COPY:
            self.x_copy(s)
        elif fam == atoms.CP_ASYNC:
            self.x_cp_async(s)
        elif fam == atoms.LDMATRIX:
            self.x_ldmatrix(s)
        elif fam == atoms.MMA:
            self.x_mma(s)
        elif fam == atoms.SHUFFLE:
            self.x_shuffle(s)
        elif fam == atoms.SYNC:
            self.x_sync_atom(s)
        elif fam in self.sm90_dispatch:
            self.sm90_dispatch[fam](self, s)
        else:
            raise InternalError(f"atom {s.atom.name}: family {fam!r} is not interpretable")

    def enabled(self, s) -> np.ndarray:
        """Thread ids that are active and whose ``pred`` is non-zero, and the active ones."""
        if type(s.pred) is int:
            act = self.active()
            return (act if s.pred else act[:0]), act
        p = self.per_thread(s.pred) != 0
        act = self.active()
        return act[p[act]], act

    def x_copy(self, s):
        atom = s.atom
        src, dst = s.arg("src"), s.arg("dst")
        sdt, ddt = src.buffer.dtype, dst.buffer.dtype
        if sdt.bits != ddt.bits:
            raise InternalError(f"{describe(s)}: source dtype {sdt} and destination dtype {ddt} differ in width")
        n = atom.values_for(sdt)
        if n == 0:
            raise InternalError(f"{describe(s)}: atom {atom.name} ({atom.width} bytes) cannot move {sdt} elements")
        on, act = self.enabled(s)
        load = isinstance(dst, ir.RegRef) and isinstance(src, ir.MemRef)
        lane = np.arange(n, dtype=np.int64)[None, :]
        if on.size:
            if isinstance(src, ir.RegRef):
                R, idx = self.reg_index(src, n, on)
                vals = R[idx]
            else:
                base = self.per_thread(src.offset)[on]
                self.check_bounds(src, base[:, None] + lane, on, "read")
                self.check_align(atom, src, base, on)
                vals = self.mem_read(src, base[:, None] + lane, np.broadcast_to(on[:, None], (on.size, n)), on)
            if sdt != ddt:
                vals = vals.view(ddt.np) if sdt.np.itemsize == ddt.np.itemsize else vals.astype(ddt.np)
            if isinstance(dst, ir.RegRef):
                R, idx = self.reg_index(dst, n, on)
                R[idx] = vals
            else:
                base = self.per_thread(dst.offset)[on]
                self.check_bounds(dst, base[:, None] + lane, on, "write")
                self.check_align(atom, dst, base, on)
                self.mem_write(dst, base[:, None] + lane, np.broadcast_to(on[:, None], (on.size, n)), on, vals)
        if load and on.size != act.size:
            off = act[~np.isin(act, on)]
            R, idx = self.reg_index(dst, n, off)
            R[idx] = 0

    def x_cp_async(self, s):
        atom = s.atom
        src, dst = s.arg("src"), s.arg("dst")
        if not isinstance(dst, ir.MemRef) or not isinstance(dst.buffer, ir.SharedBuffer):
            raise InternalError(f"{describe(s)}: cp.async must write shared memory")
        sdt, ddt = src.buffer.dtype, dst.buffer.dtype
        if sdt.bits != ddt.bits:
            raise InternalError(f"{describe(s)}: source dtype {sdt} and destination dtype {ddt} differ in width")
        n = atom.values_for(ddt)
        if n == 0:
            raise InternalError(f"{describe(s)}: atom {atom.name} ({atom.width} bytes) cannot move {ddt} elements")
        act = self.active()
        if act.size == 0:
            return
        p = (self.per_thread(s.pred)[act] != 0) if type(s.pred) is not int else np.full(act.size, bool(s.pred))
        lane = np.arange(n, dtype=np.int64)[None, :]
        sh = self.mem_target(dst)
        dbase = self.per_thread(dst.offset)[act]
        daddr = dbase[:, None] + lane
        self.check_bounds(dst, daddr, act, "write (cp.async destination)")
        self.check_align(atom, dst, dbase, act)
        vals = np.zeros((act.size, n), dtype=ddt.np)
        on = act[p]
        if on.size:
            sbase = self.per_thread(src.offset)[on]
            saddr = sbase[:, None] + lane
            self.check_bounds(src, saddr, on, "read (cp.async source)")
            self.check_align(atom, src, sbase, on)
            data = self.mem_read(src, saddr, np.broadcast_to(on[:, None], saddr.shape), on)
            if sdt != ddt:
                data = data.view(ddt.np) if sdt.np.itemsize == ddt.np.itemsize else data.astype(ddt.np)
            vals[p] = data
        thr2d = np.broadcast_to(act[:, None], daddr.shape)
        daddr = self.in_block(sh, daddr, thr2d)
        self.sh_write_check(sh, daddr, thr2d)
        sid = self.sid(s)
        sh.inflight[daddr.ravel()] = thr2d.ravel()
        sh.inflight_stmt[daddr.ravel()] = sid
        group = np.broadcast_to(self.open_group[act][:, None], daddr.shape)
        self.pending.append(_Async(sh, daddr.ravel(), thr2d.ravel().copy(), group.ravel().copy(),
                                   vals.ravel(), sid))

    def x_commit(self, s):
        self.stmt = s
        self.open_group[self.active()] += 1

    def x_wait(self, s):
        self.stmt = s
        self.wait_groups(int(s.pending))

    def wait_groups(self, pending: int):
        if not self.pending:
            return
        keep = []
        limit = self.open_group - pending           # groups below this are complete
        for rec in self.pending:
            done = self.mask[rec.thr] & (rec.group < limit[rec.thr])
            if done.any():
                a, t = rec.addr[done], rec.thr[done]
                rec.sh.inflight[a] = -1
                rec.sh.inflight_stmt[a] = -1
                self.sh_write(rec.sh, a, t, rec.values[done], sid=rec.sid)
                if not done.all():
                    rest = ~done
                    keep.append(_Async(rec.sh, rec.addr[rest], rec.thr[rest], rec.group[rest],
                                       rec.values[rest], rec.sid))
            else:
                keep.append(rec)
        self.pending = keep

    def x_sync_atom(self, s):
        name = s.atom.name
        if "commit" in name:
            self.x_commit(s)
        elif "wait" in name:
            self.stmt = s
            n = _wait_count(s.atom)
            if "wait_all" in s.atom.ptx:
                self.open_group[self.active()] += 1
            self.wait_groups(n)
        else:
            self.x_barrier(s)

    def group_rows(self, s, tab: _AtomTables) -> np.ndarray:
        """Thread groups that issue the atom now (all threads of each active); ``[G, n]``."""
        groups = _thread_groups(s.atom.group, self.T)
        if self.C > 1 and s.atom.group == atoms.BLOCK:
            groups = self.tid.reshape(self.C, self.Tc)
        on, _ = self.enabled(s)
        if on.size == self.T:
            return groups
        if on.size == 0:
            return groups[:0]
        flag = np.zeros(self.T, dtype=bool)
        flag[on] = True
        g = flag[groups]
        full = g.all(axis=1)
        part = g.any(axis=1) & ~full
        if part.any():
            k = np.flatnonzero(part)[0]
            missing = groups[k][~g[k]]
            self.hazard(f"collective atom {s.atom.name} ({s.atom.group}) issued by part of its thread group "
                        f"(divergent code or a non-uniform pred): threads {_listing(groups[k][g[k]])} "
                        f"issue it, threads {_listing(missing)} do not")
        return groups[full]

    def x_ldmatrix(self, s):
        atom = s.atom
        tab = _atom_tables(atom)
        groups = self.group_rows(s, tab)
        if groups.shape[0] == 0:
            return
        src, dst = s.arg(tab.src), s.arg(tab.dst)
        if not isinstance(src.buffer, ir.SharedBuffer):
            raise InternalError(f"{describe(s)}: ldmatrix reads shared memory")
        lanes = tab.addr.shape[0]
        G = groups.shape[0]
        rows, cols = tab.mem_tile
        who = groups[:, :lanes]                                    # [G, lanes]
        base = self.per_thread(src.offset)[who]                    # [G, lanes]
        addr = base[..., None] + np.arange(tab.per)[None, None, :]  # [G, lanes, per]
        flat_who = who.ravel()
        self.check_bounds(src, addr.reshape(G * lanes, tab.per), flat_who, "read")
        self.check_align(atom, src, base.ravel(), flat_who)
        data = self.mem_read(src, addr, np.broadcast_to(who[..., None], addr.shape), flat_who)
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
        self.write_group_regs(s, dst, groups, vals)

    def read_group_regs(self, ref, groups, nvals):
        thr = groups.ravel()
        R, idx = self.reg_index(ref, nvals, thr)
        return R[idx].reshape(groups.shape[0], groups.shape[1], nvals)

    def write_group_regs(self, s, ref, groups, vals):
        thr = groups.ravel()
        G, n, V = vals.shape
        R, idx = self.reg_index(ref, V, thr)
        dt = ref.buffer.dtype
        R[idx] = _to_dtype(vals.reshape(G * n, V), dt) if vals.dtype != dt.np else vals.reshape(G * n, V)

    def x_mma(self, s):
        atom = s.atom
        tab = _atom_tables(atom)
        groups = self.group_rows(s, tab)
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
            vals = self.read_group_regs(ref, groups, idx.shape[1])   # [G, n, V]
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
        self.write_group_regs(s, s.arg(tab.output), groups, np.stack(outs))

    def x_shuffle(self, s):
        atom = s.atom
        tab = _atom_tables(atom)
        groups = self.group_rows(s, tab)
        if groups.shape[0] == 0:
            return
        dst = s.arg(_reg_operand(atom, "out").name)
        ins = [o.name for o in atom.operands if o.role == "in"]
        src = s.arg("src" if "src" in ins else ins[0])
        lane_ref = s.arg(next(n for n in ins if n != ("src" if "src" in ins else ins[0])))
        vals = self.read_group_regs(src, groups, 1)[..., 0]           # [G, 32]
        if isinstance(lane_ref, ir.RegRef):
            lanes = self.read_group_regs(lane_ref, groups, 1)[..., 0].astype(np.int64)
        else:
            lanes = self.per_thread(lane_ref)[groups]
        out = np.stack([np.asarray(atom.semantics(vals[g], lanes[g])) for g in range(groups.shape[0])])
        self.write_group_regs(s, dst, groups, out[..., None])

    # ----------------------------------------------------------------- sm_90a: state

    def reset_sm90(self):
        T = self.T
        self.wg_open = np.zeros(T, dtype=np.int64)        # open wgmma group of each thread
        self.wg_fenced = np.zeros(T, dtype=bool)          # has executed a wgmma.fence
        self.wg_pending: list[_Wgmma] = []
        self.bulk_open = np.zeros(T, dtype=np.int64)      # open bulk async-group (TMA stores)
        self.bulk_pending: list[_BulkStore] = []
        self.tma_loads: list[tuple[int, int, int]] = []   # (barrier id, phase, statement id)
        self.bars: dict[int, _Bar] = {}
        self.bar_obs = np.zeros((T, max(self.nbars * self.C, 1)), dtype=np.int64)  # phases observed
        if self.track_wgmma:
            # per register: statement id + 1 of the last access by another instruction since the
            # thread's last wgmma.fence (0: none), and in-flight wgmma uses with their statement
            self.reg_touch = {n: np.zeros(r.shape, dtype=np.int64) for n, r in self.regs.items()}
            self.reg_busy = {n: np.zeros(r.shape, dtype=np.int64) for n, r in self.regs.items()}
            self.reg_busy_stmt = {n: np.full(r.shape, -1, dtype=np.int64) for n, r in self.regs.items()}

    def end_sm90(self):
        if self.wg_pending:
            rec = self.wg_pending[0]
            self.stmt = self.stmts[rec.sid]
            self.hazard(f"wgmma never waited for: the wgmma of threads {_listing(rec.thr)} is still in "
                        f"flight when the block ends (wgmma.commit_group and wgmma.wait_group are missing)")
        if self.bulk_pending:
            rec = self.bulk_pending[0]
            self.stmt = self.stmts[rec.sid]
            self.hazard(f"TMA store never waited for: thread {rec.thread}'s store from SH buffer "
                        f"{rec.sh.buf.name!r} is still reading shared memory when the block ends "
                        f"(cp.async.bulk.commit_group and cp.async.bulk.wait_group.read are missing)")
        for bar_id, phase, sid in self.tma_loads:
            bar = self.bars.get(bar_id)
            if bar is not None and bar.phase <= phase:
                self.stmt = self.stmts[sid]
                self.hazard(f"TMA load never completed: its mbarrier {self.bar_name(bar_id)} is still in "
                            f"phase {bar.phase} when the block ends ({bar.pending} of {bar.count} arrivals "
                            f"and {bar.tx} transaction bytes outstanding)")

    def check_remote(self):
        """Every arrival on another block's mbarrier must happen before that block's end: some
        thread of the block synchronised with it (waited on its phase, or a barrier.cluster
        followed it).  Otherwise the block may exit, and its shared memory be reused, first."""
        for t, c, q, b, sid in self.remote:
            if (self.vc[self.rank == q, t] >= c).any():
                continue
            self.stmt = self.stmts[sid]
            self.hazard(f"remote mbarrier arrival after the target block may have exited: thread {t} (block rank "
                        f"{int(self.rank[t])}) arrives on mbarrier {self.bar_name(b)}, and nothing in block rank "
                        f"{q} waits for it before that block ends (a barrier.cluster at the end keeps the "
                        f"cluster's blocks alive until all remote arrivals are done)")

    def watch_regs(self, name: str, sel, thr):
        """A non-wgmma access of registers ``sel`` of buffer ``name``: a hazard while a wgmma uses
        them; remembered so that a wgmma without a wgmma.fence in between is caught."""
        busy = self.reg_busy[name][sel]
        if busy.any():
            b = np.broadcast_to(self.reg_busy_stmt[name][sel], busy.shape)[busy > 0]
            rows = np.broadcast_to(np.asarray(thr)[:, None], busy.shape)[busy > 0] if np.ndim(thr) else thr
            self.hazard(f"read or write of wgmma registers before wgmma.wait_group: threads "
                        f"{_listing(np.unique(rows))} access register buffer {name!r}, which the in-flight "
                        f"{self.stmt_str(b[0])} uses as its accumulator or A fragment; retire it with "
                        f"wgmma.commit_group and wgmma.wait_group first")
        self.reg_touch[name][sel] = self.sid(self.stmt) + 1

    def scalar(self, s, name: str) -> np.ndarray:
        """Per-thread values of the ``Scalar`` bound to operand ``name``, ``[T]``."""
        ref = s.arg(name)
        if not isinstance(ref, ir.Scalar):
            raise InternalError(f"{describe(s)}: operand {name} takes an ir.Scalar, not {ref!r}")
        return self.per_thread(ref.value)

    def shared_of(self, s, buf) -> _Shared:
        sh = self.shared.get(getattr(buf, "name", None))
        if not isinstance(buf, ir.SharedBuffer) or sh is None or (sh.buf is not buf and sh.buf != buf):
            self.hazard(f"shared buffer {getattr(buf, 'name', buf)!r} is not declared by the kernel")
        return sh

    def tmap_of(self, s) -> ir.TensorMapParam:
        tm = s.arg("tmap")
        if not isinstance(tm, ir.TensorMapParam) or self.tmaps.get(tm.name) != tm:
            self.hazard(f"{describe(s)}: operand tmap must be a TensorMapParam of the kernel, not {tm!r}")
        return tm

    # ----------------------------------------------------------------- sm_90a: shared-memory rules

    def sm90_read_check(self, sh: _Shared, a: np.ndarray, t: np.ndarray):
        tag = sh.tma_bar[a]
        if (tag >= 0).any():
            i = np.flatnonzero(tag >= 0)
            ok = self.bar_obs[t[i], tag[i]] > sh.tma_phase[a[i]]
            if not ok.all():
                j = i[np.flatnonzero(~ok)[0]]
                self.hazard(self.early_tma_message("read", sh, a, t, j, i[~ok]))

    def early_tma_message(self, what, sh, a, t, j, bad) -> str:
        bar_id, phase = int(sh.tma_bar[a[j]]), int(sh.tma_phase[a[j]])
        bar = self.bars.get(bar_id)
        state = (f"the barrier has completed {bar.phase} phase(s)" if bar is not None else "the barrier")
        seen = int(self.bar_obs[t[j], bar_id])
        return (f"{what} before mbarrier phase completes: thread {int(t[j])} {what}s SH buffer "
                f"{sh.buf.name!r} offset {int(a[j])}, which a TMA load fills in phase {phase} (parity "
                f"{phase % 2}) of mbarrier {self.bar_name(bar_id)}; {state}, but this thread has only "
                f"observed {seen} (a try_wait.parity on parity {phase % 2} must succeed first; a wait on "
                f"the other parity returns at once on the stale phase); threads "
                f"{_listing(np.unique(t[bad]))} are affected")

    def sm90_write_check(self, sh: _Shared, a: np.ndarray, t: np.ndarray):
        rd = sh.async_rd[a]
        if (rd > 0).any():
            i = np.flatnonzero(rd > 0)[0]
            self.hazard(f"overwrite of shared memory read by an in-flight async operation: thread {int(t[i])} "
                        f"writes SH buffer {sh.buf.name!r} offset {int(a[i])}, which "
                        f"{self.stmt_str(sh.async_rd_stmt[a[i]])} still reads (wgmma: wgmma.wait_group; "
                        f"TMA store: cp.async.bulk.wait_group.read)")
        tag = sh.tma_bar[a]
        if (tag >= 0).any():
            i = np.flatnonzero(tag >= 0)
            ok = self.bar_obs[t[i], tag[i]] > sh.tma_phase[a[i]]
            if not ok.all():
                j = i[np.flatnonzero(~ok)[0]]
                self.hazard(self.early_tma_message("write", sh, a, t, j, i[~ok]))

    def proxy_check(self, sh: _Shared, a: np.ndarray, who: str):
        w = sh.proxy_w[a]
        if (w >= 0).any():
            i = np.flatnonzero(w >= 0)
            j = i[0]
            self.hazard(f"missing fence.proxy.async: {who} reads SH buffer {sh.buf.name!r} offset {int(a[j])}, "
                        f"written through the generic proxy by thread {int(w[j])} (at "
                        f"{self.stmt_str(sh.w_stmt[a[j]])}) with no fence.proxy.async of that thread since; "
                        f"{i.size} element(s), written by threads {_listing(np.unique(w[i]))}")

    def async_write_check(self, sh: _Shared, a: np.ndarray, t: int):
        """Checks for an async-proxy write (a TMA load landing) of ``a`` by thread ``t``'s issue."""
        thr = np.full(a.size, t, dtype=np.int64)
        self.sm90_write_check(sh, a, thr)
        u = np.unique(a)
        other, war = self.unordered_reader(sh, u, np.full(u.size, t, dtype=np.int64))
        if war.any():
            i = np.flatnonzero(war)
            j = i[0]
            self.hazard(f"race (write after read): the TMA load issued by thread {t} overwrites SH buffer "
                        f"{sh.buf.name!r} offset {int(u[j])}, read by thread {int(other[j])} since the last "
                        f"barrier (at {self.stmt_str(sh.r_stmt[u[j]])}); {i.size} element(s) race — a barrier "
                        f"(or an 'empty' mbarrier) must separate the readers from the refill")
        inf = sh.inflight[a]
        if (inf >= 0).any():
            i = np.flatnonzero(inf >= 0)[0]
            self.hazard(f"TMA load into in-flight async data: SH buffer {sh.buf.name!r} offset {int(a[i])} is "
                        f"the destination of a cp.async by thread {int(inf[i])} that no AsyncWait completed")

    # ----------------------------------------------------------------- sm_90a: fences, setmaxnreg

    def x_fence(self, s):
        act = self.active()
        if act.size == 0 or s.atom.name != "fence_proxy_async":
            return                                        # fence.mbarrier_init: nothing to model
        for sh in self.shared.values():
            if act.size == self.T:
                sh.proxy_w[...] = -1
            else:
                sh.proxy_w[np.isin(sh.proxy_w, act)] = -1

    def x_setmaxnreg(self, s):
        n = catalog.immediates_of(s.atom).get("n")
        if n is None or not 24 <= n <= 256 or n % 8:
            raise InternalError(f"{describe(s)}: setmaxnreg needs an immediate $n in 24..256, a multiple "
                                f"of 8 (catalog.with_immediates); got {n!r}")
        self.group_rows(s, None)        # whole warpgroups or a hazard; otherwise a no-op

    # ----------------------------------------------------------------- sm_90a: stmatrix

    def x_stmatrix(self, s):
        atom = s.atom
        tab = _atom_tables(atom)
        groups = self.group_rows(s, tab)
        if groups.shape[0] == 0:
            return
        src, dst = s.arg(tab.src), s.arg(tab.dst)
        if not isinstance(dst, ir.MemRef) or not isinstance(dst.buffer, ir.SharedBuffer):
            raise InternalError(f"{describe(s)}: stmatrix writes shared memory")
        G = groups.shape[0]
        rows, cols = tab.mem_tile
        idx = tab.tv[tab.src]
        vals = self.read_group_regs(src, groups, idx.shape[1])            # [G, 32, V]
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
        base = self.per_thread(dst.offset)[who]
        addr = base[..., None] + np.arange(tab.per)[None, None, :]
        flat_who = who.ravel()
        self.check_bounds(dst, addr.reshape(G * lanes, tab.per), flat_who, "write")
        self.check_align(atom, dst, base.ravel(), flat_who)
        self.mem_write(dst, addr, np.broadcast_to(who[..., None], addr.shape), flat_who, data)

    # ----------------------------------------------------------------- sm_90a: mbarrier

    def bar_name(self, bar_id: int) -> str:
        rank, local = divmod(bar_id, max(self.nbars, 1))
        where = f" of block rank {rank}" if self.C > 1 else ""
        for name, base in self.bar_base.items():
            b = self.shared[name].buf
            if base <= local < base + b.size:
                return f"{name}[{local - base}]{where}"
        return f"#{bar_id}"

    def bar_ids(self, s, name: str, thr: np.ndarray) -> np.ndarray:
        ref = s.arg(name)
        if not isinstance(ref, ir.MemRef) or not isinstance(ref.buffer, ir.MBarrier):
            self.hazard(f"{describe(s)}: operand {name} must address an ir.MBarrier, not "
                        f"{getattr(ref, 'buffer', ref)!r}")
        self.shared_of(s, ref.buffer)
        off = self.per_thread(ref.offset)[thr]
        self.check_bounds(ref, off[:, None], thr, "mbarrier access")
        return self.bar_base[ref.buffer.name] + off + self.rank[thr] * self.nbars

    def remote_bar(self, ids: np.ndarray, cta: np.ndarray, thr: np.ndarray) -> np.ndarray:
        """The ids of the same mbarriers as ``ids`` (the callers' own) in the blocks of rank ``cta``."""
        bad = (cta < 0) | (cta >= self.C)
        if bad.any():
            i = np.flatnonzero(bad)[0]
            self.hazard(f"cluster rank {int(cta[i])} (thread {int(thr[i])}) is outside the cluster of "
                        f"{self.C} block(s)")
        return ids % max(self.nbars, 1) + cta * self.nbars

    def bar_get(self, bar_id: int, t: int) -> _Bar:
        bar = self.bars.get(bar_id)
        if bar is None:
            self.hazard(f"mbarrier {self.bar_name(bar_id)} used by thread {t} before mbarrier.init")
        if bar.init_epoch == self.epoch and bar.init_thread != t:
            self.hazard(f"mbarrier {self.bar_name(bar_id)} used by thread {t} in the barrier epoch of its "
                        f"mbarrier.init by thread {bar.init_thread}: the init is not visible yet (a Barrier, "
                        f"after fence.mbarrier_init, must come between them)")
        return bar

    def bar_arrive(self, bar: _Bar, bar_id: int, t: int):
        if bar.pending <= 0:
            self.hazard(f"mbarrier {self.bar_name(bar_id)}: thread {t} arrives on phase {bar.phase}, whose "
                        f"{bar.count} arrival(s) are all in already (its transactions are still pending)")
        bar.pending -= 1
        bar.complete()

    def x_mbarrier(self, s):
        on, _ = self.enabled(s)
        if on.size == 0:
            return
        name = s.atom.name
        ids = self.bar_ids(s, "bar", on)
        if name == "mbarrier_init":
            counts = self.scalar(s, "count")[on]
            if np.unique(ids).size != ids.size:
                self.hazard(f"mbarrier.init race: several threads initialise one mbarrier in one statement "
                            f"(threads {_listing(on)})")
            for t, b, c in zip(on.tolist(), ids.tolist(), counts.tolist()):
                if not 1 <= c < 1 << 20:
                    self.hazard(f"mbarrier.init of {self.bar_name(b)} with count {c}; it must be in 1..2**20-1")
                self.bars[b] = _Bar(c, t, self.epoch, self.T, self.bar_obs.shape[1])
                self.bar_obs[:, b] = 0
            return
        if name == "mbarrier_try_wait":
            parity = self.scalar(s, "parity")[on] & 1
            for b in np.unique(ids).tolist():
                for t in on[ids == b].tolist():
                    self.bar_get(b, t)
            while True:
                stuck = self.stuck_wait(on, ids, parity)
                if stuck is None:
                    break
                if self.roles is None:
                    self.hazard(stuck + "; in lockstep execution nothing after this wait can complete it")
                self.roles.block(lambda: self.stuck_wait(on, ids, parity) is None, stuck)
            for b in np.unique(ids).tolist():
                thr = on[ids == b]
                bar = self.bars[b]
                self.bar_obs[thr, b] = np.maximum(self.bar_obs[thr, b], bar.phase)
                self.vc[thr] = np.maximum(self.vc[thr], bar.last)    # acquire the phase's arrivals
                self.bar_obs[thr] = np.maximum(self.bar_obs[thr], bar.obs_last[:self.bar_obs.shape[1]])
            return
        if name == "mbarrier_arrive_expect_tx":
            nbytes = self.scalar(s, "bytes")[on]
        if name == "mbarrier_arrive_cluster":
            ids = self.remote_bar(ids, self.scalar(s, "cta")[on], on)
        for i, (t, b) in enumerate(zip(on.tolist(), ids.tolist())):
            bar = self.bar_get(b, t)
            if name == "mbarrier_arrive_expect_tx":
                if nbytes[i] < 0:
                    self.hazard(f"mbarrier.arrive.expect_tx of {self.bar_name(b)} with {int(nbytes[i])} bytes")
                bar.tx += int(nbytes[i])
            elif name not in ("mbarrier_arrive", "mbarrier_arrive_cluster"):
                raise InternalError(f"{describe(s)}: unknown mbarrier atom {name}")
            np.maximum(bar.acc, self.vc[t], out=bar.acc)              # release
            np.maximum(bar.obs_acc, self.bar_obs[t], out=bar.obs_acc)
            if self.C > 1 and b // self.nbars != self.rank[t]:
                # an arrival on another block's mbarrier: that block must not exit before it
                self.remote.append((t, int(self.vc[t, t]), b // self.nbars, b, self.sid(s)))
            self.vc[t, t] += 1
            self.bar_arrive(bar, b, t)

    def stuck_wait(self, on, ids, parity) -> str | None:
        """Why the try_wait.parity of threads ``on`` on barriers ``ids`` cannot return yet, or None."""
        for b in np.unique(ids).tolist():
            sel = ids == b
            bar = self.bars[b]
            c = bar.phase
            stuck = parity[sel] == c % 2
            if stuck.any():
                p = int(parity[sel][stuck][0])
                return (f"mbarrier wait on parity {p} that can never complete: mbarrier {self.bar_name(b)} "
                        f"has completed {c} phase(s), so parity {p} names phase {c}, which still misses "
                        f"{bar.pending} of {bar.count} arrival(s) and {bar.tx} transaction byte(s) (threads "
                        f"{_listing(on[sel][stuck])}; the phase that completed last has parity {(c - 1) % 2})")
        return None

    # ----------------------------------------------------------------- sm_90a: TMA

    def x_tma(self, s):
        name = s.atom.name
        if name in ("tma_load_2d", "tma_load_2d_multicast"):
            self.x_tma_copy(s, load=True)
        elif name == "tma_store_2d":
            self.x_tma_copy(s, load=False)
        elif name == "tma_commit":
            self.bulk_open[self.active()] += 1
        elif name in ("tma_wait_read", "tma_wait"):
            n = catalog.immediates_of(s.atom).get("n")
            if n is None:
                raise InternalError(f"{describe(s)}: substitute $n first (catalog.with_immediates(atom, n=...))")
            self.bulk_retire(n)
        else:
            raise InternalError(f"{describe(s)}: unknown TMA atom {name}")

    def bulk_retire(self, n: int):
        act = self.active()
        flag = np.zeros(self.T, dtype=bool)
        flag[act] = True
        limit = self.bulk_open - n
        keep = []
        for rec in self.bulk_pending:
            if flag[rec.thread] and rec.group < limit[rec.thread]:
                rec.sh.async_rd[rec.elems] -= 1
            else:
                keep.append(rec)
        self.bulk_pending = keep

    def x_tma_copy(self, s, load: bool):
        on, _ = self.enabled(s)
        if on.size == 0:
            return
        atom = s.atom
        tm = self.tmap_of(s)
        gbuf = tm.buffer
        eb = gbuf.dtype.bits // 8
        br, bc = (int(x) for x in tm.box)
        if tm.swizzle and bc * eb != tm.swizzle:
            raise InternalError(f"{describe(s)}: the interpreter models swizzled TMA boxes whose inner extent "
                                f"equals the swizzle span; {tm.name} has {bc * eb} bytes with {tm.swizzle}-byte "
                                f"swizzle")
        ref = s.arg("dst" if load else "src")
        if not isinstance(ref, ir.MemRef) or not isinstance(ref.buffer, ir.SharedBuffer):
            raise InternalError(f"{describe(s)}: a TMA {'load writes' if load else 'store reads'} shared memory")
        sh = self.shared_of(s, ref.buffer)
        if sh.buf.dtype.bits != gbuf.dtype.bits:
            raise InternalError(f"{describe(s)}: shared buffer {sh.buf.name} holds {sh.buf.dtype}, the tensor "
                                f"map {tm.name} moves {gbuf.dtype}")
        c0 = self.scalar(s, "c0")[on]
        c1 = self.scalar(s, "c1")[on]
        offs = self.per_thread(ref.offset)[on]
        self.check_align(atom, ref, offs, on)
        ids = self.bar_ids(s, "mbar", on) if load else None
        if s.atom.name == "tma_load_2d_multicast":
            masks = self.scalar(s, "mask")[on]
            bad = (masks <= 0) | (masks >= 1 << self.C)
            if bad.any():
                i = np.flatnonzero(bad)[0]
                self.hazard(f"TMA multicast mask {int(masks[i]):#x} of thread {int(on[i])}: a cluster of "
                            f"{self.C} block(s) takes a non-empty mask below {1 << self.C:#x}")
            targets = [[q for q in range(self.C) if int(m) >> q & 1] for m in masks.tolist()]
        else:
            targets = [[int(self.rank[t])] for t in on.tolist()]
        gl = self.memory[gbuf.name]
        rows, cols = (int(x) for x in gbuf.shape)
        s0, s1 = (int(x) for x in gbuf.strides)
        gr = np.arange(br, dtype=np.int64)[:, None]
        gc = np.arange(bc, dtype=np.int64)[None, :]
        for i, t in enumerate(on.tolist()):
            r = int(c1[i]) + gr
            c = int(c0[i]) + gc
            inside = (r >= 0) & (r < rows) & (c >= 0) & (c < cols)
            inside = np.broadcast_to(inside, (br, bc))
            flat = (np.clip(r, 0, rows - 1) * s0 + np.clip(c, 0, cols - 1) * s1)
            flat = np.broadcast_to(flat, (br, bc))
            byte = sh.base + int(offs[i]) * eb
            elems = (tma.box_byte_offsets(br, bc, eb, tm.swizzle, byte) - sh.base) // eb
            e = elems.ravel()
            self.check_bounds(ref, e[None, :], np.array([t]), "TMA box " + ("write" if load else "read"))
            if load:
                vals = np.zeros((br, bc), dtype=gbuf.dtype.np)
                vals[inside] = gl[flat[inside]]
                if vals.dtype != sh.data.dtype:
                    vals = vals.view(sh.data.dtype)
                for q in targets[i]:
                    # the box lands at the same offset of each target block, and completes a
                    # transaction on that block's mbarrier at the same offset
                    eq = e + q * sh.n
                    bar_id = int(ids[i]) % max(self.nbars, 1) + q * self.nbars
                    bar = self.bar_get(bar_id, t)
                    self.async_write_check(sh, eq, t)
                    sh.data[eq] = vals.ravel()
                    sh.writer[eq] = t
                    sh.w_epoch[eq] = -1     # async proxy: ordered by the mbarrier, not by Barrier epochs
                    sh.w_stmt[eq] = self.sid(s)
                    sh.proxy_w[eq] = -1
                    sh.tma_bar[eq] = bar_id
                    sh.tma_phase[eq] = bar.phase
                    self.tma_loads.append((bar_id, bar.phase, self.sid(s)))
                    bar.tx -= br * bc * eb
                    bar.complete()
            else:
                e = e + int(self.rank[t]) * sh.n
                self.sh_read(sh, e, np.full(e.size, t, dtype=np.int64))
                self.proxy_check(sh, e, f"the TMA store of thread {t}")
                vals = sh.data[e].reshape(br, bc)
                if vals.dtype != gl.dtype:
                    vals = vals.view(gl.dtype)
                gl[flat[inside]] = vals[inside]
                sh.async_rd[e] += 1
                sh.async_rd_stmt[e] = self.sid(s)
                self.bulk_pending.append(_BulkStore(t, int(self.bulk_open[t]), sh, e, self.sid(s)))

    # ----------------------------------------------------------------- sm_90a: wgmma

    def x_wgmma_sync(self, s):
        name = s.atom.name
        groups = self.group_rows(s, None)
        if groups.shape[0] == 0:
            return
        thr = groups.ravel()
        if name == "wgmma_fence":
            self.wg_fenced[thr] = True
            for touch in self.reg_touch.values() if self.track_wgmma else ():
                touch[thr] = 0
        elif name == "wgmma_commit":
            self.wg_open[thr] += 1
        elif name == "wgmma_wait":
            n = catalog.immediates_of(s.atom).get("n")
            if n is None:
                raise InternalError(f"{describe(s)}: substitute $n first (catalog.with_immediates(atom, n=...))")
            self.wgmma_retire(thr, n)
        else:
            raise InternalError(f"{describe(s)}: unknown wgmma synchronisation atom {name}")

    def wgmma_retire(self, thr: np.ndarray, n: int):
        flag = np.zeros(self.T, dtype=bool)
        flag[thr] = True
        limit = self.wg_open - n
        keep = []
        for rec in self.wg_pending:
            done = flag[rec.thr] & (rec.group < limit[rec.thr]) & ~rec.retired
            if done.any():
                t = rec.thr[done]
                for name, off, cnt in rec.regs:
                    self.reg_busy[name][t, off:off + cnt] -= 1
                rec.retired |= done
            if rec.retired.all():
                for sh, e in rec.smem:
                    sh.async_rd[e] -= 1
            else:
                keep.append(rec)
        self.wg_pending = keep

    def wgmma_regs(self, s, name: str, count: int) -> tuple[str, int]:
        ref = s.arg(name)
        if not isinstance(ref, ir.RegRef):
            raise InternalError(f"{describe(s)}: wgmma operand {name} takes a RegRef, not {ref!r}")
        buf = ref.buffer
        if self.regs.get(buf.name) is None or (self.reg_bufs[buf.name] is not buf and self.reg_bufs[buf.name] != buf):
            self.hazard(f"register buffer {buf.name!r} is not declared by the kernel")
        off = self.ev(ref.offset)
        if np.ndim(off) != 0:
            raise InternalError(f"{describe(s)}: wgmma register offsets must be the same for every thread")
        off = int(off)
        if off < 0 or off + count > buf.size:
            self.hazard(f"register buffer {buf.name!r} (size {buf.size}) accessed at offsets {off}..{off + count - 1} "
                        f"by a wgmma: out of range")
        return buf.name, off

    def wgmma_fenced(self, name: str, off: int, cnt: int, thr: np.ndarray, what: str):
        touch = self.reg_touch[name][thr, off:off + cnt]
        if touch.any():
            rows = np.flatnonzero(touch.any(axis=1))
            sid = int(touch[rows[0]][touch[rows[0]] > 0][0]) - 1
            self.hazard(f"missing wgmma.fence: the wgmma reads its {what} registers {name}[{off}..{off + cnt - 1}], "
                        f"which {self.stmt_str(sid)} accessed after the last wgmma.fence of threads "
                        f"{_listing(thr[rows])}")

    def wgmma_operand(self, s, ref, rows: int, major: str, who: int, thr: np.ndarray, dtype) -> tuple:
        """The [rows, 16] tile a descriptor operand names, and its elements (for in-flight marks)."""
        if not isinstance(ref, ir.DescRef):
            raise InternalError(f"{describe(s)}: a wgmma descriptor operand takes an ir.DescRef, not {ref!r}")
        sh = self.shared_of(s, ref.buffer)
        eb = sh.buf.dtype.bits // 8
        if sh.buf.dtype.bits != dtype.bits:
            raise InternalError(f"{describe(s)}: shared buffer {sh.buf.name} holds {sh.buf.dtype}; the wgmma "
                                f"reads {dtype}")
        off = self.per_thread(ref.offset)[thr]
        if (off != off[0]).any():
            self.hazard(f"wgmma descriptor offset differs between the threads of a warpgroup "
                        f"({_listing(np.unique(off))}); it must be warpgroup-uniform")
        start = sh.base + int(off[0]) * eb
        if start % 16:
            self.hazard(f"wgmma descriptor of SH buffer {sh.buf.name!r} starts at shared byte {start}, which is "
                        f"not 16-byte aligned (the descriptor drops the low 4 bits)")
        if ref.swizzle and (start // ref.swizzle) % 8:
            self.hazard(f"wgmma descriptor of SH buffer {sh.buf.name!r} starts at shared byte {start}, inside "
                        f"row {(start // ref.swizzle) % 8} of a {ref.swizzle}-byte swizzle atom: the first row "
                        f"must sit on a multiple of {8 * ref.swizzle} bytes (firesched encodes base offset 0)")
        byte = descriptors.operand_byte_offsets(start, ref.lbo, ref.sbo, ref.swizzle, rows, major=major, elem_bytes=eb)
        rel = byte - sh.base
        bad = (rel < 0) | (rel >= sh.buf.size * eb)
        if bad.any():
            r, k = (int(x[0]) for x in np.nonzero(bad))
            self.hazard(f"wgmma operand outside its buffer: element ({r}, {k}) of the descriptor of SH buffer "
                        f"{sh.buf.name!r} (size {sh.buf.size}) is at element offset {int(rel[r, k]) // eb}")
        e = (rel // eb).ravel()
        if self.C > 1:
            e = e + int(self.rank[who]) * sh.n
        self.sh_read(sh, e, np.full(e.size, who, dtype=np.int64))
        self.proxy_check(sh, e, f"the wgmma of threads {int(thr[0])}..{int(thr[-1])}")
        data = sh.data[e]
        if data.dtype != dtype.np:
            data = data.view(dtype.np)
        return data.reshape(rows, -1), (sh, e)

    def x_wgmma(self, s):
        atom = s.atom
        tab = _atom_tables(atom)
        groups = self.group_rows(s, tab)
        if groups.shape[0] == 0:
            return
        m, n, k = (int(x) for x in atom.shape)
        ab = atom.dtype_of("a")
        dref = s.arg("d")
        if dref.buffer.dtype.bits != 32:
            raise InternalError(f"{describe(s)}: the accumulators are f32 registers, not {dref.buffer.dtype}")
        nd = n // 2
        dname, doff = self.wgmma_regs(s, "d", nd)
        rs = any(o.name == "a" for o in atom.operands)
        if rs:
            aref = s.arg("a")
            if aref.buffer.dtype.bits != 16:
                raise InternalError(f"{describe(s)}: the A fragment is 16-bit registers, not {aref.buffer.dtype}")
            aname, aoff = self.wgmma_regs(s, "a", 8)
        scale = self.scalar(s, "scale_d")
        D = self.regs[dname]
        sid = self.sid(s)
        for thr in groups:
            sc = scale[thr]
            if (sc != sc[0]).any():
                self.hazard(f"wgmma scale_d differs within the warpgroup of threads {int(thr[0])}..{int(thr[-1])}")
            if not self.wg_fenced[thr].all():
                self.hazard(f"missing wgmma.fence: the first wgmma of the warpgroup of threads "
                            f"{int(thr[0])}..{int(thr[-1])} must follow a wgmma.fence")
            self.wgmma_fenced(dname, doff, nd, thr, "accumulator")
            smem = []
            if rs:
                self.wgmma_fenced(aname, aoff, 8, thr, "A fragment")
                vals = self.regs[aname][thr, aoff:aoff + 8]
                if vals.dtype != ab.np:
                    vals = vals.view(ab.np)
                a_tile = np.zeros(m * k, dtype=vals.dtype)
                a_tile[tab.tv["a"].ravel()] = vals.ravel()
                a_tile = a_tile.reshape(k, m).T
            else:
                a_tile, rd = self.wgmma_operand(s, s.arg("desc_a"), m, "K", int(thr[0]), thr, ab)
                smem.append(rd)
            bt, rd = self.wgmma_operand(s, s.arg("desc_b"), n, sm90a.b_major(atom), int(thr[0]), thr, ab)
            smem.append(rd)
            idx = tab.tv["d"]
            if sc[0] != 0:
                c_tile = np.zeros(m * n, dtype=np.float32)
                c_tile[idx.ravel()] = D[thr, doff:doff + nd].astype(np.float32).ravel()
                c_tile = c_tile.reshape(n, m).T
            else:
                c_tile = np.zeros((m, n), dtype=np.float32)
            d = np.asarray(atom.semantics(a_tile, bt.T, c_tile), dtype=np.float32)
            D[thr, doff:doff + nd] = np.ravel(d, order="F")[idx].astype(D.dtype)
            regs = [(dname, doff, nd)] + ([(aname, aoff, 8)] if rs else [])
            for name, off, cnt in regs:
                self.reg_busy[name][thr, off:off + cnt] += 1
                self.reg_busy_stmt[name][thr, off:off + cnt] = sid
            for sh, e in smem:
                sh.async_rd[e] += 1
                sh.async_rd_stmt[e] = sid
                # also a read by the warpgroup in this barrier epoch, so that a later write by a
                # thread of another warpgroup (a TMA refill of the stage) needs a barrier between
                self.sh_read(sh, e, np.full(e.size, int(thr[0]), dtype=np.int64))
            self.wg_pending.append(_Wgmma(thr.copy(), self.wg_open[thr].copy(), regs, smem, sid))

    sm90_dispatch = {
        sm90a.WGMMA: x_wgmma,
        sm90a.WGMMA_SYNC: x_wgmma_sync,
        sm90a.TMA: x_tma,
        sm90a.MBARRIER: x_mbarrier,
        sm90a.FENCE: x_fence,
        sm90a.SETMAXNREG: x_setmaxnreg,
        sm90a.STMATRIX: x_stmatrix,
        sm90a.CLUSTER: x_cluster,
    }


class _Abort(BaseException):
    """Unwinds the role threads of a run that stopped (a hazard in another role)."""


class _RoleScheduler:
    """Runs the roles of a ``Roles`` statement as coroutines, one at a time.

    Each role is a lockstep group of its own (its threads' mask, loop variables and current
    statement) executing on a Python thread; a baton lets exactly one run.  A role whose
    ``mbarrier.try_wait`` cannot return yet hands the baton to the next role that can run (one
    not started, or whose wait has become satisfiable), round robin; when none can, the roles
    deadlock and the wait is reported.  The scheduling is deterministic.
    """

    def __init__(self, run: "_KernelRun", roles, blocks: int = 1, threads: int = 0):
        self.run_ = run
        self.cv = threading.Condition()
        self.roles = []
        for b in range(blocks):         # a cluster: each block's roles run on their own
            for r in roles:
                mask = np.zeros(run.T, dtype=bool)
                lo = b * threads + int(r.first)
                mask[lo:lo + int(r.count)] = True
                env = dict(run.env)
                env[ir.ROLE_TID_NAME] = run.ltid - int(r.first)
                name = r.name if blocks == 1 else f"{r.name} (block rank {b})"
                self.roles.append(dict(role=r, name=name, ctx=(mask, False, env, list(run.loops), None),
                                       ready=None, why="", done=False, started=False))
        self.turn = None
        self.error: BaseException | None = None
        self.finished = False

    def run(self):
        k = self.run_
        saved = (k.mask, k.full, k.env, k.loops, k.stmt)
        k.roles = self
        threads = [threading.Thread(target=self._body, args=(r,), daemon=True) for r in self.roles]
        for t in threads:
            t.start()
        try:
            with self.cv:
                self.turn = self.roles[0]
                self.cv.notify_all()
                while not self.finished:
                    self.cv.wait()
            for t in threads:
                t.join()
        finally:
            k.roles = None
            k.mask, k.full, k.env, k.loops, k.stmt = saved
        if self.error is not None:
            raise self.error

    def _body(self, r):
        with self.cv:
            while self.turn is not r and not self.finished:
                self.cv.wait()
            if self.finished:
                return
        k = self.run_
        k.mask, k.full, k.env, k.loops, k.stmt = r["ctx"]
        r["started"] = True
        try:
            k.exec(r["role"].body)
        except _Abort:
            return
        except BaseException as e:          # a hazard (or a bug): stop every role, report it
            self._stop(e)
            return
        r["done"] = True
        nxt = self._next(r)
        if nxt is None:
            waiting = [x for x in self.roles if not x["done"]]
            self._stop(self._deadlock(waiting) if waiting else None)
            return
        self._hand(nxt)

    def _ready(self, r) -> bool:
        return not r["done"] and (not r["started"] or r["ready"] is None or r["ready"]())

    def _next(self, cur):
        i = self.roles.index(cur)
        order = self.roles[i + 1:] + self.roles[:i + 1]
        return next((r for r in order if self._ready(r)), None)

    def _hand(self, nxt):
        with self.cv:
            self.turn = nxt
            self.cv.notify_all()

    def _stop(self, error):
        with self.cv:
            if self.error is None:
                self.error = error
            self.finished = True
            self.cv.notify_all()

    def _deadlock(self, waiting) -> HazardError:
        """The hazard naming what each role in ``waiting`` waits for."""
        lines = [f"  role {r['name']!r} waits: {r['why'] or '(not started)'}" for r in waiting]
        try:
            self.run_.hazard("deadlock: every role of the warp-specialized block waits on an mbarrier phase "
                             "that nothing left can complete\n" + "\n".join(lines))
        except HazardError as e:
            return e

    def block(self, ready, why: str):
        """Called by the running role: wait until ``ready()`` holds, letting the others run."""
        k = self.run_
        cur = next(r for r in self.roles if r is self.turn)
        cur["ready"], cur["why"] = ready, why
        cur["ctx"] = (k.mask, k.full, k.env, k.loops, k.stmt)
        nxt = self._next(cur)
        if nxt is None:
            raise self._deadlock([r for r in self.roles if not r["done"]])
        if nxt is not cur:
            with self.cv:
                self.turn = nxt
                self.cv.notify_all()
                while self.turn is not cur and not self.finished:
                    self.cv.wait()
                if self.finished:
                    raise _Abort()
        k.mask, k.full, k.env, k.loops, k.stmt = cur["ctx"]
        cur["ready"], cur["why"] = None, ""


class _Bar:
    """The state of one mbarrier: arrivals per phase, arrivals and transaction bytes still
    missing in the current phase, and the number of completed phases."""

    __slots__ = ("count", "pending", "tx", "phase", "init_thread", "init_epoch", "acc", "last", "obs_acc",
                 "obs_last")

    def __init__(self, count: int, init_thread: int, init_epoch: int, threads: int, nbars: int):
        self.count = count
        self.pending = count
        self.tx = 0
        self.phase = 0
        self.init_thread = init_thread
        self.init_epoch = init_epoch
        # vector clocks: the join of the arrivals of the current phase, and of the last completed one
        self.acc = np.zeros(threads, dtype=np.int64)
        self.last = np.zeros(threads, dtype=np.int64)
        # likewise the mbarrier phases the arriving threads had observed (knowledge passes on)
        self.obs_acc = np.zeros(nbars, dtype=np.int64)
        self.obs_last = np.zeros(nbars, dtype=np.int64)

    def complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count
            self.last, self.acc = self.acc, np.zeros_like(self.acc)
            self.obs_last, self.obs_acc = self.obs_acc, np.zeros_like(self.obs_acc)


class _Wgmma:
    """One issued wgmma not yet retired by every thread of its warpgroup."""

    __slots__ = ("thr", "group", "regs", "smem", "sid", "retired")

    def __init__(self, thr, group, regs, smem, sid):
        self.thr, self.group, self.regs, self.smem, self.sid = thr, group, regs, smem, sid
        self.retired = np.zeros(thr.size, dtype=bool)


class _BulkStore:
    """One TMA store whose shared-memory source is still being read."""

    __slots__ = ("thread", "group", "sh", "elems", "sid")

    def __init__(self, thread, group, sh, elems, sid):
        self.thread, self.group, self.sh, self.elems, self.sid = thread, group, sh, elems, sid


def _families(body) -> set:
    """Families of the atoms a statement tree issues."""
    out: set = set()
    stack = [body]
    while stack:
        s = stack.pop()
        if s is None:
            continue
        if isinstance(s, (list, tuple)):
            stack.extend(s)
        elif isinstance(s, ir.Seq):
            stack.extend(s.body)
        elif isinstance(s, (ir.For,)):
            stack.append(s.body)
        elif isinstance(s, ir.If):
            stack.append(s.then)
        elif isinstance(s, ir.Roles):
            stack.extend(r.body for r in s.roles)
        elif isinstance(s, ir.AtomCall):
            out.add(s.atom.family)
    return out


def _wait_count(atom) -> int:
    """The ``pending`` count of a ``cp.async.wait_group N`` atom (its immediate substituted by
    ``catalog.with_immediates``); ``wait_all`` waits for everything."""
    m = re.search(r"wait_group\s+(\d+)", atom.ptx)
    if m:
        return int(m.group(1))
    if "wait_all" in atom.ptx:
        return 0
    raise InternalError(f"atom {atom.name}: cannot tell how many groups it leaves pending from its PTX "
                        f"{atom.ptx!r}; substitute the immediate with catalog.with_immediates(atom, n=...)")
