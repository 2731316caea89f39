"""Walking and rewriting statements: flatten, visit every statement, substitute index variables,
expand an unrolled loop into its iterations, choose how guarded loads are written.

Passes over the kernel IR (the pipeline's fragment prefetch, the loop rule's expansion of a loop
of asynchronous issues) share these instead of each recursing over the node types.
"""

from __future__ import annotations

from typing import Callable

import attrs

from ..hardware.atoms.base import COPY
from .expr import IntExpr, Var, substitute
from .nodes import (
    GUARDS,
    AsyncCommit,
    AsyncWait,
    AtomCall,
    Barrier,
    Comment,
    DescRef,
    For,
    If,
    MemRef,
    Pointwise,
    RegFill,
    RegRef,
    Role,
    Roles,
    Scalar,
    Seq,
)


def flat(stmts) -> list:
    """``stmts`` with nested ``Seq`` spliced in (one level of statements, loops kept whole)."""
    out = []
    for st in stmts:
        if isinstance(st, Seq):
            out += flat(st.body)
        else:
            out.append(st)
    return out


def walk(stmts):
    """Every statement of ``stmts`` and of the bodies nested in them, outermost first."""
    for st in stmts:
        yield st
        if isinstance(st, Seq):
            yield from walk(st.body)
        elif isinstance(st, For):
            yield from walk([st.body])
        elif isinstance(st, If):
            yield from walk([st.then])
        elif isinstance(st, Roles):
            for r in st.roles:
                yield from walk([r.body])


def replace_leaves(st, fn: Callable):
    """``st`` with every statement that holds no others (an atom call, a barrier, ...) replaced by
    ``fn(statement)``; ``fn`` returns the statement itself, another one, or None to drop it.  Loops,
    conditionals, sequences and roles keep their shape (how a test plants a hazard: a dropped
    barrier, a weakened wait)."""
    if isinstance(st, Seq):
        return Seq(tuple(x for x in (replace_leaves(c, fn) for c in st.body) if x is not None))
    if isinstance(st, For):
        return attrs.evolve(st, body=replace_leaves(st.body, fn) or Seq(()))
    if isinstance(st, If):
        return attrs.evolve(st, then=replace_leaves(st.then, fn) or Seq(()))
    if isinstance(st, Roles):
        return attrs.evolve(st, roles=tuple(attrs.evolve(r, body=replace_leaves(r.body, fn) or Seq(()))
                                            for r in st.roles))
    return fn(st)


def guard_loads(stmts, guard: str) -> list:
    """``stmts`` with each guarded load from global memory into registers (a COPY ``AtomCall``
    whose ``pred`` is not 1) written the way ``guard`` says (``AtomCall.guard``: ``"branch"`` or
    ``"predicate"``); the semantics are the same, only the CUDA source differs."""
    if guard not in GUARDS:
        raise ValueError(f"guard_loads: guard={guard!r}; allowed: {', '.join(map(repr, GUARDS))}")

    def fn(st):
        if isinstance(st, AtomCall) and st.atom.family == COPY and st.atom.src_memory == "GL" \
                and st.atom.dst_memory == "RF" and not (isinstance(st.pred, int) and st.pred == 1):
            return attrs.evolve(st, guard=guard)
        return st

    return [replace_leaves(st, fn) for st in stmts]


def map_operand(r, expr: Callable[[IntExpr], IntExpr]):
    """Operand ``r`` (register, memory, descriptor or scalar) with its offset or value mapped
    through ``expr``; anything else unchanged."""
    if isinstance(r, RegRef):
        return RegRef(r.buffer, expr(r.offset))
    if isinstance(r, MemRef):
        return MemRef(r.buffer, expr(r.offset))
    if isinstance(r, DescRef):
        return DescRef(r.buffer, expr(r.offset), r.swizzle, r.lbo, r.sbo)
    if isinstance(r, Scalar):
        return Scalar(expr(r.value))
    return r


def map_stmt(st, expr: Callable[[IntExpr], IntExpr], ref: Callable | None = None):
    """``st`` with every index expression ``x`` replaced by ``expr(x)`` and every operand ``r``
    (register, memory, descriptor or scalar) by ``ref(r)`` (default: the same operand with its
    offset or value mapped through ``expr``).  A statement's ``origin`` keeps up: its tile
    coordinates are mapped through ``expr`` too."""

    def operand(r):
        return ref(r) if ref is not None else map_operand(r, expr)

    def origin(s):
        # the statement's origin names its tiles in the same variables: they move with it
        o = getattr(s, "origin", None)
        return None if o is None else o.map(expr)

    def go(s):
        if isinstance(s, Seq):
            return Seq(tuple(go(x) for x in s.body))
        if isinstance(s, For):
            return For(s.var, s.extent, go(s.body), s.unroll, None if s.stop is None else expr(s.stop))
        if isinstance(s, If):
            return If(expr(s.cond), go(s.then))
        if isinstance(s, Roles):
            return Roles(tuple(Role(r.name, r.first, r.count, go(r.body), r.groups) for r in s.roles))
        if isinstance(s, AtomCall):
            return AtomCall(s.atom, tuple((k, operand(v)) for k, v in s.args), expr(s.pred), s.comment,
                            origin=origin(s), src_bytes=None if s.src_bytes is None else expr(s.src_bytes),
                            guard=s.guard)
        if isinstance(s, Pointwise):
            return Pointwise(s.op, operand(s.dst), tuple(operand(x) for x in s.srcs), origin=origin(s))
        if isinstance(s, RegFill):
            return RegFill(operand(s.ref), s.count, s.value, origin=origin(s))
        if isinstance(s, Barrier):
            return Barrier(s.comment, expr(s.bar_id), s.threads, s.arrive, origin=origin(s))
        if isinstance(s, (AsyncCommit, AsyncWait)) and s.origin is not None:
            return attrs.evolve(s, origin=origin(s))
        return s

    return go(st)


def register_refs(st) -> list:
    """Every register operand (``RegRef``) of ``st`` and the statements nested in it, in program
    order, found through ``map_stmt``'s operand hook (what reads a register index: an atom call's
    arguments, a pointwise op's, a fill's)."""
    found = []

    def look(r):
        if isinstance(r, RegRef):
            found.append(r)
        return r
    map_stmt(st, lambda x: x, look)
    return found


def substitute_stmt(st, env: dict):
    """``st`` with the variables of ``env`` (by ``Var`` or name) replaced, expressions re-simplified."""
    return map_stmt(st, lambda x: substitute(x, env))


def expand(loop: For) -> Seq:
    """The iterations of ``loop`` one after another, its variable a constant in each::

        for k1 in 0..3: issue(desc(A + k1*32))   ->   issue(desc(A + 0)); issue(desc(A + 32)); ...

    The same program; each iteration's operands become constant offsets of one base."""
    v: Var = loop.var
    if loop.stop is not None:
        raise ValueError(f"expand: the loop over {v.name} stops early at run time; only fixed loops expand")
    return Seq(tuple(Seq((Comment(f"{v.name} = {i}"), substitute_stmt(loop.body, {v: i})))
                     for i in range(loop.extent)))


__all__ = ["flat", "walk", "map_operand", "map_stmt", "register_refs", "substitute_stmt", "expand"]
