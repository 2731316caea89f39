"""``firesched.tune``: search a recipe's parameter space on the GPU and keep the winner on disk.

    res = firesched.tune("gemm", 4096, 4096, 4096, dtype="bf16")      # about half a minute
    res.params, res.time_us, res.speedup_default                       # what it found
    sched = fs.recipes.gemm(4096, 4096, 4096, dtype="bf16", tuned=True)  # reads it back (< 1 ms)

What a tuning run does, in order:

1. **Look up** the problem in the tuned store (``firesched.tuned``, keyed by problem, device,
   driver and library version); a hit returns at once unless ``force=True``.
2. **Enumerate** the first ``limit`` points of the recipe's space (``recipes.gemm_space``: both
   atom families on sm_90a, pruned by O(1) rules, ordered by the tile model), plus the
   parameters the recipe takes by default (so the tuned choice is never slower than it).
3. **Compile in parallel processes** (NVRTC needs no GPU; the kernel cache carries the CUBINs
   back), with a ``tqdm`` progress bar.  Candidates that spill registers or fail to compile are
   skipped, with the reason kept.
4. **Check** each remaining candidate against a reference on random inputs (the product in
   float32 by torch, the epilogue in numpy) before it is timed; a wrong one is skipped and
   reported (``TuneResult.wrong``: that is a bug, never a tuning choice).
5. **Time** them interleaved (``firesched.timing.interleaved``: CUDA graphs, inputs rotated
   past L2, the median of rounds), together with the peer (``torch.matmul``) for the record,
   and **store** the fastest.
"""

from __future__ import annotations

import os
import time

import attrs

from . import api, recipes, runtime, timing, tuned
from .errors import ScheduleError
from .hardware.target import target as get_target
from .recipes.gemm import GemmParams, params_from_json, tuning_problem
from .testing.check import tolerance
from .testing.reference import epilogue_reference, extra_inputs

#: recipes ``tune`` knows how to search
TUNABLE = ("gemm",)


@attrs.frozen
class Candidate:
    """One point tried: its parameters (None: the recipe's default), what became of it
    (``"timed"``, ``"spills N bytes"``, ``"does not compile: ..."``, ``"wrong: ..."``) and its
    time in microseconds where it was timed."""

    params: GemmParams | None
    status: str
    time_us: float | None = None


@attrs.frozen
class TuneResult:
    """What ``tune`` found: the fastest ``params`` (None: the recipe's default was fastest), its
    ``time_us``, the default's ``default_us`` and the peer's ``peer_us`` (``torch.matmul``, timed
    with them), every ``candidates``' fate, ``from_cache`` (a stored entry, nothing timed now)
    and the run's wall ``seconds``."""

    problem: dict
    params: GemmParams | None
    time_us: float
    default_us: float | None
    peer_us: float | None
    candidates: tuple[Candidate, ...] = ()
    from_cache: bool = False
    seconds: float = 0.0

    @property
    def speedup_default(self) -> float | None:
        """The default's time over the tuned time (>= 1: the default is a candidate)."""
        return self.default_us / self.time_us if self.default_us else None

    @property
    def ratio_peer(self) -> float | None:
        """The peer's time over the tuned time (> 1: faster than ``torch.matmul``)."""
        return self.peer_us / self.time_us if self.peer_us else None

    @property
    def wrong(self) -> tuple[Candidate, ...]:
        """Candidates whose results differed from the reference (each one a bug to report)."""
        return tuple(c for c in self.candidates if c.status.startswith("wrong"))


def _build(task: tuple, params: GemmParams | None, check: bool = True):
    (M, N, K, dtype, arch, kw) = task
    if params is None:
        return recipes.gemm(M, N, K, dtype, arch, check=check, **kw)
    return recipes.gemm(M, N, K, dtype, arch, params=params, check=check, **kw)


def _compile_one(job):
    """In a worker process: build and compile one candidate; (spill bytes, error or None)."""
    task, params = job
    try:
        k = api.compile(_build(task, params), arch=task[4])
        return k.spills, None
    except Exception as e:          # a candidate that fails is skipped with its reason, never fatal
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def compile_jobs(jobs: list, workers: int | None = None, progress: bool = True) -> list:
    """Build and compile GEMM schedules in ``workers`` parallel processes (None: the CPU count),
    each job ``((M, N, K, dtype, arch, kwargs), params)`` (params None: the recipe's default),
    so that a later ``api.compile`` of the same schedule is a kernel-cache hit.  Returns per job
    ``(spill bytes, None)`` or ``(None, why it failed)``."""
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    return _compile_all(jobs, workers, progress)


def _compile_all(jobs, workers: int, progress: bool) -> list:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    try:
        from tqdm.auto import tqdm
    except ImportError:             # a dependency, but an environment may lack it: tune without a bar
        progress = False

        def tqdm(**kw):
            return _NoBar()

    bar = tqdm(total=len(jobs), desc="tune: compile", unit="kernel", disable=not progress, leave=False)
    out: list = [None] * len(jobs)
    if workers <= 1:
        for i, j in enumerate(jobs):
            out[i] = _compile_one(j)
            bar.update()
    else:
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        # spawn: the parent may hold a CUDA context, which a forked child must not inherit
        try:
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as ex:
                futures = {ex.submit(_compile_one, j): i for i, j in enumerate(jobs)}
                for f in as_completed(futures):
                    out[futures[f]] = f.result()
                    bar.update()
        except BrokenProcessPool:
            # a main module spawn cannot re-import (a script read from stdin): compile the rest here
            import warnings

            warnings.warn("firesched.tune: worker processes could not start (is __main__ a file?); "
                          "compiling in this process", stacklevel=3)
            for i, j in enumerate(jobs):
                if out[i] is None:
                    out[i] = _compile_one(j)
                    bar.update()
    bar.close()
    return out


class _NoBar:
    """What ``_compile_all`` uses where tqdm cannot be imported: a bar that shows nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _inputs(torch, sched, layout: str, sets: int, seed: int):
    """``sets`` copies of random inputs for a GEMM schedule (A, B in ``layout``, then the extra
    tensors its ops read), as torch CUDA tensors, and the host copy of the first set."""
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}
    spec = sched.spec
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a_dt = tdt[spec.operand("A").tensor.dtype.name]
    # by C's dim names, not the MatMul's roles: a swapped schedule (Cᵀ = Bᵀ Aᵀ) has n in the m role
    ext = {d: e for name in ("A", "B") for d, e in zip(spec.operand(name).tensor.dims,
                                                         spec.operand(name).tensor.shape)}
    M, N, K = ext["m"], ext["n"], ext["k"]
    out = []
    for _ in range(sets):
        a = torch.randn((M, K) if layout[0] == "R" else (K, M), device="cuda", generator=gen).to(a_dt)
        b = torch.randn((K, N) if layout[1] == "R" else (N, K), device="cuda", generator=gen).to(a_dt)
        a = a if layout[0] == "R" else a.t()
        b = b if layout[1] == "R" else b.t()
        extras = [torch.randn(shape, device="cuda", generator=gen).to(a_dt) for _, shape in extra_inputs(sched)]
        out.append((a, b, extras))
    return out


def _compare_on_gpu(torch, got, want, tol) -> str | None:
    """``testing.check.compare`` on the GPU (a large result is not copied to the host once per
    candidate): None when every element is within ``tol``, else what differs."""
    got = got.float()
    if not bool(torch.isfinite(got).all()):
        return f"non-finite values in the result ({int((~torch.isfinite(got)).sum())} of {got.numel()})"
    scale = max(1.0, float(want.abs().max()))
    allowed = tol.atol * scale + tol.rtol * want.abs()
    over = (got - want).abs() - allowed
    bad = int((over > 0).sum())
    if not bad:
        return None
    i = int(torch.argmax(over))
    r, col = divmod(i, got.shape[-1])
    return (f"{bad} of {got.numel()} elements differ; worst at ({r}, {col}): got {float(got[r, col]):.6g}, "
            f"want {float(want[r, col]):.6g} (allowed error {float(allowed[r, col]):.3g})")


def tune(recipe: str, M: int, N: int, K: int, *, dtype: str = "f16", arch: str | None = None,
         out_dtype: str | None = None, layout: str = "RR", epilogue_ops: tuple = (), limit: int = 24,
         workers: int | None = None, rounds: int = 10, force: bool = False, progress: bool = True,
         peer: bool = True) -> TuneResult:
    """Tune ``recipe`` (``"gemm"``) for one problem on the current GPU and store the winner,
    which ``recipes.gemm(..., tuned=True)`` then takes.  See the module docstring for the steps.

    ``limit`` is how many points of the space are compiled (the tile model's most promising
    first; the default parameters always join them), ``workers`` the compiling processes (None:
    the CPU count), ``rounds`` the interleaved timing rounds, ``force`` re-tunes a stored
    problem, ``progress`` shows ``tqdm`` bars, ``peer`` times ``torch.matmul`` alongside.
    Needs torch with a CUDA GPU (``RuntimeError`` otherwise)."""
    start = time.perf_counter()
    if recipe not in TUNABLE and getattr(recipe, "__name__", None) not in TUNABLE:
        raise ValueError(f"tune: recipe {recipe!r} cannot be tuned; allowed: {', '.join(TUNABLE)}")
    if limit < 1 or rounds < 1:
        raise ValueError(f"tune: limit={limit}, rounds={rounds}; each must be at least 1")
    torch = timing._torch()
    try:
        arch = get_target(arch).name
    except ValueError as e:
        raise ScheduleError(str(e), field="arch", value=arch, fix="pass arch='sm_90a', or None for the GPU present") \
            from None
    kw = dict(out_dtype=out_dtype, layout=layout, epilogue_ops=tuple(epilogue_ops))
    problem = tuning_problem(M, N, K, dtype, arch, **kw)
    device = tuned.device_key(runtime.current_device())
    if not force:
        entry = tuned.lookup(problem, device)
        if entry is not None:
            try:
                params = params_from_json(entry["params"]) if entry["params"] else None   # {}: the default
                return TuneResult(problem, params, float(entry["time_us"]), entry.get("default_us"),
                                  entry.get("peer_us"), from_cache=True, seconds=time.perf_counter() - start)
            except (KeyError, TypeError, ValueError):
                pass                       # a stored entry of another shape: tune again
    task = (M, N, K, dtype, arch, kw)
    _build(task, None)                     # the problem itself is valid (a ScheduleError otherwise)
    points = [None] + [p for p in recipes.gemm_space(M, N, K, dtype, arch, layout=layout,
                                                     epilogue_ops=tuple(epilogue_ops), limit=limit)]
    workers = workers or min(len(points), os.cpu_count() or 1)
    compiled = _compile_all([(task, p) for p in points], workers, progress)

    cands: dict[int, Candidate] = {}
    kernels = {}
    for i, (p, (spills, err)) in enumerate(zip(points, compiled)):
        if err is not None:
            cands[i] = Candidate(p, f"does not compile: {err}")
        elif spills:
            cands[i] = Candidate(p, f"spills {spills} bytes")
        else:
            kernels[i] = api.compile(_build(task, p, check=False), arch=arch)     # a kernel-cache hit
    if not kernels:
        raise ScheduleError(f"tune: no candidate of gemm {M}x{N}x{K} compiled without spills",
                            field="limit", value=limit, allowed="a larger limit",
                            fix="tune(..., limit=<more>) or report this problem")

    ref_sched = _build(task, None)
    bytes_per_set = (M * K + K * N + M * N) * 2
    sets = _inputs(torch, ref_sched, layout, timing.copies(bytes_per_set), seed=0)
    out_dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[problem["out_dtype"]]
    c = torch.empty(M, N, device="cuda", dtype=out_dt)
    a0, b0, x0 = sets[0]
    product = a0.float() @ b0.float()
    if epilogue_ops:
        host = epilogue_reference(ref_sched, product.double().cpu().numpy(), *[x.double().cpu().numpy() for x in x0])
        want = torch.from_numpy(host.astype("float32")).cuda()
    else:
        want = product.to(out_dt).float()
    tol = tolerance(problem["out_dtype"])
    fns = {}
    for i, k in kernels.items():
        k.prepare(torch.cuda.current_device())
        c.fill_(float("nan"))
        k(a0, b0, *x0, C=c)
        torch.cuda.synchronize()
        why = _compare_on_gpu(torch, c, want, tol)
        if why is not None:
            cands[i] = Candidate(points[i], f"wrong: {why}")
            continue
        fns[i] = (lambda j, k=k: k(sets[j % len(sets)][0], sets[j % len(sets)][1], *sets[j % len(sets)][2], C=c))
    if not fns:
        raise ScheduleError(f"tune: every candidate of gemm {M}x{N}x{K} computed a wrong result", field="recipe",
                            value=recipe, fix="report this problem: a schedule that checks must compute correctly")
    named = {f"c{i}": f for i, f in fns.items()}
    if peer:
        named["peer"] = lambda j: torch.matmul(sets[j % len(sets)][0], sets[j % len(sets)][1])
    us = timing.interleaved(named, rounds=rounds)
    for i in fns:
        cands[i] = Candidate(points[i], "timed", us[f"c{i}"])
    best = min(fns, key=lambda i: us[f"c{i}"])
    default_us = us["c0"] if 0 in fns else None
    peer_us = us.get("peer")
    result = TuneResult(problem, points[best], us[f"c{best}"], default_us, peer_us,
                        tuple(cands[i] for i in sorted(cands)), False, time.perf_counter() - start)
    tuned.store(problem, device, dict(points[best]) if points[best] is not None else {},
                time_us=result.time_us, default_us=default_us, peer_us=peer_us, candidates=len(points),
                timed=len(fns))
    return result
