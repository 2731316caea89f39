"""Targets: the GPU generations firesched generates code for, as data.

A ``Target`` holds the limits a schedule is checked against (shared memory per block and per SM,
registers, threads) and which atom families and features the generation has.  ``supports(atom)``
compares the atom's ``min_target`` with the target in generation order
sm_70 < sm_80 < sm_86 < sm_89 < sm_90a: an sm_80 atom runs on sm_86, sm_89 and sm_90a.
sm_90a alone has the Hopper families of ``atoms.sm90a`` (wgmma, TMA, mbarrier, ...).

Look a target up with ``target("sm_80")`` (``"sm80"`` works too) or use the constants ``SM70``,
``SM80``, ``SM86``, ``SM89``, ``SM90A``.  The SM counts are those of a reference part of each
generation: V100 (80), A100 (108), RTX 3090 (82), L4 (58) and H100 SXM (132).

sm_70 is in the catalog for the CPU interpreter only: NVRTC 13, the compiler firesched ships
with, cannot build for Volta, so ``firesched.compile`` refuses it (``CompileError``) while
``firesched.interpret`` runs sm_70 schedules.

**The default target.**  Wherever firesched takes ``arch=None`` (``compile``, the recipes,
``Schedule.check``), ``target(None)`` decides, by one rule (``default_target``): the
``FIRESCHED_ARCH`` environment variable when it is set, else the GPU present (device 0, its
compute capability mapped to a target: 8.0 → sm_80, 8.6/8.7 → sm_86, 8.9 → sm_89, 9.0 → sm_90a,
7.x → sm_70), else ``sm_90a``.  Asking the driver is done once per process and never fails: no
driver, no device or no ``cuda-bindings`` all mean "no GPU".
"""

from __future__ import annotations

import functools
import os

import attrs

from .atoms.base import CONVERT, COPY, CP_ASYNC, FLAG, LDMATRIX, MMA, SHUFFLE, SM90A_FAMILIES, SYNC

#: Generation order of the targets' names; an atom runs on every target at or after its min_target.
ORDER: tuple[str, ...] = ("sm_70", "sm_80", "sm_86", "sm_89", "sm_90a")

#: The target of a machine without a GPU.
FALLBACK = "sm_90a"

#: The environment variable that overrides the GPU present (e.g. ``FIRESCHED_ARCH=sm_80``).
ENV_VAR = "FIRESCHED_ARCH"

KIB = 1024


@attrs.frozen
class Target:
    """One GPU generation and the limits firesched checks schedules against."""

    name: str                       # one of ORDER
    arch: str                       # NVRTC --gpu-architecture value
    sm_count: int                   # SMs of the reference part
    smem_per_block_optin: int       # bytes of shared memory one block may use (opt-in maximum)
    smem_per_sm: int                # bytes of shared memory per SM
    families: frozenset = attrs.field(converter=frozenset)   # atom families the target has
    capability: tuple[int, int] = (0, 0)   # the compute capability the target's code is built for
    compiles: bool = True           # whether NVRTC (13) builds code for it; sm_70: interpreter only
    has_wgmma: bool = False
    has_tma: bool = False
    has_clusters: bool = False
    # griddepcontrol: a program's later kernels launched programmatically (they start while the
    # kernel before finishes, and wait for it in the kernel)
    has_pdl: bool = False
    smem_per_block: int = 48 * KIB  # without the opt-in (static shared memory limit)
    # what the driver keeps of the SM's shared memory for each resident block (sm_80 and later:
    # 1 KiB, cudaDevAttrReservedSharedMemoryPerBlock): N blocks of B bytes fit where N (B + this) do
    smem_reserved_per_block: int = 0
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

    @property
    def arch_specific(self) -> bool:
        """Whether the target's code runs on exactly its compute capability (``sm_90a``: wgmma,
        setmaxnreg), neither on later GPUs nor through its PTX."""
        return self.name.endswith("a")

    def thread_regs(self, threads: int, blocks: int = 1, granule: int = 1) -> int:
        """The registers each thread may take where the SM holds ``blocks`` blocks of ``threads``
        threads at once (``__launch_bounds__(threads, blocks)``, ``to_blocks(occupancy=...)``): the
        register file over them, in units of ``granule`` (ptxas allocates a warp's in units of 8 a
        thread), at most ``regs_per_thread``::

            SM90A.thread_regs(512)          -> 128
            SM90A.thread_regs(128, 6)       -> 85     (SM90A.thread_regs(128, 6, 8) -> 80)"""
        return min(self.regs_per_thread, self.regs_per_sm // max(1, threads * blocks) // granule * granule)

    def supports(self, atom) -> bool:
        """Whether ``atom`` can be issued on this target (its min_target is not later than us)."""
        if atom.min_target not in ORDER:
            raise ValueError(f"atom {atom.name}: unknown min_target {atom.min_target!r}; "
                             f"allowed: {', '.join(ORDER)}")
        return ORDER.index(atom.min_target) <= self.rank and atom.family in self.families

    def __str__(self) -> str:
        return self.name


_BASE_FAMILIES = (MMA, COPY, SHUFFLE, SYNC, FLAG)
_AMPERE_FAMILIES = _BASE_FAMILIES + (LDMATRIX, CP_ASYNC, CONVERT)

SM70 = Target(
    name="sm_70", arch="sm_70", sm_count=80, capability=(7, 0), compiles=False,
    smem_per_block_optin=96 * KIB, smem_per_sm=96 * KIB,
    families=_BASE_FAMILIES,
)

SM80 = Target(
    name="sm_80", arch="sm_80", sm_count=108, capability=(8, 0),
    smem_per_block_optin=163 * KIB, smem_per_sm=164 * KIB, smem_reserved_per_block=KIB,
    families=_AMPERE_FAMILIES,
)

# GA102 (RTX 3090: 82 SMs; the A10 has 72): the sm_80 instruction set with 100 KiB of shared
# memory and 1536 threads (16 blocks) per SM.
SM86 = Target(
    name="sm_86", arch="sm_86", sm_count=82, capability=(8, 6),
    smem_per_block_optin=99 * KIB, smem_per_sm=100 * KIB, smem_reserved_per_block=KIB,
    families=_AMPERE_FAMILIES, max_threads_per_sm=1536, max_blocks_per_sm=16,
)

# AD104 (L4: 58 SMs): Ada keeps the sm_86 limits except 24 blocks per SM.
SM89 = Target(
    name="sm_89", arch="sm_89", sm_count=58, capability=(8, 9),
    smem_per_block_optin=99 * KIB, smem_per_sm=100 * KIB, smem_reserved_per_block=KIB,
    families=_AMPERE_FAMILIES, max_threads_per_sm=1536, max_blocks_per_sm=24,
)

SM90A = Target(
    name="sm_90a", arch="sm_90a", sm_count=132, capability=(9, 0),
    smem_per_block_optin=227 * KIB, smem_per_sm=228 * KIB, smem_reserved_per_block=KIB,
    families=_AMPERE_FAMILIES + SM90A_FAMILIES,
    has_wgmma=True, has_tma=True, has_clusters=True, has_pdl=True,
)

TARGETS: dict[str, Target] = {t.name: t for t in (SM70, SM80, SM86, SM89, SM90A)}


def target_names(*, compiled: bool = False, since: str | None = None) -> str:
    """The targets, in generation order, as the ``allowed`` text of an error: every error that
    lists targets builds it here.  ``compiled`` keeps those NVRTC builds (drops sm_70), ``since``
    those at or after a target (the oldest one a schedule's atoms run on); otherwise sm_70 is
    listed as interpreter-only."""
    names = []
    start = ORDER.index(target(since).name) if since is not None else 0
    for t in TARGETS.values():
        if t.rank < start or (compiled and not t.compiles):
            continue
        names.append(t.name if t.compiles else f"{t.name} (interpret only)")
    return ", ".join(names)


def target_for_capability(major: int, minor: int, smem_optin: int | None = None) -> Target:
    """The target whose code runs best on a GPU of compute capability ``major.minor``: the same
    capability where we have it (9.0 → sm_90a), else the newest earlier one of the same major
    (8.7 → sm_86).  A GPU newer than every target (Blackwell, 10.x / 12.x) gets the newest target
    that is not architecture-specific and whose shared memory per block fits the GPU's opt-in
    ``smem_optin`` (bytes; unknown: the smallest), the most shared memory first (10.0 with 227 KiB
    → sm_80, 12.0 with 99 KiB → sm_89): its code runs there through its PTX, which the driver
    compiles for the GPU when it loads it.  Older than every target: ``ValueError``."""
    cc = (int(major), int(minor))
    same = [t for t in TARGETS.values() if t.capability[0] == cc[0] and t.capability <= cc]
    if same:
        return max(same, key=lambda t: t.capability)
    if cc > max(t.capability for t in TARGETS.values()):
        portable = [t for t in TARGETS.values() if t.compiles and not t.arch_specific]
        if smem_optin is None:
            smem_optin = min(t.smem_per_block_optin for t in portable)
        fits = [t for t in portable if t.smem_per_block_optin <= smem_optin] or portable
        return max(fits, key=lambda t: (t.smem_per_block_optin, t.rank))
    raise ValueError(f"compute capability {major}.{minor} is older than every target firesched has; "
                     f"allowed: {target_names()}")


@functools.lru_cache(maxsize=1)
def detected_target() -> Target | None:
    """The target of the GPU present (CUDA device 0), or None without one.  Asked of the driver
    once per process; no ``cuda-bindings``, no driver, no device or any driver error is None."""
    try:
        from cuda.bindings import driver
    except Exception:
        return None
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        err, count = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS or count < 1:
            return None
        err, dev = driver.cuDeviceGet(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        attr = driver.CUdevice_attribute
        values = []
        for a in (attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                  attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                  attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN):
            err, v = driver.cuDeviceGetAttribute(a, dev)
            if err != driver.CUresult.CUDA_SUCCESS:
                return None
            values.append(int(v))
    except Exception:
        return None
    try:
        return target_for_capability(*values)
    except ValueError:
        return None


def default_target() -> Target:
    """The target ``arch=None`` means everywhere: ``$FIRESCHED_ARCH`` when set, else the GPU
    present (``detected_target``), else sm_90a."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        try:
            return target(env)
        except ValueError as e:
            raise ValueError(f"${ENV_VAR}={env!r}: {e}; fix: set it to one of the targets, or unset "
                             f"it to use the GPU present") from None
    return detected_target() or TARGETS[FALLBACK]


def target(name: str | Target | None = None) -> Target:
    """The ``Target`` called ``name`` ("sm_80" or "sm80"); a ``Target`` passes through; None is
    the default target (``default_target``: the GPU present, else sm_90a)."""
    if name is None:
        return default_target()
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
        raise ValueError(f"unknown target {name!r}{hint}; allowed: {target_names()}")
    raise ValueError(f"unknown target {name!r}; allowed: {target_names()}")
