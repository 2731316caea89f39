"""Hypothesis strategies over schedules: strategy chains for a spec, the schedules ``check()``
accepts, the chains it must refuse, and inputs.

* ``strategy_chains(spec, fitting=False)`` draws a list of strategy values for ``spec`` — block,
  warp or thread tiles, shared-memory staging, pipeline stages, the atom — with sizes that may not
  divide or fit (``fitting=True``: sizes that divide the extents and suit the atom, so most are
  accepted);
* ``schedules(spec, arch="sm_80")`` draws checked ``Schedule`` values (chains ``check(arch)``
  accepts);
* ``refused_chains(spec, arch="sm_80")`` draws chains that ``spec.schedule(*chain)`` or
  ``check(arch)`` refuses — with ``ScheduleError``, and nothing else;
* ``arrays_for(spec_or_schedule)`` draws the input arrays ``interpret`` takes (float32 values in
  ``[-bound, bound]``; Hypothesis shrinks a failing input towards zeros).

Kinds covered: ``MatMul`` without batch dimensions (f16 or bf16 operands, mma.sync atoms),
``Move``, ``Pointwise`` and ``Reduce`` (one reduced dimension) of any rank, and ``Fused`` row
kernels of those (a norm, a softmax: parts over rows and one reduced column dimension, locals in
registers or shared memory, every part mapped the same way).
"""

from __future__ import annotations

try:
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("firesched.testing.strategies needs Hypothesis, a development dependency of firesched: "
                      "pip install hypothesis (or pip install -e '.[dev]')") from e

import numpy as np

from ..errors import ScheduleError
from ..hardware.atoms import sm80
from ..schedule import Schedule
from ..spec import Fused, MatMul, Move, Pointwise, Reduce
from ..strategies import (
    done,
    move_to_regs,
    move_to_smem,
    part,
    pipeline,
    place,
    tile,
    to_blocks,
    to_threads,
    to_warps,
)
from ..tensor import RF, SH
from .reference import extra_inputs, input_tiles

__all__ = ["strategy_chains", "schedules", "refused_chains", "arrays_for", "try_schedule"]

_KINDS = ("MatMul (no batch dimensions), Move, Pointwise, Reduce (one reduced dimension), Fused row kernels "
          "of those")


def _unsupported(spec, why: str) -> ValueError:
    return ValueError(f"strategy_chains: {why}: {spec}; allowed: kernel-level {_KINDS}; "
                      f"fix: build schedules of other specs by hand and check them with assert_schedule_correct")


def _sizes(extent: int, fitting: bool, options) -> st.SearchStrategy:
    """Tile sizes for a dim of ``extent``: ``options`` (powers of two and odd ones), or with
    ``fitting`` those that divide the extent (and the extent itself)."""
    if fitting:
        divs = sorted({o for o in options if extent % o == 0} | {extent})
        return st.sampled_from(divs)
    return st.sampled_from(sorted(set(options)))


def _mma_atom(spec: MatMul):
    name = f"mma_m16n8k16_{spec.a.tensor.dtype.name}_f32"
    atom = getattr(sm80, name, None)
    if atom is None or spec.b.tensor.dtype != spec.a.tensor.dtype or spec.acc.name != "f32":
        raise _unsupported(spec, f"no mma.sync atom {name} (f16 or bf16 operands of one type, f32 accumulation)")
    return atom


def _matmul(spec: MatMul, fitting: bool):
    if spec.batch_dims:
        raise _unsupported(spec, "batched MatMul")
    atom = _mma_atom(spec)
    M, N, K = spec.m, spec.n, spec.k

    @st.composite
    def chains(draw):
        if fitting:
            bm = draw(st.sampled_from([s for s in (16, 32, 64, 128) if s <= max(16, M)]))
            bn = draw(st.sampled_from([s for s in (8, 16, 32, 64, 128) if s <= max(8, N)]))
            bk = draw(st.sampled_from([s for s in (16, 32, 64) if s <= max(16, K)]))
            wm = draw(st.sampled_from([s for s in (16, 32, 64) if bm % s == 0]))
            wn = draw(st.sampled_from([s for s in (8, 16, 32, 64) if bn % s == 0]))
            wk = draw(st.sampled_from([s for s in (16, 32) if bk % s == 0]))
        else:
            bm = draw(st.sampled_from([16, 32, 48, 64, 96]))
            bn = draw(st.sampled_from([8, 16, 24, 32, 48, 64]))
            bk = draw(st.sampled_from([8, 16, 24, 32, 48, 64]))
            wm = draw(st.sampled_from([16, 32, 48]))
            wn = draw(st.sampled_from([8, 16, 24, 32]))
            wk = draw(st.sampled_from([16, 24, 32]))
        stages = draw(st.integers(1, 4))
        return [tile(m=bm, n=bn) >> to_blocks(), tile(k=bk), move_to_smem(spec.a.name), move_to_smem(spec.b.name),
                pipeline(stages), tile(m=wm, n=wn) >> to_warps(), tile(k=wk), move_to_regs(spec.a.name),
                move_to_regs(spec.b.name), tile(m=16, n=8, k=16) >> done(atom)]

    return chains()


def _elementwise(spec, fitting: bool, staged_name=None):
    out = spec.outputs[0].tensor
    dims = out.dims

    @st.composite
    def chains(draw):
        block, thread = {}, {}
        for i, d in enumerate(dims):
            inner = i == len(dims) - 1
            block[d] = draw(_sizes(out.extent(d), fitting, (8, 16, 24, 32, 64) if inner else (1, 2, 3, 4, 8)))
            thread[d] = draw(_sizes(block[d], fitting, (1, 2, 3, 4, 8) if inner else (1, 2)))
        chain = [tile(**block) >> to_blocks()]
        if staged_name is not None and draw(st.booleans()):
            chain.append(move_to_smem(staged_name))
        return chain + [tile(**thread) >> to_threads(), done()]

    return chains()


def _reduce(spec: Reduce, fitting: bool):
    if len(spec.axes) != 1:
        raise _unsupported(spec, "Reduce over several dimensions")
    (axis,) = spec.axes
    kept = tuple(d for d in spec.src.tensor.dims if d != axis)
    C = spec.src.tensor.extent(axis)

    @st.composite
    def chains(draw):
        rows = draw(st.sampled_from(["warps", "threads", "block"]))
        br = draw(st.sampled_from([1, 2, 4]))
        chunk = draw(_sizes(C, fitting, (16, 64, 100, 256)) if not fitting else st.sampled_from([32, 64, 128, 256]))
        lanes = draw(st.sampled_from([None, 4, 8, 32]))
        tc = draw(st.sampled_from([1, 2, 4, 8] if fitting else [1, 2, 3, 4, 8]))
        split = None if fitting else draw(st.sampled_from([None, 32, 100, 512]))
        one = {d: 1 for d in kept}
        rows_tile = {d: br for d in kept}
        chain = [tile(**rows_tile) >> to_blocks() if split is None else tile(**rows_tile, **{axis: split}) >> to_blocks()]
        if rows == "warps" and kept:
            chain.append(tile(**one) >> to_warps())
        elif rows == "threads" and br > 1 and kept:
            chain.append(tile(**one) >> to_threads())
        chain.append(tile(**{axis: chunk}))
        if lanes is not None:
            chain.append(tile(**{axis: max(1, chunk // lanes)}) >> to_threads())
        chain.append(tile(**{axis: tc}) >> to_threads() if lanes is None else tile(**{axis: tc}))
        chain.append(done())
        return chain

    return chains()


def _fused(spec: Fused, fitting: bool):
    """Row kernels: every part tiled over the rows the same way (one warp, several threads or a
    whole block per row), the reduced column dimension in chunks across the threads of a row;
    each local in registers (then every part must map the row identically, which ``check()``
    verifies) or in shared memory."""
    if any(isinstance(sp, (MatMul, Fused)) for sp in spec.body):
        raise _unsupported(spec, "Fused with a MatMul part")
    axes = {a for sp in spec.body if isinstance(sp, Reduce) for a in sp.axes}
    if len(axes) > 1:
        raise _unsupported(spec, "Fused reducing over several dimensions")
    dims = spec.outputs[0].tensor.dims
    col = next(iter(axes)) if axes else dims[-1]
    widest = max((sp for sp in spec.body), key=lambda sp: len(sp.outputs[0].tensor.dims))
    tensor = next(t.tensor for t in widest.operands if col in t.tensor.dims)
    rows = tuple(d for d in tensor.dims if d != col)
    C = tensor.extent(col)
    locals_ = [t.name for t in spec.locals]

    @st.composite
    def chains(draw):
        br = draw(st.sampled_from([1, 2, 4] if fitting else [1, 2, 3, 4]))
        unit = draw(st.sampled_from(["warps", "block"])) if rows else "block"
        # threads per row: a warp, or whole warps of a block (fitting); any count otherwise
        if fitting:
            lanes = 32 if unit == "warps" else draw(st.sampled_from([32, 64, 128]))
            tc = draw(st.sampled_from([t for t in (1, 2, 4, 8) if t * lanes <= max(C, lanes)]))
            chunk = tc * lanes
        else:
            lanes = draw(st.sampled_from([3, 4, 8, 32, 64]))
            tc = draw(st.sampled_from([1, 2, 4, 8]))
            chunk = draw(st.sampled_from([tc * lanes, C, 100]))
        one = {d: 1 for d in rows}
        row = []
        if unit == "warps":
            row.append(tile(**one) >> to_warps())
        row += [tile(**{col: chunk}), tile(**one, **{col: tc}) >> to_threads(), done()]
        # a shared local is tiled like the row: its chunks must divide it (fitting)
        homes = [RF, SH] if not fitting or C % chunk == 0 else [RF]
        where = {n: draw(st.sampled_from(homes)) for n in locals_}
        return [tile(**{d: br for d in rows}) >> to_blocks(),
                *(place(n, where[n]) for n in locals_),
                *(part(i, *row) for i in range(len(spec.body)))]

    return chains()


def strategy_chains(spec, *, fitting: bool = False) -> st.SearchStrategy:
    """Lists of strategy values for kernel-level ``spec`` (``spec.schedule(*chain)``), with tile
    sizes that may not divide or fit, stage counts 1..4, any unit arrangement; ``fitting=True``
    draws sizes that divide the extents and suit the atom.  ``check()`` accepts some and refuses
    the others (``schedules``, ``refused_chains``)."""
    if isinstance(spec, Schedule):
        spec = spec.spec
    if getattr(spec, "level", None) is None or str(spec.level) != "kernel":
        raise _unsupported(spec, "not a kernel-level spec")
    if isinstance(spec, Fused):
        return _fused(spec, fitting)
    if isinstance(spec, MatMul):
        return _matmul(spec, fitting)
    if isinstance(spec, Move):
        return _elementwise(spec, fitting, staged_name=spec.src.name)
    if isinstance(spec, Pointwise):
        return _elementwise(spec, fitting)
    if isinstance(spec, Reduce):
        return _reduce(spec, fitting)
    raise _unsupported(spec, f"no chains for {type(spec).__name__}")


def try_schedule(spec, chain, arch: str = "sm_80") -> Schedule | None:
    """``spec.schedule(*chain)`` checked for ``arch``, or None when a strategy or ``check()``
    refused it with ``ScheduleError`` (any other exception propagates: it is a bug)."""
    try:
        sched = spec.schedule(*chain)
        sched.check(arch)
    except ScheduleError:
        return None
    return sched


def schedules(spec, arch: str = "sm_80", *, fitting: bool = True) -> st.SearchStrategy:
    """Checked schedules of ``spec`` for ``arch``: chains from ``strategy_chains(spec,
    fitting=fitting)`` that ``check(arch)`` accepts (Hypothesis discards the refused ones)."""
    return strategy_chains(spec, fitting=fitting).map(lambda c: try_schedule(spec, c, arch)).filter(
        lambda s: s is not None)


def refused_chains(spec, arch: str = "sm_80") -> st.SearchStrategy:
    """Chains for ``spec`` that a strategy or ``check(arch)`` refuses with ``ScheduleError``
    (drawn from ``strategy_chains(spec)``, sizes that may not fit, keeping the refused ones).
    GEMM chains are often refused (tiles that do not divide on-chip operands); element-wise chains
    seldom are (partial global tiles are predicated), and Hypothesis may find none."""
    return strategy_chains(spec, fitting=False).filter(lambda c: try_schedule(spec, c, arch) is None)


def arrays_for(spec_or_schedule, *, bound: float = 4.0) -> st.SearchStrategy:
    """Tuples of input arrays for ``interpret``: the spec's inputs (in its dims order) and, for a
    schedule, the extra tensors its ops read; float64 arrays of float32 values in
    ``[-bound, bound]``."""
    sched = spec_or_schedule if isinstance(spec_or_schedule, Schedule) else None
    spec = sched.spec if sched is not None else spec_or_schedule
    shapes = [tuple(t.tensor.extent(d) for d in t.tensor.dims) for t in input_tiles(spec)]
    if sched is not None:
        shapes += [shape for _, shape in extra_inputs(sched)]
    elements = st.floats(-bound, bound, allow_nan=False, allow_infinity=False, width=32)
    return st.tuples(*(hnp.arrays(np.float32, s, elements=elements) for s in shapes)).map(
        lambda arrs: tuple(a.astype(np.float64) for a in arrs))
