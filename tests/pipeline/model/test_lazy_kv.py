"""The CPU KV cache is zero from the start but costs resident memory only for pages written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from pipeline.model.runner import lazy_zeros

_STATM = Path("/proc/self/statm")


def _resident_bytes() -> int:
    return int(_STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not _STATM.exists(), reason="needs Linux /proc")
def test_lazy_zeros_is_zero_writable_and_resident_only_where_written():
    before = _resident_bytes()
    cache = lazy_zeros((2, 8192, 16, 8, 64), torch.float32)  # 512 MiB
    assert _resident_bytes() - before < 64 * 2**20
    assert cache.shape == (2, 8192, 16, 8, 64) and cache.is_contiguous()
    cache[1, 100] = 3.0
    assert float(cache[1, 100].sum()) == 3.0 * 16 * 8 * 64
    assert float(cache[0, :50].abs().sum()) == 0.0 and float(cache[1, 8000:].abs().sum()) == 0.0
    assert _resident_bytes() - before < 64 * 2**20  # reading untouched pages maps the shared zero page
