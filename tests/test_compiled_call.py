"""What a compiled program offers without a GPU: its PTX (kept in the kernel cache), how its
modules would load on each GPU (CUBIN, or PTX through the driver), calls by tensor name and their
errors; recipes taking a GemmParams; interpret/compile of a spec that was never scheduled."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import firesched as fs
from firesched.cuda import nvrtc
from firesched.errors import LaunchError, ScheduleError
from firesched.recipes import GemmParams
from firesched.runtime import load_plan


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def k80():
    sched = fs.recipes.gemm(128, 128, 64, arch="sm_80", epilogue_ops=(fs.ops.bias("bias"),))
    return fs.compile(sched, arch="sm_80", use_cache=False)


# --------------------------------------------------------------------------- PTX

def test_compile_produces_ptx(k80):
    ptx = k80.ptx
    assert ".target sm_80" in ptx
    assert f".visible .entry {k80.program.kernels[0].name}(" in ptx
    assert "mma.sync.aligned.m16n8k16" in ptx
    assert all(m.ptx == ptx for m in k80.modules)


def test_ptx_of_a_program_of_several_launches():
    sched = fs.recipes.gemm(128, 128, 256, arch="sm_80", split_k_blocks=2)
    k = fs.compile(sched, arch="sm_80", use_cache=False)
    assert len(k.modules) == 2
    for kern, m in zip(k.program.kernels, k.modules):
        assert f"// kernel {kern.name}\n{m.ptx}" in k.ptx
        assert ".target sm_80" in m.ptx


def test_the_cache_keeps_the_ptx(cache):
    src = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n'
    first = nvrtc.compile_cuda(src, arch="sm_80")
    (entry,) = (cache / "cubin").glob("*.cubin")
    cubin, meta = nvrtc._decode_entry(entry.read_bytes(), entry.stem)
    assert cubin == first.cubin and meta["ptx"] == first.ptx and ".target sm_80" in first.ptx
    hit = nvrtc.compile_cuda(src, arch="sm_80")
    assert hit.from_cache and hit.ptx == first.ptx


def test_an_entry_without_ptx_is_compiled_again(cache):
    src = 'extern "C" __global__ void thrice(float* x) { x[threadIdx.x] *= 3.0f; }\n'
    m = nvrtc.compile_cuda(src, arch="sm_86")
    key = nvrtc.cache_key(src, "sm_86", m.options, "firesched_kernel.cu")
    cubin, meta = nvrtc._read_entry(key)
    del meta["ptx"]
    nvrtc._write_entry(key, cubin, meta)
    again = nvrtc.compile_cuda(src, arch="sm_86")
    assert not again.from_cache and again.ptx == m.ptx
    assert nvrtc.compile_cuda(src, arch="sm_86").from_cache


# --------------------------------------------------------------------------- which image loads where

@pytest.mark.parametrize("arch, cc, want", [
    ("sm_80", (8, 0), "cubin"), ("sm_80", (8, 6), "cubin"), ("sm_86", (8, 9), "cubin"),
    ("sm_90a", (9, 0), "cubin"),
    ("sm_80", (9, 0), "ptx"), ("sm_89", (9, 0), "ptx"), ("sm_80", (10, 0), "ptx"), ("sm_89", (12, 0), "ptx"),
])
def test_load_plan(arch, cc, want):
    assert load_plan(arch, cc, has_ptx=True) == want


@pytest.mark.parametrize("arch, cc, ptx, words", [
    ("sm_90a", (10, 0), True, ["cannot JIT sm_90a PTX", "compute capability 9.0 only", "arch='sm_89'"]),
    ("sm_90a", (8, 0), True, ["cannot JIT sm_90a PTX", "arch='sm_80'"]),
    ("sm_86", (8, 0), True, ["older compute capability 8.0", "arch='sm_80'"]),
    ("sm_80", (9, 0), False, ["carries no PTX", "arch='sm_90a'"]),
])
def test_load_plan_refusals(arch, cc, ptx, words):
    with pytest.raises(LaunchError) as e:
        load_plan(arch, cc, has_ptx=ptx)
    for w in words:
        assert w in str(e.value)


def test_the_suggested_target_fits_the_gpu_shared_memory():
    with pytest.raises(LaunchError, match="arch='sm_80'"):
        load_plan("sm_90a", (10, 0), has_ptx=True, smem_optin=227 * 1024)


# --------------------------------------------------------------------------- calls by name

def test_arg_names(k80):
    assert k80.arg_names == ("A", "B", "bias", "C")
    assert k80.output_names == ("C",)


def test_bind_by_name_and_position(k80):
    a, b, v, c = object(), object(), object(), object()
    assert k80.bind((a, b), {"bias": v, "C": c}) == ([a, b, v, c], ())
    assert k80.bind((), {"B": b, "A": a, "bias": v}) == ([a, b, v, None], ("C",))
    assert k80.bind((a, b, v), {}) == ([a, b, v, None], ("C",))


@pytest.mark.parametrize("args, kwargs, words", [
    ((1, 2, 3, 4, 5), {}, ["at most 4 arrays (A, B, bias, C), got 5"]),
    ((1, 2), {"bais": 3}, ["unknown argument bais=", "allowed names: A, B, bias, C"]),
    ((1, 2), {"A": 3, "bias": 4}, ["argument A given twice"]),
    ((1,), {"C": 2}, ["missing input(s) B, bias", "fix: pass B=<array>"]),
])
def test_bind_errors(k80, args, kwargs, words):
    with pytest.raises(ValueError) as e:
        k80(*args, **kwargs)
    for w in words:
        assert w in str(e.value)


def test_outputs_are_allocated_only_for_torch_or_cupy_inputs(k80):
    arrays = [np.zeros((128, 64), np.float16), np.zeros((64, 128), np.float16), np.zeros(128, np.float16)]
    with pytest.raises(LaunchError, match="allocates outputs only when every input is a torch tensor or every input "
                                          "a CuPy array.*fix: pass C=<array>"):
        k80(*arrays)


# --------------------------------------------------------------------------- GemmParams

P = GemmParams(block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2, stages=2)


def test_gemm_takes_params():
    want = fs.recipes.gemm(128, 128, 64, "f16", "sm_80", atoms="sm80", block_m=64, block_n=64, block_k=32,
                           warps_m=2, warps_n=2, stages=2)
    assert fs.recipes.gemm(128, 128, 64, "f16", "sm_80", **P) == want      # a mapping of its family's fields
    assert fs.recipes.gemm(128, 128, 64, "f16", "sm_80", params=P) == want
    assert fs.recipes.gemm(128, 128, 64, P, arch="sm_80") == want          # positional, after the sizes
    assert fs.recipes.gemm(128, 128, 64, "f16", P) == fs.recipes.gemm(128, 128, 64, "f16", params=P)


def test_params_select_the_sm80_recipe_on_hopper():
    assert "mma_m16n8k16" in str(fs.recipes.gemm(128, 128, 64, arch="sm_90a", params=P))


def test_gemm_space_points_build_with_params():
    for p in fs.recipes.gemm_space(128, 128, 64, arch="sm_80", limit=3):
        assert fs.recipes.gemm(128, 128, 64, arch="sm_80", params=p).check("sm_80")


def test_params_for_the_hopper_recipe():
    hp = GemmParams(block_m=128, block_n=128, block_k=64, stages=3)
    s = fs.recipes.gemm(256, 256, 128, arch="sm_90a", atoms="sm90a", params=hp)
    assert "wgmma_m64n128k16" in str(s) and "pipelined(3 stages)" in str(s)
    with pytest.raises(ScheduleError, match="params.warps_m") as e:
        fs.recipes.gemm(256, 256, 128, arch="sm_90a", atoms="sm90a", params=attrs.evolve(hp, warps_m=4))
    assert e.value.fix


@pytest.mark.parametrize("call, field", [
    (lambda: fs.recipes.gemm(128, 128, 64, arch="sm_80", params=P, stages=3), "stages"),
    (lambda: fs.recipes.gemm(128, 128, 64, P, params=P), "params"),
    (lambda: fs.recipes.gemm(128, 128, 64, arch="sm_80", params={"block_m": 64}), "params"),
])
def test_params_errors(call, field):
    with pytest.raises(ScheduleError) as e:
        call()
    assert e.value.field == field and e.value.fix


def test_bmm_takes_params():
    s = fs.recipes.bmm(2, 128, 128, 64, arch="sm_80", params=P)
    assert s == fs.recipes.gemm(128, 128, 64, "f16", "sm_80", params=P, batch=2)


# --------------------------------------------------------------------------- unscheduled specs

@pytest.mark.parametrize("run", [
    lambda spec: fs.interpret(spec, np.zeros((64, 32)), np.zeros((32, 64))),
    lambda spec: fs.compile(spec, arch="sm_80"),
], ids=["interpret", "compile"])
def test_an_unscheduled_spec_is_a_schedule_error(run):
    spec = fs.MatMul.kernel(M=64, N=64, K=32, a="f16", b="f16", c="f16", acc="f32")
    with pytest.raises(ScheduleError, match="has not been scheduled") as e:
        run(spec)
    assert e.value.field == "schedule" and "spec.schedule(" in e.value.fix
