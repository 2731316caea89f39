"""The GEMM recipe family on sm_80 atoms: ``C[M,N] = A[M,K] @ B[K,N]`` (+ fused epilogue).

Built only from strategies::

    split_k(p, across=BLOCK)                         # optional: K parts over blocks + reduce kernel
    tile(m=BM, n=BN) >> to_blocks()
    tile(k=BK)                                       # register accumulator around the K loop
    move_to_smem("A", swizzle), move_to_smem("B", swizzle)
    pipeline(stages=S)                               # cp.async ring, S deep
    split_k(q, across=WARP)                          # optional: the K tile split between warp groups
    tile(m=WM, n=WN) >> to_warps()
    move_to_regs("A"), move_to_regs("B")             # ldmatrix chosen to match the mma fragments
    tile(m=16, n=8, k=16) >> done(mma_m16n8k16)
    epilogue(*ops), prologue("A", relu())            # optional

``gemm_space`` enumerates the parameter sets that give a valid schedule for a problem.
"""

from __future__ import annotations

import itertools

import attrs

from .. import ops as fops
from ..dtypes import dtype
from ..errors import ScheduleError
from ..hardware.atoms import sm80
from ..hardware.target import target as get_target
from ..hardware.target import target_names
from ..layout import Swizzle
from ..schedule import Schedule
from ..spec import MatMul
from ..strategies import (
    done,
    epilogue,
    move_to_regs,
    move_to_smem,
    pipeline,
    prologue,
    split_k,
    stream_k,
    tile,
    to_blocks,
    to_warpgroups,
    to_warps,
    warp_specialize,
)
from ..tensor import BLOCK, GL, KERNEL, WARP, Tensor, Tile
from . import tiles

_MMA = {"f16": sm80.mma_m16n8k16_f16_f32, "bf16": sm80.mma_m16n8k16_bf16_f32}


#: the fields of ``GemmParams`` each atom family reads (``GemmParams.keys``)
SM80_FIELDS = ("block_m", "block_n", "block_k", "warps_m", "warps_n", "stages", "split_k_blocks", "split_k_warps",
               "swizzle", "warp_k", "group_m", "prefetch", "stream_k_parts", "split_k_fixup")
SM90_FIELDS = ("block_m", "block_n", "block_k", "stages", "group_m", "split_k_blocks", "warp_specialized",
               "persistent", "cluster", "cluster_along", "stream_k_parts", "swap_ab", "split_k_fixup")


@attrs.frozen
class GemmParams:
    """One point of the recipe's parameter space, for either atom family.

    ``atoms`` names the family (None: ``"sm80"``, as before the Hopper fields existed); the
    sm_90a family reads ``block_m``, ``block_n``, ``block_k``, ``stages``, ``group_m``,
    ``split_k_blocks``, ``warp_specialized``, ``persistent``, ``cluster``, ``cluster_along``, ``stream_k_parts``,
    ``swap_ab`` and ``split_k_fixup`` and leaves the rest at their defaults; both families read ``stream_k_parts``
    and ``split_k_fixup``.  A value is
    also a mapping of the fields its family reads, so both
    ``gemm(M, N, K, params=p)`` and ``gemm(M, N, K, **p)`` build its schedule.  A tile field left at
    None takes what ``gemm`` takes when it is not given (which depends on the family and the
    shape), so ``GemmParams(**p)`` of a dict ``p`` builds the same kernel as ``gemm(**p)``::

        >>> p = GemmParams(atoms="sm90a", block_m=128, block_n=256, block_k=64, stages=4)
        >>> sorted(p)[:3]
        ['atoms', 'block_k', 'block_m']
    """

    block_m: int | None = None               # None: the recipe's default for the family and shape
    block_n: int | None = None
    block_k: int | None = None               # None: sm_80 32; sm_90a one 128-byte swizzle span (64 f16)
    warps_m: int = 2
    warps_n: int = 2
    stages: int | None = None                # None: sm_80 3; sm_90a as many as fit (``_sm90_stages``)
    split_k_blocks: int = 1
    split_k_warps: int = 1
    swizzle: Swizzle | None = None           # None: bank-conflict-free choice per operand
    warp_k: int = 16                         # K per fragment load (registers hold one K step)
    group_m: int | None = None               # block order: groups of M tiles (L2); None: the recipe's
    prefetch: bool | None = None             # fragments one K step ahead; None: where registers allow
    atoms: str | None = None                 # "sm80" (None) or "sm90a"
    warp_specialized: bool | None = None     # sm90a: a producer warpgroup (None: the recipe's default)
    persistent: bool | None = None           # sm90a: one block per SM walking the tiles
    cluster: int | None = None               # sm90a: blocks per cluster sharing B (or A) by multicast
    cluster_along: str | None = None         # sm90a: "m" (None; the cluster shares B) or "n" (it shares A)
    stream_k_parts: int = 1                  # stream_k(parts): K chunks of all tiles over a persistent grid
    swap_ab: bool | None = None              # sm90a: Cᵀ = Bᵀ Aᵀ, M on the wgmma's N side (a row-major A)
    split_k_fixup: bool = False              # split_k_blocks' parts added in the kernel (combine="fixup")

    @property
    def family(self) -> str:
        """The atom family this point belongs to: ``"sm80"`` or ``"sm90a"``."""
        return self.atoms or "sm80"

    def keys(self) -> tuple[str, ...]:
        """The keyword arguments of ``recipes.gemm`` this point sets (its family's fields)."""
        return ("atoms",) + (SM90_FIELDS if self.family == "sm90a" else SM80_FIELDS)

    def __getitem__(self, name: str):
        if name not in self.keys():
            raise KeyError(name)
        return self.family if name == "atoms" else getattr(self, name)

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    @property
    def warp_m(self) -> int:
        return self.block_m // self.warps_m

    @property
    def warp_n(self) -> int:
        return self.block_n // self.warps_n


def gemm(M: int, N: int, K: int, dtype: str = "f16", arch: str | None = None, *, params: GemmParams | None = None,
         out_dtype: str | None = None,
         layout: str = "RR", block_m: int | None = None, block_n: int | None = None, block_k: int | None = None,
         warps_m: int | None = None, warps_n: int | None = None, stages: int | None = None,
         split_k_blocks: int | None = None, split_k_warps: int | None = None, swizzle: Swizzle | None = None,
         warp_k: int | None = None, group_m: int | None = None, prefetch: bool | None = None,
         epilogue_ops: tuple = (), prologue_ops: tuple = (), atoms: str | None = None,
         warp_specialized: bool | None = None, persistent: bool | None = None, producer_regs: int = 40,
         consumer_regs: int | None = None, cluster: int | None = None, cluster_along: str | None = None,
         stream_k_parts: int | None = None, split_k_fixup: bool | None = None,
         swap_ab: bool | None = None, batch: int | tuple = (), a_batched: bool = True, b_batched: bool = True, check: bool = True,
         tuned: bool = False) -> Schedule:
    """A GEMM schedule: ``C[..., M, N] = A[..., M, K] @ B[..., K, N]``.

    ``batch`` (an int, or a tuple for several batch dimensions) makes it a strided batched GEMM,
    each batch element a block-tile row of the grid; ``a_batched=False`` / ``b_batched=False``
    broadcast that operand over the batch (``torch.matmul`` semantics, see ``bmm``).

    ``dtype`` is the input type (f16 or bf16), accumulation is f32, ``out_dtype`` defaults to the
    input type.  ``layout`` gives A's then B's majorness (``R``/``C``).  ``epilogue_ops`` are
    ``firesched.ops`` values (bias, relu, gelu, residual, scale, cast).  ``arch`` is the target the
    schedule is checked against; None is the default target (``hardware.target.default_target``:
    the GPU present, else sm_90a), so the recipe builds the schedule of the machine it runs on.

    ``params`` is a ``GemmParams`` (what ``gemm_space`` yields), given as ``params=`` or positionally
    after the sizes (``gemm(M, N, K, GemmParams(block_m=64))``): a point of the sm_80-atom recipe,
    so it selects ``atoms="sm80"`` unless ``atoms`` says otherwise (with ``atoms="sm90a"`` its
    ``block_m``, ``block_n``, ``block_k``, ``stages`` and ``group_m`` are used).  A parameter given
    both in ``params`` and as a keyword is an error.

    ``atoms`` picks the instruction family; by default the newest the target has:

    * ``"sm90a"`` (the default for ``arch="sm_90a"``; ``gemm_sm90``): TMA copies into an mbarrier
      ring, wgmma from shared memory, a warp-specialized producer warpgroup, persistent blocks
      walking the tiles in grouped order, and a TMA-store epilogue.  It takes ``block_m`` (64, 128,
      192 or 256: one consumer warpgroup per 64 rows), ``block_n`` (a multiple of 64 up to 256), ``block_k`` (64, 32 or 16 for 16-bit
      types: the 128-, 64- or 32-byte swizzle mode), ``stages``, ``group_m``, the epilogue,
      ``warp_specialized`` / ``persistent`` (both on by default), ``producer_regs`` /
      ``consumer_regs`` (the ``setmaxnreg`` counts) and ``cluster`` (2: pairs of blocks on
      consecutive M tiles form thread-block clusters and share each B tile by TMA multicast, which
      needs warp specialization and a B tile each block of a pair can load half of: block_n a
      multiple of 128, or of 16 with a column-major B; default 1; 4 for quads of blocks;
      ``cluster_along="n"`` clusters consecutive N tiles instead, which share their A tile: a
      short M over many N tiles), and ``split_k_blocks`` (the K
      loop over that many blocks per tile, reduced by a second kernel in a fixed order).
    * Both families take ``split_k_fixup=True``: ``split_k_blocks``' parts added in the same
      launch by the block of each tile's last part (``split_k(..., combine="fixup")``: a
      workspace and a counter a tile, a fixed order), which also lets a swapped (``swap_ab``)
      schedule split K.
    * Both families take ``stream_k_parts`` (``stream_k(p)``): each tile's K loop cut into ``p``
      chunks, all chunks of all tiles spread evenly over a persistent grid, the partial tiles
      added in the kernel in a fixed order (so no SM idles in a partial last wave).
    * ``"sm80"`` (the default for sm_70 to sm_89, and what runs on any target from sm_80): cp.async
      pipelines, ldmatrix and ``mma.sync``; it also takes ``block_k``, ``warps_m`` x ``warps_n``,
      ``warp_k``, ``swizzle``, ``prefetch``, split-K across blocks and warps and ``prologue_ops``
      (on A's fragments, e.g. ``(ops.relu(),)``).

    Parameters left as None take the family's defaults.

    ``tuned=True`` takes the parameters ``firesched.tune("gemm", M, N, K, ...)`` stored for this
    problem on the current GPU (same driver, same library version); where there are none (or no
    GPU to key them by) it warns (``PerformanceWarning``, with the call that tunes it) and takes
    the tile model's choice.
    """
    if tuned:
        named_any = [n for n, v in dict(params=params, block_m=block_m, block_n=block_n, block_k=block_k,
                                        warps_m=warps_m, warps_n=warps_n, stages=stages,
                                        split_k_blocks=split_k_blocks, split_k_warps=split_k_warps,
                                        swizzle=swizzle, warp_k=warp_k, group_m=group_m, prefetch=prefetch,
                                        atoms=atoms, warp_specialized=warp_specialized, persistent=persistent,
                                        cluster=cluster, cluster_along=cluster_along, consumer_regs=consumer_regs,
                                        stream_k_parts=stream_k_parts, swap_ab=swap_ab,
                                        split_k_fixup=split_k_fixup).items() if v is not None]
        if named_any or prologue_ops:
            field = named_any[0] if named_any else "prologue_ops"
            raise ScheduleError("tuned=True takes the tuned parameters; a tile parameter given as well conflicts",
                                field=field, value=locals().get(field), allowed="None with tuned=True",
                                fix="drop tuned=True, or drop the parameter")
        tgt = _target(arch)
        found = tuned_params(M, N, K, dtype, tgt.name, out_dtype=out_dtype, layout=layout,
                             epilogue_ops=epilogue_ops, batch=batch, a_batched=a_batched, b_batched=b_batched)
        common = dict(out_dtype=out_dtype, layout=layout, epilogue_ops=epilogue_ops, producer_regs=producer_regs,
                      batch=batch, a_batched=a_batched, b_batched=b_batched, check=check)
        if isinstance(found, GemmParams):
            return gemm(M, N, K, dtype, tgt.name, params=found, **common)
        return gemm(M, N, K, dtype, tgt.name, **common)     # the default won the tuning, or nothing stored
    if isinstance(dtype, GemmParams) or isinstance(arch, GemmParams):
        given = dtype if isinstance(dtype, GemmParams) else arch
        if params is not None:
            raise ScheduleError("GemmParams given twice (positionally and as params=)", field="params",
                                value=given, fix="pass it once: gemm(M, N, K, params=GemmParams(...))")
        params = given
        dtype = "f16" if isinstance(dtype, GemmParams) else dtype
        arch = None if isinstance(arch, GemmParams) else arch
    tgt = _target(arch)
    arch = tgt.name
    if swap_ab not in (None, True, False):
        raise ScheduleError("swap_ab is a bool", field="swap_ab", value=swap_ab, allowed="True, False, None (the "
                                                                                         "tile model's choice)")
    named = (block_m, block_n, block_k, warps_m, warps_n, stages, split_k_blocks, split_k_warps, swizzle, warp_k,
             group_m, prefetch, warp_specialized, persistent, cluster, cluster_along, atoms, consumer_regs,
             stream_k_parts, swap_ab, split_k_fixup)
    sizes_ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (M, N, K))
    if params is None and not prologue_ops and sizes_ok and all(v is None for v in named):
        # no tile parameter named: the library's tile model (``recipes.tiles``) picks them per problem
        count = 1
        for b in (batch if isinstance(batch, tuple) else (batch,) if batch else ()):
            count *= b
        model = tiles.default_params(M, N, K, tgt, batch=count, layout=layout)
        if model:
            try:
                return gemm(M, N, K, dtype, arch, out_dtype=out_dtype, layout=layout, epilogue_ops=epilogue_ops,
                            producer_regs=producer_regs, batch=batch, a_batched=a_batched, b_batched=b_batched,
                            check=check, **model)
            except ScheduleError:
                pass      # the model's tile does not suit this problem (a layout, a size): the family's defaults
    if params is not None:
        if not isinstance(params, GemmParams):
            raise ScheduleError("params is a GemmParams value", field="params", value=params,
                                allowed="firesched.recipes.GemmParams(...)",
                                fix="gemm(M, N, K, params=GemmParams(block_m=..., ...)), or pass the fields as "
                                    "keywords")
        if atoms is not None and params.atoms is not None and atoms != params.atoms:
            raise ScheduleError("atoms is given both in params and as a keyword, differently", field="atoms",
                                value=(params.atoms, atoms), allowed="one of the two",
                                fix="drop the atoms keyword, or attrs.evolve(params, atoms=...)")
        atoms = params.family if atoms is None else atoms
        given = dict(block_m=block_m, block_n=block_n, block_k=block_k, warps_m=warps_m, warps_n=warps_n,
                     stages=stages, split_k_blocks=split_k_blocks, split_k_warps=split_k_warps, swizzle=swizzle,
                     warp_k=warp_k, group_m=group_m, prefetch=prefetch, warp_specialized=warp_specialized,
                     persistent=persistent, cluster=cluster, cluster_along=cluster_along,
                     stream_k_parts=stream_k_parts, swap_ab=swap_ab, split_k_fixup=split_k_fixup)
        twice = [k for k, v in given.items() if v is not None]
        if twice:
            raise ScheduleError("a parameter is given both in params and as a keyword", field=twice[0],
                                value=given[twice[0]], allowed="one of the two",
                                fix=f"attrs.evolve(params, {twice[0]}=...) or drop the keyword")
        if atoms == "sm90a":
            defaults = GemmParams()
            for name in sorted(set(SM80_FIELDS) - set(SM90_FIELDS)):
                if getattr(params, name) != getattr(defaults, name):
                    raise ScheduleError("this parameter belongs to the sm_80-atom recipe", field=f"params.{name}",
                                        value=getattr(params, name), allowed=f"{getattr(defaults, name)!r} with "
                                        "atoms='sm90a'", fix="pass atoms='sm80', or leave the field at its default")
            block_m, block_n, block_k = params.block_m, params.block_n, params.block_k
            stages, group_m, split_k_blocks = params.stages, params.group_m, params.split_k_blocks
            warp_specialized, persistent, cluster = params.warp_specialized, params.persistent, params.cluster
            stream_k_parts, swap_ab, cluster_along = params.stream_k_parts, params.swap_ab, params.cluster_along
            split_k_fixup = params.split_k_fixup
        else:
            for name in ("warp_specialized", "persistent", "cluster", "cluster_along", "swap_ab"):
                if getattr(params, name) not in (None, False, 1):
                    raise ScheduleError("this parameter belongs to the sm_90a recipe", field=f"params.{name}",
                                        value=getattr(params, name), allowed="None with atoms='sm80'",
                                        fix="GemmParams(atoms='sm90a', ...), or leave the field at None")
            (block_m, block_n, block_k, warps_m, warps_n, stages, split_k_blocks, split_k_warps, swizzle,
             warp_k, group_m, prefetch, stream_k_parts, split_k_fixup) = (getattr(params, name) for name in SM80_FIELDS)
    if atoms is None:
        atoms = "sm90a" if tgt.has_wgmma else "sm80"
    if atoms == "sm90a":
        sm80_only = dict(warps_m=warps_m, warps_n=warps_n, warp_k=warp_k, swizzle=swizzle,
                         prefetch=prefetch, split_k_warps=split_k_warps, prologue_ops=prologue_ops or None)
        for name, v in sm80_only.items():
            if v is not None and v != 1:
                raise ScheduleError("this parameter belongs to the sm_80-atom recipe", field=name, value=v,
                                    allowed="None with atoms='sm90a'",
                                    fix="pass atoms='sm80' to build the mma.sync recipe (it runs on sm_90a too)")
        if swap_ab:
            # M on the wgmma's N side: the smallest multiple of 8 that covers it; 128 columns of C
            # (two consumer warpgroups) a block
            bm = block_m if block_m is not None else min(256, -(-M // 8) * 8)
            bn = block_n if block_n is not None else (128 if N >= 128 else 64)
        else:
            bm = block_m if block_m is not None else (128 if M >= 128 else 64)
            bn = block_n if block_n is not None else (256 if N >= 256 else 128 if N >= 128 else 64)
        # warp specialization by default up to 192 rows; 256 rows (four consumer warpgroups at 104
        # registers) fit only block_n <= 128, so they specialize when asked
        ws = (bm <= 192 or bool(swap_ab)) if warp_specialized is None else warp_specialized
        # a fix-up's last part waits for blocks before it in the walk: one tile a block
        fixup_split = _fixup_flag(split_k_fixup) and isinstance(split_k_blocks, int) and split_k_blocks > 1
        per = (ws and not fixup_split) if persistent is None else persistent
        # clusters are an option, not the default: pairs sharing B measured within -3 % .. +2 % of
        # single blocks at 4096^3 and 8192^3 on an H100, timed interleaved (bench/README.md)
        cluster = 1 if cluster is None else cluster
        return gemm_sm90(M, N, K, dtype, arch, out_dtype=out_dtype, layout=layout, block_m=bm, block_n=bn,
                         block_k=block_k, batch=batch, a_batched=a_batched, b_batched=b_batched,
                         stages=stages if stages is not None else _sm90_stages(bm, bn, ws, block_k or 64, arch),
                         group_m=group_m if group_m is not None else (8 if M >= 4 * bm else 1),
                         epilogue_ops=epilogue_ops, warp_specialized=ws, persistent=per,
                         producer_regs=producer_regs, consumer_regs=consumer_regs, cluster=cluster,
                         cluster_along=cluster_along,
                         split_k_blocks=1 if split_k_blocks is None else split_k_blocks,
                         stream_k_parts=1 if stream_k_parts is None else stream_k_parts, swap_ab=bool(swap_ab),
                         split_k_fixup=_fixup_flag(split_k_fixup), check=check)
    if cluster not in (None, 1) or cluster_along is not None:
        raise ScheduleError("thread-block clusters belong to the sm_90a recipe", field="cluster",
                            value=cluster if cluster not in (None, 1) else cluster_along,
                            allowed="1 with atoms='sm80'", fix="use atoms='sm90a' (arch='sm_90a') for clusters")
    if swap_ab:
        raise ScheduleError("swap_ab is a schedule of the sm_90a family (wgmma's N side holds M)", field="swap_ab",
                            value=swap_ab, allowed="None or False with atoms='sm80'",
                            fix="gemm(..., atoms='sm90a', arch='sm_90a', layout='RC', swap_ab=True)")
    if warp_specialized or persistent:
        raise ScheduleError("warp specialization and persistent blocks are Hopper schedules", field="atoms",
                            value=atoms, allowed="'sm90a'", fix="gemm(..., atoms='sm90a', arch='sm_90a')")
    block_m = 128 if block_m is None else block_m
    block_n = 128 if block_n is None else block_n
    block_k = 32 if block_k is None else block_k
    warps_m = 2 if warps_m is None else warps_m
    warps_n = 2 if warps_n is None else warps_n
    stages = 3 if stages is None else stages
    split_k_blocks = 1 if split_k_blocks is None else split_k_blocks
    split_k_warps = 1 if split_k_warps is None else split_k_warps
    warp_k = 16 if warp_k is None else warp_k
    group_m = 1 if group_m is None else group_m
    stream_k_parts = 1 if stream_k_parts is None else stream_k_parts
    split_k_fixup = _fixup_flag(split_k_fixup)
    if atoms != "sm80":
        raise ScheduleError("unknown atom family for the GEMM recipe", field="atoms", value=atoms,
                            allowed="'sm80' (mma.sync, cp.async, ldmatrix), 'sm90a' (wgmma, TMA)")
    for name, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ScheduleError("problem sizes are positive ints", field=name, value=v, allowed="an int >= 1")
    dt = _input_dtype(dtype)
    out = dt if out_dtype is None else _out_dtype(out_dtype)
    if not (isinstance(layout, str) and len(layout) == 2 and set(layout) <= {"R", "C"}):
        raise ScheduleError("layout gives A's then B's majorness", field="layout", value=layout,
                            allowed="'RR', 'RC', 'CR', 'CC' (R = row-major, C = column-major)")
    for name, v in (("epilogue_ops", epilogue_ops), ("prologue_ops", prologue_ops)):
        if not isinstance(v, (tuple, list)):
            raise ScheduleError(f"{name} is a tuple of firesched.ops values", field=name, value=v,
                                allowed="e.g. (ops.bias('bias'), ops.relu())", fix=f"pass {name}=({v!r},)")
    p = GemmParams(block_m, block_n, block_k, warps_m, warps_n, stages, split_k_blocks, split_k_warps, swizzle,
                   warp_k, group_m, prefetch, stream_k_parts=stream_k_parts, split_k_fixup=split_k_fixup)
    _check_params(p, M, N, K)
    spec = _spec(M, N, K, dt, out, layout, batch, a_batched, b_batched)
    chain = []
    if p.split_k_blocks > 1:
        chain.append(_split_blocks(p.split_k_blocks, p.split_k_fixup))
    if p.stream_k_parts > 1:
        if p.split_k_blocks > 1:
            raise ScheduleError(f"stream_k_parts={p.stream_k_parts} with split_k_blocks: stream-K walks the K chunks "
                                "over the grid itself", field="split_k_blocks", value=p.split_k_blocks,
                                allowed="1 with stream_k_parts > 1", fix="drop split_k_blocks or stream_k_parts")
        chain.append(stream_k(p.stream_k_parts))
    chain += [
        tile(**_batch_tiles(spec), m=p.block_m, n=p.block_n) >> to_blocks(group=_group(p, M, N)),
        tile(k=p.block_k),
        move_to_smem("A", swizzle=p.swizzle),
        move_to_smem("B", swizzle=p.swizzle),
        pipeline(stages=p.stages, prefetch=_prefetch(p)),
    ]
    if p.split_k_warps > 1:
        chain.append(split_k(p.split_k_warps, across=WARP))
    chain += [
        tile(m=p.warp_m, n=p.warp_n) >> to_warps(p.warps_m, p.warps_n),
    ]
    if p.warp_k < p.block_k // p.split_k_warps:
        chain.append(tile(k=p.warp_k))
    chain += [
        move_to_regs("A"),
        move_to_regs("B"),
        tile(m=16, n=8, k=16) >> done(_MMA[dt.name]),
    ]
    if epilogue_ops:
        chain.append(epilogue(*epilogue_ops))
    if prologue_ops:
        chain.append(prologue("A", *prologue_ops))
    sched = spec.schedule(*chain)
    if check:
        sched.check(tgt)
    return sched


def tuning_problem(M: int, N: int, K: int, dtype: str = "f16", arch: str = "sm_90a", *, out_dtype=None,
                   layout: str = "RR", epilogue_ops: tuple = (), batch: int | tuple = (), a_batched: bool = True,
                   b_batched: bool = True) -> dict:
    """The problem a tuned GEMM entry is keyed by (JSON values): every argument of ``gemm`` that
    changes which parameters are fastest or valid, the epilogue ops by their ``repr``."""
    dt = _input_dtype(dtype)
    out = dt if out_dtype is None else _out_dtype(out_dtype)
    return {"recipe": "gemm", "M": M, "N": N, "K": K, "dtype": dt.name, "out_dtype": out.name, "arch": arch,
            "layout": layout, "epilogue": [repr(op) for op in epilogue_ops],
            "batch": list(batch) if isinstance(batch, tuple) else ([batch] if batch else []),
            "a_batched": a_batched, "b_batched": b_batched}


def params_from_json(values: dict) -> GemmParams:
    """A ``GemmParams`` from the JSON a tuned entry holds (its ``dict(params)``); a ``ValueError``
    naming the field for anything else."""
    fields = {f.name for f in attrs.fields(GemmParams)}
    bad = sorted(set(values) - fields)
    if bad or values.get("swizzle") is not None:
        raise ValueError(f"tuned parameters: unknown or unstorable field {(bad or ['swizzle'])[0]!r}; "
                         f"allowed: {', '.join(sorted(fields - {'swizzle'}))}")
    return GemmParams(**values)


def tuned_params(M: int, N: int, K: int, dtype: str = "f16", arch: str = "sm_90a", **problem):
    """The parameters ``firesched.tune`` stored for this GEMM on the current GPU: a
    ``GemmParams``, ``"default"`` where the recipe's default parameters won the tuning, or None
    (with a ``PerformanceWarning`` saying how to tune it) when nothing is stored or there is no
    GPU to key it by.  ``problem`` takes ``tuning_problem``'s keywords."""
    import warnings

    from .. import runtime, tuned
    from ..errors import PerformanceWarning

    key = tuning_problem(M, N, K, dtype, arch, **problem)
    why = runtime.gpu_unavailable_reason()
    entry = None
    if why is None:
        entry = tuned.lookup(key, tuned.device_key())
        if entry is not None:
            if not entry["params"]:
                return "default"
            try:
                return params_from_json(entry["params"])
            except (TypeError, ValueError):
                entry = None
        why = "nothing is stored for it on this GPU, driver and library version"
    warnings.warn(PerformanceWarning(
        f"gemm {M}x{N}x{K} {key['dtype']} tuned=True: {why}; taking the tile model's parameters. Tune it with "
        f"firesched.tune('gemm', {M}, {N}, {K}, dtype={key['dtype']!r}, arch={arch!r}) on the GPU"), stacklevel=3)
    return None


def _target(arch):
    """The target ``arch`` names (None: the default target), or a ScheduleError listing them."""
    try:
        return get_target(arch)
    except ValueError as e:
        raise ScheduleError(str(e), field="arch", value=arch, allowed=target_names(),
                            fix="pass arch='sm_80' (or another target above), or None for the GPU present") from None


def _sm90_stages(bm: int, bn: int, ws: bool, bk: int, arch: str) -> int:
    """As many ``bk``-deep K stages (16-bit operands) as fit in the target's shared memory next to
    the TMA-store staging of a warp-specialized kernel, 2 to 6 (up to 8 for shallower K tiles)."""
    from ..lower.rules.accumulators import SPAN, STORE_BUFFERS

    stage = (bm + bn) * bk * 2
    staging = (bm // 64) * STORE_BUFFERS * 64 * SPAN if ws else 0
    budget = get_target(arch).smem_per_block_optin - 1024 - staging     # 1 KiB: barriers, alignment
    return max(2, min(8, 6 * 64 // bk, budget // stage))


#: the most registers the recipe gives a consumer thread (as CUTLASS's warp-specialized kernels)
CONSUMER_REGS_MAX = 240


def gemm_sm90(M: int, N: int, K: int, dtype: str = "f16", arch: str = "sm_90a", *, out_dtype=None,
              layout: str = "RR", block_m: int = 128, block_n: int = 256, block_k: int | None = None,
              stages: int = 4, group_m: int = 1,
              epilogue_ops: tuple = (), warp_specialized: bool = False, persistent: bool = False,
              producer_regs: int = 40, consumer_regs: int | None = None, cluster: int = 1,
              cluster_along: str | None = None, split_k_blocks: int = 1,
              stream_k_parts: int = 1, swap_ab: bool = False, split_k_fixup: bool = False,
              batch: int | tuple = (), a_batched: bool = True, b_batched: bool = True, check: bool = True) -> Schedule:
    """The Hopper GEMM: TMA + mbarrier ring, one wgmma warpgroup per 64 rows of the block tile
    (see ``firesched.lowering_sm90``).

    ``warp_specialized=True`` adds a producer warpgroup that issues the TMA copies
    (``warp_specialize(producer_regs, consumer_regs)``); ``persistent=True`` (which needs it)
    launches one block per SM that walks the tiles in the grouped order.  ``consumer_regs``
    defaults to the most registers the block's register file leaves each consumer thread.
    ``cluster=2`` (which needs warp specialization) pairs blocks on consecutive M tiles into
    thread-block clusters that share each B tile through TMA multicast (``cluster=4``: quads);
    ``cluster_along="n"`` clusters consecutive N tiles instead, which share each A tile (one M
    tile over many N tiles re-reads the same rows of A).  ``split_k_blocks=p``
    splits the K loop over ``p`` blocks per output tile (``split_k(p, across=BLOCK)``, the same
    strategy the sm_80 family uses): each writes its f32 partial tile to a workspace and a second
    kernel adds the parts in a fixed order, so results are bitwise the same run to run; with
    ``split_k_fixup=True`` the block of each tile's last part adds them in the same launch
    (``split_k(p, across=BLOCK, combine="fixup")``), also in a fixed order.
    ``stream_k_parts=p`` (``stream_k(p)``) cuts each tile's K loop into ``p`` chunks and spreads
    all chunks evenly over a persistent grid; the block holding a tile's top chunk adds the other
    blocks' partial tiles in the kernel, in a fixed order.

    ``swap_ab=True`` computes ``Cᵀ = Bᵀ Aᵀ`` for a small M: the wgmma's 64 rows run over N
    (``block_n``, a multiple of 64: one consumer warpgroup per 64 columns of C) and M sits on the
    wgmma's N side (``block_m``, a multiple of 8 from 8 to 256), so M = 1 .. 64 does not fill a
    64-row MMA with padding.  A column-major B (``layout="RC"``: B stored N x K, as
    ``nn.Linear`` keeps its weight) is the swapped product's K-major A operand, a row-major B
    its MN-major A (the ``_ss_tnspa`` wgmma records); A must be row-major.  C is stored element
    by element down the accumulator's rows."""
    from ..hardware.atoms import sm90a

    if swap_ab:
        return _gemm_swapped(M, N, K, dtype, arch, out_dtype=out_dtype, layout=layout, block_m=block_m,
                             block_n=block_n, block_k=block_k, stages=stages, group_m=group_m,
                             epilogue_ops=epilogue_ops, warp_specialized=warp_specialized, persistent=persistent,
                             producer_regs=producer_regs, consumer_regs=consumer_regs, cluster=cluster,
                             cluster_along=cluster_along, split_k_blocks=split_k_blocks,
                             stream_k_parts=stream_k_parts, split_k_fixup=split_k_fixup, batch=batch,
                             check=check)

    dt = _input_dtype(dtype)
    out = dt if out_dtype is None else _out_dtype(out_dtype)
    if not (isinstance(layout, str) and len(layout) == 2 and layout[0] == "R" and set(layout) <= {"R", "C"}):
        raise ScheduleError("the sm_90a GEMM takes a row-major A and either B", field="layout", value=layout,
                            allowed="'RR', 'RC'")
    # one 128-byte swizzle span of K by default; 32 or 64 bytes (block_k=16 / 32 for 16-bit types)
    # select the 32- and 64-byte swizzle modes
    bk = 128 * 8 // dt.bits if block_k is None else block_k
    spec = _spec(M, N, K, dt, out, layout, batch, a_batched, b_batched)
    p = GemmParams(block_m, block_n, bk, block_m // 64 or 1, 1, stages, group_m=group_m)
    try:
        atom = sm90a.wgmma_atom(block_n, dt, b_mn_major=layout[1] == "R")
    except ValueError as e:
        raise ScheduleError(str(e), field="block_n", value=block_n, allowed="multiples of 8 up to 256") from None
    if isinstance(split_k_blocks, bool) or not isinstance(split_k_blocks, int) or split_k_blocks < 1:
        raise ScheduleError("split_k_blocks is a positive int", field="split_k_blocks", value=split_k_blocks,
                            allowed="1 (no split), 2, 3, ...")
    if isinstance(stream_k_parts, bool) or not isinstance(stream_k_parts, int) or stream_k_parts < 1:
        raise ScheduleError("stream_k_parts is a positive int", field="stream_k_parts", value=stream_k_parts,
                            allowed="1 (no stream-K), 2, 3, ...")
    chain = [_split_blocks(split_k_blocks, _fixup_flag(split_k_fixup))] if split_k_blocks > 1 else []
    chain += [stream_k(stream_k_parts)] if stream_k_parts > 1 else []
    if stream_k_parts > 1 and (split_k_blocks > 1 or cluster > 1):
        other = "split_k_blocks" if split_k_blocks > 1 else "cluster"
        raise ScheduleError(f"stream_k_parts={stream_k_parts} with {other}: stream-K walks the K chunks over "
                            "the grid itself", field=other, value=split_k_blocks if split_k_blocks > 1 else cluster,
                            allowed="1 with stream_k_parts > 1", fix=f"drop {other} or stream_k_parts")
    chain += _ring(dict(_batch_tiles(spec), m=block_m, n=block_n), _group(p, M, N), persistent, cluster, bk, ("A", "B"),
                   stages, warp_specialized, producer_regs, consumer_regs, max(block_m // 64, 1), arch,
                   cluster_along=cluster_along)
    chain += [
        tile(m=64) >> to_warpgroups(),
        tile(k=16) >> done(atom),
    ]
    return _scheduled(spec, chain, epilogue_ops, check, arch)


def _scheduled(spec: MatMul, chain: list, epilogue_ops: tuple, check: bool, arch) -> Schedule:
    """``spec`` refined by ``chain`` and the epilogue, checked against ``arch`` when ``check``."""
    if epilogue_ops:
        chain = chain + [epilogue(*epilogue_ops)]
    sched = spec.schedule(*chain)
    if check:
        sched.check(get_target(arch))
    return sched


def _ring(block_tiles: dict, group: int, persistent: bool, cluster: int, bk: int, loads: tuple, stages: int,
          warp_specialized: bool, producer_regs: int, consumer_regs, warpgroups: int, arch,
          cluster_along: str | None = None) -> list:
    """The Hopper GEMM's block tiles, K tiles, TMA loads into an mbarrier ring and (optionally) a
    producer warpgroup: what the plain and the swapped schedules share."""
    from ..hardware.atoms import sm90a

    chain = [
        tile(**block_tiles) >> to_blocks(group=group, persistent=persistent, cluster=cluster,
                                         cluster_along=cluster_along),
        tile(k=bk),
        *(move_to_smem(name, via=(sm90a.tma_load_2d,)) for name in loads),
        pipeline(stages=stages),
    ]
    if warp_specialized:
        if consumer_regs is None:
            # what the launch gives the block, less the producer's, shared by the consumers
            from ..lower.transforms.specialize import consumer_regs_for

            consumer_regs = consumer_regs_for(get_target(arch), warpgroups, producer_regs, cap=CONSUMER_REGS_MAX)
        chain.append(warp_specialize(producer_regs=producer_regs, consumer_regs=consumer_regs))
    return chain


def _gemm_swapped(M, N, K, dtype, arch, *, out_dtype, layout, block_m, block_n, block_k, stages, group_m,
                  epilogue_ops, warp_specialized, persistent, producer_regs, consumer_regs, cluster, cluster_along,
                  split_k_blocks, stream_k_parts, split_k_fixup, batch, check) -> Schedule:
    """``gemm_sm90(..., swap_ab=True)``: the schedule of ``Cᵀ = Bᵀ Aᵀ`` (see ``gemm_sm90``)::

        MatMul<kernel>(B:GL f16[KxN], A:GL f16[MxK], C:GL f16[MxN]) roles (n, m, k)
          tile(m=block_m, n=block_n) >> to_blocks()       C tiles, as without the swap
          tile(k=64), move_to_smem("B"), move_to_smem("A"), pipeline(...)   TMA into the ring
          tile(n=64) >> to_warpgroups()                   64 columns of C per consumer warpgroup
          tile(k=16) >> done(wgmma m64 n<block_m> k16)    B's tile is the MMA's A, Aᵀ its B
    """
    from ..hardware.atoms import sm90a

    dt = _input_dtype(dtype)
    out = dt if out_dtype is None else _out_dtype(out_dtype)
    if layout not in ("RC", "RR"):
        raise ScheduleError("swap_ab computes Cᵀ = Bᵀ Aᵀ with Aᵀ as the MMA's K-major B operand: it takes a "
                            "row-major A", field="layout", value=layout, allowed="'RR', 'RC' with swap_ab=True",
                            fix="pass A row-major, or swap_ab=False")
    if batch not in ((), 0, 1):
        raise ScheduleError("swap_ab is a schedule of one GEMM", field="batch", value=batch, allowed="()",
                            fix="drop swap_ab for a batched GEMM")
    if cluster != 1 or cluster_along is not None:
        raise ScheduleError("swap_ab with clusters: a small M has no pairs of M tiles to share B", field="cluster",
                            value=cluster, allowed="1 (and cluster_along None) with swap_ab=True",
                            fix="drop cluster or swap_ab")
    if split_k_blocks != 1 and not _fixup_flag(split_k_fixup):
        # the second launch that adds the parts reads its epilogue's axes off C, not off the
        # swapped product; the fix-up adds them in the product's registers
        raise ScheduleError("swap_ab with split_k_blocks: the parts' reduction is a launch of its own over C",
                            field="split_k_blocks", value=split_k_blocks,
                            allowed="1, or any with split_k_fixup=True, with swap_ab=True",
                            fix="pass split_k_fixup=True (the parts are added in the kernel), use stream_k_parts=..., "
                                "or drop swap_ab")
    if isinstance(block_m, bool) or not isinstance(block_m, int) or block_m % 8 or not 8 <= block_m <= 256:
        raise ScheduleError("with swap_ab, block_m rows of C sit on the wgmma's N side", field="block_m",
                            value=block_m, allowed="multiples of 8 from 8 to 256")
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n % 64 or not 64 <= block_n <= 256:
        raise ScheduleError("with swap_ab, block_n columns of C are the wgmma's rows, one consumer warpgroup per 64",
                            field="block_n", value=block_n, allowed="64, 128, 192, 256")
    for name, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ScheduleError("problem sizes are positive ints", field=name, value=v, allowed="an int >= 1")
    bk = 128 * 8 // dt.bits if block_k is None else block_k
    ta = Tensor("A", dt, GL, ("m", "k"), (M, K), "k")
    # a column-major B (N x K, an nn.Linear weight) is the K-major A of the swapped product; a
    # row-major one its MN-major A (the _ss_tnspa records)
    tb = Tensor("B", dt, GL, ("k", "n"), (K, N), "k" if layout == "RC" else "n")
    tc = Tensor("C", out, GL, ("m", "n"), (M, N), "n")
    spec = MatMul(Tile(tb, tb.shape), Tile(ta, ta.shape), Tile(tc, tc.shape), KERNEL, "f32", roles=("n", "m", "k"))
    atom = sm90a.wgmma_atom(block_m, dt, a_mn_major=layout == "RR")
    # the epilogue's axes are the accumulator's: a bias over C's columns runs down its rows
    epi = tuple(attrs.evolve(op, axis={"m": "n", "n": "m"}[op.axis]) if isinstance(op, fops.Bias) else op
                for op in epilogue_ops)
    p = GemmParams(block_m, block_n, bk, 1, 1, stages, group_m=group_m)
    chain = [_split_blocks(split_k_blocks, True)] if split_k_blocks > 1 else []
    chain += [stream_k(stream_k_parts)] if stream_k_parts > 1 else []
    chain += _ring(dict(m=block_m, n=block_n), _group(p, M, N), persistent, cluster, bk, ("B", "A"), stages,
                   warp_specialized, producer_regs, consumer_regs, block_n // 64, arch)
    chain += [tile(n=64) >> to_warpgroups(), tile(k=16) >> done(atom)]
    return _scheduled(spec, chain, epi, check, arch)


def _fixup_flag(v) -> bool:
    if v not in (None, True, False):
        raise ScheduleError("split_k_fixup is a bool", field="split_k_fixup", value=v,
                            allowed="True (the parts added in the kernel), False or None (a second launch)")
    return bool(v)


def _split_blocks(parts: int, fixup: bool) -> split_k:
    """``split_k`` over blocks, its parts added by a second launch or in the kernel (``fixup``)."""
    return split_k(parts, across=BLOCK, combine="fixup" if fixup else "launch")


def _spec(M, N, K, dt, out, layout, batch, a_batched, b_batched) -> MatMul:
    try:
        return MatMul.kernel(M, N, K, a=dt, b=dt, c=out, acc="f32", layout=layout, batch=batch,
                             a_batched=a_batched, b_batched=b_batched)
    except ValueError as e:
        raise ScheduleError(str(e), field="M, N, K, batch", value=(M, N, K, batch)) from None


def _batch_tiles(spec: MatMul) -> dict[str, int]:
    """Each batch element is its own row of block tiles."""
    return {d: 1 for d in spec.batch_dims}


def _input_dtype(name):
    try:
        dt = dtype(name)
    except ValueError:
        raise ScheduleError("unknown dtype", field="dtype", value=name, allowed="f16, bf16") from None
    if dt.name not in _MMA:
        raise ScheduleError("the sm_80 GEMM recipe takes 16-bit inputs", field="dtype", value=name,
                            allowed="f16, bf16")
    return dt


def _out_dtype(name):
    try:
        dt = dtype(name)
    except ValueError:
        raise ScheduleError("unknown output dtype", field="out_dtype", value=name, allowed="f16, bf16, f32") from None
    if dt.name not in ("f16", "bf16", "f32"):
        raise ScheduleError("unsupported output dtype", field="out_dtype", value=name, allowed="f16, bf16, f32")
    return dt


def _check_params(p: GemmParams, M: int, N: int, K: int):
    for name in SM80_FIELDS:
        v = getattr(p, name)
        if name in ("swizzle", "split_k_fixup"):      # split_k_fixup: checked by _fixup_flag
            continue
        if name == "prefetch":
            if v is not None and not isinstance(v, bool):
                raise ScheduleError("prefetch is a bool or None", field="prefetch", value=v,
                                    allowed="True, False, None (automatic)")
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ScheduleError("recipe parameters are positive ints", field=name, value=v,
                                allowed="a positive int", fix=f"pass gemm(..., {name}=<int>)")
    if p.block_m % p.warps_m or p.block_n % p.warps_n:
        raise ScheduleError("the warp arrangement does not divide the block tile", field="warps_m x warps_n",
                            value=f"{p.warps_m}x{p.warps_n}", allowed=f"divisors of {p.block_m}x{p.block_n}",
                            fix="choose warps_m | block_m and warps_n | block_n")
    if p.warp_m % 16 or p.warp_n % 16:
        raise ScheduleError(f"warp tiles of {p.warp_m}x{p.warp_n}: each warp tile must be a multiple of "
                            "16x16 (mma m16n8k16 fragments, ldmatrix x4 of B)", field="block / warps",
                            value=(p.block_m, p.block_n, p.warps_m, p.warps_n), allowed="multiples of 16")
    if p.block_k % (16 * p.split_k_warps):
        raise ScheduleError("the K tile must hold 16 K per warp group", field="block_k", value=p.block_k,
                            allowed=f"multiples of {16 * p.split_k_warps}")
    if p.warp_k % 16 or (p.block_k // p.split_k_warps) % p.warp_k:
        raise ScheduleError("warp_k is the K of one fragment load: a multiple of 16 dividing the warp's K tile",
                            field="warp_k", value=p.warp_k, allowed=f"multiples of 16 dividing {p.block_k // p.split_k_warps}")


def _prefetch(p: GemmParams) -> bool:
    """Double-buffered fragments cost registers: with 64x64 warp tiles (128 accumulator registers)
    they fit when a K tile holds two warp K steps, not four (measured: 255 registers and spills)."""
    if p.prefetch is not None:
        return p.prefetch
    steps = p.block_k // p.split_k_warps // p.warp_k
    return steps <= 2 or p.warp_m * p.warp_n <= 64 * 32


def _group(p: GemmParams, M: int, N: int) -> int:
    """Grouped block order only where there is more than one group of M tiles."""
    mt = -(-M // p.block_m)
    return p.group_m if 1 < p.group_m < mt and N > p.block_n else 1


#: block tiles each family's space draws from (16-row tiles are the sm_80 family's small-M shape)
SPACE_BLOCKS_SM80 = ((256, 128), (128, 256), (128, 128), (64, 128), (128, 64), (64, 64), (32, 64), (64, 32),
                     (32, 32), (16, 64), (16, 128), (16, 32))
SPACE_WARPS_SM80 = ((4, 2), (2, 4), (2, 2), (1, 4), (4, 1), (1, 2), (2, 1), (1, 1))
SPACE_BM_SM90 = (64, 128, 192, 256)
SPACE_BN_SM90 = (64, 128, 192, 256)


def _covering(sizes, extent: int):
    """``sizes`` up to the smallest that covers ``extent`` in one tile (larger ones only add
    padding): O(1) pruning before any schedule is built."""
    cover = [b for b in sizes if b >= extent]
    top = min(cover) if cover else max(sizes)
    return [b for b in sizes if b <= top]


def _splits(M: int, N: int, K: int, bm: int, bn: int, bk: int, batch: int, sms: int):
    return tiles.split_factors(M, N, K, bm, bn, bk, batch=batch, sms=sms)


#: stream-K chunks per tile the space offers
SPACE_STREAM_K = (2, 3, 4)


def _stream_parts(M: int, N: int, K: int, bm: int, bn: int, batch: int, sms: int) -> list[int]:
    """Stream-K chunk counts worth a try for ``bm x bn`` tiles: where the tiles fill at least one
    wave and leave a partial last one (fewer tiles than SMs are split-K's case), with at least
    two 64-wide K tiles a chunk."""
    tiles = -(-M // bm) * -(-N // bn) * batch
    if tiles < sms or tiles % sms == 0:
        return []
    return [p for p in SPACE_STREAM_K if K >= 2 * 64 * p]


def _space_sm90(M, N, K, tgt, dt, layout, batch):
    """The sm_90a family's points, pruned by O(1) rules (tile coverage, accumulator registers
    under the launch's register limit, shared memory through ``_sm90_stages``)."""
    from ..lower.transforms.specialize import WGMMA_OVERHEAD_REGS, launch_regs

    if layout[0] != "R":
        return
    eb = dt.bits // 8
    for bm, bn, bk in itertools.product(_covering(SPACE_BM_SM90, M), _covering(SPACE_BN_SM90, N),
                                        (128 // eb, 64 // eb)):
        if bk > 128 // eb or (bk < 128 // eb and K >= 1024):
            continue                    # the narrower swizzle only where K is short
        mt = -(-M // bm)
        for ws, per in ((True, True), (True, False), (False, False)):
            if bn // 2 + WGMMA_OVERHEAD_REGS > launch_regs(tgt, 128 * (bm // 64 + (1 if ws else 0))):
                continue                # accumulators over what ptxas may give a thread
            stages = _sm90_stages(bm, bn, ws, bk, tgt.name)
            for split in _splits(M, N, K, bm, bn, bk, batch, tgt.sm_count):
                clusters = (1, 2) if ws and bn % 128 == 0 and mt >= 2 and split == 1 else (1,)
                for cl in clusters:
                    yield GemmParams(block_m=bm, block_n=bn, block_k=bk, stages=stages,
                                     group_m=8 if M >= 4 * bm else 1, split_k_blocks=split,
                                     atoms="sm90a", warp_specialized=ws, persistent=per, cluster=cl)
            if ws and not per and M <= 128 and batch == 1 and bn <= 128:
                # Cᵀ = Bᵀ Aᵀ: M on the wgmma's N side, the block tile's N on its rows; a ring as
                # deep as shared memory holds (at most 12), and 8
                sbm = min(256, -(-M // 8) * 8)
                deepest = tiles.swapped_stages(sbm, bn, bk, eb, tgt.smem_per_block_optin)
                for st in sorted({deepest, min(8, deepest)}, reverse=True):
                    yield GemmParams(block_m=sbm, block_n=bn, block_k=bk, stages=st,
                                     group_m=1, atoms="sm90a", warp_specialized=True, persistent=False,
                                     cluster=1, swap_ab=True)
            if per or not ws:
                for parts in _stream_parts(M, N, K, bm, bn, batch, tgt.sm_count):
                    yield GemmParams(block_m=bm, block_n=bn, block_k=bk, stages=stages,
                                     group_m=8 if M >= 4 * bm else 1, atoms="sm90a", warp_specialized=ws,
                                     persistent=per, cluster=1, stream_k_parts=parts)


def _space_sm80(M, N, K, tgt, dt, batch):
    """The sm_80 family's points, pruned by O(1) rules (tile coverage, warp tiles of whole
    fragments and at most 64 x 64 accumulators, shared memory, split-K where SMs idle)."""
    bms = _covering(sorted({b[0] for b in SPACE_BLOCKS_SM80}), M)
    bns = _covering(sorted({b[1] for b in SPACE_BLOCKS_SM80}), N)
    ks = _covering((32, 64, 128), K)
    for (bm, bn), (wm, wn), bk, st in itertools.product(SPACE_BLOCKS_SM80, SPACE_WARPS_SM80, ks, (4, 3, 2)):
        if bm not in bms or bn not in bns:
            continue
        wtm, wtn = bm // wm, bn // wn
        if bm % wm or bn % wn or wtm % 16 or wtn % 16 or wtm * wtn > 64 * 64:
            continue
        if st * (bm + bn) * bk * dt.bits // 8 > tgt.smem_per_block_optin - 1024:
            continue
        for skw in (1, 2):
            if skw > 1 and (bk // skw < 32 or wm * wn * skw > 8):
                continue
            for skb in _splits(M, N, K, bm, bn, bk, batch, tgt.sm_count):
                yield GemmParams(bm, bn, bk, wm, wn, st, skb, skw, warp_k=16 if bk // skw <= 64 else 32,
                                 group_m=8 if M >= 4 * bm else 1, atoms="sm80")
            if skw == 1:
                for parts in _stream_parts(M, N, K, bm, bn, batch, tgt.sm_count):
                    yield GemmParams(bm, bn, bk, wm, wn, st, 1, 1, warp_k=16 if bk <= 64 else 32,
                                     group_m=8 if M >= 4 * bm else 1, atoms="sm80", stream_k_parts=parts)


def gemm_space(M: int, N: int, K: int, dtype: str = "f16", arch: str | None = None, *, atoms: str | None = None,
               layout: str = "RR", epilogue_ops: tuple = (), batch: int = 1, limit: int | None = None):
    """Yield ``GemmParams`` whose schedule checks for this problem and target (None: the default
    target), the most promising first; each builds as ``gemm(M, N, K, dtype, arch, params=p)``
    or ``gemm(M, N, K, dtype, arch, **p)``.

    ``atoms`` restricts it to one family (``"sm80"`` or ``"sm90a"``); by default every family
    the target has, both on sm_90a.  The space is each family's block tiles, warp layouts, K
    tiles, stages, split-K factors (where the tiles leave SMs idle), stream-K chunks (where they
    leave a partial last wave), and on sm_90a warp specialization, persistence and clusters.  O(1) rules prune it first (tiles larger than the
    problem needs, accumulators over the register limit, shared memory); the survivors are
    ordered by the tile model's time (``tiles.modelled_time``) and only then built and checked,
    so the first ``limit`` points cost ``limit`` checks and a few more.  ``layout``,
    ``epilogue_ops`` and ``batch`` are checked with each point as ``gemm`` takes them.
    """
    tgt = _target(arch)
    dt = _input_dtype(dtype)
    families = ("sm90a", "sm80") if tgt.has_wgmma else ("sm80",)
    if atoms is not None:
        if atoms not in ("sm80", "sm90a") or (atoms == "sm90a" and not tgt.has_wgmma):
            raise ScheduleError("no such atom family on this target", field="atoms", value=atoms,
                                allowed=", ".join(repr(f) for f in families))
        families = (atoms,)
    points = []
    for fam in families:
        points += _space_sm90(M, N, K, tgt, dt, layout, batch) if fam == "sm90a" else \
            _space_sm80(M, N, K, tgt, dt, batch)

    def cost(p):
        return tiles.modelled_time(M, N, K, p.family, p.block_m, p.block_n, p.split_k_blocks, batch=batch,
                                   sms=tgt.sm_count, specialized=p.warp_specialized is not False,
                                   persistent=p.persistent is not False or p.stream_k_parts > 1,
                                   stream=p.stream_k_parts)

    points.sort(key=cost)
    count = 0
    for p in points:
        try:
            gemm(M, N, K, dtype, tgt.name, params=p, layout=layout, epilogue_ops=tuple(epilogue_ops),
                 batch=batch if batch > 1 else ())
        except ScheduleError:
            continue
        yield p
        count += 1
        if limit is not None and count >= limit:
            return


EPILOGUES = {
    "none": (),
    "bias": (fops.bias("bias"),),
    "bias_relu": (fops.bias("bias"), fops.relu()),
    "bias_gelu": (fops.bias("bias"), fops.gelu()),
    "residual": (fops.residual("residual"),),
}
