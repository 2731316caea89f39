"""The library's version: what compiled kernels, tuned parameters and reports are keyed by."""

__version__ = "0.1.0"
