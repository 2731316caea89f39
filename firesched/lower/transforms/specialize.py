"""Warp specialization: a producer warpgroup and consumer warpgroups run different parts of the
same block tile (``warp_specialize``).

The block's work is lowered twice, by the same rules, with a different part of the pipelined loop
kept each time: the producer part (the ring's copies, issued by its first thread) and the
consumer part (everything else).  The loops around the pipelined loop — a persistent block's
tile loop included — appear in both::

    init the ring's mbarriers; barrier (a cluster barrier in a cluster)
    producer (warpgroup 0, setmaxnreg.dec):     consumers (warpgroups 1.., setmaxnreg.inc):
      thread 0: for tile: for kt:                  for tile: acc = 0; for kt: wait full; mma;
                  wait empty; expect; TMA                        release; epilogue

``setmaxnreg`` moves registers from the producer to the consumers, whose accumulators need them;
its budget assumes one block per SM, so the block claims more than half of the SM's shared
memory (a second resident block could leave a consumer waiting for registers forever).

With ``pingpong`` the consumer warpgroups take turns to issue their wgmma groups
(``rules.turns``); the interpreter then runs each consumer warpgroup as a group of its own
(``ir.Role.groups``), since they no longer keep in step.
"""

from __future__ import annotations

from ... import ir
from ...dtypes import u8
from ...hardware.atoms import catalog, sm90a
from ...schedule import Node
from ...spec import MatMul
from ...tensor import RF, WARPGROUP
from ..context import err


def launch_regs(target, threads: int, blocks: int = 1) -> int:
    """The registers a thread of a ``threads``-thread block is compiled to (and launched with)
    when the kernel uses ``setmaxnreg``: ptxas takes the whole file over the threads of the
    ``blocks`` blocks an SM holds at once (``to_blocks(occupancy=...)``), in units of 8 (a warp's
    allocation granularity), at most 255."""
    return target.thread_regs(threads, blocks, granule=8)


def consumer_regs_for(target, consumer_warpgroups: int, producer_regs: int, cap: int = 240, blocks: int = 1) -> int:
    """The most registers the consumers may ``setmaxnreg.inc`` to: what the launch gave all the
    block's threads (``blocks`` blocks an SM), less what the producer keeps, over the consumer
    threads (in units of 8)::

        640 threads (4 consumer warpgroups): launched with 96 each = 61,440
        producer keeps 128 x 40                                     =  5,120
        consumers: (61,440 - 5,120) / 512 = 110  ->  104

    Asking for more than that pool holds blocks ``setmaxnreg.inc`` for ever: the hang that four
    consumer warpgroups with 112 registers each showed on an H100."""
    threads = 128 * (consumer_warpgroups + 1)
    pool = threads * launch_regs(target, threads, blocks)
    return max(24, min(cap, (pool - 128 * producer_regs) // (128 * consumer_warpgroups) // 8 * 8))


def specialized_loop(block: Node):
    """The pipelined loop ``warp_specialize`` marked below ``block`` (and its node), or None."""
    def go(n: Node):
        for lp in n.loops:
            if lp.specialize:
                return n, lp
        for c in n.children:
            r = go(c)
            if r is not None:
                return r
        return None

    return go(block)


#: Registers a consumer thread needs besides its wgmma accumulators (descriptors, addresses,
#: loop state): ptxas asked for "a register target of 154" for 128 accumulators (64x256 f32
#: per warpgroup) on sm_90a.
WGMMA_OVERHEAD_REGS = 26


def accumulator_regs(node: Node) -> int:
    """The f32 accumulator registers of one consumer thread below ``node``: the largest C tile a
    warpgroup-level MatMul holds, over the 128 threads of the warpgroup (0 when none)."""
    most = 0
    for m in node.walk():
        sp = m.spec
        if isinstance(sp, MatMul) and sp.level == WARPGROUP and sp.c.memory == RF:
            n = 1
            for e in sp.c.shape:
                n *= e
            most = max(most, n // 128)
    return most


def check_budget(node: Node, target, consumer_warpgroups: int, producer_regs: int, consumer_regs: int,
                 blocks: int = 1) -> None:
    """Refuse a warp-specialized block whose registers cannot work out: a ``setmaxnreg`` split
    over the registers the launch gives the block (``consumer_regs_for``: asking for more blocks
    ``setmaxnreg.inc`` for ever), or accumulators that do not fit the registers ptxas may give a
    thread of the launch (the whole file over its threads, at most 255 — ``setmaxnreg`` moves
    registers between warpgroups at run time, but the code is compiled to that limit); ``blocks``:
    the blocks an SM holds at once, each launched with its share of the file."""
    threads = 128 * (consumer_warpgroups + 1)
    limit = launch_regs(target, threads, blocks)
    most = consumer_regs_for(target, consumer_warpgroups, producer_regs, cap=255, blocks=blocks)
    if consumer_regs > most:
        raise err(node, f"setmaxnreg budget: {threads} threads are launched with {limit} registers each "
                        f"({threads * limit} in all{f', {blocks} blocks an SM' if blocks > 1 else ''}); the producer keeps 128 x {producer_regs}, which leaves "
                        f"{consumer_warpgroups} x 128 consumer threads at most {most} each, not {consumer_regs} "
                        "(setmaxnreg.inc would wait for registers that never come)", field="consumer_regs",
                  value=consumer_regs, allowed=f"<= {most}",
                  fix=f"consumer_regs={most}, or leave it to the recipe")
    acc = accumulator_regs(node)
    if acc and acc + WGMMA_OVERHEAD_REGS > limit:
        most_n = (limit - WGMMA_OVERHEAD_REGS) * 2 // 64 * 64      # whole 64-element TMA boxes
        raise err(node, f"each consumer thread holds {acc} f32 accumulators (a 64 x {2 * acc} tile per warpgroup), "
                        f"and with {WGMMA_OVERHEAD_REGS} more for the rest ptxas needs {acc + WGMMA_OVERHEAD_REGS} "
                        f"registers; {threads} threads per block leave it {limit}", field="block_n", value=2 * acc,
                  allowed=f"<= {most_n} with {consumer_warpgroups} consumer warpgroups",
                  fix=f"block_n <= {most_n}, or fewer consumer warpgroups (a smaller block_m)")


def roles(producer_regs: int, consumer_regs: int, producer: list, consumers: list, consumer_threads: int,
          groups: int = 1) -> ir.Roles:
    """The two roles, with their register budgets (``groups``: consumer warpgroups that do not
    keep in step, taking turns)."""
    return ir.Roles((
        ir.Role("producer", 0, 128, ir.Seq((
            _call(catalog.with_immediates(sm90a.setmaxnreg_dec, n=producer_regs),
                  comment="the producer needs few registers"), *producer))),
        ir.Role("consumers", 128, consumer_threads, ir.Seq((
            _call(catalog.with_immediates(sm90a.setmaxnreg_inc, n=consumer_regs),
                  comment="the accumulators need registers"), *consumers)), groups),
    ))


def one_block_per_sm(kb) -> None:
    """Claim more than the SM's shared memory over ``kb.min_blocks_per_sm + 1`` blocks:
    setmaxnreg's budget assumes at most that many blocks on the SM (one, unless
    ``to_blocks(occupancy=N)`` asked for N), and a further block would find the registers taken."""
    blocks = max(1, kb.min_blocks_per_sm)
    have = ir.shared_bytes(kb.shared.values())
    need = kb.target.smem_per_sm // (blocks + 1) + 1024
    if have < need:
        past = "a second block" if blocks == 1 else f"a block past the {blocks} asked for"
        kb.add_shared(ir.SharedBuffer("one_block_per_sm", u8, need - have, 16,
                                      f"unused: keeps {past} off the SM (setmaxnreg budget)"))


def _call(atom, comment="", pred=1, **args):
    return ir.AtomCall(atom, tuple(args.items()), pred, comment)
