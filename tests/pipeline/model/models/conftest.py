"""Fixtures of the family tests."""

from __future__ import annotations

import pytest

from pipeline.model.cpu.kernels import load_decode_kernel


@pytest.fixture(params=["kernel", "torch"])
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Runners made in the test decode with the native kernel, or with AQUEDUCT_CPU_KERNEL=0."""
    load_decode_kernel.cache_clear()  # it reads the environment once
    if request.param == "torch":
        monkeypatch.setenv("AQUEDUCT_CPU_KERNEL", "0")
    elif load_decode_kernel() is None:
        pytest.skip("the native decode kernel is unavailable (no C compiler)")
    yield request.param
    load_decode_kernel.cache_clear()
