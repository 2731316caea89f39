"""What a node is lowered *in*: the lowering context.

A rule turns one node of the schedule tree into kernel-IR statements.  It needs to know where the
tiles of its operands sit (``origin``: a coordinate expression per dimension, absolute for global
tensors, relative to the tile the tensor was created for — its *frame* — for shared and register
tensors), how far a global tensor extends from there (``limit``: what predicates the edges of
partial tiles; ``low``: where it starts, in a row's aligned window that begins before it), which
pipeline stage a staged shared tensor is in (``stage``), what the loop
variables mapped onto units stand for (``vars``), which threads execute the code (``scope``), and
which part of a pipelined loop is being emitted (``part``: the producer's copies, the consumers'
work, or both).

``Ctx`` is an immutable value: a rule that descends passes a changed copy.  ``Hoists`` is the one
mutable sink: statements a rule asks to place at the start of the enclosing block tile, right
before its epilogue, or at the end of the role (a bias preloaded while the K loop runs, a final
wait for asynchronous stores).
"""

from __future__ import annotations

import attrs

from .. import ir
from ..errors import InternalError, ScheduleError
from ..ir.expr import IntExpr, binop
from ..tensor import GL, RF, SH

PRODUCER, CONSUMER = "producer", "consumer"
#: the named barrier a warp-specialized role synchronises its own threads with (the consumers
#: staging a tile no ring fills): __syncthreads would wait for the other role too
ROLE_BARRIER = 15
#: a consumer warpgroup's own named barrier (warpgroup w uses WARPGROUP_BARRIER + w, ids 1..4):
#: its 128 threads wait for each other (a stage they read, the epilogue's staging buffer)
WARPGROUP_BARRIER = 1
#: the named barriers of consumer warpgroups taking turns to issue their MMAs (``pingpong``):
#: warpgroup w waits on PINGPONG_BARRIER + w (ids 8..11; the epilogue's are 1..4)
PINGPONG_BARRIER = 8


@attrs.frozen
class Scope:
    """The threads that execute a piece of code: ``threads`` of them, ``tid`` is the thread's
    index among them (``tid`` of the block, or ``rtid`` inside a role); ``elected`` when only one
    thread of the block runs it (TMA issue)."""

    threads: int
    tid: IntExpr
    elected: bool = False
    first: int = 0          # the scope's first thread in the block (roles start at 128, ...)


@attrs.define
class Hoists:
    """Statements rules place around the innermost block tile (see the module docstring)."""

    tile_start: list = attrs.field(factory=list)
    before_post: list = attrs.field(factory=list)
    scope_end: list = attrs.field(factory=list)


@attrs.frozen(eq=False)
class Ctx:
    origin: dict = attrs.field(factory=dict)     # (name, mem) -> {dim: expr}
    limit: dict = attrs.field(factory=dict)      # (name, "GL" | "RF") -> {dim: expr}
    # where a tensor starts, along the dims of a window that begins before it (``align``): an
    # element at a coordinate below it is outside the tensor (absent: 0, the tile's own start)
    low: dict = attrs.field(factory=dict)        # (name, mem) -> {dim: expr}
    # dim -> (the window's offset from the tensors' first element along it, -(vec - 1) .. 0; the
    # window's vector): on-chip tensors created inside the window hold its elements from there
    # (``align``)
    shift: dict = attrs.field(factory=dict)
    stage: dict = attrs.field(factory=dict)      # SH name -> stage expr
    vars: dict = attrs.field(factory=dict)       # loop var -> expr (loops mapped onto units)
    scope: Scope | None = None
    part: str | None = None                      # None | PRODUCER | CONSUMER
    staged: frozenset = frozenset()              # SH names the enclosing ring fills
    # the staged SH names a producer's pass issues (None: all; separate rings issue one at a time)
    issuing: frozenset | None = None
    ring: object = None                          # the enclosing pipeline ring
    # the ring of the copies a warp-specialized producer issues once per block tile, above the
    # pipelined loop (``transforms.tile_moves.TileRing``)
    tiles: object = None
    # pipeline(stages=S) over a persistent block's tile loop: the copies issued S - 1 tiles ahead
    # (``transforms.tile_prefetch.TileCopies``)
    tile_copies: object = None
    tile_index: IntExpr = 0                      # a persistent block's tile iteration
    hoists: Hoists | None = None
    hoist_node: object = None                    # the block-tile node whose lowering splices them
    specialized: bool = False                    # inside warp-specialized roles
    async_mma: bool = False                      # a pipeline fences, commits and retires async MMAs
    pingpong: int = 0                            # consumer warpgroups taking turns to issue MMAs
    # (row, col, diagonal) of causal masks this code needs not apply: a loop step wholly on the
    # visible side of the diagonal (``decompose.loop_visible``)
    unmasked: frozenset = frozenset()
    cluster: object = None                       # the launch's cluster (size, rank, clamp), if any
    stream: object = None                        # a stream-K launch's walk (``transforms.blocks.StreamK``)
    made_by: dict = attrs.field(factory=dict)    # dim -> the strategy whose tile set its extent
    spans: dict = attrs.field(factory=dict)      # unit loop var -> (thread stride, count)
    repeated: bool = False                       # inside a sequential loop (or a block's tile loop)
    units: tuple = ()                            # the unit-mapped loops (below the block) around the node
    # accumulator name -> its register copies of group partial products (``rules.partials``)
    partials: dict = attrs.field(factory=dict)

    def with_origin(self, key, dims: dict) -> "Ctx":
        o = dict(self.origin)
        o[key] = dims
        return attrs.evolve(self, origin=o)

    def with_limit(self, key, dims: dict) -> "Ctx":
        lim = dict(self.limit)
        lim[key] = dims
        return attrs.evolve(self, limit=lim)

    def with_low(self, key, dims: dict) -> "Ctx":
        low = dict(self.low)
        low[key] = dims
        return attrs.evolve(self, low=low)

    def bind(self, **vars_: IntExpr) -> "Ctx":
        v = dict(self.vars)
        v.update(vars_)
        return attrs.evolve(self, vars=v)


def key(tile) -> tuple[str, str]:
    """How a context knows a tensor: its name and memory."""
    return (tile.name, tile.memory.name)


def enter_global(ctx: Ctx, tile) -> Ctx:
    """A global tensor enters at origin 0 with its full extents as limits."""
    k = key(tile)
    ctx = ctx.with_origin(k, {d: 0 for d in tile.tensor.dims})
    return ctx.with_limit(k, {d: tile.tensor.extent(d) for d in tile.tensor.dims})


def frames(ctx: Ctx, specs) -> Ctx:
    """Zero-origin frames for the shared/register tensors first seen in ``specs``; a register
    tensor's extents are its limits (a thread's tile may pad past them: see ``RF_PADDED``), and
    so are a shared tensor's where a cluster splits a row into parts that reach past its end."""
    for sp in specs:
        for t in sp.operands:
            k = key(t)
            if t.memory != GL and k not in ctx.origin:
                ctx = ctx.with_origin(k, {d: 0 for d in t.tensor.dims})
                padded = any(t.extent(d) < t.tensor.extent(d) for d in t.tensor.dims)
                if t.memory == RF or (t.memory == SH and (padded or getattr(ctx.cluster, "dim", None) in t.tensor.dims)):
                    ctx = ctx.with_limit(k, _register_limits(ctx, t))
                shifted = {d: b for d, (b, _) in ctx.shift.items() if d in t.tensor.dims}
                if shifted:
                    ctx = _in_window(ctx, k, t, shifted)
    return ctx


def _in_window(ctx: Ctx, k, t, shifted: dict) -> Ctx:
    """An on-chip tensor created inside an aligned window (``align``): its element ``j`` along a
    shifted dim is the global tensors' element ``origin + j`` (the origin shifted back by the
    row's phase), so the row's elements are those from the global tensors' low bound ``-
    origin`` up to their limit ``- origin``::

        window:  | p elements of the row before | the row (cols elements) | the rest of the window |
                 j = 0                          j = -shift = p            j = cols + p

    (for a cluster's part of the row, ``lower.rules.align``, the part's own first and last
    elements bound it instead)."""
    lim = dict(ctx.limit.get(k, {d: t.extent(d) for d in t.tensor.dims}))
    low = {}
    for d in shifted:
        g = next((g for g, o in ctx.origin.items() if g[1] == "GL" and d in o and d in ctx.limit.get(g, {})), None)
        if g is None:
            raise InternalError(f"no global tensor in scope bounds the aligned dim {d} of {t.name}")
        # the window starts at the global tensor's (shifted) origin: its element j is the global
        # tensor's element origin + j, inside from the tensor's low bound up to its limit
        o = ctx.origin[g][d]
        lim[d] = ctx.limit[g][d] - o
        low[d] = ctx.low.get(g, {}).get(d, 0) - o
    return ctx.with_limit(k, lim).with_low(k, low)


def _register_limits(ctx: Ctx, t) -> dict:
    """An on-chip tensor's limits: its extents, except along the dim a thread-block cluster
    splits, where the last block's part may reach past the row — that block's elements end where
    the global tensors' tightened limit does::

        row of 40,001 over 8 blocks of 5,001:   block 7 holds 40,001 - 7·5,001 = 3,994 elements
    """
    lim = {d: t.extent(d) for d in t.tensor.dims}     # a padded shared buffer's tile ends before it
    cl = ctx.cluster
    d = getattr(cl, "dim", None)
    if d not in lim:
        return lim
    for k, o in ctx.origin.items():
        gl = ctx.limit.get(k, {}).get(d)
        if k[1] != "GL" or d not in o or gl is None:
            continue
        # a row a whole number of parts long leaves every block's part whole
        if not (isinstance(gl, int) and gl % lim[d] == 0):
            lim[d] = binop("min", lim[d], gl - o[d])
        break
    return lim


def scope_barrier(ctx: "Ctx", comment: str) -> ir.Barrier:
    """A barrier over the threads that run this code: the block's ``__syncthreads``, or inside a
    role of a warp-specialized kernel a named barrier over the role's threads."""
    if ctx.specialized and ctx.scope is not None:
        return ir.Barrier(comment, bar_id=ROLE_BARRIER, threads=ctx.scope.threads)
    return ir.Barrier(comment)


def err(node_or_spec, msg: str, **kw) -> ScheduleError:
    """A ``ScheduleError`` about the spec of ``node_or_spec`` (a node or a spec)."""
    spec = getattr(node_or_spec, "spec", node_or_spec)
    return ScheduleError(msg, spec=spec, **kw)
