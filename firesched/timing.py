"""Interleaved GPU timing: several callables measured in turn, in one process, on torch streams.

How every figure firesched reports is taken (the tuner, ``bench/``): each callable's ``reps``
calls are captured once in a CUDA graph, so a microsecond kernel is not timed as its launch
overhead; the graphs then replay in turn, round after round (ours, peer, ours, peer, ...), so
clock and thermal drift hit every candidate alike; each callable's time is the median over
rounds.  Callables take the call index ``i`` so that they can rotate among copies of their
inputs (``copies``), which keeps a small problem's operands from being served out of L2::

    from firesched import timing
    us = timing.interleaved({"ours": lambda i: k(a[i % n], b[i % n], c),
                             "cublas": lambda i: torch.matmul(a[i % n], b[i % n])})
    us["cublas"] / us["ours"]          # the ratio we report

torch is imported on the first call (it is optional for the library, needed here).
"""

from __future__ import annotations

import math
from typing import Callable

#: bytes of L2 on the largest GPU we time on (an H100 has 50 MiB): inputs rotate past twice this
L2_BYTES = 50 * 2 ** 20


def copies(bytes_per_set: int, *, l2_bytes: int = L2_BYTES, most: int = 16) -> int:
    """How many copies of a problem's inputs to rotate among so that consecutive calls read
    memory that is not in L2 (together more than twice the L2); at least 1, at most ``most``."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(most, math.ceil(2 * l2_bytes / bytes_per_set)))


def _torch():
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(f"firesched.timing needs torch with CUDA ({e}); pip install torch") from None
    if not torch.cuda.is_available():
        raise RuntimeError("firesched.timing needs a CUDA GPU; torch.cuda.is_available() is False")
    return torch


def graphed(fn: Callable[[int], None], reps: int) -> Callable[[], None]:
    """A function replaying a CUDA graph of ``fn(0), ..., fn(reps - 1)`` (warmed up twice on a
    side stream first, as capture requires)."""
    torch = _torch()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(2):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(i)
    return g.replay


def _event_us(torch, replay, reps: int) -> float:
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / reps


def reps_for(fn: Callable[[int], None], *, sample_us: float = 2000.0, most: int = 200) -> int:
    """Calls per timed sample so that one sample lasts about ``sample_us`` (from one graph of
    three calls), 1 to ``most``."""
    torch = _torch()
    replay = graphed(fn, 3)
    replay()
    torch.cuda.synchronize()
    one = min(_event_us(torch, replay, 3) for _ in range(3))
    return max(1, min(most, round(sample_us / max(one, 1e-3))))


def interleaved(fns: dict[str, Callable[[int], None]], *, reps: int | dict | None = None, rounds: int = 15,
                sample_us: float = 2000.0) -> dict[str, float]:
    """Microseconds per call of each of ``fns`` (name -> ``fn(i)``), timed interleaved.

    Each is captured as a CUDA graph of ``reps`` calls (an int, a dict by name, or None: enough
    for about ``sample_us`` per sample, ``reps_for``); every round replays the graphs in turn,
    each between two CUDA events; the result is the median over ``rounds``."""
    if rounds < 1:
        raise ValueError(f"interleaved: rounds={rounds}; allowed: 1 or more")
    torch = _torch()
    counts = {n: (reps.get(n) if isinstance(reps, dict) else reps) or reps_for(f, sample_us=sample_us)
              for n, f in fns.items()}
    replays = {n: graphed(f, counts[n]) for n, f in fns.items()}
    for r in replays.values():
        r()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(rounds):
        for name, replay in replays.items():
            times[name].append(_event_us(torch, replay, counts[name]))
    return {n: sorted(t)[len(t) // 2] for n, t in times.items()}
