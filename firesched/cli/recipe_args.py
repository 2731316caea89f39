"""How the command line names a schedule: a recipe of ``firesched.recipes``, its shape as positional
integers, ``--dtype``, ``--arch`` and ``-p name=value`` for any other keyword parameter of the
recipe function (checked against its signature, so the CLI follows the recipes as they grow).

    firesched show gemm 1024 1024 1024 --dtype f16 --arch sm_90a -p block_m=128 --epilogue bias_relu
    firesched show rmsnorm 4096 8192 -p eps=1e-5
    firesched show cast 4096 4096 --dtype f32:bf16
"""

from __future__ import annotations

import argparse
import inspect
import re
from typing import Any, Callable

import attrs

from firesched import recipes
from firesched.errors import FireschedError
from firesched.layout import SW32, SW64, SW128, Swizzle
from firesched.schedule import Schedule


class CLIError(FireschedError, ValueError):
    """A command-line argument firesched cannot use; the message names it and what is allowed."""


@attrs.frozen
class Recipe:
    """A recipe as the command line sees it: its ``dims`` (the positional shape arguments, in
    order), a one-line ``summary``, the recipe function ``fn`` and ``build(shape, dtype, arch, params,
    **kw)`` -> Schedule (``params``: what ``-p`` set; ``kw``: keyword arguments of ``fn`` itself).  ``params_of`` is the function whose keyword parameters
    ``-p`` may set (``fn`` itself unless it forwards ``**params`` to another)."""

    name: str
    dims: tuple[str, ...]
    summary: str
    fn: Callable[..., Schedule]
    build: Callable[..., Schedule]
    params_of: Callable[..., Any] | None = None
    dtype_help: str = "element type (f16, bf16)"
    #: Recipes that take their overrides as one ``params`` dict: True, and the keys ``-p`` may
    #: set (None: any; the recipe checks them).
    overrides_dict: bool = False
    override_keys: tuple[str, ...] | None = None

    def param_names(self) -> dict[str, inspect.Parameter]:
        """The keyword parameters ``-p`` may set: the recipe's, less the shape, dtype and arch."""
        sig = inspect.signature(self.params_of or self.fn)
        skip = {d.lower() for d in self.dims} | set(self.dims) | {"dtype", "arch", "check", "shape", "src", "dst",
                                                                   "rows", "cols", "batch", "params"}
        return {n: p for n, p in sig.parameters.items()
                if n not in skip and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def _kw(fn: Callable[..., Schedule]) -> Callable[..., Schedule]:
    """The usual calling convention: ``fn(*shape, dtype=..., arch=..., **params)``."""
    return lambda shape, dtype, arch, params, **kw: fn(*shape, dtype=dtype, arch=arch, **params, **kw)


def _with_params_dict(fn: Callable[..., Schedule]) -> Callable[..., Schedule]:
    """Recipes that take their tuning overrides as one ``params`` dict (transpose)."""
    return lambda shape, dtype, arch, params, **kw: fn(*shape, dtype=dtype, arch=arch, params=params or None, **kw)


def cast_dtypes(dtype: str) -> tuple[str, str]:
    """``--dtype`` of ``cast``: ``src:dst`` (``f32:bf16``), or ``dst`` alone for a cast from f32."""
    src, _, dst = dtype.rpartition(":")
    return (src or "f32", dst)


def _cast(shape, dtype, arch, params, **kw):
    src, dst = cast_dtypes(dtype)
    return recipes.cast(tuple(shape), src, dst, arch=arch, params=params or None, **kw)


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("gemm", ("M", "N", "K"), "C = A @ B (+ epilogue), A MxK, B KxN", recipes.gemm, _kw(recipes.gemm)),
    Recipe("bmm", ("batch", "M", "N", "K"), "batched C[b] = A[b] @ B[b]", recipes.bmm, _kw(recipes.bmm),
           params_of=recipes.gemm),
    Recipe("rmsnorm", ("rows", "cols"), "Y = X / rms(X) * W over rows", recipes.rmsnorm, _kw(recipes.rmsnorm)),
    Recipe("layernorm", ("rows", "cols"), "Y = (X - mean) / std * W + B over rows", recipes.layernorm,
           _kw(recipes.layernorm)),
    Recipe("add_rmsnorm", ("rows", "cols"), "H = X + R; Y = rmsnorm(H)", recipes.add_rmsnorm,
           _kw(recipes.add_rmsnorm)),
    Recipe("softmax", ("rows", "cols"), "Y = softmax(scale * X) over rows", recipes.softmax, _kw(recipes.softmax)),
    Recipe("transpose", ("rows", "cols"), "Y = X, row-major in, column-major out", recipes.transpose,
           _with_params_dict(recipes.transpose), overrides_dict=True,
           override_keys=tuple(recipes.copies.transpose_params(128, 128))),
    # cast's other override, "block", is a dict of extents per dim: Python API only
    Recipe("cast", ("rows", "cols"), "Y = dst(X) element by element", recipes.cast, _cast,
           dtype_help="src:dst element types (f32:bf16), or dst alone for a cast from f32",
           overrides_dict=True, override_keys=("thread",)),
)}

#: Named epilogues of the GEMM recipes (``--epilogue``).
EPILOGUES = recipes.EPILOGUES


def recipe(name: str) -> Recipe:
    """The recipe called ``name``; a CLIError lists the recipes otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise CLIError(f"no recipe named {name!r}; recipes: {', '.join(RECIPES)}") from None


def recipes_help() -> str:
    """One line per recipe: its name, shape arguments and summary (for --help)."""
    return "\n".join(f"  {r.name + ' ' + ' '.join(r.dims):<24} {r.summary}" for r in RECIPES.values())


def add_recipe_arguments(p: argparse.ArgumentParser, *, arch_default: str | None = "sm_90a") -> None:
    """The arguments that name a schedule: RECIPE SHAPE..., --dtype, --arch, -p, --epilogue."""
    p.add_argument("recipe", metavar="RECIPE", help="one of: " + ", ".join(RECIPES))
    p.add_argument("shape", metavar="DIM", nargs="*", help="the recipe's shape (e.g. M N K for gemm)")
    add_schedule_options(p, arch_default=arch_default)


def add_schedule_options(p: argparse.ArgumentParser, *, arch_default: str | None = "sm_90a") -> None:
    """--dtype, --arch, -p and --epilogue (for commands whose positional arguments differ)."""
    p.add_argument("--dtype", default=None, help="element type: f16 (default), bf16; cast: src:dst (f32:bf16)")
    default = arch_default or "the GPU's, else sm_90a"
    p.add_argument("--arch", default=arch_default, help=f"target (default {default}): sm_80, sm_90a, ...")
    p.add_argument("-p", "--param", dest="params", action="append", default=[], metavar="NAME=VALUE",
                   help="a keyword parameter of the recipe (repeatable), e.g. -p block_m=128 -p stages=3")
    p.add_argument("--epilogue", default=None, metavar="NAME",
                   help=f"GEMM epilogue ops by name: {', '.join(EPILOGUES)}")


_NAMED_SWIZZLES = {"SW32": SW32, "SW64": SW64, "SW128": SW128}
_SWIZZLE_RE = re.compile(r"^\s*(?:Sw<|Swizzle\()\s*(\d+)\s*,\s*(\d+)\s*,\s*(-?\d+)\s*[>)]\s*$", re.IGNORECASE)


def parse_swizzle(text: str) -> Swizzle | None:
    """``Sw<3,4,3>``, ``Swizzle(3,4,3)`` or SW32 / SW64 / SW128; None when ``text`` is none of these."""
    named = _NAMED_SWIZZLES.get(text.strip().upper())
    if named is not None:
        return named
    m = _SWIZZLE_RE.match(text)
    if m is None:
        return None
    return Swizzle(*(int(g) for g in m.groups()))


def parse_value(text: str) -> Any:
    """``-p`` values: ints, floats, true/false, none, otherwise the string itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _expected_types(param: inspect.Parameter) -> set[type] | None:
    """The simple types a parameter's annotation allows, or None when it says nothing usable."""
    ann = param.annotation
    if ann is inspect.Parameter.empty:
        ann = "" if param.default is inspect.Parameter.empty or param.default is None else type(param.default).__name__
    text = ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann))
    words = set(text.replace("|", " ").replace(",", " ").replace("[", " ").replace("]", " ").split())
    names = {"int": int, "float": float, "bool": bool, "str": str, "None": type(None)}
    if not words or not words <= set(names) | {"Optional"}:
        return None          # tuples, swizzles, ops: not settable from the command line
    out = {names[w] for w in words if w in names}
    if float in out:
        out.add(int)         # 1 is a fine float
    return out


def parse_params(rec: Recipe, items: list[str]) -> dict[str, Any]:
    """``["block_m=128", ...]`` -> ``{"block_m": 128, ...}``, each name checked against the recipe."""
    allowed = rec.param_names()
    out: dict[str, Any] = {}
    for item in items:
        name, eq, raw = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise CLIError(f"-p {item!r}: write NAME=VALUE, e.g. -p block_m=128")
        if rec.overrides_dict:
            if rec.override_keys is not None and name not in rec.override_keys:
                raise CLIError(f"-p {name}: {rec.name} has no parameter {name!r} that the command line can set; "
                               f"parameters: {', '.join(rec.override_keys)}")
            sw = parse_swizzle(raw)
            out[name] = sw if sw is not None else parse_value(raw)     # the recipe checks the values
            continue
        if name not in allowed:
            raise CLIError(f"-p {name}: {rec.name} has no parameter {name!r}; parameters: {', '.join(allowed)}")
        if "Swizzle" in str(allowed[name].annotation):
            sw = parse_swizzle(raw)
            if sw is None and raw.strip().lower() != "none":
                raise CLIError(f"-p {name}={raw}: write a swizzle as Sw<3,3,3> (bits, base, shift on element "
                               "offsets) or none")
            out[name] = sw
            continue
        value = parse_value(raw)
        want = _expected_types(allowed[name])
        if want is None:
            raise CLIError(f"-p {name}: {rec.name}'s {name} ({allowed[name].annotation}) cannot be given on the "
                           "command line; use the Python API (firesched.recipes)")
        if type(value) not in want:
            kinds = " or ".join(sorted(t.__name__ if t is not type(None) else "none" for t in want))
            raise CLIError(f"-p {name}={raw}: {rec.name}'s {name} takes {kinds}")
        out[name] = value
    return out


def parse_shape(rec: Recipe, shape: list[str]) -> tuple[int, ...]:
    """The positional shape arguments as positive ints, one per dim of the recipe."""
    if len(shape) != len(rec.dims):
        got = " ".join(shape) or "nothing"
        raise CLIError(f"{rec.name} takes {len(rec.dims)} sizes ({' '.join(rec.dims)}), got {got}; "
                       f"e.g. {rec.name} {' '.join(['1024'] * len(rec.dims))}")
    out = []
    for d, s in zip(rec.dims, shape):
        try:
            v = int(s)
        except ValueError:
            raise CLIError(f"{rec.name}: {d}={s!r} is not an integer; sizes are positive integers") from None
        if v < 1:
            raise CLIError(f"{rec.name}: {d}={v}; sizes are positive integers (>= 1)")
        out.append(v)
    return tuple(out)


@attrs.frozen
class Built:
    """A schedule built from the command line, with what named it (for headings)."""

    recipe: Recipe
    shape: tuple[int, ...]
    dtype: str
    arch: str
    params: dict
    schedule: Schedule

    def describe(self) -> str:
        """``gemm 1024x1024x1024 f16 for sm_90a`` (with any -p parameters)."""
        ps = "".join(f" {k}={v}" for k, v in self.params.items() if k != "epilogue_ops")
        return f"{self.recipe.name} {'x'.join(map(str, self.shape))} {self.dtype} for {self.arch}{ps}"


def build_schedule(args: argparse.Namespace, *, check: bool = True) -> Built:
    """The schedule the command line names (``args``: from ``add_recipe_arguments``).

    ``check=False`` asks recipes that check while building (those with a ``check`` parameter)
    not to, so that ``firesched check`` can report the check itself.
    """
    rec = recipe(args.recipe)
    shape = parse_shape(rec, args.shape)
    params = parse_params(rec, args.params)
    if args.epilogue is not None:
        if "epilogue_ops" not in rec.param_names():
            raise CLIError(f"--epilogue: {rec.name} has no epilogue; the GEMM recipes (gemm, bmm) do")
        if args.epilogue not in EPILOGUES:
            raise CLIError(f"--epilogue {args.epilogue!r}: no such epilogue; epilogues: {', '.join(EPILOGUES)}")
        params["epilogue_ops"] = EPILOGUES[args.epilogue]
    kw = {"check": False} if not check and "check" in inspect.signature(rec.fn).parameters else {}
    dtype = args.dtype or ("f32:bf16" if rec.name == "cast" else "f16")
    sched = rec.build(shape, dtype, args.arch, params, **kw)
    return Built(rec, shape, dtype, args.arch, params, sched)
