"""Checks that cost O(tree), run before any statement is built.

A schedule whose tiles could never fit (a block tile of a million rows, more shared memory than the
target has, an atom the target lacks, a compute spec nobody refined) fails here in milliseconds,
with the strategy and the field at fault, instead of after lowering millions of unrolled copies.
Everything finer — fragments that do not match, tiles that do not divide on-chip data — is found
by the rules themselves, each before it builds anything.

The atoms a schedule uses are those its strategies name (``done(atom)``, ``via=``) and those the
rules pick for it (``atom_uses``): the copy a ``move_to_smem`` fills shared memory with (the rule's
own ``copy_atom``), the ldmatrix variant a ``move_to_regs`` derives from the consumer's fragments
(the rule's own ``ldmatrix_fits``), and the commit / wait of a cp.async ring.  Every one the target
lacks is refused here, in one error that lists them all.
"""

from __future__ import annotations

from typing import Callable

import attrs

from ..errors import ScheduleError
from ..hardware.atoms import sm80
from ..hardware.atoms.base import CP_ASYNC, SYNC, TMA, Atom
from ..hardware.target import ORDER
from ..schedule import Node, Schedule
from ..spec import MatMul, Move
from ..tensor import BLOCK, GL, RF, SH
from .context import err
from .layouts import plain_smem_layout, register_layouts
from .rules.copies import LDMATRIX_ATOMS, copy_atom, ldmatrix_fits
from .transforms.pipeline import ring_kind, staged_moves
from .transforms.tile_moves import tile_move_names


def precheck(sched: Schedule, target) -> None:
    root = sched.root
    if root.is_open:
        raise err(root, "this spec is not refined: a schedule starts with tile(...) >> to_blocks()",
                  fix="e.g. spec.schedule(tile(m=128, n=128) >> to_blocks(), ...)")
    for n in sched.nodes():
        if isinstance(n.spec, MatMul) and n.is_open:
            raise err(n, "this spec is not refined down to an atom",
                      fix="continue the chain until done(atom) (e.g. tile(m=16, n=8, k=16) >> "
                          "done(sm80.mma_m16n8k16_f16_f32) at the warp level)")
    _target_atoms(sched, target)
    _shared_estimate(sched, target)


# --------------------------------------------------------------------------- atoms

@attrs.frozen
class AtomUse:
    """An atom the lowering of ``node`` issues; ``how`` says who chose it (the strategy that names
    it, or the rule that picks it and for which strategy).  ``exact`` is False where the rule's
    choice could not be derived (the use then stands for the atom's family)."""

    node: Node = attrs.field(eq=False)
    atom: Atom
    how: str
    field: str
    exact: bool = True

    @property
    def label(self) -> str:
        return self.atom.name if self.exact else f"{self.atom.family} (any variant)"


def atom_uses(sched: Schedule) -> list[AtomUse]:
    """Every atom the lowering of ``sched`` issues that a strategy names or a rule picks, in tree
    order, compute atoms first: what ``check(target)`` compares with the target.  (Companion
    instructions of the Hopper families — wgmma fences, mbarriers, setmaxnreg — come with the
    wgmma and TMA atoms listed here and are not listed themselves.)"""
    return _uses(sched, lambda candidates: True)


def _uses(sched: Schedule, derive: Callable[[tuple], bool]) -> list[AtomUse]:
    """The uses of ``atom_uses``; a ``move_to_regs`` whose ldmatrix the rule picks among
    ``candidates`` is derived only where ``derive(candidates)`` (the derivation walks the
    fragments, so ``precheck`` asks for it only where the target has none of the candidates)."""
    done: list[AtomUse] = []
    moves: list[AtomUse] = []
    layouts: dict[int, dict] = {}
    staged: set[int] = set()

    def go(n: Node, parent: Node | None, block: Node | None):
        if block is None and n.spec.level == BLOCK:
            block = n
        made_by = str(parent.strategy) if parent is not None and parent.strategy is not None else None
        if n.atom is not None:
            how = f"done({n.atom!r})" if not isinstance(n.spec, Move) else (made_by or f"atom={n.atom!r}")
            done.append(AtomUse(n, n.atom, how, "done" if not isinstance(n.spec, Move) else "atom"))
        for v in n.via:
            moves.append(AtomUse(n, v, made_by or f"via=({v!r},)", "via"))
        for lp in n.loops:
            if _ring(n, lp) == "cp_async":
                staged.update(id(m) for m in staged_moves(n))
                what = f"the cp.async ring of pipeline(stages={lp.stages}) over loop {lp.var}"
                moves.extend([AtomUse(n, sm80.cp_async_commit, what, "stages"),
                              AtomUse(n, sm80.cp_async_wait, what, "stages")])
        if _open_move(n, GL, SH) and not (n.via and n.via[0].family == TMA):
            atom = _chosen_copy(n)
            if atom is not None and not n.via:
                moves.append(AtomUse(n, atom, f"the copy the lowering picks for {made_by or 'this move'}",
                                     "copy atom"))
            if atom is not None and atom.family == CP_ASYNC and id(n) not in staged:
                # not filled by a ring: the move waits for its own copies
                what = f"the wait for the copies of {made_by or 'this move'}"
                moves.extend([AtomUse(n, sm80.cp_async_commit, what, "copy atom"),
                              AtomUse(n, sm80.cp_async_wait, what, "copy atom")])
        if _open_move(n, SH, RF) and n.atom is None and derive(LDMATRIX_ATOMS):
            atom = _derived_ldmatrix(n, block, layouts)
            how = (f"the ldmatrix variant the lowering derives from the consumer's fragments for "
                   f"{made_by or 'this move'}")
            moves.append(AtomUse(n, atom or LDMATRIX_ATOMS[0], how, "atom", exact=atom is not None))
        for c in n.children:
            go(c, n, block)

    go(sched.root, None, None)
    # the copies and fragment loads first, the group commits and waits that come with them last
    return done + sorted(moves, key=lambda u: u.atom.family == SYNC)


def _open_move(n: Node, src, dst) -> bool:
    sp = n.spec
    return (isinstance(sp, Move) and sp.src.memory == src and sp.dst.memory == dst and n.strategy is None
            and not (n.loops or n.pre or n.body or n.post))


def _ring(n: Node, lp) -> str | None:
    """The kind of ring the pipeline rule makes of loop ``lp`` of ``n`` (as ``pipeline.pipelined``
    decides), or None."""
    if lp.unit is not None or n.spec.level != BLOCK or lp.dim not in n.spec.reduction_dims:
        return None
    if not staged_moves(n):
        return None
    try:
        return ring_kind(n)
    except ScheduleError:
        return None       # the rule refuses the mixed ring itself


def _chosen_copy(n: Node):
    """The copy atom the global -> shared rule picks for ``n`` (its ``copy_atom``, on the shared
    layout per-thread copies fill); None where it picks none (element copies through registers)
    or refuses (it says why itself, when lowering)."""
    src, dst = n.spec.src, n.spec.dst
    lay = plain_smem_layout(dst.tensor)
    try:
        atom = copy_atom(n, lay.cols, src.tensor.extent(lay.col_dim), src.tensor.dtype.bits)
    except ScheduleError:
        return None
    return atom if isinstance(atom, Atom) else None


def _derived_ldmatrix(n: Node, block: Node | None, layouts: dict):
    """The ldmatrix variant the shared -> register rule picks for ``n`` from the register layout of
    its consumer (ignoring the target), or None where it cannot be derived."""
    if block is None:
        return None
    try:
        if id(block) not in layouts:
            layouts[id(block)] = register_layouts(block)
        lay = layouts[id(block)].get(n.spec.dst.tensor)
        if lay is None:
            return None
        src = n.spec.src
        rdim, cdim = src.tensor.storage_dims[-2:]
        return next((a for a in LDMATRIX_ATOMS if ldmatrix_fits(a, lay, src, rdim, cdim) is None), None)
    except ScheduleError:
        return None


_SHOWN = 12


def _target_atoms(sched: Schedule, target) -> None:
    """Refuse every atom the schedule uses that ``target`` lacks, in one error."""
    lacking = [u for u in _uses(sched, lambda cands: not any(target.supports(a) for a in cands))
               if not target.supports(u.atom)]
    if not lacking:
        return
    first = lacking[0]
    need = max((u.atom.min_target for u in lacking), key=ORDER.index)
    lines = []
    for u in lacking[:_SHOWN]:
        lines.append(f"{u.label} ({u.atom.family}, needs {u.atom.min_target}): {u.how}, on {u.node.spec}")
    if len(lacking) > _SHOWN:
        lines.append(f"... and {len(lacking) - _SHOWN} more")
    later = " or later" if ORDER.index(need) < len(ORDER) - 1 else ""
    own = target.name.replace("_", "")
    raise err(first.node,
              f"{first.atom.family} needs {first.atom.min_target}: the target {target.name} has no {first.label}. "
              f"The atoms this schedule uses that {target.name} lacks:\n    " + "\n    ".join(lines),
              field=first.field, value=first.atom,
              allowed=f"atoms of {target.name} (min_target up to {target.name}: "
                      f"catalog.for_target({target.name!r}, every=True))",
              fix=f"compile for {need}{later}, or use the {own} atoms (firesched.hardware.atoms.{own})")


# --------------------------------------------------------------------------- shared memory


def _shared_estimate(sched: Schedule, target) -> None:
    """The staged shared tiles alone, against the target's shared memory per block."""
    seen: dict[str, int] = {}
    where: dict[str, Node] = {}
    # a pipelined loop's TMA ring has at least two stages; a tile move's is as deep as its tile
    once = tile_move_names(sched.root)
    for n in sched.nodes():
        for t in n.spec.operands:
            if t.memory == SH and t.name not in seen:
                elems = 1
                for s in t.tensor.shape:
                    elems *= s
                tma = any(v.family == "tma" for v in n.via) and t.name not in once
                stages = max(t.tensor.stages, 2) if tma else t.tensor.stages
                seen[t.name] = elems * stages * t.dtype.bits // 8
            if t.memory == SH and t.name not in where and isinstance(n.spec, MatMul):
                where[t.name] = n          # the compute spec that reads the staged tile
    # as the launch lays them out: each buffer aligned, 128 bytes of slack apiece
    total = sum(seen.values()) + 128 * len(seen)
    if total > target.smem_per_block_optin:
        first = next(iter(seen))
        parts = ", ".join(f"{k}_smem: {v} B" for k, v in seen.items())
        raise err(where.get(first, sched.root), f"shared memory over the target's limit: {total} bytes ({parts}, "
                                                "the staged tiles alone)", field="shared memory", value=total,
                  allowed=f"<= {target.smem_per_block_optin} bytes on {target.name}",
                  fix="use fewer pipeline stages or smaller block / K tiles")
