"""Barriers a kernel does not need: rules place a block-wide barrier wherever their own reasoning
asks for one, without seeing their neighbours' (a copy into shared memory ends with "the tile is
filled", the next part of a fused kernel starts with "the earlier parts are done with it").  Two
cases are redundant whatever the rules were::

    __syncthreads();    // the first statement of the kernel: no thread has done anything yet
    ...
    __syncthreads();    // a second barrier right after a first (only comments between):
    __syncthreads();    //   every thread has already arrived at the first one

Only block-wide barriers (``ir.Barrier`` of barrier 0 over every thread) in straight-line code at
the top of the kernel body are touched; loops, branches and roles keep theirs.
"""

from __future__ import annotations

from ... import ir


def _block_wide(s) -> bool:
    return isinstance(s, ir.Barrier) and s.threads == 0 and not s.arrive and isinstance(s.bar_id, int) \
        and s.bar_id == 0


def without_redundant_barriers(body: list) -> list:
    """``body`` (a kernel's top-level statements) without a leading block-wide barrier and without
    a block-wide barrier that follows another with only comments between (nested ``Seq`` are
    straight-line code too)."""
    return _strip(list(body), True)[0]


def _strip(body: list, after_barrier: bool) -> tuple[list, bool]:
    out: list = []
    for s in body:
        if isinstance(s, ir.Seq):
            inner, after_barrier = _strip(list(s.body), after_barrier)
            out.append(ir.Seq(tuple(inner)))
        elif _block_wide(s) and after_barrier:
            out.append(ir.Comment(f"({s.comment}: no barrier needed here)"))
        else:
            out.append(s)
            if not isinstance(s, ir.Comment):
                after_barrier = _block_wide(s)
    return out, after_barrier


__all__ = ["without_redundant_barriers"]
