"""The default target (arch=None everywhere), the Ampere-family targets sm_86 / sm_89, the one list
of targets in errors, and sm_70 as an interpreter-only target."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import firesched as fs
from firesched.errors import CompileError, ScheduleError
from firesched.hardware import SM70, SM80, SM86, SM89, SM90A, catalog, sm80, sm90a
from firesched.hardware.target import (
    default_target,
    detected_target,
    target,
    target_for_capability,
    target_names,
)

target_mod = sys.modules["firesched.hardware.target"]   # the package re-exports the function target()


@pytest.fixture
def gpu(monkeypatch):
    """Pretend the GPU present is of a given target (``gpu(SM80)``); FIRESCHED_ARCH unset."""
    monkeypatch.delenv("FIRESCHED_ARCH", raising=False)

    def set_(tgt):
        monkeypatch.setattr(target_mod, "detected_target", lambda: tgt)

    return set_


# --------------------------------------------------------------------------- the default rule

def test_no_gpu_means_sm90a(gpu):
    gpu(None)
    assert default_target() is SM90A
    assert target(None) is SM90A


@pytest.mark.parametrize("tgt", [SM80, SM86, SM89, SM90A])
def test_the_gpu_present_is_the_default(gpu, tgt):
    gpu(tgt)
    assert default_target() is tgt


def test_the_environment_overrides_the_gpu(gpu, monkeypatch):
    gpu(SM90A)
    monkeypatch.setenv("FIRESCHED_ARCH", "sm86")
    assert default_target() is SM86
    monkeypatch.setenv("FIRESCHED_ARCH", "sm_75")
    with pytest.raises(ValueError, match=r"\$FIRESCHED_ARCH='sm_75'.*allowed: sm_70 \(interpret only\), sm_80"):
        default_target()


@pytest.mark.parametrize("cc, smem, want", [
    ((8, 0), None, "sm_80"), ((8, 6), None, "sm_86"), ((8, 7), None, "sm_86"), ((8, 9), None, "sm_89"),
    ((9, 0), None, "sm_90a"), ((7, 0), None, "sm_70"), ((7, 5), None, "sm_70"),
    # newer than every target: the portable target with the most shared memory that fits the GPU
    ((10, 0), 227 * 1024, "sm_80"), ((12, 0), 99 * 1024, "sm_89"), ((12, 0), None, "sm_89"),
])
def test_compute_capability_to_target(cc, smem, want):
    assert target_for_capability(*cc, smem).name == want


def test_older_than_every_target():
    with pytest.raises(ValueError, match="compute capability 6.1 is older than every target"):
        target_for_capability(6, 1)


def test_detecting_the_gpu_never_fails(monkeypatch):
    """No driver (an exception) or a failing cuInit is "no GPU", not an error."""
    from cuda.bindings import driver

    probe = detected_target.__wrapped__

    def boom(flags):
        raise RuntimeError("no libcuda.so")

    monkeypatch.setattr(driver, "cuInit", boom)
    assert probe() is None
    monkeypatch.setattr(driver, "cuInit", lambda flags: (driver.CUresult.CUDA_ERROR_NO_DEVICE,))
    assert probe() is None


def test_detecting_the_gpu_is_cached():
    assert detected_target() is detected_target()
    assert detected_target.cache_info().currsize == 1


# --------------------------------------------------------------------------- arch=None everywhere

def test_gemm_builds_the_schedule_of_the_gpu_present(gpu):
    gpu(SM80)
    assert "wgmma" not in str(fs.recipes.gemm(256, 256, 256))
    gpu(None)
    assert "wgmma" in str(fs.recipes.gemm(256, 256, 256))


def test_compile_takes_the_default_target(gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(tmp_path))
    gpu(SM86)
    sched = fs.recipes.gemm(64, 64, 32, block_m=64, block_n=64, stages=2)
    k = fs.compile(sched)
    assert k.arch == "sm_86"
    assert ".target sm_86" in k.ptx


def test_check_without_a_target_uses_the_default(gpu):
    """A schedule needing 131 KiB of shared memory fits the default sm_80 but not sm_86 / sm_89."""
    big = fs.recipes.gemm(256, 256, 256, arch="sm_80", block_m=128, block_n=128, block_k=64, stages=4, check=False)
    gpu(SM80)
    assert big.check() is big
    for tgt in (SM86, SM89):
        gpu(tgt)
        with pytest.raises(ScheduleError, match="shared memory over the target's limit"):
            big.check()


@pytest.mark.parametrize("build", [
    lambda: fs.recipes.bmm(2, 64, 64, 64),
    lambda: fs.recipes.transpose(64, 64),
    lambda: fs.recipes.cast((64, 64)),
    lambda: fs.recipes.rmsnorm(8, 256),
    lambda: fs.recipes.softmax(8, 256),
], ids=["bmm", "transpose", "cast", "rmsnorm", "softmax"])
def test_every_recipe_takes_arch_none(gpu, build):
    gpu(SM86)
    sched = build()
    assert isinstance(sched, fs.Schedule)
    assert sched.check() is sched


# --------------------------------------------------------------------------- sm_86 / sm_89

def test_ampere_family_order():
    assert SM80.rank < SM86.rank < SM89.rank < SM90A.rank
    for atom in (sm80.mma_m16n8k16_f16_f32, sm80.cp_async_16, sm80.ldmatrix_x4):
        assert SM86.supports(atom) and SM89.supports(atom)
    assert not SM86.supports(sm90a.tma_load_2d) and not SM89.supports(sm90a.wgmma_m64n128k16_f16_f32_ss_tnspb)
    assert catalog.for_target("sm_86") == catalog.for_target("sm_80")


def test_sm80_gemm_compiles_for_sm86_and_sm89(tmp_path, monkeypatch):
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(tmp_path))
    sched = fs.recipes.gemm(128, 128, 64, arch="sm_89")
    assert "mma_m16n8k16" in str(sched)
    for arch in ("sm_86", "sm_89"):
        k = fs.compile(sched, arch=arch)
        assert k.arch == arch and k.modules[0].cubin[:4] == b"\x7fELF"


# --------------------------------------------------------------------------- one list of targets

@pytest.mark.parametrize("call", [
    lambda: fs.recipes.gemm(64, 64, 64, arch="sm_75"),
    lambda: fs.recipes.bmm(2, 64, 64, 64, arch="sm_75"),
    lambda: fs.recipes.transpose(64, 64, arch="sm_75"),
    lambda: fs.recipes.gemm(64, 64, 64, arch="sm_80").check("sm_75"),
    lambda: fs.compile(fs.recipes.gemm(64, 64, 64, arch="sm_80"), arch="sm_75"),
], ids=["gemm", "bmm", "transpose", "check", "compile"])
def test_errors_list_the_targets(call):
    with pytest.raises(ValueError) as e:
        call()
    assert "sm_80, sm_86, sm_89, sm_90a" in str(e.value)
    assert "fix:" in str(e.value)


def test_row_recipes_list_the_targets_from_sm80():
    with pytest.raises(ValueError, match=r"allowed: sm_80, sm_86, sm_89, sm_90a, or None"):
        fs.recipes.rmsnorm(8, 256, arch="sm_70")


def test_target_names():
    assert target_names() == "sm_70 (interpret only), sm_80, sm_86, sm_89, sm_90a"
    assert target_names(compiled=True) == "sm_80, sm_86, sm_89, sm_90a"
    assert target_names(since="sm_89") == "sm_89, sm_90a"


# --------------------------------------------------------------------------- sm_70: interpreter only

def test_sm70_compiles_to_a_one_line_error_and_interprets():
    sched = fs.recipes.cast((64,), "f32", "f16", arch="sm_70")
    assert not SM70.compiles
    with pytest.raises(CompileError) as e:
        fs.compile(sched, arch="sm_70")
    msg = str(e.value)
    assert "\n" not in msg
    assert "cannot build sm_70" in msg and "firesched.interpret" in msg
    x = np.linspace(-2, 2, 64).astype(np.float32)
    np.testing.assert_array_equal(fs.interpret(sched, x, target="sm_70"), x.astype(np.float16))
