"""The decomposition tree, its focus, printing and ``check()``.

A ``Schedule`` is an immutable tree of ``Node`` values.  Each node holds a spec and, once refined,
the strategy that refined it and the pieces it was split into:

* ``loops`` — the loops the strategy created (outer first), sequential or mapped onto parallel
  units of a level (blocks, warps, threads);
* ``pre`` / ``body`` / ``post`` — child nodes before the loops, inside them, after them.  The last
  child of ``body`` is the compute spec the chain goes on refining (the *focus* path); moves the
  strategies create come before it.  ``pre``/``post`` hold the accumulator's ``Init`` and store.

Strategies refine the *focus*: the deepest open compute node on the ``body[-1]`` chain.  Moves,
inits and stores are refined at ``check()`` time by their ``via`` strategies or, by default, by a
schedule derived from the layouts around them (a coalesced 16-byte copy, the ldmatrix that feeds
the consumer's fragments) — that is what makes the chain data-movement aware without making the
user spell out every copy.
"""

from __future__ import annotations

from typing import Callable

import attrs

from . import spec as _spec
from .errors import InternalError, ScheduleError
from .hardware.target import target as get_target
from .hardware.target import target_names
from .spec import Attention, Fused, MatMul, Move, Pointwise, Reduce
from .strategy import Strategy
from .tensor import Level


@attrs.frozen(repr=False)
class Loop:
    """``for var in range(count)``: each step advances the named dims by their steps.

    ``unit`` is None for a sequential loop, else the level whose units run the iterations in
    parallel (``Level.BLOCK`` → grid, ``Level.WARP`` → warps of the block, ``Level.THREAD`` →
    threads).  ``stages`` > 1 marks a K loop a ``pipeline`` turned into a software pipeline.
    ``group`` > 1 on block-mapped M/N loops orders blocks in groups of ``group`` M tiles, so
    blocks that run together share A and B tiles in L2.
    """

    var: str
    count: int
    steps: tuple[tuple[str, int], ...]
    unit: Level | None = None
    stages: int = 1
    group: int = 1
    prefetch: bool = False     # pipeline(prefetch=True): register fragments one K step ahead
    overlap: bool = False      # pipeline(overlap=True): a step's first MMA issues with the last one's second
    # pipeline(separate=True): each staged operand on full/empty mbarriers of its own
    separate: bool = False
    persistent: bool = False   # to_blocks(persistent=True): one block per SM walks the tiles
    # warp_specialize(): (producer_regs, consumer_regs), and a third item 1 with pingpong=True
    specialize: tuple[int, ...] = ()
    cluster: int = 1           # to_blocks(cluster=C): C consecutive M tiles form a thread-block cluster
    occupancy: int = 1         # to_blocks(occupancy=N): N blocks must fit on one SM at once
    reverse: bool = False      # to_blocks(reverse=True): blocks take the tiles last to first
    # to_blocks(cluster=C, exchange="push"): the cluster's blocks push a split reduction's parts
    # into each other's shared memory (st.async + mbarrier) instead of meeting at barrier.cluster
    exchange: str = "barrier"
    # stream_k(parts): the loop's K chunks and the block tiles form one iteration space that a
    # persistent grid splits into equal contiguous ranges (partial tiles fixed up in the kernel)
    stream: bool = False
    # split_k(parts, across=BLOCK, combine="fixup"): the loop's K parts run on blocks of one launch,
    # and the block of the last part adds the others' partial sums (no second launch)
    fixup: bool = False
    # (row, offset): a loop over columns that stops at the diagonal of a causal mask: the steps
    # whose every column lies past the tile's last row + offset are masked out entirely, so the
    # loop ends before them (online_softmax on a causal Attention)
    diagonal: tuple[str, int] | tuple[()] = ()
    # align(c=vec): a loop of one step over the row's window, which starts at the vector of vec
    # elements that holds the row's first element (its origin moves back by the row's phase)
    align: int = 0
    # tile(..., unroll=False): a sequential loop inside a warp or warpgroup that runs at run time
    # instead of being unrolled (its variable may index no registers)
    rolled: bool = False

    @property
    def dim(self) -> str:
        return self.steps[0][0]

    def step(self, dim: str) -> int:
        for d, s in self.steps:
            if d == dim:
                return s
        return 0

    def __repr__(self):
        extra = "".join(f", {k}={v!r}" for k, v, d in (("prefetch", self.prefetch, False),
                                                       ("overlap", self.overlap, False),
                                                       ("separate", self.separate, False),
                                                       ("persistent", self.persistent, False),
                                                       ("specialize", self.specialize, ()),
                                                       ("cluster", self.cluster, 1),
                                                       ("occupancy", self.occupancy, 1),
                                                       ("reverse", self.reverse, False),
                                                       ("exchange", self.exchange, "barrier"),
                                                       ("stream", self.stream, False),
                                                       ("fixup", self.fixup, False),
                                                       ("diagonal", self.diagonal, ()),
                                                       ("align", self.align, 0),
                                                       ("rolled", self.rolled, False)) if v != d)
        return (f"Loop({self.var!r}, {self.count}, {self.steps!r}, {self.unit!r}, {self.stages}, "
                f"{self.group}{extra})")

    def __str__(self):
        kind = "seq" if self.unit is None else str(self.unit)
        pipe = (f" pipelined({self.stages} stages" + (", overlapped" if self.overlap else "")
                + (", separate rings" if self.separate else "") + ")"
                if self.stages > 1 else "")
        spec = (f" warp-specialized(producer {self.specialize[0]} regs, consumers {self.specialize[1]}"
                + (", ping-pong" if self.specialize[2:] == (1,) else "") + ")" if self.specialize else "")
        grp = f" grouped({self.group})" if self.group > 1 else ""
        per = " persistent" if self.persistent else ""
        clu = f" clusters({self.cluster}{', push' if self.exchange == 'push' else ''})" if self.cluster > 1 else ""
        occ = f" occupancy({self.occupancy})" if self.occupancy > 1 else ""
        occ += " reversed" if self.reverse else ""
        occ += " stream-K" if self.stream else ""
        occ += " fixup" if self.fixup else ""
        diag = (f" until the diagonal of {self.diagonal[0]}" + (f"{self.diagonal[1]:+d}" if self.diagonal[1] else "")
                if self.diagonal else "")
        occ += f" aligned({self.align})" if self.align else ""
        occ += " rolled" if self.rolled else ""
        return f"{self.var} in {kind}({self.count}){pipe}{spec}{grp}{per}{clu}{occ}{diag}"


@attrs.frozen(repr=False)
class Node:
    spec: object
    strategy: object = None
    loops: tuple[Loop, ...] = ()
    pre: tuple["Node", ...] = ()
    body: tuple["Node", ...] = ()
    post: tuple["Node", ...] = ()
    via: tuple = ()          # Move nodes: strategies the user gave for this copy
    atom: object = None      # set by done(atom)

    @property
    def is_open(self) -> bool:
        return self.strategy is None and self.atom is None

    @property
    def children(self) -> tuple["Node", ...]:
        return self.pre + self.body + self.post

    def walk(self):
        """This node and every node below it, pre-order."""
        yield self
        for c in self.children:
            yield from c.walk()

    def __repr__(self):
        return f"Node({self.spec!r}, strategy={self.strategy!r}, loops={self.loops!r})"


def _refines(parent: Node, child: Node) -> bool:
    """Whether ``child`` is ``parent``'s spec on a smaller tile or another level (the chain of
    refinement the focus follows), rather than a move or an init a strategy added beside it."""
    return type(child.spec) is type(parent.spec) or type(child.spec).__name__ in getattr(parent.spec, "REFINED_BY", ())


@attrs.frozen(repr=False, eq=False)
class Schedule:
    """A spec and the strategies refining it, as a tree.  Immutable; ``apply`` returns a new one."""

    root: Node
    strategies: tuple = ()

    @classmethod
    def of(cls, spec) -> "Schedule":
        """The unrefined schedule of a kernel-level ``spec`` (its root is the focus)."""
        if not isinstance(spec, (MatMul, Move, Pointwise, Reduce, Fused, Attention)):
            raise ScheduleError("not a spec", field="spec", value=spec,
                                allowed="MatMul, Move, Pointwise, Reduce, Fused, Attention (e.g. firesched.MatMul.kernel(...))")
        if spec.level != Level.KERNEL:
            raise ScheduleError("a schedule starts from a kernel-level spec", spec=spec, field="level",
                                value=str(spec.level), allowed="kernel",
                                fix="build it with the spec's .kernel(...) constructor")
        return cls(Node(spec))

    @property
    def spec(self):
        return self.root.spec

    # ------------------------------------------------------------------ focus navigation

    def focus_path(self) -> tuple[Node, ...]:
        """Nodes from the root along ``body[-1]`` to the focus (the last one)."""
        path = [self.root]
        while True:
            n = path[-1]
            if n.is_open or not n.body or not _refines(n, n.body[-1]):
                return tuple(path)
            path.append(n.body[-1])

    @property
    def focus(self) -> Node:
        return self.focus_path()[-1]

    def open_focus(self, strategy) -> Node:
        f = self.focus
        if not f.is_open:
            raise ScheduleError(
                "nothing left to refine: the focus is already atomic", strategy=strategy, spec=f.spec,
                fix="put compute strategies before done(...); epilogue/prologue/pipeline may follow it")
        return f

    def replace_path(self, path: tuple[Node, ...], new_last: Node) -> "Schedule":
        """Rebuild the chain ``path`` (root..node) with its last node replaced."""
        node = new_last
        for parent in reversed(path[:-1]):
            node = attrs.evolve(parent, body=parent.body[:-1] + (node,))
        return attrs.evolve(self, root=node)

    def replace_focus(self, new: Node) -> "Schedule":
        return self.replace_path(self.focus_path(), new)

    def map_nodes(self, fn: Callable[[Node], Node]) -> "Schedule":
        """Apply ``fn`` bottom-up to every node."""

        def go(n: Node) -> Node:
            n = attrs.evolve(n, pre=tuple(go(c) for c in n.pre), body=tuple(go(c) for c in n.body),
                             post=tuple(go(c) for c in n.post))
            return fn(n)

        return attrs.evolve(self, root=go(self.root))

    def nodes(self):
        """Every node, pre-order."""

        return self.root.walk()

    # ------------------------------------------------------------------ refinement

    def apply(self, *strategies) -> "Schedule":
        s = self
        for st in strategies:
            if not isinstance(st, Strategy):
                raise ScheduleError(f"{st!r} is not a strategy", field="strategy", value=st,
                                    allowed="tile, to_blocks, to_warps, to_threads, split_k, move_to_smem, "
                                            "move_to_regs, pipeline, epilogue, prologue, done, or a chain a >> b")
            s = st.apply(s)
            s = attrs.evolve(s, strategies=s.strategies + (st,))
        return s

    def with_strategy_record(self, st) -> "Schedule":
        return attrs.evolve(self, strategies=self.strategies + (st,))

    # ------------------------------------------------------------------ check / lowering

    def check(self, target=None) -> "Schedule":
        """Raise ``ScheduleError`` unless every leaf is atomic, resources fit ``target`` and the
        register fragments of producers and consumers agree.  Returns self.

        ``target`` is a target name or ``Target``; None is the default target, the one
        ``firesched.compile`` also takes (``hardware.target.default_target``: the GPU present,
        else sm_90a)."""
        _lowering("check")(self, _target(target))
        return self

    def lower(self, target=None, *, programmatic: bool | None = None):
        """The kernel IR ``Program`` of this schedule for ``target`` (None: the default target).

        ``programmatic``: whether the program's first kernel is launched programmatically, so
        that it overlaps the tail of the launch before it on the stream (it waits with
        ``griddepcontrol.wait`` before touching global memory), and its last kernel lets the next
        launch start; None: wherever the target can (sm_90a), unless the grid is sized to the SMs
        (persistent, stream-K), the last kernel letting the next start only in a program of one
        kernel (``firesched.compile``).  A program's later kernels are launched so there in any
        case."""
        return _lowering("lower")(self, _target(target), programmatic=programmatic)

    # ------------------------------------------------------------------ printing

    def __str__(self) -> str:
        focus = self.focus
        lines: list[str] = []

        def go(n: Node, ind: int):
            pad = "  " * ind
            mark = "   <- focus" if n is focus and n.is_open else ""
            lines.append(f"{pad}{n.spec}{mark}")
            inner = ind + 1
            if n.strategy is not None:
                lines.append(f"{'  ' * inner}{n.strategy}")
            if n.atom is not None:
                lines.append(f"{'  ' * inner}done({n.atom!r})")
            if n.via:
                lines.append(f"{'  ' * inner}via " + " >> ".join(map(str, n.via)))
            for c in n.pre:
                go(c, inner)
            if n.loops:
                lines.append(f"{'  ' * inner}for " + ", ".join(map(str, n.loops)) + ":")
                for c in n.body:
                    go(c, inner + 1)
            else:
                for c in n.body:
                    go(c, inner)
            for c in n.post:
                go(c, inner)

        go(self.root, 0)
        return "\n".join(lines)

    def __repr__(self):
        return f"Schedule.of({self.root.spec!r}).apply(*{self.strategies!r})"

    # Two schedules are equal when they build the same tree, however the strategies were grouped
    # (apply(a >> b) == apply(a, b)).
    def __hash__(self):
        return hash(self.root)

    def __eq__(self, other):
        return isinstance(other, Schedule) and self.root == other.root


# Checking a schedule is lowering it.  The lowering reads this module's trees, so it sits above it
# and registers itself here when ``firesched.lower`` is imported (``firesched`` always imports it):
# the schedule never imports upward.
_LOWER = None


def bind_lowering(lower) -> None:
    """Called by ``firesched.lower``: ``lower(schedule, target, programmatic=None) -> ir.Program``."""
    global _LOWER
    _LOWER = lower


def _lowering(what: str):
    if _LOWER is None:  # pragma: no cover - firesched/__init__ imports the lowering
        raise InternalError(f"Schedule.{what}() needs firesched.lower, which is not imported")
    return _LOWER


def _target(target):
    """``target`` as a ``Target``: None is the default target; an unknown name is a ScheduleError."""
    try:
        return get_target(target)
    except ValueError as e:
        raise ScheduleError(str(e), field="target", value=target, allowed=target_names(),
                            fix="check('sm_80') or another target listed, or check() for the GPU present") from None


def find_store(sched: Schedule, c_name: str) -> tuple[tuple[Node, ...], int] | None:
    """(path to the node whose ``post`` stores the accumulator into ``c_name`` — in global or
    shared memory —, index)."""

    def go(path):
        n = path[-1]
        for i, p in enumerate(n.post):
            if isinstance(p.spec, (Move, Reduce)) and p.spec.dst.name == c_name and \
                    str(p.spec.dst.memory) != "RF":
                return path, i
        for c in n.body:
            r = go(path + (c,))
            if r:
                return r
        return None

    return go((sched.root,))


__all__ = ["Schedule", "Node", "Loop", "find_store", "bind_lowering"]

_spec.bind_scheduler(Schedule.of)
