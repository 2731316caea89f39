"""The kernel IR: what a checked schedule lowers to, and what both back ends read.

A ``Program`` is one or more ``Kernel`` launches over global buffers.  A kernel body is a tree of
statements over three kinds of storage:

* ``GlobalBuffer`` — a kernel parameter (row-major, strides in elements), or a workspace;
* ``SharedBuffer`` — a block's shared memory, a flat array of elements (its swizzle is already in
  the index expressions that address it);
* ``RegBuffer`` — a per-thread register array of ``size`` elements, indexed only by expressions
  that are compile-time constants once unrolled loops are unrolled.

Statements: ``Seq``, ``For`` (serial or unrolled), ``If`` (a predicate; it may diverge between
threads — the interpreter masks, the printer branches), ``AtomCall`` (one hardware atom issued by
its thread group), ``Barrier``, ``AsyncCommit``/``AsyncWait`` (cp.async groups), ``RegFill``
(set registers to a constant), ``Pointwise`` (one element-wise scalar op on registers),
``Comment``, and ``Roles`` (warp specialization: thread ranges running different bodies).
The leaf statements carry an ``Origin`` (the schedule node whose lowering emitted them, for
hazard messages); it takes no part in equality and the printer ignores it.

Index expressions are ints or ``expr.Expr``; thread and block indices are the variables
``TID``, ``BID_X``, ``BID_Y``, ``BID_Z`` below, loop indices are the loops' own ``Var``.

Hopper (sm_90a) additions, used by the atoms of ``hardware.atoms.sm90a``:

* ``TensorMapParam`` — a kernel parameter that is a TMA descriptor (``CUtensorMap``) of a
  ``GlobalBuffer`` of rank 1 to 5 (2-D matrices, 3-D batches of them); the printer declares it
  ``const __grid_constant__ CUtensorMap``, the interpreter reads and writes the underlying buffer
  through it;
* ``MBarrier`` — a ``SharedBuffer`` of ``size`` mbarrier objects, 8 bytes each;
* ``DescRef`` — binds a wgmma descriptor operand: a shared buffer, an element offset, the swizzle
  and the LBO/SBO of the canonical layout; printed as the 64-bit descriptor computed at run time
  from the shared address;
* ``Scalar`` — binds a 32-bit value operand (a TMA coordinate, an mbarrier count or parity,
  wgmma's ``scale_d``) to an index expression.
"""

from __future__ import annotations

from typing import Union

import attrs

from ..dtypes import DType, f64, u8
from ..hardware.atoms.base import Atom
from ..hardware.descriptors import DESCRIPTOR_MODE
from ..hardware.tma import tma_box_problems
from .expr import IntExpr, Var


def _tuple(x):
    return tuple(x)


# --------------------------------------------------------------------------- storage

@attrs.frozen
class GlobalBuffer:
    """A kernel argument in global memory (or a workspace the program allocates)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]          # elements
    role: str = "in"                  # "in" | "out" | "inout" | "workspace"
    align: int = 16                   # bytes the base pointer must be aligned to
    # a workspace blocks hand to each other (stream-K's partial tiles): the interpreter checks that
    # a block reads another's elements only after acquiring a flag that block released after them
    exchange: bool = False
    # a workspace that must hold zeros before the first launch (stream-K's flags; each launch
    # leaves them zero again)
    zeroed: bool = False

    @property
    def size(self) -> int:
        """Elements spanned (max offset + 1)."""
        if any(s == 0 for s in self.shape):
            return 0
        return 1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides))


@attrs.frozen
class SharedBuffer:
    """A block's shared-memory array of ``size`` elements, aligned to ``align`` bytes.

    ``alias``, where set, names another buffer of the kernel whose bytes this one occupies from
    their start (same element type, at most its size): it takes no bytes of its own.  A rule
    asks for that only where the other buffer is dead for the accesses it makes (an epilogue's
    staging in operand rows the warpgroup has finished reading); the interpreter gives both names
    the same elements and their access history, so a use that overlaps a live one is a hazard."""

    name: str
    dtype: DType
    size: int
    align: int = 128
    note: str = ""                    # e.g. "4 stages x 128x32, Sw<3,3,3>"
    alias: str = attrs.field(default="", kw_only=True)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.bits // 8


@attrs.frozen
class RegBuffer:
    """A per-thread register array of ``size`` elements."""

    name: str
    dtype: DType
    size: int


@attrs.frozen
class MBarrier(SharedBuffer):
    """``size`` mbarrier objects in shared memory, 8 bytes each (aligned to 8).

    A ``SharedBuffer`` so that it is laid out, declared and addressed like one (``MemRef(bar, i)``
    is barrier ``i``); its dtype (f64) only gives the 8-byte storage, the content is opaque and
    only the mbarrier atoms may touch it."""

    size: int = 1
    dtype: DType = attrs.field(default=f64, kw_only=True)
    align: int = attrs.field(default=8, kw_only=True)
    note: str = attrs.field(default="", kw_only=True)


@attrs.frozen
class TensorMapParam:
    """A kernel parameter holding the TMA descriptor of ``buffer`` (rank 1 to 5, its innermost
    dimension contiguous): boxes of ``box`` elements, one extent per dimension, outermost first
    (``(rows, cols)`` of a matrix, ``(1, rows, cols)`` of a (batch, rows, cols) tensor), ``swizzle``
    bytes (0, 32, 64, 128) of shared-memory swizzle, out-of-bounds elements read as zeros.  The
    atoms that use it take as many coordinates as it has dimensions (``tma_load_2d`` two,
    ``tma_load_3d`` three), innermost first.

    The host encodes it (``runtime.encode_tensor_map``) for the array passed as ``buffer``;
    ``buffer`` itself need not be a kernel parameter.

    4-bit elements (int4 codes, two a byte) are moved as bytes: the map the hardware sees is one
    of bytes (``hardware_view``), and its innermost coordinate counts bytes, ``unit`` = 2
    elements each; ``box`` and ``buffer`` stay in elements (an even innermost extent)."""

    name: str
    buffer: GlobalBuffer
    box: tuple[int, ...] = attrs.field(converter=_tuple)
    swizzle: int = 0

    def __attrs_post_init__(self):
        b = self.buffer
        if not isinstance(b, GlobalBuffer) or not 1 <= len(b.shape) <= 5:
            raise ValueError(f"TensorMapParam {self.name!r}: buffer must be a GlobalBuffer of 1 to 5 dimensions "
                             f"(a 2-D matrix, a 3-D batch of matrices...), not {b!r}")
        if len(self.box) != len(b.shape):
            raise ValueError(f"TensorMapParam {self.name!r}: the box {self.box} is {len(self.box)}-D but buffer "
                             f"{b.name} is {len(b.shape)}-D (shape {b.shape}); give one box extent per dimension, "
                             f"outermost first (e.g. (1, rows, cols) for one matrix of a batch)")
        if b.dtype.bits % 8 and (b.dtype.bits != 4 or b.shape[-1] % 2 or self.box[-1] % 2 or self.swizzle):
            raise ValueError(f"TensorMapParam {self.name!r}: TMA moves {b.dtype} elements as bytes: an even "
                             f"innermost extent and box, no swizzle (shape {b.shape}, box {self.box}, "
                             f"swizzle {self.swizzle})")
        dt, shape, strides, box = self.hardware_view()
        problems = tma_box_problems(dt.bits // 8, shape, strides, box, self.swizzle)
        if problems:
            raise ValueError(f"TensorMapParam {self.name!r}: " + "; ".join(problems))

    @property
    def unit(self) -> int:
        """Elements per unit of the innermost coordinate: 2 for 4-bit elements (bytes), else 1."""
        return 2 if self.buffer.dtype.bits == 4 else 1

    def hardware_view(self) -> tuple:
        """``(dtype, shape, strides in bytes, box)`` of the map the hardware is given: the
        buffer's own, or for 4-bit elements the same memory as bytes (``unit`` elements each)."""
        b, u = self.buffer, self.unit
        if u == 1:
            eb = b.dtype.bits // 8
            return b.dtype, tuple(b.shape), tuple(s * eb for s in b.strides), tuple(self.box)
        return (u8, tuple(b.shape[:-1]) + (b.shape[-1] // u,), tuple(s // u for s in b.strides[:-1]) + (1,),
                tuple(self.box[:-1]) + (self.box[-1] // u,))

    @property
    def dtype(self) -> DType:
        return self.buffer.dtype

    @property
    def rank(self) -> int:
        """The number of dimensions of the map (and of coordinates its atoms take)."""
        return len(self.buffer.shape)

    @property
    def box_bytes(self) -> int:
        """Bytes one box moves (what an mbarrier's expect_tx counts for a load): the whole box,
        out-of-bounds elements included."""
        n = 1
        for x in self.box:
            n *= int(x)
        return n * self.buffer.dtype.bits // 8


@attrs.frozen
class DescRef:
    """A wgmma matrix-descriptor operand: the operand tile starts at element ``offset`` of the
    shared ``buffer`` and is laid out canonically with ``swizzle`` (bytes: 0, 32, 64, 128) and
    leading / stride byte offsets ``lbo`` / ``sbo`` (see ``hardware.atoms.sm90a``)."""

    buffer: SharedBuffer
    offset: IntExpr
    swizzle: int = 0
    lbo: int = 0
    sbo: int = 0

    def __attrs_post_init__(self):
        if self.swizzle not in DESCRIPTOR_MODE:
            raise ValueError(f"DescRef: swizzle={self.swizzle!r}; allowed: 0, 32, 64, 128 (bytes)")
        for name in ("lbo", "sbo"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v % 16 or v >= 1 << 18:
                raise ValueError(f"DescRef: {name}={v!r} must be an int multiple of 16 in [0, 2**18)")


@attrs.frozen
class Scalar:
    """A 32-bit value operand (bound with the ``"r"`` constraint) equal to ``value``."""

    value: IntExpr


Buffer = Union[GlobalBuffer, SharedBuffer, RegBuffer]


@attrs.frozen
class MemRef:
    """An element offset into a global or shared buffer."""

    buffer: GlobalBuffer | SharedBuffer
    offset: IntExpr


@attrs.frozen
class RegRef:
    """The registers of ``buffer`` starting at element ``offset``."""

    buffer: RegBuffer
    offset: IntExpr


# --------------------------------------------------------------------------- provenance

@attrs.frozen(eq=False)
class Origin:
    """Where a statement comes from: the schedule node whose lowering emitted it.

    The lowering stamps every leaf statement a rule returns (``Lowerer.lower``): the innermost node
    wins, so an ldmatrix names the ``Move<warp>`` a ``move_to_regs`` made, and a barrier the
    pipeline places names the node whose pipelined loop it belongs to.  The interpreter reads it to
    say which strategy and which tile a hazard is in (``simulate.messages``); the printer ignores
    it, and statements compare equal whatever their origin.

    * ``path``: the schedule nodes being lowered, the launch's block node first, the emitting node
      last (nodes are opaque to the IR);
    * ``coords``: ``(loop var, unit, index expr)`` of the loops mapped onto units around the node
      (blocks, warpgroups, warps, threads): which unit a thread is, in the schedule's loop names;
    * ``tiles``: ``(operand, ((dim, start, extent), ...))`` of the node's operands: where its tiles
      start (absolute for global tensors, in the tensor's frame on chip), as index expressions.
    """

    path: tuple = ()
    coords: tuple = ()
    tiles: tuple = ()

    @property
    def node(self):
        """The schedule node that emitted the statement."""
        return self.path[-1] if self.path else None

    def map(self, expr) -> "Origin":
        """The same origin with every index expression ``x`` replaced by ``expr(x)`` (what a
        rewrite of the statement did to its own expressions)."""
        return Origin(self.path, tuple((v, u, expr(x)) for v, u, x in self.coords),
                      tuple((name, tuple((d, expr(x), n) for d, x, n in dims)) for name, dims in self.tiles))


def _origin():
    return attrs.field(default=None, eq=False, repr=False, kw_only=True)


# --------------------------------------------------------------------------- statements

@attrs.frozen
class Seq:
    body: tuple = attrs.field(converter=_tuple)


@attrs.frozen
class For:
    """``for var in range(extent)``; ``unroll`` loops are fully unrolled (their variable may index
    registers).  ``var.extent`` equals ``extent``.

    ``stop`` (not with ``unroll``) ends the loop early: iterations ``var < min(extent, stop)``
    run.  It must be the same for every thread that runs the loop (barriers sit inside it); the
    causal key loop of attention stops at the diagonal this way.  ``extent`` stays the bound
    expressions are simplified under."""

    var: Var
    extent: int
    body: object
    unroll: bool = False
    stop: IntExpr | None = None


#: how a guarded COPY load is written (``AtomCall.guard``)
GUARDS = ("branch", "predicate")


@attrs.frozen
class If:
    """Run ``then`` where ``cond`` is non-zero.  The condition may differ between threads."""

    cond: IntExpr
    then: object


@attrs.frozen
class AtomCall:
    """Issue ``atom`` with its operands bound.

    ``args`` maps each operand name of the atom to a ``RegRef`` (register operands) or a
    ``MemRef`` (address operands; for collective atoms such as ldmatrix, each thread's own
    address).  ``pred`` disables the access where zero: a disabled COPY load writes zeros to its
    registers, a disabled CP_ASYNC writes zeros to shared memory (zero-fill), a disabled store
    writes nothing; ``pred`` must be uniform within the atom's thread group for MMA and LDMATRIX.
    ``src_bytes`` (CP_ASYNC only): the bytes an enabled copy reads, the rest of its chunk
    zero-filled (``cp.async``'s ``src-size``; None: the whole chunk) — a chunk that reaches past
    the end of what it may read::

        chunk:  | b0 b1 ... b9 | b10 .. b15 |      src_bytes = 10
                  read           zero-filled

    ``guard`` (a COPY load into registers under a ``pred`` other than 1): how the CUDA source
    writes the test — the same semantics either way, a different program for ptxas to schedule::

        "branch":     if (pred) { ld.global ... } else { regs = 0; }
        "predicate":  { setp.ne p, pred, 0; mov regs, 0; @p ld.global ...; }    (one asm statement)

    ptxas may keep a branch's load after the arithmetic of the loads before it (a second trip to
    memory); under a PTX predicate it issues the load with the others.  Which is faster differs
    by kernel: ``done(guard=...)`` chooses it for a leaf's loads.
    """

    atom: Atom
    args: tuple[tuple[str, MemRef | RegRef], ...] = attrs.field(converter=_tuple)
    pred: IntExpr = 1
    comment: str = ""
    origin: Origin | None = _origin()
    src_bytes: IntExpr | None = attrs.field(default=None, kw_only=True)
    guard: str = attrs.field(default="branch", kw_only=True, validator=attrs.validators.in_(GUARDS))

    def arg(self, name: str):
        for n, v in self.args:
            if n == name:
                return v
        raise KeyError(f"{self.atom.name}: no argument {name!r}")


@attrs.frozen
class Barrier:
    """``bar.sync 0``: every thread of the block waits; shared memory written before is visible.

    With ``threads`` > 0 it is the named barrier ``bar.sync bar_id, threads``: only the ``threads``
    threads (whole warps) that execute it with the same ``bar_id`` (1..15; 0 is ``__syncthreads``)
    wait for each other, e.g. the 128 threads of one warpgroup inside a warp-specialized role.
    ``bar_id`` may be an index expression (``1 + warpgroup``: one barrier per warpgroup).

    With ``arrive`` it is ``bar.arrive bar_id, threads``: the calling threads count towards the
    barrier's ``threads`` without waiting for it (a signal to the threads that ``bar.sync`` on it:
    consumer warpgroups passing the turn to issue their MMAs, ``warp_specialize(pingpong=True)``).
    """

    comment: str = ""
    bar_id: IntExpr = 0
    threads: int = 0
    arrive: bool = False
    origin: Origin | None = _origin()


@attrs.frozen
class Role:
    """Threads ``first`` .. ``first + count - 1`` of the block run ``body`` (see ``Roles``).

    Inside ``body`` the variable ``role_tid(count)`` (``rtid``) is the thread's index within the
    role, ``tid - first``: index expressions over it stay provably non-negative, so they simplify.
    ``groups`` > 1: the role's threads run ``body`` as that many equal groups that do not keep in
    step with each other (consumer warpgroups taking turns through named barriers); the printed
    code is the same, the interpreter runs each group as a role of its own.
    """

    name: str
    first: int
    count: int
    body: object
    groups: int = 1


@attrs.frozen
class Roles:
    """Warp specialization: disjoint, warp-aligned thread ranges of the block run different code,
    e.g. a producer warpgroup issuing TMA and consumer warpgroups issuing wgmma.

    The roles synchronise only through mbarriers and named barriers; a block-wide ``Barrier``
    inside a role is an error.  The printer emits an ``if``/``else if`` chain on the thread index;
    the interpreter runs each role as its own lockstep group and switches between them when one
    waits on an mbarrier phase that has not completed.
    """

    roles: tuple = attrs.field(converter=_tuple)


@attrs.frozen
class AsyncCommit:
    """``cp.async.commit_group``: close the calling thread's open group of async copies."""

    origin: Origin | None = _origin()


@attrs.frozen
class AsyncWait:
    """``cp.async.wait_group pending``: wait until at most ``pending`` of the calling thread's
    committed groups are still in flight."""

    pending: int
    origin: Origin | None = _origin()


@attrs.frozen
class RegFill:
    """Set ``count`` registers from ``ref`` on to ``value``."""

    ref: RegRef
    count: int
    value: float = 0.0
    origin: Origin | None = _origin()


@attrs.frozen
class Pointwise:
    """``dst = op(*srcs)`` on one element; srcs are ``RegRef`` or float constants.

    ``op`` names an entry of ``firesched.ops.SCALAR_OPS`` (add, mul, max, relu, gelu, sigmoid,
    tanh, cvt).  ``cvt`` converts between the register dtypes of src and dst (rounding to nearest
    even), everything else computes in the dtype of dst.
    """

    op: str
    dst: RegRef
    srcs: tuple = attrs.field(converter=_tuple)
    origin: Origin | None = _origin()


@attrs.frozen
class Comment:
    text: str


Stmt = Union[Seq, For, If, Roles, AtomCall, Barrier, AsyncCommit, AsyncWait, RegFill, Pointwise, Comment]

# Thread and block indices.  Block size and grid size bound them per kernel; the lowering binds
# fresh Vars with the right extents, but the names below are the ones the back ends know.
TID_NAME = "tid"
BID_NAMES = ("bid_x", "bid_y", "bid_z")


ROLE_TID_NAME = "rtid"


def role_tid(count: int) -> Var:
    """The thread index within the enclosing ``Role`` (0 .. count-1)."""
    return Var(ROLE_TID_NAME, count)


def tid(threads: int) -> Var:
    return Var(TID_NAME, threads)


def bid(axis: int, extent: int) -> Var:
    return Var(BID_NAMES[axis], extent)


@attrs.frozen
class Kernel:
    """One launch: ``grid`` blocks of ``threads`` threads; ``params`` in signature order (global
    buffers, and ``TensorMapParam`` descriptors on sm_90a).  With ``cluster`` = C > 1, blocks
    ``C*i .. C*i + C-1`` along x form a thread-block cluster (``__cluster_dims__(C, 1, 1)``; the
    block's rank in its cluster is ``blockIdx.x % C``)."""

    name: str
    params: tuple[GlobalBuffer, ...] = attrs.field(converter=_tuple)
    grid: tuple[int, int, int] = attrs.field(converter=_tuple)
    threads: int = 128
    shared: tuple[SharedBuffer, ...] = attrs.field(default=(), converter=_tuple)
    regs: tuple[RegBuffer, ...] = attrs.field(default=(), converter=_tuple)
    body: object = None
    header: str = ""                 # text printed as a comment on top (the schedule tree)
    min_blocks_per_sm: int = 1
    cluster: int = 1                 # blocks per thread-block cluster, along x (grid[0] a multiple of it)
    # launched programmatically (PDL): it may start before the kernel before it (in the program; for
    # the first kernel, the launch before the program on the stream) has finished, and must wait
    # (griddep_wait) before touching any buffer that one may have touched
    programmatic: bool = False

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory the launch needs (buffers laid out in order, each aligned)."""
        return shared_bytes(self.shared)

    def shared_offsets(self) -> dict[str, int]:
        """Byte offset of each shared buffer: in order, each at its alignment; an alias at the
        offset of the buffer it names."""
        off, out = 0, {}
        for b in self.shared:
            if b.alias:
                continue
            off = -(-off // b.align) * b.align
            out[b.name] = off
            off += b.nbytes
        for b in self.shared:
            if b.alias:
                if b.alias not in out:
                    raise ValueError(f"kernel {self.name}: shared buffer {b.name!r} aliases {b.alias!r}, which is not "
                                     f"one of its own shared buffers ({', '.join(sorted(out)) or 'none'}); name one "
                                     f"of those, or drop alias=")
                out[b.name] = out[b.alias]
        return out


def shared_bytes(buffers) -> int:
    """Bytes of shared memory ``buffers`` take when laid out in order, each at its alignment
    (an alias takes none)."""
    off = 0
    for b in buffers:
        if not b.alias:
            off = -(-off // b.align) * b.align + b.nbytes
    return off


@attrs.frozen
class Program:
    """Kernels launched in order over the same arguments.

    ``inputs`` and ``output`` are the user-visible global buffers, in the order
    ``firesched.interpret``/``compile(...)(...)`` take them (output last; ``side_outputs``, the
    other results of a fused spec such as a norm's per-row statistics, after it); ``workspaces``
    are allocated by the runtime (zero-filled) and passed where kernels name them.
    """

    kernels: tuple[Kernel, ...] = attrs.field(converter=_tuple)
    inputs: tuple[GlobalBuffer, ...] = attrs.field(converter=_tuple)
    output: GlobalBuffer = None
    workspaces: tuple[GlobalBuffer, ...] = attrs.field(default=(), converter=_tuple)
    side_outputs: tuple[GlobalBuffer, ...] = attrs.field(default=(), converter=_tuple)

    @property
    def outputs(self) -> tuple[GlobalBuffer, ...]:
        """Every result, the output first."""
        return ((self.output,) if self.output is not None else ()) + self.side_outputs


__all__ = ["Origin", "GlobalBuffer", "SharedBuffer", "RegBuffer", "MBarrier", "TensorMapParam", "DescRef", "Scalar", "Buffer", "MemRef", "RegRef", "Seq", "For", "If", "GUARDS", "AtomCall", "Barrier", "Role", "Roles", "AsyncCommit", "AsyncWait", "RegFill", "Pointwise", "Comment", "Stmt", "TID_NAME", "BID_NAMES", "ROLE_TID_NAME", "role_tid", "tid", "bid", "Kernel", "shared_bytes", "Program"]
