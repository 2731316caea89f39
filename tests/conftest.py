"""Shared pytest configuration: hypothesis profiles, the gpu marker, --update-golden."""

from __future__ import annotations

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
