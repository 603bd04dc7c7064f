"""Qwen3-Next and Qwen3.5 (dense, MoE, their multimodal checkpoints): transformers builds them, and loading
one is refused with the reason (a recurrent state per sequence in the gated DeltaNet layers, which the
paged KV cache cannot hold; docs/models.md), not the bare list of supported architectures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from tests.pipeline.model.test_model_forward import make_runner

_TEXT = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
         "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16}
_CASES = {
    "Qwen3NextForCausalLM": lambda: transformers.Qwen3NextConfig(**_TEXT, **_MOE),
    "Qwen3_5ForCausalLM": lambda: transformers.Qwen3_5TextConfig(**_TEXT),
    "Qwen3_5MoeForCausalLM": lambda: transformers.Qwen3_5MoeTextConfig(**_TEXT, **_MOE),
    "Qwen3_5ForConditionalGeneration": lambda: transformers.Qwen3_5Config(text_config=_TEXT),
}


@pytest.mark.parametrize("architecture", list(_CASES))
def test_hybrid_linear_attention_checkpoints_are_refused_with_the_reason(architecture: str, tmp_path: Path) -> None:
    config = _CASES[architecture]()
    assert "linear_attention" in (config.get_text_config().layer_types or [])  # the hybrid layers are there
    torch.manual_seed(0)
    getattr(transformers, architecture)(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=rf"architecture '{architecture}' is not supported yet: its gated DeltaNet "
                                         r"\(linear attention\) layers carry a recurrent state per sequence"):
        make_runner(tmp_path)
