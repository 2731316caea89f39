"""Operands that several atom families decode alike: per-thread scalars and mbarrier addresses.

An ``ir.Scalar`` operand is an index expression evaluated per thread (an mbarrier count, a TMA
coordinate, wgmma's ``scale_d``).  An mbarrier operand is a ``MemRef`` into an ``ir.MBarrier``
buffer; the atom acts on the mbarrier of the issuing thread's own block, whose id is what
``bar_ids`` returns.
"""

from __future__ import annotations

import numpy as np

from ... import ir
from ...errors import InternalError
from ..messages import describe


def scalar(k, s, name: str) -> np.ndarray:
    """Per-thread values of the ``Scalar`` bound to operand ``name``, ``[T]``."""
    ref = s.arg(name)
    if not isinstance(ref, ir.Scalar):
        raise InternalError(f"{describe(s)}: operand {name} takes an ir.Scalar, not {ref!r}")
    return k.ctx.per_thread(ref.value)


def bar_ids(k, s, name: str, thr: np.ndarray) -> np.ndarray:
    """The ids of the mbarriers operand ``name`` addresses for threads ``thr`` (bounds checked)."""
    ctx, mem, bars = k.ctx, k.mem, k.bars
    ref = s.arg(name)
    if not isinstance(ref, ir.MemRef) or not isinstance(ref.buffer, ir.MBarrier):
        ctx.hazard(f"{describe(s)}: operand {name} must address an ir.MBarrier, not "
                   f"{getattr(ref, 'buffer', ref)!r}")
    mem.shared_of(ref.buffer)
    off = ctx.per_thread(ref.offset)[thr]
    mem.check_bounds(ref, off[:, None], thr, "mbarrier access")
    return bars.base[ref.buffer.name] + off + ctx.rank[thr] * bars.n
