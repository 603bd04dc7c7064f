"""Quantized layers' bfloat16 copies (pipeline/model/layers/bf16_copies.py): many rows of bfloat16 go
through the copy (the dequantized weight's bfloat16 product), fewer through the layer's kernel, and
copies are made only when they all fit the budget."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.cpu.kernels import load_quantized_linear_kernel
from pipeline.model.cpu.linear import onednn_linear_works
from pipeline.model.layers import bf16_copies
from pipeline.model.layers.bf16_copies import COPY_MIN_ROWS, attach_bf16_copies, copy_panel_kernel, copy_takes
from pipeline.model.layers.quantized_linear import Int8Linear

NATIVE = load_quantized_linear_kernel()
pytestmark = pytest.mark.skipif(NATIVE is None, reason="no C compiler for the native kernels")
# The copies are oneDNN products, which need AVX-512 (or AVX-NE-CONVERT) for bfloat16 weights.
needs_onednn_bfloat16 = pytest.mark.skipif(not onednn_linear_works(torch.bfloat16),
                                           reason="oneDNN packs no bfloat16 weights on this CPU (AVX2 only)")


def _layer(seed: int, out_features: int = 96, in_features: int = 128) -> Int8Linear:
    """An int8 layer (4-bit ones multiply many rows on AMX tiles themselves: csrc/int4_amx.c)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    return Int8Linear.from_float(weight, torch.randn(out_features, generator=generator), NATIVE)


@needs_onednn_bfloat16
def test_many_bfloat16_rows_take_the_copy_and_few_the_kernel():
    model = nn.Sequential(_layer(1), _layer(2, 128, 96))
    assert attach_bf16_copies(model, budget_bytes=1 << 20, layer_types=(Int8Linear,)) == 2
    layer = model[0]
    weight = layer.dequantized().to(torch.bfloat16)
    many = torch.randn(COPY_MIN_ROWS, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    expected = F.linear(many.float(), weight.float(), layer.bias.to(torch.bfloat16).float())
    torch.testing.assert_close(layer(many).float(), expected, rtol=2e-2, atol=2e-2)
    few = many[:COPY_MIN_ROWS - 1]
    assert torch.equal(layer(few), NATIVE.int8(few, layer.column_blocks, layer.scales, 96, 128, layer.bias))
    assert copy_takes(layer, COPY_MIN_ROWS, torch.bfloat16) and not copy_takes(layer, COPY_MIN_ROWS, torch.float32)
    # The one-call forms go to the copy too: its panels where it keeps them (copy_panel_kernel), else none.
    copy, gate_up = layer.__dict__["bf16_copy"], torch.cat([many, many], dim=1)
    if copy.panels is None:
        assert layer.forward_float32(many) is None and layer.forward_gated(gate_up) is None
    else:
        assert torch.equal(layer.forward_float32(many), copy.forward_float32(many))
        assert torch.equal(layer.forward_gated(gate_up), copy(F.silu(many) * many))
    assert "bf16_copy" not in dict(layer.named_children())  # not a submodule: module walks see the layer only


@needs_onednn_bfloat16
def test_no_copies_when_they_do_not_fit_the_budget():
    model = nn.Sequential(_layer(4), _layer(5))
    needed = 2 * 96 * 128 * 2  # bytes: oneDNN's layout, 2 a weight
    assert attach_bf16_copies(model, budget_bytes=needed - 1, layer_types=(Int8Linear,)) == 0
    assert not copy_takes(model[0], COPY_MIN_ROWS, torch.bfloat16)
    assert attach_bf16_copies(model, budget_bytes=needed, layer_types=(Int8Linear,)) == 2
    assert model[0].__dict__["bf16_copy"].panels is None  # panels (2 bytes a weight more) did not fit


def test_no_copies_where_onednn_has_no_bfloat16_product(monkeypatch):
    monkeypatch.setattr(bf16_copies, "onednn_linear_works", lambda dtype: False)
    model = nn.Sequential(_layer(6))
    assert attach_bf16_copies(model, budget_bytes=1 << 20, layer_types=(Int8Linear,)) == 0
    assert not copy_takes(model[0], COPY_MIN_ROWS, torch.bfloat16)


@pytest.mark.skipif(copy_panel_kernel() is None, reason="copies keep panels on AVX512-BF16 CPUs without AMX")
def test_copies_keep_panels_when_the_budget_holds_them():
    model = nn.Sequential(_layer(6), _layer(7))
    assert attach_bf16_copies(model, budget_bytes=2 * 96 * 128 * 4, layer_types=(Int8Linear,)) == 2
    assert all(layer.__dict__["bf16_copy"].panels is not None for layer in model)
