"""YaRN rope scaling equals transformers' own: the inverse frequencies and attention factor of its rope
init function (bitwise), and gpt-oss's cos/sin tables, for gpt-oss's defaults and DeepSeek-style mscales."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import GptOssConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

from pipeline.model.layers.rope import RotaryEmbedding, parse_rope, rope_inv_freq

_YARN: list[dict[str, Any]] = [
    {},  # GptOssConfig's default: factor 32 over 4096, untruncated ramp
    {"factor": 8.0, "original_max_position_embeddings": 128, "truncate": False, "rope_theta": 150000.0},
    {"factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 10000.0},  # truncated (HF's default)
    {"factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 10000.0, "mscale": 1.0,
     "mscale_all_dim": 0.8, "beta_fast": 16.0, "beta_slow": 2.0},
    {"factor": 2.0, "original_max_position_embeddings": 512, "rope_theta": 10000.0, "attention_factor": 0.9},
    {"original_max_position_embeddings": 256, "rope_theta": 10000.0, "factor": None},  # factor from the context
]


def _configs(overrides: dict[str, Any]) -> tuple[GptOssConfig, dict[str, Any]]:
    rope = None if not overrides else {"rope_type": "yarn", **overrides}
    hf = GptOssConfig(hidden_size=64, num_attention_heads=4, head_dim=32, max_position_embeddings=1024,
                      rope_parameters=rope)
    return hf, {**hf.to_dict(), "architectures": ["GptOssForCausalLM"]}


@pytest.mark.parametrize("overrides", _YARN)
def test_inverse_frequencies_and_attention_factor_equal_transformers(overrides: dict[str, Any]) -> None:
    hf_config, config = _configs(overrides)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_config)
    params = parse_rope(config)
    assert params.rope_type == "yarn"
    assert params.attention_factor == pytest.approx(attention_factor, rel=1e-15)
    assert torch.equal(rope_inv_freq(32, params), inv_freq)


@pytest.mark.parametrize("overrides", _YARN[:2])
def test_cos_sin_tables_equal_gpt_oss_rotary_embedding(overrides: dict[str, Any]) -> None:
    hf_config, config = _configs(overrides)
    ours = RotaryEmbedding(32, 300, parse_rope(config))
    ours.build("cpu")
    positions = torch.arange(300)
    cos, sin = GptOssRotaryEmbedding(hf_config)(torch.zeros(1, dtype=torch.float32), positions[None])
    our_cos, our_sin = ours.lookup(positions, torch.float32)
    assert torch.equal(our_cos[:, 0], cos[0]) and torch.equal(our_sin[:, 0], sin[0])
    assert cos.abs().max() > 1.0  # the attention factor (> 1 here) is in the table
