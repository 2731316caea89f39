"""A schedule that compiles to a spilling kernel says so: ``fs.compile`` warns with a
``PerformanceWarning`` naming the kernel, its spill bytes and what to change.  Real NVRTC
compiles, no GPU needed."""

from __future__ import annotations

import re
import warnings

import pytest

import firesched as fs
from firesched import ops
from firesched.errors import PerformanceWarning


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A private kernel cache (and so a fresh entry in compile's per-process memo)."""
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(tmp_path / "fscache"))


def spilling_gemm():
    """64x64 warp tiles (128 f32 accumulators per thread) with a GELU on A's fragments and a
    residual + GELU epilogue: within check()'s register estimate, but ptxas (NVRTC 13, sm_80)
    runs out of its 255 registers and spills a few hundred bytes per thread."""
    return fs.recipes.gemm(512, 512, 512, dtype="f16", block_m=128, block_n=128, warps_m=2, warps_n=2,
                           epilogue_ops=(ops.residual("R"), ops.gelu()), prologue_ops=(ops.gelu(),), arch="sm_80")


def test_performance_warning_is_a_user_warning():
    assert issubclass(PerformanceWarning, UserWarning)
    assert fs.errors.PerformanceWarning is PerformanceWarning


def test_a_spilling_kernel_warns_with_its_name_spills_and_a_hint():
    sched = spilling_gemm()
    with pytest.warns(PerformanceWarning) as record:
        k = fs.compile(sched, arch="sm_80")
    (r,) = k.resources.values()
    assert r.spill_store_bytes > 0 and r.spill_load_bytes > 0 and k.spills > 0   # it really spills
    (w,) = [w for w in record if issubclass(w.category, PerformanceWarning)]
    msg = str(w.message)
    assert msg.startswith(f"kernel firesched_matmul spills registers (sm_80): {r.spill_store_bytes} bytes of "
                          f"spill stores and {r.spill_load_bytes} bytes of spill loads per thread, at "
                          f"{r.registers} registers")
    assert "smaller tiles" in msg and "fewer pipeline stages" in msg
    assert w.filename == __file__                   # it points at the fs.compile call
    # asked again (the per-process memo answers), it says so again
    with pytest.warns(PerformanceWarning, match=re.escape(f"{r.spill_store_bytes} bytes of spill stores")):
        assert fs.compile(sched, arch="sm_80") is k


def test_a_kernel_that_does_not_spill_does_not_warn():
    sched = fs.recipes.gemm(256, 256, 256, dtype="f16", arch="sm_80")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        k = fs.compile(sched, arch="sm_80")
    assert k.spills == 0
