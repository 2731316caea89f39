"""Running kernels: the entry points, the block loop, and the execution of statements.

``run_program`` loads the user's arrays into flat global buffers and runs every kernel of the
program in order; ``run_kernel`` runs one launch.  Blocks run in order (grid x fastest, then y,
then z; a cluster's blocks together), and independent blocks run in batches: up to
``BATCH_THREADS`` threads of consecutive blocks execute each statement at once, as the ranks of
a group whose blocks never synchronise with each other (block-diagonal clocks, one copy of
shared memory each).  A statement then costs one numpy call for the whole batch instead of one
per block, which is what makes a 1024^3 GEMM interpret in seconds.  A hazard found in a batch is
reported from a re-run of the launch one block at a time, on the global memory it started from,
so its message names one block and is the same with or without batching.  Clusters, and kernels
issuing cluster atoms, run unbatched.  A ``KernelRun`` owns the parts of the model, each reset
per block (batch):

* ``ctx`` (``lockstep``): the threads, the active mask, the index variables, hazard reporting;
* ``order`` (``order``): barrier epochs, vector clocks, observed mbarrier phases;
* ``mem`` (``memory``) and ``regs`` (``registers``): the storage and its access checks;
* ``bars`` (``mbarriers``), ``cp``, ``tma``, ``wg`` (``asyncs``): mbarrier phases and the
  asynchronous operations in flight;

executes control flow and register arithmetic itself, hands atoms to their family's executor
(``families``) and ``Roles`` to the role scheduler (``roles``), and at the end of each block
reports whatever is still in flight.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import HazardError, InternalError
from ..hardware.atoms import sm90a
from ..hardware.atoms.base import FLAG
from ..ops import SCALAR_OPS
from .asyncs import CpAsyncGroups, TmaOps, WgmmaGroups
from .convert import to_dtype
from .families import EXECUTORS
from .families.barriers import barrier
from .families.copies import commit, wait
from .families.flags import Exchange
from .lockstep import Lockstep
from .mbarriers import MBarriers
from .memory import Memory, load_global, unload_global
from .order import Order
from .registers import Registers
from .roles import run_roles
from .stacked import run_nest

# --------------------------------------------------------------------------- entry points


def run_program(program: ir.Program, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run every kernel of ``program`` in order; return the final global arrays by name.

    ``arrays`` holds each input (and optionally the output) by buffer name, in the buffer's
    ``shape`` (or already flat, ``buffer.size`` elements); missing outputs and workspaces start
    as zeros.  The result maps every global buffer name to an array of its ``shape``.
    """
    buffers: dict[str, ir.GlobalBuffer] = {}
    for b in (*program.inputs, *program.outputs, *program.workspaces):
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

    memory = {name: load_global(b, arrays.get(name)) for name, b in buffers.items()}
    inputs = {b.name for b in program.inputs}
    # buffers a programmatic kernel may touch only after its griddep_wait: those (not inputs) of
    # the kernels run so far; for the first kernel, every buffer (the launch before the program,
    # which it overlaps, may have written any of them)
    touched: set = set()                # buffers (not inputs) of the kernels run so far
    for i, k in enumerate(program.kernels):
        pending = frozenset(buffers if i == 0 else touched) if getattr(k, "programmatic", False) else frozenset()
        run_kernel(k, memory, pending=pending)
        touched |= {(p.buffer if isinstance(p, ir.TensorMapParam) else p).name for p in k.params} - inputs
    return {name: unload_global(buffers[name], memory[name]) for name in buffers}


#: Threads of one batch of independent blocks (see the module docstring); 1 disables batching.
BATCH_THREADS = 2048

#: Atoms that address other blocks of a cluster: a kernel issuing one runs unbatched, so that
#: a cluster rank outside the (implicit, one-block) cluster stays an error.
_CLUSTER_ATOMS = frozenset({"tma_load_2d_multicast", "mbarrier_arrive_cluster", "barrier_cluster"})


def run_kernel(kernel: ir.Kernel, memory: dict[str, np.ndarray], batch_threads: int | None = None,
               pending: frozenset = frozenset()) -> None:
    """Run one kernel launch on flat global arrays (by buffer name), in place.

    ``batch_threads`` (default ``BATCH_THREADS``) bounds the threads of a batch of blocks run at
    once; 1 runs the blocks one at a time.  ``pending``: the global buffers a programmatic launch
    may touch only after ``griddep_wait`` (``families.griddep``)."""
    blocks = block_ids(kernel)
    limit = BATCH_THREADS if batch_threads is None else int(batch_threads)
    B = min(len(blocks), max(1, limit // max(int(kernel.threads), 1)))
    if B <= 1 or not batchable(kernel):
        KernelRun(kernel, memory, pending=pending).run_blocks(blocks)
        return
    names = [(p.buffer if isinstance(p, ir.TensorMapParam) else p).name for p in kernel.params]
    saved = {n: memory[n].copy() for n in names if n in memory}
    try:
        full = len(blocks) // B * B
        if full:
            KernelRun(kernel, memory, B, pending).run_blocks(blocks[:full])
        if full < len(blocks):
            KernelRun(kernel, memory, len(blocks) - full, pending).run_blocks(blocks[full:])
        return
    except HazardError:
        pass
    # report it as the one-block-at-a-time run does: from the start, on the same inputs (outside
    # the handler, so that the batch's own report is not chained to it)
    for n in names:
        if n in saved:
            memory[n][...] = saved[n]
        else:
            memory.pop(n, None)
    KernelRun(kernel, memory, pending=pending).run_blocks(blocks)


def block_ids(kernel: ir.Kernel) -> list[tuple[int, int, int]]:
    """The blocks of a launch in execution order (x fastest; the first block of each cluster)."""
    gx, gy, gz = (int(g) for g in kernel.grid)
    step = int(getattr(kernel, "cluster", 1) or 1)
    return [(bx, by, bz) for bz in range(gz) for by in range(gy) for bx in range(0, gx, step)]


def batchable(kernel: ir.Kernel) -> bool:
    """Whether the blocks of ``kernel`` may run in batches: no clusters, no cluster atoms."""
    if int(getattr(kernel, "cluster", 1) or 1) > 1:
        return False
    fams = families_of(kernel.body)
    # blocks that hand each other data through flags must run in order, one at a time
    return not (atoms_of(kernel.body) & _CLUSTER_ATOMS) and sm90a.DSMEM not in fams and FLAG not in fams


def families_of(body) -> set:
    """Families of the atoms a statement tree issues."""
    return {a.family for a in _atoms(body)}


def atoms_of(body) -> set:
    """Names of the atoms a statement tree issues."""
    return {a.name for a in _atoms(body)}


def _atoms(body) -> list:
    out: list = []
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
            out.append(s.atom)
    return out


# --------------------------------------------------------------------------- one launch

class KernelRun:
    """One launch of a kernel: the parts of the model, the block loop, statement execution."""

    def __init__(self, kernel: ir.Kernel, memory: dict[str, np.ndarray], batch: int = 1,
                 pending: frozenset = frozenset()):
        self.kernel = kernel
        self.ctx = ctx = Lockstep(kernel, batch)
        families = families_of(kernel.body)
        # the sm_90a bookkeeping (proxy fences, TMA tags, observed phases) costs time; only kernels
        # that use sm_90a atoms, tensor maps or mbarriers pay for it
        self.sm90 = bool(families & (set(sm90a.FAMILIES) - {sm90a.GRIDDEP})) or any(
            isinstance(p, ir.TensorMapParam) for p in kernel.params) or any(
            isinstance(b, ir.MBarrier) for b in kernel.shared)
        track_wgmma = sm90a.WGMMA in families
        nbars = sum(int(b.size) for b in kernel.shared if isinstance(b, ir.MBarrier))   # per block
        # the blocks of a batch never synchronise with each other: block-diagonal clocks
        self.order = Order(ctx.T, self.sm90, nbars * ctx.C, group=ctx.Tc if batch > 1 else 0)
        self.bars = MBarriers(kernel, ctx, self.order)
        self.mem = Memory(kernel, memory, ctx, self.order, self.bars, self.sm90)
        self.mem.pending = pending
        # flags and exchange workspaces live across the launch's blocks
        self.xchg = Exchange(kernel, self.order, ctx.T) if FLAG in families or any(
            isinstance(p, ir.GlobalBuffer) and p.exchange for p in kernel.params) else None
        self.mem.xchg = self.xchg
        self.regs = Registers(kernel, ctx, track_wgmma)
        self.memo: dict = {}                # executors' per-statement facts, by id (value: the statement)
        self.cp = CpAsyncGroups(ctx)
        self.named: dict = {}
        self.tma = TmaOps(ctx, self.bars)
        self.wg = WgmmaGroups(ctx, self.regs)
        self.dispatch = {
            ir.Seq: self.x_seq, tuple: self.x_list, list: self.x_list, ir.For: self.x_for,
            ir.If: self.x_if, ir.Roles: self.x_roles, ir.AtomCall: self.x_atom, ir.Barrier: self.x_barrier,
            ir.AsyncCommit: self.x_commit, ir.AsyncWait: self.x_wait, ir.RegFill: self.x_fill,
            ir.Pointwise: self.x_pointwise, ir.Comment: self.x_nothing, type(None): self.x_nothing,
        }
        if ctx.cluster > 1 and int(kernel.grid[0]) % ctx.cluster:
            raise InternalError(f"kernel {kernel.name!r}: grid x = {kernel.grid[0]} is not a multiple of its "
                                f"cluster size {ctx.cluster}")

    # ----------------------------------------------------------------- driving

    def run(self):
        """Run every block of the launch."""
        self.run_blocks(block_ids(self.kernel))

    def run_blocks(self, blocks):
        """Run ``blocks`` (first blocks of clusters), ``ctx.batch`` of them at a time."""
        B = self.ctx.batch
        if len(blocks) % B:
            raise InternalError(f"kernel {self.kernel.name!r}: {len(blocks)} blocks do not make batches of {B}")
        for i in range(0, len(blocks), B):
            self.run_block(blocks[i] if B == 1 else blocks[i:i + B])
        if self.xchg is not None:
            self.xchg.check_end(self.ctx)

    def run_block(self, bid):
        """Run block (cluster) ``bid``, or the batch of blocks ``bid`` (a list)."""
        if isinstance(bid, list):
            self.ctx.start_batch(bid)
        else:
            self.ctx.start_block(bid)
        self.order.reset()
        self.mem.reset()
        self.regs.reset()
        self.bars.reset()
        self.cp.reset()
        self.tma.reset()
        self.wg.reset()
        self.named = {}                     # (block rank, id) -> a named barrier collecting arrivals
        if self.xchg is not None:
            self.xchg.start_block(bid)
        self.exec(self.kernel.body)
        # what is still in flight when the block ends (the order of the checks decides which
        # hazard a block with several is reported with)
        if self.sm90:
            self.wg.check_end()
            self.tma.check_end()
        if self.bars.remote:
            self.bars.check_remote()
        self.cp.check_end()

    def exec(self, s):
        try:
            handler = self.dispatch[type(s)]
        except KeyError:
            raise InternalError(f"kernel {self.kernel.name!r}: not a statement: {s!r}") from None
        handler(s)

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
        if run_nest(self, s):               # a nest of MMAs, run a few iterations at a time
            return
        ctx = self.ctx
        name = s.var.name
        saved = ctx.env.get(name)
        ctx.loops.append((name, 0))
        slot = len(ctx.loops) - 1
        stop = None if s.stop is None else self.loop_stop(s)
        saved_mask = (ctx.mask, ctx.full)
        try:
            for i in range(int(s.extent)):
                if stop is not None:
                    if np.ndim(stop) == 0:
                        if i >= stop:
                            break
                    else:
                        # blocks of a batch stop at different iterations: the others run on
                        run = saved_mask[0] & (stop > i)
                        if not run.any():
                            break
                        ctx.mask, ctx.full = run, bool(run.all())
                ctx.env[name] = i
                ctx.loops[slot] = (name, i)
                self.exec(s.body)
        finally:
            ctx.mask, ctx.full = saved_mask
        ctx.loops.pop()
        if saved is None:
            ctx.env.pop(name, None)
        else:
            ctx.env[name] = saved

    def loop_stop(self, s):
        """The early stop of loop ``s`` (``For.stop``): a constant, or one value per thread that
        every active thread of a block shares (barriers sit inside the loop)."""
        ctx = self.ctx
        ctx.stmt = s
        stop = ctx.ev(s.stop)
        if np.ndim(stop) == 0:
            return int(stop)
        stop = np.broadcast_to(np.asarray(stop), (ctx.T,))
        for row, act in zip(stop.reshape(ctx.C, ctx.Tc), ctx.mask.reshape(ctx.C, ctx.Tc)):
            if act.any() and np.unique(row[act]).size > 1:
                ctx.hazard(f"the loop over {s.var.name} stops at different iterations for threads of one block "
                           f"({sorted(set(row[act].tolist()))[:4]}): its bound must be block-uniform")
        return stop

    def x_if(self, s):
        ctx = self.ctx
        c = ctx.ev(s.cond)
        if np.ndim(c) == 0:
            if c:
                self.exec(s.then)
            return
        new = ctx.mask & (np.broadcast_to(c, (ctx.T,)) != 0)
        if not new.any():
            return
        saved = (ctx.mask, ctx.full)
        ctx.mask, ctx.full = new, bool(new.all())
        try:
            self.exec(s.then)
        finally:
            ctx.mask, ctx.full = saved

    def x_roles(self, s):
        run_roles(self.ctx, s, self.exec)

    # ----------------------------------------------------------------- synchronisation statements

    def x_barrier(self, s):
        barrier(self, s)

    def x_commit(self, s):
        commit(self, s)

    def x_wait(self, s):
        wait(self, s)

    def x_atom(self, s: ir.AtomCall):
        self.ctx.stmt = s
        execute = EXECUTORS.get(s.atom.family)
        if execute is None:
            raise InternalError(f"atom {s.atom.name}: family {s.atom.family!r} is not interpretable")
        execute(self, s)

    # ----------------------------------------------------------------- register arithmetic

    def x_fill(self, s):
        ctx = self.ctx
        ctx.stmt = s
        thr = ctx.active()
        if thr.size == 0:
            return
        R, idx = self.regs.index(s.ref, int(s.count), thr)
        R[idx] = to_dtype(np.float64(s.value), s.ref.buffer.dtype)

    def x_pointwise(self, s):
        ctx, regs = self.ctx, self.regs
        ctx.stmt = s
        thr = ctx.active()
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
                R, idx = regs.index(src, 1, thr)
                x = R[idx][:, 0]
            else:
                x = np.full(thr.size, float(src))
            if np.asarray(x).dtype.kind == "f" or dt.kind != "float":
                x = np.asarray(x).astype(np.float64)
            out = to_dtype(x, dt)
        else:
            args = []
            for src in s.srcs:
                if isinstance(src, ir.RegRef):
                    args.append(regs.column(src, thr).astype(np.float64))
                else:
                    args.append(np.float64(src))
            out = np.asarray(op.np(*args), dtype=np.float64)
            if out.shape != thr.shape:
                out = np.broadcast_to(out, thr.shape)
            out = to_dtype(out, dt)
        regs.put_column(s.dst, thr, out)
