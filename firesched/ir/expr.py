"""Integer index expressions: symbolic, simplified, printable as C and evaluable over numpy.

Layouts and TV layouts are evaluated on these objects (they overload ``+ * // % & >> ^``), so a
tile's address falls out of the same algebra the schedule checks.  Every variable carries its
range; the simplifier uses the ranges to drop ``% c`` and ``// c`` that cannot matter, which is
what keeps the printed CUDA readable (``lane / 4`` instead of ``(tid % 32) / 4 % 8``).

Constants are plain Python ints; an expression is an int or an ``Expr``.
"""

from __future__ import annotations

import functools
import operator
from typing import Union

import attrs

IntExpr = Union[int, "Expr"]


def _lift(x) -> "IntExpr":
    if isinstance(x, (Expr, int)) and not isinstance(x, bool):
        return x
    if hasattr(x, "__index__"):
        return int(x)
    raise TypeError(f"not an index expression: {x!r}")


class Expr:
    """Base of symbolic integer expressions (not instantiated directly)."""

    __slots__ = ()

    def __add__(self, o):
        return add(self, o)

    def __radd__(self, o):
        return add(o, self)

    def __sub__(self, o):
        return add(self, mul(-1, o))

    def __rsub__(self, o):
        return add(o, mul(-1, self))

    def __mul__(self, o):
        return mul(self, o)

    def __rmul__(self, o):
        return mul(o, self)

    def __floordiv__(self, o):
        return floordiv(self, o)

    def __rfloordiv__(self, o):
        return floordiv(o, self)

    def __mod__(self, o):
        return mod(self, o)

    def __rmod__(self, o):
        return mod(o, self)

    def __and__(self, o):
        return binop("&", self, o)

    def __rand__(self, o):
        return binop("&", o, self)

    def __xor__(self, o):
        return binop("^", self, o)

    def __rxor__(self, o):
        return binop("^", o, self)

    def __rshift__(self, o):
        return binop(">>", self, o)

    def __lshift__(self, o):
        return mul(self, 1 << o) if isinstance(o, int) else binop("<<", self, o)

    def __neg__(self):
        return mul(-1, self)

    def __bool__(self):
        raise TypeError("a symbolic index expression has no truth value; compare with lt()/ge()")


@attrs.frozen(repr=False, cache_hash=True)
class Var(Expr):
    """A named integer in ``[0, extent)``: a loop index, a thread or block index."""

    name: str
    extent: int | None = None   # None = unbounded non-negative

    def __repr__(self):
        return f"Var({self.name!r}, {self.extent})"

    def __str__(self):
        return self.name


@attrs.frozen(repr=False, cache_hash=True)
class Sum(Expr):
    """``const + Σ coeff·term``, terms sorted for a canonical form."""

    terms: tuple[tuple[Expr, int], ...]
    const: int = 0

    def __repr__(self):
        return f"Sum({self.terms!r}, {self.const})"

    def __str__(self):
        return to_c(self)


@attrs.frozen(repr=False, cache_hash=True)
class BinOp(Expr):
    """A non-linear operation: ``//``, ``%``, ``&``, ``>>``, ``<<``, ``^``, ``*`` of two symbols,
    comparisons (``<``, ``>=``, ``==``), ``&&``, ``min``, ``max``."""

    op: str
    a: IntExpr
    b: IntExpr

    def __repr__(self):
        return f"BinOp({self.op!r}, {self.a!r}, {self.b!r})"

    def __str__(self):
        return to_c(self)


@attrs.frozen(repr=False, cache_hash=True)
class Select(Expr):
    cond: IntExpr
    a: IntExpr
    b: IntExpr

    def __str__(self):
        return to_c(self)


# --------------------------------------------------------------------------- construction

def _as_sum(x: IntExpr) -> tuple[dict, int]:
    if isinstance(x, int):
        return {}, x
    if isinstance(x, Sum):
        return dict(x.terms), x.const
    return {x: 1}, 0


def _key(e: Expr) -> str:
    """The sort key of a term in a ``Sum``: its C text (a variable's is its name)."""
    return e.name if isinstance(e, Var) else _printed(e)


@functools.lru_cache(maxsize=1 << 16)
def _printed(e: Expr) -> str:
    # Sums are built term by term, each time sorting their terms by this text: remembering it
    # (and each expression's hash, ``cache_hash``) keeps building an index linear in its terms
    return to_c(e)


def _make_sum(terms: dict, const: int) -> IntExpr:
    items = [(t, c) for t, c in terms.items() if c != 0]
    if len(items) > 1:
        items.sort(key=lambda tc: _key(tc[0]))
    if not items:
        return const
    if const == 0 and len(items) == 1 and items[0][1] == 1:
        return items[0][0]
    return Sum(tuple(items), const)


def add(a, b) -> IntExpr:
    a, b = _lift(a), _lift(b)
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    ta, ca = _as_sum(a)
    tb, cb = _as_sum(b)
    for t, c in tb.items():
        ta[t] = ta.get(t, 0) + c
    return _make_sum(ta, ca + cb)


def mul(a, b) -> IntExpr:
    a, b = _lift(a), _lift(b)
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(b, int):
        a, b = b, a
    if isinstance(a, int):
        if a == 0:
            return 0
        tb, cb = _as_sum(b)
        return _make_sum({t: c * a for t, c in tb.items()}, cb * a)
    return BinOp("*", a, b)


def bounds(x: IntExpr) -> tuple[int | None, int | None]:
    """Inclusive (lo, hi) of ``x`` given its variables' extents; None where unknown."""
    if isinstance(x, int):
        return x, x
    if isinstance(x, Var):
        return 0, (None if x.extent is None else x.extent - 1)
    if isinstance(x, Sum):
        lo = hi = x.const
        for t, c in x.terms:
            tl, th = bounds(t)
            if c > 0:
                lo = None if lo is None or tl is None else lo + c * tl
                hi = None if hi is None or th is None else hi + c * th
            else:
                lo = None if lo is None or th is None else lo + c * th
                hi = None if hi is None or tl is None else hi + c * tl
        return lo, hi
    if isinstance(x, BinOp):
        al, ah = bounds(x.a)
        bl, bh = bounds(x.b)
        if x.op == "//" and isinstance(x.b, int) and x.b > 0:
            return (None if al is None else al // x.b), (None if ah is None else ah // x.b)
        if x.op == "%" and isinstance(x.b, int) and x.b > 0:
            if al is not None and al >= 0:
                return 0, x.b - 1 if ah is None else min(ah, x.b - 1)
            return None, None
        if x.op == "&" and isinstance(x.b, int) and x.b >= 0:
            return 0, x.b
        if x.op in ("<", ">=", "==", "&&", "!="):
            return 0, 1
        if x.op == ">>" and isinstance(x.b, int) and al is not None and al >= 0:
            return al >> x.b, None if ah is None else ah >> x.b
        if x.op == "^" and al is not None and al >= 0 and bl is not None and bl >= 0 and ah is not None and bh is not None:
            return 0, (1 << max(ah, bh).bit_length()) - 1
        if x.op == "*" and None not in (al, ah, bl, bh) and al >= 0 and bl >= 0:
            return al * bl, ah * bh
        if x.op == "min":
            return (None if al is None or bl is None else min(al, bl)), (
                ah if bh is None else bh if ah is None else min(ah, bh))
        if x.op == "max":
            return (al if bl is None else bl if al is None else max(al, bl)), (
                None if ah is None or bh is None else max(ah, bh))
        return None, None
    if isinstance(x, Select):
        al, ah = bounds(x.a)
        bl, bh = bounds(x.b)
        lo = None if al is None or bl is None else min(al, bl)
        hi = None if ah is None or bh is None else max(ah, bh)
        return lo, hi
    return None, None


def _nonneg(x: IntExpr) -> bool:
    lo, _ = bounds(x)
    return lo is not None and lo >= 0


def floordiv(a, b) -> IntExpr:
    a, b = _lift(a), _lift(b)
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    if isinstance(b, int):
        if b <= 0:
            raise ValueError(f"index division by {b}")
        if b == 1:
            return a
        lo, hi = bounds(a)
        if lo is not None and hi is not None and lo >= 0 and hi < b:
            return 0
        if isinstance(a, BinOp) and a.op == "//" and isinstance(a.b, int) and _nonneg(a.a):
            return floordiv(a.a, a.b * b)
        if isinstance(a, (Sum, Var)) and _nonneg(a):
            terms, const = _as_sum(a)
            q = {t: c // b for t, c in terms.items() if c % b == 0}
            r = {t: c for t, c in terms.items() if c % b != 0}
            qc, rc = divmod(const, b)
            rest = _make_sum(r, rc)
            rl, rh = bounds(rest)
            if rl is not None and rh is not None and rl >= 0 and rh < b and all(c > 0 for c in r.values()):
                return _make_sum(q, qc)
            if (q or qc) and rl is not None and rl >= 0 and all(c > 0 for c in r.values()):
                # (b·q + rest) // b == q + rest // b for non-negative rest
                return add(_make_sum(q, qc), BinOp("//", rest, b))
    return BinOp("//", a, b)


def mod(a, b) -> IntExpr:
    a, b = _lift(a), _lift(b)
    if isinstance(a, int) and isinstance(b, int):
        return a % b
    if isinstance(b, int):
        if b <= 0:
            raise ValueError(f"index modulo by {b}")
        if b == 1:
            return 0
        lo, hi = bounds(a)
        if lo is not None and hi is not None and lo >= 0 and hi < b:
            return a
        if isinstance(a, BinOp) and a.op == "%" and isinstance(a.b, int) and a.b % b == 0:
            return mod(a.a, b)
        if (isinstance(a, BinOp) and a.op == "//" and isinstance(a.b, int) and isinstance(a.a, BinOp)
                and a.a.op == "%" and isinstance(a.a.b, int) and a.a.b % (a.b * b) == 0 and _nonneg(a.a.a)):
            # ((x % c) // d) % e == (x // d) % e when d * e divides c: the dropped high bits of x
            # only reach digits above the ones kept
            return mod(floordiv(a.a.a, a.b), b)
        if isinstance(a, (Sum, Var)) and _nonneg(a):
            terms, const = _as_sum(a)
            r = {t: c % b for t, c in terms.items() if c % b != 0}
            rest = _make_sum(r, const % b)
            if rest != a and _nonneg(rest):
                return mod(rest, b)
    return BinOp("%", a, b)


_FOLD = {
    "&": operator.and_, "^": operator.xor, ">>": operator.rshift, "<<": operator.lshift,
    "<": lambda x, y: int(x < y), ">=": lambda x, y: int(x >= y), "==": lambda x, y: int(x == y),
    "!=": lambda x, y: int(x != y), "&&": lambda x, y: int(bool(x) and bool(y)), "min": min, "max": max,
}


def binop(op: str, a, b) -> IntExpr:
    a, b = _lift(a), _lift(b)
    if isinstance(a, int) and isinstance(b, int):
        return _FOLD[op](a, b)
    if op == "^" and (a == 0 or b == 0):
        return b if a == 0 else a
    if op == ">>" and b == 0:
        return a
    if op == "&" and isinstance(b, int):
        lo, hi = bounds(a)
        if b == 0:
            return 0
        if lo is not None and hi is not None and lo >= 0 and (b + 1) & b == 0 and hi <= b:
            return a
        if (b + 1) & b == 0 and _nonneg(a):  # mask of low bits == modulo
            return mod(a, b + 1)
        # (x & m) where every term of x is a multiple of a power of two above m's bits: 0
    if op == ">>" and isinstance(b, int) and _nonneg(a):
        return floordiv(a, 1 << b)
    if op in ("<", ">=") and isinstance(b, int):
        lo, hi = bounds(a)
        if op == "<":
            if hi is not None and hi < b:
                return 1
            if lo is not None and lo >= b:
                return 0
        else:
            if lo is not None and lo >= b:
                return 1
            if hi is not None and hi < b:
                return 0
    if op == "&&":
        if a == 1:
            return b
        if b == 1:
            return a
        if a == 0 or b == 0:
            return 0
    return BinOp(op, a, b)


def lt(a, b) -> IntExpr:
    return binop("<", a, b)


def ge(a, b) -> IntExpr:
    return binop(">=", a, b)


def land(*conds) -> IntExpr:
    out: IntExpr = 1
    for c in conds:
        out = binop("&&", out, c)
    return out


def select(cond, a, b) -> IntExpr:
    cond, a, b = _lift(cond), _lift(a), _lift(b)
    if isinstance(cond, int):
        return a if cond else b
    if a == b if isinstance(a, int) and isinstance(b, int) else False:
        return a
    return Select(cond, a, b)


def minimum(a, b) -> IntExpr:
    return binop("min", a, b)


def maximum(a, b) -> IntExpr:
    return binop("max", a, b)


# --------------------------------------------------------------------------- substitution / evaluation

def substitute(x: IntExpr, env: dict) -> IntExpr:
    """Replace variables (by Var or by name) with expressions or ints, re-simplifying."""
    if isinstance(x, int):
        return x
    if isinstance(x, Var):
        if x in env:
            return env[x]
        return env.get(x.name, x)
    if isinstance(x, Sum):
        out: IntExpr = x.const
        for t, c in x.terms:
            out = add(out, mul(c, substitute(t, env)))
        return out
    if isinstance(x, BinOp):
        a, b = substitute(x.a, env), substitute(x.b, env)
        if x.op == "//":
            return floordiv(a, b)
        if x.op == "%":
            return mod(a, b)
        if x.op == "*":
            return mul(a, b)
        return binop(x.op, a, b)
    if isinstance(x, Select):
        return select(substitute(x.cond, env), substitute(x.a, env), substitute(x.b, env))
    raise TypeError(f"not an index expression: {x!r}")


def free_vars(x: IntExpr) -> set:
    if isinstance(x, int):
        return set()
    if isinstance(x, Var):
        return {x}
    if isinstance(x, Sum):
        return set().union(*(free_vars(t) for t, _ in x.terms))
    if isinstance(x, BinOp):
        return free_vars(x.a) | free_vars(x.b)
    if isinstance(x, Select):
        return free_vars(x.cond) | free_vars(x.a) | free_vars(x.b)
    raise TypeError(f"not an index expression: {x!r}")


_NP_OPS = {
    "//": operator.floordiv, "%": operator.mod, "*": operator.mul,
    "&": operator.and_, "^": operator.xor, ">>": operator.rshift, "<<": operator.lshift,
}


def evaluate(x: IntExpr, env: dict):
    """Value of ``x`` with variables (keyed by name) bound to ints or numpy integer arrays."""
    import numpy as np

    if isinstance(x, int):
        return x
    if isinstance(x, Var):
        try:
            return env[x.name]
        except KeyError:
            raise KeyError(f"index variable {x.name!r} is not bound here") from None
    if isinstance(x, Sum):
        out = x.const
        for t, c in x.terms:
            out = out + c * evaluate(t, env)
        return out
    if isinstance(x, BinOp):
        a, b = evaluate(x.a, env), evaluate(x.b, env)
        if x.op in _NP_OPS:
            return _NP_OPS[x.op](a, b)
        if x.op == "<":
            return np.less(a, b).astype(np.int64) if not isinstance(a, int) or not isinstance(b, int) else int(a < b)
        if x.op == ">=":
            return np.greater_equal(a, b).astype(np.int64) if not (isinstance(a, int) and isinstance(b, int)) else int(a >= b)
        if x.op == "==":
            return np.equal(a, b).astype(np.int64) if not (isinstance(a, int) and isinstance(b, int)) else int(a == b)
        if x.op == "!=":
            return np.not_equal(a, b).astype(np.int64) if not (isinstance(a, int) and isinstance(b, int)) else int(a != b)
        if x.op == "&&":
            return np.logical_and(a, b).astype(np.int64) if not (isinstance(a, int) and isinstance(b, int)) else int(bool(a) and bool(b))
        if x.op == "min":
            return np.minimum(a, b)
        if x.op == "max":
            return np.maximum(a, b)
        raise ValueError(f"unknown index operator {x.op!r}")
    if isinstance(x, Select):
        c = evaluate(x.cond, env)
        return np.where(c != 0, evaluate(x.a, env), evaluate(x.b, env))
    raise TypeError(f"not an index expression: {x!r}")


# --------------------------------------------------------------------------- C printing

_PREC = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, ">=": 7,
         "<<": 8, ">>": 8, "+": 9, "*": 10, "//": 10, "%": 10}


def to_c(x: IntExpr, prec: int = 0) -> str:
    """C source for ``x``; operands of ``/`` and ``%`` are non-negative by construction, so C's
    truncating division equals Python's floor division here."""
    if isinstance(x, int):
        return str(x) if x >= 0 or prec == 0 else f"({x})"
    if isinstance(x, Var):
        return x.name
    if isinstance(x, Sum):
        parts = []
        for t, c in x.terms:
            if c == 1:
                parts.append(("+", to_c(t, _PREC["+"])))
            elif c == -1:
                parts.append(("-", to_c(t, _PREC["*"])))
            elif c > 0:
                parts.append(("+", f"{to_c(t, _PREC['*'])} * {c}"))
            else:
                parts.append(("-", f"{to_c(t, _PREC['*'])} * {-c}"))
        if x.const > 0:
            parts.append(("+", str(x.const)))
        elif x.const < 0:
            parts.append(("-", str(-x.const)))
        s = ("-" if parts[0][0] == "-" else "") + parts[0][1]
        for sign, p in parts[1:]:
            s += f" {sign} {p}"
        return f"({s})" if prec > _PREC["+"] else s
    if isinstance(x, BinOp):
        if x.op in ("min", "max"):
            return f"{x.op}({to_c(x.a)}, {to_c(x.b)})"
        p = _PREC[x.op]
        cop = "/" if x.op == "//" else x.op
        s = f"{to_c(x.a, p)} {cop} {to_c(x.b, p + 1)}"
        return f"({s})" if prec > p else s
    if isinstance(x, Select):
        s = f"{to_c(x.cond, 3)} ? {to_c(x.a, 3)} : {to_c(x.b, 3)}"
        return f"({s})" if prec > 0 else s
    raise TypeError(f"not an index expression: {x!r}")
