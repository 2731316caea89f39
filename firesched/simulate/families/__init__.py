"""The executors of the atom families, one module per group of families.

An executor is a function ``(run, stmt)`` that executes one ``AtomCall`` for the threads of the
run's lockstep group: it decodes the operands, asks ``run.ctx`` which threads issue the atom,
moves data through ``run.mem`` and ``run.regs``, and records what stays in flight in the
asynchronous model (``run.cp``, ``run.tma``, ``run.wg``, ``run.bars``).  ``EXECUTORS`` maps each
interpretable family to its executor.
"""

from __future__ import annotations

from ...hardware.atoms import base as atoms
from ...hardware.atoms import sm90a
from . import barriers, collectives, conversions, copies, flags, griddep, tma, wgmma

EXECUTORS = {
    atoms.COPY: copies.copy,
    atoms.CP_ASYNC: copies.cp_async,
    atoms.LDMATRIX: collectives.ldmatrix,
    atoms.MMA: collectives.mma,
    atoms.SHUFFLE: collectives.shuffle,
    atoms.SYNC: barriers.sync,
    atoms.CONVERT: conversions.convert,
    atoms.FLAG: flags.flag,
    sm90a.WGMMA: wgmma.wgmma,
    sm90a.WGMMA_SYNC: wgmma.wgmma_sync,
    sm90a.TMA: tma.tma,
    sm90a.MBARRIER: barriers.mbarrier,
    sm90a.FENCE: barriers.fence,
    sm90a.SETMAXNREG: wgmma.setmaxnreg,
    sm90a.STMATRIX: collectives.stmatrix,
    sm90a.CLUSTER: barriers.cluster,
    sm90a.DSMEM: copies.dsmem,
    sm90a.GRIDDEP: griddep.griddep,
}

__all__ = ["EXECUTORS"]
