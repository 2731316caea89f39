"""Stock schedules built only from strategies."""

from . import rows, tiles
from .bmm import bmm
from .copies import cast, transpose
from .fmha import FmhaParams, fmha
from .fmha import plan as fmha_plan
from .gemm import EPILOGUES, GemmParams, gemm, gemm_sm90, gemm_space
from .norms import add_rmsnorm, layernorm, rmsnorm
from .softmax import softmax
from .w4a16 import W4A16Params, W4A16WgmmaParams, gemm_w4a16, pack_weights

__all__ = ["gemm", "gemm_sm90", "gemm_space", "bmm", "tiles", "GemmParams", "EPILOGUES", "transpose", "cast",
           "rows", "rmsnorm", "layernorm", "add_rmsnorm", "softmax", "fmha", "FmhaParams", "fmha_plan",
           "gemm_w4a16", "W4A16Params", "W4A16WgmmaParams", "pack_weights"]
