"""Schedule → kernel IR.

One visitor method per kind of node; it sits above ``schedule`` and ``strategies`` (it reads
their trees) and below ``recipes``.  It also *is* ``Schedule.check()``: everything a schedule
leaves implicit — the default copy of a move, the ldmatrix that feeds a fragment, where each
register fragment lives — is resolved here, and anything that cannot be resolved raises a
``ScheduleError`` that names the node and what to change.

Coordinates.  Every tensor a node touches is known by ``(name, memory)``.  Global tensors are
addressed by absolute coordinates; shared and register tensors by coordinates relative to the
tile they were created for (their *frame*).  Loops advance the origin of every operand of the
spec they tile; limits (for predication) are tracked for global tensors only: a tile that sticks
out of the tensor — or out of a split-K part — is predicated element by element, and the copies
that fill shared memory zero the part that sticks out, so the tensor-core math needs no
predicate.

Register fragments (``RFLayout``).  A register tensor is distributed by its *consumer*: the path
of loops from the node that created it down to the atom that reads or writes it.  Loops over the
tensor's dims mapped to warps say which warp holds which part, sequential (unrolled) loops say
which registers, the atom's TV layout says which lane and value.  Producers (ldmatrix), the
accumulator's init and store are derived from that layout, and checked against it.
"""

from __future__ import annotations

import functools
import itertools

import attrs

from .. import ir
from .. import ops as fops
from ..dtypes import DType, f32
from ..errors import InternalError, ScheduleError
from ..hardware.atoms import catalog, sm80
from ..hardware.atoms.base import Atom
from ..hardware.target import SM80
from ..hardware.target import target as get_target
from ..ir.expr import IntExpr, Var, evaluate, land, lt, minimum, substitute
from ..schedule import Loop, Node, Schedule
from ..spec import Init, MatMul, Move, Reduce
from ..tensor import BLOCK, GL, KERNEL, RF, SH, THREAD, WARP

REDUCE_THREADS = 128          # threads per block of the split-K reduction kernel
_COPY_WIDTHS = (16, 8, 4)     # cp.async widths, widest first
_LDMATRIX = (sm80.ldmatrix_x4, sm80.ldmatrix_x4_trans, sm80.ldmatrix_x2, sm80.ldmatrix_x2_trans,
             sm80.ldmatrix_x1, sm80.ldmatrix_x1_trans)
REG_OVERHEAD = 40             # registers a GEMM spends on addresses, loop state, predicates


# --------------------------------------------------------------------------- register layouts

@attrs.frozen
class RFLayout:
    """Where each element of a register tensor lives (see module docstring)."""

    key: tuple[str, str]
    dims: tuple[str, str]
    shape: tuple[int, int]
    atom: Atom
    operand: str                                   # "a" | "b" | "c"
    seq: tuple[tuple[str, int, int], ...]          # (dim, count, step), registers, outer first
    par: tuple[tuple[str, int, int, str], ...]     # (dim, count, step, loop var): warps
    replicas: tuple[tuple[str, int], ...]          # (loop var, count): split-K parts over warps

    @property
    def tv(self):
        return self.atom.operand(self.operand).tv

    @property
    def frag(self) -> tuple[int, int]:
        return self.tv.tile

    @property
    def values(self) -> int:
        return self.tv.num_values

    @property
    def size(self) -> int:
        n = self.values
        for _, c, _ in self.seq:
            n *= c
        return n

    def strides(self) -> list[int]:
        out, acc = [], self.values
        for _, c, _ in reversed(self.seq):
            out.append(acc)
            acc *= c
        return out[::-1]

    def offset(self, origin: dict[str, IntExpr]) -> IntExpr:
        """Register offset of the fragment whose tile origin (relative to the tensor) is ``origin``."""
        off: IntExpr = 0
        for (d, c, s), st in zip(self.seq, self.strides()):
            off = off + ((origin[d] // s) % c) * st
        return off

    def owner(self, coord: tuple[int, int]) -> tuple[int, int]:
        """(lane, register offset) holding the element at integer ``coord`` (relative to the warp's
        part of the tensor)."""
        f0, f1 = self.frag
        r, c = coord
        inv = _inverse(self.tv)
        lane, v = inv[r % f0, c % f1]
        origin = {self.dims[0]: r - r % f0, self.dims[1]: c - c % f1}
        return int(lane), int(evaluate(self.offset(origin), {})) + int(v)


# --------------------------------------------------------------------------- context

@attrs.frozen
class Ctx:
    """What a node is lowered in: origins/limits of tensors, SH stages, mode."""

    origin: dict = attrs.field(factory=dict)   # (name, mem) -> {dim: expr}
    limit: dict = attrs.field(factory=dict)    # (name, "GL") -> {dim: expr}
    stage: dict = attrs.field(factory=dict)    # SH name -> stage expr
    mode: str = "all"                          # "all" | "loads" | "compute"
    staged: frozenset = frozenset()            # SH names whose loads the enclosing pipeline issues

    def with_origin(self, key, dims: dict) -> "Ctx":
        o = dict(self.origin)
        o[key] = dims
        return attrs.evolve(self, origin=o)


def _key(tile) -> tuple[str, str]:
    return (tile.name, tile.memory.name)


def _operands(spec) -> list:
    if isinstance(spec, MatMul):
        return [spec.a, spec.b, spec.c]
    if isinstance(spec, (Move, Reduce)):
        return [spec.src, spec.dst]
    if isinstance(spec, Init):
        return [spec.dst]
    return []


def _err(node_or_spec, msg, **kw) -> ScheduleError:
    spec = node_or_spec.spec if isinstance(node_or_spec, Node) else node_or_spec
    return ScheduleError(msg, spec=spec, **kw)


# --------------------------------------------------------------------------- the lowering

class Lowering:
    def __init__(self, sched: Schedule, target=None):
        self.sched = sched
        self.target = get_target(target) if isinstance(target, str) else (target or SM80)
        self.root = sched.root
        self.spec: MatMul = sched.root.spec
        self._check_atomic()
        self.gl: dict[str, ir.GlobalBuffer] = {}
        self.extras: list = []
        self._collect_extras()
        self.var_expr: dict[str, IntExpr] = {}
        self.regs: dict[str, ir.RegBuffer] = {}
        self.shared: dict[str, ir.SharedBuffer] = {}
        self.rf_layouts: dict[tuple[str, str], RFLayout] = {}
        self.kernels: list[ir.Kernel] = []
        self._tmp = itertools.count()
        self._cur_origin: dict = {}

    # ---------------------------------------------------------------- validation passes

    def _check_atomic(self):
        for n in self.sched.nodes():
            if isinstance(n.spec, MatMul) and n.is_open:
                raise _err(n, "this spec is not refined down to an atom",
                           fix="continue the chain until done(atom) (e.g. tile(m=16, n=8, k=16) >> "
                               "done(sm80.mma_m16n8k16_f16_f32) at the warp level)")

    def _collect_extras(self):
        seen = set()
        for n in self.sched.nodes():
            for op in getattr(n.spec, "ops", ()) or ():
                for e in op.extras():
                    if e.name not in seen:
                        seen.add(e.name)
                        self.extras.append(e)

    # ---------------------------------------------------------------- buffers

    def gbuf(self, tile) -> ir.GlobalBuffer:
        t = tile.tensor
        if t.name not in self.gl:
            shape = tuple(t.extent(d) for d in t.storage_dims)
            strides, acc = [], 1
            for s in reversed(shape):
                strides.append(acc)
                acc *= s
            role = "in"
            if t.name == self.spec.c.name:
                role = "out"
            elif t.name.endswith("_part") and t.dtype == f32 and "kp" in t.dims:
                role = "workspace"
            self.gl[t.name] = ir.GlobalBuffer(t.name, t.dtype, shape, tuple(reversed(strides)), role)
        return self.gl[t.name]

    def extra_buf(self, e) -> ir.GlobalBuffer:
        c = self.spec.c.tensor
        out_dt = self._out_dtype()
        if e.name not in self.gl:
            if e.kind == "vector_n":
                shape = (c.extent("n"),)
            elif e.kind == "vector_m":
                shape = (c.extent("m"),)
            else:
                shape = (c.extent("m"), c.extent("n"))
            strides = (1,) if len(shape) == 1 else (shape[1], 1)
            self.gl[e.name] = ir.GlobalBuffer(e.name, out_dt, shape, strides, "in")
        return self.gl[e.name]

    def _out_dtype(self) -> DType:
        for n in self.sched.nodes():
            for t in _operands(n.spec):
                if t.name == self.spec.c.name and t.memory == GL:
                    return t.dtype
        return self.spec.c.dtype

    def reg(self, name: str, dt: DType, size: int) -> ir.RegBuffer:
        if name in self.regs:
            b = self.regs[name]
            if b.size < size or b.dtype != dt:
                b = ir.RegBuffer(name, dt, max(b.size, size))
                self.regs[name] = b
            return self.regs[name]
        b = ir.RegBuffer(name, dt, size)
        self.regs[name] = b
        return b

    # ---------------------------------------------------------------- entry

    def run(self) -> ir.Program:
        root = self.root
        for n in _walk(root):
            for lp in n.loops:
                hopper = [(what, field, v) for what, field, v in (
                    ("persistent blocks", "persistent", lp.persistent),
                    ("warp specialization", "warp_specialize", lp.specialize),
                    ("thread-block clusters", "cluster", lp.cluster if lp.cluster > 1 else None)) if v]
                if hopper:
                    what, field, v = hopper[0]
                    raise _err(n, f"{what} are lowered on the Hopper path only (TMA copies and wgmma); this "
                                  f"schedule uses the sm_80 atoms", field=field, value=v,
                               fix="drop persistent=True / warp_specialize() / cluster=, or build the schedule "
                                   "with sm90a atoms (recipes.gemm(..., arch='sm_90a'))")
        # a kernel-level split-K: the partial products, then the reduction kernel
        if root.loops and any(lp.unit == BLOCK and lp.step("kp") for lp in root.loops):
            main = root.body[-1]
            self.kernels.append(self.kernel_of("firesched_gemm", main, outer=root))
            red = root.post[0]
            self.kernels.append(self.reduce_kernel("firesched_splitk_reduce", red))
        else:
            self.kernels.append(self.kernel_of("firesched_gemm", root, outer=None))
        inputs = [self.gbuf(self.spec.a), self.gbuf(self.spec.b)] + [self.extra_buf(e) for e in self.extras]
        out = self.gl[self.spec.c.name]
        ws = tuple(b for b in self.gl.values() if b.role == "workspace")
        return ir.Program(tuple(self.kernels), tuple(inputs), out, ws)

    # ---------------------------------------------------------------- kernel assembly

    def kernel_of(self, name: str, node: Node, outer: Node | None) -> ir.Kernel:
        """The main kernel: block loops → grid, warp loops → warps, the rest lowered in place."""
        self.regs, self.shared = {}, {}
        block_loops = []
        if outer is not None:
            block_loops += [(lp, outer) for lp in outer.loops]
        if node.spec.level == KERNEL:
            if not node.loops or any(lp.unit != BLOCK for lp in node.loops):
                raise _err(node, "the kernel-level spec must be tiled onto blocks",
                           fix="start the chain with tile(m=..., n=...) >> to_blocks()")
            block_loops += [(lp, node) for lp in node.loops]
            block_node = node.body[-1]
        else:
            block_node = node
        if len(block_loops) > 3:
            raise _err(node, f"{len(block_loops)} loops mapped to blocks; the grid has 3 dimensions")
        grid = self._map_blocks(block_loops, node)
        warp_loops = self._warp_loops(block_node)
        nwarps = 1
        for lp in warp_loops:
            nwarps *= lp.count
        if not warp_loops:
            raise _err(block_node, "no loop of the block is mapped onto warps",
                       fix="tile the block's work with tile(m=..., n=...) >> to_warps()")
        self.threads = nwarps * 32
        self.tid = ir.tid(self.threads)
        self.lane = self.tid % 32
        stride = 1
        for lp in reversed(warp_loops):
            self.var_expr[lp.var] = (self.tid // (32 * stride)) % lp.count
            stride *= lp.count
        self._rf_pass(block_node)
        # origins of the kernel-level tiles, then the block loops
        ctx = Ctx()
        for t in _operands(self.spec) + _operands(node.spec):
            if t.memory == GL and _key(t) not in ctx.origin:
                ctx = self._enter_gl(ctx, t)
        for lp, owner in block_loops:
            ctx = self._advance(ctx, owner, lp, self.var_expr[lp.var])
        body = self.visit(block_node, ctx)
        self._check_resources(block_node)
        params = [self.gbuf(self.spec.a), self.gbuf(self.spec.b)]
        params += [self.extra_buf(e) for e in self.extras if self._uses_extras(node)]
        c_tile = node.spec.c if isinstance(node.spec, MatMul) else self.spec.c
        params.append(self.gbuf(self._gl_c(node, c_tile)))
        return ir.Kernel(name, tuple(params), tuple(grid), self.threads, tuple(self.shared.values()),
                         tuple(self.regs.values()), ir.Seq(tuple(body)), header=str(self.sched),
                         min_blocks_per_sm=1)

    def _map_blocks(self, block_loops, node) -> list:
        """Grid dimensions for the loops mapped to blocks; binds each loop variable."""
        grid = [1, 1, 1]
        grouped = [lp for lp, _ in block_loops if lp.group > 1]
        if grouped:
            # one grid axis for the M x N tiles, walked in column-major groups of G M-tiles:
            # the blocks resident at once touch G rows of A tiles and few columns of B tiles
            lm, ln = [lp for lp, _ in block_loops if lp.group > 1]
            rest = [lp for lp, _ in block_loops if lp.group == 1]
            G, Mt, Nt = lm.group, lm.count, ln.count
            pid = ir.bid(0, Mt * Nt)
            per_group = G * Nt
            first_m = (pid // per_group) * G
            size_m = _min(Mt - first_m, G)
            local = pid % per_group
            self.var_expr[lm.var] = first_m + _mod(local, size_m)
            self.var_expr[ln.var] = _div(local, size_m)
            grid[0] = Mt * Nt
            for axis, lp in enumerate(reversed(rest), start=1):
                grid[axis] = lp.count
                self.var_expr[lp.var] = ir.bid(axis, lp.count)
        else:
            for axis, (lp, _) in enumerate(reversed(block_loops)):
                grid[axis] = lp.count
                self.var_expr[lp.var] = ir.bid(axis, lp.count)
        for axis, limit in ((0, 2 ** 31 - 1), (1, 65535), (2, 65535)):
            if grid[axis] > limit:
                raise _err(node, f"grid dimension {'xyz'[axis]} would be {grid[axis]} blocks",
                           field=f"gridDim.{'xyz'[axis]}", value=grid[axis], allowed=f"<= {limit}",
                           fix="use larger block tiles, or group=... in to_blocks() to put the M x N tiles on "
                               "grid x")
        return grid

    def _uses_extras(self, node) -> bool:
        """Whether the epilogue that reads the extra tensors runs in this kernel."""
        for n in _walk(node):
            for op in getattr(n.spec, "ops", ()) or ():
                if op.extras():
                    return True
        return False

    def _gl_c(self, node, c_tile):
        for n in _walk(node):
            for t in _operands(n.spec):
                if t.memory == GL and t.tensor.dims[-2:] == ("m", "n") and t.name != self.spec.a.name:
                    return t
        return c_tile

    def _warp_loops(self, block_node: Node) -> list[Loop]:
        out = []
        for n in _walk(block_node):
            for lp in n.loops:
                if lp.unit == WARP:
                    out.append(lp)
                elif lp.unit == THREAD:
                    raise _err(n, "to_threads() on compute specs is not lowered yet; map warps and let "
                                  "the atom distribute lanes")
                elif lp.unit == BLOCK:
                    raise _err(n, "blocks can only be mapped at the kernel level")
        return out

    def _check_resources(self, block_node):
        smem = sum(b.nbytes for b in self.shared.values()) + 128 * len(self.shared)
        limit = self.target.smem_per_block_optin
        if smem > limit:
            parts = ", ".join(f"{b.name}: {b.nbytes} B" for b in self.shared.values())
            raise _err(block_node, f"shared memory over the target's limit: {smem} bytes ({parts})",
                       field="shared memory", value=smem, allowed=f"<= {limit} bytes on {self.target.name}",
                       fix="use fewer pipeline stages or smaller block / K tiles")
        words = sum(-(-b.size * b.dtype.bits // 32) for b in self.regs.values())
        if words + REG_OVERHEAD > self.target.regs_per_thread:
            parts = ", ".join(f"{b.name}: {-(-b.size * b.dtype.bits // 32)}" for b in self.regs.values())
            raise _err(block_node, f"registers over budget: about {words + REG_OVERHEAD} per thread ({parts}, "
                                   f"+{REG_OVERHEAD} for addressing)", field="registers",
                       value=words + REG_OVERHEAD, allowed=f"<= {self.target.regs_per_thread}",
                       fix="use smaller warp tiles (more warps per block) or a smaller block tile")
        if self.threads > self.target.max_threads_per_block:
            raise _err(block_node, f"{self.threads} threads per block", field="threads", value=self.threads,
                       allowed=f"<= {self.target.max_threads_per_block}")

    # ---------------------------------------------------------------- coordinates

    def _enter_gl(self, ctx: Ctx, tile) -> Ctx:
        key = _key(tile)
        ctx = ctx.with_origin(key, {d: 0 for d in tile.tensor.dims})
        lim = dict(ctx.limit)
        lim[key] = {d: tile.tensor.extent(d) for d in tile.tensor.dims}
        return attrs.evolve(ctx, limit=lim)

    def _advance_tensor(self, ctx: Ctx, key, lp: Loop, var: IntExpr, owner: Node) -> Ctx:
        o = dict(ctx.origin[key])
        lim = dict(ctx.limit.get(key, {}))
        for d, step in lp.steps:
            if d not in o:
                continue
            if key[1] == "GL" and d in lim:
                parent_ext = _extent(owner, key[0], d)
                if parent_ext is not None and parent_ext % step:
                    lim[d] = _min(lim[d], o[d] + parent_ext)
            o[d] = o[d] + var * step
        ctx = ctx.with_origin(key, o)
        if key[1] == "GL":
            limits = dict(ctx.limit)
            limits[key] = lim
            ctx = attrs.evolve(ctx, limit=limits)
        return ctx

    def _advance(self, ctx: Ctx, node: Node, lp: Loop, var: IntExpr) -> Ctx:
        """Move the origin of every tensor in scope that has one of the loop's dims (shared and
        register tensors created inside the loop are not in scope yet, so they keep their frame)."""
        for key in list(ctx.origin):
            ctx = self._advance_tensor(ctx, key, lp, var, node)
        return ctx

    def _frames(self, ctx: Ctx, specs) -> Ctx:
        """Zero-origin frames for shared/register tensors first seen in ``specs``."""
        for sp in specs:
            for t in _operands(sp):
                key = _key(t)
                if t.memory != GL and key not in ctx.origin:
                    ctx = ctx.with_origin(key, {d: 0 for d in t.tensor.dims})
        return ctx

    # ---------------------------------------------------------------- register layout pass

    def _rf_pass(self, block_node: Node):
        """Find every register tensor's consumer atom and derive its RFLayout."""
        self.rf_layouts = {}

        def go(n: Node, path: list):
            here = path + [n]
            if n.atom is not None and isinstance(n.spec, MatMul):
                for opname, t in (("a", n.spec.a), ("b", n.spec.b), ("c", n.spec.c)):
                    key = _key(t)
                    if key not in self.rf_layouts:
                        self.rf_layouts[key] = self._derive_rf(key, t, opname, n.atom, here)
            for c in n.children:
                go(c, here)

        go(block_node, [])

    def _derive_rf(self, key, tile, opname, atom, path) -> RFLayout:
        # the tensor's frame starts where it is created: the first node in the path that has it
        # as an operand in RF
        start = 0
        for i, n in enumerate(path):
            if any(_key(t) == key for t in _operands(n.spec)):
                start = i
                break
        dims = tile.tensor.dims
        seq, par, rep = [], [], []
        for n in path[start:]:
            for lp in n.loops:
                mine = [(d, s) for d, s in lp.steps if d in dims]
                if not mine:
                    if lp.unit == WARP and opname == "c":
                        rep.append((lp.var, lp.count))
                    continue
                d, s = mine[0]
                if lp.unit == WARP:
                    par.append((d, lp.count, s, lp.var))
                elif lp.unit is None:
                    seq.append((d, lp.count, s))
                else:
                    raise _err(n, f"register tensor {tile.name} is split over {lp.unit}s; only warps "
                                  "and sequential loops can hold register fragments")
        # steps must nest: each loop's step divides the one above it (per dim)
        last = {d: None for d in dims}
        for d, _c, s in [(d, c, s) for d, c, s, *_ in par] + seq:
            if last[d] is not None and last[d] % s:
                raise _err(path[-1], f"the tiles of register tensor {tile.name} along {d} do not nest "
                                     f"({s} does not divide {last[d]})", fix="use power-of-two tile sizes")
            last[d] = s
        lay = RFLayout(key, dims, tuple(tile.tensor.shape), atom, opname, tuple(seq), tuple(par), tuple(rep))
        f0, f1 = lay.frag
        for d, f in zip(dims, (f0, f1)):
            if last[d] is not None and last[d] != f:
                raise _err(path[-1], f"register tensor {tile.name}: the innermost tile along {d} is {last[d]}, "
                                     f"the atom's fragment is {f}")
        return lay

    # ---------------------------------------------------------------- visitor

    def visit(self, node: Node, ctx: Ctx) -> list:
        spec = node.spec
        if isinstance(spec, MatMul):
            return self.visit_matmul(node, ctx)
        if isinstance(spec, Move):
            src, dst = spec.src.memory, spec.dst.memory
            if src == GL and dst == SH:
                return self.visit_move_gl_sh(node, ctx)
            if src == SH and dst == RF:
                return self.visit_move_sh_rf(node, ctx)
            if src == RF and dst == GL:
                return self.visit_store(node, ctx, reduce_vars=())
            raise _err(node, f"a move from {src} to {dst} has no lowering yet",
                       allowed="GL->SH, SH->RF, RF->GL")
        if isinstance(spec, Init):
            return self.visit_init(node, ctx)
        if isinstance(spec, Reduce):
            if spec.src.memory == RF:
                return self.visit_store(node, ctx, reduce_vars=spec.axes)
            raise InternalError(f"Reduce {spec} should have become its own kernel")
        raise _err(node, f"no lowering for {type(spec).__name__} specs yet")

    def visit_matmul(self, node: Node, ctx: Ctx) -> list:
        ctx = self._frames(ctx, [node.spec] + [p.spec for p in node.pre])
        if node.atom is not None:
            if ctx.mode == "loads":
                return []
            return [self.mma_call(node, ctx)]
        out: list = []
        for p in node.pre:
            if ctx.mode != "loads":
                out += self.visit(p, ctx)
        out += self.loops(node, ctx, list(node.loops))
        for p in node.post:
            if ctx.mode != "loads":
                out += self.visit(p, ctx)
        return out

    def body(self, node: Node, ctx: Ctx) -> list:
        out: list = []
        for c in node.body:
            ctx = self._frames(ctx, [c.spec])
            if isinstance(c.spec, Move) and c.spec.src.memory == GL and c.spec.dst.memory == SH:
                if ctx.mode == "compute" and c.spec.dst.name in ctx.staged:
                    continue
                out += self.visit(c, ctx)
            elif ctx.mode == "loads":
                if not c.loops and isinstance(c.spec, MatMul):
                    out += self.body(c, ctx)
            else:
                out += self.visit(c, ctx)
        return out

    def loops(self, node: Node, ctx: Ctx, loops: list) -> list:
        if not loops:
            return self.body(node, ctx)
        lp, rest = loops[0], loops[1:]
        if lp.unit is not None:
            var = self.var_expr[lp.var]
            return self.loops(node, self._advance(ctx, node, lp, var), rest)
        if lp.dim == "k" and node.spec.level == BLOCK and self._has_staged_moves(node):
            return self.pipeline(node, ctx, lp, rest)
        v = Var(lp.var, lp.count)
        unroll = node.spec.level >= WARP
        inner = self.loops(node, self._advance(ctx, node, lp, v), rest)
        if not inner:
            return []
        return [ir.For(v, lp.count, ir.Seq(tuple(inner)), unroll=unroll)]

    def _has_staged_moves(self, node: Node) -> bool:
        return bool(self._staged(node))

    def _staged(self, node: Node) -> set:
        names = set()
        n = node
        while True:
            for c in n.body:
                if isinstance(c.spec, Move) and c.spec.src.memory == GL and c.spec.dst.memory == SH:
                    names.add(c.spec.dst.name)
            nxt = n.body[-1] if n.body else None
            if nxt is None or not isinstance(nxt.spec, MatMul) or nxt.loops or nxt.atom is not None:
                return names
            n = nxt

    # ---------------------------------------------------------------- pipeline

    def pipeline(self, node: Node, ctx: Ctx, lp: Loop, rest: list) -> list:
        """The K loop with its global → shared copies, ``stages`` deep (1 = no overlap)."""
        S = lp.stages
        staged = frozenset(self._staged(node))
        n = lp.count

        def loads(kt: IntExpr, stage: IntExpr) -> list:
            c = self._advance(ctx, node, lp, kt)
            c = attrs.evolve(c, mode="loads", staged=staged, stage={**ctx.stage, **{s: stage for s in staged}})
            return self.loops(node, c, rest)

        out: list = [ir.Comment(f"K loop over {n} tiles of {lp.step('k')}, {S}-stage cp.async pipeline")]
        kt = Var(lp.var, n)
        compute_ctx = attrs.evolve(self._advance(ctx, node, lp, kt), mode="compute", staged=staged,
                                   stage={**ctx.stage, **{s: (kt % S if S > 1 else 0) for s in staged}})
        compute = self.loops(node, compute_ctx, rest)
        if S == 1:
            body = [ir.Barrier("the previous tile's readers are done"), *loads(kt, 0), ir.AsyncCommit(),
                    ir.AsyncWait(0), ir.Barrier("the tile is in shared memory"), *compute]
            out.append(ir.For(kt, n, ir.Seq(tuple(body))))
            return out
        for s in range(S - 1):
            ld = loads(s, s)
            if s < n:
                out += ld
            out.append(ir.AsyncCommit())
        ahead = kt + (S - 1)
        issue = loads(ahead, ahead % S)
        split = _split_ksteps(compute)
        if split is not None and lp.prefetch:
            # the next tile's fragments come from stage (kt + 1) % S; lowered afresh rather than
            # substituted, since expressions were simplified knowing kt < n
            nxt = kt + 1
            next_ctx = attrs.evolve(self._advance(ctx, node, lp, nxt), mode="compute", staged=staged,
                                    stage={**ctx.stage, **{s: nxt % S for s in staged}})
            split_next = _split_ksteps(self.loops(node, next_ctx, rest))
            return out + self._prefetching_loop(kt, n, S, ir.If(lt(ahead, n), ir.Seq(tuple(issue))), *split,
                                                split_next[1])
        body = [ir.AsyncWait(S - 2), ir.Barrier("tile kt landed; stage (kt-1) % S is free"),
                ir.If(lt(ahead, n), ir.Seq(tuple(issue))), ir.AsyncCommit(), *compute]
        out.append(ir.For(kt, n, ir.Seq(tuple(body))))
        out.append(ir.AsyncWait(0))
        return out

    def _prefetching_loop(self, kt: Var, n: int, S: int, issue, kvar: Var, frag_loads: list, math: list,
                          next_loads: list) -> list:
        """The K loop with register fragments double-buffered one warp K-step ahead.

        Fragments of step ks+1 load while the mma of step ks run; the first step of tile kt+1
        loads during the last step of tile kt, right after the one barrier of the iteration (which
        now sits there: every read of stage kt-1 happened before it, so the cp.async issued at the
        top of the next iteration may overwrite that stage)::

            wait; barrier; load frags(tile 0, step 0) -> buf 0
            for kt:  issue cp.async(tile kt+S-1); commit
                     step 0: load frags(step 1) -> buf 1;  mma(buf 0)
                     ...
                     step KS-1: wait; barrier; load frags(tile kt+1, step 0) -> buf 0;  mma(buf 1)
        """
        KS = kvar.extent
        bufs = {}
        for st in _walk_ir(frag_loads):
            if isinstance(st, ir.AtomCall) and st.atom.family == "ldmatrix":
                b = st.arg("dst").buffer
                bufs[b.name] = b
        doubled = {}
        for name, b in bufs.items():
            d = ir.RegBuffer(b.name, b.dtype, 2 * b.size)
            self.regs[name] = d
            doubled[name] = (d, b.size)

        def part(stmts, kt_expr, ks, parity):
            env = {kvar.name: ks} if kt_expr is kt else {kvar.name: ks, kt.name: kt_expr}
            return [_rewrite(s, env, doubled, parity) for s in stmts]

        pro = [ir.AsyncWait(S - 2), ir.Barrier("tile 0 landed"), *part(frag_loads, 0, 0, 0)]
        body: list = [issue, ir.AsyncCommit()]
        for ks in range(KS):
            if ks < KS - 1:
                body += part(frag_loads, kt, ks + 1, (ks + 1) % 2)
            else:
                body += [ir.AsyncWait(S - 2), ir.Barrier("tile kt+1 landed; stage kt-1 is no longer read"),
                         *part(next_loads, kt, 0, 0)]
            body += part(math, kt, ks, ks % 2)
        return [*pro, ir.For(kt, n, ir.Seq(tuple(body))), ir.AsyncWait(0)]

    # ---------------------------------------------------------------- GL -> SH

    def shared_buf(self, tile) -> ir.SharedBuffer:
        t = tile.tensor
        name = f"{t.name}_smem"
        if name not in self.shared:
            elems = t.shape[0] * t.shape[1]
            note = f"{t.stages} stage(s) x {'x'.join(map(str, t.shape))} {t.dtype}"
            if t.swizzle is not None and t.swizzle.bits:
                note += f", {t.swizzle}"
            self.shared[name] = ir.SharedBuffer(name, t.dtype, elems * t.stages, 128, note)
        return self.shared[name]

    def sh_offset(self, tile, ctx: Ctx, coord: dict[str, IntExpr]) -> IntExpr:
        """Element offset in the shared buffer of ``tile``'s tensor at frame coordinate ``coord``."""
        t = tile.tensor
        rdim, cdim = t.storage_dims
        cols = t.extent(cdim)
        lin = coord[rdim] * cols + coord[cdim]
        if t.swizzle is not None and t.swizzle.bits:
            lin = t.swizzle(lin)
        stage = ctx.stage.get(t.name, 0)
        if t.stages > 1:
            lin = stage * (t.shape[0] * t.shape[1]) + lin
        return lin

    def visit_move_gl_sh(self, node: Node, ctx: Ctx) -> list:
        spec: Move = node.spec
        if ctx.mode == "compute" and spec.dst.name in ctx.staged:
            return []
        src, dst = spec.src, spec.dst
        t = src.tensor
        rdim, cdim = t.storage_dims
        rows, cols = src.extent(rdim), src.extent(cdim)
        eb = t.dtype.bits
        gbuf = self.gbuf(src)
        sbuf = self.shared_buf(dst)
        o = ctx.origin[_key(src)]
        lim = ctx.limit[_key(src)]
        ld = t.extent(cdim)
        atom = self._copy_atom(node, rows, cols, ld, lim[cdim], eb)
        vec = atom.values_for(t.dtype) if atom.family in ("cp_async", "copy") else 1
        cpr = cols // vec
        total = rows * cpr
        T = self.threads
        iters = -(-total // T)
        out: list = [ir.Comment(f"{spec}: {total} chunks of {vec} x {t.dtype} over {T} threads")]
        it = Var(f"c{next(self._tmp)}", iters)
        chunk = it * T + self.tid
        r = chunk // cpr
        cc = (chunk % cpr) * vec
        in_tile = lt(chunk, total) if total % T else 1
        g_r, g_c = o[rdim] + r, o[cdim] + cc
        goff = g_r * ld + g_c
        soff = self.sh_offset(dst, ctx, {rdim: r, cdim: cc})
        in_bounds = land(lt(g_r, lim[rdim]), lt(g_c, lim[cdim]))
        if atom.family == "cp_async":
            # chunks outside the tensor are zero-filled by cp.async itself (src-size 0); chunks
            # outside the tile (when threads outnumber them) are not issued at all
            call = ir.AtomCall(atom, (("dst", ir.MemRef(sbuf, soff)), ("src", ir.MemRef(gbuf, goff))),
                               in_bounds, comment=f"{t.name} tile -> shared")
            stmts = [call] if in_tile == 1 else [ir.If(in_tile, call)]
        else:
            tmp = self.reg(f"{t.name}_stage_tmp", t.dtype, vec)
            ld_atom = catalog.copy_atom("GL", "RF", atom.width)
            st_atom = catalog.copy_atom("RF", "SH", atom.width)
            load = ir.AtomCall(ld_atom, (("dst", ir.RegRef(tmp, 0)), ("src", ir.MemRef(gbuf, goff))),
                               land(in_tile, in_bounds),
                               comment=f"{t.name}: unaligned rows, synchronous element copy")
            store = ir.AtomCall(st_atom, (("dst", ir.MemRef(sbuf, soff)), ("src", ir.RegRef(tmp, 0))), in_tile)
            stmts = [load, store]
        out.append(ir.For(it, iters, ir.Seq(tuple(stmts)), unroll=True))
        return out

    def _copy_atom(self, node: Node, rows: int, cols: int, ld: int, col_limit: IntExpr, eb: int) -> Atom:
        # Tile origins along the contiguous dim are multiples of the tile width (and split-K parts
        # multiples of 64), so whole chunks stay inside or outside the tensor when the row length
        # and the tile width are multiples of the chunk.
        user = node.via[0] if node.via else None
        for w in _COPY_WIDTHS:
            v = w * 8 // eb
            if v and cols % v == 0 and ld % v == 0 and (user is None or user.width == w):
                a = catalog.copy_atom("GL", "SH", w)
                if user is None or user == a:
                    return a
        if user is not None:
            raise _err(node, f"{user!r} cannot copy this tile: rows of {ld} elements are not "
                             f"{user.width}-byte aligned or the tile width {cols} is not a multiple",
                       field="via", value=user, fix="drop via= to let firesched choose the widest legal copy")
        w = eb // 8
        if w < 1:
            raise _err(node, f"sub-byte tensors need 16-byte aligned rows (row length {ld})")
        return catalog.copy_atom("GL", "SH", w) if w >= 4 else _SyncCopy(w)

    # ---------------------------------------------------------------- SH -> RF (ldmatrix)

    def visit_move_sh_rf(self, node: Node, ctx: Ctx) -> list:
        if ctx.mode == "loads":
            return []
        spec: Move = node.spec
        src, dst = spec.src, spec.dst
        key = _key(dst)
        lay = self.rf_layouts.get(key)
        if lay is None:
            raise _err(node, f"register tensor {dst.name} is never read by an atom")
        if spec.level != WARP:
            raise _err(node, "register fragments are loaded per warp: apply move_to_regs after to_warps()",
                       field="level", value=str(spec.level), allowed="warp")
        t = src.tensor
        rdim, cdim = t.storage_dims
        candidates = [node.atom] if node.atom is not None else list(_LDMATRIX)
        reasons = []
        for atom in candidates:
            why = self._ldmatrix_fits(atom, lay, src, rdim, cdim)
            if why is None:
                return self._emit_ldmatrix(node, ctx, atom, lay, src, dst, rdim, cdim)
            reasons.append(f"{atom.name}: {why}")
        raise _err(node, f"no ldmatrix delivers {dst.name}'s fragments in the layout "
                         f"{lay.atom.name} reads:\n    " + "\n    ".join(reasons),
                   field="atom", value=node.atom,
                   fix="drop atom= to let firesched choose, or stage the operand with the other majorness")

    def _ldmatrix_fits(self, atom: Atom, lay: RFLayout, src, rdim, cdim) -> str | None:
        if atom.family != "ldmatrix":
            return "not an ldmatrix"
        if src.dtype.bits != 16:
            return f"ldmatrix moves 16-bit elements, {src.name} is {src.dtype}"
        ar, ac = atom.operand("dst").tv.tile
        g = {rdim: ar, cdim: ac}
        part = self._warp_part(lay)
        for d in (rdim, cdim):
            if part[d] % g[d]:
                return f"its {ar}x{ac} tile does not divide the warp's {part[rdim]}x{part[cdim]} part"
        tv = atom.operand("dst").tv
        coords = _coords(tv)
        for i0 in range(0, part[rdim], ar):
            for i1 in range(0, part[cdim], ac):
                base = None
                for lane in range(32):
                    for v in range(tv.num_values):
                        r, c = coords[lane][v]
                        logical = {rdim: i0 + r, cdim: i1 + c}
                        own_lane, off = lay.owner((logical[lay.dims[0]], logical[lay.dims[1]]))
                        if own_lane != lane:
                            return (f"lane {lane} would receive element {logical} that the consumer expects "
                                    f"in lane {own_lane}")
                        if lane == 0 and v == 0:
                            base = off
                        elif off != base + v:
                            return "the values arrive in a register order the consumer does not use"
        return None

    def _warp_part(self, lay: RFLayout) -> dict[str, int]:
        part = dict(zip(lay.dims, lay.shape))
        for d, _c, s, _ in lay.par:
            part[d] = s
        return part

    def _emit_ldmatrix(self, node, ctx, atom, lay, src, dst, rdim, cdim) -> list:
        """One ldmatrix per atom tile of the warp's part, unrolled here so that each issue's first
        register is a constant (an x1/x2 issue may start inside a consumer fragment)."""
        ar, ac = atom.operand("dst").tv.tile
        part = self._warp_part(lay)
        rbuf = self.reg(f"{dst.name}_frag", dst.dtype, lay.size)
        sbuf = self.shared_buf(src)
        addr = atom.operand("src").addr
        a_idx = addr(self.lane % addr.size())
        a_r, a_c = a_idx % ar, a_idx // ar
        so = ctx.origin[_key(src)]
        r0, c0 = atom.operand("dst").tv.coord(0, 0)
        ops_ = spec_ops(node.spec)
        stmts: list = [ir.Comment(f"{node.spec}: {atom.name}")]
        for i0 in range(0, part[rdim], ar):
            for i1 in range(0, part[cdim], ac):
                first = {rdim: i0 + r0, cdim: i1 + c0}
                _, reg_off = lay.owner((first[lay.dims[0]], first[lay.dims[1]]))
                soff = self.sh_offset(src, ctx, {rdim: so[rdim] + i0 + a_r, cdim: so[cdim] + i1 + a_c})
                stmts.append(ir.AtomCall(atom, (("dst", ir.RegRef(rbuf, reg_off)), ("src", ir.MemRef(sbuf, soff))),
                                         comment=f"{src.name} fragments for {lay.atom.name}"))
                for op in ops_:
                    for name, args in op.scalar():
                        for v in range(atom.operand("dst").values):
                            r = ir.RegRef(rbuf, reg_off + v)
                            stmts.append(ir.Pointwise(name, r, (r, *args)))
        return stmts

    # ---------------------------------------------------------------- MMA

    def mma_call(self, node: Node, ctx: Ctx) -> ir.AtomCall:
        spec: MatMul = node.spec
        atom = node.atom
        args = {}
        for opname, t in (("a", spec.a), ("b", spec.b), ("c", spec.c)):
            key = _key(t)
            lay = self.rf_layouts[key]
            o = ctx.origin.get(key)
            if o is None:
                raise InternalError(f"no origin for {key}")
            buf = self.reg(f"{t.name}_frag" if opname != "c" else f"{t.name}_acc", t.dtype if opname != "c" else spec.acc,
                           lay.size)
            args[opname] = ir.RegRef(buf, lay.offset(o))
        return ir.AtomCall(atom, (("d", args["c"]), ("a", args["a"]), ("b", args["b"]), ("c", args["c"])),
                           comment=str(spec))

    # ---------------------------------------------------------------- accumulator init / store

    def visit_init(self, node: Node, ctx: Ctx) -> list:
        key = _key(node.spec.dst)
        lay = self.rf_layouts.get(key)
        if lay is None:
            raise _err(node, "the accumulator is never written by an atom")
        buf = self.reg(f"{node.spec.dst.name}_acc", node.spec.dst.dtype, lay.size)
        return [ir.RegFill(ir.RegRef(buf, 0), lay.size, float(node.spec.value))]

    def _frag_iter(self, lay: RFLayout):
        """(unrolled loop vars, element coordinate exprs (relative to the tensor), register offset)
        for every fragment run of this thread, grouped in runs adjacent along the last dim."""
        vars_ = [Var(f"f{next(self._tmp)}", c) for _, c, _ in lay.seq]
        origin = {d: 0 for d in lay.dims}
        for (d, _c, s), v in zip(lay.seq, vars_):
            origin[d] = origin[d] + v * s
        for d, _c, s, var in lay.par:
            origin[d] = origin[d] + self.var_expr[var] * s
        base = lay.offset({d: sum(v * s for (dd, c, s), v in zip(lay.seq, vars_) if dd == d) for d in lay.dims})
        tv = lay.tv
        runs = _value_runs(tv)
        items = []
        for vs in runs:
            r, c = tv.coord(self.lane, vs[0])
            coord = {lay.dims[0]: origin[lay.dims[0]] + r, lay.dims[1]: origin[lay.dims[1]] + c}
            items.append((vs, coord))
        return vars_, base, items

    def visit_store(self, node: Node, ctx: Ctx, reduce_vars) -> list:
        if ctx.mode == "loads":
            return []
        spec = node.spec
        src, dst = spec.src, spec.dst
        key = _key(src)
        lay = self.rf_layouts.get(key)
        if lay is None:
            raise _err(node, "the accumulator is never written by an atom")
        acc = self.reg(f"{src.name}_acc", src.dtype, lay.size)
        vars_, base, items = self._frag_iter(lay)
        go = ctx.origin[_key(dst)]
        glim = ctx.limit[_key(dst)]
        self._cur_origin = ctx.origin
        out: list = [ir.Comment(f"{spec}")]
        rep = [(v, c) for v, c in lay.replicas if v in reduce_vars or not reduce_vars]
        if reduce_vars and rep:
            out += self._warp_reduce(node, lay, acc, vars_, base, items, rep)
        stmts = []
        for vs, coord in items:
            row = go["m"] + coord["m"]
            col = go["n"] + coord["n"]
            stmts += self.epilogue_run(node, spec_ops(spec), acc, base + vs[0], len(vs), dst, row, col, glim)
        body = ir.Seq(tuple(stmts))
        for v in reversed(vars_):
            body = ir.For(v, v.extent, body, unroll=True)
        if rep:
            body = ir.If(land(*[_eq0(self.var_expr[v]) for v, _ in rep]), body)
        out.append(body)
        return out

    def _warp_reduce(self, node, lay, acc, vars_, base, items, rep) -> list:
        """Split-K across warps: parts 1.. write their partial fragments to shared memory, part 0
        adds them up."""
        if len(rep) != 1:
            raise _err(node, "split-K across warps can be applied once per block")
        (var, parts), = rep
        m, n = lay.shape
        red = self.shared.setdefault("splitk_smem", ir.SharedBuffer("splitk_smem", f32, (parts - 1) * m * n, 128,
                                                                    f"split-K partials {parts - 1} x {m}x{n} f32"))
        kp = self.var_expr[var]
        st4 = catalog.copy_atom("RF", "SH", 4)
        ld4 = catalog.copy_atom("SH", "RF", 4)
        tmp = self.reg("splitk_tmp", f32, 1)
        writes, reads = [], []
        for vs, coord in items:
            for j, v in enumerate(vs):
                r, c = coord["m"], coord["n"] + j
                off = (kp - 1) * (m * n) + r * n + c
                writes.append(ir.AtomCall(st4, (("dst", ir.MemRef(red, off)), ("src", ir.RegRef(acc, base + v)))))
                for p in range(1, parts):
                    roff = (p - 1) * (m * n) + r * n + c
                    reads.append(ir.AtomCall(ld4, (("dst", ir.RegRef(tmp, 0)), ("src", ir.MemRef(red, roff)))))
                    reads.append(ir.Pointwise("add", ir.RegRef(acc, base + v), (ir.RegRef(acc, base + v), ir.RegRef(tmp, 0))))

        def nest(stmts):
            b = ir.Seq(tuple(stmts))
            for v in reversed(vars_):
                b = ir.For(v, v.extent, b, unroll=True)
            return b

        return [ir.Comment(f"split-K over {parts} warp groups: reduce through shared memory"),
                ir.If(_ne0(kp), nest(writes)), ir.Barrier("partials written"), ir.If(_eq0(kp), nest(reads))]

    def epilogue_run(self, node, ops_, acc, reg_off, p, dst, row, col, glim) -> list:
        """Apply ``ops_`` to ``p`` adjacent accumulator values at (row, col..col+p-1) and store."""
        out_dt = dst.dtype
        gbuf = self.gbuf(dst)
        goff = self._gl_offset(gbuf, dst, row, col)
        stmts = []
        work = self.reg("epi", f32, p)
        for j in range(p):
            stmts.append(ir.Pointwise("copy", ir.RegRef(work, j), (ir.RegRef(acc, reg_off + j),)))
        stmts += self.apply_ops(ops_, work, p, row, col, glim)
        full = self._store(work, p, out_dt, gbuf, goff, row, col, glim)
        return stmts + full

    def apply_ops(self, ops_, work, p, row, col, glim, preloaded=None) -> list:
        """The epilogue ops on ``p`` f32 registers of ``work`` (columns ``col`` .. ``col + p - 1`` of
        row ``row``).  Extra tensors are loaded here, ``p`` elements with one vector load where
        the row length allows it, unless ``preloaded`` maps the extra's name to f32 registers that
        already hold its ``p`` values (a bias shared by several rows of a fragment)."""
        stmts = []
        for op in ops_:
            for name, args in op.scalar():
                srcs_of = []
                for a in args:
                    if isinstance(a, fops.Extra) and preloaded and a.name in preloaded:
                        srcs_of.append(preloaded[a.name])
                    elif isinstance(a, fops.Extra):
                        xf, loads = self.load_extra(a, p, row, col, glim)
                        stmts += loads
                        srcs_of.append(xf)
                    else:
                        srcs_of.append(float(a))
                for j in range(p):
                    srcs = [ir.RegRef(work, j)] + [ir.RegRef(x, j) if isinstance(x, ir.RegBuffer) else x
                                                   for x in srcs_of]
                    stmts.append(ir.Pointwise(name, ir.RegRef(work, j), tuple(srcs)))
        return stmts

    def load_extra(self, a, p, row, col, glim):
        """``p`` values of extra tensor ``a`` at (row, col .. col + p - 1) into new f32 registers:
        (the register buffer, the statements).  Out-of-range elements read as zero."""
        buf = self.extra_buf(a)
        xr = self.reg(f"x_{a.name}", buf.dtype, p)
        xf = self.reg(f"xf_{a.name}", f32, p)
        stmts = self.load_extra_raw(a, p, row, col, glim, xr, 0)
        stmts += [ir.Pointwise("cvt", ir.RegRef(xf, j), (ir.RegRef(xr, j),)) for j in range(p)]
        return xf, stmts

    def load_extra_raw(self, a, p, row, col, glim, xr, off) -> list:
        """Loads of ``p`` values of extra tensor ``a`` at (row, col ..) into registers ``xr[off ..]``
        of its own dtype: one vector load when the p elements are contiguous, aligned and in
        range together (col a multiple of p, as fragment pairs are, and N a multiple of p)."""
        buf = self.extra_buf(a)
        w = buf.dtype.bits // 8
        in_row = lt(row, glim["m"])
        n_lim = glim["n"]
        if a.kind == "vector_m":
            offs = [(row, in_row)] * p
        elif a.kind == "vector_n":
            offs = [(col + j, lt(col + j, n_lim)) for j in range(p)]
        else:
            offs = [(row * buf.shape[1] + col + j, land(in_row, lt(col + j, n_lim))) for j in range(p)]
        vec = (p > 1 and a.kind != "vector_m" and isinstance(n_lim, int) and n_lim % p == 0
               and buf.shape[-1] % p == 0 and (p * w) in (2, 4, 8, 16))
        if vec:
            return [ir.AtomCall(catalog.copy_atom("GL", "RF", p * w),
                                (("dst", ir.RegRef(xr, off)), ("src", ir.MemRef(buf, offs[0][0]))), offs[0][1],
                                comment=f"{a.name} for the epilogue")]
        return [ir.AtomCall(catalog.copy_atom("GL", "RF", w),
                            (("dst", ir.RegRef(xr, off + j)), ("src", ir.MemRef(buf, o))), pred,
                            comment=f"{a.name} for the epilogue") for j, (o, pred) in enumerate(offs)]

    def _store(self, work, p, out_dt, gbuf, goff, row, col, glim) -> list:
        n_lim = glim["n"]
        aligned = isinstance(n_lim, int) and n_lim % p == 0 and gbuf.shape[-1] % p == 0
        outr = self.reg(f"out_{out_dt.name}", out_dt, p)
        stmts = []
        for j in range(p):
            stmts.append(ir.Pointwise("cvt" if out_dt != f32 else "copy", ir.RegRef(outr, j), (ir.RegRef(work, j),)))
        w = out_dt.bits // 8
        if aligned and p > 1 and (p * w) in (2, 4, 8, 16):
            atom = catalog.copy_atom("RF", "GL", p * w)
            stmts.append(ir.AtomCall(atom, (("dst", ir.MemRef(gbuf, goff)), ("src", ir.RegRef(outr, 0))),
                                     land(lt(row, glim["m"]), lt(col, n_lim)), comment="C"))
        else:
            atom = catalog.copy_atom("RF", "GL", w)
            for j in range(p):
                stmts.append(ir.AtomCall(atom, (("dst", ir.MemRef(gbuf, goff + j)), ("src", ir.RegRef(outr, j))),
                                         land(lt(row, glim["m"]), lt(col + j, n_lim)), comment="C"))
        return stmts

    def _gl_offset(self, gbuf: ir.GlobalBuffer, tile, row: IntExpr, col: IntExpr) -> IntExpr:
        """Element offset of (row, col) of C-like tile ``tile``; other dims (a split-K part) at the
        tile's current origin."""
        coords = dict(self._cur_origin.get(_key(tile), {}))
        coords["m"], coords["n"] = row, col
        return sum(coords[d] * s for d, s in zip(tile.tensor.storage_dims, gbuf.strides))

    # ---------------------------------------------------------------- split-K reduction kernel

    def reduce_kernel(self, name: str, node: Node) -> ir.Kernel:
        self.regs, self.shared = {}, {}
        spec: Reduce = node.spec
        ws = self.gbuf(spec.src)
        out = self.gbuf(spec.dst)
        parts, M, N = spec.src.tensor.shape
        p = 2 if N % 2 == 0 else 1
        T = REDUCE_THREADS
        total = M * N // p if p == 2 else M * N
        blocks = -(-total // T)
        tid = ir.tid(T)
        b = ir.bid(0, blocks)
        idx = (b * T + tid) * p
        row, col = idx // N, idx % N
        glim = {"m": M, "n": N}
        work = self.reg("epi", f32, p)
        tmp = self.reg("part", f32, p)
        ld = catalog.copy_atom("GL", "RF", 4 * p)
        live = lt(idx, M * N)
        stmts: list = [ir.RegFill(ir.RegRef(work, 0), p, 0.0)]
        for j in range(parts):
            stmts.append(ir.AtomCall(ld, (("dst", ir.RegRef(tmp, 0)), ("src", ir.MemRef(ws, j * M * N + idx))), live,
                                     comment=f"partial sum {j}"))
            for q in range(p):
                stmts.append(ir.Pointwise("add", ir.RegRef(work, q), (ir.RegRef(work, q), ir.RegRef(tmp, q))))
        stmts += self.apply_ops(spec.ops, work, p, row, col, glim)
        stmts += self._store(work, p, spec.dst.dtype, out, idx, row, col, glim)
        params = [ws] + [self.extra_buf(e) for e in self.extras] + [out]
        return ir.Kernel(name, tuple(params), (blocks, 1, 1), T, (), tuple(self.regs.values()),
                         ir.Seq((ir.Comment(str(spec)), ir.If(live, ir.Seq(tuple(stmts))))), header=str(spec))


# --------------------------------------------------------------------------- helpers

def _flat(stmts) -> list:
    out = []
    for st in stmts:
        if isinstance(st, ir.Seq):
            out += _flat(st.body)
        else:
            out.append(st)
    return out


def _walk_ir(stmts):
    for st in stmts:
        yield st
        if isinstance(st, ir.Seq):
            yield from _walk_ir(st.body)
        elif isinstance(st, ir.For):
            yield from _walk_ir([st.body])
        elif isinstance(st, ir.If):
            yield from _walk_ir([st.then])


def _split_ksteps(compute: list):
    """(k-step var, fragment loads, math) when the compute part of a K tile is one unrolled loop
    over an even number of warp K steps whose body is ldmatrix issues followed by the mma."""
    top = [st for st in _flat(compute) if not isinstance(st, ir.Comment)]
    if len(top) != 1 or not isinstance(top[0], ir.For) or not top[0].unroll or top[0].extent % 2:
        return None
    loop = top[0]
    body = _flat([loop.body])
    loads, math, seen_math = [], [], False
    for st in body:
        is_load = (isinstance(st, ir.AtomCall) and st.atom.family == "ldmatrix") or isinstance(st, ir.Pointwise)
        if is_load and not seen_math:
            loads.append(st)
        elif isinstance(st, ir.Comment) and not seen_math:
            loads.append(st)
        else:
            seen_math = True
            math.append(st)
    has_mma = any(isinstance(s, ir.AtomCall) and s.atom.family == "mma" for s in _walk_ir(math))
    if not loads or not has_mma or any(isinstance(s, ir.AtomCall) and s.atom.family == "ldmatrix"
                                       for s in _walk_ir(math)):
        return None
    return loop.var, loads, math


def _rewrite(st, env: dict, doubled: dict, parity: int):
    """``st`` with variables substituted and fragment buffers replaced by their double buffers."""

    def e(x):
        return substitute(x, env)

    def ref(r):
        if isinstance(r, ir.RegRef):
            if r.buffer.name in doubled:
                buf, size = doubled[r.buffer.name]
                return ir.RegRef(buf, e(r.offset) + parity * size)
            return ir.RegRef(r.buffer, e(r.offset))
        if isinstance(r, ir.MemRef):
            return ir.MemRef(r.buffer, e(r.offset))
        return r

    if isinstance(st, ir.Seq):
        return ir.Seq(tuple(_rewrite(s, env, doubled, parity) for s in st.body))
    if isinstance(st, ir.For):
        return ir.For(st.var, st.extent, _rewrite(st.body, env, doubled, parity), st.unroll)
    if isinstance(st, ir.If):
        return ir.If(e(st.cond), _rewrite(st.then, env, doubled, parity))
    if isinstance(st, ir.AtomCall):
        return ir.AtomCall(st.atom, tuple((k, ref(v)) for k, v in st.args), e(st.pred), st.comment)
    if isinstance(st, ir.Pointwise):
        return ir.Pointwise(st.op, ref(st.dst), tuple(ref(x) for x in st.srcs))
    if isinstance(st, ir.RegFill):
        return ir.RegFill(ref(st.ref), st.count, st.value)
    return st


class _SyncCopy:
    """Marker for an element-wise synchronous copy (rows not 4-byte aligned)."""

    family = "sync_copy"

    def __init__(self, width: int):
        self.width = width

    def values_for(self, dt) -> int:
        return max(1, self.width * 8 // dt.bits)


def spec_ops(spec) -> tuple:
    return tuple(getattr(spec, "ops", ()) or ())


def _walk(node: Node):
    yield node
    for c in node.children:
        yield from _walk(c)


def _extent(node: Node, name: str, dim: str) -> int | None:
    """Extent along ``dim`` of tensor ``name`` in the spec ``node`` tiles (or its refined child)."""
    specs = [node.spec] + ([node.body[-1].spec] if node.body else [])
    for sp in specs:
        for t in _operands(sp):
            if t.name == name and t.memory == GL and dim in t.tensor.dims:
                return t.extent(dim)
    return None


def _min(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return minimum(a, b)


def _mod(a: IntExpr, b: IntExpr) -> IntExpr:
    from ..ir.expr import binop

    return a % b if isinstance(b, int) else binop("%", a, b)


def _div(a: IntExpr, b: IntExpr) -> IntExpr:
    from ..ir.expr import binop

    return a // b if isinstance(b, int) else binop("//", a, b)


def _eq0(e: IntExpr) -> IntExpr:
    return lt(e, 1)


def _ne0(e: IntExpr) -> IntExpr:
    from ..ir.expr import ge

    return ge(e, 1)


def _value_runs(tv) -> list[tuple[int, ...]]:
    """Group a fragment's values into runs adjacent along the tile's columns (same for every lane)."""
    runs, cur = [], [0]
    for v in range(1, tv.num_values):
        ok = all(tv.coord(t, v) == (tv.coord(t, v - 1)[0], tv.coord(t, v - 1)[1] + 1) for t in range(tv.num_threads))
        if ok and len(cur) < 2:
            cur.append(v)
        else:
            runs.append(tuple(cur))
            cur = [v]
    runs.append(tuple(cur))
    return runs


@functools.lru_cache(maxsize=None)
def _inverse(tv):
    return tv.inverse()


@functools.lru_cache(maxsize=None)
def _coords(tv):
    return tuple(tuple(tuple(int(x) for x in tv.coord(t, v)) for v in range(tv.num_values))
                 for t in range(tv.num_threads))
