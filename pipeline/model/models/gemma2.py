"""Gemma 2 (Gemma2ForCausalLM): the Llama decoder with Gemma's numerics and extra norms.

What differs from Llama, each as HF transformers computes it:
- embeddings are multiplied by sqrt(hidden_size), rounded to the activation dtype first
  (hidden 3584: x * bfloat16(59.87) = x * 59.75 in bfloat16);
- RMSNorm scales by (1 + weight) in float32 (layers.GemmaRMSNorm), and every layer has four:
  input and post_attention around attention, pre_ and post_feedforward around the MLP, the
  "post" ones normalising the branch output before it joins the residual;
- the MLP gate is GELU with the tanh approximation;
- attention scores are scaled by query_pre_attn_scalar ** -0.5 (not head_dim) and soft-capped
  (cap * tanh(scores / cap)) by the attention backend; layers alternate sliding and global
  (`layer_types`);
- the LM head output is soft-capped too (final_logit_softcapping), in the activation dtype and
  then cast to float32, as HF does;
- embeddings are tied by default.
The checkpoint layout is Llama's, so weight loading (with the q/k/v and gate/up fusions) is
inherited from LlamaForCausalLM.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.norms import GemmaRMSNorm
from pipeline.model.models.llama import Attention, DecoderConfig, DecoderModel, LlamaForCausalLM, decoder_config

# HF's hidden_activation names for GELU with the tanh approximation (F.gelu(approximate="tanh")).
_GELU_TANH_NAMES = ("gelu_pytorch_tanh",)


@dataclass(frozen=True, slots=True)
class Gemma2Config(DecoderConfig):
    query_pre_attn_scalar: float = 256.0  # attention scale = query_pre_attn_scalar ** -0.5
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None


# Gemma2Config's defaults for keys a config.json may leave out (transformers < 5 wrote no layer_types).
_DEFAULTS: dict[str, Any] = {"query_pre_attn_scalar": 256,
                             "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                             "sliding_window": 4096, "tie_word_embeddings": True}


def with_gemma2_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """config.json with Gemma2Config's defaults filled in; without layer_types, even-indexed layers
    slide (0: sliding, 1: full, 2: sliding, ...), as HF's config and the original Gemma 2 code do.
    An explicit null cap is kept: it switches the cap off."""
    config = {**_DEFAULTS, **config}
    config["hidden_activation"] = config.get("hidden_activation") or "gelu_pytorch_tanh"
    if not config.get("layer_types"):
        config["layer_types"] = ["full_attention" if index % 2 else "sliding_attention"
                                 for index in range(config["num_hidden_layers"])]
    return config


def gemma2_config(config: dict[str, Any], max_positions: int) -> Gemma2Config:
    """Gemma2Config from an HF config.json dict; ValueError for what this module does not serve
    (an activation other than GELU-tanh, bidirectional attention)."""
    return gemma_config(with_gemma2_defaults(config), max_positions, "Gemma 2")


def gemma_config(config: dict[str, Any], max_positions: int, family: str) -> Gemma2Config:
    """Gemma2Config from a config.json whose family defaults are filled in (Gemma 2, Gemma 3);
    ValueError for what neither serves."""
    if config["hidden_activation"] not in _GELU_TANH_NAMES:
        raise ValueError(f"hidden_activation must be one of {_GELU_TANH_NAMES} for {family}, "
                         f"got {config['hidden_activation']!r}")
    if config.get("use_bidirectional_attention"):
        raise ValueError(f"use_bidirectional_attention must be false: only causal {family} is served")
    base = decoder_config(config, max_positions)
    shared = {field.name: getattr(base, field.name) for field in fields(base)}
    return Gemma2Config(
        **shared,
        query_pre_attn_scalar=float(config["query_pre_attn_scalar"]),
        attn_logit_softcap=_optional_float(config["attn_logit_softcapping"]),
        final_logit_softcap=_optional_float(config["final_logit_softcapping"]),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    gemma = gemma2_config(config, max_positions=1)
    return AttentionShape(num_layers=gemma.num_layers, num_heads=gemma.num_heads, num_kv_heads=gemma.num_kv_heads,
                          head_dim=gemma.head_dim, scale=gemma.query_pre_attn_scalar**-0.5,
                          layer_windows=gemma.layer_windows, logit_softcap=gemma.attn_logit_softcap)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> Gemma2ForCausalLM:
    return Gemma2ForCausalLM(gemma2_config(config, max_positions), backend)


class Gemma2DecoderLayer(nn.Module):
    attention_class: ClassVar[type[Attention]] = Attention  # Gemma 3 passes its q/k-normed attention

    def __init__(self, config: Gemma2Config, backend: AttentionBackend, window: int | None) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.self_attn = self.attention_class(config, backend, window)  # scale and soft-cap live in the backend
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.mlp = GatedMLP(size, config.intermediate_size, bias=config.mlp_bias,
                            activation=functools.partial(F.gelu, approximate="tanh"))
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, metadata)
        hidden = hidden + self.post_attention_layernorm(attended)
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))


class Gemma2Model(DecoderModel):
    layer_class = Gemma2DecoderLayer
    norm_class = GemmaRMSNorm

    def __init__(self, config: Gemma2Config, backend: AttentionBackend) -> None:
        super().__init__(config, backend)
        # sqrt(hidden_size) in the activation dtype; set by build_buffers (not in checkpoints).
        self.register_buffer("embed_scale", torch.empty(()), persistent=False)


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Serves Gemma2ForCausalLM checkpoints."""

    decoder_class = Gemma2Model
    config: Gemma2Config

    def build_buffers(self, device: torch.device) -> None:
        """The rotary table and the embedding scale, once the weights are loaded."""
        super().build_buffers(device)
        # HF keeps sqrt(hidden_size) as a tensor and casts it to the weights' dtype before the
        # multiply, so the product rounds like a same-dtype multiply (not like x * a Python float).
        self.model.embed_scale = torch.tensor(self.config.hidden_size**0.5, device=device,
                                              dtype=self.model.embed_tokens.weight.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden_size], final norm applied."""
        hidden = self.embed(input_ids)
        cos, sin = self.model.rotary_emb.lookup(positions, hidden.dtype)
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            hidden = layer(hidden, cos, sin, kv_cache, metadata)
        return self.model.norm(hidden)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> [T, hidden_size] embeddings times sqrt(hidden_size), rounded as in HF (see build_buffers)."""
        return self.model.embed_tokens(input_ids) * self.model.embed_scale

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden_size] -> float32 logits [R, vocab_size], soft-capped.

        The cap runs in the LM head's dtype, as in HF, so bfloat16 serving rounds where HF does
        (capping in float32 instead moved bfloat16 logits by up to 0.04 on the test model); in
        float32 (the CPU default) only the op order matters.
        """
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()
