"""The rule registry and the dispatcher that walks one block's part of the tree.

A rule is a function ``rule(lw, node, ctx) -> [statements]`` registered for one kind of node:

* a node declared atomic by ``done(atom)``: the rule of the atom's *family* (``mma``, ``wgmma``);
* a node a strategy refined (it has loops or children): the one decomposition rule, which lowers
  its ``pre`` children, its loops (each loop by the loop rules: sequential, mapped onto units,
  pipelined) around its ``body`` children, and its ``post`` children;
* an open node a strategy created beside the focus (a ``Move``, an ``Init``, a ``Reduce`` that
  combines partial results): the rule of its spec kind and memories (``Move GL->SH``, ...), each
  of which picks its atom from the layouts around it.

No rule knows which recipe built the tree; a rule asks the ``Lowerer`` for resources (shared
buffers, registers, the layouts of its operands) and for the lowering of its children.
"""

from __future__ import annotations

from typing import Callable

import attrs

from .. import ir
from ..errors import InternalError
from ..ir.rewrite import guard_loads
from ..schedule import Node
from ..tensor import GL, SH
from .context import CONSUMER, PRODUCER, Ctx, err

Rule = Callable[["Lowerer", Node, Ctx], list]

_ATOM_RULES: dict[str, Rule] = {}
_LEAF_RULES: dict[type, Rule] = {}
_FRAGMENT_RULES: dict[type, Rule] = {}
_SPEC_RULES: dict[tuple, Rule] = {}
_DECOMPOSITION: list[Rule] = []
_LOOP_RULES: list[tuple[Callable, Callable]] = []     # (matches(lw, node, loop), lower(lw, node, ctx, loop, rest))
_LOOPS: list[Callable] = []                           # loops(lw, node, ctx, loops) of the decomposition rule


def atom_rule(*families: str):
    """Register the rule lowering a ``done(atom)`` node whose atom is of one of ``families``."""

    def deco(fn: Rule) -> Rule:
        for f in families:
            _ATOM_RULES[f] = fn
        return fn

    return deco


def leaf_rule(kind: type):
    """Register the rule lowering a thread's element-wise leaf of ``kind`` (``done()`` without an
    atom)."""

    def deco(fn: Rule) -> Rule:
        _LEAF_RULES[kind] = fn
        return fn

    return deco


def is_leaf(node: Node) -> bool:
    """A node ``done()`` declared a thread's element-wise work (no atom, no decomposition)."""
    return (node.atom is None and node.strategy is not None and not node.loops and not node.pre
            and not node.body and not node.post)


def fragment_rule(kind: type):
    """Register the rule lowering an ``on_fragments()`` leaf of ``kind``: element-wise work on the
    register fragments threads hold."""

    def deco(fn: Rule) -> Rule:
        _FRAGMENT_RULES[kind] = fn
        return fn

    return deco


def spec_rule(kind: type, *memories: str, via: str | None = None):
    """Register the rule lowering an open ``kind`` node whose operands live in ``memories``
    (``spec_rule(Move, "GL", "SH")``; no memories: any), or only those whose ``via=`` atom is of
    family ``via`` (``spec_rule(Move, "GL", "SH", via="tma")``)."""

    def deco(fn: Rule) -> Rule:
        _SPEC_RULES[(kind, tuple(memories), via)] = fn
        return fn

    return deco


def decomposition_rule(fn: Rule) -> Rule:
    """Register the rule of refined nodes (there is one)."""
    _DECOMPOSITION[:] = [fn]
    return fn


def loops_rule(fn):
    """Register ``loops(lw, node, ctx, loops)``: the lowering of a node's loops around its body."""
    _LOOPS[:] = [fn]
    return fn


def loop_rule(matches: Callable):
    """Register the rule of the sequential loops for which ``matches(lw, node, loop)`` holds
    (a pipelined reduction loop); it is called as ``rule(lw, node, ctx, loop, rest)``."""

    def deco(fn):
        _LOOP_RULES.append((matches, fn))
        return fn

    return deco


def special_loop(lw, node, lp):
    """The registered rule for sequential loop ``lp`` of ``node``, or None for a plain loop."""
    for matches, fn in _LOOP_RULES:
        if matches(lw, node, lp):
            return fn
    return None


def is_refined(node: Node) -> bool:
    """A node a strategy decomposed (loops or children), as opposed to a leaf or an open node."""
    return bool(node.loops or node.pre or node.body or node.post)


def is_staged_move(node: Node, ctx: Ctx) -> bool:
    """A global -> shared copy that the enclosing pipeline ring issues."""
    sp = node.spec
    return (type(sp).__name__ == "Move" and sp.src.memory == GL and sp.dst.memory == SH
            and sp.dst.name in ctx.staged)


def wants(node: Node, ctx: Ctx) -> bool:
    """Whether ``node`` belongs to the part of a pipelined loop being emitted (``ctx.part``):
    the producer issues the ring's copies, the consumers do everything else; the loops and
    decompositions around them belong to both."""
    if ctx.part is None:
        return True
    if is_staged_move(node, ctx):
        return ctx.part == PRODUCER and (ctx.issuing is None or node.spec.dst.name in ctx.issuing)
    if node.atom is None and is_refined(node):
        return True
    return ctx.part == CONSUMER


# the leaf statements that carry an ir.Origin
_STAMPED = (ir.AtomCall, ir.Barrier, ir.AsyncCommit, ir.AsyncWait, ir.RegFill, ir.Pointwise)


def origin_of(path: tuple, node: Node, ctx: Ctx) -> ir.Origin:
    """The ``ir.Origin`` of statements ``node``'s rule emits in ``ctx``: the node path, the loops
    mapped onto units around it (the block's, then those below the block) and where its operands'
    tiles start."""
    coords = [(v, "block", x) for v, x in ctx.vars.items() if v not in ctx.spans]
    coords += [(lp.var, str(lp.unit), ctx.vars[lp.var]) for lp, _ in ctx.units if lp.var in ctx.vars]
    tiles = []
    for t in node.spec.operands:
        o = ctx.origin.get((t.name, t.memory.name))
        if o is not None:
            tiles.append((f"{t.name}:{t.memory.name}",
                          tuple((d, o.get(d, 0), t.extent(d)) for d in t.tensor.dims)))
    return ir.Origin(path, tuple(coords), tuple(tiles))


@attrs.define(eq=False)
class Lowerer:
    """Lowers the nodes of one launch: holds the program and kernel builders and the layouts
    inferred for the launch's tensors, and dispatches nodes to rules."""

    pb: object                              # ProgramBuilder
    kb: object                              # KernelBuilder
    target: object
    rf: dict = attrs.field(factory=dict)    # register layouts by (name, mem)
    smem: dict = attrs.field(factory=dict)  # shared layouts by name
    notes: dict = attrs.field(factory=dict)  # facts rules share about this launch (tensor maps, ...)
    path: list = attrs.field(factory=list)  # the nodes being lowered, outermost first (for ir.Origin)
    _stamped: dict = attrs.field(factory=dict)  # id -> statement subtrees whose leaves all have an origin

    def lower(self, node: Node, ctx: Ctx) -> list:
        """The statements of ``node`` in ``ctx``, each leaf statement stamped with its ``ir.Origin``
        (the innermost node whose rule returned it: a child's statements keep the child's)."""
        self.path.append(node)
        try:
            stmts = self._lower(node, ctx)
        finally:
            self.path.pop()
        return self._stamp(stmts, origin_of(tuple(self.path) + (node,), node, ctx))

    def _stamp(self, stmts, origin: ir.Origin) -> list:
        """``stmts`` with ``origin`` on every leaf statement that has none yet.  Subtrees stamped
        before (a child's, already complete) are remembered by identity and not walked again."""
        done = self._stamped

        def go(s):
            if id(s) in done:
                return s
            if isinstance(s, ir.Seq):
                body = tuple(go(c) for c in s.body)
                out = s if all(a is b for a, b in zip(body, s.body)) else ir.Seq(body)
            elif isinstance(s, ir.For):
                b = go(s.body)
                out = s if b is s.body else attrs.evolve(s, body=b)
            elif isinstance(s, ir.If):
                b = go(s.then)
                out = s if b is s.then else attrs.evolve(s, then=b)
            elif isinstance(s, ir.Roles):
                roles = tuple(attrs.evolve(r, body=go(r.body)) for r in s.roles)
                out = s if all(a.body is b.body for a, b in zip(roles, s.roles)) else ir.Roles(roles)
            elif isinstance(s, _STAMPED) and s.origin is None:
                out = attrs.evolve(s, origin=origin)
            else:
                out = s
            done[id(out)] = out           # holding it keeps its id from being reused
            return out

        return [go(s) for s in stmts]

    def _lower(self, node: Node, ctx: Ctx) -> list:
        if node.atom is not None and type(node.spec).__name__ == "Move":
            # a move given its atom (move_to_regs(..., atom=)) is lowered by its move rule, which
            # checks and uses that atom
            return self.default(node, ctx)
        if node.atom is not None:
            rule = _ATOM_RULES.get(node.atom.family)
            if rule is None:
                raise err(node, f"no rule lowers {node.atom.family} atoms as a compute leaf", field="atom",
                          value=node.atom, allowed=", ".join(sorted(_ATOM_RULES)))
            return rule(self, node, ctx)
        if is_refined(node):
            return _DECOMPOSITION[0](self, node, ctx)
        if is_leaf(node) and getattr(node.strategy, "fragments", False):
            return _FRAGMENT_RULES[type(node.spec)](self, node, ctx)
        if is_leaf(node):
            rule = _LEAF_RULES.get(type(node.spec))
            if rule is None:  # pragma: no cover - done() accepts only kinds with a leaf rule
                raise err(node, f"no rule lowers a thread's {type(node.spec).__name__}")
            # done(guard=...): how the leaf's guarded loads are written (the rules write branches)
            guard = getattr(node.strategy, "guard", "branch")
            stmts = rule(self, node, ctx)
            return stmts if guard == "branch" else guard_loads(stmts, guard)
        return self.default(node, ctx)

    def default(self, node: Node, ctx: Ctx) -> list:
        sp = node.spec
        # a tuple reduction's rule is chosen by its input and first output (it stores every output)
        mems = tuple(t.memory.name for t in ((sp.src, sp.dst) if getattr(sp, "more", ()) else sp.operands))
        via = node.via[0].family if node.via else None
        keys = ([(type(sp), mems, via)] if via else []) + [(type(sp), mems, None), (type(sp), (), None)]
        for k in keys:
            rule = _SPEC_RULES.get(k)
            if rule is not None:
                return rule(self, node, ctx)
        known = sorted(f"{kk.__name__}({' -> '.join(m) or 'any'}{', via ' + v if v else ''})"
                       for kk, m, v in _SPEC_RULES if kk is type(sp))
        raise err(node, f"no rule lowers a {type(sp).__name__} between {' and '.join(mems)}",
                  allowed=", ".join(known) or "none yet",
                  fix="refine it with strategies down to atoms (done(...))")

    def loops(self, node: Node, ctx: Ctx, loops) -> list:
        """The statements of ``node``'s loops ``loops`` (outer first) around its body."""
        return _LOOPS[0](self, node, ctx, list(loops))

    def reg_layout(self, tile, node=None):
        lay = self.rf.get(tile.tensor)
        if lay is None:
            raise err(node or tile, f"register tensor {tile.name} is never read or written by an atom",
                      fix="refine its consumer down to an MMA atom (done(...))")
        return lay

    def smem_layout(self, tile):
        lay = self.smem.get(tile.name)
        if lay is None:  # pragma: no cover - every shared tensor gets a layout at kernel entry
            raise InternalError(f"no shared layout for {tile.name}")
        return lay
