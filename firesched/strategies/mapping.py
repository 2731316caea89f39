"""``to(level)`` and its short forms: map the loops a ``tile`` just created onto parallel units.

::

    MatMul<kernel>(... C:GL[4096x4096])                 MatMul<kernel>(... C:GL[4096x4096])
      tile(m=128, n=128)                       ==>        tile(m=128, n=128) >> to_blocks()
      for m0 in seq(32), n0 in seq(32):                   for m0 in block(32), n0 in block(32):
        MatMul<kernel>(... C:GL[128x128])                   MatMul<block>(... C:GL[128x128])

Units are linearised row-major over the mapped loops (the last loop varies fastest): blocks
``n`` → ``blockIdx.x``; warps ``w = wm * WN + wn``.
"""

from __future__ import annotations

import attrs

from .. import ops as fops
from ..errors import ScheduleError
from ..schedule import Node
from ..spec import Fused, MatMul, Reduce
from ..tensor import BLOCK, GL, KERNEL, THREAD, WARP, WARPGROUP, Level, Tensor, Tile
from .base import Strategy, record

#: Blocks per thread-block cluster that ``to_blocks(cluster=...)`` accepts: a MatMul's clusters of 2
#: or 4 share the operand that does not depend on the clustered dim through TMA multicast (B along
#: m, A along n); a reduction split over
#: a cluster's blocks combines their parts through distributed shared memory (8: the largest
#: portable cluster).
CLUSTER_SIZES = (1, 2, 3, 4, 5, 6, 7, 8)
MATMUL_CLUSTER_SIZES = (1, 2, 4)
EXCHANGES = ("barrier", "push")    # how a cluster's blocks hand each other a split reduction's parts

# Which level a spec must be at for its loops to map onto units of ``to``.
_FROM = {
    BLOCK: (KERNEL,),
    WARPGROUP: (BLOCK,),
    WARP: (BLOCK, WARPGROUP),
    THREAD: (WARP, BLOCK, WARPGROUP),
}


@attrs.frozen(repr=False)
class to(Strategy):
    """``to(level, arrangement, ...)``: map the unmapped loops of the ``tile`` just applied onto
    parallel units of ``level``; the focus moves to that level.  Written through its short forms
    ``to_blocks``, ``to_warpgroups``, ``to_warps`` and ``to_threads``, right after a tile::

        MatMul<block>(A:SH f16[128x32], B:SH f16[32x128], C:RF f32[128x128]) acc f32
          tile(m=64, n=64) >> to_warps(2, 2)
          for m1 in warp(2), n1 in warp(2):
            MatMul<warp>(A:SH f16[64x32], B:SH f16[32x64], C:RF f32[64x64]) acc f32   <- focus

    Loops over a MatMul's reduction dimension stay sequential (``split_k`` splits it); a
    ``Reduce`` may map its reduced dimensions (the partial results are combined by the store).

    * ``level``: ``Level.BLOCK`` (from a kernel-level focus), ``Level.WARPGROUP`` (from a block),
      ``Level.WARP`` (from a block or warpgroup), ``Level.THREAD`` (from a warp, warpgroup or
      block).
    * ``arrangement``: the unit counts per mapped loop, checked against the tiling (e.g. ``(2, 2)``:
      2 along m, 2 along n); empty to accept what the tile gives.  At most 32 warps and 1,024
      threads per block.
    * ``group``, ``persistent``, ``cluster``, ``occupancy``, ``reverse``, ``cluster_along``: block
      order and launch options, for ``Level.BLOCK`` only (see ``to_blocks``).
    """

    level: Level
    arrangement: tuple[int, ...] = ()
    group: int = 1
    persistent: bool = False
    cluster: int = 1
    occupancy: int = 1
    reverse: bool = False
    cluster_along: str | None = None
    exchange: str = "barrier"

    def apply(self, sched):
        path = sched.focus_path()
        focus = path[-1]
        if not isinstance(self.level, Level) or self.level not in _FROM:
            bad_level = True
        else:
            bad_level = False
        if not isinstance(self.arrangement, tuple):
            raise ScheduleError("an arrangement is a tuple of unit counts", strategy=self, spec=focus.spec,
                                field="arrangement", value=self.arrangement, allowed="e.g. (2, 2)")
        if bad_level:
            raise ScheduleError("cannot map loops onto this level", strategy=self, spec=focus.spec,
                                field="level", value=self.level,
                                allowed="Level.BLOCK, Level.WARPGROUP, Level.WARP, Level.THREAD")
        if len(path) < 2 or not path[-2].loops or focus is not path[-2].body[-1]:
            raise ScheduleError("there are no loops to map: to(...) follows a tile(...)", strategy=self,
                                spec=focus.spec, fix="write tile(m=..., n=...) >> " + str(self))
        parent = path[-2]
        spec = focus.spec
        # a MatMul splits its reduction with split_k; a Reduce may map its reduced dims onto units
        # (each unit reduces a part; the store of the accumulator combines the parts)
        red = set(spec.reduction_dims) if isinstance(spec, MatMul) else set()
        loops = [lp for lp in parent.loops if lp.unit is None and lp.dim not in red]
        if not loops:
            raise ScheduleError("the last tile created no unmapped loops over dimensions the focus keeps "
                                f"(its reduction dims {sorted(red)} are split with split_k)", strategy=self,
                                spec=parent.spec, fix="tile(m=..., n=...) before mapping")
        # a Reduce's reduced dim tiled onto blocks: partial results and a second launch (_partials),
        # or one launch whose cluster combines them (cluster=); a fused spec's reductions must
        # stay within a cluster (no part of it can wait for a second launch)
        splits = _reduced_dims(spec) if self.level == BLOCK else ()
        across = [lp for lp in loops if lp.dim in splits]
        if len(across) > 1:
            raise ScheduleError("a reduction across blocks splits one reduced dimension into parts "
                                f"({', '.join(lp.dim for lp in across)} were tiled onto blocks)",
                                strategy=self, spec=spec, field="level", value=str(self.level),
                                fix="tile one reduced dim onto blocks, and reduce the others inside each block")
        if spec.level not in _FROM[self.level]:
            raise ScheduleError(f"loops of a {spec.level}-level spec cannot map onto {self.level}s",
                                strategy=self, spec=spec, field="level", value=str(self.level),
                                allowed=", ".join(str(x) for x in _FROM[self.level]) + " specs",
                                fix=_fix_for(spec.level, self.level))
        counts = tuple(lp.count for lp in loops)
        if self.arrangement:
            for a in self.arrangement:
                if isinstance(a, bool) or not isinstance(a, int) or a <= 0:
                    raise ScheduleError("an arrangement holds positive ints", strategy=self, spec=spec,
                                        field="arrangement", value=self.arrangement)
            if tuple(self.arrangement) != counts:
                dims = ", ".join(f"{lp.dim}: {lp.count} tiles" for lp in loops)
                raise ScheduleError(
                    f"the arrangement does not match the tiling ({dims})", strategy=self, spec=parent.spec,
                    field="arrangement", value=self.arrangement, allowed=str(counts),
                    fix="choose tile sizes that divide the spec into exactly that many tiles per dim")
        n_units = 1
        for c in counts:
            n_units *= c
        if self.level == WARP:
            others = _mapped_warps(path[:-1])
            if n_units * others > 32:
                raise ScheduleError(f"{n_units * others} warps per block; a block holds at most 32",
                                    strategy=self, spec=spec, field="warps", value=n_units * others,
                                    allowed="<= 32", fix="use larger warp tiles")
        if self.level == THREAD and n_units > 1024:
            raise ScheduleError(f"{n_units} threads; a block holds at most 1024", strategy=self, spec=spec,
                                field="threads", value=n_units, allowed="<= 1024")
        if isinstance(self.group, bool) or not isinstance(self.group, int) or self.group < 1:
            raise ScheduleError("group must be a positive int", strategy=self, spec=spec, field="group",
                                value=self.group, allowed=">= 1 (1 = row-major block order)")
        if self.group > 1 and self.level != BLOCK:
            raise ScheduleError("grouped block order orders blocks: it belongs to to_blocks()", strategy=self,
                                spec=spec, field="group", value=self.group, fix="tile(m=..., n=...) >> to_blocks(group=8)")
        if self.group > 1 and len(loops) < 2:
            raise ScheduleError("grouped block order needs two loops mapped to blocks (rows of tiles, then "
                                "columns: m and n for a MatMul)", strategy=self,
                                spec=spec, field="group", value=self.group, fix="tile(m=..., n=...) >> to_blocks(group=8)")
        if not isinstance(self.persistent, bool) or (self.persistent and self.level != BLOCK):
            raise ScheduleError("persistent is a bool, and only blocks can be persistent", strategy=self,
                                spec=spec, field="persistent", value=self.persistent,
                                allowed="True with to_blocks(...), else False")
        if isinstance(self.cluster, bool) or not isinstance(self.cluster, int) or self.cluster not in CLUSTER_SIZES:
            raise ScheduleError("cluster is the number of blocks per thread-block cluster", strategy=self, spec=spec,
                                field="cluster", value=self.cluster,
                                allowed=", ".join(map(str, CLUSTER_SIZES)) + " (1 = no clusters)")
        cdim = _cluster_dim(self, spec, loops, across)
        if isinstance(spec, Fused) and across and self.cluster == 1:
            raise ScheduleError(f"the fused spec's reduction over {across[0].dim} is split over "
                                f"{across[0].count} blocks, which cannot combine their parts without a cluster",
                                strategy=self, spec=spec, field="cluster", value=self.cluster,
                                allowed=", ".join(map(str, CLUSTER_SIZES[1:])) + f" (= the {across[0].count} "
                                f"{across[0].dim} tiles, on sm_90a)",
                                fix=f"to_blocks(cluster={across[0].count}), or keep the {across[0].dim} "
                                    "dimension in one block")
        if self.exchange not in EXCHANGES or (self.exchange != "barrier" and not (across and self.cluster > 1)) \
                or (self.exchange == "push" and self.persistent):
            raise ScheduleError("exchange says how the blocks of a cluster that split a reduction hand each other "
                                "their parts: 'barrier' (barrier.cluster, then loads from each other's shared "
                                "memory) or 'push' (st.async into every block's shared memory, an mbarrier per "
                                "exchange)", strategy=self, spec=spec, field="exchange", value=self.exchange,
                                allowed="'barrier', or 'push' with cluster > 1 on a reduction split over the "
                                        "cluster's blocks, one tile per block (not persistent)",
                                fix="to_blocks(cluster=C, exchange='push') on tile(r=1, c=cols // C)")
        if isinstance(self.occupancy, bool) or not isinstance(self.occupancy, int) or self.occupancy < 1 \
                or (self.occupancy > 1 and self.level != BLOCK):
            raise ScheduleError("occupancy is the number of blocks that must fit on one SM at once, a positive "
                                "int given to to_blocks()", strategy=self, spec=spec, field="occupancy",
                                value=self.occupancy, allowed=">= 1 with to_blocks(...), else 1")
        if not isinstance(self.reverse, bool) or (self.reverse and (self.level != BLOCK or self.cluster > 1)):
            raise ScheduleError("reverse walks the block tiles last to first: a bool given to to_blocks() "
                                "without clusters", strategy=self, spec=spec, field="reverse", value=self.reverse,
                                allowed="True or False with to_blocks(...), False with clusters or other units")
        grouped = loops[-2:] if self.group > 1 else []
        mapped = tuple(attrs.evolve(lp, unit=self.level, group=self.group if lp in grouped else 1,
                                    persistent=self.persistent, cluster=self.cluster if lp.dim == cdim else 1,
                                    exchange=self.exchange if lp.dim == cdim else "barrier",
                                    occupancy=self.occupancy, reverse=self.reverse)
                       if lp in loops else lp
                       for lp in parent.loops)
        new_spec = attrs.evolve(spec, level=self.level)
        post = parent.post
        if across and self.cluster > 1:
            new_spec = whole_means(new_spec, parent.spec, across[0].dim)
        elif across:
            if isinstance(spec, Reduce) and spec.monoid is not None:
                raise ScheduleError(f"a tuple reduction ({spec.op}) split over blocks combines its parts in one "
                                    "launch, through a cluster's distributed shared memory (a workspace of "
                                    "partial results holds one value per part)", strategy=self, spec=spec,
                                    field="cluster", value=self.cluster, allowed="2 to 8 (sm_90a)",
                                    fix=f"to_blocks(cluster={across[0].count})")
            mapped, new_spec, second = _partials(sched, parent.spec, new_spec, mapped, across[0])
            post = post + (Node(second),)
        new_focus = attrs.evolve(focus, spec=new_spec)
        new_parent = attrs.evolve(parent, loops=mapped, strategy=record(parent, self),
                                  body=parent.body[:-1] + (new_focus,), post=post)
        return sched.replace_path(path[:-1], new_parent)

    def __repr__(self):
        names = {BLOCK: "to_blocks", WARP: "to_warps", THREAD: "to_threads", WARPGROUP: "to_warpgroups"}
        arr = self.arrangement if isinstance(self.arrangement, tuple) else (self.arrangement,)
        args = [repr(a) for a in arr]
        if self.group != 1:
            args.append(f"group={self.group!r}")
        if self.persistent is not False:
            args.append(f"persistent={self.persistent!r}")
        if self.cluster != 1:
            args.append(f"cluster={self.cluster!r}")
        if self.occupancy != 1:
            args.append(f"occupancy={self.occupancy!r}")
        if self.reverse is not False:
            args.append(f"reverse={self.reverse!r}")
        if self.cluster_along is not None:
            args.append(f"cluster_along={self.cluster_along!r}")
        if self.exchange != "barrier":
            args.append(f"exchange={self.exchange!r}")
        if not isinstance(self.level, Level) or self.level not in names:
            return f"to({self.level!r}{''.join(', ' + a for a in args)})"
        return f"{names.get(self.level, 'to')}({', '.join(args)})"

    __str__ = __repr__


def _reduced_dims(spec) -> tuple[str, ...]:
    """The dims a Reduce reduces, or that some Reduce of a fused spec's body reduces."""
    if isinstance(spec, Reduce):
        return tuple(spec.reduction_dims)
    if isinstance(spec, Fused):
        return tuple(dict.fromkeys(d for sp in spec.body if isinstance(sp, Reduce) for d in sp.reduction_dims))
    return ()


def _cluster_dim(strategy, spec, loops, across) -> str | None:
    """The dim whose block tiles ``to_blocks(cluster=C)`` groups into clusters: a MatMul's m (its
    clusters share B tiles), or the reduced dim of a Reduce or fused row kernel split over the
    cluster's blocks (exactly C tiles: the cluster holds the whole reduction)."""
    C = strategy.cluster
    if C == 1:
        if strategy.cluster_along is not None:
            raise ScheduleError("cluster_along names the dim of the blocks' clusters: it needs cluster > 1",
                                strategy=strategy, spec=spec, field="cluster_along", value=strategy.cluster_along,
                                allowed="None with cluster=1", fix="to_blocks(cluster=2, cluster_along=...)")
        return None
    if strategy.level != BLOCK:
        raise ScheduleError("clusters group blocks: cluster= belongs to to_blocks()", strategy=strategy, spec=spec,
                            field="cluster", value=C, fix="to_blocks(cluster=...)")
    along = strategy.cluster_along
    if isinstance(spec, MatMul):
        dims = (spec.m_dim, spec.n_dim)
        if along is not None and along not in dims:
            raise ScheduleError("a MatMul's clusters run along its m dim (the blocks share B) or its n dim (they "
                                "share A)", strategy=strategy, spec=spec, field="cluster_along", value=along,
                                allowed=f"None (= {spec.m_dim!r}), {spec.m_dim!r}, {spec.n_dim!r}")
        cdim = along or spec.m_dim
        if C not in MATMUL_CLUSTER_SIZES or cdim not in [lp.dim for lp in loops]:
            raise ScheduleError(f"a MatMul's clusters are {', '.join(map(str, MATMUL_CLUSTER_SIZES[1:]))} "
                                f"block tiles of its {cdim} loop mapped to blocks",
                                strategy=strategy, spec=spec, field="cluster", value=C,
                                allowed=", ".join(map(str, MATMUL_CLUSTER_SIZES)),
                                fix=f"tile(m=..., n=...) >> to_blocks(cluster=2{'' if along is None else ', cluster_along=' + repr(along)})")
        return cdim
    if along is not None:
        raise ScheduleError("cluster_along names a MatMul's clustered dim; a split reduction's clusters run along "
                            "the reduced dim", strategy=strategy, spec=spec, field="cluster_along", value=along,
                            allowed="None", fix="drop cluster_along")
    if not across:
        raise ScheduleError("clusters group the block tiles of a MatMul's m loop, or of a reduced dim split "
                            "over blocks; this tile maps neither", strategy=strategy, spec=spec, field="cluster",
                            value=C, fix="tile(r=1, c=cols // C) >> to_blocks(cluster=C) for a row reduction "
                                         "split over C blocks, or drop cluster=")
    lp = across[0]
    if lp.count != C:
        raise ScheduleError(f"the reduction over {lp.dim} is split into {lp.count} block tiles; a cluster of "
                            f"{C} must hold all of them (it combines their parts)", strategy=strategy, spec=spec,
                            field="cluster", value=C, allowed=str(lp.count),
                            fix=f"tile {lp.dim} into exactly {C} parts (tile({lp.dim}=ceil(extent / {C})))")
    return lp.dim


def whole_means(spec, whole, dim: str):
    """``spec`` (a Reduce, or a fused spec) with each mean over ``dim`` — whose tiles the blocks
    of a cluster split — made a sum scaled by the whole count: the store that combines the
    cluster's parts must divide by the whole row, not by one block's part."""
    def fix(sp, wh):
        if not isinstance(sp, Reduce) or sp.op != "mean" or dim not in sp.reduction_dims:
            return sp
        n = 1
        for d in wh.reduction_dims:
            n *= wh.src.tensor.extent(d)
        return attrs.evolve(sp, op="sum", ops=(fops.scale(1.0 / n),) + tuple(sp.ops))

    if isinstance(spec, Fused):
        return attrs.evolve(spec, body=tuple(fix(sp, wh) for sp, wh in zip(spec.body, whole.body)))
    return fix(spec, whole)


def _partials(sched, whole: Reduce, part: Reduce, loops: tuple, lp):
    """A reduction whose reduced dim ``lp.dim`` is tiled onto blocks, as two launches::

        Reduce<kernel>(sum over c: X[R x C] -> Y[R])         for c0 in block(P):
          tile(c=S) >> to_blocks()                ==>          Reduce<block>(sum over c: X[R x S] -> Y_part[1 x R])
                                                             Reduce<kernel>(sum over cp: Y_part[P x R] -> Y[R])

    Each block reduces its part into a workspace of partial results (one row per part, in the
    accumulation dtype); a second launch combines the parts and applies the ops.  A mean is a sum
    of parts scaled by the whole count once, at the end; max and min combine with themselves."""
    dst = part.dst
    pdim = _fresh_dim(whole, f"{lp.dim}p")
    ws = Tensor(f"{dst.name}_part", part.acc, GL, (pdim,) + dst.tensor.dims, (lp.count,) + dst.tensor.shape,
                dst.tensor.major, workspace=True)
    first = "sum" if whole.op == "mean" else whole.op
    ops = tuple(whole.ops)
    if whole.op == "mean":
        n = 1
        for d in whole.reduction_dims:
            n *= whole.src.tensor.extent(d)
        ops = (fops.scale(1.0 / n),) + ops
    loops = tuple(attrs.evolve(x, steps=x.steps + ((pdim, 1),)) if x.var == lp.var else x for x in loops)
    block_part = attrs.evolve(part, op=first, ops=(), dst=Tile(ws, (1,) + tuple(dst.shape)))
    second = Reduce(first, Tile(ws, ws.shape), whole.dst, (pdim,), KERNEL, ops, whole.acc)
    return loops, block_part, second


def _fresh_dim(spec, base: str) -> str:
    used = {d for t in spec.operands for d in t.tensor.dims}
    name, i = base, 0
    while name in used:
        i += 1
        name = f"{base}{i}"
    return name


def _mapped_warps(path) -> int:
    n = 1
    for node in path:
        for lp in node.loops:
            if lp.unit == WARP:
                n *= lp.count
    return n


def _fix_for(have: Level, want: Level) -> str:
    if want == WARP and have == KERNEL:
        return "map the block tiles first: tile(m=..., n=...) >> to_blocks(), then tile(...) >> to_warps()"
    if want == BLOCK:
        return "to_blocks() maps the first tiling of the kernel-level spec"
    return f"insert the tiling that creates {want}-sized work before mapping to {want}s"


def to_blocks(*arrangement: int, group: int = 1, persistent: bool = False, cluster: int = 1,
              occupancy: int = 1, reverse: bool = False, cluster_along: str | None = None,
              exchange: str = "barrier") -> to:
    """Map onto blocks; ``group=G`` orders tiles in groups of G M-tiles (L2 reuse)::

        MatMul<kernel>(A:GL f16[256x512], B:GL f16[512x128], C:GL f16[256x128]) acc f32
          tile(m=128, n=128) >> to_blocks()
          for m0 in block(2), n0 in block(1):
            MatMul<block>(A:GL f16[128x512], B:GL f16[512x128], C:GL f16[128x128]) acc f32   <- focus

    * ``*arrangement``: blocks per mapped loop, checked against the tiling; none to take what the
      tile gives.
    * ``group``: M tiles per group of the block order (1: row-major); needs two mapped loops.
    * ``persistent``, ``cluster``, ``occupancy``, ``reverse``: below.

    ``persistent=True`` launches one block per SM (at most one per tile) that walks the tiles in
    that order, ``tile = blockIdx.x + i * gridDim.x``; on sm_90a a warp-specialized block then
    loads the next tile's operands while its consumers run the previous tile's epilogue::

        for m0 in block(32), n0 in block(16) grouped(8)     # 512 blocks, one tile each
        for m0 in block(32), n0 in block(16) grouped(8) persistent   # 132 blocks, ~3.9 tiles each

    Under an aligned window (``align(c=vec)``) the persistent grid is a multiple of ``vec`` blocks
    (rounded down), so the rows a block walks all start at one phase and what depends on the phase
    alone — a weight shifted into the window's frame — is done once a block
    (``lower.rules.threads.staged_run``)::

        tile(r=1) >> to_blocks(persistent=True, occupancy=8) >> align(c=8)   # 1,056 blocks (132 x 8)

    ``cluster=C`` (sm_90a) launches thread-block clusters of C blocks.  For a MatMul (C = 2 or 4)
    they take C consecutive M tiles of one N tile: the B tile they share is loaded once, each block
    fetching 1/C of it with a TMA multicast into the shared memory of every block of the cluster
    (for a reduction split over blocks, see below).  ``cluster_along="n"`` (the MatMul's n dim)
    clusters C consecutive N tiles of one M tile instead, which share their A tile — what a
    short, wide problem wants, where every N tile re-reads the same few rows of A::

        for m0 in block(32) clusters(2), n0 in block(16)    # block pairs (m0, m0+1) share B
        for m0 in block(1), n0 in block(128) clusters(4)    # cluster_along="n": 4 N tiles share A

    A ``Reduce`` whose reduced dim is tiled onto blocks becomes two launches: each block reduces
    its part into a workspace of partial results, and a second launch folds the parts::

        Reduce<kernel>(sum over c: X[R x C] -> Y[R]), tile(r=1, c=4096) >> to_blocks()
        for r0 in block(R), c0 in block(C/4096):
          Reduce<block>(sum over c: X[1 x 4096] -> Y_part[1 x 1])
        Reduce<kernel>(sum over cp: Y_part:f32[C/4096 x R] -> Y[R])

    With ``cluster=C`` equal to the number of parts (2, 4 or 8, sm_90a) it stays one launch: the
    C blocks of a cluster each reduce one part and combine the parts through distributed shared
    memory, every block folding them in the same order (a mean divides by the whole row).  That
    is how a fused row kernel (a norm, a softmax) takes rows longer than one block holds, the row
    still read once and written once::

        Fused<kernel>[Move(X -> Xr); ...; Reduce(mean over c: Q -> Rstd); ...]   X: f16[R x 65536]
          tile(r=1, c=32768) >> to_blocks(cluster=2)
          for r0 in block(R), c0 in block(2) clusters(2):
            Fused<block>[Move(X:GL f16[1x32768] -> Xr); ...; Reduce(sum over c: ...) with scale(1/65536)]

    ``exchange`` says how the cluster's blocks hand each other their parts: ``"barrier"`` (a
    ``barrier.cluster`` per reduction, then each block loads every part from its owner's shared
    memory, and one more before the kernel ends) or ``"push"`` (each block stores its part into
    every block's shared memory with ``st.async``, which completes bytes on the receiver's mbarrier:
    a block goes on as soon as its peers' parts have landed, waiting for no thread of theirs; one
    ``barrier.cluster`` at the start makes the mbarriers' initialisation visible).  ``"push"``
    needs one tile per block (not ``persistent``)::

        tile(r=1, c=8192) >> to_blocks(cluster=8, exchange="push")

    ``occupancy=N`` asks for N blocks resident on each SM at once (``__launch_bounds__(threads,
    N)``): the compiler then keeps each thread within ``regs_per_sm / (threads * N)`` registers.
    A memory-bound kernel whose block stalls on a reduction between its loads wants a second block
    on the SM to keep loads in flight; ``check()`` refuses an occupancy whose threads or shared
    memory do not fit on the SM, and a kernel that must spill to meet it compiles with a
    ``PerformanceWarning``::

        for r0 in block(4096) occupancy(2)        # 512-thread blocks, at most 64 registers each

    ``reverse=True`` hands the tiles out last to first (each block-mapped loop's index counted
    down; not with clusters).  The GPU starts blocks in about grid order, so where the last tiles
    are the longest (the query tiles of causal attention, whose key loop stops at the diagonal)
    they start first and the short ones fill the tail::

        for b0 in block(8), hk0 in block(16), g0 in block(1), q0 in block(32) reversed
    """
    return to(BLOCK, tuple(arrangement), group, persistent, cluster, occupancy, reverse, cluster_along, exchange)


def to_warps(*arrangement: int) -> to:
    """Map the loops of the last ``tile`` onto the warps of a block (or of a warpgroup); warps are
    numbered row-major over the loops, ``w = wm * WN + wn``::

        MatMul<block>(A:SH f16[128x32] Sw<2,3,3>, B:SH f16[32x128] Sw<3,3,4>, C:RF f32[128x128]) acc f32
          tile(m=64, n=64) >> to_warps(2, 2)
          for m1 in warp(2), n1 in warp(2):
            MatMul<warp>(A:SH f16[64x32] Sw<2,3,3>, B:SH f16[32x64] Sw<3,3,4>, C:RF f32[64x64]) acc f32   <- focus

    * ``*arrangement``: warps per mapped loop, outer first (``2, 2``), checked against the tiling;
      none to take what the tile gives.  At most 32 warps per block.
    """
    return to(WARP, tuple(arrangement))


def to_threads(*arrangement: int) -> to:
    """Map the loops of the last ``tile`` onto threads (of a warp, warpgroup or block); the thread's
    work is then declared atomic with ``done()``::

        Pointwise<block>(add: X:GL f16[4x256], Y:GL f16[4x256] -> O:GL f16[4x256])
          tile(r=1, c=8) >> to_threads()
          for r1 in thread(4), c1 in thread(32):
            Pointwise<thread>(add: X:GL f16[1x8], Y:GL f16[1x8] -> O:GL f16[1x8])   <- focus

    Threads are numbered row-major over the loops (the last loop varies fastest: here 32 threads
    along a row, so a warp's loads are contiguous).

    * ``*arrangement``: threads per mapped loop, checked against the tiling; none to take what the
      tile gives.  At most 1,024 threads per block.
    """
    return to(THREAD, tuple(arrangement))


def to_warpgroups(*arrangement: int) -> to:
    """Map the loops of the last ``tile`` onto warpgroups (4 warps, 128 threads: the issuing group
    of ``wgmma`` on sm_90a)::

        MatMul<block>(A:SH f16[128x64] Sw<3,3,3> x3 stages, B:SH f16[64x128] Sw<3,3,4> x3 stages, C:RF f32[128x128]) acc f32
          tile(m=64) >> to_warpgroups()
          for m1 in warpgroup(2):
            MatMul<warpgroup>(A:SH f16[64x64] Sw<3,3,3> x3 stages, B:SH f16[64x128] Sw<3,3,4> x3 stages, C:RF f32[64x128]) acc f32   <- focus

    Under ``warp_specialize`` these are the consumer warpgroups; the producer is added beside them.

    * ``*arrangement``: warpgroups per mapped loop; none to take what the tile gives.
    """
    return to(WARPGROUP, tuple(arrangement))
