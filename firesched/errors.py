"""The exceptions a user of firesched can see.

Every error names what was being done (the strategy, the spec, the kernel), the offending value,
the allowed values and what to change.  Internal invariants use ``InternalError`` so that a bug
in firesched is never mistaken for a mistake in the user's schedule.
"""

from __future__ import annotations


class FireschedError(Exception):
    """Base class of every error firesched raises on purpose."""


class ScheduleError(FireschedError, ValueError):
    """A strategy cannot refine a spec, or a schedule fails ``check()``.

    The message names the strategy, the spec, the offending field and value, the allowed values
    and what to change.
    """

    def __init__(self, message: str, *, strategy=None, spec=None, field: str | None = None,
                 value=None, allowed=None, fix: str | None = None):
        parts = []
        if strategy is not None:
            parts.append(f"strategy {strategy}")
        if spec is not None:
            parts.append(f"on spec {spec}")
        head = (" ".join(parts) + ": ") if parts else ""
        text = head + message
        if field is not None:
            text += f"\n  field: {field} = {value!r}"
        if allowed is not None:
            text += f"\n  allowed: {allowed}"
        if fix is not None:
            text += f"\n  fix: {fix}"
        super().__init__(text)
        self.strategy = strategy
        self.spec = spec
        self.field = field
        self.value = value
        self.allowed = allowed
        self.fix = fix


class CompileError(FireschedError):
    """NVRTC rejected generated CUDA; carries the compiler log and the offending source lines."""

    def __init__(self, message: str, *, log: str = "", source: str = ""):
        super().__init__(message)
        self.log = log
        self.source = source


class PerformanceWarning(UserWarning):
    """A schedule compiled, but to a kernel that will run slowly (it spills registers to local
    memory); the message names the kernel, the figures and what to change."""


class HazardError(FireschedError):
    """The CPU interpreter found a race, a read of in-flight async data, or an out-of-bounds access."""


class LaunchError(FireschedError, RuntimeError):
    """A compiled kernel could not be launched (no GPU, driver error)."""


class InternalError(FireschedError, RuntimeError):
    """A bug in firesched itself; please report it with the schedule that triggered it."""
