"""Targets: the GPU generations firesched generates code for, as data.

A ``Target`` holds the limits a schedule is checked against (shared memory per block and per SM,
registers, threads) and which atom families and features the generation has.  ``supports(atom)``
compares the atom's ``min_target`` with the target in generation order sm_70 < sm_80 < sm_90a.
sm_90a alone has the Hopper families of ``atoms.sm90a`` (wgmma, TMA, mbarrier, ...).

Look a target up with ``target("sm_80")`` (``"sm80"`` works too) or use the constants ``SM70``,
``SM80``, ``SM90A``.  The SM counts are those of the reference parts: V100 (80), A100 (108) and
H100 SXM (132).
"""

from __future__ import annotations

import attrs

from .atoms.base import COPY, CP_ASYNC, LDMATRIX, MMA, SHUFFLE, SM90A_FAMILIES, SYNC

#: Generation order of the targets' names; an atom runs on every target at or after its min_target.
ORDER: tuple[str, ...] = ("sm_70", "sm_80", "sm_90a")

KIB = 1024


@attrs.frozen
class Target:
    """One GPU generation and the limits firesched checks schedules against."""

    name: str                       # "sm_70" | "sm_80" | "sm_90a"
    arch: str                       # NVRTC --gpu-architecture value
    sm_count: int                   # SMs of the reference part
    smem_per_block_optin: int       # bytes of shared memory one block may use (opt-in maximum)
    smem_per_sm: int                # bytes of shared memory per SM
    families: frozenset = attrs.field(converter=frozenset)   # atom families the target has
    has_wgmma: bool = False
    has_tma: bool = False
    has_clusters: bool = False
    smem_per_block: int = 48 * KIB  # without the opt-in (static shared memory limit)
    regs_per_thread: int = 255
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    warp_size: int = 32

    @property
    def rank(self) -> int:
        """Position in generation order (sm_70 is 0)."""
        return ORDER.index(self.name)

    def supports(self, atom) -> bool:
        """Whether ``atom`` can be issued on this target (its min_target is not later than us)."""
        if atom.min_target not in ORDER:
            raise ValueError(f"atom {atom.name}: unknown min_target {atom.min_target!r}; "
                             f"allowed: {', '.join(ORDER)}")
        return ORDER.index(atom.min_target) <= self.rank and atom.family in self.families

    def __str__(self) -> str:
        return self.name


_BASE_FAMILIES = (MMA, COPY, SHUFFLE, SYNC)

SM70 = Target(
    name="sm_70", arch="sm_70", sm_count=80,
    smem_per_block_optin=96 * KIB, smem_per_sm=96 * KIB,
    families=_BASE_FAMILIES,
)

SM80 = Target(
    name="sm_80", arch="sm_80", sm_count=108,
    smem_per_block_optin=163 * KIB, smem_per_sm=164 * KIB,
    families=_BASE_FAMILIES + (LDMATRIX, CP_ASYNC),
)

SM90A = Target(
    name="sm_90a", arch="sm_90a", sm_count=132,
    smem_per_block_optin=227 * KIB, smem_per_sm=228 * KIB,
    families=_BASE_FAMILIES + (LDMATRIX, CP_ASYNC) + SM90A_FAMILIES,
    has_wgmma=True, has_tma=True, has_clusters=True,
)

TARGETS: dict[str, Target] = {t.name: t for t in (SM70, SM80, SM90A)}


def target(name: str | Target) -> Target:
    """The ``Target`` called ``name`` ("sm_80" or "sm80"); a ``Target`` passes through."""
    if isinstance(name, Target):
        return name
    if isinstance(name, str):
        key = name.strip().lower()
        if key.startswith("sm") and not key.startswith("sm_"):
            key = "sm_" + key[2:]
        if key in TARGETS:
            return TARGETS[key]
        hint = ""
        if key + "a" in TARGETS:
            hint = f" (did you mean {key + 'a'!r}? firesched targets the arch-specific variant)"
        raise ValueError(f"unknown target {name!r}{hint}; allowed: {', '.join(TARGETS)}")
    raise ValueError(f"unknown target {name!r}; allowed: {', '.join(TARGETS)}")
