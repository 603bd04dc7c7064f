"""Gemma 4 multimodal checkpoints (Gemma4ForConditionalGeneration) served text only: the language
model of gemma4.py, as HF transformers runs it when a request has no images, video or audio:
- its settings are config.json's `text_config` (Gemma4TextConfig's defaults for keys left out) and
  the top-level `tie_word_embeddings`;
- a prompt's image, video and audio placeholder ids are read as the pad token (HF swaps them before
  both embeddings, whether or not media come with them);
- the language model's weights are `model.language_model.*`; the vision and audio towers and their
  embedders are skipped. The final logits are soft-capped as in Gemma4ForCausalLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.models import gemma4
from pipeline.model.models.gemma4_config import Gemma4Config, gemma4_config, with_defaults

# Gemma4Config's defaults for the placeholder ids a config.json may leave out.
_PLACEHOLDER_DEFAULTS = {"image_token_id": 258_880, "video_token_id": 258_884, "audio_token_id": 258_881}
_SKIPPED = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config (vocab_size, max_position_embeddings, eos_token_id, ...)."""
    return with_defaults({**config.get("text_config", {}), "architectures": ["Gemma4ForCausalLM"],
                          "tie_word_embeddings": config.get("tie_word_embeddings", True)})


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    return gemma4.attention_shape(text_config(config))


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> Gemma4TextOnly:
    placeholders = tuple(int(config.get(key, default)) for key, default in _PLACEHOLDER_DEFAULTS.items())
    text = text_config(config)
    return Gemma4TextOnly(gemma4_config(text, max_positions), backend, placeholders, int(text["pad_token_id"] or 0))


class Gemma4TextOnly(gemma4.Gemma4ForCausalLM):
    """Serves Gemma4ForConditionalGeneration checkpoints' language model (text prompts only)."""

    def __init__(self, config: Gemma4Config, backend: AttentionBackend, placeholder_ids: tuple[int, ...],
                 pad_token_id: int) -> None:
        super().__init__(config, backend)
        self.placeholder_ids = placeholder_ids
        self.pad_token_id = pad_token_id
        self.register_buffer("placeholders", torch.empty(0, dtype=torch.long), persistent=False)

    def build_buffers(self, device: torch.device) -> None:
        """The model's buffers and the placeholder ids on the device (a CUDA graph's replay creates no tensor)."""
        super().build_buffers(device)
        self.placeholders = torch.tensor(self.placeholder_ids, dtype=torch.long, device=device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        input_ids = torch.where(torch.isin(input_ids, self.placeholders), self.pad_token_id, input_ids)
        return super().forward(input_ids, positions, metadata, kv_caches)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_language_model_weights(weights))


def _language_model_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """"model.language_model.layers.0.q_proj.weight" -> "model.layers.0.q_proj.weight"; towers skipped."""
    for name, tensor in weights:
        if name.startswith(_SKIPPED):
            continue
        yield ("model." + name.removeprefix("model.language_model.") if name.startswith("model.language_model.")
               else name), tensor
