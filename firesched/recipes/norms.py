"""Row normalizations as fused specs: RMSNorm, LayerNorm and the residual-add + RMSNorm block.

Each recipe writes its computation as a ``Fused`` spec of element-wise and reduction specs over
``(r, c)`` — the way a reader would write it in numpy — and schedules it with strategies only:
the block tiling of ``rows.kernel_strategies``, ``place(name, RF)`` for the row and the
intermediates (they never leave the registers of the threads that compute them), and the same
``rows.part_strategies`` for every part.  ``rmsnorm(4096, 4096)`` is::

    Fused<kernel>[Move(X -> Xr); Pointwise(mul: Xr, Xr -> Q); Reduce(mean over c: Q -> Rstd)
                  with shift(1e-06), rsqrt(); Pointwise(mul: Xr, Rstd -> N); Pointwise(mul: N, W -> Y)]
      tile(r=1) >> to_blocks()
      for r0 in block(4096):
        Fused<block>[... Xr:RF f16[1x4096] ... Q:RF f32[1x4096] ... Rstd:RF f32[1] ...]
          place(Xr, RF) >> place(Q, RF) >> place(Rstd, RF) >> place(N, RF) >> part(0, ...) >> ...
          Move<block>(X:GL f16[1x4096] -> Xr:RF f16[1x4096])        # the row, read once
            tile(c=2048)
            for c0 in seq(2):
              tile(c=8) >> to_threads()
              for c1 in thread(256):
                Move<thread>(X:GL f16[1x8] -> Xr:RF f16[1x8])        # one 16-byte load
          Pointwise<block>(mul: Xr:RF, Xr:RF -> Q:RF)                # squares, in registers
          Reduce<block>(mean over c: Q:RF f32[1x4096] -> Rstd:RF f32[1])
            tile(c=2048)                                             # each thread folds its 16
            ...                                                      # shuffles, then warps:
            Reduce<block>(sum of the partial results: Rstd_p -> Rstd) with scale(1/4096), shift, rsqrt
          Pointwise<block>(mul: Xr:RF, Rstd:RF -> N:RF)
          Pointwise<block>(mul: N:RF, W:GL -> Y:GL)                  # one 16-byte store

Statistics are computed in f32, LayerNorm's in two passes over the registers: the mean, then the
mean of squared deviations, which does not cancel as E[x²] - E[x]² does for rows with a large
mean.  A row split over a thread-block cluster takes both in one tuple reduction instead
(``monoids.welford``: each thread's (count, mean, M2), merged by Chan's formula), so the blocks
exchange once per row, and so does a 16-bit row on one block of 512 or more threads, where the
second exchange across 16 or 32 warps costs more than the tuple's merges (``rows.wide_tuple``: on
an H200 up to 12 % at 32,768 columns).  On smaller blocks the two plain reductions measured faster
(the tuple's merges cost more than the block barrier they save: bench/README.md, "One exchange per
row"), and so they
do on a persistent block whose next rows are in flight, beside another block on its SM, where each
thread has the registers to hold the deviations (``rows.deviations_fit``: on an H200 4 - 9 % on odd
rows of 4,033 - 8,191 columns, and 30 % from 2,800, where such windows with the tuple were slower
than the element plans; a block alone on its SM takes the tuple, 1 - 4 % faster there).  On a
cluster the output is one pass from the row (``normalize_affine``: (x - mean) · rstd · w + b;
RMSNorm's ``mul_mul``, its squares folded straight from the row by ``monoids.sum_squares``), and
the row's part waits in shared memory (``rows.row_plan``, ``schedule_rows(row=...)``).
``stats=True`` also returns the per-row statistics a backward pass needs (RMSNorm's ``rstd``;
LayerNorm's ``mean`` and ``rstd``), written to global memory by the parts that compute them and
read back by the next part after a barrier.  A cluster's blocks combine by ``st.async`` pushes
into each other's shared memory and an mbarrier (``exchange="push"``: 2.12 -> 2.40 TB/s RMSNorm,
1.66 -> 1.95 LayerNorm at 1024 x 262144 bf16 on an H100) or by ``barrier.cluster``
(``exchange="barrier"``); ``to_blocks(exchange=...)``.  By default each recipe takes the one
measured faster (``rows.cluster_exchange``): the barrier for RMSNorm's rows of 16-byte vectors
(on an H200 up to 14 % faster at 24,576 - 262,144 columns, level at a few), pushes elsewhere.
"""

from __future__ import annotations

import attrs

from .. import monoids, ops
from ..hardware.target import target as get_target
from ..hardware.target import target_names
from ..ir.nodes import GUARDS
from ..schedule import Schedule
from ..spec import Fused, Init, Move, Pointwise, Reduce
from ..strategies import part, pipeline, place
from ..tensor import GL, KERNEL, RF, SH, Tensor, Tile
from . import rows as _rows

DTYPES = ("f16", "bf16", "f32")


class _Specs:
    """Kernel-level tiles over (r, c) for one row kernel: ``t("X")`` a row-major (r, c) tensor,
    ``t("W", ("c",))`` a vector along the row, ``t("S", ("r",), "f32")`` a per-row value."""

    def __init__(self, rows: int, cols: int, dtype: str):
        self.ext = {"r": rows, "c": cols}
        self.dtype = dtype

    def t(self, name: str, dims=("r", "c"), dt=None) -> Tile:
        shape = tuple(self.ext[d] for d in dims)
        return Tile(Tensor(name, dt or self.dtype, GL, tuple(dims), shape, dims[-1]), shape)


def check_args(what: str, rows, cols, dtype, arch) -> None:
    for name, v in (("rows", rows), ("cols", cols)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"recipes.{what}: {name} must be a positive int, got {v!r}")
    if dtype not in DTYPES:
        raise ValueError(f"recipes.{what}: dtype={dtype!r}; allowed: {', '.join(DTYPES)}")
    # the schedule is the same on every target from sm_80 (16-byte loads, warp shuffles); None is
    # the default target (the GPU present, else sm_90a)
    try:
        tgt = get_target(arch)
    except ValueError:
        if arch is None:          # $FIRESCHED_ARCH names no target: its own message says so
            raise
        tgt = None
    if tgt is None or tgt.rank < get_target("sm_80").rank:
        raise ValueError(f"recipes.{what}: arch={arch!r}; allowed: {target_names(since='sm_80')}, or None "
                         f"for the GPU present")


EXCHANGES = ("barrier", "push")


def plan_rows(rows: int, cols: int, dtype: str, arch, max_values: int | None = None,
              exchange: str | None = None, what: str = "plan_rows", stage: bool = True,
              plan: _rows.RowPlan | None = None, stage_few_passes: bool = True,
              odd_values: int | None = None, aligned_values: int | None = None,
              op: str | None = None) -> _rows.RowPlan:
    """``rows.row_plan`` for ``arch``: rows too long for one block take a thread-block cluster
    where the target has them (sm_90a); ``max_values`` as there; ``exchange`` how the cluster's
    blocks combine their statistics (``to_blocks(exchange=...)``: ``"barrier"`` or ``"push"``;
    None: the recipe's measured choice, ``rows.cluster_exchange``: ``"push"`` but for RMSNorm's
    rows of 16-byte vectors); ``stage``,
    ``stage_few_passes`` and ``odd_values``: a row may wait in shared memory, as ``rows.row_plan``'s;
    ``aligned_values``: as there, the elements a thread of an aligned window holds; ``op``: the
    recipe (``rmsnorm``, ``add_rmsnorm``, ``layernorm``, ``softmax``, ``causal``) whose measured
    choices to take (``rows.measured_plan_args``: aligned windows, element plans, half blocks, the
    odd rows it stages; they replace ``odd_values`` where they name one; and ``rows.load_guard``:
    how its guarded loads are written);
    ``plan``: a ``rows.RowPlan`` of the caller's instead of the tile model's (its ``exchange``
    replaced by ``exchange`` when that is given)."""
    if exchange is not None and exchange not in EXCHANGES:
        raise ValueError(f"recipes.{what}: exchange={exchange!r}; allowed: 'barrier' (barrier.cluster) or 'push' "
                         "(st.async into each other's shared memory, an mbarrier per exchange), or None (the recipe's: "
                         "rows.cluster_exchange)")
    if plan is not None:
        if not isinstance(plan, _rows.RowPlan):
            raise ValueError(f"recipes.{what}: plan={plan!r}; allowed: a recipes.rows.RowPlan, or None (the tile "
                             "model's: rows.row_plan)")
        if plan.cluster > 1 and not get_target(arch).has_clusters:
            raise ValueError(f"recipes.{what}: plan.cluster={plan.cluster} needs thread-block clusters: arch='sm_90a'")
        return plan if exchange is None else attrs.evolve(plan, exchange=exchange)
    clusters = get_target(arch).has_clusters
    measured = _rows.measured_plan_args(op, cols, dtype, clusters, rows) if op is not None else {}
    measured.setdefault("odd_values", odd_values)
    plan = _rows.row_plan(rows, cols, dtype, max_values=max_values, clusters=clusters, stage=stage,
                          stage_few_passes=stage_few_passes, shared_per_sm=get_target(arch).smem_per_sm,
                          aligned_values=aligned_values, **measured)
    if not plan.persistent and plan.occupancy > 1 and -(-rows // plan.rows) * plan.cluster <= get_target(arch).sm_count:
        # a grid of no more blocks than the target's SMs: each SM holds one of them, and asking
        # for more only caps the registers (RMSNorm 5 x 45,001 on 1,024 threads, two an SM, spilled
        # 16 bytes a thread; 1 x 131,071 and softmax 1 x 262,143, clusters of 8 parts, 8 bytes).
        # (Target.sm_count is the reference part's: on a part with fewer SMs, an H100 PCIe's 114,
        # a grid between the two counts may run its last blocks in a second wave)
        plan = attrs.evolve(plan, blocks_per_sm=1)
    return attrs.evolve(plan, exchange=_rows.cluster_exchange(op, plan, dtype) if exchange is None else exchange,
                        guard=_rows.load_guard(op, plan, cols, dtype))


#: the row recipes whose plans ``recipe_plan`` knows (``causal``: ``softmax(..., causal=True)``)
RECIPES = ("rmsnorm", "add_rmsnorm", "layernorm", "softmax", "causal")


def recipe_plan_args(op: str, dtype: str, arch) -> dict:
    """The ``plan_rows`` arguments recipe ``op`` (one of ``RECIPES``) asks for on ``dtype`` and
    ``arch``, besides ``op=op``: what its kernel's registers hold, measured per recipe.

    * add + RMSNorm: 32 values a thread (the sum, its square and the normalised row live beside each
      other: 40 spilled).  On clusters the sum may wait in shared memory as the other rows do: it
      measured within 2 % of the sum in registers there (an H100, bf16, 49,152 to 262,144
      columns), and a row of 28,672 f16 that spills on one block takes two staged parts instead.
    * LayerNorm: f32 rows 24 (32 spill its two-pass statistics: 56 bytes at 32,768 columns); odd
      rows in registers up to 20 elements a thread (24 and more spilled: 32-80 bytes); an aligned
      window (``RowPlan.aligned``, where it measured faster: ``rows.aligned_faster``) 24 elements a
      thread on sm_90a (no spills), 16 on sm_80 (24 spilled 8-24 bytes at 20,481 and 24,569
      columns), f32 12 (32 spilled 12-156 bytes, f32 16 48).
    * softmax: an odd row one block holds stays in registers (faster than staged, no spills);
      causal softmax also keeps a row of few passes on one block (its parts' work is uneven)."""
    if op not in RECIPES:
        raise ValueError(f"recipe_plan_args: op={op!r}; allowed: {', '.join(map(repr, RECIPES))}")
    if op == "add_rmsnorm":
        return {"max_values": 32}
    if op == "layernorm":
        window = 12 if dtype == "f32" else 24 if get_target(arch).has_clusters else 16
        return {"max_values": 24 if dtype == "f32" else None, "odd_values": 20, "aligned_values": window}
    if op in ("softmax", "causal"):
        return {"odd_values": _rows.VALUES_IN_REGISTERS[2], "stage_few_passes": op != "causal"}
    return {}


def recipe_plan(op: str, rows: int, cols: int, dtype: str, arch, exchange: str | None = None,
                plan: _rows.RowPlan | None = None) -> _rows.RowPlan:
    """The plan recipe ``op`` takes for ``rows`` x ``cols`` elements of ``dtype`` on ``arch``:
    ``plan_rows`` with the recipe's arguments (``recipe_plan_args``); ``exchange`` and ``plan`` as
    there."""
    what = "softmax" if op == "causal" else op
    return plan_rows(rows, cols, dtype, arch, exchange=exchange, what=what, plan=plan, op=op,
                     **recipe_plan_args(op, dtype, arch))


def schedule_rows(spec: Fused, plan: _rows.RowPlan, local: tuple[str, ...], row: str | None = None) -> Schedule:
    """``spec`` tiled by ``plan``: its intermediates ``local`` in registers, each part mapped by
    ``rows.part_strategies`` (parts without the row dim, per-row statistics, skip the row walk).

    With ``plan.row_memory == "SH"`` the intermediate ``row`` (the row every later part reads:
    ``Xr``, or add + RMSNorm's sum ``Hr``) waits in shared memory instead: ``place(row, SH)``.  A
    plain ``Move`` from global memory that fills it stays a block's copy (``cp.async`` of 16-byte
    chunks, one wait and one barrier); any other producer (a masked load, a sum) is mapped onto
    threads like the other parts and stores its elements to shared memory.  No thread then holds
    the row in registers while the statistics are exchanged, so more blocks fit an SM."""
    if plan.row_memory not in ("RF", "SH"):
        raise ValueError(f"schedule_rows: plan.row_memory={plan.row_memory!r}; allowed: 'RF', 'SH'")
    if plan.guard not in GUARDS:
        raise ValueError(f"schedule_rows: plan.guard={plan.guard!r}; allowed: {', '.join(map(repr, GUARDS))} (how "
                         "guarded loads are written: done(guard=...))")
    if isinstance(plan.tile_stages, bool) or not isinstance(plan.tile_stages, int) or plan.tile_stages < 1:
        raise ValueError(f"schedule_rows: plan.tile_stages={plan.tile_stages!r}; allowed: an int >= 1 (2 and more: "
                         "a persistent block's next rows in flight, with persistent=True and row_memory='SH')")
    staged = row if plan.row_memory == "SH" else None
    if plan.row_memory == "SH" and staged not in local:
        raise ValueError(f"schedule_rows: row={row!r} must name one of the intermediates {local} to stage it in "
                         "shared memory (plan.row_memory='SH')")
    # a part that is not whole passes walks a buffer padded to them (the last pass partial)
    # (a cluster's part in an aligned window: the part and vec - 1 more elements)
    ext = plan.part + plan.vec - 1 if plan.cluster > 1 and plan.aligned else plan.part or spec.extents["c"]
    pad = plan.span if ext % plan.span else None
    # several rows' parts a block (plan.rows): each line at its own length, unswizzled (threads walk
    # each row in consecutive 16-byte chunks)
    strategies = list(_rows.kernel_strategies(plan)) + [
        place(name, SH, pad=pad, swizzle=plan.rows == 1) if name == staged else place(name, RF) for name in local]
    for i, sp in enumerate(spec.body):
        if isinstance(sp, Move) and sp.dst.name == staged and sp.src.memory == GL and not sp.ops:
            continue          # the block's copy into shared memory (lower.rules.copies)
        if isinstance(sp, Init):
            continue          # a constant every thread sets in its registers (lower.rules.accumulators)
        strategies.append(part(i, *_rows.part_strategies(plan, walk_row="c" in sp.dims)))
    if plan.tile_stages > 1:
        # the next rows' copies in flight while the block computes one (lower.transforms.tile_prefetch)
        strategies.append(pipeline(stages=plan.tile_stages))
    return spec.schedule(*strategies)


def _rms_body(s: _Specs, x: Tile, eps: float, weight: bool, out: str, stats_local: bool, fused: bool = False):
    """RMSNorm of the row tile ``x`` (already on chip) into ``out``: the specs and the locals they
    create.  ``fused`` (a row split over a cluster): the sum of squares folded straight from the
    row (``monoids.sum_squares``) and the output in one pass, ``x · rstd · w``, so no f32 copy of
    the row waits between parts."""
    f32 = "f32"
    rstd = s.t("Rstd", ("r",), f32)
    n = s.ext["c"]
    if fused:
        body = [Reduce(monoids.sum_squares(), x, rstd, ("c",), KERNEL, (ops.scale(1.0 / n), ops.shift(eps),
                                                                         ops.rsqrt()))]
        body.append(Pointwise("mul_mul", (x, rstd, s.t("W", ("c",))), s.t(out), KERNEL) if weight else
                    Pointwise("mul", (x, rstd), s.t(out), KERNEL))
        return body, (["Rstd"] if stats_local else [])
    body = [Pointwise("mul", (x, x), s.t("Q", dt=f32), KERNEL),
            Reduce("mean", s.t("Q", dt=f32), rstd, ("c",), KERNEL, (ops.shift(eps), ops.rsqrt()))]
    local = ["Q"] + (["Rstd"] if stats_local else [])
    if weight:
        body += [Pointwise("mul", (x, rstd), s.t("N", dt=f32), KERNEL),
                 Pointwise("mul", (s.t("N", dt=f32), s.t("W", ("c",))), s.t(out), KERNEL)]
        local.append("N")
    else:
        body.append(Pointwise("mul", (x, rstd), s.t(out), KERNEL))
    return body, local


def _row_source(s: _Specs, name: str = "X"):
    """The row as the parts read it: ``Xr``, loaded once into registers by a ``Move`` part."""
    return [Move(s.t(name), s.t(name + "r"), KERNEL)], s.t(name + "r"), [name + "r"]


def rmsnorm(rows: int, cols: int, *, dtype: str = "f16", arch: str | None = None, weight: bool = True,
            eps: float = 1e-6, stats: bool = False, exchange: str | None = None,
            plan: _rows.RowPlan | None = None) -> Schedule:
    """``Y = X / sqrt(mean(X², axis=-1) + eps) * W`` over rows of ``cols`` elements (torch's
    ``rms_norm(x, (cols,), w, eps)``); inputs ``X`` (rows x cols) and ``W`` (cols,) when
    ``weight``; ``stats=True`` also returns ``Rstd`` (rows,) in f32.  The schedule tree is in the
    module docstring; ``rows.row_plan`` picks the tiling (``plan``: a ``rows.RowPlan`` instead);
    ``exchange``: how a row split over a cluster combines, ``"push"`` (``st.async`` pushes) or
    ``"barrier"`` (``barrier.cluster``; None: ``rows.cluster_exchange``, the barrier for rows of
    16-byte vectors) (``to_blocks``)."""
    check_args("rmsnorm", rows, cols, dtype, arch)
    plan = recipe_plan("rmsnorm", rows, cols, dtype, arch, exchange=exchange, plan=plan)
    s = _Specs(rows, cols, dtype)
    load, x, local = _row_source(s)
    body, more = _rms_body(s, x, eps, weight, "Y", stats_local=not stats, fused=_rows.one_pass(plan))
    spec = Fused.kernel(*load, *body, results=("Y", "Rstd") if stats else ())
    return schedule_rows(spec, plan, tuple(local + more), row="Xr")


def add_rmsnorm(rows: int, cols: int, *, dtype: str = "f16", arch: str | None = None, weight: bool = True,
                eps: float = 1e-6, exchange: str | None = None, plan: _rows.RowPlan | None = None) -> Schedule:
    """The pre-norm block of a transformer layer: ``H = X + R`` (rounded to ``dtype``, as torch
    computes it) and ``Y = rmsnorm(H) * W``; returns ``(Y, H)``.  ``H`` is written once and kept in
    registers for the norm, so the kernel reads 2 and writes 2 elements per element of the row.
    ``plan``: a ``rows.RowPlan`` instead of the tile model's."""
    check_args("add_rmsnorm", rows, cols, dtype, arch)
    plan = recipe_plan("add_rmsnorm", rows, cols, dtype, arch, exchange=exchange, plan=plan)
    s = _Specs(rows, cols, dtype)
    head = [Pointwise("add", (s.t("X"), s.t("R")), s.t("Hr"), KERNEL), Move(s.t("Hr"), s.t("H"), KERNEL)]
    h, local = s.t("Hr"), ["Hr"]
    body, more = _rms_body(s, h, eps, weight, "Y", stats_local=True, fused=_rows.one_pass(plan))
    spec = Fused.kernel(*head, *body, results=("Y", "H"))
    return schedule_rows(spec, plan, tuple(local + more), row="Hr")


def _from_row(x, mean, rstd, w, b, y) -> Pointwise:
    """LayerNorm's output in one pass from the row: ``(x - mean) · rstd · w (+ b)``."""
    if b is None:
        return Pointwise("normalize_scale", (x, mean, rstd, w), y, KERNEL)
    return Pointwise("normalize_affine", (x, mean, rstd, w, b), y, KERNEL)


def layernorm(rows: int, cols: int, *, dtype: str = "f16", arch: str | None = None, weight: bool = True,
              bias: bool = True, eps: float = 1e-5, stats: bool = False, exchange: str | None = None,
              tuple_stats: bool | None = None, plan: _rows.RowPlan | None = None) -> Schedule:
    """``Y = (X - mean) / sqrt(var + eps) * W + B`` over rows of ``cols`` elements (torch's
    ``layer_norm``; the biased variance), statistics in f32 in two passes over the registers;
    inputs ``X``, then ``W`` and ``B`` (cols,) when ``weight`` / ``bias``; ``stats=True`` also
    returns ``Mean`` and ``Rstd`` (rows,) in f32.  ``tuple_stats``: the mean and the variance in
    one tuple reduction (True, Welford) or two (False); None: one where the row is split over a
    cluster or waits in shared memory, or a 16-bit row on one block of 512 threads or more
    (``rows.wide_tuple``; module docstring), but two on a persistent block that prefetches its
    rows with room for the deviations in registers (``rows.deviations_fit``).
    ``plan``: a ``rows.RowPlan`` instead of the tile model's."""
    check_args("layernorm", rows, cols, dtype, arch)
    if tuple_stats is not None and not isinstance(tuple_stats, bool):
        raise ValueError(f"recipes.layernorm: tuple_stats={tuple_stats!r}; allowed: True, False, None (by the plan)")
    plan = recipe_plan("layernorm", rows, cols, dtype, arch, exchange=exchange, plan=plan)
    s = _Specs(rows, cols, dtype)
    load, x, local = _row_source(s)
    f32 = "f32"
    mean, rstd = s.t("Mean", ("r",), f32), s.t("Rstd", ("r",), f32)
    w, b = s.t("W", ("c",)), s.t("B", ("c",))
    if (_rows.one_pass(plan) and not _rows.deviations_fit(plan)) or _rows.wide_tuple(plan, "layernorm", dtype, cols) \
            if tuple_stats is None else tuple_stats:
        # the mean and the variance in one reduction (Welford / Chan: each thread's (count, mean,
        # M2), merged across lanes, warps and the blocks of the cluster in one exchange each),
        # then the output in one pass, (x - mean) · rstd · w + b: no f32 copy of the row waits
        # between parts (it would hold registers the SM's other blocks could use)
        body = [Reduce(monoids.welford(), x, mean, ("c",), KERNEL, more=(rstd,),
                       more_ops=((ops.shift(eps), ops.rsqrt()),))]
        local += [] if stats else ["Mean", "Rstd"]
        if weight:
            body.append(_from_row(x, mean, rstd, w, b if bias else None, s.t("Y")))
        elif bias:
            body += [Pointwise("normalize", (x, mean, rstd), s.t("N0", dt=f32), KERNEL),
                     Pointwise("add", (s.t("N0", dt=f32), b), s.t("Y"), KERNEL)]
            local.append("N0")
        else:
            body.append(Pointwise("normalize", (x, mean, rstd), s.t("Y"), KERNEL))
    else:
        # on one block: the mean, then the mean of squared deviations (two plain reductions), and
        # the output from the deviations
        d, d2 = s.t("D", dt=f32), s.t("D2", dt=f32)
        body = [Reduce("mean", x, mean, ("c",), KERNEL),
                Pointwise("sub", (x, mean), d, KERNEL),
                Pointwise("mul", (d, d), d2, KERNEL),
                Reduce("mean", d2, rstd, ("c",), KERNEL, (ops.shift(eps), ops.rsqrt()))]
        local += ["D", "D2"] + ([] if stats else ["Mean", "Rstd"])
        steps = [("mul", rstd)] + ([("mul", w)] if weight else []) + ([("add", b)] if bias else [])
        if plan.row_memory == "RF" and weight and dtype != "f32" and plan.vec * 2 < 16:
            # an odd row (accesses narrower than 16 bytes) waits in registers: the output from it,
            # (x - mean) · rstd · w (+ b), so the deviations die with the variance instead of
            # waiting beside the row for the output (fewer registers: 48 -> 38 at 16384 x 1023).
            # Measured on an H200 (bench/rows.py --old, bf16 / f16): 16384 x 1023 2.33 -> 2.46 /
            # 2.44 -> 2.51 TB/s, 32768 x 1001 2.62 -> 2.77, 16384 x 2047 2.68 -> 2.75; the rows of
            # 16-byte vectors read 0.8-1.2 % slower with it (4096 x 4096, 4096 x 1536) and keep
            # the deviations
            body.append(_from_row(x, mean, rstd, w, b if bias else None, s.t("Y")))
            steps = []
        cur = d
        for i, (op, other) in enumerate(steps):
            last = i == len(steps) - 1
            nxt = s.t("Y") if last else s.t(f"N{i}", dt=f32)
            body.append(Pointwise(op, (cur, other), nxt, KERNEL))
            if not last:
                local.append(f"N{i}")
            cur = nxt
    spec = Fused.kernel(*load, *body, results=("Y", "Mean", "Rstd") if stats else ())
    return schedule_rows(spec, plan, tuple(local), row="Xr")


__all__ = ["rmsnorm", "add_rmsnorm", "layernorm", "schedule_rows", "plan_rows", "check_args"]
