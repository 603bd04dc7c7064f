"""Gemma 3, text (Gemma3ForCausalLM; Gemma3ForConditionalGeneration checkpoints served text only):
Gemma 2's layers (gemma2.py) with these differences, each as HF transformers computes it:
- q and k are RMS-normalised per head before rope, in Gemma's form (scale by 1 + weight in float32);
- sliding and global layers rotate with their own rope: `rope_parameters` per layer type
  (transformers 5), or `rope_local_base_freq` for the sliding layers and `rope_theta` plus
  `rope_scaling` (linear on the released 4B-27B) for the global ones (transformers 4);
- without `layer_types`, every `sliding_window_pattern`-th layer (default 6) is global, the rest slide;
- no attention soft-cap: HF's Gemma 3 attention never applies `attn_logit_softcapping`, so neither
  does this module; the final logits are capped where `final_logit_softcapping` is set, except in
  Gemma3ForConditionalGeneration, whose head HF never caps;
- the defaults for keys a config leaves out are Gemma3TextConfig's (a multimodal checkpoint's
  `text_config` names only what differs from them), and its top-level `tie_word_embeddings` governs.
A multimodal checkpoint's vision tower and projector weights are skipped; its language model's
names (`language_model.model.*` as released, `model.language_model.*` as transformers 5 holds them)
load as Gemma3ForCausalLM's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.norms import GemmaRMSNorm
from pipeline.model.layers.rope import RopeParams, RotaryEmbedding, parse_rope
from pipeline.model.models.gemma2 import Gemma2Config, Gemma2DecoderLayer, Gemma2ForCausalLM, Gemma2Model, gemma_config
from pipeline.model.models.llama import Attention, DecoderConfig

MULTIMODAL = "Gemma3ForConditionalGeneration"
_GLOBAL_THETA, _LOCAL_THETA = 1_000_000.0, 10_000.0  # Gemma3TextConfig.default_theta
_SLIDING_WINDOW_PATTERN = 6

# Gemma3TextConfig's defaults for keys a config.json may leave out.
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
}


@dataclass(frozen=True, slots=True)
class Gemma3Config(Gemma2Config):
    # The sliding layers' rope; `rope` is the global layers'.
    local_rope: RopeParams = field(default_factory=lambda: RopeParams(theta=_LOCAL_THETA))


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config.json with Gemma3TextConfig's defaults filled in: a
    Gemma3ForCausalLM config, or a Gemma3ForConditionalGeneration config's `text_config`."""
    architecture = config["architectures"][0]
    if architecture == MULTIMODAL:
        config = {**config.get("text_config", {}), "architectures": [architecture],
                  "tie_word_embeddings": config.get("tie_word_embeddings", True)}
    config = {**_DEFAULTS, **config}
    if not config.get("layer_types"):
        pattern = config.get("sliding_window_pattern") or _SLIDING_WINDOW_PATTERN
        config["layer_types"] = ["sliding_attention" if (index + 1) % pattern else "full_attention"
                                 for index in range(config["num_hidden_layers"])]
    config["rope_parameters"] = _rope_parameters(config)
    return config


def _rope_parameters(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per layer type rope settings from either config form, as Gemma3TextConfig reads them
    ({"full_attention": {...}, "sliding_attention": {...}})."""
    given = config.get("rope_parameters") or {}
    full = dict(given.get("full_attention") or {"rope_type": "default"})
    full.update(config.get("rope_scaling") or {})
    full.setdefault("rope_theta", config.get("rope_theta") or _GLOBAL_THETA)
    sliding = dict(given.get("sliding_attention") or {"rope_type": "default"})
    sliding.setdefault("rope_theta", config.get("rope_local_base_freq") or _LOCAL_THETA)
    return {"full_attention": full, "sliding_attention": sliding}


def gemma3_config(config: dict[str, Any], max_positions: int) -> Gemma3Config:
    """Gemma3Config from either architecture's config.json; ValueError for what this module does not serve."""
    text = text_config(config)
    ropes = {kind: parse_rope({"rope_parameters": params, "max_position_embeddings": text["max_position_embeddings"]})
             for kind, params in text["rope_parameters"].items()}
    gemma = gemma_config({**text, "rope_parameters": text["rope_parameters"]["full_attention"]}, max_positions,
                         "Gemma 3")
    shared = {field.name: getattr(gemma, field.name) for field in fields(gemma)}
    shared.update(rope=ropes["full_attention"], attn_logit_softcap=None)
    if text["architectures"][0] == MULTIMODAL:
        shared["final_logit_softcap"] = None
    return Gemma3Config(**shared, local_rope=ropes["sliding_attention"])


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    gemma = gemma3_config(config, max_positions=1)
    return AttentionShape(num_layers=gemma.num_layers, num_heads=gemma.num_heads, num_kv_heads=gemma.num_kv_heads,
                          head_dim=gemma.head_dim, scale=gemma.query_pre_attn_scalar**-0.5,
                          layer_windows=gemma.layer_windows)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> Gemma3ForCausalLM:
    model_class = Gemma3TextOnly if config["architectures"][0] == MULTIMODAL else Gemma3ForCausalLM
    return model_class(gemma3_config(config, max_positions), backend)


class Gemma3Attention(Attention):
    """Llama's attention with per-head q/k norms in Gemma's form (1 + weight), applied before rope."""

    def __init__(self, config: DecoderConfig, backend: AttentionBackend, window: int | None = None) -> None:
        super().__init__(config, backend, window)
        self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    attention_class = Gemma3Attention


class Gemma3Model(Gemma2Model):
    layer_class = Gemma3DecoderLayer

    def __init__(self, config: Gemma3Config, backend: AttentionBackend) -> None:
        super().__init__(config, backend)
        self.rotary_emb_local = RotaryEmbedding(config.head_dim, config.max_positions, config.local_rope)


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Serves Gemma3ForCausalLM checkpoints."""

    decoder_class = Gemma3Model
    config: Gemma3Config

    def build_buffers(self, device: torch.device) -> None:
        """Both rotary tables and the embedding scale, once the weights are loaded."""
        super().build_buffers(device)
        self.model.rotary_emb_local.build(device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden_size], final norm applied."""
        hidden = self.embed(input_ids)
        global_rope = self.model.rotary_emb.lookup(positions, hidden.dtype)
        local_rope = self.model.rotary_emb_local.lookup(positions, hidden.dtype)
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            cos, sin = global_rope if layer.self_attn.window is None else local_rope
            hidden = layer(hidden, cos, sin, kv_cache, metadata)
        return self.model.norm(hidden)


class Gemma3TextOnly(Gemma3ForCausalLM):
    """Serves Gemma3ForConditionalGeneration checkpoints' language model (text prompts only)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_language_model_weights(weights))


def _language_model_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A multimodal checkpoint's language model tensors under Gemma3ForCausalLM's names; vision skipped.

    "language_model.model.layers.0.mlp.up_proj.weight" -> "model.layers.0.mlp.up_proj.weight"
    "model.language_model.layers.0.mlp.up_proj.weight" -> "model.layers.0.mlp.up_proj.weight"
    "language_model.lm_head.weight" -> "lm_head.weight"; "model.vision_tower.*", "multi_modal_projector.*" -> skipped
    """
    for name, tensor in weights:
        bare = name.removeprefix("model.")
        if bare.startswith(("vision_tower.", "multi_modal_projector.")):
            continue
        if name.startswith("model.language_model."):
            yield "model." + name.removeprefix("model.language_model."), tensor
        else:  # language_model.model.*, language_model.lm_head.*, lm_head.*; anything else fails in load_weights
            yield name.removeprefix("language_model."), tensor
