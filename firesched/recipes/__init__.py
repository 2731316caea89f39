"""Stock schedules built only from strategies."""

from . import tiles
from .bmm import bmm
from .copies import cast, transpose
from .gemm import EPILOGUES, GemmParams, gemm, gemm_sm90, gemm_space

__all__ = ["gemm", "gemm_sm90", "gemm_space", "bmm", "tiles", "GemmParams", "EPILOGUES", "transpose", "cast"]
