"""Specs: immutable descriptions of a computation at one level of the GPU hierarchy.

* ``MatMul(a, b, c, level, acc, roles)`` — ``c (+)= a @ b`` accumulated in ``acc``, over any
  number of batch dimensions (torch ``matmul`` semantics: an operand without a batch dimension is
  broadcast along it);
* ``Move(src, dst, level, ops)`` — copy a tile between memories (and maybe between layouts or
  dtypes), applying element-wise ``ops`` (an epilogue on C's store, a prologue on A/B's load);
* ``Init(dst, value, level)`` — fill a tile (the accumulator before a reduction loop);
* ``Pointwise(op, inputs, out, level)`` — an n-ary element-wise op with broadcasting;
* ``Reduce(op, src, dst, axes, level)`` — sum / max / mean of ``src`` over the dimensions ``axes``;
* ``Fused(body)`` — a spec whose meaning is its body of specs (FMHA, MLP, LSTM cells);
* ``Attention(q, k, v, outs, level, scale, causal)`` — ``softmax(scale Q Kᵀ + mask) V``, which
  ``online_softmax`` decomposes into a loop over key tiles whose body is a ``Fused`` spec.

Every operand is a ``Tile`` of a named ``Tensor``, and every spec names its dimensions: the
dimensions of a spec are the union of its operands' (``dims``), their sizes its ``extents``, and
those that disappear from the output its ``reduction_dims``.  Strategies tile and map any of them
by name: ``tile(b=1, m=128, n=128)``.

A spec prints like Fireiron: ``MatMul<block>(A:SH f16[128x32], B:SH f16[32x128], C:RF f32[128x128])``.
"""

from __future__ import annotations

import attrs

from .dtypes import DType, dtype
from .ops import SCALAR_OPS
from .tensor import GL, KERNEL, Level, Tensor, Tile

# The schedule layer sits above specs and registers ``Schedule.of`` here when it is imported, so
# that ``spec.schedule(...)`` works without this module importing upward.
_SCHEDULE_OF = None


def bind_scheduler(of) -> None:
    """Called by ``firesched.schedule``: ``of(spec) -> Schedule``."""
    global _SCHEDULE_OF
    _SCHEDULE_OF = of


def _opstr(ops) -> str:
    return (" with " + ", ".join(map(str, ops))) if ops else ""


class SpecBase:
    """What every spec shares: its operands, dimensions and extents, and ``schedule``.

    Subclasses list their tile fields in ``_TILES`` (inputs first, the output last)."""

    _TILES: tuple[str, ...] = ()

    @property
    def operands(self) -> tuple[Tile, ...]:
        out = []
        for f in self._TILES:
            v = getattr(self, f)
            out += list(v) if isinstance(v, tuple) else [v]
        return tuple(out)

    @property
    def inputs(self) -> tuple[Tile, ...]:
        return self.operands[:-1]

    @property
    def outputs(self) -> tuple[Tile, ...]:
        return self.operands[-1:]

    @property
    def dims(self) -> tuple[str, ...]:
        """Every dimension of the operands, in order of first appearance."""
        out: list[str] = []
        for t in self.operands:
            out += [d for d in t.dims if d not in out]
        return tuple(out)

    @property
    def extents(self) -> dict[str, int]:
        ext: dict[str, int] = {}
        for t in self.operands:
            for d, s in zip(t.dims, t.shape):
                ext.setdefault(d, s)
        return ext

    @property
    def reduction_dims(self) -> tuple[str, ...]:
        """Dimensions of the inputs that the outputs do not have."""
        out_dims = {d for t in self.outputs for d in t.dims}
        return tuple(d for d in self.dims if d not in out_dims)

    def operand(self, name: str) -> Tile:
        for t in self.operands:
            if t.name == name:
                return t
        raise KeyError(name)

    def with_operand(self, name: str, tile: Tile):
        """This spec with operand ``name`` replaced by ``tile`` (staged elsewhere, or retyped)."""
        changed = {}
        for f in self._TILES:
            v = getattr(self, f)
            if isinstance(v, tuple):
                if any(t.name == name for t in v):
                    changed[f] = tuple(tile if t.name == name else t for t in v)
            elif v.name == name:
                changed[f] = tile
        if not changed:
            raise KeyError(name)
        return attrs.evolve(self, **changed)

    def with_extents(self, **ext: int):
        """This spec on a tile of the given extents (dims not named keep theirs)."""
        changed = {}
        for f in self._TILES:
            v = getattr(self, f)
            changed[f] = tuple(t.with_extent(**ext) for t in v) if isinstance(v, tuple) else v.with_extent(**ext)
        return attrs.evolve(self, **changed)

    def schedule(self, *strategies):
        """Refine this spec with ``strategies`` (applied in order); see ``firesched.schedule``."""
        if _SCHEDULE_OF is None:  # pragma: no cover - firesched/__init__ imports the schedule
            raise RuntimeError("spec.schedule() needs firesched.schedule, which is not imported")
        return _SCHEDULE_OF(self).apply(*strategies)


def _positive(what: str, name: str, v) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{what}: {name} must be a positive int, got {v!r}")
    return v


@attrs.frozen(repr=False)
class MatMul(SpecBase):
    """``c (+)= a @ b``: a is (m, k), b is (k, n), c is (m, n), each with the batch dimensions
    it has (``c`` has all of them); accumulate in ``acc``.

    ``roles`` names the operands' dimensions that play m, n and k (``("q", "kv", "d")`` for the
    scores of attention); every other dimension of ``c`` is a batch dimension.
    """

    _TILES = ("a", "b", "c")

    a: Tile
    b: Tile
    c: Tile
    level: Level
    acc: DType = attrs.field(converter=dtype)
    roles: tuple[str, str, str] = ("m", "n", "k")

    @property
    def m_dim(self) -> str:
        return self.roles[0]

    @property
    def n_dim(self) -> str:
        return self.roles[1]

    @property
    def k_dim(self) -> str:
        return self.roles[2]

    @property
    def m(self) -> int:
        return self.c.extent(self.m_dim)

    @property
    def n(self) -> int:
        return self.c.extent(self.n_dim)

    @property
    def k(self) -> int:
        return self.a.extent(self.k_dim)

    @property
    def batch_dims(self) -> tuple[str, ...]:
        return tuple(d for d in self.c.dims if d not in self.roles)

    @property
    def inputs(self) -> tuple[Tile, ...]:
        """``a`` and ``b`` in the order of ``c``'s dimensions: the operand that carries C's rows
        first.  That is (a, b), unless the roles are swapped to compute ``Cᵀ = Bᵀ Aᵀ`` (a small M
        on the MMA's N side), where it stays (A, B) as the caller passes them."""
        rows = next((d for d in self.c.dims if d in self.roles[:2]), self.m_dim)
        return (self.b, self.a) if rows in self.b.dims and rows not in self.a.dims else (self.a, self.b)

    @property
    def dims(self) -> tuple[str, ...]:
        """Batch dimensions, then m, n, k (the order ``tile`` creates its loops in)."""
        return self.batch_dims + self.roles

    @property
    def reduction_dims(self) -> tuple[str, ...]:
        return (self.k_dim,)

    @classmethod
    def kernel(cls, M: int, N: int, K: int, *, batch: int | tuple[int, ...] = (), a="f16", b="f16", c="f16",
               acc="f32", layout: str = "RR", names: tuple[str, str, str] = ("A", "B", "C"),
               a_batched: bool = True, b_batched: bool = True) -> "MatMul":
        """The kernel-level spec of ``C[..., M, N] = A[..., M, K] @ B[..., K, N]``.

        ``batch`` gives the batch extents (an int for one batch dimension, named ``b``; a tuple for
        several, named ``b0, b1, ...``), outermost first; ``a_batched=False`` (or ``b_batched``)
        broadcasts that operand over the batch, as ``torch.matmul`` does for a 2-D operand.
        ``layout`` gives the majorness of A then B: ``R`` row-major (A's k / B's n contiguous),
        ``C`` column-major (A's m / B's k contiguous).  C is row-major.  Batch dimensions are
        stored outermost (strided batched GEMM).
        """
        for name, v in (("M", M), ("N", N), ("K", K)):
            _positive("MatMul.kernel", name, v)
        if not (isinstance(layout, str) and len(layout) == 2 and set(layout) <= {"R", "C"}):
            raise ValueError(f"MatMul.kernel: layout={layout!r}; allowed 'RR', 'RC', 'CR', 'CC' "
                             "(majorness of A then B: R = row-major, C = column-major)")
        bshape = (batch,) if isinstance(batch, int) and not isinstance(batch, bool) else tuple(batch)
        for i, v in enumerate(bshape):
            _positive("MatMul.kernel", f"batch[{i}]", v)
        bdims = ("b",) if len(bshape) == 1 else tuple(f"b{i}" for i in range(len(bshape)))
        if not isinstance(a_batched, bool) or not isinstance(b_batched, bool):
            raise ValueError("MatMul.kernel: a_batched and b_batched are bools")
        an, bn, cn = names
        ab = bdims if a_batched else ()
        bb = bdims if b_batched else ()
        ash, bsh = bshape if a_batched else (), bshape if b_batched else ()
        ta = Tensor(an, a, GL, ab + ("m", "k"), ash + (M, K), "k" if layout[0] == "R" else "m")
        tb = Tensor(bn, b, GL, bb + ("k", "n"), bsh + (K, N), "n" if layout[1] == "R" else "k")
        tc = Tensor(cn, c, GL, bdims + ("m", "n"), bshape + (M, N), "n")
        return cls(Tile(ta, ta.shape), Tile(tb, tb.shape), Tile(tc, tc.shape), KERNEL, acc)

    def __repr__(self):
        roles = "" if self.roles == ("m", "n", "k") else f", roles={self.roles!r}"
        return f"MatMul({self.a!r}, {self.b!r}, {self.c!r}, {self.level!r}, {self.acc!r}{roles})"

    def __str__(self):
        return f"MatMul<{self.level}>({self.a}, {self.b}, {self.c}) acc {self.acc}"


@attrs.frozen(repr=False)
class Move(SpecBase):
    """Copy ``src`` to ``dst`` (same dimensions and extents), applying ``ops`` element-wise on the
    way; ``dst`` may differ in memory, dtype (a cast) and major dimension (a transpose)."""

    _TILES = ("src", "dst")

    src: Tile
    dst: Tile
    level: Level
    ops: tuple = ()

    @classmethod
    def kernel(cls, shape: dict[str, int], *, src="f16", dst=None, names=("X", "Y"), src_major=None,
               dst_major=None) -> "Move":
        """A kernel-level copy of a tensor of ``shape`` (dims in order, e.g. ``{"r": 4096, "c":
        1024}``), optionally cast to ``dst`` and transposed (``dst_major``, default the last dim)."""
        dims, ext = _shape("Move.kernel", shape)
        x = Tensor(names[0], src, GL, dims, ext, src_major or dims[-1])
        y = Tensor(names[1], dst or src, GL, dims, ext, dst_major or dims[-1])
        return cls(Tile(x, ext), Tile(y, ext), KERNEL)

    def __repr__(self):
        return f"Move({self.src!r}, {self.dst!r}, {self.level!r}, {self.ops!r})"

    def __str__(self):
        return f"Move<{self.level}>({self.src} -> {self.dst}){_opstr(self.ops)}"


@attrs.frozen(repr=False)
class Init(SpecBase):
    """Fill ``dst`` with ``value``."""

    _TILES = ("dst",)

    dst: Tile
    value: float            # a tuple of floats: the identity of a monoid's components
    level: Level

    def __repr__(self):
        return f"Init({self.dst!r}, {self.value!r}, {self.level!r})"

    def __str__(self):
        if isinstance(self.value, tuple):
            return f"Init<{self.level}>({self.dst} = ({', '.join(f'{v:g}' for v in self.value)}))"
        return f"Init<{self.level}>({self.dst} = {self.value:g})"


@attrs.frozen(repr=False)
class ScaleAdd(SpecBase):
    """``dst += Σ_g scale[group g of the K tile, n] · src[g]``: the partial products of a MatMul's
    K tile, one per group of ``scale.group_size`` k of the dequantised operand ``operand``, each
    multiplied in f32 by its group's scale and added to the accumulator.  ``scale_partials()``
    leaves it after the MatMul that computes ``src`` (``groups`` register copies of it)::

        MatMul<warpgroup>(B:RF f16[128x64], A:SH f16[16x128], C_groups:RF f32[16x64]) acc f32
        ScaleAdd<warpgroup>(C_groups:RF f32[16x64] x1 group -> C:RF f32[16x64]) by S[k/128, n]
    """

    _TILES = ("src", "dst")

    src: Tile
    dst: Tile
    level: Level
    scale: object           # an ops.GroupScale with partials=True
    operand: str            # the dequantised operand: its k and n index the scales
    groups: int = 1

    def __repr__(self):
        return (f"ScaleAdd({self.src!r}, {self.dst!r}, {self.level!r}, {self.scale!r}, {self.operand!r}, "
                f"{self.groups!r})")

    def __str__(self):
        g = self.scale.group_size or "K"
        return (f"ScaleAdd<{self.level}>({self.src} x{self.groups} group{'s' if self.groups > 1 else ''} "
                f"-> {self.dst}) by {self.scale.name}[k/{g}, n]")


@attrs.frozen(repr=False)
class Pointwise(SpecBase):
    """``out = op(*inputs)`` element by element; an input without one of ``out``'s dimensions is
    broadcast along it.  ``op`` names a scalar op of ``firesched.ops.SCALAR_OPS`` whose arity is
    the number of inputs; ``ops`` are element-wise ops applied after it (bias, relu, ...)."""

    _TILES = ("inputs", "out")

    op: str
    inputs: tuple[Tile, ...]
    out: Tile
    level: Level
    ops: tuple = ()

    def __attrs_post_init__(self):
        sop = SCALAR_OPS.get(self.op)
        if sop is None:
            raise ValueError(f"Pointwise: unknown op {self.op!r}; allowed: {', '.join(SCALAR_OPS)}")
        if sop.arity != len(self.inputs):
            raise ValueError(f"Pointwise: {self.op} takes {sop.arity} input(s), got {len(self.inputs)}")
        for t in self.inputs:
            extra = [d for d in t.dims if d not in self.out.dims]
            if extra:
                raise ValueError(f"Pointwise: input {t.name} has dims {extra} that the output {self.out.name} "
                                 f"lacks; an input may only lack dims (broadcast), not add them")

    @classmethod
    def kernel(cls, op: str, shape: dict[str, int], *, dtype="f16", out=None, inputs=None,
               names=None) -> "Pointwise":
        """A kernel-level element-wise op over a tensor of ``shape``; ``inputs`` optionally gives
        each input's dims (a subset of ``shape``'s: broadcast), default all of them."""
        dims, ext = _shape("Pointwise.kernel", shape)
        sop = SCALAR_OPS.get(op)
        if sop is None:
            raise ValueError(f"Pointwise.kernel: unknown op {op!r}; allowed: {', '.join(SCALAR_OPS)}")
        names = names or tuple("XYZW"[:sop.arity]) + ("O",)
        in_dims = inputs or [dims] * sop.arity
        tiles = []
        for name, ds in zip(names, in_dims):
            ds = tuple(ds)
            t = Tensor(name, dtype, GL, ds, tuple(shape[d] for d in ds), ds[-1])
            tiles.append(Tile(t, t.shape))
        o = Tensor(names[-1], out or dtype, GL, dims, ext, dims[-1])
        return cls(op, tuple(tiles), Tile(o, ext), KERNEL)

    def __repr__(self):
        return f"Pointwise({self.op!r}, {self.inputs!r}, {self.out!r}, {self.level!r}, {self.ops!r})"

    def __str__(self):
        return (f"Pointwise<{self.level}>({self.op}: {', '.join(map(str, self.inputs))} -> {self.out})"
                f"{_opstr(self.ops)}")


REDUCE_OPS = ("sum", "max", "min", "mean")


@attrs.frozen(repr=False)
class Reduce(SpecBase):
    """``dst = op-reduction of src over axes`` (sum, max, min, mean), accumulated in ``acc``;
    ``ops`` are element-wise ops applied to the result before it is stored.

    ``op`` may also be a ``firesched.monoids.Monoid``: a combine over several values (softmax's
    ``(max, sum of exp)``, LayerNorm's ``(count, mean, M2)``), reduced in one exchange per level.
    Its first output goes to ``dst`` (through ``ops``), the others to the tiles ``more`` (each
    through its entry of ``more_ops``), all over ``dst``'s dims::

        Reduce(monoids.softmax_stats(), Xr, M, ("c",), KERNEL, more=(Z,), more_ops=((ops.reciprocal(),),))
    """

    _TILES = ("src", "dst", "more")

    op: object
    src: Tile
    dst: Tile
    axes: tuple[str, ...]
    level: Level
    ops: tuple = ()
    acc: DType = attrs.field(default="f32", converter=dtype)
    more: tuple = ()
    more_ops: tuple = ()

    def __attrs_post_init__(self):
        if isinstance(self.op, str):
            if self.more or self.more_ops:
                raise ValueError(f"Reduce: more= holds the further outputs of a monoid; op={self.op!r} has one "
                                 "output (dst)")
            return
        n = getattr(self.op, "outputs", None)
        if n is None or not hasattr(self.op, "combine"):
            raise ValueError(f"Reduce: op={self.op!r}; allowed: {', '.join(REDUCE_OPS)} or a "
                             "firesched.monoids.Monoid")
        # more=() with a monoid of several outputs: dst is a register accumulator of the whole
        # tuple (what tile() creates; its store finishes the outputs)
        if not isinstance(self.more, tuple) or len(self.more) not in (0, n - 1) or \
                (not self.more and n > 1 and self.level == KERNEL):
            raise ValueError(f"Reduce: {self.op} has {n} outputs: dst and more= with {n - 1} tiles, got "
                             f"{len(self.more) if isinstance(self.more, tuple) else self.more!r}")
        bad = [t.name for t in self.more if tuple(t.dims) != tuple(self.dst.dims)]
        if bad:
            raise ValueError(f"Reduce: the outputs {', '.join(bad)} must have dst's dims {self.dst.dims}")
        if self.acc.name != "f32":
            raise ValueError(f"Reduce: a monoid combines f32 components; acc={self.acc}; allowed: f32")
        mo = tuple(self.more_ops) or ((),) * len(self.more)
        if len(mo) != len(self.more) or not all(isinstance(o, tuple) for o in mo):
            raise ValueError(f"Reduce: more_ops holds one tuple of ops per tile of more ({len(self.more)}), got "
                             f"{self.more_ops!r}")
        object.__setattr__(self, "more_ops", mo)

    @property
    def inputs(self) -> tuple[Tile, ...]:
        return (self.src,)

    @property
    def outputs(self) -> tuple[Tile, ...]:
        return (self.dst, *self.more)

    @property
    def monoid(self):
        """The monoid of a tuple reduction, or None for sum / max / min / mean."""
        return None if isinstance(self.op, str) else self.op

    def output_ops(self) -> tuple[tuple[Tile, tuple], ...]:
        """(tile, its ops) of every output: ``dst`` with ``ops``, then ``more`` with ``more_ops``."""
        return ((self.dst, tuple(self.ops)), *zip(self.more, self.more_ops))

    @property
    def reduction_dims(self) -> tuple[str, ...]:
        return tuple(self.axes)

    @classmethod
    def kernel(cls, op: str, shape: dict[str, int], axes, *, dtype="f16", out="f32",
               names=("X", "Y")) -> "Reduce":
        """A kernel-level reduction of a tensor of ``shape`` over ``axes`` (a dim name or a tuple)."""
        if op not in REDUCE_OPS:
            raise ValueError(f"Reduce.kernel: op={op!r}; allowed: {', '.join(REDUCE_OPS)}")
        dims, ext = _shape("Reduce.kernel", shape)
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        bad = [a for a in axes if a not in dims]
        if bad or not axes:
            raise ValueError(f"Reduce.kernel: axes {axes!r} must name dims of {dims!r}")
        x = Tensor(names[0], dtype, GL, dims, ext, dims[-1])
        kept = tuple(d for d in dims if d not in axes) or ("one",)
        kext = tuple(shape[d] for d in kept if d in shape) or (1,)
        y = Tensor(names[1], out, GL, kept, kext, kept[-1])
        return cls(op, Tile(x, ext), Tile(y, kext), axes, KERNEL)

    def __repr__(self):
        more = f", more={self.more!r}, more_ops={self.more_ops!r}" if self.more else ""
        return (f"Reduce({self.op!r}, {self.src!r}, {self.dst!r}, {self.axes!r}, {self.level!r}, {self.ops!r}, "
                f"{self.acc!r}{more})")

    def __str__(self):
        what = f"over {','.join(self.axes)}" if self.axes else "of the partial results"
        outs = "".join(f", {t}{_opstr(o)}" for t, o in zip(self.more, self.more_ops))
        return f"Reduce<{self.level}>({self.op} {what}: {self.src} -> {self.dst}{_opstr(self.ops)}{outs})" \
            if self.more else f"Reduce<{self.level}>({self.op} {what}: {self.src} -> {self.dst}){_opstr(self.ops)}"


@attrs.frozen(repr=False)
class Fused(SpecBase):
    """A generic spec whose meaning is its body of specs, run in order (Graphene's generic spec:
    an MLP, an attention block, a GEMM with its softmax).

    Its outputs are the last body spec's outputs; a tensor some body spec writes that is not an
    output is *local*: an intermediate that never needs to reach global memory (``place`` puts it
    on chip); every other tensor is an input.  Strategies that tile the fused spec tile every body
    spec along the named dims; ``part(i, ...)`` refines body spec ``i`` on its own::

        Fused<kernel>[MatMul(X, W1 -> H); MatMul(H, W2 -> Y)]
          tile(m=64) >> to_blocks(), place("H", SH)
          part(0, tile(k=32), ...)         # H = relu(X W1), kept in shared memory
          part(1, tile(h=32), ...)         # Y = H W2, reading H from there
    """

    body: tuple
    level: Level = KERNEL
    results: tuple[str, ...] = ()

    def __attrs_post_init__(self):
        if not self.body:
            raise ValueError("Fused: the body needs at least one spec")
        if not isinstance(self.results, tuple) or not all(isinstance(r, str) for r in self.results):
            raise ValueError(f"Fused: results is a tuple of tensor names, got {self.results!r}")
        written = [t.name for sp in self.body for t in sp.outputs]
        bad = [r for r in self.results if r not in written]
        if bad or len(set(self.results)) != len(self.results):
            raise ValueError(f"Fused: results {self.results!r} must name distinct tensors a body spec writes; "
                             f"written: {', '.join(dict.fromkeys(written))}")
        # the body runs at the fused spec's level: mapping the fused spec maps every part
        if any(sp.level != self.level for sp in self.body):
            object.__setattr__(self, "body", tuple(attrs.evolve(sp, level=self.level) for sp in self.body))

    @classmethod
    def kernel(cls, *body, results=()) -> "Fused":
        """The kernel-level fusion of ``body`` (kernel-level specs sharing tensors by name).

        ``results`` names the tensors the kernel returns, in order (default: the last body spec's
        output); a norm that also returns its per-row statistics names them here."""
        for sp in body:
            if not isinstance(sp, SpecBase) or isinstance(sp, Fused):
                raise ValueError(f"Fused.kernel: {sp!r} is not a spec to fuse (MatMul, Move, Pointwise, Reduce)")
        return cls(tuple(body), KERNEL, tuple(results))

    @property
    def operands(self) -> tuple[Tile, ...]:
        seen, out = set(), []
        for sp in self.body:
            for t in sp.operands:
                if t.name not in seen:
                    seen.add(t.name)
                    out.append(t)
        return tuple(out)

    @property
    def outputs(self) -> tuple[Tile, ...]:
        if not self.results:
            return self.body[-1].outputs
        last = {t.name: t for sp in self.body for t in sp.outputs}
        return tuple(last[r] for r in self.results)

    @property
    def locals(self) -> tuple[Tile, ...]:
        """Tensors a body spec writes that are no output: the intermediates."""
        outs = {t.name for t in self.outputs}
        written = {t.name for sp in self.body for t in sp.outputs}
        return tuple(t for t in self.operands if t.name in written and t.name not in outs)

    @property
    def inputs(self) -> tuple[Tile, ...]:
        skip = {t.name for t in self.outputs + self.locals}
        return tuple(t for t in self.operands if t.name not in skip)

    def with_extents(self, **ext: int):
        return attrs.evolve(self, body=tuple(sp.with_extents(**ext) for sp in self.body))

    def with_operand(self, name: str, tile: Tile):
        changed = []
        for sp in self.body:
            try:
                changed.append(sp.with_operand(name, tile))
            except KeyError:
                changed.append(sp)
        return attrs.evolve(self, body=tuple(changed))

    def __repr__(self):
        res = f", {self.results!r}" if self.results else ""
        return f"Fused({self.body!r}, {self.level!r}{res})"

    def __str__(self):
        res = f" -> {', '.join(self.results)}" if self.results else ""
        return f"Fused<{self.level}>[{'; '.join(map(str, self.body))}]{res}"


ATTENTION_DIMS = ("b", "hk", "g", "q", "kv", "d")


@attrs.frozen(repr=False)
class Attention(SpecBase):
    """``O = softmax(scale * Q Kᵀ + mask) V`` over the key/value positions ``kv``, per batch ``b``
    and head; with ``lse``, also the row log-sum-exp ``LSE = log(sum(exp(scale * Q Kᵀ + mask)))``
    that a backward pass needs.

    Dims (every operand names them): ``b`` batch, ``hk`` key/value heads, ``g`` query heads per
    key/value head (grouped-query attention: query head ``h = hk * g_count + g``, so a torch
    ``(B, H, S, D)`` tensor is ``(b, hk, g, q, d)`` without a copy; ``g`` = 1 is multi-head
    attention), ``q`` query positions, ``kv`` key/value positions, ``d`` head dim::

        Q (b, hk, g, q, d)   K (b, hk, kv, d)   V (b, hk, kv, d)
        O (b, hk, g, q, d)   LSE (b, hk, g, q) f32

    ``causal`` masks key ``j`` from query ``i`` where ``j > i`` (``torch``'s ``is_causal``: the
    mask is aligned to the top-left corner when ``seq_q != seq_kv``).  The statistics are f32.
    """

    _TILES = ("q", "k", "v", "outs")
    REFINED_BY = ("Fused",)        # online_softmax's key loop: its body, a fused spec, is the focus

    q: Tile
    k: Tile
    v: Tile
    outs: tuple[Tile, ...]
    level: Level
    scale: float
    causal: bool = False

    def __attrs_post_init__(self):
        if not self.outs or len(self.outs) > 2:
            raise ValueError("Attention: outs is (O,) or (O, LSE)")
        if not isinstance(self.causal, bool):
            raise ValueError(f"Attention: causal is a bool, got {self.causal!r}")

    @property
    def o(self) -> Tile:
        return self.outs[0]

    @property
    def lse(self) -> Tile | None:
        return self.outs[1] if len(self.outs) > 1 else None

    @property
    def outputs(self) -> tuple[Tile, ...]:
        return self.outs

    @property
    def inputs(self) -> tuple[Tile, ...]:
        return (self.q, self.k, self.v)

    @property
    def reduction_dims(self) -> tuple[str, ...]:
        return ("kv",)

    @classmethod
    def kernel(cls, batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int, *, dtype="f16",
               kv_heads: int | None = None, causal: bool = False, scale: float | None = None,
               lse: bool = False) -> "Attention":
        """Kernel-level attention over torch-layout tensors: Q and O ``(batch, heads, seq_q, head_dim)``,
        K and V ``(batch, kv_heads, seq_kv, head_dim)`` (``kv_heads`` divides ``heads``; default
        ``heads``), ``scale`` default ``1 / sqrt(head_dim)``."""
        for name, v in (("batch", batch), ("heads", heads), ("seq_q", seq_q), ("seq_kv", seq_kv),
                        ("head_dim", head_dim)):
            _positive("Attention.kernel", name, v)
        kvh = heads if kv_heads is None else _positive("Attention.kernel", "kv_heads", kv_heads)
        if heads % kvh:
            raise ValueError(f"Attention.kernel: kv_heads={kvh} must divide heads={heads} (grouped-query attention "
                             "shares each key/value head among heads / kv_heads query heads)")
        if not isinstance(causal, bool) or not isinstance(lse, bool):
            raise ValueError("Attention.kernel: causal and lse are bools")
        scale = 1.0 / head_dim ** 0.5 if scale is None else float(scale)
        g = heads // kvh
        qd = ("b", "hk", "g", "q", "d")
        kd = ("b", "hk", "kv", "d")

        def t(name, dt, dims, shape, major):
            x = Tensor(name, dt, GL, dims, shape, major)
            return Tile(x, shape)

        q = t("Q", dtype, qd, (batch, kvh, g, seq_q, head_dim), "d")
        k = t("K", dtype, kd, (batch, kvh, seq_kv, head_dim), "d")
        v = t("V", dtype, kd, (batch, kvh, seq_kv, head_dim), "d")
        o = t("O", dtype, qd, (batch, kvh, g, seq_q, head_dim), "d")
        outs = (o,)
        if lse:
            outs += (t("LSE", "f32", qd[:-1], (batch, kvh, g, seq_q), "q"),)
        return cls(q, k, v, outs, KERNEL, scale, causal)

    def __repr__(self):
        return (f"Attention({self.q!r}, {self.k!r}, {self.v!r}, {self.outs!r}, {self.level!r}, {self.scale!r}, "
                f"{self.causal!r})")

    def __str__(self):
        extra = (", causal" if self.causal else "") + f", scale={self.scale:.6g}"
        return (f"Attention<{self.level}>({self.q}, {self.k}, {self.v} -> {', '.join(map(str, self.outs))}"
                f"{extra})")


def _shape(what: str, shape) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if not isinstance(shape, dict) or not shape:
        raise ValueError(f"{what}: shape is a dict of dim name -> extent, e.g. {{'r': 4096, 'c': 1024}}")
    for d, v in shape.items():
        if not isinstance(d, str) or not d.isidentifier():
            raise ValueError(f"{what}: dim names are identifiers, got {d!r}")
        _positive(what, d, v)
    return tuple(shape), tuple(shape.values())


Spec = MatMul | Move | Init | Pointwise | Reduce | Fused | Attention
