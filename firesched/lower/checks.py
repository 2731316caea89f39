"""Checks that cost O(tree), run before any statement is built.

A schedule whose tiles could never fit (a block tile of a million rows, more shared memory than the
target has, an atom the target lacks, a compute spec nobody refined) fails here in milliseconds,
with the strategy and the field at fault, instead of after lowering millions of unrolled copies.
Everything finer — fragments that do not match, tiles that do not divide on-chip data — is found
by the rules themselves, each before it builds anything.
"""

from __future__ import annotations

from ..schedule import Node, Schedule
from ..spec import MatMul
from ..tensor import SH
from .context import err


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
    # the compute atoms first (they decide the target), then the copies' via= atoms
    uses = [(n, n.atom, "done") for n in sched.nodes() if n.atom is not None]
    uses += [(n, v, "via") for n in sched.nodes() for v in n.via]
    for n, atom, what in uses:
        if not target.supports(atom):
            raise err(n, f"{atom.family} needs {atom.min_target}: the target {target.name} has no {atom.name}",
                      field=what, value=atom, allowed=f"atoms of {target.name} (min_target up to {target.name})",
                      fix=f"check/compile for {atom.min_target} or later, or pick an atom {target.name} has")
    _shared_estimate(sched, target)


def _shared_estimate(sched: Schedule, target) -> None:
    """The staged shared tiles alone, against the target's shared memory per block."""
    seen: dict[str, int] = {}
    where: dict[str, Node] = {}
    for n in sched.nodes():
        for t in n.spec.operands:
            if t.memory == SH and t.name not in seen:
                elems = 1
                for s in t.tensor.shape:
                    elems *= s
                stages = max(t.tensor.stages, 2) if any(v.family == "tma" for v in n.via) else t.tensor.stages
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
