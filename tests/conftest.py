"""Shared pytest configuration: hypothesis profiles, the gpu marker, --update-golden, and how many
processes ``pytest`` runs the tests in (pytest-xdist's ``-n auto``, set in ``pyproject.toml``)."""

from __future__ import annotations

import gc
import os

import pytest
from hypothesis import HealthCheck, settings

# ``dev`` keeps a local run quick; ``ci`` is what CI (CI=true) runs: 500 examples per law.
settings.register_profile("dev", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the golden CUDA files under tests/golden/ instead of comparing")


@pytest.fixture
def update_golden(request) -> bool:
    return bool(request.config.getoption("--update-golden"))


def pytest_collection_finish(session):
    """Collection imported every test module and built every item; none of that is garbage.
    ``gc.freeze`` moves it out of the collector's generations, so that the full collections the
    tests' many small frozen values (specs, index expressions, IR) trigger do not traverse it
    again each time (measured: a third of the collector's time in the interpreter-heavy files)."""
    gc.collect()
    gc.freeze()


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one process per CPU on a machine without a GPU (the CPU suite is NVRTC
    compiles and interpreter runs, which share nothing); 0 (the tests in this process) where a GPU
    is present, so that the GPU tests' timings and memory are not shared between processes.
    ``$FIRESCHED_TEST_WORKERS`` overrides both."""
    env = os.environ.get("FIRESCHED_TEST_WORKERS")
    if env:
        return int(env)
    return 0 if _gpu_reason() is None else (os.cpu_count() or 1)


def _gpu_reason() -> str | None:
    """None when a CUDA device can be used, else why not."""
    try:
        from cuda.bindings import driver
    except Exception as e:  # pragma: no cover - depends on the machine
        return f"cuda-bindings not importable: {e}"
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return f"no CUDA driver/device (cuInit: {err.name})"
        err, n = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS or n == 0:
            return "no CUDA device"
    except Exception as e:  # pragma: no cover
        return f"no CUDA driver: {e}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
