"""Flags between blocks (FLAG): one block releases data in global memory, a later one acquires it.

The interpreter runs a launch's blocks one after another (``kernel``), so a block may only wait
for a flag that an earlier block has set: on the GPU, blocks start in that order, and a wait on a
later block could hang a grid larger than what runs at once.  ``Exchange`` keeps, for one launch,
what the checks need:

* each element of an exchange workspace (``GlobalBuffer.exchange``) remembers the block that wrote
  it and how many flags that block had released before (``writer``, ``wcount``); a thread of
  another block may read it only after acquiring a flag that block released later;
* a release (``flag_store`` of a non-zero value) must come after every exchange write of its
  block's threads in happens-before order (a barrier between them), or the data could arrive
  after the flag;
* a reset (``flag_store`` of 0, for the next launch) must come after every thread of its block
  that waited on the flag (else a late waiter would spin forever), and no flag of a workspace
  may be left set when the launch ends.

A counter (``flag_add``) is a flag that several blocks release by adding to it: each addition is
a release with the same rule as a ``flag_store``, and a wait for a count (``flag_wait_count``)
acquires every addition made before it when it waits for all of them (a wait for fewer could
return after any of them, so it acquires none); the count must already be reached by earlier
blocks.
"""

from __future__ import annotations

import numpy as np

from ... import ir
from ...errors import InternalError
from ..messages import describe, listing
from .operands import scalar


class Exchange:
    """The flags and exchange workspaces of one launch, across its blocks."""

    def __init__(self, kernel: ir.Kernel, order, T: int):
        self.order = order
        gx, gy, gz = (int(g) for g in kernel.grid)
        self.grid = (gx, gy, gz)
        self.blocks = gx * gy * gz
        self.bufs = {p.name: p for p in kernel.params if isinstance(p, ir.GlobalBuffer) and p.exchange}
        # flags in a workspace must be cleared by the launch that set them (the next one reuses it)
        self.workspaces = {p.name for p in kernel.params if isinstance(p, ir.GlobalBuffer) and p.role == "workspace"}
        self.writer = {n: np.full(b.size, -1, dtype=np.int64) for n, b in self.bufs.items()}
        self.wcount = {n: np.zeros(b.size, dtype=np.int64) for n, b in self.bufs.items()}
        self.releases = np.zeros(self.blocks, dtype=np.int64)
        self.source: dict = {}          # (buffer, offset) -> [(block, release count)] of its releases
        self.set: dict = {}             # (buffer, offset) -> block, flags set and not yet reset
        self.T = T
        self.block = 0

    def start_block(self, bid) -> None:
        """Block ``bid`` (x, y, z) starts: its threads have acquired nothing yet."""
        gx, gy, _ = self.grid
        self.block = int(bid[0]) + gx * (int(bid[1]) + gy * int(bid[2]))
        self.acq = np.zeros((self.T, self.blocks), dtype=np.int64)
        self.xw = np.full(self.T, -1, dtype=np.int64)     # own clock of a thread's last exchange write
        self.pollers: dict = {}

    # ----------------------------------------------------------------- exchange data

    def wrote(self, name: str, addr: np.ndarray, thr: np.ndarray) -> None:
        self.writer[name][addr] = self.block
        self.wcount[name][addr] = self.releases[self.block]
        t = np.unique(thr)
        self.xw[t] = self.order.own(t)

    def check_read(self, ctx, name: str, addr: np.ndarray, thr: np.ndarray) -> None:
        w = self.writer[name][addr]
        other = (w >= 0) & (w != self.block)
        if not other.any():
            return
        a, t, wb = addr[other], thr[other], w[other]
        bad = self.acq[t, wb] <= self.wcount[name][a]
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            ctx.hazard(f"block {self.block} reads {name}[{int(a[i])}], which block {int(wb[i])} wrote, without "
                       f"having acquired a flag that block released after writing it (threads "
                       f"{listing(np.unique(t[bad]))}): wait on the flag (flag_wait) before reading",
                       thread=int(t[i]), on=f"GL buffer {name!r}")

    # ----------------------------------------------------------------- the atoms

    def _release(self, ctx, key, t: int, add: bool) -> None:
        writers = np.flatnonzero(self.xw >= 0)
        if writers.size:
            ok = self.order.ordered(writers, self.xw[writers], np.full(writers.size, t))
            if not ok.all():
                late = writers[~ok]
                ctx.hazard(f"flag {key[0]}[{key[1]}] is released by thread {t} before the exchange writes of "
                           f"threads {listing(late)} are ordered before it: a barrier between the writes and "
                           f"the flag is missing", thread=t, on=f"GL buffer {key[0]!r}")
        self.releases[self.block] += 1
        mine = (self.block, int(self.releases[self.block]))
        self.source[key] = self.source.get(key, []) + [mine] if add else [mine]
        if key[0] in self.workspaces:
            self.set[key] = self.block

    def add(self, ctx, key, t: int) -> None:
        """Thread ``t`` adds to counter ``key`` (a release, like a flag_store)."""
        self._release(ctx, key, t, add=True)

    def store(self, ctx, key, t: int, value: int) -> None:
        if value:
            self._release(ctx, key, t, add=False)
            return
        polls = self.pollers.get(key, [])
        if polls:
            thr = np.array([p[0] for p in polls], dtype=np.int64)
            clk = np.array([p[1] for p in polls], dtype=np.int64)
            ok = self.order.ordered(thr, clk, np.full(thr.size, t))
            if not ok.all():
                ctx.hazard(f"flag {key[0]}[{key[1]}] is reset by thread {t} while threads "
                           f"{listing(np.unique(thr[~ok]))} that wait on it are not ordered before the reset: "
                           f"they could spin forever (a barrier after the waits is missing)",
                           thread=t, on=f"GL buffer {key[0]!r}")
        self.set.pop(key, None)
        self.source.pop(key, None)

    def wait(self, ctx, key, thr: np.ndarray, value: int, need: int = 1, count: bool = False) -> None:
        """Threads ``thr`` wait until flag ``key`` (now ``value``) is non-zero, or with ``count``
        at least ``need``."""
        if value < need:
            what = "set" if need == 1 else f"brought to {need} (it is {value})"
            ctx.hazard(f"block {self.block} waits on flag {key[0]}[{key[1]}], which no earlier block has {what}: "
                       f"on the GPU it would wait for a block that starts after it, or forever",
                       thread=int(thr[0]), on=f"GL buffer {key[0]!r}")
        # a wait for less than the count the additions so far reached may return after any of them
        # have landed: none of them in particular is acquired
        for wb, n in self.source.get(key, ()) if not count or need >= value else ():
            self.acq[thr, wb] = np.maximum(self.acq[thr, wb], n)
        self.pollers.setdefault(key, []).extend(zip(thr.tolist(), self.order.own(thr).tolist()))

    def check_end(self, ctx) -> None:
        """No flag of a workspace may stay set: the next launch would take it for one of its own."""
        if self.set:
            key, block = next(iter(self.set.items()))
            ctx.hazard(f"flag {key[0]}[{key[1]}] (set by block {block}) is still set when the launch ends: the next "
                       f"launch would read a stale partial result; the block that consumes it must reset it")


def flag(k, s):
    """FLAG: ``flag_store`` (release a value), ``flag_wait`` (acquire a non-zero value),
    ``flag_add`` (release by adding) and ``flag_wait_count`` (acquire a count)."""
    ctx, mem, xchg = k.ctx, k.mem, k.xchg
    on, _ = ctx.enabled(s)
    if on.size == 0:
        return
    ref = s.arg("flag")
    if not isinstance(ref, ir.MemRef) or not isinstance(ref.buffer, ir.GlobalBuffer):
        raise InternalError(f"{describe(s)}: a flag lives in global memory")
    mem.target(ref)
    off = ctx.per_thread(ref.offset)[on]
    mem.check_bounds(ref, off[:, None], on, "flag access")
    mem.check_align(s.atom, ref, off, on)
    data = mem.arrays[ref.buffer.name]
    if s.atom.name == "flag_store":
        values = scalar(k, s, "value")[on]
        for t, o, v in zip(on.tolist(), off.tolist(), values.tolist()):
            xchg.store(ctx, (ref.buffer.name, o), t, int(v))
            data[o] = v
        return
    if s.atom.name == "flag_add":
        values = scalar(k, s, "value")[on]
        for t, o, v in zip(on.tolist(), off.tolist(), values.tolist()):
            xchg.add(ctx, (ref.buffer.name, o), t)
            data[o] = int(data[o]) + int(v)
        return
    if s.atom.name == "flag_wait":
        need = np.ones(on.size, dtype=np.int64)
    elif s.atom.name == "flag_wait_count":
        need = scalar(k, s, "value")[on].astype(np.int64) & 0xFFFFFFFF
    else:
        raise InternalError(f"{describe(s)}: unknown flag atom {s.atom.name}")
    for o, n in sorted(set(zip(off.tolist(), need.tolist()))):
        thr = on[(off == o) & (need == n)]
        xchg.wait(ctx, (ref.buffer.name, o), thr, int(data[o]), n, count=s.atom.name == "flag_wait_count")
