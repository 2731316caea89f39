"""``warp_specialize()``: split a pipelined block into a producer warpgroup and consumer warpgroups.

::

    for k0 in seq(64) pipelined(4 stages):          for k0 in seq(64) pipelined(4 stages)
      Move<block>(A:GL -> A:SH x4 stages)    ==>        warp-specialized(producer 40 regs, consumers 232):
      Move<block>(B:GL -> B:SH x4 stages)             Move<block>(A:GL -> A:SH x4 stages)   # producer
      MatMul<block>(...)                              Move<block>(B:GL -> B:SH x4 stages)   # producer
                                                      MatMul<block>(...)                    # consumers

The block gets one more warpgroup.  Its first thread issues every TMA copy of the ring, waiting
on an "empty" mbarrier per stage before it refills one; the consumer warpgroups (those
``to_warpgroups`` creates) wait on the stage's "full" mbarrier, issue their wgmma and release the
stage once ``wgmma.wait_group`` has retired the wgmma that read it — keeping one wgmma group in
flight behind the next.  ``setmaxnreg`` moves registers from the producer (``producer_regs``
per thread) to the consumers (``consumer_regs``), whose accumulators need them.  Needs the
sm_90a atoms: a ``pipeline`` over moves ``via=(sm90a.tma_load_2d,)``.
"""

from __future__ import annotations

import attrs

from ..errors import ScheduleError
from ..spec import Move
from ..tensor import GL, SH
from .base import Strategy

REG_MIN, REG_MAX, REG_STEP = 24, 256, 8     # setmaxnreg's range and granularity


@attrs.frozen(repr=False)
class warp_specialize(Strategy):
    """``warp_specialize(producer_regs=40, consumer_regs=232)``: give the pipelined K loop above the
    focus a producer warpgroup (TMA copies) and consumer warpgroups (wgmma); the module docstring
    shows the tree before and after, and the loop prints as::

        for k0 in seq(4) pipelined(3 stages) warp-specialized(producer 40 regs, consumers 232):

    The focus is unchanged (the consumer warpgroups are those ``tile(m=64) >> to_warpgroups()``
    creates after it).  Every staged move must name a TMA atom.

    * ``producer_regs``: registers per producer thread after ``setmaxnreg.dec``, 24..256, a multiple
      of 8.
    * ``consumer_regs``: registers per consumer thread after ``setmaxnreg.inc``, at least
      ``producer_regs``.
    * ``pingpong``: the consumer warpgroups take turns to issue their wgmma groups (at least two
      of them; FlashAttention-3's warpgroup scheduling).  Each waits for its turn on a named
      barrier before ``wgmma.fence`` and passes the turn on (``bar.arrive``) after
      ``wgmma.commit_group``, so the tensor cores run one warpgroup's MMAs while the other works
      on what its last ones produced (attention's softmax)::

          warpgroup 1:  [S=QK]  softmax  [O+=PV]  ...      [ ]: issued in its turn
          warpgroup 2:       [S=QK]  softmax  [O+=PV] ...
          tensor cores: S1 S2 PV1 PV2 S1 ...

      The loop prints ``warp-specialized(producer 40 regs, consumers 232, ping-pong)``.
    """

    producer_regs: int = 40
    consumer_regs: int = 232
    pingpong: bool = False

    def apply(self, sched):
        path = sched.focus_path()
        spec = path[-1].spec
        for name in ("producer_regs", "consumer_regs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not REG_MIN <= v <= REG_MAX or v % REG_STEP:
                raise ScheduleError("setmaxnreg takes a register count per thread", strategy=self, spec=spec,
                                    field=name, value=v,
                                    allowed=f"{REG_MIN}..{REG_MAX}, a multiple of {REG_STEP}")
        if not isinstance(self.pingpong, bool):
            raise ScheduleError("pingpong turns the consumers' turns on or off", strategy=self, spec=spec,
                                field="pingpong", value=self.pingpong, allowed="True, False")
        if self.producer_regs > self.consumer_regs:
            raise ScheduleError("the producer gives registers to the consumers, not the other way round",
                                strategy=self, spec=spec, field="producer_regs", value=self.producer_regs,
                                allowed=f"<= consumer_regs ({self.consumer_regs})")
        for i in range(len(path) - 1, -1, -1):
            node = path[i]
            kl = [lp for lp in node.loops if lp.unit is None and lp.dim in node.spec.reduction_dims
                  and lp.stages > 1]
            if not kl:
                continue
            moves = [c for n in path[i:] for c in n.body[:-1]
                     if isinstance(c.spec, Move) and c.spec.src.memory == GL and c.spec.dst.memory == SH]
            no_tma = [c.spec.dst.name for c in moves if not c.via or getattr(c.via[0], "family", "") != "tma"]
            if no_tma:
                raise ScheduleError(f"a producer warp issues TMA copies; {', '.join(no_tma)} move(s) without one",
                                    strategy=self, spec=node.spec, field="via", value=no_tma,
                                    fix="move_to_smem(name, via=(sm90a.tma_load_2d,)) for every staged operand")
            mark = (self.producer_regs, self.consumer_regs) + ((1,) if self.pingpong else ())
            loops = tuple(attrs.evolve(lp, specialize=mark)
                          if lp is kl[-1] else lp for lp in node.loops)
            return sched.replace_path(path[:i + 1], attrs.evolve(node, loops=loops))
        raise ScheduleError("there is no pipelined K loop to specialize", strategy=self, spec=spec,
                            fix="pipeline(stages=...) first, then warp_specialize()")

    def __repr__(self):
        args = []
        if self.producer_regs != 40:
            args.append(f"producer_regs={self.producer_regs!r}")
        if self.consumer_regs != 232:
            args.append(f"consumer_regs={self.consumer_regs!r}")
        if self.pingpong:
            args.append("pingpong=True")
        return f"warp_specialize({', '.join(args)})"

    __str__ = __repr__
