"""Schedule → kernel IR.  Checking a schedule is lowering it (``Schedule.check``)."""

from .. import ir
from .. import schedule as _schedule
from .gemm_sm80 import Lowering
from .gemm_sm90 import HopperGemmLowering, uses_wgmma


def lower(sched, target=None) -> ir.Program:
    """The kernel IR of ``sched``; raises ``ScheduleError`` for anything that cannot be lowered."""
    if uses_wgmma(sched):
        # a schedule built on wgmma can only mean sm_90a; an explicit other target still errors
        return HopperGemmLowering(sched, "sm_90a" if target is None else target).run()
    return Lowering(sched, target).run()


_schedule.bind_lowering(lower)

__all__ = ["lower"]
