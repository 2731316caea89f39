"""Op-agnostic transforms over a launch: block order and tile schedulers (``blocks``), software
pipelines over one ring abstraction (``pipeline``), warp specialization into roles
(``specialize``)."""

from . import blocks, pipeline, specialize

__all__ = ["blocks", "pipeline", "specialize"]
