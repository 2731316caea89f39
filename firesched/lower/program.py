"""The resources a lowering hands out: global buffers and launches (``ProgramBuilder``), shared
memory, mbarriers, registers and parameters of one launch (``KernelBuilder``).

Rules do not own kernels; they *ask* for what they need — a shared buffer for a staged tile, a
ring of mbarriers, a register fragment, a workspace, a second launch — and the builders lay it out.
A kernel's parameters are the global tensors its rules touched: those it only reads first (in the
order they were first touched), then those it writes.
"""

from __future__ import annotations

import itertools

from .. import ir
from .. import ops as fops
from ..dtypes import DType
from ..spec import MatMul
from ..tensor import GL


def _row_major_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


class ProgramBuilder:
    """The global side of one schedule's program: its buffers, workspaces and launches."""

    def __init__(self, sched, target):
        self.sched = sched
        self.target = target
        self.spec = sched.root.spec
        self.gl: dict[str, ir.GlobalBuffer] = {}
        self.kernels: list[ir.Kernel] = []
        self.extra_workspaces: list[ir.GlobalBuffer] = []
        self.padded: dict[str, ir.GlobalBuffer] = {}   # row-padded copies of tensors, by name
        self.counter = itertools.count()            # fresh names (c0, f1, ...), program-wide
        self.extras: list[fops.Extra] = []
        seen = set()
        for n in sched.nodes():
            for op in getattr(n.spec, "ops", ()) or ():
                for e in op.extras():
                    if e.name not in seen:
                        seen.add(e.name)
                        self.extras.append(e)
        # the first result is the output; a fused spec may have more (``Fused.results``)
        self.output = self.spec.outputs[0]
        self.side_outputs = tuple(self.spec.outputs[1:])
        self._out_names = {t.name for t in self.spec.outputs}
        self.out_dtype = self._out_dtype()

    def _out_dtype(self) -> DType:
        """The output's dtype as stored (an epilogue ``cast`` may have changed it)."""
        for n in self.sched.nodes():
            for t in n.spec.operands:
                if t.name == self.output.name and t.memory == GL:
                    return t.dtype
        return self.output.dtype

    def tmp(self) -> int:
        return next(self.counter)

    # ------------------------------------------------------------------ global buffers

    def gbuf(self, tile) -> ir.GlobalBuffer:
        """The global buffer of ``tile``'s tensor: stored in ``storage_dims`` order, row-major."""
        t = tile.tensor
        if t.name not in self.gl:
            shape = tuple(t.extent(d) for d in t.storage_dims)
            role = "workspace" if t.workspace else ("out" if t.name in self._out_names else "in")
            self.gl[t.name] = ir.GlobalBuffer(t.name, t.dtype, shape, _row_major_strides(shape), role)
        return self.gl[t.name]

    def out_axes(self) -> tuple[str, str]:
        """The output dims an epilogue's ``axis="m"`` / ``"n"`` refer to."""
        if isinstance(self.spec, MatMul):
            return self.spec.m_dim, self.spec.n_dim
        dims = self.output.tensor.dims
        return (dims[-2] if len(dims) > 1 else dims[-1]), dims[-1]

    def extra_dims(self, e: fops.Extra) -> tuple[str, ...]:
        """The output dims extra tensor ``e`` is indexed by."""
        m, n = self.out_axes()
        if e.kind == "vector_n":
            return (n,)
        if e.kind == "vector_m":
            return (m,)
        return self.output.tensor.storage_dims

    def extra_buf(self, e: fops.Extra) -> ir.GlobalBuffer:
        """An epilogue's extra tensor (bias, residual): in the output's stored dtype, a vector
        along one output dim or a tensor of the output's shape.  A prologue's group scales
        (``ops.group_scale``): ``(ceil(K / group), N)`` of the operand it dequantises, in the
        type it dequantises to."""
        if e.name not in self.gl and e.kind == "groups":
            for n in self.sched.nodes():
                sp = n.spec
                if any(x == e for op in getattr(sp, "ops", ()) or () for x in op.extras()):
                    src = next(t.tensor for t in self.spec.operands if t.name == sp.src.name)
                    k = src.extent(src.major)
                    rows = 1 if not e.group else -(-k // e.group)
                    cols = [d for d in src.dims if d != src.major]
                    shape = (rows, src.extent(cols[-1]))
                    self.gl[e.name] = ir.GlobalBuffer(e.name, sp.dst.dtype, shape, _row_major_strides(shape), "in")
                    break
        if e.name not in self.gl:
            out = self.output.tensor
            shape = tuple(out.extent(d) for d in self.extra_dims(e))
            self.gl[e.name] = ir.GlobalBuffer(e.name, self.out_dtype, shape, _row_major_strides(shape), "in")
        return self.gl[e.name]

    def workspace(self, buf: ir.GlobalBuffer) -> ir.GlobalBuffer:
        """Register a workspace the program allocates (zero-filled) for its launches."""
        if buf not in self.extra_workspaces:
            self.extra_workspaces.append(buf)
        return buf

    # ------------------------------------------------------------------ the program

    def program(self) -> ir.Program:
        inputs = [self.gbuf(t) for t in self.spec.inputs if t.memory == GL and not t.tensor.workspace]
        inputs += [self.extra_buf(e) for e in self.extras]
        out = self.gbuf(self.output)
        side = tuple(self.gbuf(t) for t in self.side_outputs)
        ws = [b for b in self.gl.values() if b.role == "workspace"] + self.extra_workspaces
        return ir.Program(tuple(self.kernels), tuple(inputs), out, tuple(ws), side)


class KernelBuilder:
    """One launch being built: block size, grid, shared memory, registers, parameters."""

    def __init__(self, pb: ProgramBuilder, name: str):
        self.pb = pb
        self.target = pb.target
        self.name = name
        self.shared: dict[str, ir.SharedBuffer] = {}
        self.regs: dict[str, ir.RegBuffer] = {}
        self._read: list = []
        self._written: list = []
        self.threads = 0
        self.grid = (1, 1, 1)
        self.cluster = 1
        self.min_blocks_per_sm = 1

    # ------------------------------------------------------------------ registers, shared memory

    def reg(self, name: str, dt: DType, size: int) -> ir.RegBuffer:
        """The register array ``name`` of at least ``size`` elements of ``dt`` (grown, or retyped,
        when asked again)."""
        b = self.regs.get(name)
        if b is None or b.size < size or b.dtype != dt:
            b = ir.RegBuffer(name, dt, size if b is None else max(b.size, size))
            self.regs[name] = b
        return b

    def shared_buf(self, name: str, dt: DType, size: int, align: int = 128, note: str = "") -> ir.SharedBuffer:
        if name not in self.shared:
            self.shared[name] = ir.SharedBuffer(name, dt, size, align, note)
        return self.shared[name]

    def mbarrier(self, name: str, count: int, note: str = "") -> ir.MBarrier:
        if name not in self.shared:
            self.shared[name] = ir.MBarrier(name, count, note=note)
        return self.shared[name]

    def add_shared(self, buf: ir.SharedBuffer) -> ir.SharedBuffer:
        self.shared[buf.name] = buf
        return buf

    # ------------------------------------------------------------------ parameters

    def param(self, buf, *, write: bool = False):
        """Note that the kernel reads (or writes) global buffer or tensor map ``buf``."""
        lst = self._written if write else self._read
        if buf not in lst:
            lst.append(buf)
        return buf

    def gbuf(self, tile, *, write: bool = False) -> ir.GlobalBuffer:
        return self.param(self.pb.gbuf(tile), write=write)

    def extra_buf(self, e) -> ir.GlobalBuffer:
        return self.param(self.pb.extra_buf(e))

    def params(self) -> tuple:
        written = [b for b in self._written]
        return tuple([b for b in self._read if b not in written] + written)

    def build(self, body, header: str = "") -> ir.Kernel:
        return ir.Kernel(self.name, self.params(), tuple(self.grid), self.threads, tuple(self.shared.values()),
                         tuple(self.regs.values()), body, header=header, min_blocks_per_sm=self.min_blocks_per_sm,
                         cluster=self.cluster)
