"""Op-agnostic transforms over a launch: block order and tile schedulers (``blocks``), software
pipelines over one ring abstraction (``pipeline``) and in registers (``register_ring``), warp
specialization into roles (``specialize``)."""

from . import blocks, pipeline, register_ring, specialize

__all__ = ["blocks", "pipeline", "register_ring", "specialize"]
