"""OLMo 2 (Olmo2ForCausalLM): the Llama decoder with norms after each sublayer and q/k norms over
whole projections.

What differs from Llama, each as HF transformers computes it:
- no input norms: each layer normalises the attention output (`post_attention_layernorm`) and the
  MLP output (`post_feedforward_layernorm`) before adding it to the residual stream;
- q and k are RMS-normalised over the whole projection (num_heads * head_dim values per token, one
  variance across all heads; Qwen3 normalises each head on its own), before rope;
- every RMSNorm scales in float32 and rounds last (layers.Float32RMSNorm);
- rope runs in float32 (HF keeps this family's cos/sin in float32 and rounds q and k once, after
  the rotation), which only shows in bfloat16/float16.
The checkpoint layout is Llama's plus `self_attn.q_norm`/`k_norm`, so the q/k/v and gate/up fusions
load as in LlamaForCausalLM.

Tensor parallelism is refused when the model is sharded (parallel/sharding.py: a rank holding some
heads cannot compute the variance over all of them without another all-reduce per layer). LoRA wraps
the projections as it does Llama's; the q/k norms apply to the adapted q and k, as in PEFT on HF.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.norms import Float32RMSNorm
from pipeline.model.layers.rope import apply_rotary
from pipeline.model.models import llama
from pipeline.model.models.llama import Attention, DecoderConfig, DecoderModel, LlamaForCausalLM


def decoder_config(config: dict[str, Any], max_positions: int) -> DecoderConfig:
    """DecoderConfig from an OLMo 2 config.json; `attention_bias` covers q/k/v and o, the MLP has none."""
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"OLMo 2 hidden_act must be 'silu', got {config['hidden_act']!r}")
    return replace(llama.decoder_config(config, max_positions), mlp_bias=False, qk_norm=False)


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    decoder_config(config, max_positions=1)  # the checks
    return llama.attention_shape(config)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> Olmo2ForCausalLM:
    return Olmo2ForCausalLM(decoder_config(config, max_positions), backend)


class Olmo2Attention(Attention):
    """Llama's attention with q and k normalised over their whole projections before rope."""

    def __init__(self, config: DecoderConfig, backend: AttentionBackend, window: int | None = None) -> None:
        super().__init__(config, backend, window)
        # [num_heads * head_dim] weights (the checkpoint's names): one variance per token over every head.
        self.q_norm = Float32RMSNorm(self.q_size, config.rms_norm_eps)
        self.k_norm = Float32RMSNorm(self.kv_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # cos/sin are float32 (Olmo2ForCausalLM.forward_embeddings): rotate in float32, round once.
        q = apply_rotary(self.q_norm(q).view(num_tokens, self.num_heads, self.head_dim).float(), cos, sin)
        k = apply_rotary(self.k_norm(k).view(num_tokens, self.num_kv_heads, self.head_dim).float(), cos, sin)
        q, k = q.to(x.dtype), k.to(x.dtype)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = self.backend.forward(q, k, v, kv_cache, metadata, window=self.window)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig, backend: AttentionBackend, window: int | None) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Olmo2Attention(config, backend, window)
        self.post_attention_layernorm = Float32RMSNorm(size, eps)
        self.mlp = GatedMLP(size, config.intermediate_size)
        self.post_feedforward_layernorm = Float32RMSNorm(size, eps)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        hidden = hidden + self.post_attention_layernorm(self.self_attn(hidden, cos, sin, kv_cache, metadata))
        return hidden + self.post_feedforward_layernorm(self.mlp(hidden))


class Olmo2Model(DecoderModel):
    layer_class = Olmo2DecoderLayer
    norm_class = Float32RMSNorm


class Olmo2ForCausalLM(LlamaForCausalLM):
    """Serves Olmo2ForCausalLM checkpoints."""

    decoder_class = Olmo2Model

    def forward_embeddings(self, hidden: torch.Tensor, positions: torch.Tensor, metadata: object,
                           kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """Token embeddings [T, hidden_size] -> final hidden states, with float32 cos/sin (module docstring)."""
        cos, sin = self.model.rotary_emb.lookup(positions, torch.float32)
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            hidden = layer(hidden, cos, sin, kv_cache, metadata)
        return self.model.norm(hidden)
