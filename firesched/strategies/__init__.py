"""Strategies: frozen values that refine the focus of a schedule; ``a >> b`` chains them."""

from .align import align
from .attention import online_softmax
from .base import Chain, Strategy
from .done import done, on_fragments
from .fused import part, place
from .fusion import epilogue, prologue
from .mapping import to, to_blocks, to_threads, to_warpgroups, to_warps
from .moves import auto_swizzle, move_to_regs, move_to_smem
from .partials import scale_partials
from .pipeline import pipeline
from .specialize import warp_specialize
from .split_k import split_k
from .stream_k import stream_k
from .tile import tile

__all__ = ["Strategy", "Chain", "tile", "to", "to_blocks", "to_warps", "to_threads", "to_warpgroups",
           "split_k", "stream_k", "move_to_smem", "move_to_regs", "pipeline", "warp_specialize", "epilogue", "prologue", "done",
           "auto_swizzle", "part", "place", "on_fragments", "online_softmax", "align", "scale_partials"]
