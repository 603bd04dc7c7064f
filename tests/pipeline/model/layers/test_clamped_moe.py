"""gpt-oss's mixture of experts equals transformers' GptOssMLP (float32 and bfloat16, its grouped_mm
experts path), its clamp bites where HF's does, and MXFP4 dequantization equals transformers' own."""

from __future__ import annotations

import pytest
import torch
from transformers import GptOssConfig
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

from pipeline.model.layers.clamped_moe import BiasedTopKMoE, clamped_swiglu
from pipeline.model.layers.mxfp4 import dequantize_mxfp4


def _pair(dtype: torch.dtype, limit: float = 1.5) -> tuple[GptOssMLP, BiasedTopKMoE]:
    config = GptOssConfig(hidden_size=64, intermediate_size=48, num_local_experts=5, num_experts_per_tok=3,
                          swiglu_limit=limit)
    config._experts_implementation = "grouped_mm"  # v5's default in a whole model
    generator = torch.Generator().manual_seed(0)
    hf = GptOssMLP(config)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            std = 1.0 if name.endswith("bias") else param.shape[-2 if "experts" in name else -1] ** -0.5
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    ours = BiasedTopKMoE(64, 48, 5, 3, alpha=config.swiglu_alpha, limit=limit)
    ours.load_state_dict(hf.state_dict())  # the same names and layout
    return hf.to(dtype), ours.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_equals_transformers_block(dtype: torch.dtype) -> None:
    hf, ours = _pair(dtype)
    x = torch.randn(1, 41, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        expected, _ = hf(x)
        got = ours(x[0])
    if dtype == torch.bfloat16:
        assert torch.equal(got, expected[0])
    else:
        torch.testing.assert_close(got, expected[0], atol=1e-5, rtol=1e-5)


def test_routing_is_a_softmax_over_the_top_k_logits() -> None:
    _, ours = _pair(torch.float32)
    x = torch.randn(7, 64)
    logits = ours.router(x)
    chosen = torch.topk(logits, 3).indices
    seen: dict[str, torch.Tensor] = {}
    ours.experts.register_forward_hook(lambda _m, args, _out: seen.update(ids=args[1], weights=args[2]))
    with torch.no_grad():
        ours(x)
    assert torch.equal(seen["ids"], chosen)
    torch.testing.assert_close(seen["weights"], torch.softmax(logits.gather(1, chosen), dim=-1))


def test_swiglu_clamps_gate_above_and_up_on_both_sides() -> None:
    # interleaved columns (gate, up): gate 3 -> 1.5; up -4 -> -1.5; below the limit nothing changes
    gate_up = torch.tensor([[3.0, -4.0, -2.0, 0.5]])
    alpha = 1.702
    expected = torch.tensor([[(1 - 1.5) * 1.5 * torch.sigmoid(torch.tensor(1.5 * alpha)),
                              (0.5 + 1) * -2.0 * torch.sigmoid(torch.tensor(-2.0 * alpha))]])
    torch.testing.assert_close(clamped_swiglu(gate_up, alpha, 1.5), expected)


def test_mxfp4_dequantization_equals_transformers() -> None:
    generator = torch.Generator().manual_seed(2)
    blocks = torch.randint(0, 256, (3, 8, 2, 16), generator=generator, dtype=torch.uint8)
    scales = torch.randint(100, 150, (3, 8, 2), generator=generator, dtype=torch.uint8)
    expected = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [3, 64, 8]: input-major
    assert torch.equal(dequantize_mxfp4(blocks, scales).transpose(-2, -1), expected)
    assert dequantize_mxfp4(torch.tensor([[0x21]], dtype=torch.uint8),
                            torch.tensor([128], dtype=torch.uint8)).tolist() == [1.0, 2.0]


def test_mxfp4_shapes_and_dtypes_are_checked() -> None:
    with pytest.raises(ValueError, match="do not match scales"):
        dequantize_mxfp4(torch.zeros(2, 3, 16, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="must be uint8"):
        dequantize_mxfp4(torch.zeros(2, 3, 16), torch.zeros(2, 3, dtype=torch.uint8))
