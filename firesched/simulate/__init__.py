"""The CPU interpreter of the kernel IR: every thread of a block in lockstep over numpy, with
races, reads of in-flight asynchronous data and out-of-bounds accesses reported as
``HazardError``."""

from .interp import describe, run_kernel, run_program

__all__ = ["describe", "run_kernel", "run_program"]
