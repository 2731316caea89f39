"""The rules: one per kind of node a strategy creates (see ``firesched.lower.lowerer``).

Importing this package registers them: the decomposition and loop rules (``decompose``), moves
between memories (``copies``, ``tma``), accumulators and their epilogues (``accumulators``), the MMA
atoms (``mma``), element-wise work on register fragments (``fragments``), the launches of open kernel-level specs (``elementwise``), consumer warpgroups' turns to issue wgmma
(``turns``), aligned row windows (``align``), and group scales on partial products (``partials``)."""

from . import (
    accumulators,
    align,
    copies,
    decompose,
    elementwise,
    fragments,
    mma,
    partials,
    smem,
    threads,
    tma,
    turns,
)

__all__ = ["accumulators", "align", "copies", "decompose", "elementwise", "fragments", "mma", "partials", "smem",
           "threads", "tma", "turns"]
