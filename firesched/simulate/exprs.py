"""Index expressions compiled to closures, evaluated for all threads at once.

``expr.evaluate`` walks the expression tree on every call; the interpreter evaluates the same
offsets millions of times (once per statement execution), so each expression is compiled once
into nested closures over numpy.  A closure returns an int where the expression is uniform (loop
variables, block ids) and a per-thread array where it depends on ``tid``.
"""

from __future__ import annotations

import numpy as np

from ..errors import InternalError
from ..ir.expr import BinOp, Select, Sum, Var


def compile_expr(x):
    """A function ``env -> value`` computing ``expr.evaluate(x, env)``, built once per expression."""
    if isinstance(x, (bool, np.bool_)):
        x = int(x)
    if isinstance(x, (int, np.integer)):
        c = int(x)
        return lambda env: c
    if isinstance(x, Var):
        name = x.name

        def var(env):
            try:
                return env[name]
            except KeyError:
                raise InternalError(f"index variable {name!r} is not bound here") from None
        return var
    if isinstance(x, Sum):
        const = x.const
        terms = tuple((compile_expr(t), c) for t, c in x.terms)
        if len(terms) == 1:
            (f0, c0), = terms
            return lambda env: const + c0 * f0(env)

        def total(env):
            out = const
            for f, c in terms:
                out = out + c * f(env)
            return out
        return total
    if isinstance(x, BinOp):
        fa, fb = compile_expr(x.a), compile_expr(x.b)
        op = _BINOPS.get(x.op)
        if op is None:
            raise InternalError(f"unknown index operator {x.op!r} in {x!r}")
        return lambda env: op(fa(env), fb(env))
    if isinstance(x, Select):
        fc, fa, fb = compile_expr(x.cond), compile_expr(x.a), compile_expr(x.b)

        def sel(env):
            c, a, b = fc(env), fa(env), fb(env)
            if np.ndim(c) == 0 and np.ndim(a) == 0 and np.ndim(b) == 0:
                return int(a) if c else int(b)
            return np.where(np.asarray(c) != 0, a, b)
        return sel
    raise InternalError(f"not an index expression: {x!r}")


def _as_int(r):
    # comparisons yield 0/1 like C, whether the operands were uniform ints or per-thread arrays
    return r.astype(np.int64) if isinstance(r, np.ndarray) else int(r)


_BINOPS = {
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "*": lambda a, b: a * b,
    "&": lambda a, b: a & b,
    "^": lambda a, b: a ^ b,
    ">>": lambda a, b: a >> b,
    "<<": lambda a, b: a << b,
    "<": lambda a, b: _as_int(np.less(a, b)),
    ">=": lambda a, b: _as_int(np.greater_equal(a, b)),
    "==": lambda a, b: _as_int(np.equal(a, b)),
    "!=": lambda a, b: _as_int(np.not_equal(a, b)),
    "&&": lambda a, b: _as_int(np.logical_and(a, b)),
    "min": lambda a, b: np.minimum(a, b),
    "max": lambda a, b: np.maximum(a, b),
}
