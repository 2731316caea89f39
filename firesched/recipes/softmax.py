"""Softmax over the last dimension as a fused spec: the row is read once into registers, its
maximum and the sum of exponentials are reduced there, and the row is written once::

    Fused<kernel>[Move(X -> Xr); Reduce(max over c: Xr -> M); Pointwise(sub: Xr, M -> E)
                  with scale(s·log2 e), exp2(); Reduce(sum over c: E -> Z) with rcp(); Pointwise(mul: E, Z -> Y)]
      tile(r=1) >> to_blocks()                          # rows.row_plan picks the tiling
      place(Xr, RF) >> place(M, RF) >> place(E, RF) >> place(Z, RF)
      part(i, tile(c=span), tile(c=8) >> to_threads(), done()) for every part

A row split over a thread-block cluster takes its two statistics in one tuple reduction instead
(``monoids.softmax_stats``: each thread's ``(max, sum exp)``, merged online), so the cluster's
blocks exchange once per row: ``Reduce(softmax_stats over c: Xr -> M, Z with rcp())``, and writes
its output in one pass from the row, ``Pointwise(exp2_scaled_diff_mul: Xr, M, C, Z -> Y)`` with the
scale times log2(e) in a register ``C`` (``Init``), so no f32 copy of the exponentials waits between parts; its
row part waits in shared memory (``rows.row_plan``: ``row_memory="SH"``).

``causal=True`` masks the elements past the diagonal (``c > r + diagonal``) to ``-inf`` as the
row is loaded — ``ops.causal`` on the ``Move`` —, so they count in neither statistic and come out
as 0 (torch's ``softmax(x.masked_fill(~torch.ones(R, C).tril(diagonal).bool(), -inf))``, the
reference of causal attention).

Every exponential is ``2^(log2(e) · scale · (x - max))``, one ``ex2.approx`` (``ops.exp2``: 2 ulp)
instead of ``expf``'s range reduction, which made the kernels issue-bound on an H100.
``E = exp(scale · (x - max))`` never overflows (its largest element is 1) and the sum is at least
1, so large-magnitude rows give no inf or NaN.  Padded elements of a row whose length is not a
multiple of the threads' tiles are skipped by the reductions (in the tuple, a part of a row whose
elements are all masked holds ``(-inf, 0)``, which merges without a NaN).  ``scale`` must be positive (the
maximum of ``scale · x`` is then ``scale · max(x)``).
"""

from __future__ import annotations

from .. import monoids, ops
from ..schedule import Schedule
from ..spec import Fused, Init, Move, Pointwise, Reduce
from ..tensor import KERNEL
from . import rows as _rows
from .norms import _Specs, check_args, recipe_plan, schedule_rows


def softmax(rows: int, cols: int, *, dtype: str = "f16", arch: str | None = None, scale: float = 1.0,
            causal: bool = False, diagonal: int = 0, exchange: str | None = None,
            tuple_stats: bool | None = None, plan=None) -> Schedule:
    """``Y = softmax(scale · X, axis=-1)`` over rows of ``cols`` elements (torch's
    ``softmax(x * scale, dim=-1)``), statistics in f32; input ``X`` (rows x cols).  ``causal=True``
    masks ``X[r, c]`` where ``c > r + diagonal`` (the row's first element is never masked when
    ``diagonal >= 0``).  ``exchange``: how a row split over a cluster combines, ``"push"``
    (``st.async`` pushes and an mbarrier; None, the default) or ``"barrier"`` (``barrier.cluster``),
    as ``to_blocks(exchange=...)``.  ``tuple_stats``: the maximum and the sum in one tuple
    reduction (True) or two (False); None: one where the row is split over a cluster or waits in
    shared memory, but two on a persistent block that prefetches its rows with room for the
    exponentials in registers (``rows.deviations_fit``).  ``plan``:
    a ``recipes.rows.RowPlan`` instead of the tile model's (``rows.row_plan``)."""
    check_args("softmax", rows, cols, dtype, arch)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"recipes.softmax: scale={scale!r}; allowed: a positive number")
    if not isinstance(causal, bool):
        raise ValueError(f"recipes.softmax: causal={causal!r}; allowed: True, False")
    if isinstance(diagonal, bool) or not isinstance(diagonal, int) or (causal and diagonal < 0):
        raise ValueError(f"recipes.softmax: diagonal={diagonal!r}; allowed: an int >= 0 (a negative diagonal "
                         "masks whole rows, whose softmax is undefined)")
    if tuple_stats is not None and not isinstance(tuple_stats, bool):
        raise ValueError(f"recipes.softmax: tuple_stats={tuple_stats!r}; allowed: True, False, None (by the plan)")
    plan = recipe_plan("causal" if causal else "softmax", rows, cols, dtype, arch, exchange=exchange, plan=plan)
    s = _Specs(rows, cols, dtype)
    f32 = "f32"
    xr, m, e, z = s.t("Xr"), s.t("M", ("r",), f32), s.t("E", dt=f32), s.t("Z", ("r",), f32)
    # Z holds 1 / sum: the row's elements multiply by it (a division per element would take the
    # slow path of the IEEE division for every masked, i.e. zero, exponential)
    load = Move(s.t("X"), xr, KERNEL, (ops.causal(diagonal),) if causal else ())
    if _rows.one_pass(plan) and not _rows.deviations_fit(plan, "softmax") if tuple_stats is None else tuple_stats:
        # the maximum and the sum of exponentials in one reduction: the cluster's blocks exchange
        # once per row; then the output in one pass, exp(scale · (x - max)) · (1 / sum) with the
        # scale in a register c: no f32 copy of the row's exponentials waits between parts
        c = s.t("C", ("r",), f32)
        spec = Fused.kernel(
            load,
            Reduce(monoids.softmax_stats(scale), xr, m, ("c",), KERNEL, more=(z,), more_ops=((ops.reciprocal(),),)),
            Init(c, float(scale) * ops.LOG2E, KERNEL),
            Pointwise("exp2_scaled_diff_mul", (xr, m, c, z), s.t("Y"), KERNEL))
        return schedule_rows(spec, plan, ("Xr", "M", "Z", "C"), row="Xr")
    # on one block two plain reductions, each exponential taken once (the tuple's online merge
    # takes a second one per element: 2.78 -> 2.30 TB/s at 32768 x 32768 bf16)
    spec = Fused.kernel(
        load,
        Reduce("max", xr, m, ("c",), KERNEL),
        Pointwise("sub", (xr, m), e, KERNEL, (ops.scale(scale * ops.LOG2E), ops.exp2())),
        Reduce("sum", e, z, ("c",), KERNEL, (ops.reciprocal(),)),
        Pointwise("mul", (e, z), s.t("Y"), KERNEL))
    return schedule_rows(spec, plan, ("Xr", "M", "E", "Z"), row="Xr")


__all__ = ["softmax"]
