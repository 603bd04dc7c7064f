"""Model families: which module serves each HF architecture name.

Every family module provides
- `attention_shape(config) -> AttentionShape`: what the KV cache and the attention backend need;
- `build_model(config, backend, max_positions) -> nn.Module` on the current (meta) device, with
  `forward(input_ids, positions, metadata, kv_caches)`, `compute_logits(hidden)`,
  `load_weights(named_tensors)`, `tie_weights()` and `build_buffers(device)`.
`config` is the checkpoint's config.json as a dict. A vision-language family also provides
`text_config(config)`, its language model's config, and its model `encode_images(pixel_values)` and
an `images` argument to `forward` (pipeline/model/models/llava.py); a family that serves such
checkpoints text only provides `text_config` alone (gemma3.py). A family with linear-attention layers
(qwen3_next.py) also provides `recurrent_state_shape(config)`, what it keeps per sequence outside the KV
cache, and its model's `forward` takes `states` (layers/recurrent_state.py's StateStep). An encoder
family (bert.py) instead sets `ENCODER = True` and provides `build_encoder(config)`, whose model takes a padded batch
(`forward(input_ids, attention_mask)`) and `load_weights(named_tensors)`: it serves embeddings only.

May import: pipeline.model.attention, pipeline.model.layers.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# HF architecture name -> module under pipeline.model.models
_FAMILIES: dict[str, str] = {
    "BertModel": "bert",
    "DeepseekV2ForCausalLM": "deepseek",
    "DeepseekV3ForCausalLM": "deepseek",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # served text only
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4_text_only",
    "Glm4ForCausalLM": "glm4",
    "GptOssForCausalLM": "gpt_oss",
    "GraniteForCausalLM": "granite",
    "LlamaForCausalLM": "llama",
    "LlamaModel": "llama",  # base models: embedders (--runner pooling)
    "Llama4ForCausalLM": "llama4",
    "Llama4ForConditionalGeneration": "llama4",  # served text only
    "LlavaForConditionalGeneration": "llava",
    "MistralForCausalLM": "llama",
    "MistralModel": "llama",
    "MixtralForCausalLM": "mixtral",
    "Olmo2ForCausalLM": "olmo2",
    "Phi3ForCausalLM": "phi3",
    "Qwen2ForCausalLM": "llama",
    "Qwen2Model": "llama",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3ForCausalLM": "llama",
    "Qwen3Model": "llama",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForCausalLM": "qwen3_next",
    "Qwen3_5ForConditionalGeneration": "qwen3_next",  # served text only
    "Qwen3_5MoeForCausalLM": "qwen3_next",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_next",  # served text only
    "SmolLM3ForCausalLM": "smollm3",
    "XLMRobertaModel": "bert",
}

SUPPORTED_ARCHITECTURES = tuple(_FAMILIES)

# Architectures transformers builds that are refused on purpose, and why (docs/models.md, "Not served yet");
# none at present.
_REFUSED: dict[str, str] = {}


def family_of(architecture: str) -> ModuleType:
    """The module serving `architecture`; ValueError naming the supported ones otherwise (and, for an
    architecture refused on purpose, why)."""
    if architecture not in _FAMILIES:
        reason = f" yet: {_REFUSED[architecture]}" if architecture in _REFUSED else ""
        raise ValueError(f"architecture {architecture!r} is not supported{reason}; supported architectures: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    return importlib.import_module(f"pipeline.model.models.{_FAMILIES[architecture]}")


def is_encoder(architecture: str) -> bool:
    """An encoder family (bert.py: `ENCODER = True`) embeds whole prompts, with no KV cache or decode."""
    return bool(getattr(family_of(architecture), "ENCODER", False))
