"""The CUDA back end: the printer of the kernel IR as self-contained CUDA C++ with inline PTX
(``printer``) and the NVRTC driver with its on-disk cubin cache (``nvrtc``)."""

from . import nvrtc, printer
from .printer import PRELUDE, c_type, emit, emit_kernel, required_arch

__all__ = ["nvrtc", "printer", "PRELUDE", "c_type", "emit", "emit_kernel", "required_arch"]
