"""Every atom of every table, and the look-ups the strategies use to pick one.

``ALL_ATOMS`` lists the records of ``sm70``, ``sm80`` and ``convert`` (thread-level register
conversions: int4 dequantisation and group scales, sm_80 instructions) in table order: the
warp-level generation every strategy so far is built on.  The Hopper records of ``sm90a`` (wgmma, TMA,
mbarrier, stmatrix, ...) are ``SM90A_ATOMS``, and ``EVERY_ATOM`` is both; they are kept out of
``ALL_ATOMS`` so that the generic look-ups below and the tables' tests keep meaning "the
mma.sync/ldmatrix/cp.async generation" until strategies use the new families.  Names are unique
across all tables.  ``by_name`` finds one record of any table, ``for_target`` those a target can
issue (``every=True`` includes the sm90a records), ``mma_atoms`` the MMA atoms of a dtype
combination and ``copy_atom`` the thread-level move of a width between two memories.
``with_immediates`` turns template parameters that PTX wants as literal constants (``$n`` of
``cp.async.wait_group``) into text before the atom reaches ``asm_node``; ``immediates_of`` reads
them back.  ``predicated`` writes a load and its zeros under one PTX predicate.
"""

from __future__ import annotations

import difflib
import re

import attrs

from ...dtypes import DType, dtype
from ..target import Target
from ..target import target as _target
from . import convert, sm70, sm80, sm90a
from .base import COPY, CP_ASYNC, MMA, Atom

ALL_ATOMS: tuple[Atom, ...] = sm70.ATOMS + sm80.ATOMS + convert.ATOMS
SM90A_ATOMS: tuple[Atom, ...] = sm90a.ATOMS
EVERY_ATOM: tuple[Atom, ...] = ALL_ATOMS + SM90A_ATOMS

BY_NAME: dict[str, Atom] = {a.name: a for a in EVERY_ATOM}
if len(BY_NAME) != len(EVERY_ATOM):  # pragma: no cover - a table error, caught on import
    _names = [a.name for a in EVERY_ATOM]
    _dups = sorted({n for n in _names if _names.count(n) > 1})
    raise RuntimeError(f"atom names are not unique: {_dups}")


def by_name(name: str) -> Atom:
    """The atom called ``name`` (``"ldmatrix_x4"``); a ValueError names the closest ones."""
    if name in BY_NAME:
        return BY_NAME[name]
    close = difflib.get_close_matches(str(name), BY_NAME, n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ValueError(f"no atom named {name!r}{hint} (allowed: {', '.join(BY_NAME)})")


def for_target(target: Target | str, *, every: bool = False) -> tuple[Atom, ...]:
    """The atoms of ``ALL_ATOMS`` (``every``: of ``EVERY_ATOM``) that ``target`` can issue, in
    table order."""
    t = _target(target)
    return tuple(a for a in (EVERY_ATOM if every else ALL_ATOMS) if t.supports(a))


def mma_atoms(a_dtype: DType | str, b_dtype: DType | str, acc_dtype: DType | str,
              target: Target | str | None = None) -> tuple[Atom, ...]:
    """MMA atoms multiplying ``a_dtype`` by ``b_dtype`` into ``acc_dtype`` accumulators, largest
    k first; restricted to those ``target`` can issue when it is given.  Empty when none fits."""
    a, b, acc = dtype(a_dtype), dtype(b_dtype), dtype(acc_dtype)
    t = None if target is None else _target(target)
    found = [x for x in ALL_ATOMS
             if x.family == MMA and x.dtype_of("a") == a and x.dtype_of("b") == b
             and x.dtype_of("c") == acc and (t is None or t.supports(x))]
    return tuple(sorted(found, key=lambda x: -x.shape[2]))


def copy_atom(src_mem: str, dst_mem: str, width: int) -> Atom:
    """The per-thread move of ``width`` bytes from ``src_mem`` to ``dst_mem``.

    Memories are ``"GL"``, ``"SH"`` and ``"RF"``; global -> shared is ``cp.async`` (16 bytes:
    ``cp_async_16``, which bypasses L1; ``cp_async_16_ca`` is asked for by name).
    """
    family = CP_ASYNC if (src_mem, dst_mem) == ("GL", "SH") else COPY
    cands = [a for a in ALL_ATOMS
             if a.family == family and a.src_memory == src_mem and a.dst_memory == dst_mem]
    if not cands:
        pairs = sorted({(a.src_memory, a.dst_memory) for a in ALL_ATOMS if a.family in (COPY, CP_ASYNC)})
        raise ValueError(f"no copy atom moves {src_mem} -> {dst_mem}; "
                         f"allowed: {', '.join(f'{s}->{d}' for s, d in pairs)}")
    for a in cands:
        if a.width == width:
            return a
    raise ValueError(f"no {src_mem} -> {dst_mem} copy atom of width {width!r} bytes; "
                     f"allowed: {sorted({a.width for a in cands})}")


def with_immediates(atom: Atom, **values: int) -> Atom:
    """``atom`` with ``$name`` replaced by the literal ``values[name]`` in its PTX template.

    For parameters PTX only takes as constants, e.g. ``with_immediates(cp_async_wait, n=1)``
    prints ``cp.async.wait_group 1;``.
    """
    ptx = atom.ptx
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"atom {atom.name}: immediate {name}={v!r} is not an int")
        pattern = re.compile(r"\$" + re.escape(name) + r"(?![A-Za-z0-9_])")
        if not pattern.search(ptx):
            raise ValueError(f"atom {atom.name}: its template {atom.ptx!r} has no ${name}")
        ptx = pattern.sub(str(v), ptx)
    return attrs.evolve(atom, ptx=ptx)


def predicated(atom: Atom) -> Atom:
    """``atom``, a COPY load into registers, as one PTX statement under the predicate ``$guard``
    (an integer operand; non-zero: load): its registers set to zero, then the load issued where
    the predicate holds, with no branch around it (``ir.AtomCall.guard``)::

        { .reg .pred fs_g;  setp.ne.b32 fs_g, $guard, 0;
          mov.b32 $dst[0], 0;  ...  mov.b32 $dst[3], 0;
          @fs_g ld.global.v4.b32 $dst, [$src]; }

    A disabled load thus leaves zeros, as the branch form's ``else`` does."""
    regs = [o for o in atom.operands if o.memory == "RF" and o.role == "out"]
    if atom.family != COPY or len(regs) != 1 or atom.dst_memory != "RF":
        raise ValueError(f"atom {atom.name}: only a COPY load into registers can be predicated this way "
                         f"(family {atom.family}, {atom.src_memory} -> {atom.dst_memory})")
    if "$guard" in atom.ptx:
        raise ValueError(f"atom {atom.name}: already predicated ({atom.ptx!r})")
    dst = regs[0]
    zeros = " ".join(f"mov.b{dst.reg_bits} ${dst.name}[{r}], 0;" for r in range(dst.regs))
    ptx = f"{{ .reg .pred fs_g; setp.ne.b32 fs_g, $guard, 0; {zeros} @fs_g {atom.ptx} }}"
    return attrs.evolve(atom, ptx=ptx)


def immediates_of(atom: Atom) -> dict[str, int]:
    """The immediates ``with_immediates`` substituted into ``atom``, by name (``{"n": 1}`` for
    ``with_immediates(cp_async_wait, n=1)``); empty for a record as the table holds it.

    The original template is the record of the same name in the tables; each ``$name`` that is
    gone from ``atom.ptx`` must have been replaced by an integer."""
    original = BY_NAME.get(atom.name)
    if original is None or original.ptx == atom.ptx:
        return {}
    pattern, names, pos = "", [], 0
    for m in re.finditer(r"\$([A-Za-z_][A-Za-z0-9_]*)", original.ptx):
        pattern += re.escape(original.ptx[pos:m.start()])
        name = m.group(1)
        if name in names:
            pattern += f"(?P={name})"
        else:
            pattern += rf"(?P<{name}>-?\d+|\${name}(?![A-Za-z0-9_]))"
            names.append(name)
        pos = m.end()
    pattern += re.escape(original.ptx[pos:])
    m = re.fullmatch(pattern, atom.ptx)
    if m is None:
        raise ValueError(f"atom {atom.name}: its template {atom.ptx!r} is not the record's "
                         f"{original.ptx!r} with integers substituted")
    return {n: int(m.group(n)) for n in names if not m.group(n).startswith("$")}
