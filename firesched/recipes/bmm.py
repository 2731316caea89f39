"""Batched GEMM: ``C[b] = A[b] @ B[b]`` for every batch element, with ``torch.bmm`` /
``torch.matmul`` semantics (an operand without the batch dimension is broadcast).

It is the GEMM recipe on a spec with a batch dimension, and nothing else: the batch index is one
more loop the block tiling maps onto the grid (``tile(b=1, m=BM, n=BN) >> to_blocks()``), so every
strategy and rule of the GEMM applies unchanged::

    MatMul<kernel>(A:GL f16[8x512x64], B:GL f16[8x64x512], C:GL f16[8x512x512]) acc f32
      tile(b=1, m=128, n=128) >> to_blocks()
      for b0 in block(8), m0 in block(4), n0 in block(4):
        MatMul<block>(A:GL f16[1x128x64], B:GL f16[1x64x128], C:GL f16[1x128x128]) acc f32
          ...                                    (the GEMM's K loop, stages, warps, atoms)

Parameters a caller leaves out come from the tile model (``recipes.tiles``), which counts the batch
in its waves of tiles.
"""

from __future__ import annotations

from ..errors import ScheduleError
from ..hardware.target import target as get_target
from ..hardware.target import target_names
from ..schedule import Schedule
from .gemm import GemmParams, gemm
from .tiles import params_sm80, params_sm90


def bmm(batch: int, M: int, N: int, K: int, dtype: str = "f16", arch: str | None = None, *, a_batched: bool = True,
        b_batched: bool = True, atoms: str | None = None, check: bool = True, params: GemmParams | None = None,
        **kwargs) -> Schedule:
    """The schedule of a batched matrix product over ``batch`` elements.

    ``a_batched=False`` (or ``b_batched``) takes a 2-D A (B) shared by every batch element.  Every
    other keyword is a ``recipes.gemm`` parameter (``block_m``, ``stages``, ``epilogue_ops``,
    ``layout``, ``out_dtype`` ...); the ones left out come from the tile model for this shape.
    ``params`` (a ``GemmParams``) gives the tile parameters at once instead, as in ``gemm``.
    ``arch`` None is the default target (the GPU present, else sm_90a).
    Kernels take ``k(A, B, *extras, C)`` with A of shape ``(batch, M, K)`` (or ``(M, K)``), B
    ``(batch, K, N)`` (or ``(K, N)``), C ``(batch, M, N)``."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise ScheduleError("batch is the number of matrix products", field="batch", value=batch,
                            allowed="a positive int", fix="bmm(8, M, N, K) for 8 products")
    try:
        tgt = get_target(arch)
    except ValueError as e:
        raise ScheduleError(str(e), field="arch", value=arch, allowed=target_names(),
                            fix="pass arch='sm_80' (or another target above), or None for the GPU present") from None
    if params is not None:
        return gemm(M, N, K, dtype, tgt.name, params=params, atoms=atoms, batch=batch, a_batched=a_batched,
                    b_batched=b_batched, check=check, **kwargs)
    fam = atoms or ("sm90a" if tgt.has_wgmma else "sm80")
    model = (params_sm90 if fam == "sm90a" else params_sm80)(M, N, K, batch=batch, sms=tgt.sm_count)
    model.pop("atoms")
    for k, v in model.items():
        kwargs.setdefault(k, v)
    return gemm(M, N, K, dtype, tgt.name, atoms=fam, batch=batch, a_batched=a_batched, b_batched=b_batched,
                check=check, **kwargs)
