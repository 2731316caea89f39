"""A module compiled for an older architecture runs on a newer GPU through its PTX (the driver
compiles it when loading), and an sm_90a module is refused on any other GPU."""

from __future__ import annotations

import numpy as np
import pytest

import firesched as fs
from firesched.errors import LaunchError
from firesched.runtime import device_info, load_module

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def test_an_sm80_gemm_runs_through_its_ptx_on_a_newer_major():
    cc = device_info(0).compute_capability
    if cc[0] <= 8:
        pytest.skip(f"compute capability {cc[0]}.{cc[1]}: the sm_80 CUBIN itself runs here")
    sched = fs.recipes.gemm(256, 192, 128, arch="sm_80", epilogue_ops=(fs.ops.bias("bias"), fs.ops.relu()))
    k = fs.compile(sched, arch="sm_80")
    assert ".target sm_80" in k.ptx
    loaded = load_module(k.modules[0], 0)
    assert loaded.from_ptx
    g = torch.Generator().manual_seed(3)
    a = torch.randn(256, 128, generator=g).half().cuda()
    b = torch.randn(128, 192, generator=g).half().cuda()
    bias = torch.randn(192, generator=g).half().cuda()
    c = k(a, b, bias=bias)
    torch.cuda.synchronize()
    want = torch.relu(a.float() @ b.float() + bias.float())
    np.testing.assert_allclose(c.float().cpu().numpy(), want.cpu().numpy(), rtol=2e-2, atol=2e-2)


def test_cubin_bytes_alone_cannot_take_the_ptx_path():
    cc = device_info(0).compute_capability
    if cc[0] <= 8:
        pytest.skip("needs a GPU newer than sm_8x")
    m = fs.compile(fs.recipes.gemm(64, 64, 64, arch="sm_86"), arch="sm_86").modules[0]

    class Bare:                 # the CUBIN and its arch, without the PTX
        cubin, arch, ptx = m.cubin + b"\0" * 16, m.arch, ""

    with pytest.raises(LaunchError, match="carries no PTX"):
        load_module(Bare(), 0)


def test_sm90a_is_refused_elsewhere_and_loads_its_cubin_on_hopper():
    cc = device_info(0).compute_capability
    k = fs.compile(fs.recipes.gemm(128, 128, 64, arch="sm_90a"), arch="sm_90a")
    if cc != (9, 0):
        with pytest.raises(LaunchError, match="cannot JIT sm_90a PTX"):
            load_module(k.modules[0], 0)
        return
    assert not load_module(k.modules[0], 0).from_ptx
