"""Granite (GraniteForCausalLM): the Llama decoder with four scalar multipliers from config.json.

As HF transformers applies them:
- `embedding_multiplier` multiplies the token embeddings;
- `residual_multiplier` multiplies each sublayer's output before it joins the residual stream;
- `attention_multiplier` is the attention scale, in place of head_dim ** -0.5 (the backend applies it);
- `logits_scaling` divides the logits, in the LM head's dtype (then float32, as HF's generate).
The checkpoint layout is Llama's, so weight loading (with the q/k/v and gate/up fusions) is
inherited from LlamaForCausalLM. Layers are Llama's Attention and GatedMLP, so LoRA and tensor
parallelism wrap them as they do Llama's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.models import llama
from pipeline.model.models.llama import DecoderConfig, DecoderLayer, DecoderModel, LlamaForCausalLM


@dataclass(frozen=True, slots=True)
class GraniteConfig(DecoderConfig):
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    logits_scaling: float = 1.0


def granite_config(config: dict[str, Any], max_positions: int) -> GraniteConfig:
    """GraniteConfig from an HF config.json dict (GraniteConfig's defaults, 1.0, for absent multipliers)."""
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"Granite hidden_act must be 'silu', got {config['hidden_act']!r}")
    base = llama.decoder_config(config, max_positions)
    shared = {field.name: getattr(base, field.name) for field in fields(base)}
    multipliers = {name: float(config.get(name, 1.0)) for name in
                   ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")}
    return GraniteConfig(**shared, **multipliers)


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    granite = granite_config(config, max_positions=1)
    return AttentionShape(num_layers=granite.num_layers, num_heads=granite.num_heads,
                          num_kv_heads=granite.num_kv_heads, head_dim=granite.head_dim,
                          scale=granite.attention_multiplier, layer_windows=granite.layer_windows)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> GraniteForCausalLM:
    return GraniteForCausalLM(granite_config(config, max_positions), backend)


class GraniteDecoderLayer(DecoderLayer):
    """Llama's layer with each sublayer's output scaled by residual_multiplier before the add."""

    def __init__(self, config: GraniteConfig, backend: AttentionBackend, window: int | None = None) -> None:
        super().__init__(config, backend, window)
        self.residual_multiplier = config.residual_multiplier

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, metadata)
        hidden = hidden + attended * self.residual_multiplier
        return hidden + self.mlp(self.post_attention_layernorm(hidden)) * self.residual_multiplier


class GraniteModel(DecoderModel):
    layer_class = GraniteDecoderLayer


class GraniteForCausalLM(LlamaForCausalLM):
    """Serves GraniteForCausalLM checkpoints."""

    decoder_class = GraniteModel
    config: GraniteConfig

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden_size], final norm applied."""
        hidden = self.model.embed_tokens(input_ids) * self.config.embedding_multiplier
        return self.forward_embeddings(hidden, positions, metadata, kv_caches)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden_size] -> float32 logits [R, vocab_size], divided by logits_scaling in the head's
        dtype first, so bfloat16 serving rounds where HF does."""
        return (self.lm_head(hidden) / self.config.logits_scaling).float()
