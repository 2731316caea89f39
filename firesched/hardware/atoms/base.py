"""The atom record: one hardware instruction variant as data, and the families of the catalog.

An ``Atom`` says what spec it implements (its *pattern*: kind, thread group, tile shape, dtypes,
memories), how each operand is distributed over the threads that execute it together (a
``TVLayout`` per register operand, an address layout per memory operand), how to print it as PTX
(a template with named operand groups, expanded by ``asm_node``), its alignment rule, its minimum
target and its numpy semantics.  The CUDA printer and the CPU interpreter read the same record,
so an atom that prints right and interprets wrong cannot hide.

Templates name operand groups with ``$name`` (``$d``, ``$a``, ``[$src]``): PTX's own braces
``{...}`` stay literal and never collide with a formatting language.  ``$name`` expands to ``%i``
for one register or ``{%i, %j, ...}`` for a vector; ``$name[r]`` is register ``r`` of the group
alone (multi-instruction templates that write a vector's registers one by one).

Families (``Atom.family``, the constants below): ``mma``, ``ldmatrix``, ``copy``, ``cp_async``,
``shuffle``, ``sync`` (sm_70 / sm_80 tables); ``convert`` (the ``convert`` table: register to
register dequantisation and scaling); ``wgmma``, ``wgmma_sync``, ``tma``, ``mbarrier``,
``fence``, ``setmaxnreg``, ``stmatrix``, ``cluster`` (the sm_90a table).
"""

from __future__ import annotations

import re
from typing import Callable

import attrs

from ...dtypes import DType
from ...layout import Layout, TVLayout

# Thread groups an atom can be issued by, with the number of threads in each.
THREAD, QUADPAIR, WARP, WARPGROUP, BLOCK = "thread", "quadpair", "warp", "warpgroup", "block"
GROUP_THREADS = {THREAD: 1, QUADPAIR: 8, WARP: 32, WARPGROUP: 128}

# Families: how the interpreter executes an atom and how the lowering uses it.
MMA = "mma"              # c = a @ b + c on register fragments
LDMATRIX = "ldmatrix"    # warp-collective shared -> register tile load
COPY = "copy"            # a thread moves `vector` contiguous elements between memories / registers
CP_ASYNC = "cp_async"    # asynchronous global -> shared copy (completes at cp.async.wait_group)
SHUFFLE = "shuffle"      # shfl.sync
SYNC = "sync"            # barriers, async-group commit/wait
CONVERT = "convert"      # a thread's register -> register conversion (int4 dequantisation, scaling)
FLAG = "flag"            # a flag in global memory that one block releases and another acquires
# Hopper (sm_90a) families, see ``atoms.sm90a``.
WGMMA = "wgmma"            # warpgroup MMA, asynchronous (completes at wgmma.wait_group)
WGMMA_SYNC = "wgmma_sync"  # wgmma.fence / commit_group / wait_group
TMA = "tma"                # cp.async.bulk.tensor and its bulk-group commit / wait
MBARRIER = "mbarrier"      # mbarrier.init / arrive / arrive.expect_tx / try_wait.parity
FENCE = "fence"            # fence.proxy.async, fence.mbarrier_init
SETMAXNREG = "setmaxnreg"  # warpgroup register reallocation
STMATRIX = "stmatrix"      # warp-collective register -> shared 8x8 matrix store
CLUSTER = "cluster"        # barrier.cluster (every thread of every block of the cluster)
DSMEM = "dsmem"            # a thread's load from another cluster block's shared memory (mapa + ld.shared::cluster)
GRIDDEP = "griddep"        # griddepcontrol: a programmatic launch's trigger and wait
SM90A_FAMILIES = (WGMMA, WGMMA_SYNC, TMA, MBARRIER, FENCE, SETMAXNREG, STMATRIX, CLUSTER, DSMEM, GRIDDEP)

_REG_CONSTRAINT = {16: "h", 32: "r", 64: "l"}


@attrs.frozen
class Operand:
    """One operand group of an atom.

    ``memory`` is ``"RF"`` for registers, ``"SH"``/``"GL"`` for an address operand.
    ``regs`` is the number of PTX registers in the group (vector operands print as ``{...}``);
    ``reg_bits`` their width (a b32 register may hold two f16 values); ``values`` the number of
    data elements per thread the group carries.  ``tv`` maps (thread, value) to the operand's tile
    coordinate for group atoms; ``addr`` maps a thread to the tile coordinate (column-major index)
    whose address it supplies, for memory operands of collective atoms (ldmatrix).
    """

    name: str
    role: str                 # "in" | "out" | "inout"
    memory: str               # "RF" | "SH" | "GL"
    regs: int = 1
    reg_bits: int = 32
    values: int = 1
    float_regs: bool = False  # f32 registers print with the "f" constraint
    tv: TVLayout | None = None
    addr: Layout | None = None

    @property
    def constraint(self) -> str:
        if self.memory == "GL":
            return "l"          # 64-bit generic address of global memory
        if self.memory == "SH":
            return "r"          # 32-bit shared-window address (__cvta_generic_to_shared)
        if self.float_regs:
            return "f" if self.reg_bits == 32 else "d"
        return _REG_CONSTRAINT[self.reg_bits]


@attrs.frozen(repr=False)
class Atom:
    """One instruction variant.  See the module docstring."""

    name: str
    family: str
    group: str                                # THREAD | QUADPAIR | WARP | WARPGROUP | BLOCK
    kind: str                                 # "MatMul" | "Move" | "Sync" | "Shuffle"
    shape: tuple[int, ...]                    # MatMul: (m, n, k); Move: (rows, cols) of one issue
    dtypes: tuple[tuple[str, DType], ...]     # operand name -> element dtype
    operands: tuple[Operand, ...]
    ptx: str                                  # template with $operand groups
    min_target: str                           # "sm_70" | "sm_80" | "sm_90a"
    alignment: int = 0                        # bytes each address must be aligned to
    src_memory: str | None = None             # Move atoms: where data comes from
    dst_memory: str | None = None             # Move atoms: where data goes
    width: int = 0                            # COPY / CP_ASYNC: contiguous bytes per thread per issue
    trans: bool = False                       # LDMATRIX: fragments transposed; WGMMA: B MN-major
    trans_a: bool = False                     # WGMMA: A MN-major in shared memory (imm-trans-a)
    # numpy meaning, by family:
    #   MMA:       semantics(a[m,k], b[k,n], c[m,n]) -> d[m,n]   (tiles in the operands' dtypes)
    #   LDMATRIX, COPY, CP_ASYNC: semantics(tile) -> tile      (the data each thread receives is
    #              then given by the destination operand's TV layout, in memory coordinates)
    #   SHUFFLE:   semantics(values[32], src_lane[32]) -> values[32]
    #   CONVERT:   semantics(*words) -> words: one uint32 array [..., regs] per input register
    #              operand, in operand order, the output operand's [..., regs] words back (the
    #              bits the instructions compute; ``atoms.convert.to_words`` packs values)
    #   SYNC:      None
    # Every semantics also takes a stack of operands along leading axes (a[..., m, k], values[..., 32])
    # and returns the stack of results: the interpreter executes all issuing groups of a statement
    # in one call (tests/test_atoms.py checks each catalog atom stacked against one by one).
    semantics: Callable | None = attrs.field(default=None, eq=False, hash=False)
    catalog: str = ""                         # module name of the table ("sm80"), for repr
    doc: str = ""

    def __repr__(self) -> str:
        return f"{self.catalog}.{self.name}" if self.catalog else f"Atom({self.name!r})"

    def __str__(self) -> str:
        return self.name

    @property
    def threads(self) -> int:
        return GROUP_THREADS.get(self.group, 1)

    def dtype_of(self, operand: str) -> DType:
        for n, d in self.dtypes:
            if n == operand:
                return d
        raise KeyError(f"atom {self.name} has no operand {operand!r}; it has {[n for n, _ in self.dtypes]}")

    def operand(self, name: str) -> Operand:
        for o in self.operands:
            if o.name == name:
                return o
        raise KeyError(f"atom {self.name} has no operand {name!r}; it has {[o.name for o in self.operands]}")

    def values_for(self, dt: DType) -> int:
        """Elements of ``dt`` one thread moves per issue (COPY / CP_ASYNC), 0 if ``width`` is not a
        whole number of elements."""
        bits = self.width * 8
        return bits // dt.bits if bits % dt.bits == 0 and bits >= dt.bits else 0


# --------------------------------------------------------------------------- PTX emission

@attrs.frozen
class Asm:
    """A structured ``asm volatile`` statement: template, outputs, inputs, clobbers.

    Outputs/inputs are ``(constraint, c_expression)`` pairs; ``%i`` in the template refers to
    outputs first, then inputs, as in GCC-style inline assembly.
    """

    template: str
    outputs: tuple[tuple[str, str], ...] = ()
    inputs: tuple[tuple[str, str], ...] = ()
    clobbers: tuple[str, ...] = ()
    comment: str = ""

    def to_c(self) -> str:
        def grp(items):
            return ", ".join(f'"{c}"({e})' for c, e in items)

        text = self.template.replace("\\", "\\\\").replace('"', '\\"')
        s = f'asm volatile("{text}"\n    : {grp(self.outputs)}\n    : {grp(self.inputs)}'
        if self.clobbers:
            s += "\n    : " + ", ".join(f'"{c}"' for c in self.clobbers)
        return s + ");"


_GROUP = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?")


def asm_node(atom: Atom, bindings: dict[str, list[str]], *, clobbers: tuple[str, ...] = (),
             comment: str = "") -> Asm:
    """Build the ``Asm`` for ``atom`` with each operand group bound to C expressions.

    ``bindings[name]`` lists one C lvalue/rvalue per register of the group (memory operands: one
    address expression; extra scalar template operands such as ``src_size``: one expression).
    Output and inout groups come first in the operand numbering.
    """
    outs: list[tuple[str, str]] = []
    ins: list[tuple[str, str]] = []
    index: dict[str, list[int]] = {}
    ordered = [o for o in atom.operands if o.role in ("out", "inout") and o.memory == "RF"]
    ordered += [o for o in atom.operands if not (o.role in ("out", "inout") and o.memory == "RF")]
    n_out = sum(len(bindings[o.name]) for o in ordered if o.role in ("out", "inout") and o.memory == "RF")
    pos_out, pos_in = 0, n_out
    for o in ordered:
        exprs = bindings.get(o.name)
        if exprs is None:
            raise KeyError(f"atom {atom.name}: operand {o.name!r} is not bound")
        if o.role in ("out", "inout") and o.memory == "RF":
            prefix = "=" if o.role == "out" else "+"
            outs += [(prefix + o.constraint, e) for e in exprs]
            index[o.name] = list(range(pos_out, pos_out + len(exprs)))
            pos_out += len(exprs)
        else:
            ins += [(o.constraint, e) for e in exprs]
            index[o.name] = list(range(pos_in, pos_in + len(exprs)))
            pos_in += len(exprs)
    extra = [k for k in bindings if k not in index]
    for k in extra:  # scalar immediates/registers named in the template, e.g. $src_size
        ins += [("r", e) for e in bindings[k]]
        index[k] = list(range(pos_in, pos_in + len(bindings[k])))
        pos_in += len(bindings[k])

    def expand(m: re.Match) -> str:
        name = m.group(1)
        if name not in index:
            raise KeyError(f"atom {atom.name}: template names ${name}, which is no operand")
        ids = index[name]
        if m.group(2) is not None:
            r = int(m.group(2))
            if r >= len(ids):
                raise KeyError(f"atom {atom.name}: template names ${name}[{r}]; the group has {len(ids)} registers")
            return f"%{ids[r]}"
        return f"%{ids[0]}" if len(ids) == 1 else "{" + ", ".join(f"%{i}" for i in ids) + "}"

    return Asm(_GROUP.sub(expand, atom.ptx), tuple(outs), tuple(ins), clobbers, comment)
