"""GLM-4 (Glm4ForCausalLM, the GLM-4-0414 models): the Llama decoder with GLM's rope and extra norms.

What differs from Llama, each as HF transformers computes it:
- partial rotary in GLM's interleaved layout: only the first head_dim * partial_rotary_factor dims
  of each q/k head rotate (default factor 0.5), as adjacent pairs (layers.apply_rotary_interleaved),
  with inverse frequencies over that rotary dim; the rest pass through;
- two more norms per layer: `post_self_attn_layernorm` on the attention output and
  `post_mlp_layernorm` on the MLP output, each before its residual add (the pre-norms
  input_layernorm and post_attention_layernorm stay where Llama has them);
- q/k/v have biases (attention_bias, true by default), o_proj never;
- the checkpoint stores the MLP's gate and up fused as `mlp.gate_up_proj` (rows [gate; up]), our
  GatedMLP's layout, so it loads as it is; q/k/v fuse as in LlamaForCausalLM.
Glm4Config's defaults differ from Llama's (head_dim 128, attention_bias, the factor 0.5, rms eps),
so they fill in keys a config.json leaves out. Rope scaling (anything but the default rope) is refused.
Layers keep Llama's Attention projections and GatedMLP, so LoRA (on q/k/v/o/down: an adapter for the
fused gate_up_proj is refused by name when loading) and tensor parallelism wrap them as they do Llama's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.norms import RMSNorm
from pipeline.model.layers.rope import RotaryEmbedding, apply_rotary_interleaved
from pipeline.model.models import llama
from pipeline.model.models.llama import Attention, DecoderConfig, DecoderModel, LlamaForCausalLM

# Glm4Config's defaults for keys a config.json may leave out.
_DEFAULTS: dict[str, Any] = {"head_dim": 128, "attention_bias": True, "rms_norm_eps": 1.5625e-07,
                             "tie_word_embeddings": False}
_DEFAULT_PARTIAL_ROTARY_FACTOR = 0.5


@dataclass(frozen=True, slots=True)
class Glm4Config(DecoderConfig):
    rotary_dim: int = 0  # leading dims of each head that rotate: int(head_dim * partial_rotary_factor)


def glm4_config(config: dict[str, Any], max_positions: int) -> Glm4Config:
    """Glm4Config from an HF config.json dict; ValueError for what this module does not serve."""
    config = {**_DEFAULTS, **config}
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"GLM-4 hidden_act must be 'silu', got {config['hidden_act']!r}")
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"GLM-4 rope type {rope_type!r} is not supported (only 'default')")
    factor = float(rope.get("partial_rotary_factor",
                            config.get("partial_rotary_factor", _DEFAULT_PARTIAL_ROTARY_FACTOR)))
    base = llama.decoder_config(config, max_positions)
    rotary_dim = int(base.head_dim * factor)
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > base.head_dim:
        raise ValueError(f"GLM-4 partial_rotary_factor {factor} gives rotary dim {rotary_dim} for head_dim "
                         f"{base.head_dim}; it must be even and in 2..head_dim")
    shared = {field.name: getattr(base, field.name) for field in fields(base)}
    shared.update(qkv_bias=bool(config["attention_bias"]), o_bias=False, mlp_bias=False)
    return Glm4Config(**shared, rotary_dim=rotary_dim)


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    glm = glm4_config(config, max_positions=1)
    return AttentionShape(num_layers=glm.num_layers, num_heads=glm.num_heads, num_kv_heads=glm.num_kv_heads,
                          head_dim=glm.head_dim, scale=glm.head_dim**-0.5, layer_windows=glm.layer_windows)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> Glm4ForCausalLM:
    return Glm4ForCausalLM(glm4_config(config, max_positions), backend)


class Glm4Attention(Attention):
    """Llama's attention with GLM's partial, interleaved rope (cos/sin cover the rotary dims only)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        # q and k heads side by side in each qkv row, rotated in one pass (as llama.Attention does).
        qk = apply_rotary_interleaved(qkv[:, :self.q_size + self.kv_size].view(
            num_tokens, self.num_heads + self.num_kv_heads, self.head_dim), cos, sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.q_size + self.kv_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
        out = self.backend.forward(q, k, v, kv_cache, metadata, window=self.window)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class Glm4DecoderLayer(nn.Module):
    def __init__(self, config: Glm4Config, backend: AttentionBackend, window: int | None) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(size, eps)
        self.self_attn = Glm4Attention(config, backend, window)
        self.post_self_attn_layernorm = RMSNorm(size, eps)
        self.post_attention_layernorm = RMSNorm(size, eps)
        self.mlp = GatedMLP(size, config.intermediate_size)
        self.post_mlp_layernorm = RMSNorm(size, eps)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, metadata)
        hidden = hidden + self.post_self_attn_layernorm(attended)
        return hidden + self.post_mlp_layernorm(self.mlp(self.post_attention_layernorm(hidden)))


class Glm4Model(DecoderModel):
    layer_class = Glm4DecoderLayer

    def __init__(self, config: Glm4Config, backend: AttentionBackend) -> None:
        super().__init__(config, backend)
        # Frequencies over the rotary dims only: 1 / theta ** (2i / rotary_dim), i < rotary_dim / 2.
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.max_positions, config.rope)


class Glm4ForCausalLM(LlamaForCausalLM):
    """Serves Glm4ForCausalLM checkpoints."""

    decoder_class = Glm4Model
