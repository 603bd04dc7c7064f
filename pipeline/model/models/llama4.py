"""Llama 4, text (Llama4ForCausalLM; Llama4ForConditionalGeneration checkpoints served text only).

What differs from Llama, each as HF transformers' modeling_llama4 computes it (settings: llama4_config.py):
- rope layers rotate q and k by adjacent pairs (HF's complex form: (x[2i], x[2i+1]) turned by angle i,
  in float32, rounded back), with llama3 scaling as released; NoPE layers (`no_rope_layers` 0,
  every 4th by default) leave q and k unrotated, in the KV cache too;
- rope layers attend within chunks of `attention_chunk_size` positions (`chunked_attention`: the
  query at p sees keys p - p % C .. p, attention/windows.py), NoPE layers attend to the whole context;
- `use_qk_norm`: after rope, q and k are RMS-normalised per head without a weight (rope layers only);
- `attn_temperature_tuning`: on NoPE layers q is multiplied, per token, by
  log1p(floor((position + 1) / floor_scale)) * attn_scale + 1 (in float32, rounded back);
- MoE layers (`moe_layers`, or every `interleave_moe_layer_step`-th) run a shared expert plus top-k
  routed experts whose sigmoid scores scale the experts' *inputs* (layers/scored_input_moe.py); the
  other layers a dense MLP of `intermediate_size_mlp`.
Checkpoints: q/k/v and each MLP's gate/up fuse as for Llama (`feed_forward.*`: the dense MLP, the
`shared_expert`); the experts load in HF's input-major layout (`feed_forward.experts.gate_up_proj`
[E, H, 2I], `down_proj` [E, I, H]), the router as `feed_forward.router`. A multimodal checkpoint's
`language_model.*` tensors load as Llama4ForCausalLM's; `vision_model.*` and
`multi_modal_projector.*` are skipped (HF embeds a text-only prompt's ids as they are).
LoRA and tensor parallelism refuse it, as every mixture-of-experts model; decode runs per op (the
native whole-layer decoder serves only plain Llama models), its attention in the native decode kernel.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.attention.windows import Window
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.norms import RMSNorm
from pipeline.model.layers.rope import RotaryEmbedding, apply_rotary_interleaved
from pipeline.model.layers.scored_input_moe import ScoredInputMoE
from pipeline.model.models.llama import Attention, Index, LlamaForCausalLM
from pipeline.model.models.llama4_config import MULTIMODAL, Llama4Config, llama4_config
from pipeline.model.models.llama4_config import text_config as text_config  # the family's language model config

_SKIPPED = ("vision_model.", "multi_modal_projector.")


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    llama4 = llama4_config(config, max_positions=1)
    return AttentionShape(num_layers=llama4.num_layers, num_heads=llama4.num_heads, num_kv_heads=llama4.num_kv_heads,
                          head_dim=llama4.head_dim, scale=llama4.head_dim**-0.5, layer_windows=llama4.layer_windows)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> Llama4ForCausalLM:
    model_class = Llama4TextOnly if config["architectures"][0] == MULTIMODAL else Llama4ForCausalLM
    return model_class(llama4_config(config, max_positions), backend)


class Llama4Attention(Attention):
    """Llama's projections; rope by pairs, or none with q scaled by position (module docstring)."""

    def __init__(self, config: Llama4Config, backend: AttentionBackend, window: Window, use_rope: bool) -> None:
        super().__init__(config, backend, window)
        self.use_rope = use_rope
        self.l2_qk_norm = config.l2_qk_norm and use_rope
        self.eps = config.rms_norm_eps

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object, q_scale: torch.Tensor | None = None) -> torch.Tensor:
        """cos, sin [T, 1, D/2] float32 (rope layers); q_scale [T, 1, 1] float32 (NoPE layers with tuning)."""
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.use_rope:
            q = apply_rotary_interleaved(q.float(), cos, sin).to(x.dtype)
            k = apply_rotary_interleaved(k.float(), cos, sin).to(x.dtype)
        if self.l2_qk_norm:
            q, k = self._norm(q), self._norm(k)
        if q_scale is not None and not self.use_rope:
            q = (q * q_scale).to(x.dtype)
        out = self.attend(q, k, v.view(num_tokens, self.num_kv_heads, self.head_dim), kv_cache, metadata)
        return self.o_proj(out.reshape(num_tokens, self.q_size))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """HF's Llama4TextL2Norm: an RMS norm without a weight, in float32, rounded back."""
        x_f32 = x.float()
        return (x_f32 * torch.rsqrt(x_f32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Llama4DecoderLayer(nn.Module):
    def __init__(self, config: Llama4Config, backend: AttentionBackend, index: int) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(size, eps)
        self.self_attn = Llama4Attention(config, backend, config.window_of(index), config.rope_layers[index])
        self.post_attention_layernorm = RMSNorm(size, eps)
        self.feed_forward: nn.Module
        if config.moe_layers[index]:
            self.feed_forward = ScoredInputMoE(size, config.intermediate_size, config.num_experts,
                                               config.num_experts_per_tok, config.intermediate_size)
        else:
            self.feed_forward = GatedMLP(size, config.dense_intermediate_size)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_scale: torch.Tensor | None,
                kv_cache: torch.Tensor, metadata: object) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, metadata, q_scale)
        return hidden + self.feed_forward(self.post_attention_layernorm(hidden))


class Llama4Model(nn.Module):
    """Embeddings, the layers, the final norm and the rotary table, under Llama's names."""

    def __init__(self, config: Llama4Config, backend: AttentionBackend) -> None:
        super().__init__()
        # An explicit (uninitialised) weight skips nn.Embedding's random init (llama.DecoderModel says why).
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(Llama4DecoderLayer(config, backend, index) for index in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.max_positions, config.rope)


class Llama4ForCausalLM(LlamaForCausalLM):
    """Serves Llama4ForCausalLM checkpoints."""

    decoder_class = Llama4Model
    config: Llama4Config

    def forward_embeddings(self, hidden: torch.Tensor, positions: torch.Tensor, metadata: object,
                           kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """Token embeddings [T, hidden_size] -> final hidden states; rope tables and q scales shared by the layers."""
        cos, sin = self.model.rotary_emb.lookup(positions, torch.float32)  # HF rotates in float32
        q_scale = self.temperature_scales(positions) if self.config.temperature_tuning else None
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            hidden = layer(hidden, cos, sin, q_scale, kv_cache, metadata)
        return self.model.norm(hidden)

    def temperature_scales(self, positions: torch.Tensor) -> torch.Tensor:
        """[T] -> [T, 1, 1] float32: log1p(floor((p + 1) / floor_scale)) * attn_scale + 1, HF's formula."""
        scales = torch.log1p(torch.floor((positions.float() + 1.0) / self.config.floor_scale))
        return (scales * self.config.attn_scale + 1.0).view(-1, 1, 1)

    def locate(self, name: str) -> tuple[str, Index]:
        """Gate and up rows fuse by their MLP's own size: the dense MLP's intermediate_size_mlp, the
        shared expert's intermediate_size.

        "model.layers.1.feed_forward.shared_expert.up_proj.weight" ->
        ("model.layers.1.feed_forward.shared_expert.gate_up_proj.weight", rows I..2I)
        """
        module, _, kind = name.rpartition(".")
        prefix, _, proj = module.rpartition(".")
        if proj not in ("gate_proj", "up_proj"):
            return super().locate(name)
        c = self.config
        size = c.intermediate_size if prefix.endswith(".shared_expert") else c.dense_intermediate_size
        rows = slice(0, size) if proj == "gate_proj" else slice(size, 2 * size)
        return f"{prefix}.gate_up_proj.{kind}", rows


class Llama4TextOnly(Llama4ForCausalLM):
    """Serves Llama4ForConditionalGeneration checkpoints' language model (text prompts only)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_language_model_weights(weights))


def _language_model_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A multimodal checkpoint's language model tensors under Llama4ForCausalLM's names; vision skipped.

    "language_model.model.layers.0.self_attn.q_proj.weight" -> "model.layers.0.self_attn.q_proj.weight"
    "language_model.lm_head.weight" -> "lm_head.weight"; "vision_model.*", "multi_modal_projector.*" -> skipped
    """
    for name, tensor in weights:
        if name.startswith(_SKIPPED):
            continue
        yield name.removeprefix("language_model."), tensor
