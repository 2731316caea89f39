"""What a spec means, in numpy: the reference a schedule of it must reproduce.

``reference(spec, *arrays)`` evaluates an unscheduled kernel-level spec — ``MatMul`` (batched,
broadcast operands), ``Move`` (casts, transposes), ``Pointwise`` (broadcasting inputs),
``Reduce`` (sum, max, min, mean), ``Fused`` (its body in order, intermediates by name) — in
float64, every input rounded to its tensor's element type first and every stored result rounded
to its own (as the kernel stores it).  Element-wise ``ops`` on a spec (``Move.ops``,
``Pointwise.ops``, ``Reduce.ops``) apply before the store.

``schedule_reference(schedule, *arrays)`` is the meaning of a *schedule*: its spec plus the
element-wise ops its strategies added — an ``epilogue(...)`` on the store of the result, a
``prologue(...)`` on the loads of an operand — with the arrays in the order ``firesched.interpret``
takes them (the spec's inputs, then the extra tensors the ops read: a bias, a residual).

``w4a16_reference(a, q, scales, zeros, group_size)`` is the meaning of a weight-only int4 GEMM:
``a (M, K) @ dequantize_int4(q, scales, zeros, group_size) (K, N)``, the weights dequantised in
float32 (``firesched.quant``) and the product summed in float64, returned as float32.

The formulas are the op values' own (``EpilogueOp.reference``, ``ops.SCALAR_OPS``): this checks a
schedule against its spec, not the ops' definitions (the project's own tests check those against
formulas written independently, ``tests/oracles.py``).
"""

from __future__ import annotations

import attrs
import numpy as np

from .. import dtypes as dt
from ..errors import ScheduleError
from ..ops import SCALAR_OPS
from ..quant import dequantize_int4
from ..schedule import Schedule
from ..spec import Fused, Init, MatMul, Move, Pointwise, Reduce
from ..tensor import GL

__all__ = ["reference", "schedule_reference", "input_tiles", "extra_inputs", "rounded", "w4a16_reference"]


def rounded(x, dtype) -> np.ndarray:
    """``x`` rounded to element type ``dtype`` (round to nearest even), back in float64."""
    d = dt.dtype(dtype)
    return np.asarray(x, dtype=np.float64).astype(d.np).astype(np.float64)


def input_tiles(spec) -> tuple:
    """The spec's input tiles, in the order ``interpret`` takes their arrays."""
    return tuple(t for t in spec.inputs if not t.tensor.workspace)


def _logical_shape(tile) -> tuple[int, ...]:
    t = tile.tensor
    return tuple(t.extent(d) for d in t.dims)


def _apply_ops(x: np.ndarray, ops, extras: dict, extra_dtype) -> np.ndarray:
    """``x`` (2-D or less: the ops' M x N frame) after the element-wise ``ops``; an extra tensor is
    rounded to ``extra_dtype`` (the kernel holds it in the result's type)."""
    for op in ops:
        need = {e.name: rounded(extras[e.name], extra_dtype) for e in op.extras()}
        x = np.asarray(op.reference(x, need), dtype=np.float64)
    return x


def _aligned(x: np.ndarray, dims: tuple[str, ...], to: tuple[str, ...]) -> np.ndarray:
    """``x`` over ``dims`` viewed over ``to`` (a superset, in its order): broadcast where absent."""
    order = [dims.index(d) for d in to if d in dims]
    y = np.transpose(x, order) if order else x
    shape = [x.shape[dims.index(d)] if d in dims else 1 for d in to]
    return y.reshape(shape)


def _eval(spec, env: dict, extras: dict) -> None:
    """Evaluate one spec on ``env`` (tensor name -> float64 array in its dims order), storing its
    outputs, rounded to their element types."""
    if isinstance(spec, Fused):
        for sp in spec.body:
            _eval(sp, env, extras)
        return
    if isinstance(spec, MatMul):
        a, b, c = spec.a.tensor, spec.b.tensor, spec.c.tensor
        m, n, k = spec.roles
        batch = spec.batch_dims
        A = _aligned(env[a.name], a.dims, batch + (m, k))
        B = _aligned(env[b.name], b.dims, batch + (k, n))
        out = np.matmul(A, B)
        out = np.broadcast_to(out, tuple(c.extent(d) for d in batch) + out.shape[-2:])
        env[c.name] = rounded(_aligned(out, batch + (m, n), c.dims), c.dtype)
        return
    if isinstance(spec, Init):
        t = spec.dst.tensor
        values = spec.value if isinstance(spec.value, tuple) else (spec.value,)
        if len(values) != 1:
            raise ScheduleError("no numpy reference for a tuple Init (a monoid's identity)", spec=spec,
                                field="value", value=spec.value, allowed="one float",
                                fix="compare with a reference of your own (assert_schedule_correct(..., reference=fn))")
        env[t.name] = rounded(np.full(tuple(t.extent(d) for d in t.dims), float(values[0])), t.dtype)
        return
    if isinstance(spec, Move):
        x = env[spec.src.name]
        x = _apply_ops(x, spec.ops, extras, spec.dst.tensor.dtype)
        env[spec.dst.name] = rounded(_aligned(x, spec.src.tensor.dims, spec.dst.tensor.dims), spec.dst.tensor.dtype)
        return
    if isinstance(spec, Pointwise):
        out = spec.out.tensor
        args = [_aligned(env[t.name], t.tensor.dims, out.dims) for t in spec.inputs]
        y = np.broadcast_to(SCALAR_OPS[spec.op].np(*args), tuple(out.extent(d) for d in out.dims))
        y = _apply_ops(np.asarray(y, dtype=np.float64), spec.ops, extras, out.dtype)
        env[out.name] = rounded(y, out.dtype)
        return
    if isinstance(spec, Reduce) and spec.monoid is not None:
        # a tuple reduction: the monoid's own numpy meaning gives each output from the whole
        # reduced array (independent of the programs the lowering runs)
        src = spec.src.tensor
        axes = tuple(src.dims.index(a) for a in spec.axes)
        kept = tuple(d for d in src.dims if d not in spec.axes)
        ys = spec.monoid.reference(np.asarray(env[src.name], dtype=np.float64), axes)
        for (t, ops_), y in zip(spec.output_ops(), ys):
            dst = t.tensor
            y = np.asarray(y, dtype=np.float64).reshape(tuple(dst.extent(d) for d in dst.dims)) if not kept else \
                _aligned(y, kept, dst.dims)
            env[dst.name] = rounded(_apply_ops(y, ops_, extras, dst.dtype), dst.dtype)
        return
    if isinstance(spec, Reduce):
        src, dst = spec.src.tensor, spec.dst.tensor
        x = env[src.name]
        axes = tuple(src.dims.index(a) for a in spec.axes)
        fn = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}[spec.op]
        y = fn(x, axis=axes)
        kept = tuple(d for d in src.dims if d not in spec.axes)
        y = np.asarray(y, dtype=np.float64).reshape(tuple(dst.extent(d) for d in dst.dims)) if not kept else \
            _aligned(y, kept, dst.dims)
        y = _apply_ops(y, spec.ops, extras, dst.dtype)
        env[dst.name] = rounded(y, dst.dtype)
        return
    raise ScheduleError("no numpy reference for this spec", spec=spec, field="spec", value=type(spec).__name__,
                        allowed="MatMul, Move, Pointwise, Reduce, Init, Fused",
                        fix="compare with a reference of your own (assert_schedule_correct(..., reference=fn))")


def reference(spec, *arrays, extras: dict | None = None):
    """The numpy meaning of kernel-level ``spec`` on ``arrays`` (its inputs, in ``spec.inputs``
    order, each in its tensor's dims order): the result (float64, rounded to the output's element
    type), or a tuple of them for a spec with several results.  ``extras`` maps the name of an
    extra tensor the spec's ops read (a bias) to its values."""
    tiles = input_tiles(spec)
    if len(arrays) != len(tiles):
        raise ValueError(f"reference: {spec} takes {len(tiles)} arrays ({', '.join(t.name for t in tiles)}), "
                         f"got {len(arrays)}")
    env = {}
    for t, a in zip(tiles, arrays):
        a = np.asarray(a)
        if a.shape != _logical_shape(t):
            raise ValueError(f"reference: {t.name} has shape {a.shape}; {spec} expects {_logical_shape(t)} "
                             f"(dims {', '.join(t.tensor.dims)})")
        env[t.name] = rounded(a, t.tensor.dtype)
    _eval(spec, env, dict(extras or {}))
    outs = [env[t.name] for t in spec.outputs]
    return outs[0] if len(outs) == 1 else tuple(outs)


# --------------------------------------------------------------------------- schedules

def _added_ops(schedule: Schedule):
    """(prologue ops by input name, epilogue ops by output name) the strategies put on moves of
    the kernel's global tensors: ops on a move out of an input, ops on a move into a result."""
    inputs = {t.name for t in input_tiles(schedule.spec)}
    outputs = {t.name for t in schedule.spec.outputs}
    pro: dict = {}
    epi: dict = {}
    for node in schedule.root.walk():
        sp = node.spec
        if isinstance(sp, Reduce) and isinstance(schedule.spec, MatMul) and sp.ops and sp.dst.name in outputs:
            # split-K: the kernel that adds a MatMul's parts applies its epilogue
            epi.setdefault(sp.dst.name, tuple(sp.ops))
            continue
        if not isinstance(sp, Move) or not sp.ops or sp.level == schedule.spec.level:
            continue
        if sp.dst.name in outputs and sp.dst.memory == GL:
            epi.setdefault(sp.dst.name, tuple(sp.ops))
        elif sp.src.name in inputs:
            # group scales that scale_partials() moved onto the partial products mean the same
            # weights (the scale applied in f32 to the sums instead of rounded into each weight)
            pro.setdefault(sp.src.name, tuple(attrs.evolve(op, partials=False) if getattr(op, "partials", False)
                                              else op for op in sp.ops))
    return pro, epi


def _loaded_dtypes(schedule: Schedule) -> dict:
    """The register type each input is loaded into where a move changes it (int4 codes
    dequantised to f16 / bf16): what its prologue ops' results are rounded to."""
    inputs = {t.name for t in input_tiles(schedule.spec)}
    out = {}
    for node in schedule.root.walk():
        sp = node.spec
        # a conversion out of global memory is the spec's own (a cast), except int4 codes, which
        # may be dequantised straight from global memory into a fragment
        if isinstance(sp, Move) and sp.src.name in inputs and sp.dst.dtype != sp.src.dtype and (
                sp.src.memory != GL or sp.src.dtype.is_subbyte):
            out.setdefault(sp.src.name, sp.dst.dtype)
    return out


def extra_inputs(schedule: Schedule) -> tuple:
    """``(name, shape)`` of the extra tensors the ops of ``schedule`` read, in the order
    ``interpret`` takes them after the spec's inputs (a bias along n has shape ``(N,)``)."""
    spec = schedule.spec
    pro, epi = _added_ops(schedule)
    out = spec.outputs[0].tensor
    ext = {d: out.extent(d) for d in out.dims}
    m = n = None
    if isinstance(spec, MatMul):
        m, n = spec.m, spec.n
    elif len(out.dims) >= 2:
        m, n = ext[out.dims[-2]], ext[out.dims[-1]]
    elif out.dims:
        n = ext[out.dims[-1]]
    # a matrix extra (a residual) has C's shape; a swapped MatMul (Cᵀ = Bᵀ Aᵀ) has its m role on
    # C's columns, and its vectors are along the roles (the recipe turned their axes)
    matrix = (ext[out.dims[-2]], ext[out.dims[-1]]) if len(out.dims) >= 2 else (m, n)
    seen, res = set(), []
    owners = [(name, ops) for name, ops in pro.items()] + [(None, ops) for ops in epi.values()] + \
        [(None, getattr(spec, "ops", ()))]
    for owner, ops in owners:
        for op in ops:
            for e in op.extras():
                if e.name in seen:
                    continue
                seen.add(e.name)
                if e.kind == "groups":
                    k = spec.k if isinstance(spec, MatMul) else 1
                    # one row per group of k, one column per element of the operand's other dim
                    # (the weights' columns, whichever MatMul role the weights play)
                    cols = n
                    if owner is not None and isinstance(spec, MatMul):
                        t = spec.operand(owner).tensor
                        cols = next((t.extent(d) for d in t.dims if d != spec.k_dim), n)
                    shape = (1 if not e.group else -(-k // e.group), cols)
                else:
                    shape = {"vector_n": (n,), "vector_m": (m,), "matrix": matrix}[e.kind]
                res.append((e.name, shape))
    return tuple(res)


def schedule_reference(schedule: Schedule, *arrays):
    """The numpy meaning of ``schedule`` on ``arrays`` as ``firesched.interpret`` takes them: its
    spec with the prologue ops its strategies put on the inputs (each op's result rounded to the
    input's type, as the registers hold it) and the epilogue ops on the stored result."""
    spec = schedule.spec
    tiles = input_tiles(spec)
    names = [e for e, _ in extra_inputs(schedule)]
    if len(arrays) != len(tiles) + len(names):
        want = [t.name for t in tiles] + names
        raise ValueError(f"schedule_reference: the schedule takes {len(want)} arrays ({', '.join(want)}), "
                         f"got {len(arrays)}")
    extras = dict(zip(names, arrays[len(tiles):]))
    pro, epi = _added_ops(schedule)
    loaded = _loaded_dtypes(schedule)
    ins = []
    for t, a in zip(tiles, arrays):
        x = rounded(a, t.tensor.dtype)
        into = loaded.get(t.name, t.tensor.dtype)
        for op in pro.get(t.name, ()):
            x = rounded(_apply_ops(x, (op,), extras, into), into)
        if into != t.tensor.dtype:
            # the operand is computed with as the type it was loaded into (dequantised weights)
            spec = spec.with_operand(t.name, attrs.evolve(spec.operand(t.name), tensor=attrs.evolve(
                spec.operand(t.name).tensor, dtype=into, packing=None)))
        ins.append(x)
    if not epi:
        return reference(spec, *ins, extras=extras)
    # the epilogue runs on the unrounded result: evaluate in the accumulator's precision, then the ops
    wide = _widened(spec)
    got = reference(wide, *ins, extras=extras)
    outs = got if isinstance(got, tuple) else (got,)
    res = []
    for t, y in zip(spec.outputs, outs):
        y = _apply_ops(y, epi.get(t.name, ()), extras, t.tensor.dtype)
        res.append(rounded(y, t.tensor.dtype))
    return res[0] if len(res) == 1 else tuple(res)


def _widened(spec):
    """``spec`` with its results stored in f64 (the epilogue rounds them afterwards)."""
    def widen(tile):
        return attrs.evolve(tile, tensor=attrs.evolve(tile.tensor, dtype=dt.dtype("f64")))

    outs = {t.name for t in spec.outputs}
    if isinstance(spec, Fused):
        return attrs.evolve(spec, body=tuple(_widened(sp) if any(t.name in outs for t in sp.outputs) else sp
                                             for sp in spec.body))
    for t in spec.outputs:
        spec = spec.with_operand(t.name, widen(t))
    return spec


# --------------------------------------------------------------------------- weight-only int4

def w4a16_reference(a, q, scales, zeros=None, group_size: int | None = 128) -> np.ndarray:
    """``C (M, N) = a (M, K) @ W`` with ``W = dequantize_int4(q, scales, zeros, group_size)``
    (``(K, N)``, float32): the activations as given (f16 / bf16 / f32 values), the weights
    dequantised in float32, the products summed in float64 and the result returned as float32.
    ``q``, ``scales``, ``zeros`` are what ``firesched.quant.quantize_int4`` returns."""
    w = dequantize_int4(q, scales, zeros, group_size)
    x = np.asarray(a)
    if x.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"w4a16_reference: a has shape {x.shape}; it must be (M, K) with K = {w.shape[0]}, "
                         f"the rows of q")
    return (x.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)


def epilogue_reference(schedule: Schedule, product, *extras) -> np.ndarray:
    """The result of a one-output ``schedule`` (a GEMM with an epilogue) given its unrounded
    product ``product``, computed elsewhere (in float32 on a GPU where numpy would take
    minutes): the epilogue ops its strategies added, then the rounding to the result's type.
    ``extras`` are the tensors the ops read, in ``extra_inputs`` order.  A schedule with
    prologue ops has no such shortcut (``ValueError``: use ``schedule_reference``)."""
    names = [e for e, _ in extra_inputs(schedule)]
    if len(extras) != len(names):
        raise ValueError(f"epilogue_reference: the schedule's ops read {len(names)} tensors ({', '.join(names)}), "
                         f"got {len(extras)}")
    pro, epi = _added_ops(schedule)
    if pro:
        raise ValueError(f"epilogue_reference: the schedule has prologue ops on {', '.join(pro)}; "
                         "use schedule_reference(schedule, *arrays)")
    out = schedule.spec.outputs[0]
    y = _apply_ops(np.asarray(product, dtype=np.float64), epi.get(out.name, ()) + tuple(getattr(schedule.spec, "ops", ())),
                   dict(zip(names, extras)), out.tensor.dtype)
    return rounded(y, out.tensor.dtype)
