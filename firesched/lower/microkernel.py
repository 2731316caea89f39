"""One-atom test kernels: for any catalog atom, a one-warp ``Program`` that issues it once.

``atom_program(atom)`` returns ``(program, inputs, expected)``:

* ``program`` has one kernel of one warp (32 threads; quad-pair atoms run their four quad-pairs
  at once).  Its inputs sit in global memory; plain per-thread copies (``ld.global``,
  ``st.shared`` + a barrier) move them to where the atom wants them, the atom is issued once
  (its ``AtomCall`` carries the comment ``"atom under test"``), and every thread stores its own
  results to the global buffer ``out``.
* ``inputs`` are ``random_inputs(atom, 0)``: arrays by input buffer name.
* ``expected(inputs)`` computes ``out`` from the atom's numpy ``semantics`` and its TV / address
  layouts at tile level, without the interpreter.

The programs stay legal CUDA once printed: buffers are 16-byte aligned, each address meets the
alignment of the atom that uses it, every thread writes only its own slots and a barrier
separates shared-memory stores from the loads of other threads.

Data shapes, by family:

* COPY / CP_ASYNC: ``inp`` and ``out`` are ``[32, n]`` (``n = atom.values_for(dtype)``); thread
  ``t`` moves chunk ``t`` through the atom, and chunks are permuted on the way
  (``perm(t) = (7t + 3) % 32``) so that wrong addresses show.
* LDMATRIX: ``tile`` is the atom's memory tile ``(rows, cols)`` (row-major, staged to a padded
  shared buffer); ``out[t, v]`` is value ``v`` of thread ``t``'s destination fragment.
* MMA: ``a`` ``[G, m, k]``, ``b`` ``[G, k, n]``, ``c`` ``[G, m, n]`` and ``out`` ``[G, m, n]``,
  one slice per thread group (``G`` = 1 for warp atoms, 4 for quad-pair atoms).
* SHUFFLE: ``src`` ``[32]`` values and ``lane`` ``[32]`` per-lane operands; ``out`` ``[32]``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import dtypes as dt
from ..hardware.atoms import base as atoms
from ..hardware.atoms import catalog
from . import ir
from .expr import Var

__all__ = ["atom_program", "random_inputs", "UNDER_TEST", "perm"]

WARP_THREADS = 32
UNDER_TEST = "atom under test"
_TID = ir.tid(WARP_THREADS)


def perm(t):
    """The chunk permutation of the copy kernels: ``(7t + 3) % 32`` (a bijection of 0..31)."""
    return (t * 7 + 3) % WARP_THREADS


_INV_PERM = np.argsort([perm(t) for t in range(WARP_THREADS)])


def atom_program(atom: atoms.Atom, dtype: dt.DType | str | None = None
                 ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """``(program, inputs, expected)`` for one issue of ``atom``; see the module docstring."""
    plan = _plan(atom, dtype)
    return plan.program, plan.random(0), plan.expected


def random_inputs(atom: atoms.Atom, seed: int = 0, dtype: dt.DType | str | None = None) -> dict[str, np.ndarray]:
    """Random inputs for ``atom_program(atom, dtype)``.

    Float data are multiples of 1/4 in [-2, 2]: exact in every float type, and small enough that
    the products and sums of one MMA issue are exact too, so results match to the last bit.
    """
    return _plan(atom, dtype).random(seed)


# --------------------------------------------------------------------------- plans

class _Plan:
    def __init__(self, program: ir.Program, expected: Callable, lanes: tuple[str, ...] = ()):
        self.program = program
        self.expected = expected
        self.lanes = lanes          # input names holding lane numbers

    def random(self, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        out = {}
        for b in self.program.inputs:
            if b.name in self.lanes:
                out[b.name] = rng.integers(0, WARP_THREADS, size=b.shape).astype(b.dtype.np)
            else:
                out[b.name] = _random(rng, b.dtype, b.shape)
        return out


def _random(rng, d: dt.DType, shape) -> np.ndarray:
    if d.is_float:
        return (rng.integers(-8, 9, size=shape) / 4.0).astype(d.np)
    lo, hi = (-(1 << (d.bits - 1)), 1 << (d.bits - 1)) if d.kind == "int" else (0, 1 << d.bits)
    return rng.integers(lo, hi, size=shape).astype(d.np)


def _plan(atom: atoms.Atom, dtype) -> _Plan:
    d = None if dtype is None else dt.dtype(dtype)
    fam = atom.family
    if fam == atoms.COPY:
        return _copy_plan(atom, d)
    if fam == atoms.CP_ASYNC:
        return _cp_async_plan(atom, d, commit=None)
    if fam == atoms.LDMATRIX:
        return _ldmatrix_plan(atom, d)
    if fam == atoms.MMA:
        return _mma_plan(atom, d)
    if fam == atoms.SHUFFLE:
        return _shuffle_plan(atom, d)
    if fam == atoms.SYNC:
        if "commit" in atom.name:
            return _cp_async_plan(_copy_atom("cp_async", 16), d, commit=atom)
        if "wait" in atom.name:
            if "$n" in atom.ptx:
                atom = catalog.with_immediates(atom, n=0)
            return _cp_async_plan(_copy_atom("cp_async", 16), d, wait=atom)
        if atom.group == atoms.BLOCK and "bar" in atom.name:
            return _copy_plan(_copy_atom("ld_shared", 16), d, barrier=atom)
    raise ValueError(f"atom_program: no one-atom kernel for {atom!r} (family {fam!r}); "
                     f"supported: mma, ldmatrix, copy, cp_async, shuffle atoms, bar_sync and the cp.async "
                     f"commit and wait")


def _row_major(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _gbuf(name: str, d: dt.DType, shape, role: str = "in") -> ir.GlobalBuffer:
    shape = tuple(int(s) for s in shape)
    return ir.GlobalBuffer(name, d, shape, _row_major(shape), role)


def _call(atom, comment: str = "", pred=1, **args) -> ir.AtomCall:
    return ir.AtomCall(atom, tuple(args.items()), pred, comment)


_MOVES = {"ld_global": ("GL", "RF"), "st_global": ("RF", "GL"), "ld_shared": ("SH", "RF"),
          "st_shared": ("RF", "SH"), "cp_async": ("GL", "SH")}


def _copy_atom(kind: str, width: int) -> atoms.Atom:
    """The per-thread move ``kind`` (``ld_global``, ``st_shared``, ``cp_async``...) of ``width`` bytes."""
    return catalog.copy_atom(*_MOVES[kind], width)


def _width(d: dt.DType, n: int) -> int:
    bits = d.bits * n
    if bits % 8 or bits // 8 not in (1, 2, 4, 8, 16):
        raise ValueError(f"{n} elements of {d} ({bits} bits) are no single per-thread move")
    return bits // 8


def _program(atom, params_in, out, body, shared=(), regs=(), threads=WARP_THREADS) -> ir.Program:
    kernel = ir.Kernel(
        name=f"micro_{atom.name}", params=(*params_in, out), grid=(1, 1, 1), threads=threads,
        shared=tuple(shared), regs=tuple(regs), body=ir.Seq(body),
        header=f"one issue of {atom!r}")
    return ir.Program(kernels=(kernel,), inputs=tuple(params_in), output=out)


def _default_move_dtype(atom) -> dt.DType:
    return dt.u8 if atom.width == 1 else dt.f16


def _chunks_semantics(atom, x: np.ndarray) -> np.ndarray:
    """The atom's tile semantics applied to each thread's chunk (row) of ``x``."""
    return np.stack([np.asarray(atom.semantics(row[None, :]))[0] for row in x])


# --------------------------------------------------------------------------- COPY

def _copy_plan(atom, d, barrier=None) -> _Plan:
    d = d or _default_move_dtype(atom)
    n = atom.values_for(d)
    if n == 0:
        raise ValueError(f"atom_program: {atom.name} moves {atom.width} bytes, which is no whole number of {d}")
    w = atom.width
    inp = _gbuf("inp", d, (WARP_THREADS, n))
    out = _gbuf("out", d, (WARP_THREADS, n), "out")
    r = ir.RegBuffer("r", d, n)
    t = _TID
    mems = (atom.src_memory, atom.dst_memory)
    under = {"comment": UNDER_TEST}
    if "SH" not in mems:
        ld = atom if atom.src_memory == "GL" else _copy_atom("ld_global", w)
        st = atom if atom.dst_memory == "GL" else _copy_atom("st_global", w)
        body = [
            _call(ld, src=ir.MemRef(inp, perm(t) * n), dst=ir.RegRef(r, 0), **(under if ld is atom else {})),
            _call(st, dst=ir.MemRef(out, t * n), src=ir.RegRef(r, 0), **(under if st is atom else {})),
        ]

        def expected(inputs):
            x = np.asarray(inputs["inp"]).astype(d.np)
            return _chunks_semantics(atom, x[[perm(i) for i in range(WARP_THREADS)]])
        return _Plan(_program(atom, (inp,), out, body, regs=(r,)), expected)

    sh = ir.SharedBuffer("smem", d, WARP_THREADS * n, note=f"{WARP_THREADS} chunks of {n} {d}")
    r2 = ir.RegBuffer("r2", d, n)
    st = atom if atom.dst_memory == "SH" else _copy_atom("st_shared", w)
    ld = atom if atom.src_memory == "SH" else _copy_atom("ld_shared", w)
    sync = _call(barrier, comment=UNDER_TEST) if barrier is not None else ir.Barrier("stores before loads")
    body = [
        _call(_copy_atom("ld_global", w), src=ir.MemRef(inp, t * n), dst=ir.RegRef(r, 0)),
        _call(st, dst=ir.MemRef(sh, perm(t) * n), src=ir.RegRef(r, 0), **(under if st is atom else {})),
        sync,
        _call(ld, src=ir.MemRef(sh, t * n), dst=ir.RegRef(r2, 0), **(under if ld is atom else {})),
        _call(_copy_atom("st_global", w), dst=ir.MemRef(out, t * n), src=ir.RegRef(r2, 0)),
    ]

    def expected(inputs):
        x = np.asarray(inputs["inp"]).astype(d.np)
        return _chunks_semantics(atom, x[_INV_PERM])
    return _Plan(_program(atom, (inp,), out, body, shared=(sh,), regs=(r, r2)), expected)


# --------------------------------------------------------------------------- CP_ASYNC

def _cp_async_plan(atom, d, commit=None, wait=None) -> _Plan:
    d = d or _default_move_dtype(atom)
    n = atom.values_for(d)
    if n == 0:
        raise ValueError(f"atom_program: {atom.name} moves {atom.width} bytes, which is no whole number of {d}")
    w = atom.width
    inp = _gbuf("inp", d, (WARP_THREADS, n))
    out = _gbuf("out", d, (WARP_THREADS, n), "out")
    sh = ir.SharedBuffer("smem", d, WARP_THREADS * n, note=f"{WARP_THREADS} chunks of {n} {d}")
    r = ir.RegBuffer("r", d, n)
    t = _TID
    body = [
        _call(atom, src=ir.MemRef(inp, t * n), dst=ir.MemRef(sh, perm(t) * n),
              comment="" if commit is not None or wait is not None else UNDER_TEST),
        _call(commit, comment=UNDER_TEST) if commit is not None else ir.AsyncCommit(),
        _call(wait, comment=UNDER_TEST) if wait is not None else ir.AsyncWait(0),
        ir.Barrier("copies landed before other threads read them"),
        _call(_copy_atom("ld_shared", w), src=ir.MemRef(sh, t * n), dst=ir.RegRef(r, 0)),
        _call(_copy_atom("st_global", w), dst=ir.MemRef(out, t * n), src=ir.RegRef(r, 0)),
    ]

    def expected(inputs):
        x = np.asarray(inputs["inp"]).astype(d.np)
        return _chunks_semantics(atom, x[_INV_PERM])
    return _Plan(_program(commit or wait or atom, (inp,), out, body, shared=(sh,), regs=(r,)), expected)


# --------------------------------------------------------------------------- LDMATRIX

def _ldmatrix_plan(atom, d) -> _Plan:
    d = d or atom.dtype_of("src")
    if d.bits != 16:
        raise ValueError(f"atom_program: ldmatrix moves 16-bit elements, not {d}")
    src = next(o for o in atom.operands if o.memory == "SH")
    dst = next(o for o in atom.operands if o.memory == "RF")
    rows, cols = (int(x) for x in atom.shape[:2])
    lanes = src.addr.size()
    ld = cols + 8                              # padded row pitch, rows stay 16-byte aligned
    tile = _gbuf("tile", d, (rows, cols))
    nvals = dst.tv.num_values
    out = _gbuf("out", d, (WARP_THREADS, nvals), "out")
    sh = ir.SharedBuffer("smem", d, rows * ld, note=f"{rows}x{cols} row-major, pitch {ld}")
    stage_n = rows * cols // WARP_THREADS      # elements each thread stages
    stage_w = _width(d, stage_n)
    r_stage = ir.RegBuffer("stage", d, stage_n)
    frag = ir.RegBuffer("frag", d, nvals)
    t = _TID
    first = t * stage_n                        # row-major flat index of the thread's chunk
    idx = src.addr(t % lanes)                  # column-major tile index of the lane's row
    row, col = idx % rows, idx // rows
    out_w = _width(d, nvals)
    body = [
        _call(_copy_atom("ld_global", stage_w), src=ir.MemRef(tile, first), dst=ir.RegRef(r_stage, 0)),
        _call(_copy_atom("st_shared", stage_w), dst=ir.MemRef(sh, (first // cols) * ld + first % cols),
              src=ir.RegRef(r_stage, 0)),
        ir.Barrier("tile staged"),
        _call(atom, src=ir.MemRef(sh, row * ld + col), dst=ir.RegRef(frag, 0), comment=UNDER_TEST),
        _call(_copy_atom("st_global", out_w), dst=ir.MemRef(out, t * nvals), src=ir.RegRef(frag, 0)),
    ]

    def expected(inputs):
        x = np.asarray(inputs["tile"]).astype(d.np)
        return dst.tv.scatter(np.asarray(atom.semantics(x)))
    return _Plan(_program(atom, (tile,), out, body, shared=(sh,), regs=(r_stage, frag)), expected)


# --------------------------------------------------------------------------- MMA

def _local_thread(group: str, t):
    """(group index, thread index within the group) of block thread ``t`` for a warp kernel."""
    if group == atoms.WARP:
        return 0, t
    if group == atoms.QUADPAIR:
        return (t // 4) % 4, t % 4 + 4 * (t // 16)
    raise ValueError(f"atom_program: MMA thread group {group!r} is not supported")


def _mma_plan(atom, d) -> _Plan:
    if d is not None:
        raise ValueError(f"atom_program: {atom.name} has fixed operand dtypes; pass dtype=None")
    groups = WARP_THREADS // atom.threads
    ops = {o.name: o for o in atom.operands if o.memory == "RF"}
    m, n, k = (int(x) for x in atom.shape)
    shapes = {"a": (m, k), "b": (k, n), "c": (m, n), "d": (m, n)}
    gbufs = {name: _gbuf(name, atom.dtype_of(name), (groups, *shapes[name])) for name in ("a", "b", "c")}
    out = _gbuf("out", atom.dtype_of("d"), (groups, m, n), "out")
    regs = {name: ir.RegBuffer(f"frag_{name}", atom.dtype_of(name), ops[name].tv.num_values)
            for name in ("a", "b", "c", "d")}
    g, q = _local_thread(atom.group, _TID)
    body = []
    for name in ("a", "b", "c"):
        tv = ops[name].tv
        v = Var(f"v_{name}", tv.num_values)
        rows_, cols_ = shapes[name]
        r, c = tv.coord(q, v)
        el = _copy_atom("ld_global", _width(atom.dtype_of(name), 1))
        body.append(ir.For(v, tv.num_values, _call(
            el, src=ir.MemRef(gbufs[name], g * rows_ * cols_ + r * cols_ + c), dst=ir.RegRef(regs[name], v)),
            unroll=True))
    body.append(_call(atom, d=ir.RegRef(regs["d"], 0), a=ir.RegRef(regs["a"], 0), b=ir.RegRef(regs["b"], 0),
                      c=ir.RegRef(regs["c"], 0), comment=UNDER_TEST))
    tv = ops["d"].tv
    v = Var("v_d", tv.num_values)
    r, c = tv.coord(q, v)
    el = _copy_atom("st_global", _width(atom.dtype_of("d"), 1))
    body.append(ir.For(v, tv.num_values, _call(
        el, dst=ir.MemRef(out, g * m * n + r * n + c), src=ir.RegRef(regs["d"], v)), unroll=True))

    def expected(inputs):
        res = [np.asarray(atom.semantics(*(np.asarray(inputs[x])[i].astype(atom.dtype_of(x).np)
                                            for x in ("a", "b", "c"))))
               for i in range(groups)]
        return np.stack(res).astype(atom.dtype_of("d").np)
    program = _program(atom, tuple(gbufs.values()), out, body, regs=tuple(regs.values()))
    return _Plan(program, expected)


# --------------------------------------------------------------------------- SHUFFLE

def _shuffle_plan(atom, d) -> _Plan:
    ins = [o for o in atom.operands if o.role == "in"]
    src_op = next(o for o in ins if o.name == "src")
    lane_op = next(o for o in ins if o is not src_op)
    dst_op = next(o for o in atom.operands if o.role == "out")
    d = d or atom.dtype_of(src_op.name)
    if d.bits != 32:
        raise ValueError(f"atom_program: {atom.name} shuffles 32-bit values, not {d}")
    lane_dt = atom.dtype_of(lane_op.name)
    src = _gbuf("src", d, (WARP_THREADS,))
    lane = _gbuf("lane", lane_dt, (WARP_THREADS,))
    out = _gbuf("out", d, (WARP_THREADS,), "out")
    rv, rl, ro = ir.RegBuffer("v", d, 1), ir.RegBuffer("l", lane_dt, 1), ir.RegBuffer("o", d, 1)
    t = _TID
    ld4, st4 = _copy_atom("ld_global", 4), _copy_atom("st_global", 4)
    body = [
        _call(ld4, src=ir.MemRef(src, t), dst=ir.RegRef(rv, 0)),
        _call(ld4, src=ir.MemRef(lane, t), dst=ir.RegRef(rl, 0)),
        _call(atom, comment=UNDER_TEST, **{dst_op.name: ir.RegRef(ro, 0), src_op.name: ir.RegRef(rv, 0),
                                           lane_op.name: ir.RegRef(rl, 0)}),
        _call(st4, dst=ir.MemRef(out, t), src=ir.RegRef(ro, 0)),
    ]

    def expected(inputs):
        return np.asarray(atom.semantics(np.asarray(inputs["src"]).astype(d.np),
                                         np.asarray(inputs["lane"]).astype(np.int64))).astype(d.np)
    return _Plan(_program(atom, (src, lane), out, body, regs=(rv, rl, ro)), expected, lanes=("lane",))
