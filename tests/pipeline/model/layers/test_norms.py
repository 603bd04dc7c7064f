"""The native RMSNorm (csrc/rms_norm.c) against the torch path it replaces (pipeline/model/layers/)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline.model.cpu.kernels import load_rms_norm_kernel
from pipeline.model.layers.norms import GemmaRMSNorm, RMSNorm, use_native_norms


def _norms(dtype: torch.dtype, dim: int) -> tuple[RMSNorm, RMSNorm]:
    torch.manual_seed(dim)
    torch_norm = RMSNorm(dim, 1e-5).to(dtype)
    with torch.no_grad():
        torch_norm.weight.copy_(torch.randn(dim))
    native = RMSNorm(dim, 1e-5).to(dtype)
    native.load_state_dict(torch_norm.state_dict())
    assert use_native_norms(native) == 1
    return torch_norm, native


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-6), (torch.bfloat16, 1.6e-2)])
@pytest.mark.parametrize("rows", [1, 3, 70])  # 70: the threaded path
def test_native_norm_matches_the_torch_path(dtype: torch.dtype, tolerance: float, rows: int) -> None:
    if load_rms_norm_kernel() is None:
        pytest.skip("no C compiler")
    torch_norm, native = _norms(dtype, 100)
    x = (torch.randn(rows, 100) * 3).to(dtype)
    with torch.no_grad():
        ours, theirs = native(x), torch_norm(x)
    assert ours.dtype == dtype and ours.shape == x.shape
    torch.testing.assert_close(ours.float(), theirs.float(), atol=tolerance, rtol=tolerance)


def test_bfloat16_rows_round_alike_in_vectors_and_in_the_tail() -> None:
    """dim 40: elements 0-31 are normalised 16 lanes at a time (AVX-512), 32-39 one by one; the same x and w
    values in both give the same bits (the normalised value rounded, times w, rounded again), a NaN
    row's NaNs included."""
    kernel = load_rms_norm_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    generator = torch.Generator().manual_seed(5)
    x = (torch.randn(64, 8, generator=generator) * 4).repeat(1, 5).to(torch.bfloat16)
    x[0, 3] = float("nan")
    weight = (torch.rand(8, generator=generator) + 0.5).repeat(5).to(torch.bfloat16)
    bits = kernel(x, weight, 1e-6).view(torch.int16)
    for first in (0, 8, 16, 24):
        assert torch.equal(bits[:, first:first + 8], bits[:, 32:40]), first
    assert torch.isnan(bits[0].view(torch.bfloat16)).all() and not torch.isnan(bits[1:].view(torch.bfloat16)).any()


def test_worked_example_and_fallbacks() -> None:
    if load_rms_norm_kernel() is None:
        pytest.skip("no C compiler")
    _, native = _norms(torch.float32, 2)
    with torch.no_grad():
        native.weight.fill_(1.0)
        native.eps = 0.0
        torch.testing.assert_close(native(torch.tensor([[3.0, 4.0]])), torch.tensor([[0.8485281, 1.1313708]]))
        wide = torch.randn(4, 4)[:, :2]  # not contiguous: the torch path
        torch.testing.assert_close(native(wide), RMSNorm(2, 0.0)(wide))
    model = nn.Sequential(RMSNorm(8, 1e-6), GemmaRMSNorm(8, 1e-6))
    assert use_native_norms(model) == 1  # Gemma's form (1 + weight, one rounding) keeps its torch path
