"""Split-K workspaces belong to a stream, not to a compiled program: two streams launching the
same program at once must not share partial sums.  What runs without a GPU: the size a launch
needs, and that workspaces are kept apart by stream (the GPU test launches on several streams at
once: tests/gpu/test_splitk_streams_gpu.py)."""

from __future__ import annotations

import firesched as fs
from firesched.api import _stream_key
from firesched.recipes.gemm import GemmParams


def _split_k_program():
    p = GemmParams(block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2, stages=2, split_k_blocks=4)
    return fs.compile(fs.recipes.gemm(96, 80, 512, params=p, arch="sm_80"), "sm_80")


def test_workspace_bytes_is_what_the_partial_sums_take():
    k = _split_k_program()
    (ws,) = k.program.workspaces
    assert ws.size == 4 * 96 * 80                      # four f32 parts of C
    assert k.workspace_bytes == 4 * 96 * 80 * 4
    plain = fs.compile(fs.recipes.gemm(96, 80, 512, arch="sm_80"), "sm_80")
    assert plain.workspace_bytes == 0


def test_streams_are_kept_apart_by_handle():
    class TorchLike:                                   # what torch.cuda.Stream exposes
        cuda_stream = 0x1234

    assert _stream_key(None) == 0
    assert _stream_key(7) == 7
    assert _stream_key(TorchLike()) == 0x1234
    assert _stream_key(TorchLike()) != _stream_key(None)
