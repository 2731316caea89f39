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
* CONVERT: one ``[32, values]`` input per register operand, named as the operand (``src`` of a
  dequantisation: eight 4-bit weights a thread; ``q``, ``s``, ``z`` of a scale: two halves), and
  ``out`` ``[32, values]``, the destination's values in value order (``dst`` register ``v // 2``,
  half ``v % 2``).  Each thread loads its row with one ``ld.global``, issues the atom once and
  stores its destination with one ``st.global``.

The sm_90a atoms get one-warpgroup programs (``wgmma_program``, ``tma_load_program``,
``tma_store_program``, their rank-3 to rank-5 versions ``tma_load_nd_program`` and ``tma_store_nd_program``
on a (batch..., rows, cols) tensor; stmatrix one warp, ``stmatrix_program``), described where they are
defined; ``atom_program`` picks one with default settings (the synchronisation atoms of a
family run in that family's program: ``wgmma_fence`` in a wgmma program, the mbarrier atoms in
the TMA load program; the cluster atoms in ``cluster_multicast_program``, a cluster of two
blocks).  setmaxnreg has none.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import dtypes as dt
from .. import ir
from ..hardware.atoms import base as atoms
from ..hardware.atoms import catalog, sm90a
from ..hardware.atoms import convert as cv
from ..hardware.tma import tma_coordinate_problems
from ..ir import expr as ex
from ..ir.expr import Var

__all__ = ["atom_program", "random_inputs", "UNDER_TEST", "perm", "wgmma_program", "tma_load_program",
           "tma_wgmma_program", "cluster_multicast_program",
           "tma_store_program", "tma_load_3d_program", "tma_load_nd_program", "tma_store_3d_program",
           "tma_store_nd_program", "stmatrix_program",
           "WARPGROUP_THREADS"]

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
    if atom.min_target == "sm_90a":
        return _sm90a_plan(atom, None if dtype is None else dt.dtype(dtype))
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
    def __init__(self, program: ir.Program, expected: Callable, lanes: tuple[str, ...] = (),
                 nonzero: tuple[str, ...] = ()):
        self.program = program
        self.expected = expected
        self.lanes = lanes          # input names holding lane numbers
        self.nonzero = nonzero      # input names holding set flags (1 .. 1000)

    def random(self, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        out = {}
        for b in self.program.inputs:
            if b.name in self.lanes:
                out[b.name] = rng.integers(0, WARP_THREADS, size=b.shape).astype(b.dtype.np)
            elif b.name in self.nonzero:
                out[b.name] = rng.integers(1, 1001, size=b.shape).astype(b.dtype.np)
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
    if fam == atoms.CONVERT:
        return _convert_plan(atom, d)
    if fam == atoms.FLAG:
        return _flag_plan(atom, d)
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
                     f"supported: mma, ldmatrix, copy, cp_async, shuffle, convert, flag atoms, bar_sync and "
                     f"the cp.async commit and wait")


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


# --------------------------------------------------------------------------- FLAG

def _flag_plan(atom, d) -> _Plan:
    """flag_store: thread t sets flag ``perm(t)`` of ``out`` to ``3t + 1``.  flag_add: thread t
    adds ``t + 1`` to counter ``perm(t) % 8`` of ``out`` (each counter the sum of four threads').
    flag_wait / flag_wait_count: thread t waits on flag ``perm(t)`` of ``flags`` (all set, at
    least 1), then stores 7 to ``out[t]``."""
    if d is not None:
        raise ValueError(f"atom_program: {atom.name} moves 32-bit flags; pass dtype=None")
    t = _TID
    out = _gbuf("out", dt.i32, (WARP_THREADS,), "out")
    if atom.name == "flag_add":
        body = [_call(atom, comment=UNDER_TEST, flag=ir.MemRef(out, perm(t) % 8), value=ir.Scalar(t + 1))]

        def expected_add(inputs):
            got = np.zeros(WARP_THREADS, dtype=np.int32)
            np.add.at(got, [perm(i) % 8 for i in range(WARP_THREADS)], np.arange(WARP_THREADS) + 1)
            return got
        return _Plan(_program(atom, (), out, body, regs=()), expected_add)
    if atom.name == "flag_store":
        body = [_call(atom, comment=UNDER_TEST, flag=ir.MemRef(out, perm(t)), value=ir.Scalar(t * 3 + 1))]

        def expected(inputs):
            got = np.zeros(WARP_THREADS, dtype=np.int32)
            got[[perm(i) for i in range(WARP_THREADS)]] = np.arange(WARP_THREADS) * 3 + 1
            return got
        return _Plan(_program(atom, (), out, body, regs=()), expected)
    flags = _gbuf("flags", dt.i32, (WARP_THREADS,))
    r = ir.RegBuffer("r", dt.i32, 1)
    wait = dict(value=ir.Scalar(1)) if atom.name == "flag_wait_count" else {}
    body = [_call(atom, comment=UNDER_TEST, flag=ir.MemRef(flags, perm(t)), **wait),
            ir.RegFill(ir.RegRef(r, 0), 1, 7.0),
            _call(_copy_atom("st_global", 4), dst=ir.MemRef(out, t), src=ir.RegRef(r, 0))]

    def expected_wait(inputs):
        return np.full(WARP_THREADS, 7, dtype=np.int32)
    return _Plan(_program(atom, (flags,), out, body, regs=(r,)), expected_wait, nonzero=("flags",))


# --------------------------------------------------------------------------- GRIDDEP

def _griddep_plan(atom, d) -> _Plan:
    """griddepcontrol.launch_dependents / .wait in a kernel launched the ordinary way (the wait
    returns at once, the trigger has no dependent): thread t issues it, then stores 7 to
    ``out[t]``."""
    if d is not None:
        raise ValueError(f"atom_program: {atom.name} moves no data; pass dtype=None")
    out = _gbuf("out", dt.i32, (WARP_THREADS,), "out")
    r = ir.RegBuffer("r", dt.i32, 1)
    body = [_call(atom, comment=UNDER_TEST), ir.RegFill(ir.RegRef(r, 0), 1, 7.0),
            _call(_copy_atom("st_global", 4), dst=ir.MemRef(out, _TID), src=ir.RegRef(r, 0))]

    def expected(inputs):
        return np.full(WARP_THREADS, 7, dtype=np.int32)
    return _Plan(_program(atom, (), out, body, regs=(r,)), expected)


# --------------------------------------------------------------------------- CONVERT

def _convert_plan(atom, d) -> _Plan:
    if d is not None:
        raise ValueError(f"atom_program: {atom.name} has fixed operand dtypes; pass dtype=None")
    ins = [o for o in atom.operands if o.role == "in"]
    dst = next(o for o in atom.operands if o.role == "out")
    t = _TID
    gins, regs, body, args = [], [], [], {}
    for o in ins:
        if o.tv is None:
            # a run-time scalar (shift_halves' q): lane l takes l, so one warp covers every value
            # an atom reads of it (its semantics take it modulo what matters)
            args[o.name] = ir.Scalar(t)
            continue
        od = atom.dtype_of(o.name)
        g = _gbuf(o.name, od, (WARP_THREADS, o.values))
        r = ir.RegBuffer(f"r_{o.name}", od, o.values)
        gins.append(g)
        regs.append(r)
        body.append(_call(_copy_atom("ld_global", _width(od, o.values)), src=ir.MemRef(g, t * o.values),
                          dst=ir.RegRef(r, 0)))
        args[o.name] = ir.RegRef(r, 0)
    dd = atom.dtype_of(dst.name)
    out = _gbuf("out", dd, (WARP_THREADS, dst.values), "out")
    r_dst = ir.RegBuffer(f"r_{dst.name}", dd, dst.values)
    regs.append(r_dst)
    body.append(_call(atom, comment=UNDER_TEST, **{dst.name: ir.RegRef(r_dst, 0)}, **args))
    body.append(_call(_copy_atom("st_global", _width(dd, dst.values)), dst=ir.MemRef(out, t * dst.values),
                      src=ir.RegRef(r_dst, 0)))

    def expected(inputs):
        lanes = np.arange(WARP_THREADS, dtype=np.int64)[:, None]
        words = [lanes if o.tv is None else cv.to_words(np.asarray(inputs[o.name]), atom.dtype_of(o.name))
                 for o in ins]
        return cv.from_words(np.asarray(atom.semantics(*words), dtype=np.uint32), dd)
    return _Plan(_program(atom, tuple(gins), out, body, regs=tuple(regs)), expected)


# --------------------------------------------------------------------------- sm_90a
#
# One-warpgroup (128-thread) programs for the Hopper atoms.  Shared-memory operands are staged
# element by element with ld.global / st.shared at the byte offsets of their canonical layout
# (``sm90a.canonical_offset`` swizzled), buffers aligned to the swizzle repeat so that offsets
# within the buffer swizzle like shared-window addresses.  Keyword arguments drop single steps
# (``fence``, ``proxy_fence``, ``wait``, a wrong ``parity``) to plant the hazards the interpreter
# must report; with the defaults every program is correct and runs on an sm_90a device.

WARPGROUP_THREADS = 128
_WG_TID = ir.tid(WARPGROUP_THREADS)


def _eq(a, b):
    return ex.binop("==", a, b)


def _smem(name: str, d: dt.DType, nbytes: int, swizzle: int, note: str) -> ir.SharedBuffer:
    align = max(128, sm90a.swizzle_atom_bytes(swizzle))
    return ir.SharedBuffer(name, d, -(-nbytes // (d.bits // 8)), align=align, note=note)


def _operand_layout(rows: int, swizzle: int, major: str) -> tuple[int, int, int]:
    """(lbo, sbo, bytes) of a dense canonical ``rows`` x 16 operand of 16-bit elements."""
    if major == "K":
        if swizzle == 0:
            # core matrices of 8 rows x 16 bytes: the 8-row groups of k 0-7 first, then of k 8-15
            return (rows // 8) * 128, 128, rows * 32
        return 16, 8 * swizzle, (rows // 8) * 8 * swizzle
    if swizzle == 0:
        # MN blocks of 8 elements x 8 k rows, then the k 8-15 half
        return (rows // 8) * 128, 128, rows * 32
    per_row = swizzle // 2                          # MN elements in one swizzled row
    blocks = -(-rows // per_row)
    return 2 * 8 * swizzle, 8 * swizzle, blocks * 2 * 8 * swizzle


def _stage(src: ir.GlobalBuffer, dst: ir.SharedBuffer, count: int, g_offset, s_byte, reg: ir.RegBuffer,
           name: str) -> ir.For:
    """Every thread moves elements ``e = tid + 128*i`` from ``src[g_offset(e)]`` to the shared byte
    ``s_byte(e)`` of ``dst``; ``count`` is a multiple of 128."""
    eb = src.dtype.bits // 8
    i = Var(name, count // WARPGROUP_THREADS)
    e = _WG_TID + WARPGROUP_THREADS * i
    return ir.For(i, count // WARPGROUP_THREADS, ir.Seq([
        _call(_copy_atom("ld_global", eb), src=ir.MemRef(src, g_offset(e)), dst=ir.RegRef(reg, 0)),
        _call(_copy_atom("st_shared", eb), dst=ir.MemRef(dst, ex.floordiv(s_byte(e), eb)), src=ir.RegRef(reg, 0)),
    ]))


def wgmma_program(atom: atoms.Atom, *, swizzle: int = 128, scale_d: int = 1, fence: bool = True,
                  proxy_fence: bool = True, wait: bool = True
                  ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """One warpgroup issues ``atom`` (a wgmma record) once: ``out = a @ b + c`` (``a @ b`` when
    ``scale_d`` is 0) with ``a`` [64, 16], ``b`` [16, N] and ``c``, ``out`` [64, N] f32.

    A (``_ss``, K-major or with ``_tnspa`` MN-major) and B sit in shared memory in the canonical
    layout of ``swizzle`` (0, 32, 64 or 128 bytes); ``_rs`` loads A's fragment from global memory.  ``fence=False`` leaves out the
    wgmma.fence, ``proxy_fence=False`` the fence.proxy.async after the shared stores,
    ``wait=False`` the wgmma.wait_group before the results are stored."""
    if atom.family != sm90a.WGMMA:
        raise ValueError(f"wgmma_program: {atom!r} is no wgmma atom")
    if swizzle not in sm90a.SWIZZLES:
        raise ValueError(f"wgmma_program: swizzle={swizzle!r}; allowed: 0, 32, 64, 128")
    ab = atom.dtype_of("a")
    m, n, k = (int(x) for x in atom.shape)
    eb = ab.bits // 8
    rs = any(o.name == "a" for o in atom.operands)
    b_major = sm90a.b_major(atom)
    t = _WG_TID
    a_g, b_g = _gbuf("a", ab, (m, k)), _gbuf("b", ab, (k, n))
    c_g, out = _gbuf("c", dt.f32, (m, n)), _gbuf("out", dt.f32, (m, n), "out")
    stage = ir.RegBuffer("stage", ab, 1)
    acc = ir.RegBuffer("acc", dt.f32, n // 2)
    regs = [stage, acc]
    shared = []
    body: list = []
    b_lbo, b_sbo, b_bytes = _operand_layout(n, swizzle, b_major)
    sb = _smem("sB", ab, b_bytes, swizzle, f"B {n}x16 {b_major}-major, swizzle {swizzle}")
    shared.append(sb)
    body.append(_stage(b_g, sb, n * k, lambda e: (e % k) * n + e // k,
                       lambda e: sm90a.SWIZZLES[swizzle](sm90a.canonical_offset(
                           e // k, e % k, b_lbo, b_sbo, swizzle, major=b_major, elem_bytes=eb)),
                       stage, "i_b"))
    desc_b = ir.DescRef(sb, 0, swizzle, b_lbo, b_sbo)
    if not rs:
        a_major = sm90a.a_major(atom)
        a_lbo, a_sbo, a_bytes = _operand_layout(m, swizzle, a_major)
        sa = _smem("sA", ab, a_bytes, swizzle, f"A 64x16 {a_major}-major, swizzle {swizzle}")
        shared.insert(0, sa)
        body.insert(0, _stage(a_g, sa, m * k, lambda e: e,
                              lambda e: sm90a.SWIZZLES[swizzle](sm90a.canonical_offset(
                                  e // k, e % k, a_lbo, a_sbo, swizzle, major=a_major, elem_bytes=eb)),
                              stage, "i_a"))
        a_arg = {"desc_a": ir.DescRef(sa, 0, swizzle, a_lbo, a_sbo)}
    if proxy_fence:
        body.append(_call(sm90a.fence_proxy_async, comment="shared stores visible to the async proxy"))
    body.append(ir.Barrier("operands staged"))
    tv = sm90a.tv_d(n)
    v = Var("v_c", n // 2)
    r, col = tv.coord(t, v)
    body.append(ir.For(v, n // 2, _call(_copy_atom("ld_global", 4), src=ir.MemRef(c_g, r * n + col),
                                        dst=ir.RegRef(acc, v)), unroll=True))
    if rs:
        frag = ir.RegBuffer("frag_a", ab, 8)
        regs.append(frag)
        va = Var("v_a", 8)
        ra, ca = sm90a.TV_A_RS.coord(t, va)
        body.append(ir.For(va, 8, _call(_copy_atom("ld_global", eb), src=ir.MemRef(a_g, ra * k + ca),
                                        dst=ir.RegRef(frag, va)), unroll=True))
        a_arg = {"a": ir.RegRef(frag, 0)}
    if fence:
        body.append(_call(sm90a.wgmma_fence))
    body.append(_call(atom, comment=UNDER_TEST, d=ir.RegRef(acc, 0), **a_arg, desc_b=desc_b,
                      scale_d=ir.Scalar(int(scale_d))))
    body.append(_call(sm90a.wgmma_commit))
    if wait:
        body.append(_call(catalog.with_immediates(sm90a.wgmma_wait, n=0)))
    vo = Var("v_d", n // 2)
    ro, co = tv.coord(t, vo)
    body.append(ir.For(vo, n // 2, _call(_copy_atom("st_global", 4), dst=ir.MemRef(out, ro * n + co),
                                         src=ir.RegRef(acc, vo)), unroll=True))

    def expected(inputs):
        a = np.asarray(inputs["a"]).astype(ab.np)
        b = np.asarray(inputs["b"]).astype(ab.np)
        c = np.asarray(inputs["c"]).astype(np.float32) if scale_d else np.zeros((m, n), np.float32)
        return np.asarray(atom.semantics(a, b, c)).astype(np.float32)

    program = _program(atom, (a_g, b_g, c_g), out, body, shared=shared, regs=regs, threads=WARPGROUP_THREADS)
    return program, _Plan(program, expected).random(0), expected


def _box_io(d: dt.DType, shape, box, swizzle: int):
    eb = d.bits // 8
    bc = int(box[1])

    def s_byte(e):
        return sm90a.SWIZZLES[swizzle]((e // bc) * (bc * eb) + (e % bc) * eb)
    return s_byte


def _check_coords(what: str, d: dt.DType, coords, store: bool = False) -> None:
    """Refuse box coordinates a GPU would fault on (``tma.tma_coordinate_problems``)."""
    problems = tma_coordinate_problems(d.bits // 8, coords, store=store)
    if problems:
        raise ValueError(f"{what}: " + "; ".join(problems))


def _box_expected(x: np.ndarray, box, coords) -> np.ndarray:
    """The box of ``x`` at column ``coords[0]``, row ``coords[1]``, zeros outside ``x``."""
    br, bc = box
    c0, c1 = coords
    out = np.zeros((br, bc), dtype=x.dtype)
    for i in range(br):
        for j in range(bc):
            r, c = c1 + i, c0 + j
            if 0 <= r < x.shape[0] and 0 <= c < x.shape[1]:
                out[i, j] = x[r, c]
    return out


def tma_load_program(dtype: dt.DType | str = "f16", *, shape=(40, 72), box=(16, 64), coords=(16, 32),
                     swizzle: int = 128, parity: int = 0, arrivals: str = "one"
                     ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """One warpgroup loads the box of ``x`` [``shape``] at ``coords`` = (column, row) with one TMA
    load completing on an mbarrier, waits on ``parity`` and copies the box to ``out`` [``box``].

    Thread 0 initialises the barrier (``fence.mbarrier_init``, then a Barrier), expects the box's
    bytes and issues the load; with ``arrivals="all"`` the barrier counts 128 arrivals and the
    other threads arrive too.  The default box hangs over the bottom and right edges of ``x``,
    so its last rows and columns are zeros.  Coordinates that do not start the box on a 16-byte
    boundary of the row are refused (``ValueError``): a GPU faults on them."""
    d = dt.dtype(dtype)
    _check_coords("tma_load_program", d, coords)
    eb = d.bits // 8
    br, bc = (int(b) for b in box)
    if (br * bc) % WARPGROUP_THREADS:
        raise ValueError(f"tma_load_program: the box has {br * bc} elements, not a multiple of 128")
    if arrivals not in ("one", "all"):
        raise ValueError(f"tma_load_program: arrivals={arrivals!r}; allowed: 'one', 'all'")
    x = _gbuf("x", d, shape)
    out = _gbuf("out", d, (br, bc), "out")
    tmap = ir.TensorMapParam("tmap_x", x, (br, bc), swizzle)
    sm = _smem("smem", d, br * bc * eb, swizzle, f"{br}x{bc} box, swizzle {swizzle}")
    bar = ir.MBarrier("bar", 1)
    reg = ir.RegBuffer("r", d, 1)
    t = _WG_TID
    count = WARPGROUP_THREADS if arrivals == "all" else 1
    body = [
        ir.If(_eq(t, 0), ir.Seq([
            _call(sm90a.mbarrier_init, bar=ir.MemRef(bar, 0), count=ir.Scalar(count)),
            _call(sm90a.fence_mbarrier_init),
        ])),
        ir.Barrier("barrier initialised"),
        ir.If(_eq(t, 0), ir.Seq([
            _call(sm90a.mbarrier_arrive_expect_tx, bar=ir.MemRef(bar, 0), bytes=ir.Scalar(tmap.box_bytes)),
            _call(sm90a.tma_load_2d, comment=UNDER_TEST, dst=ir.MemRef(sm, 0), tmap=tmap,
                  c0=ir.Scalar(int(coords[0])), c1=ir.Scalar(int(coords[1])), mbar=ir.MemRef(bar, 0)),
        ])),
    ]
    if arrivals == "all":
        body.append(ir.If(ex.ge(t, 1), _call(sm90a.mbarrier_arrive, bar=ir.MemRef(bar, 0))))
    body.append(_call(sm90a.mbarrier_try_wait, bar=ir.MemRef(bar, 0), parity=ir.Scalar(int(parity))))
    s_byte = _box_io(d, shape, box, swizzle)
    i = Var("i_out", br * bc // WARPGROUP_THREADS)
    e = t + WARPGROUP_THREADS * i
    body.append(ir.For(i, br * bc // WARPGROUP_THREADS, ir.Seq([
        _call(_copy_atom("ld_shared", eb), src=ir.MemRef(sm, ex.floordiv(s_byte(e), eb)), dst=ir.RegRef(reg, 0)),
        _call(_copy_atom("st_global", eb), dst=ir.MemRef(out, e), src=ir.RegRef(reg, 0)),
    ])))

    def expected(inputs):
        return _box_expected(np.asarray(inputs["x"]).astype(d.np), (br, bc), coords)

    kernel = ir.Kernel(name="micro_tma_load_2d", params=(tmap, out), grid=(1, 1, 1), threads=WARPGROUP_THREADS,
                       shared=(sm, bar), regs=(reg,), body=ir.Seq(body),
                       header=f"TMA load of a {br}x{bc} box of x{list(shape)} at {tuple(coords)}, swizzle {swizzle}")
    program = ir.Program(kernels=(kernel,), inputs=(x,), output=out)
    return program, _Plan(program, expected).random(0), expected


def cluster_multicast_program(dtype: dt.DType | str = "f16", *, shape=(40, 72), box=(16, 64),
                              coords=(8, 16), swizzle: int = 128, cluster: int = 2, remote_arrive: bool = True
                              ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """A cluster of ``cluster`` blocks (one warpgroup each) loads one box of ``x`` [``shape``] at
    ``coords`` = (column, row) into every block: block ``r`` issues rows ``r * box[0] / cluster``..
    of the box as one TMA multicast to all blocks, so each block's copy is assembled from all of
    them.  Each block then copies its box to ``out[r]`` (``out`` is [cluster * box rows, box cols])::

        thread 0 of each block: init full (1 arrival), done (``cluster`` arrivals); fence
        barrier.cluster                                   # the inits are visible cluster-wide
        thread 0: expect_tx(full, whole box); multicast rows r*h..r*h+h-1 to every block
        all: wait full; copy the box to out[r]
        thread 0: arrive on done of every block (mapa + remote mbarrier.arrive)
        all: wait done                                    # every block has read its box
        barrier.cluster                                   # no block leaves before the others

    ``remote_arrive=False`` arrives only on the block's own ``done`` barrier, which then never
    completes: the interpreter reports the deadlock (a GPU would hang)."""
    d = dt.dtype(dtype)
    _check_coords("cluster_multicast_program", d, coords)
    eb = d.bits // 8
    br, bc = (int(b) for b in box)
    C = int(cluster)
    if C < 2 or br % C or (br // C) % 8 or (br * bc) % WARPGROUP_THREADS:
        raise ValueError(f"cluster_multicast_program: box {box} must split into {C} slices of whole "
                         f"8-row swizzle atoms, with a multiple of 128 elements")
    h = br // C
    x = _gbuf("x", d, shape)
    out = _gbuf("out", d, (C * br, bc), "out")
    tmap = ir.TensorMapParam("tmap_x", x, (h, bc), swizzle)
    sm = _smem("smem", d, br * bc * eb, swizzle, f"{br}x{bc} box, swizzle {swizzle}, from {C} multicasts")
    full = ir.MBarrier("full", 1)
    done = ir.MBarrier("done", 1)
    reg = ir.RegBuffer("r", d, 1)
    t = _WG_TID
    rank = ex.mod(ir.bid(0, C), C)
    arrivals = [_call(sm90a.mbarrier_arrive_cluster, bar=ir.MemRef(done, 0), cta=ir.Scalar(q))
                for q in range(C)] if remote_arrive else [_call(sm90a.mbarrier_arrive, bar=ir.MemRef(done, 0))]
    body = [
        ir.If(_eq(t, 0), ir.Seq([
            _call(sm90a.mbarrier_init, bar=ir.MemRef(full, 0), count=ir.Scalar(1)),
            _call(sm90a.mbarrier_init, bar=ir.MemRef(done, 0), count=ir.Scalar(C)),
            _call(sm90a.fence_mbarrier_init),
        ])),
        _call(sm90a.barrier_cluster, comment="the mbarriers of every block are initialised"),
        ir.If(_eq(t, 0), ir.Seq([
            _call(sm90a.mbarrier_arrive_expect_tx, bar=ir.MemRef(full, 0), bytes=ir.Scalar(br * bc * eb)),
            _call(sm90a.tma_load_2d_multicast, comment=UNDER_TEST, dst=ir.MemRef(sm, rank * (h * bc)), tmap=tmap,
                  c0=ir.Scalar(int(coords[0])), c1=ir.Scalar(int(coords[1]) + rank * h), mbar=ir.MemRef(full, 0),
                  mask=ir.Scalar((1 << C) - 1)),
        ])),
        _call(sm90a.mbarrier_try_wait, bar=ir.MemRef(full, 0), parity=ir.Scalar(0)),
    ]
    s_byte = _box_io(d, shape, box, swizzle)
    i = Var("i_out", br * bc // WARPGROUP_THREADS)
    e = t + WARPGROUP_THREADS * i
    body.append(ir.For(i, br * bc // WARPGROUP_THREADS, ir.Seq([
        _call(_copy_atom("ld_shared", eb), src=ir.MemRef(sm, ex.floordiv(s_byte(e), eb)), dst=ir.RegRef(reg, 0)),
        _call(_copy_atom("st_global", eb), dst=ir.MemRef(out, rank * (br * bc) + e), src=ir.RegRef(reg, 0)),
    ])))
    body += [
        ir.If(_eq(t, 0), ir.Seq(arrivals)),
        _call(sm90a.mbarrier_try_wait, bar=ir.MemRef(done, 0), parity=ir.Scalar(0),
              comment="every block of the cluster has read its box"),
        _call(sm90a.barrier_cluster, comment="no block leaves while another may still arrive on its barriers"),
    ]

    def expected(inputs):
        one = _box_expected(np.asarray(inputs["x"]).astype(d.np), (br, bc), coords)
        return np.concatenate([one] * C)

    kernel = ir.Kernel(name="micro_tma_multicast", params=(tmap, out), grid=(C, 1, 1), threads=WARPGROUP_THREADS,
                       shared=(sm, full, done), regs=(reg,), body=ir.Seq(body), cluster=C,
                       header=f"a cluster of {C} blocks: TMA multicast of a {br}x{bc} box of x{list(shape)} at "
                              f"{tuple(coords)}, swizzle {swizzle}, in {C} slices")
    program = ir.Program(kernels=(kernel,), inputs=(x,), output=out)
    return program, _Plan(program, expected).random(0), expected


def dsmem_program(dtype: dt.DType | str = "f32", *, cluster: int = 2, barrier: bool = True
                  ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """A cluster of ``cluster`` blocks (one warp each): block ``r`` stores its row ``x[r]`` (32
    four-byte values) in its shared memory, and after a ``barrier.cluster`` each lane reads the
    value of the block of rank ``r + 1`` (mod ``cluster``) with ``ld_shared_cluster_4`` into
    ``out[r]``::

        st.shared  smem[lane] = x[r, lane]
        barrier.cluster                          # every block's row is visible cluster-wide
        out[r, lane] = ld.shared::cluster(smem[lane], rank (r + 1) % cluster)
        barrier.cluster                          # no block leaves while another reads its memory

    ``barrier=False`` leaves out the first barrier: the interpreter reports the race."""
    d = dt.dtype(dtype)
    if d.bits != 32:
        raise ValueError(f"dsmem_program: dtype={d}; ld_shared_cluster_4 moves 32-bit values")
    C = int(cluster)
    x = _gbuf("x", d, (C, WARP_THREADS))
    out = _gbuf("out", d, (C, WARP_THREADS), "out")
    sm = ir.SharedBuffer("smem", d, WARP_THREADS, 16, "this block's row")
    reg = ir.RegBuffer("r", d, 1)
    t = ir.tid(WARP_THREADS)
    rank = ex.mod(ir.bid(0, C), C)
    body = [
        _call(_copy_atom("ld_global", 4), src=ir.MemRef(x, rank * WARP_THREADS + t), dst=ir.RegRef(reg, 0)),
        _call(_copy_atom("st_shared", 4), dst=ir.MemRef(sm, t), src=ir.RegRef(reg, 0)),
        *([_call(sm90a.barrier_cluster, comment="every block's row is in its shared memory")] if barrier else []),
        _call(sm90a.ld_shared_cluster_4, comment=UNDER_TEST, dst=ir.RegRef(reg, 0), src=ir.MemRef(sm, t),
              cta=ir.Scalar(ex.mod(rank + 1, C))),
        _call(_copy_atom("st_global", 4), dst=ir.MemRef(out, rank * WARP_THREADS + t), src=ir.RegRef(reg, 0)),
        _call(sm90a.barrier_cluster, comment="no block leaves while another may read its shared memory"),
    ]

    def expected(inputs):
        return np.roll(np.asarray(inputs["x"]).astype(d.np), -1, axis=0)

    kernel = ir.Kernel(name="micro_dsmem", params=(x, out), grid=(C, 1, 1), threads=WARP_THREADS, shared=(sm,),
                       regs=(reg,), body=ir.Seq(body), cluster=C,
                       header=f"a cluster of {C} blocks: each reads the next block's row from its shared memory")
    program = ir.Program(kernels=(kernel,), inputs=(x,), output=out)
    return program, _Plan(program, expected).random(0), expected


def push_program(dtype: dt.DType | str = "f32", *, cluster: int = 2, wait: bool = True
                 ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """A cluster of ``cluster`` blocks (one warp each): block ``r`` pushes its row ``x[r]`` (32
    four-byte values) into the shared memory of the block of rank ``r + 1`` (mod ``cluster``) with
    ``st_async_cluster_4``, each store completing 4 bytes on that block's mbarrier; each block
    waits for its own mbarrier and writes what it received to ``out[r]``::

        thread 0: mbarrier.init(bar, 1); arrive.expect_tx(bar, 128); fence.mbarrier_init
        barrier.cluster                          # every block's mbarrier is initialised
        st.async  smem[lane] of rank (r + 1) % cluster = x[r, lane], complete_tx on its bar
        try_wait.parity.acquire.cluster(bar, 0)  # the row of rank r - 1 has landed
        out[r, lane] = smem[lane]

    No barrier.cluster at the end: a block leaves after its wait, when every push into it has
    landed.  ``wait=False`` leaves out the wait: the interpreter reports the early read."""
    d = dt.dtype(dtype)
    if d.bits != 32:
        raise ValueError(f"push_program: dtype={d}; st_async_cluster_4 moves 32-bit values")
    C = int(cluster)
    x = _gbuf("x", d, (C, WARP_THREADS))
    out = _gbuf("out", d, (C, WARP_THREADS), "out")
    sm = ir.SharedBuffer("smem", d, WARP_THREADS, 16, "the row the previous block pushes here")
    bar = ir.MBarrier("pushed", 1, note="the previous block's row has landed")
    reg = ir.RegBuffer("r", d, 1)
    t = ir.tid(WARP_THREADS)
    rank = ex.mod(ir.bid(0, C), C)
    init = (_call(sm90a.mbarrier_init, bar=ir.MemRef(bar, 0), count=ir.Scalar(1)),
            _call(sm90a.mbarrier_arrive_expect_tx, bar=ir.MemRef(bar, 0), bytes=ir.Scalar(4 * WARP_THREADS)),
            _call(sm90a.fence_mbarrier_init))
    body = [
        ir.If(ex.lt(t, 1), ir.Seq(init)),
        _call(sm90a.barrier_cluster, comment="every block's mbarrier is initialised"),
        _call(_copy_atom("ld_global", 4), src=ir.MemRef(x, rank * WARP_THREADS + t), dst=ir.RegRef(reg, 0)),
        _call(sm90a.st_async_cluster_4, comment=UNDER_TEST, dst=ir.MemRef(sm, t), src=ir.RegRef(reg, 0),
              bar=ir.MemRef(bar, 0), cta=ir.Scalar(ex.mod(rank + 1, C))),
        *([_call(sm90a.mbarrier_try_wait_cluster, bar=ir.MemRef(bar, 0), parity=ir.Scalar(0))] if wait else []),
        _call(_copy_atom("ld_shared", 4), src=ir.MemRef(sm, t), dst=ir.RegRef(reg, 0)),
        _call(_copy_atom("st_global", 4), dst=ir.MemRef(out, rank * WARP_THREADS + t), src=ir.RegRef(reg, 0)),
    ]

    def expected(inputs):
        return np.roll(np.asarray(inputs["x"]).astype(d.np), 1, axis=0)

    kernel = ir.Kernel(name="micro_push", params=(x, out), grid=(C, 1, 1), threads=WARP_THREADS, shared=(sm, bar),
                       regs=(reg,), body=ir.Seq(body), cluster=C,
                       header=f"a cluster of {C} blocks: each pushes its row into the next block's shared memory")
    program = ir.Program(kernels=(kernel,), inputs=(x,), output=out)
    return program, _Plan(program, expected).random(0), expected


def tma_store_program(dtype: dt.DType | str = "f16", *, shape=(40, 72), box=(16, 64), coords=(16, 32),
                      swizzle: int = 128, proxy_fence: bool = True, wait: str | None = "read"
                      ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """One warpgroup stages ``tile`` [``box``] in shared memory (st.shared, in the box layout of
    ``swizzle``), fences the async proxy, and thread 0 stores it with one TMA store into ``out``
    [``shape``] at ``coords`` = (column, row); elements outside ``out`` are dropped.

    ``wait`` is ``"read"`` (cp.async.bulk.wait_group.read 0), ``"all"`` (cp.async.bulk.wait_group
    0) or None; ``proxy_fence=False`` leaves out the fence.proxy.async.  Coordinates that do not
    start the box on a 16-byte boundary of the row, or that are negative, are refused
    (``ValueError``): a GPU faults on them."""
    d = dt.dtype(dtype)
    _check_coords("tma_store_program", d, coords, store=True)
    eb = d.bits // 8
    br, bc = (int(b) for b in box)
    if (br * bc) % WARPGROUP_THREADS:
        raise ValueError(f"tma_store_program: the box has {br * bc} elements, not a multiple of 128")
    tile = _gbuf("tile", d, (br, bc))
    out = _gbuf("out", d, shape, "out")
    tmap = ir.TensorMapParam("tmap_out", out, (br, bc), swizzle)
    sm = _smem("smem", d, br * bc * eb, swizzle, f"{br}x{bc} box, swizzle {swizzle}")
    reg = ir.RegBuffer("r", d, 1)
    t = _WG_TID
    body: list = [_stage(tile, sm, br * bc, lambda e: e, _box_io(d, shape, box, swizzle), reg, "i_in")]
    if proxy_fence:
        body.append(_call(sm90a.fence_proxy_async, comment="shared stores visible to the async proxy"))
    body.append(ir.Barrier("box staged"))
    store = [_call(sm90a.tma_store_2d, comment=UNDER_TEST, tmap=tmap, c0=ir.Scalar(int(coords[0])),
                   c1=ir.Scalar(int(coords[1])), src=ir.MemRef(sm, 0)),
             _call(sm90a.tma_commit)]
    if wait is not None:
        if wait not in ("read", "all"):
            raise ValueError(f"tma_store_program: wait={wait!r}; allowed: 'read', 'all', None")
        store.append(_call(catalog.with_immediates(sm90a.tma_wait_read if wait == "read" else sm90a.tma_wait, n=0)))
    body.append(ir.If(_eq(t, 0), ir.Seq(store)))

    def expected(inputs):
        x = np.asarray(inputs["tile"]).astype(d.np)
        want = np.zeros(tuple(shape), dtype=d.np)
        c0, c1 = coords
        for i in range(br):
            for j in range(bc):
                r, c = c1 + i, c0 + j
                if 0 <= r < shape[0] and 0 <= c < shape[1]:
                    want[r, c] = x[i, j]
        return want

    kernel = ir.Kernel(name="micro_tma_store_2d", params=(tile, tmap), grid=(1, 1, 1), threads=WARPGROUP_THREADS,
                       shared=(sm,), regs=(reg,), body=ir.Seq(body),
                       header=f"TMA store of a {br}x{bc} box into out{list(shape)} at {tuple(coords)}, swizzle {swizzle}")
    program = ir.Program(kernels=(kernel,), inputs=(tile,), output=out)
    return program, _Plan(program, expected).random(0), expected


def _check_box_3d(what: str, d: dt.DType, shape, box, coords, store: bool = False, rank: int = 3):
    """The (batch..., rows, cols) shape and box and the (column, row, batch...) coordinates of a
    rank-``rank`` TMA microkernel, as ints, refused (``ValueError``) where a GPU would fault or the
    kernel's copy loop does not fit."""
    shape, box, coords = tuple(int(x) for x in shape), tuple(int(x) for x in box), tuple(coords)
    if len(shape) != rank or len(box) != rank or len(coords) != rank:
        raise ValueError(f"{what}: shape {shape} and box {box} must be ({'batch, ' * (rank - 2)}rows, cols) and "
                         f"coords {coords} (column, row{', batch' * (rank - 2)})")
    problems = tma_coordinate_problems(d.bits // 8, coords, store=store, rank=rank)
    if problems:
        raise ValueError(f"{what}: " + "; ".join(problems))
    n = int(np.prod(box))
    if n % WARPGROUP_THREADS:
        raise ValueError(f"{what}: the box has {n} elements, not a multiple of 128")
    return shape, box, tuple(int(c) for c in coords), n


def tma_load_3d_program(dtype: dt.DType | str = "f16", *, shape=(3, 40, 72), box=(1, 16, 64),
                        coords=(16, 32, 1), swizzle: int = 128
                        ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """``tma_load_program`` on a rank-3 tensor map: one warpgroup loads the box of ``x``
    [``shape`` = (batch, rows, cols)] at ``coords`` = (column, row, batch) with one
    ``tma_load_3d`` completing on an mbarrier (expecting the whole box's bytes), waits, and copies
    the box to ``out`` [``box``].

    The box lands in shared memory row-major over its dimensions, so a (1, rows, cols) box is
    the 2-D box of that matrix.  Elements outside ``x`` in any dimension are zeros: the default
    box hangs over the bottom and right edges of matrix 1 and must not read matrix 2's first rows
    (which a 2-D view of (batch * rows) x cols would); a batch coordinate outside 0..batch-1 gives
    a box of zeros.  Coordinates a GPU faults on are refused (``ValueError``)."""
    return tma_load_nd_program(dtype, shape=shape, box=box, coords=coords, swizzle=swizzle)


def tma_load_nd_program(dtype: dt.DType | str = "f16", *, shape=(2, 3, 40, 72), box=(1, 1, 16, 64),
                        coords=(16, 32, 1, 1), swizzle: int = 128
                        ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """``tma_load_3d_program`` for a tensor map of rank 3, 4 or 5 (``len(shape)``): the box of
    ``x`` [(batch..., rows, cols)] at ``coords`` = (column, row, batch...; innermost first) by one
    ``tma_load_{rank}d``; elements outside ``x`` in any dimension are zeros."""
    d = dt.dtype(dtype)
    rank = len(tuple(shape))
    if rank not in sm90a.TMA_LOADS or rank < 3:
        raise ValueError(f"tma_load_nd_program: a rank-{rank} shape {tuple(shape)}; ranks 3 to 5")
    shape, box, coords, n = _check_box_3d(f"tma_load_{rank}d_program", d, shape, box, coords, rank=rank)
    load = sm90a.TMA_LOADS[rank]
    eb = d.bits // 8
    x = _gbuf("x", d, shape)
    out = _gbuf("out", d, box, "out")
    tmap = ir.TensorMapParam("tmap_x", x, box, swizzle)
    sm = _smem("smem", d, n * eb, swizzle, f"{'x'.join(map(str, box))} box, swizzle {swizzle}")
    bar = ir.MBarrier("bar", 1)
    reg = ir.RegBuffer("r", d, 1)
    t = _WG_TID
    c0, c1 = coords[:2]
    body = [
        ir.If(_eq(t, 0), ir.Seq([
            _call(sm90a.mbarrier_init, bar=ir.MemRef(bar, 0), count=ir.Scalar(1)),
            _call(sm90a.fence_mbarrier_init),
        ])),
        ir.Barrier("barrier initialised"),
        ir.If(_eq(t, 0), ir.Seq([
            _call(sm90a.mbarrier_arrive_expect_tx, bar=ir.MemRef(bar, 0), bytes=ir.Scalar(tmap.box_bytes)),
            _call(load, comment=UNDER_TEST, dst=ir.MemRef(sm, 0), tmap=tmap,
                  **{f"c{i}": ir.Scalar(c) for i, c in enumerate(coords)}, mbar=ir.MemRef(bar, 0)),
        ])),
        _call(sm90a.mbarrier_try_wait, bar=ir.MemRef(bar, 0), parity=ir.Scalar(0)),
    ]
    # element e of the box (row-major over it) sits at byte e * eb before the swizzle: the rows of
    # every outer index follow each other, as in a 2-D box
    s_byte = _box_io(d, shape[-2:], box[-2:], swizzle)
    i = Var("i_out", n // WARPGROUP_THREADS)
    e = t + WARPGROUP_THREADS * i
    body.append(ir.For(i, n // WARPGROUP_THREADS, ir.Seq([
        _call(_copy_atom("ld_shared", eb), src=ir.MemRef(sm, ex.floordiv(s_byte(e), eb)), dst=ir.RegRef(reg, 0)),
        _call(_copy_atom("st_global", eb), dst=ir.MemRef(out, e), src=ir.RegRef(reg, 0)),
    ])))

    def expected(inputs):
        xs = np.asarray(inputs["x"]).astype(d.np)
        want = np.zeros(box, dtype=d.np)
        outer = coords[2:][::-1]                  # the batch coordinates, outermost first
        for idx in np.ndindex(*box[:-2]):
            g = tuple(c + j for c, j in zip(outer, idx))
            if all(0 <= x < e for x, e in zip(g, shape[:-2])):
                want[idx] = _box_expected(xs[g], box[-2:], (c0, c1))
        return want

    kernel = ir.Kernel(name=f"micro_tma_load_{rank}d", params=(tmap, out), grid=(1, 1, 1), threads=WARPGROUP_THREADS,
                       shared=(sm, bar), regs=(reg,), body=ir.Seq(body),
                       header=f"TMA load of a {'x'.join(map(str, box))} box of x{list(shape)} at (column, row, "
                              f"batch...) {coords}, swizzle {swizzle}")
    program = ir.Program(kernels=(kernel,), inputs=(x,), output=out)
    return program, _Plan(program, expected).random(0), expected


def tma_store_3d_program(dtype: dt.DType | str = "f16", *, shape=(3, 40, 72), box=(1, 16, 64),
                         coords=(16, 32, 1), swizzle: int = 128
                         ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """``tma_store_program`` on a rank-3 tensor map: one warpgroup stages ``tile`` [``box``] in
    shared memory (row-major over the box, in the layout of ``swizzle``), fences the async proxy,
    and thread 0 stores it with one ``tma_store_3d`` into ``out`` [``shape`` = (batch, rows,
    cols)] at ``coords`` = (column, row, batch), then commits and waits for the bulk group.

    Elements outside ``out`` in any dimension are dropped: the default box hangs over the bottom
    and right edges of matrix 1 and must leave matrix 2 untouched (a 2-D view of (batch * rows) x
    cols would write its first rows).  Negative or misaligned coordinates are refused
    (``ValueError``): a GPU faults on them."""
    return tma_store_nd_program(dtype, shape=shape, box=box, coords=coords, swizzle=swizzle)


def tma_store_nd_program(dtype: dt.DType | str = "f16", *, shape=(3, 40, 72), box=(1, 16, 64),
                         coords=(16, 32, 1), swizzle: int = 128
                         ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """``tma_store_3d_program`` for a tensor map of rank 3, 4 or 5 (``len(shape)``): the box
    staged in shared memory goes into ``out`` [(batch..., rows, cols)] at ``coords`` = (column,
    row, batch...; innermost first) by one ``tma_store_{rank}d``; what falls outside ``out`` in
    any dimension is dropped."""
    d = dt.dtype(dtype)
    rank = len(tuple(shape))
    if rank not in sm90a.TMA_STORES or rank < 3:
        raise ValueError(f"tma_store_nd_program: a rank-{rank} shape {tuple(shape)}; ranks 3 to 5")
    shape, box, coords, n = _check_box_3d(f"tma_store_{rank}d_program", d, shape, box, coords, store=True,
                                          rank=rank)
    store = sm90a.TMA_STORES[rank]
    eb = d.bits // 8
    tile = _gbuf("tile", d, box)
    out = _gbuf("out", d, shape, "out")
    tmap = ir.TensorMapParam("tmap_out", out, box, swizzle)
    sm = _smem("smem", d, n * eb, swizzle, f"{'x'.join(map(str, box))} box, swizzle {swizzle}")
    reg = ir.RegBuffer("r", d, 1)
    t = _WG_TID
    body: list = [_stage(tile, sm, n, lambda e: e, _box_io(d, shape[-2:], box[-2:], swizzle), reg, "i_in"),
                  _call(sm90a.fence_proxy_async, comment="shared stores visible to the async proxy"),
                  ir.Barrier("box staged"),
                  ir.If(_eq(t, 0), ir.Seq([
                      _call(store, comment=UNDER_TEST, tmap=tmap,
                            **{f"c{i}": ir.Scalar(c) for i, c in enumerate(coords)}, src=ir.MemRef(sm, 0)),
                      _call(sm90a.tma_commit),
                      _call(catalog.with_immediates(sm90a.tma_wait, n=0)),
                  ]))]

    def expected(inputs):
        xs = np.asarray(inputs["tile"]).astype(d.np)
        want = np.zeros(shape, dtype=d.np)
        origin = tuple(reversed(coords))         # outermost first, as the shape
        for idx in np.ndindex(*box):
            at = tuple(o + i for o, i in zip(origin, idx))
            if all(0 <= a < e for a, e in zip(at, shape)):
                want[at] = xs[idx]
        return want

    kernel = ir.Kernel(name=f"micro_tma_store_{rank}d", params=(tile, tmap), grid=(1, 1, 1),
                       threads=WARPGROUP_THREADS, shared=(sm,), regs=(reg,), body=ir.Seq(body),
                       header=f"TMA store of a {'x'.join(map(str, box))} box into out{list(shape)} at (column, row, "
                              f"batch...) {coords}, swizzle {swizzle}")
    program = ir.Program(kernels=(kernel,), inputs=(tile,), output=out)
    return program, _Plan(program, expected).random(0), expected


def stmatrix_program(atom: atoms.Atom
                     ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """One warp stores its ``frag`` [32, V] values with ``atom`` (a stmatrix record) into a padded
    shared tile and copies the tile to ``out`` [rows, cols] (memory coordinates)."""
    if atom.family != sm90a.STMATRIX:
        raise ValueError(f"stmatrix_program: {atom!r} is no stmatrix atom")
    d = atom.dtype_of("src")
    dst = next(o for o in atom.operands if o.memory == "SH")
    src = next(o for o in atom.operands if o.memory == "RF")
    rows, cols = (int(x) for x in atom.shape[:2])
    lanes = dst.addr.size()
    ld = cols + 8
    nv = src.tv.num_values
    frag_g = _gbuf("frag", d, (WARP_THREADS, nv))
    out = _gbuf("out", d, (rows, cols), "out")
    sh = ir.SharedBuffer("smem", d, rows * ld, note=f"{rows}x{cols} row-major, pitch {ld}")
    frag = ir.RegBuffer("frag_r", d, nv)
    per = rows * cols // WARP_THREADS
    back = ir.RegBuffer("back", d, per)
    t = _TID
    idx = dst.addr(t % lanes)
    row, col = idx % rows, idx // rows
    first = t * per
    body = [
        _call(_copy_atom("ld_global", _width(d, nv)), src=ir.MemRef(frag_g, t * nv), dst=ir.RegRef(frag, 0)),
        _call(atom, comment=UNDER_TEST, dst=ir.MemRef(sh, row * ld + col), src=ir.RegRef(frag, 0)),
        ir.Barrier("tile stored"),
        _call(_copy_atom("ld_shared", _width(d, per)), src=ir.MemRef(sh, (first // cols) * ld + first % cols),
              dst=ir.RegRef(back, 0)),
        _call(_copy_atom("st_global", _width(d, per)), dst=ir.MemRef(out, first), src=ir.RegRef(back, 0)),
    ]

    def expected(inputs):
        return src.tv.gather(np.asarray(inputs["frag"]).astype(d.np))

    program = _program(atom, (frag_g,), out, body, shared=(sh,), regs=(frag, back))
    return program, _Plan(program, expected).random(0), expected


def _sm90a_plan(atom: atoms.Atom, d) -> tuple:
    fam = atom.family
    if fam == sm90a.WGMMA:
        if d is not None:
            raise ValueError(f"atom_program: {atom.name} has fixed operand dtypes; pass dtype=None")
        return wgmma_program(atom)
    if fam == sm90a.WGMMA_SYNC:
        return wgmma_program(sm90a.wgmma_m64n8k16_f16_f32_ss)
    if fam == sm90a.STMATRIX:
        return stmatrix_program(atom)
    if atom in (sm90a.tma_load_2d_multicast, sm90a.mbarrier_arrive_cluster, sm90a.barrier_cluster):
        return cluster_multicast_program(d or dt.f16)
    if atom in (sm90a.st_async_cluster_4, sm90a.mbarrier_try_wait_cluster):
        return push_program(d or dt.f32)
    if fam == sm90a.DSMEM:
        return dsmem_program(d or dt.f32)
    if fam == sm90a.TMA:
        if atom is sm90a.tma_load_2d:
            return tma_load_program(d or dt.f16)
        if atom is sm90a.tma_load_3d:
            return tma_load_3d_program(d or dt.f16)
        if atom in (sm90a.tma_load_4d, sm90a.tma_load_5d):
            rank = 4 if atom is sm90a.tma_load_4d else 5
            # a box hanging over the edges of an inner matrix of a (2, 3, [2,] 40, 72) tensor
            return tma_load_nd_program(d or dt.f16, shape=(2, 3) + (2,) * (rank - 4) + (40, 72),
                                       box=(1,) * (rank - 2) + (16, 64), coords=(16, 32) + (1,) * (rank - 2))
        if atom is sm90a.tma_store_3d:
            return tma_store_3d_program(d or dt.f16)
        if atom in (sm90a.tma_store_4d, sm90a.tma_store_5d):
            rank = 4 if atom is sm90a.tma_store_4d else 5
            # a box hanging over the bottom and right edges of one inner matrix: the others untouched
            return tma_store_nd_program(d or dt.f16, shape=(2, 3) + (2,) * (rank - 4) + (40, 72),
                                        box=(1,) * (rank - 2) + (16, 64), coords=(16, 32) + (1,) * (rank - 2))
        return tma_store_program(d or dt.f16, wait="all" if atom is sm90a.tma_wait else "read")
    if fam == sm90a.MBARRIER:
        return tma_load_program(d or dt.f16, arrivals="all" if atom is sm90a.mbarrier_arrive else "one")
    if fam == sm90a.GRIDDEP:
        plan = _griddep_plan(atom, d)
        return plan.program, plan.random(0), plan.expected
    if fam == sm90a.FENCE:
        if atom is sm90a.fence_proxy_async:
            return tma_store_program(d or dt.f16)
        return tma_load_program(d or dt.f16)
    raise ValueError(f"atom_program: no one-atom kernel for {atom!r} (family {fam!r}): setmaxnreg changes "
                     f"register allocation only, which one issue cannot show")


def tma_wgmma_program(n: int = 64, dtype: dt.DType | str = "f16", *, swizzle: int = 128
                      ) -> tuple[ir.Program, dict[str, np.ndarray], Callable[[dict], np.ndarray]]:
    """``out = a @ bt.T`` for ``a`` [64, K], ``bt`` [n, K] (B stored K-major) and ``out`` [64, n]
    f32, the operands brought to shared memory by TMA loads completing on one mbarrier and
    multiplied by ``K / 16`` wgmma (``m64n{n}k16``, A and B in shared memory).

    With a swizzle the boxes are one swizzle span wide (K = span / element size: 64 f16 at 128
    bytes) and each k step moves the descriptors' start 32 bytes along the rows; without, K is 16
    and each operand is two 16-byte-wide boxes, the interleaved canonical layout.  The first
    wgmma has ``scale_d = 0`` (no accumulator initialisation needed)."""
    d = dt.dtype(dtype)
    atom = sm90a.wgmma_atom(n, d)
    eb = d.bits // 8
    if swizzle not in sm90a.SWIZZLES:
        raise ValueError(f"tma_wgmma_program: swizzle={swizzle!r}; allowed: 0, 32, 64, 128")
    k = swizzle // eb if swizzle else 16
    box_k = k if swizzle else 8
    m = 64
    a_g, b_g = _gbuf("a", d, (m, k)), _gbuf("bt", d, (n, k))
    out = _gbuf("out", dt.f32, (m, n), "out")
    tm_a = ir.TensorMapParam("tmap_a", a_g, (m, box_k), swizzle)
    tm_b = ir.TensorMapParam("tmap_b", b_g, (n, box_k), swizzle)
    sa = _smem("sA", d, m * k * eb, swizzle, f"A 64x{k} K-major, swizzle {swizzle}")
    sb = _smem("sB", d, n * k * eb, swizzle, f"B {n}x{k} K-major, swizzle {swizzle}")
    bar = ir.MBarrier("bar", 1)
    acc = ir.RegBuffer("acc", dt.f32, n // 2)
    t = _WG_TID
    loads = []
    for tm, sm, rows in ((tm_a, sa, m), (tm_b, sb, n)):
        for chunk in range(k // box_k):
            loads.append(_call(sm90a.tma_load_2d, dst=ir.MemRef(sm, chunk * rows * box_k), tmap=tm,
                               c0=ir.Scalar(chunk * box_k), c1=ir.Scalar(0), mbar=ir.MemRef(bar, 0)))
    nbytes = (m + n) * k * eb
    ks = Var("ks", k // 16)
    if swizzle:
        desc_a = ir.DescRef(sa, ks * 16, swizzle, 16, 8 * swizzle)
        desc_b = ir.DescRef(sb, ks * 16, swizzle, 16, 8 * swizzle)
    else:
        desc_a = ir.DescRef(sa, 0, 0, m * 16, 128)
        desc_b = ir.DescRef(sb, 0, 0, n * 16, 128)
    body = [
        ir.If(_eq(t, 0), ir.Seq([
            _call(sm90a.mbarrier_init, bar=ir.MemRef(bar, 0), count=ir.Scalar(1)),
            _call(sm90a.fence_mbarrier_init),
        ])),
        ir.Barrier("barrier initialised"),
        ir.If(_eq(t, 0), ir.Seq([
            _call(sm90a.mbarrier_arrive_expect_tx, bar=ir.MemRef(bar, 0), bytes=ir.Scalar(nbytes)),
            *loads,
        ])),
        _call(sm90a.mbarrier_try_wait, bar=ir.MemRef(bar, 0), parity=ir.Scalar(0)),
        _call(sm90a.wgmma_fence),
        ir.For(ks, k // 16, _call(atom, comment=UNDER_TEST, d=ir.RegRef(acc, 0), desc_a=desc_a, desc_b=desc_b,
                                  scale_d=ir.Scalar(ex.minimum(ks, 1))), unroll=True),
        _call(sm90a.wgmma_commit),
        _call(catalog.with_immediates(sm90a.wgmma_wait, n=0)),
    ]
    tv = sm90a.tv_d(n)
    vo = Var("v_d", n // 2)
    ro, co = tv.coord(t, vo)
    body.append(ir.For(vo, n // 2, _call(_copy_atom("st_global", 4), dst=ir.MemRef(out, ro * n + co),
                                         src=ir.RegRef(acc, vo)), unroll=True))

    def expected(inputs):
        a = np.asarray(inputs["a"]).astype(d.np)
        bt = np.asarray(inputs["bt"]).astype(d.np)
        return np.asarray(atom.semantics(a, bt.T, np.zeros((m, n), np.float32))).astype(np.float32)

    kernel = ir.Kernel(name=f"micro_tma_wgmma_n{n}", params=(tm_a, tm_b, out), grid=(1, 1, 1),
                       threads=WARPGROUP_THREADS, shared=(sa, sb, bar), regs=(acc,), body=ir.Seq(body),
                       header=f"TMA + mbarrier + {k // 16} x {atom!r}, swizzle {swizzle}")
    program = ir.Program(kernels=(kernel,), inputs=(a_g, b_g), output=out)
    return program, _Plan(program, expected).random(0), expected
