"""Stock schedules built only from strategies."""

from .gemm import EPILOGUES, GemmParams, gemm, gemm_space

__all__ = ["gemm", "gemm_space", "GemmParams", "EPILOGUES"]
