"""SmolLM3 (SmolLM3ForCausalLM): the Llama decoder with rope switched off in some layers (NoPE).

`no_rope_layers` has one entry per layer, and despite its name 1 means the layer *uses* rope, 0 that
it attends without any position encoding (q and k unrotated, also in the KV cache). Without the list,
SmolLM3Config derives it from `no_rope_layer_interval` (default 4): every interval-th layer skips rope,
[1, 1, 1, 0, 1, 1, 1, 0, ...] for 4. Sliding windows follow `layer_types` (attention/shape.py); the
released checkpoints use none. Embeddings are tied unless config.json says otherwise.
The checkpoint layout is Llama's, so weight loading is inherited from LlamaForCausalLM; the layers are
Llama's Attention (with a rope switch) and GatedMLP, so LoRA and tensor parallelism wrap them as they
do Llama's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.models import llama
from pipeline.model.models.llama import Attention, DecoderConfig, DecoderLayer, DecoderModel, LlamaForCausalLM

_DEFAULT_NO_ROPE_INTERVAL = 4  # SmolLM3Config's no_rope_layer_interval


@dataclass(frozen=True, slots=True)
class SmolLM3Config(DecoderConfig):
    rope_layers: tuple[bool, ...] = ()  # per layer: whether it rotates q and k


def rope_layers(config: dict[str, Any]) -> tuple[bool, ...]:
    """Per layer, whether it uses rope: `no_rope_layers` (1 = rope), else every
    `no_rope_layer_interval`-th layer without (interval 4: layers 3, 7, 11, ... skip rope)."""
    num_layers = config["num_hidden_layers"]
    flags = config.get("no_rope_layers")
    if flags is None:
        interval = int(config.get("no_rope_layer_interval", _DEFAULT_NO_ROPE_INTERVAL))
        flags = [(index + 1) % interval != 0 for index in range(num_layers)]
    if len(flags) != num_layers:
        raise ValueError(f"no_rope_layers has {len(flags)} entries for {num_layers} layers")
    return tuple(bool(flag) for flag in flags)


def smollm3_config(config: dict[str, Any], max_positions: int) -> SmolLM3Config:
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"SmolLM3 hidden_act must be 'silu', got {config['hidden_act']!r}")
    config = {"tie_word_embeddings": True, **config}  # SmolLM3Config's default
    base = llama.decoder_config(config, max_positions)
    shared = {field.name: getattr(base, field.name) for field in fields(base)}
    return SmolLM3Config(**shared, rope_layers=rope_layers(config))


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    smollm3_config(config, max_positions=1)  # the checks
    return llama.attention_shape(config)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> SmolLM3ForCausalLM:
    return SmolLM3ForCausalLM(smollm3_config(config, max_positions), backend)


class SmolLM3Attention(Attention):
    """Llama's attention, or with use_rope False the same without rotating q and k."""

    use_rope = True  # set per layer by SmolLM3Model

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        if self.use_rope:
            return super().forward(x, cos, sin, kv_cache, metadata)
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        out = self.backend.forward(q.view(num_tokens, self.num_heads, self.head_dim),
                                   k.view(num_tokens, self.num_kv_heads, self.head_dim),
                                   v.view(num_tokens, self.num_kv_heads, self.head_dim),
                                   kv_cache, metadata, window=self.window)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class SmolLM3DecoderLayer(DecoderLayer):
    attention_class = SmolLM3Attention


class SmolLM3Model(DecoderModel):
    layer_class = SmolLM3DecoderLayer

    def __init__(self, config: SmolLM3Config, backend: AttentionBackend) -> None:
        super().__init__(config, backend)
        for layer, uses_rope in zip(self.layers, config.rope_layers, strict=True):
            layer.self_attn.use_rope = uses_rope


class SmolLM3ForCausalLM(LlamaForCausalLM):
    """Serves SmolLM3ForCausalLM checkpoints."""

    decoder_class = SmolLM3Model
