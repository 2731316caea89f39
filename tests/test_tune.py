"""The GEMM parameter space (both atom families), the tuned-parameters store and the parts of the
tuner that run without a GPU: parallel compiles, ``recipes.gemm(tuned=True)``'s read path."""

from __future__ import annotations

import json
import multiprocessing
import time
import warnings

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import firesched as fs
from firesched import runtime, tuned
from firesched.errors import PerformanceWarning, ScheduleError
from firesched.hardware.target import target as get_target
from firesched.recipes.gemm import GemmParams, gemm_space, params_from_json, tuning_problem
from firesched.testing.check import assert_schedule_correct
from firesched.tuner import compile_jobs

DEVICE = {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "sms": 132, "driver": 13000}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(tmp_path))
    return tmp_path


# --------------------------------------------------------------------------- GemmParams


def test_params_are_a_mapping_of_their_family():
    p = GemmParams(atoms="sm90a", block_m=128, block_n=256, block_k=64, stages=4, split_k_blocks=2,
                   warp_specialized=True, persistent=False)
    assert set(p) == {"atoms", "block_m", "block_n", "block_k", "stages", "group_m", "split_k_blocks",
                      "warp_specialized", "persistent", "cluster", "cluster_along", "stream_k_parts", "swap_ab",
                      "split_k_fixup"}
    assert fs.recipes.gemm(256, 512, 1024, "f16", "sm_90a", **p) == \
        fs.recipes.gemm(256, 512, 1024, "f16", "sm_90a", params=p)
    q = GemmParams(block_m=64, block_n=64)
    assert q.family == "sm80" and "warps_m" in q and "cluster" not in q.keys()
    assert eval(repr(p), {"GemmParams": GemmParams, "Swizzle": fs.Swizzle}) == p


@pytest.mark.parametrize("p, field", [
    (GemmParams(atoms="sm90a", warps_m=4), "params.warps_m"),
    (GemmParams(atoms="sm80", cluster=2), "params.cluster"),
    (GemmParams(atoms="sm90a", split_k_blocks=0), "split_k_blocks"),
])
def test_params_of_the_wrong_family_are_refused(p, field):
    with pytest.raises(ScheduleError) as e:
        fs.recipes.gemm(256, 256, 256, "f16", "sm_90a", params=p)
    assert e.value.field == field


def test_atoms_given_twice_differently():
    with pytest.raises(ScheduleError, match="atoms"):
        fs.recipes.gemm(256, 256, 256, "f16", "sm_90a", params=GemmParams(atoms="sm90a"), atoms="sm80")


# --------------------------------------------------------------------------- the space


def test_space_has_both_families_on_hopper_and_one_on_ampere():
    hopper = list(gemm_space(512, 512, 4096, "f16", "sm_90a", limit=80))
    assert {p.family for p in hopper} == {"sm80", "sm90a"}
    assert any(p.split_k_blocks > 1 and p.family == "sm90a" for p in hopper)
    assert {p.family for p in gemm_space(512, 512, 4096, "f16", "sm_80", limit=30)} == {"sm80"}
    with pytest.raises(ScheduleError, match="atom family"):
        list(gemm_space(512, 512, 512, "f16", "sm_80", atoms="sm90a"))


def test_space_is_fast_to_its_first_points():
    t = time.perf_counter()
    pts = list(gemm_space(8192, 8192, 8192, "bf16", "sm_90a", limit=24))
    assert len(pts) == 24 and time.perf_counter() - t < 5
    assert pts[0].family == "sm90a"          # the tile model's favourite on a large problem


def test_space_prunes_tiles_larger_than_the_problem():
    for p in gemm_space(1, 4096, 4096, "f16", "sm_90a", limit=60):
        assert p.block_m <= 64


def test_space_takes_the_layout_and_epilogue():
    pts = list(gemm_space(256, 256, 256, "f16", "sm_90a", layout="CR", limit=20))
    assert pts and all(p.family == "sm80" for p in pts)     # the Hopper family wants a row-major A
    epi = (fs.ops.bias("bias"), fs.ops.relu())
    for p in gemm_space(192, 320, 256, "f16", "sm_90a", epilogue_ops=epi, limit=4):
        fs.recipes.gemm(192, 320, 256, "f16", "sm_90a", params=p, epilogue_ops=epi)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(M=st.integers(1, 160), N=st.integers(8, 200).map(lambda n: n // 8 * 8), K=st.integers(16, 300),
       pick=st.integers(0, 7), arch=st.sampled_from(["sm_80", "sm_90a"]))
def test_every_yielded_point_interprets_correctly(M, N, K, pick, arch):
    """Points of the space on small and odd problems are schedules the interpreter proves."""
    pts = list(gemm_space(M, N, K, "f16", arch, limit=8))
    assert pts
    p = pts[pick % len(pts)]
    assert_schedule_correct(fs.recipes.gemm(M, N, K, "f16", arch, params=p), examples=1, arch=arch)


@pytest.mark.parametrize("M, N, K", [(1, 512, 1024), (200, 264, 520)])
def test_first_points_compile_without_spills(M, N, K):
    pts = list(gemm_space(M, N, K, "f16", "sm_90a", limit=4))
    pts += list(gemm_space(M, N, K, "f16", "sm_90a", atoms="sm90a", limit=2))
    for p in pts:
        assert fs.compile(fs.recipes.gemm(M, N, K, "f16", "sm_90a", params=p), "sm_90a").spills == 0, p


def test_compile_jobs_in_worker_processes():
    task = (96, 160, 320, "f16", "sm_90a", dict(out_dtype=None, layout="RR", epilogue_ops=()))
    pts = [None] + list(gemm_space(96, 160, 320, "f16", "sm_90a", limit=2))
    bad = GemmParams(atoms="sm90a", block_m=64, block_n=64, stages=99)    # refused when built
    out = compile_jobs([(task, p) for p in pts + [bad]], workers=2, progress=False)
    assert [r for r, _ in out[:-1]] == [0] * len(pts)
    assert out[-1][0] is None and "ScheduleError" in out[-1][1]


# --------------------------------------------------------------------------- the store


PROBLEM = tuning_problem(4096, 4096, 4096, "bf16", "sm_90a")


def test_store_and_lookup(cache):
    assert tuned.lookup(PROBLEM, DEVICE) is None
    p = GemmParams(atoms="sm90a", block_m=128, block_n=256, block_k=64, stages=4)
    path = tuned.store(PROBLEM, DEVICE, dict(p), time_us=191.0)
    assert path.parent == cache / "tuned"
    entry = tuned.lookup(PROBLEM, DEVICE)
    assert params_from_json(entry["params"]) == p and entry["time_us"] == 191.0
    assert tuned.lookup(PROBLEM, {**DEVICE, "driver": 13010}) is None       # another driver re-tunes
    assert tuned.lookup({**PROBLEM, "K": 4097}, DEVICE) is None
    assert tuned.clear() == 1 and tuned.lookup(PROBLEM, DEVICE) is None


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", '{"key": 1, "params": {}}', "\x00\xff garbage"])
def test_a_corrupt_entry_is_a_miss(cache, text):
    path = tuned.store(PROBLEM, DEVICE, {"block_m": 64})
    path.write_bytes(text.encode("latin-1"))
    assert tuned.lookup(PROBLEM, DEVICE) is None
    tuned.store(PROBLEM, DEVICE, {"block_m": 128})                          # overwritten whole
    assert tuned.lookup(PROBLEM, DEVICE)["params"] == {"block_m": 128}


def _writer(args):
    folder, n, seed = args
    import os

    os.environ["FIRESCHED_CACHE_DIR"] = folder
    for i in range(n):
        tuned.store(PROBLEM, DEVICE, {"block_m": 64 * (1 + (seed + i) % 3)}, time_us=float(i), writer=seed)
    return n


def test_concurrent_writers_leave_whole_entries(cache):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        pending = pool.map_async(_writer, [(str(cache), 60, s) for s in range(3)])
        seen = 0
        while not pending.ready():
            e = tuned.lookup(PROBLEM, DEVICE)          # never a torn file: a whole entry or none yet
            if e is not None:
                assert e["params"]["block_m"] in (64, 128, 192)
                seen += 1
        assert pending.get() == [60] * 3
    assert tuned.lookup(PROBLEM, DEVICE)["writer"] in (0, 1, 2)
    assert not list((cache / "tuned").glob(".tmp-*"))
    assert json.loads(next((cache / "tuned").glob("*.json")).read_text())["key"]["problem"] == PROBLEM


def test_an_unwritable_folder_warns(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FIRESCHED_CACHE_DIR", str(blocker))
    with pytest.warns(UserWarning, match="cannot write tuned parameters"):
        assert tuned.store(PROBLEM, DEVICE, {}) is None


# --------------------------------------------------------------------------- recipes.gemm(tuned=True)


def test_tuned_without_an_entry_warns_and_takes_the_default(cache):
    with pytest.warns(PerformanceWarning, match=r"firesched.tune\('gemm', 256, 256, 512"):
        s = fs.recipes.gemm(256, 256, 512, "f16", "sm_90a", tuned=True)
    assert s == fs.recipes.gemm(256, 256, 512, "f16", "sm_90a")


def test_tuned_reads_the_stored_parameters(cache, monkeypatch):
    """The read path with the device identity a GPU would give (none on this machine)."""
    monkeypatch.setattr(runtime, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(tuned, "device_key", lambda device=None: DEVICE)
    p = GemmParams(atoms="sm90a", block_m=64, block_n=128, block_k=64, stages=3, split_k_blocks=2,
                   warp_specialized=True, persistent=True)
    problem = tuning_problem(200, 256, 2048, "f16", "sm_90a")
    tuned.store(problem, DEVICE, dict(p), time_us=10.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fs.recipes.gemm(200, 256, 2048, "f16", "sm_90a", tuned=True)
    assert got == fs.recipes.gemm(200, 256, 2048, "f16", "sm_90a", params=p)
    tuned.store(problem, DEVICE, {}, time_us=10.0)          # the default won
    assert fs.recipes.gemm(200, 256, 2048, "f16", "sm_90a", tuned=True) == \
        fs.recipes.gemm(200, 256, 2048, "f16", "sm_90a")
    tuned.store(problem, DEVICE, {"bogus": 1}, time_us=10.0)  # another release's field: a miss
    with pytest.warns(PerformanceWarning):
        fs.recipes.gemm(200, 256, 2048, "f16", "sm_90a", tuned=True)


def test_tuned_with_parameters_too_is_refused():
    with pytest.raises(ScheduleError, match="tuned=True") as e:
        fs.recipes.gemm(256, 256, 256, "f16", "sm_90a", tuned=True, block_m=64)
    assert e.value.field == "block_m"


def test_tune_without_a_gpu_says_so():
    if runtime.gpu_available():
        pytest.skip("this machine has a GPU (tests/gpu/test_tune_gpu.py runs the tuner)")
    with pytest.raises(RuntimeError, match="torch|CUDA"):
        fs.tune("gemm", 256, 256, 256)
    with pytest.raises(ValueError, match="allowed: gemm"):
        fs.tune("fmha", 256, 256, 256)


def test_problem_keys_differ_by_what_changes_the_schedule():
    base = tuning_problem(512, 512, 512, "f16", "sm_90a")
    assert base != tuning_problem(512, 512, 512, "bf16", "sm_90a")
    assert base != tuning_problem(512, 512, 512, "f16", "sm_90a", layout="RC")
    assert base != tuning_problem(512, 512, 512, "f16", "sm_90a", epilogue_ops=(fs.ops.relu(),))
    assert attrs.has(GemmParams)


@pytest.mark.parametrize("M, N, K", [(4096, 4096, 4096), (127, 4096, 4096), (16, 8192, 8192)])
def test_params_built_from_the_models_dict_are_the_default_kernel(M, N, K):
    """A tile field left out (None) is what ``gemm`` takes when it is not given, so
    ``GemmParams(**default_params(...))`` builds the very schedule ``gemm(M, N, K)`` does (the
    sm_90a K tile is 64, not the sm_80 family's 32)."""
    p = fs.recipes.tiles.default_params(M, N, K, get_target("sm_90a"))
    assert str(fs.recipes.gemm(M, N, K, "f16", "sm_90a", params=GemmParams(**p))) == \
        str(fs.recipes.gemm(M, N, K, "f16", "sm_90a"))
