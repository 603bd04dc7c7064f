"""csrc/int4_amx.c: 4-bit column blocks widened to bfloat16 and multiplied on AMX tiles give the
bfloat16 product of the dequantized weights, and a row the same bits whatever other rows share the
call (partial tiles, several 32-row passes, a pass's rows written out during the next one's, a task's
blocks in several runs of panels); Int4Linear takes it for AMX_MIN_ROWS bfloat16 rows on."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline.model.cpu.kernels import load_quantized_linear_kernel
from pipeline.model.layers.quantized_linear import AMX_MIN_ROWS, Int4Linear

NATIVE = load_quantized_linear_kernel()
pytestmark = pytest.mark.skipif(NATIVE is None or not NATIVE.int4_amx_available, reason="no AMX on this CPU")


def _layer(out_features: int, in_features: int, seed: int) -> Int4Linear:
    generator = torch.Generator().manual_seed(seed)
    return Int4Linear(torch.randint(0, 16, (out_features, in_features), generator=generator),
                      torch.rand(out_features, in_features // 32, generator=generator) * 0.02,
                      torch.rand(out_features, in_features // 32, generator=generator) * 0.02 - 0.01,
                      torch.randn(out_features, generator=generator), NATIVE)


@pytest.mark.parametrize("shape", [(100, 96), (576, 1536), (2400, 1536)],
                         ids=["padded-block", "smollm2-down", "several-panel-runs-a-task"])
def test_the_product_is_the_dequantized_bfloat16_weights_and_each_row_its_own(shape):
    out_features, in_features = shape
    layer = _layer(out_features, in_features, seed=1)
    weight = layer.dequantized().to(torch.bfloat16).float()
    x = torch.randn(70, in_features, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    full = NATIVE.int4_amx(x, layer.column_blocks, layer.block_scales, out_features, layer.bias)
    expected = F.linear(x.float(), weight, layer.bias)
    # float32 sums of bfloat16 products, rounded to bfloat16 once: within bfloat16's rounding of the result
    torch.testing.assert_close(full.float(), expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item())
    for rows in (1, 15, 16, 17, 32, 33, 64):
        part = NATIVE.int4_amx(x[:rows], layer.column_blocks, layer.block_scales, out_features, layer.bias)
        assert torch.equal(part, full[:rows]), rows
        last = NATIVE.int4_amx(x[rows - 1:rows], layer.column_blocks, layer.block_scales, out_features, layer.bias)
        assert torch.equal(last, full[rows - 1:rows]), rows


def test_int4_linear_takes_amx_from_its_row_limit_and_the_kernel_below():
    layer = _layer(64, 128, seed=3)
    x = torch.randn(AMX_MIN_ROWS, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    assert layer.amx_takes(AMX_MIN_ROWS, torch.bfloat16) and not layer.amx_takes(AMX_MIN_ROWS - 1, torch.bfloat16)
    assert not layer.amx_takes(AMX_MIN_ROWS, torch.float32)
    assert torch.equal(layer(x), NATIVE.int4_amx(x, layer.column_blocks, layer.block_scales, 64, layer.bias))
    few = x[:AMX_MIN_ROWS - 1]
    assert torch.equal(layer(few), NATIVE.int4(few, layer.column_blocks, layer.block_scales, 64, layer.bias))
    assert layer.forward_float32(x) is None


def test_a_gated_down_projection_on_amx_gates_as_torch_rounds_then_multiplies():
    """forward_gated for AMX rows: silu(gate) * up with torch's bfloat16 roundings (input_rows.h, the
    gating of every native kernel, the C decoder's too), then the AMX product."""
    layer = _layer(64, 128, seed=5)
    gate_up = (torch.randn(40, 256, generator=torch.Generator().manual_seed(6)) * 3).to(torch.bfloat16)
    gate, up = gate_up.split(128, dim=1)
    expected = NATIVE.int4_amx(F.silu(gate) * up, layer.column_blocks, layer.block_scales, 64, layer.bias)
    assert torch.equal(layer.forward_gated(gate_up), expected)
    assert torch.equal(NATIVE.int4_amx(gate_up, layer.column_blocks, layer.block_scales, 64, layer.bias, gated=True),
                       expected)
