"""A small interpreter for the C the CUDA printer puts in its prelude, so that the tests can run
the prelude's helpers on the CPU and compare them with numpy / ml_dtypes.

It understands what the prelude is written in and nothing more: ``static __device__
__forceinline__`` functions over scalar integer and float types and byte pointers, declarations,
``if``/``else``, ``return``, assignments (also compound), the C operators with C's integer
promotions and usual arithmetic conversions (widths 8/16/32/64, unsigned wrap-around, float
arithmetic in float32), the CUDA intrinsics the prelude calls, ``#if __CUDA_ARCH__ >= N`` /
``#else`` / ``#endif``, and ``asm`` statements whose single instruction is a ``cvt`` (emulated
from the PTX ISA's rounding modifiers: ``.rn`` nearest even, ``.rz`` toward zero, ``.rm`` down,
``.rp`` up, ``.rna`` nearest away; no modifier for exact widening).  Anything else raises, so a
prelude change that leaves this subset shows up as a test failure to look at, not as a silent
pass.

This is test code: it shares nothing with firesched's own numpy models of the conversions.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np

# --------------------------------------------------------------------------- types

#: C type name -> (bits, signed, kind) with kind "int" or "float"
TYPES = {
    "bool": (32, True, "int"), "char": (8, True, "int"), "signed char": (8, True, "int"),
    "unsigned char": (8, False, "int"), "short": (16, True, "int"), "unsigned short": (16, False, "int"),
    "int": (32, True, "int"), "unsigned": (32, False, "int"), "unsigned int": (32, False, "int"),
    "long long": (64, True, "int"), "unsigned long long": (64, False, "int"),
    "float": (32, True, "float"), "double": (64, True, "float"),
}
_RANK = {8: 1, 16: 2, 32: 3, 64: 4}


class CError(Exception):
    """The C text leaves the subset this interpreter understands."""


class Val:
    """A typed scalar: ``t`` a key of ``TYPES``, ``v`` a Python int or a numpy float."""

    __slots__ = ("t", "v")

    def __init__(self, t: str, v):
        self.t, self.v = t, v

    def __repr__(self):
        return f"({self.t}){self.v!r}"


class Ptr:
    """A pointer into a Python list of ``Val`` (the byte arrays of the 4-bit helpers)."""

    def __init__(self, t: str, cells: list, offset: int = 0):
        self.t, self.cells, self.offset = t, cells, offset


def convert(x: Val, t: str) -> Val:
    """C's conversion of ``x`` to type ``t`` (integers wrap; float -> int truncates)."""
    bits, signed, kind = TYPES[t]
    if kind == "float":
        return Val(t, np.float32(x.v) if bits == 32 else np.float64(x.v))
    v = x.v
    if TYPES[x.t][2] == "float":
        if not np.isfinite(v):
            raise CError(f"conversion of {v} to {t} is undefined in C")
        v = int(np.trunc(v))
    v &= (1 << bits) - 1
    if signed and v >= 1 << (bits - 1):
        v -= 1 << bits
    return Val(t, v)


def _promote(t: str) -> str:
    bits, signed, kind = TYPES[t]
    return t if kind == "float" or bits >= 32 else "int"


def _common(a: str, b: str) -> str:
    """The usual arithmetic conversions of C."""
    for f in ("double", "float"):
        if f in (a, b):
            return f
    a, b = _promote(a), _promote(b)
    if a == b:
        return a
    (ba, sa, _), (bb, sb, _) = TYPES[a], TYPES[b]
    if sa == sb:
        return a if ba >= bb else b
    u, s = (a, b) if not sa else (b, a)
    if _RANK[TYPES[u][0]] >= _RANK[TYPES[s][0]]:
        return u
    if TYPES[s][0] > TYPES[u][0]:
        return s
    return "unsigned " + s if s != "int" else "unsigned"


# --------------------------------------------------------------------------- tokens

_TOKEN = re.compile(r"""
    (?P<ws>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<num>0[xX][0-9a-fA-F]+[uUlL]*|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?[fFuUlL]*)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><<=|>>=|\+=|-=|\*=|/=|%=|&=|\|=|\^=|<<|>>|<=|>=|==|!=|&&|\|\||\+\+|--|[-+*/%&|^~!<>=?:;,(){}\[\]])
""", re.X | re.S)


def tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise CError(f"cannot read C at: {text[pos:pos + 40]!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append(m.group())
    return out


def preprocess(text: str, arch: int) -> str:
    """Keep the branch of each ``#if __CUDA_ARCH__ >= N`` that ``arch`` takes; drop other
    preprocessor lines (include guards, ``#define``, ``#error`` guarded by feature macros)."""
    out, stack = [], []
    for ln in text.splitlines():
        s = ln.strip()
        m = re.match(r"#if\s+__CUDA_ARCH__\s*>=\s*(\d+)\s*$", s)
        if m:
            stack.append(arch >= int(m.group(1)))
            continue
        if s.startswith("#if"):
            stack.append(None)          # a guard we do not evaluate: keep its body
            continue
        if s.startswith("#else"):
            if stack[-1] is not None:
                stack[-1] = not stack[-1]
            continue
        if s.startswith("#endif"):
            stack.pop()
            continue
        if s.startswith("#"):
            continue
        if all(x is not False for x in stack):
            out.append(ln)
    return "\n".join(out)


# --------------------------------------------------------------------------- PTX cvt emulation

_NP_FLOATS = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64}


def _round_float(x: float, dst: str, mode: str):
    """``x`` rounded to float type ``dst`` with the PTX rounding modifier ``mode``."""
    t = _NP_FLOATS[dst]
    with np.errstate(over="ignore"):
        near = t(x)
    if mode == "rn" or not np.isfinite(x):
        return near
    if float(near) == x:
        return near
    # the two representable neighbours of x
    lo, hi = (near, np.nextafter(near, t(np.inf))) if float(near) < x else (np.nextafter(near, t(-np.inf)), near)
    if mode == "rz":
        return lo if x > 0 else hi
    if mode == "rm":
        return lo
    if mode == "rp":
        return hi
    if mode == "rna":
        dl, dh = x - float(lo), float(hi) - x
        return (hi if x > 0 else lo) if dl == dh else (lo if dl < dh else hi)
    raise CError(f"unknown rounding modifier .{mode}")


def emulate_cvt(instr: str, src: Val, out_type: str) -> Val:
    """One ``cvt`` instruction on the value of its source operand."""
    parts = instr.split(".")
    if parts[0] != "cvt":
        raise CError(f"asm instruction {instr!r} is not emulated (only cvt)")
    mods = parts[1:]
    rnd = [m for m in mods if m in ("rn", "rz", "rm", "rp", "rna", "rni", "rzi", "rmi", "rpi")]
    types = [m for m in mods if m not in rnd and m != "sat" and m != "ftz"]
    if len(types) != 2:
        raise CError(f"cvt {instr!r}: expected a destination and a source type")
    dst, srct = types
    if srct == "f32":
        x = float(np.float32(src.v))
    elif srct in ("f16", "bf16"):
        bits = int(src.v) & 0xFFFF
        x = float(np.array([bits], np.uint16).view(_NP_FLOATS[srct])[0])
    else:
        raise CError(f"cvt from .{srct} is not emulated")
    if dst == "f32":
        if _NP_FLOATS[srct](x).astype(np.float32) != np.float32(x) and not np.isnan(x):
            raise CError("a widening cvt must be exact")
        if rnd and srct != "f32":
            raise CError(f"cvt {instr!r}: a widening conversion takes no rounding modifier")
        return convert(Val("float", np.float32(x)), out_type)
    if dst in ("f16", "bf16"):
        if len(rnd) != 1:
            raise CError(f"cvt {instr!r}: a narrowing float conversion needs one rounding modifier")
        y = _round_float(x, dst, rnd[0])
        bits = int(np.array([y], _NP_FLOATS[dst]).view(np.uint16)[0])
        return Val(out_type, bits)
    raise CError(f"cvt to .{dst} is not emulated")


# --------------------------------------------------------------------------- intrinsics

def _f32(v: Val) -> np.float32:
    return np.float32(convert(v, "float").v)


def _rn_int(x: np.float32, lo: int, hi: int) -> int:
    if np.isnan(x):
        return 0
    r = float(np.rint(np.float64(x)))           # ties to even
    return int(min(max(r, lo), hi))


def _libm(fn):
    """A float math function of CUDA's libm: computed in double, rounded to float (CUDA's are
    within a few ulp; the tests compare with a tolerance)."""
    return lambda *args: Val("float", np.float32(fn(*(float(_f32(a)) for a in args))))


INTRINSICS = {
    "fmaxf": _libm(lambda a, b: b if np.isnan(a) else a if np.isnan(b) else max(a, b)),
    "fminf": _libm(lambda a, b: b if np.isnan(a) else a if np.isnan(b) else min(a, b)),
    "fabsf": _libm(abs),
    "expf": _libm(lambda a: float(np.exp(np.float64(a)))),
    "tanhf": _libm(lambda a: float(np.tanh(a))),
    "erff": _libm(lambda a: __import__("math").erf(a)),
    # (div.approx: within 2 ulp of the quotient for 2^-126 <= |b| <= 2^126)
    "__fdividef": _libm(lambda a, b: a / b),

    "__float_as_uint": lambda v: Val("unsigned", int(np.array([_f32(v)], np.float32).view(np.uint32)[0])),
    "__uint_as_float": lambda v: Val("float", np.array([convert(v, "unsigned").v], np.uint32).view(np.float32)[0]),
    "__float2uint_rn": lambda v: Val("unsigned", _rn_int(_f32(v), 0, 2 ** 32 - 1)),
    "__float2int_rn": lambda v: Val("int", _rn_int(_f32(v), -2 ** 31, 2 ** 31 - 1)),
}


# --------------------------------------------------------------------------- parser + evaluator

class _Return(Exception):
    def __init__(self, value):
        self.value = value


_TYPE_WORDS = {"unsigned", "signed", "int", "char", "short", "long", "float", "double", "bool", "void"}
_QUALIFIERS = {"const", "static", "__device__", "__forceinline__", "inline", "volatile"}


class Function:
    def __init__(self, name, ret, params, body):
        self.name, self.ret, self.params, self.body = name, ret, params, body


class Program:
    """The functions of a C text, callable by name: ``Program(text, arch).call("fs_f32_to_f16",
    Val("float", ...))``."""

    def __init__(self, text: str, arch: int = 900):
        self.toks = tokens(preprocess(text, arch))
        self.i = 0
        self.functions: dict[str, Function] = {}
        while self.i < len(self.toks):
            self._function()

    # -- token helpers
    def peek(self, k=0):
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def take(self, want=None):
        t = self.peek()
        if want is not None and t != want:
            raise CError(f"expected {want!r}, found {t!r} near {' '.join(self.toks[self.i:self.i + 8])}")
        self.i += 1
        return t

    def _type(self):
        words = []
        while self.peek() in _QUALIFIERS:
            self.take()
        while self.peek() in _TYPE_WORDS:
            words.append(self.take())
        while self.peek() in _QUALIFIERS:
            self.take()
        if not words:
            return None
        name = " ".join(words)
        if name == "long long int":
            name = "long long"
        ptr = False
        ref = False
        while self.peek() in ("*", "&", "const"):
            t = self.take()
            ptr |= t == "*"
            ref |= t == "&"
        if ref:
            return ("ref", name)        # parsed (fs_fence_reg), never called
        return ("ptr", name) if ptr else name

    def _function(self):
        ret = self._type()
        name = self.take()
        if ret is None:
            # a struct or other top-level declaration: skip it to its end
            depth = 0
            while True:
                t = self.take()
                depth += t == "{"
                depth -= t == "}"
                if t == ";" and depth == 0:
                    return
        self.take("(")
        params = []
        while self.peek() != ")":
            t = self._type()
            params.append((t, self.take()))
            if self.peek() == ",":
                self.take()
        self.take(")")
        start = self.i
        depth = 0
        while True:                      # the body's tokens, parsed when called
            t = self.take()
            depth += t == "{"
            depth -= t == "}"
            if depth == 0:
                break
        self.functions[name] = Function(name, ret, params, (start, self.i))

    def call(self, name: str, *args):
        f = self.functions.get(name)
        if f is None:
            if name in INTRINSICS:
                return INTRINSICS[name](*args)
            raise CError(f"no function {name}")
        env = {}
        for (t, pname), a in zip(f.params, args, strict=True):
            if isinstance(t, tuple) and t[0] == "ref":
                raise CError(f"{name} takes a reference; not in the subset")
            env[pname] = a if isinstance(t, tuple) else convert(a, t)
        saved = self.i
        self.i = f.body[0]
        try:
            self._block(env)
            result = None
        except _Return as r:
            result = None if f.ret == "void" else convert(r.value, f.ret)
        finally:
            self.i = saved
        return result

    # -- statements
    def _block(self, env):
        self.take("{")
        # one scope per call: the prelude never shadows a name, and assignments in a nested
        # block must reach the function's variables
        while self.peek() != "}":
            self._statement(env)
        self.take("}")

    def _skip_statement(self):
        if self.peek() == "{":
            depth = 0
            while True:
                t = self.take()
                depth += t == "{"
                depth -= t == "}"
                if depth == 0:
                    return
        if self.peek() == "if":
            self.take()
            self._skip_parens()
            self._skip_statement()
            if self.peek() == "else":
                self.take()
                self._skip_statement()
            return
        while self.take() != ";":
            pass

    def _skip_parens(self):
        self.take("(")
        depth = 1
        while depth:
            t = self.take()
            depth += t == "("
            depth -= t == ")"

    def _statement(self, env):
        t = self.peek()
        if t == "{":
            return self._block(env)
        if t == "if":
            self.take()
            self.take("(")
            cond = self._expr(env)
            self.take(")")
            if cond.v:
                self._statement(env)
                if self.peek() == "else":
                    self.take()
                    self._skip_statement()
            else:
                self._skip_statement()
                if self.peek() == "else":
                    self.take()
                    self._statement(env)
            return
        if t == "return":
            self.take()
            if self.peek() == ";":
                self.take()
                raise _Return(None)
            v = self._expr(env)
            self.take(";")
            raise _Return(v)
        if t == "asm":
            return self._asm(env)
        if t in _TYPE_WORDS or t in _QUALIFIERS:
            ty = self._type()
            while True:
                name = self.take()
                if self.peek() == "=":
                    self.take()
                    env[name] = convert(self._expr(env), ty)
                else:
                    env[name] = Val(ty, 0)          # uninitialised: only written before read
                if self.peek() == ",":
                    self.take()
                    continue
                break
            self.take(";")
            return
        self._expr(env)
        self.take(";")

    def _asm(self, env):
        self.take("asm")
        if self.peek() == "volatile":
            self.take()
        self.take("(")
        template = self.take()[1:-1]
        groups = [[], [], []]
        g = -1
        while self.peek() != ")":
            if self.peek() == ":":
                self.take()
                g += 1
                continue
            if self.peek() == ",":
                self.take()
                continue
            cons = self.take()[1:-1]
            if g == 2:          # clobbers
                continue
            self.take("(")
            if g == 0:
                name = self.take()
                groups[0].append((cons, name))
            else:
                groups[1].append((cons, self._expr(env)))
            self.take(")")
        self.take(")")
        self.take(";")
        instrs = [s.strip() for s in template.split(";") if s.strip()]
        if len(instrs) != 1:
            raise CError(f"asm {template!r}: one instruction expected")
        op, _, operands = instrs[0].partition(" ")
        ops_ = [o.strip() for o in operands.split(",")]
        if [o for o in ops_] != ["%0", "%1"] or len(groups[0]) != 1 or len(groups[1]) != 1:
            raise CError(f"asm {template!r}: expected 'cvt... %0, %1' with one output and one input")
        (_, out_name), (_, src) = groups[0][0], groups[1][0]
        env[out_name] = emulate_cvt(op, src, env[out_name].t)

    # -- expressions (precedence climbing)
    _BINARY = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", ">", "<=", ">="), ("<<", ">>"),
               ("+", "-"), ("*", "/", "%")]
    _ASSIGN = {"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="}

    def _expr(self, env):
        return self._assign(env)

    def _assign(self, env):
        start = self.i
        if self.peek(0) and re.match(r"[A-Za-z_]", self.peek(0)) and self.peek(1) in self._ASSIGN:
            name = self.take()
            op = self.take()
            rhs = self._assign(env)
            cur = env[name]
            val = rhs if op == "=" else self._binop(op[:-1], cur, rhs)
            env[name] = convert(val, cur.t)
            return env[name]
        if self.peek(0) and re.match(r"[A-Za-z_]", self.peek(0)) and self.peek(1) == "[":
            # p[index] op= value
            name = self.take()
            self.take("[")
            idx = self._expr(env)
            self.take("]")
            if self.peek() in self._ASSIGN:
                op = self.take()
                rhs = self._assign(env)
                p = env[name]
                k = p.offset + idx.v
                cur = p.cells[k]
                val = rhs if op == "=" else self._binop(op[:-1], cur, rhs)
                p.cells[k] = convert(val, p.t)
                return p.cells[k]
            self.i = start
        return self._ternary(env)

    def _ternary(self, env):
        c = self._binary(env, 0)
        if self.peek() != "?":
            return c
        self.take("?")
        if c.v:
            a = self._assign(env)
            self.take(":")
            self._skip_expr()
            return a
        self._skip_expr(stop=":")
        self.take(":")
        return self._assign(env)

    def _skip_expr(self, stop=None):
        """Skip one conditional-expression operand without evaluating it."""
        depth = 0
        while True:
            t = self.peek()
            if depth == 0 and (t in (")", ",", ";", "]") or (stop is not None and t == stop)):
                return
            if t == "?" and depth == 0 and stop == ":":
                # a nested conditional inside the skipped operand: skip to its own ':'
                self.take()
                self._skip_expr(stop=":")
                self.take(":")
                continue
            depth += t in ("(", "[")
            depth -= t in (")", "]")
            self.take()

    def _binary(self, env, level):
        if level == len(self._BINARY):
            return self._unary(env)
        left = self._binary(env, level + 1)
        while self.peek() in self._BINARY[level]:
            op = self.take()
            if op in ("&&", "||"):
                if (op == "&&" and not left.v) or (op == "||" and left.v):
                    self._skip_binary(level + 1)
                    left = Val("int", int(op == "||"))
                    continue
                right = self._binary(env, level + 1)
                left = Val("int", int(bool(right.v)))
                continue
            right = self._binary(env, level + 1)
            left = self._binop(op, left, right)
        return left

    def _skip_binary(self, level):
        depth = 0
        while True:
            t = self.peek()
            if depth == 0 and t in (")", ",", ";", "?", ":", "&&", "||", "]"):
                return
            depth += t in ("(", "[")
            depth -= t in (")", "]")
            self.take()

    def _binop(self, op, a: Val, b: Val) -> Val:
        if op in ("<<", ">>"):
            t = _promote(a.t)
            x = convert(a, t)
            n = convert(b, "int").v
            if not 0 <= n < TYPES[t][0]:
                raise CError(f"shift by {n} of a {t} is undefined")
            return convert(Val("unsigned long long", x.v << n if op == "<<" else x.v >> n), t)
        t = _common(a.t, b.t)
        x, y = convert(a, t).v, convert(b, t).v
        if TYPES[t][2] == "float":
            with np.errstate(all="ignore"):
                r = {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "/": lambda: x / y}.get(op)
                if r is not None:
                    return Val(t, r())
        if op in ("==", "!=", "<", ">", "<=", ">="):
            r = {"==": x == y, "!=": x != y, "<": x < y, ">": x > y, "<=": x <= y, ">=": x >= y}[op]
            return Val("int", int(bool(r)))
        if TYPES[t][2] == "float":
            raise CError(f"operator {op} on floats")
        if op in ("/", "%"):
            if y == 0:
                raise CError("division by zero")
            q = abs(x) // abs(y) * (1 if (x >= 0) == (y >= 0) else -1)     # C truncates
            return convert(Val(t, q if op == "/" else x - q * y), t)
        r = {"+": x + y, "-": x - y, "*": x * y, "&": x & y, "|": x | y, "^": x ^ y}[op]
        return convert(Val("long long" if TYPES[t][1] else "unsigned long long", r), t)

    def _unary(self, env):
        t = self.peek()
        if t == "(" and self.peek(1) in _TYPE_WORDS | _QUALIFIERS:
            self.take("(")
            ty = self._type()
            self.take(")")
            v = self._unary(env)
            if isinstance(ty, tuple):
                raise CError("pointer casts are not in the subset")
            return convert(v, ty)
        if t == "-":
            self.take()
            v = self._unary(env)
            tt = _promote(v.t)
            if TYPES[tt][2] == "float":
                return Val(tt, -convert(v, tt).v)
            return convert(Val("long long", -convert(v, tt).v), tt)
        if t == "~":
            self.take()
            v = self._unary(env)
            x = convert(v, _promote(v.t))
            return convert(Val("long long", ~x.v), x.t)
        if t == "!":
            self.take()
            return Val("int", int(not self._unary(env).v))
        if t == "+":
            self.take()
            return self._unary(env)
        return self._postfix(env)

    def _postfix(self, env):
        t = self.take()
        if t == "(":
            v = self._expr(env)
            self.take(")")
            return v
        m = re.fullmatch(r"(0[xX][0-9a-fA-F]+|\d+\.\d*|\.\d+|\d+)((?:[eE][-+]?\d+)?)([fFuUlL]*)", t)
        if m:
            body, exp, suf = m.group(1), m.group(2), m.group(3).lower()
            if "." in body or exp or ("f" in suf and not body.lower().startswith("0x")):
                return Val("float" if "f" in suf else "double", (np.float32 if "f" in suf else np.float64)(body + exp))
            n = int(body, 0)
            unsigned = "u" in suf
            longlong = "ll" in suf
            if longlong:
                return Val("unsigned long long" if unsigned else "long long", n)
            if unsigned:
                return Val("unsigned" if n < 2 ** 32 else "unsigned long long", n)
            if n < 2 ** 31:
                return Val("int", n)
            if body.lower().startswith("0x") and n < 2 ** 32:
                return Val("unsigned", n)
            return Val("long long", n)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", t):
            raise CError(f"unexpected token {t!r}")
        if self.peek() == "(":
            self.take("(")
            args = []
            while self.peek() != ")":
                args.append(self._expr(env))
                if self.peek() == ",":
                    self.take()
            self.take(")")
            return self.call(t, *args)
        if t not in env:
            raise CError(f"unknown name {t}")
        v = env[t]
        if self.peek() == "[":
            self.take("[")
            idx = self._expr(env)
            self.take("]")
            return v.cells[v.offset + idx.v]
        return v


def f32_val(x) -> Val:
    return Val("float", np.float32(x))


def u_val(t: str, x: int) -> Val:
    return convert(Val("unsigned long long", int(x) & (2 ** 64 - 1)), t)
