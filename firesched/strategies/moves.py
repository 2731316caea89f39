"""``move_to_smem`` and ``move_to_regs``: stage an operand's tile in a faster memory.

::

    MatMul<block>(A:GL f16[128x32], B:GL f16[32x128], C:RF f32[128x128])
      move_to_smem("A")
      Move<block>(A:GL f16[128x32] -> A:SH f16[128x32] Sw<2,3,3>)
      MatMul<block>(A:SH f16[128x32] Sw<2,3,3>, B:GL f16[32x128], C:RF f32[128x128])   <- focus

The created ``Move`` is refined at ``check()`` time: by ``via=`` strategies when given, else by a
default derived from the layouts — a coalesced copy of the widest aligned vector (cp.async 16 B
where it can) for global → shared, and for shared → registers the ldmatrix variant whose
fragments are exactly the ones the consuming atom reads.
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..hardware.atoms.base import Atom
from ..layout import Swizzle
from ..schedule import Node
from ..spec import Fused, Move
from ..tensor import BLOCK, GL, RF, SH, WARP, WARPGROUP, Tile
from .base import Strategy, with_operand_in_parts

_NO_SWIZZLE = Swizzle(0, 0, 0)
# A 16-byte chunk is the unit of cp.async and ldmatrix rows; a swizzle must keep it whole.
CHUNK_BYTES = 16
#: the 4-bit code types a register move dequantises, and the types it dequantises them to
QUANTISED = ("u4", "i4")
DEQUANT_TO = ("f16", "bf16")
BANK_LINE_BYTES = 128


def auto_swizzle(cols: int, elem_bits: int) -> Swizzle:
    """A bank-conflict-free swizzle for a row-major shared tile ``cols`` elements wide.

    XOR the 16-byte chunk index inside a 128-byte line with the row bits above it, so the 8 rows
    an ldmatrix (or a quarter-warp of 16-byte stores) touches land in 8 different chunk columns::

        chunk ->  0 1 2 3 4 5 6 7          Sw<3,3,3> on a 64-element f16 row (128 B)
        row 0:    0 1 2 3 4 5 6 7
        row 1:    1 0 3 2 5 4 7 6
        row 2:    2 3 0 1 6 7 4 5
        ...       (chunk c of row r is stored at c ^ (r % 8))
    """
    row_bytes = cols * elem_bits // 8
    if row_bytes < 2 * CHUNK_BYTES or row_bytes % CHUNK_BYTES:
        return _NO_SWIZZLE
    base = (CHUNK_BYTES * 8 // elem_bits).bit_length() - 1          # elements per chunk, log2
    bits = min(3, (row_bytes // CHUNK_BYTES).bit_length() - 1)      # chunks per line, log2
    shift = max(cols.bit_length() - 1, base + 3) - base             # row bits sit above the line
    return Swizzle(bits, base, shift)


def _names(tiles) -> list[str]:
    return [t.name for t in tiles]


def _size(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _roles(spec) -> tuple[str, ...]:
    """Dimensions an on-chip copy keeps even at extent 1: a MatMul's m, n and k."""
    return tuple(getattr(spec, "roles", ()))


def _operand_tile(strategy, spec, name: str) -> Tile:
    names = [t.name for t in spec.operands]
    if not isinstance(name, str) or name not in names:
        raise ScheduleError("unknown operand", strategy=strategy, spec=spec, field="operand",
                            value=name, allowed=", ".join(repr(n) for n in names))
    return spec.operand(name)


@attrs.frozen(repr=False)
class move_to_smem(Strategy):
    """``move_to_smem(operand, swizzle=None, via=())``: stage an input of a block-level focus in
    shared memory; the focus reads the copy::

        MatMul<block>(A:GL f16[128x32], B:GL f16[32x128], C:RF f32[128x128]) acc f32   <- focus
          move_to_smem('A')
          Move<block>(A:GL f16[128x32] -> A:SH f16[128x32] Sw<2,3,3>)
          MatMul<block>(A:SH f16[128x32] Sw<2,3,3>, B:GL f16[32x128], C:RF f32[128x128]) acc f32   <- focus

    The shared tile has the operand's tile shape and major dimension; ``pipeline`` later makes it
    several stages deep.  The ``Move`` is refined at ``check()`` time.

    * ``operand``: the name of an input of the focus in global memory (``"A"``, ``"B"``, ``"X"``).
    * ``swizzle``: a ``Swizzle`` for the shared tile, or None for ``auto_swizzle``'s bank-conflict-free
      choice; it must keep 16-byte chunks whole.
    * ``via``: a tuple of one copy atom — ``sm80.cp_async_4/8/16``, a ``copy`` atom, or
      ``sm90a.tma_load_2d`` (TMA, needed by ``warp_specialize`` and read by wgmma); empty for the
      widest legal ``cp.async``.
    * ``stages``: buffers of a *tile move* — a TMA copy above a warp-specialized pipelined loop,
      which the producer issues once per block tile on a ring of its own
      (``lower.transforms.tile_moves``): with 2, a persistent block's next tile lands in the other
      buffer while the consumers still read this one (attention's query tile).  A move inside a
      pipelined loop is as deep as ``pipeline(stages=)`` makes it (``pipeline`` refuses one given
      another count); any other move has one buffer.
    """

    operand: str
    swizzle: Swizzle | None = None
    via: tuple = ()
    stages: int = 1

    def apply(self, sched):
        node = sched.open_focus(self)
        spec = node.spec
        t = _operand_tile(self, spec, self.operand)
        if spec.level != BLOCK:
            raise ScheduleError("shared memory belongs to a block: stage operands of a block-level spec",
                                strategy=self, spec=spec, field="level", value=str(spec.level),
                                allowed="block", fix="apply move_to_smem right after tiling to blocks (and K)")
        if t.memory != GL:
            raise ScheduleError(f"operand {t.name} is in {t.memory}, not global memory", strategy=self,
                                spec=spec, field="operand", value=self.operand,
                                allowed="operands in GL", fix="stage each operand once")
        if t.name in _names(spec.outputs):
            raise ScheduleError(f"{t.name} is the output (accumulated in registers); stage the inputs",
                                strategy=self, spec=spec, field="operand", value=self.operand,
                                allowed=", ".join(repr(n) for n in _names(spec.inputs)))
        cols = t.extent(t.tensor.major)
        sw = self.swizzle
        if sw is None:
            sw = auto_swizzle(cols, t.dtype.bits)
        elif not isinstance(sw, Swizzle):
            raise ScheduleError("swizzle must be a Swizzle(bits, base, shift) or None (automatic)",
                                strategy=self, spec=spec, field="swizzle", value=sw)
        else:
            min_base = (CHUNK_BYTES * 8 // t.dtype.bits).bit_length() - 1
            if sw.bits and sw.base < min_base:
                raise ScheduleError(
                    "the swizzle would split 16-byte chunks that copies and ldmatrix move whole",
                    strategy=self, spec=spec, field="swizzle", value=sw,
                    allowed=f"base >= {min_base} for {t.dtype} (or None for automatic)")
            tile_elems = _size(t.shape)
            if sw.bits and (1 << (sw.bits + sw.base + sw.shift)) > tile_elems:
                raise ScheduleError(f"the swizzle permutes blocks of {1 << (sw.bits + sw.base + sw.shift)} "
                                    f"elements, more than the {tile_elems}-element tile", strategy=self,
                                    spec=spec, field="swizzle", value=sw, fix="use fewer bits or swizzle=None")
        via = self.via if isinstance(self.via, (tuple, list)) else (self.via,)
        for a in via:
            if not isinstance(a, Atom) or a.family not in ("cp_async", "copy", "tma") or \
                    (a.family == "tma" and a.src_memory != "GL"):
                raise ScheduleError("via= names the copy atom for this move", strategy=self, spec=spec,
                                    field="via", value=self.via,
                                    allowed="sm80.cp_async_4/8/16, sm90a.tma_load_2d (or nothing: the widest "
                                            "legal cp.async)")
        if len(via) > 1:
            raise ScheduleError("give one copy atom", strategy=self, spec=spec, field="via", value=self.via)
        if isinstance(self.stages, bool) or not isinstance(self.stages, int) or not 1 <= self.stages <= 4:
            raise ScheduleError("stages: buffers of a tile move's ring, an int from 1 to 4", strategy=self, spec=spec,
                                field="stages", value=self.stages, allowed="1..4")
        if self.stages > 1 and not (via and via[0].family == "tma"):
            raise ScheduleError("stages > 1 gives a tile move (a TMA copy a warp-specialized producer issues once "
                                "per block tile) a ring of its own; this move is not a TMA copy", strategy=self,
                                spec=spec, field="stages", value=self.stages, allowed="1 without via=TMA",
                                fix=f"move_to_smem({self.operand!r}, via=(sm90a.tma_load_2d,), stages="
                                    f"{self.stages}) under warp_specialize(), or stages=1")
        sh = t.on_chip(SH, keep=_roles(spec), swizzle=sw)
        if self.stages > 1:
            sh = attrs.evolve(sh, tensor=attrs.evolve(sh.tensor, stages=self.stages))
        move = Node(Move(t, sh, BLOCK), via=tuple(via))
        if isinstance(spec, Fused):
            return self._into_fused(sched, node, t, sh, move)
        new = attrs.evolve(node, strategy=self, body=(move, Node(spec.with_operand(t.name, sh))))
        return sched.replace_focus(new)

    def _into_fused(self, sched, node, t, sh, move):
        """A fused focus runs its parts in order in one node: the copy goes before it, in the loop
        around it (the key loop of ``online_softmax``), and every part reads the shared tile."""
        path = sched.focus_path()
        if len(path) < 2:
            raise ScheduleError("a fused spec's input is staged in the loop around it; this one has none",
                                strategy=self, spec=node.spec, fix="tile the fused spec onto blocks first")
        if any(t.name in {x.name for x in p.spec.operands} and (p.loops or p.children) for p in node.body):
            raise ScheduleError(f"move_to_smem({t.name!r}) comes before the part(...) that reads {t.name}",
                                strategy=self, spec=node.spec)
        fused = attrs.evolve(node, spec=node.spec.with_operand(t.name, sh),
                             body=with_operand_in_parts(node.body, t.name, sh))
        parent = path[-2]
        parent = attrs.evolve(parent, body=parent.body[:-1] + (move, fused))
        return sched.replace_path(path[:-1], parent)

    def __repr__(self):
        args = [repr(self.operand)]
        if self.swizzle is not None:
            args.append(f"swizzle={self.swizzle!r}")
        if self.via:
            args.append(f"via={self.via!r}")
        if self.stages != 1:
            args.append(f"stages={self.stages!r}")
        return f"move_to_smem({', '.join(args)})"

    __str__ = __repr__


@attrs.frozen(repr=False)
class move_to_regs(Strategy):
    """``move_to_regs(operand, atom=None)``: load a shared-memory input of a warp-level (or
    block-level) focus into registers; the focus reads the fragments::

        MatMul<warp>(A:SH f16[64x32] Sw<2,3,3>, B:SH f16[32x64] Sw<3,3,4>, C:RF f32[64x64]) acc f32   <- focus
          move_to_regs('A')
          Move<warp>(A:SH f16[64x32] Sw<2,3,3> -> A:RF f16[64x32])
          MatMul<warp>(A:RF f16[64x32], B:SH f16[32x64] Sw<3,3,4>, C:RF f32[64x64]) acc f32   <- focus

    An int4 operand (``u4``/``i4`` weights) is *dequantised* on the way: the registers hold
    ``dtype`` values (f16 or bf16; by default the type of the focus's other input), converted
    eight at a time by a ``convert`` atom, with the group scales a ``prologue(operand,
    ops.group_scale(...))`` adds::

        MatMul<warp>(A:RF f16[16x64], B:SH u4[64x64] packed, C:RF f32[16x64]) acc f32   <- focus
          move_to_regs('B')
          Move<warp>(B:SH u4[64x64] packed -> B:RF f16[64x64])
          MatMul<warp>(A:RF f16[16x64], B:RF f16[64x64], C:RF f32[16x64]) acc f32   <- focus

    * ``operand``: the name of an input of the focus in shared memory (``move_to_smem`` first).
    * ``atom``: an ``ldmatrix`` atom (``sm80.ldmatrix_x1/x2/x4``, ``_trans``), or None to derive the
      variant whose fragments are exactly the ones the consuming atom reads.
    * ``dtype``: the register type of a dequantised int4 operand (``"f16"``, ``"bf16"``); other
      operands keep their type.
    """

    operand: str
    atom: Atom | None = None
    dtype: str | None = None

    def apply(self, sched):
        node = sched.open_focus(self)
        spec = node.spec
        t = _operand_tile(self, spec, self.operand)
        if t.name in _names(spec.outputs):
            red = spec.reduction_dims[0] if spec.reduction_dims else "k"
            raise ScheduleError(f"{t.name}'s register accumulator is created by tile({red}=...)",
                                strategy=self, spec=spec, field="operand", value=self.operand,
                                allowed=", ".join(repr(n) for n in _names(spec.inputs)))
        if spec.level == WARPGROUP and t.dtype.name not in QUANTISED:
            # a warpgroup's wgmma reads a float A fragment that other instructions wrote (an
            # accumulator); only the dequantising move fills one from shared memory
            raise ScheduleError(f"{t.name} is {t.dtype}: a warpgroup loads register fragments only by "
                                f"dequantising int4 codes (wgmma reads float operands from shared memory)",
                                strategy=self, spec=spec, field="level", value=str(spec.level),
                                allowed="warp, block (any operand); warpgroup (u4, i4 operands)",
                                fix="let the wgmma read it from shared memory (no move_to_regs), or "
                                    "tile(...) >> to_warps() for mma.sync")
        if spec.level not in (WARP, BLOCK, WARPGROUP):
            raise ScheduleError("register fragments are loaded by warps", strategy=self, spec=spec,
                                field="level", value=str(spec.level), allowed="warp, block, warpgroup",
                                fix="apply move_to_regs after tile(...) >> to_warps()")
        if t.memory != SH and not (t.memory == GL and t.dtype.name in QUANTISED):
            raise ScheduleError(f"operand {t.name} is in {t.memory}; fragments are loaded from shared "
                                "memory (ldmatrix)", strategy=self, spec=spec, field="operand",
                                value=self.operand, allowed="operands in SH; int4 codes in SH or GL",
                                fix=f"apply move_to_smem({t.name!r}) at the block level first")
        if self.atom is not None and (not isinstance(self.atom, Atom) or self.atom.family != "ldmatrix"):
            raise ScheduleError("move_to_regs takes an ldmatrix atom", strategy=self, spec=spec,
                                field="atom", value=self.atom,
                                allowed="sm80.ldmatrix_x1/x2/x4 with or without _trans, or None (automatic)")
        rf = t.on_chip(RF, keep=_roles(spec), dtype=self._register_dtype(spec, t))
        move = Node(Move(t, rf, spec.level), atom=self.atom)
        new = attrs.evolve(node, strategy=self, body=(move, Node(spec.with_operand(t.name, rf))))
        return sched.replace_focus(new)

    def _register_dtype(self, spec, t: Tile):
        """The registers' type: ``dtype`` for an int4 operand (by default the float type of the
        spec's other inputs), else None (the operand's own)."""
        quantised = t.dtype.name in QUANTISED
        if self.dtype is None:
            if not quantised:
                return None
            floats = sorted({x.dtype.name for x in spec.inputs if x.name != t.name and x.dtype.is_float})
            if len(floats) != 1 or floats[0] not in DEQUANT_TO:
                raise ScheduleError(f"{t.name} holds {t.dtype} codes: say which type to dequantise them to",
                                    strategy=self, spec=spec, field="dtype", value=None,
                                    allowed=", ".join(map(repr, DEQUANT_TO)),
                                    fix=f"move_to_regs({t.name!r}, dtype='f16')")
            return floats[0]
        if not quantised:
            raise ScheduleError(f"{t.name} is {t.dtype}; only int4 operands (u4, i4) change type on the way "
                                f"into registers", strategy=self, spec=spec, field="dtype", value=self.dtype,
                                allowed="None", fix=f"move_to_regs({t.name!r})")
        if self.dtype not in DEQUANT_TO:
            raise ScheduleError("int4 codes dequantise to a 16-bit float", strategy=self, spec=spec, field="dtype",
                                value=self.dtype, allowed=", ".join(map(repr, DEQUANT_TO)))
        return self.dtype

    def __repr__(self):
        a = f", atom={self.atom!r}" if self.atom is not None else ""
        d = f", dtype={self.dtype!r}" if self.dtype is not None else ""
        return f"move_to_regs({self.operand!r}{a}{d})"

    __str__ = __repr__
