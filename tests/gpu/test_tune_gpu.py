"""The tuner on the GPU: it times real candidates, stores the winner, a second call and a second
process read it back, a corrupt entry is re-tuned; the Hopper split-K GEMM is correct and
bitwise the same run to run; random points of the space compute correctly."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import firesched as fs
from firesched import tuned
from firesched.recipes.gemm import GemmParams, tuning_problem

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_tune_times_stores_and_reads_back(cache):
    res = fs.tune("gemm", 512, 768, 1024, dtype="f16", arch="sm_90a", limit=6, rounds=3, progress=False)
    assert not res.from_cache and res.time_us > 0 and res.default_us and res.peer_us
    assert res.time_us <= res.default_us            # the default is a candidate
    assert not res.wrong
    assert sum(c.status == "timed" for c in res.candidates) >= 3
    again = fs.tune("gemm", 512, 768, 1024, dtype="f16", arch="sm_90a", limit=6, progress=False)
    assert again.from_cache and again.params == res.params and again.seconds < 0.05
    sched = fs.recipes.gemm(512, 768, 1024, "f16", "sm_90a", tuned=True)
    want = fs.recipes.gemm(512, 768, 1024, "f16", "sm_90a", **(res.params or {}))
    assert sched == want
    problem = tuning_problem(512, 768, 1024, "f16", "sm_90a")
    device = tuned.device_key()
    t0 = time.perf_counter()
    for _ in range(100):
        assert tuned.lookup(problem, device) is not None
    assert (time.perf_counter() - t0) / 100 < 1e-3       # a cached lookup under 1 ms


@pytest.mark.parametrize("M, layout", [(1, "RR"), (16, "RC"), (100, "RR")])
def test_tuning_a_short_m_whose_default_is_swapped(cache, M, layout):
    """The default of a short M computes Cᵀ = Bᵀ Aᵀ, whose MatMul has n in the m role: the tuner's
    inputs still take A as M x K and B as K x N (by C's dim names)."""
    assert "roles" in repr(fs.recipes.gemm(M, 1024, 512, "f16", "sm_90a", layout=layout).root.spec)
    res = fs.tune("gemm", M, 1024, 512, dtype="f16", arch="sm_90a", layout=layout, limit=4, rounds=3,
                  progress=False)
    assert not res.wrong and res.time_us > 0 and sum(c.status == "timed" for c in res.candidates) >= 2


def test_second_process_reuses_the_entry_and_a_corrupt_one_is_retuned(cache):
    fs.tune("gemm", 256, 512, 512, dtype="bf16", arch="sm_90a", limit=4, rounds=3, progress=False)
    code = ("import firesched as fs; r = fs.tune('gemm', 256, 512, 512, dtype='bf16', arch='sm_90a', limit=4, "
            "progress=False); print(r.from_cache)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "FIRESCHED_CACHE_DIR": str(cache)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
    (entry,) = (cache / "tuned").glob("*.json")
    entry.write_text('{"key": {"problem": 3}, "params": ')        # torn
    res = fs.tune("gemm", 256, 512, 512, dtype="bf16", arch="sm_90a", limit=4, rounds=3, progress=False)
    assert not res.from_cache
    assert fs.tune("gemm", 256, 512, 512, dtype="bf16", arch="sm_90a", progress=False).from_cache


@pytest.mark.parametrize("M, N, K, split", [(64, 256, 8192, 4), (100, 200, 3000, 3), (256, 128, 16384, 8)])
@pytest.mark.parametrize("epi", [(), (fs.ops.bias("bias"), fs.ops.relu())], ids=["plain", "bias_relu"])
def test_hopper_split_k_is_right_and_bitwise_reproducible(M, N, K, split, epi):
    p = GemmParams(atoms="sm90a", block_m=64, block_n=128, block_k=64, stages=4, split_k_blocks=split,
                   warp_specialized=True, persistent=True)
    k = fs.compile(fs.recipes.gemm(M, N, K, "f16", "sm_90a", params=p, epilogue_ops=epi), "sm_90a")
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    bias = torch.randn(N, device="cuda", dtype=torch.float16)
    extra = (bias,) if epi else ()
    c1 = torch.empty(M, N, device="cuda", dtype=torch.float16)
    c2 = torch.empty_like(c1)
    k(a, b, *extra, C=c1)
    for _ in range(3):
        k(a, b, *extra, C=c2)
        torch.cuda.synchronize()
        assert torch.equal(c1, c2)
    ref = a.float() @ b.float()
    if epi:
        ref = torch.relu(ref + bias.float())
    assert ((c1.float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("M, N, K", [(1, 1024, 4096), (100, 300, 700), (640, 512, 256)])
def test_points_of_the_space_compute_correctly(M, N, K):
    """The first points of both families' space (what the tuner times) against torch."""
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    ref = a.float() @ b.float()
    seen = set()
    for p in fs.recipes.gemm_space(M, N, K, "f16", "sm_90a", limit=10):
        seen.add(p.family)
        k = fs.compile(fs.recipes.gemm(M, N, K, "f16", "sm_90a", params=p), "sm_90a")
        assert k.spills == 0, p
        c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
        k(a, b, C=c)
        torch.cuda.synchronize()
        assert ((c.float() - ref).norm() / ref.norm()).item() < 1e-2, p
    assert seen


def test_the_tuners_check_finds_a_wrong_element():
    from firesched.testing.check import tolerance
    from firesched.tuner import _compare_on_gpu

    want = torch.randn(300, 200, device="cuda")
    got = want.half()
    assert _compare_on_gpu(torch, got, want, tolerance("f16")) is None
    got[17, 33] += 1.0
    why = _compare_on_gpu(torch, got, want, tolerance("f16"))
    assert why.startswith("1 of 60000 elements differ; worst at (17, 33)")
    got[0, 0] = float("nan")
    assert "non-finite" in _compare_on_gpu(torch, got, want, tolerance("f16"))


def test_tuning_a_large_problem_takes_under_a_minute(cache):
    res = fs.tune("gemm", 16384, 16384, 256, dtype="f16", arch="sm_90a", progress=False)
    assert res.seconds < 60 and not res.wrong, (res.seconds, res.wrong)
