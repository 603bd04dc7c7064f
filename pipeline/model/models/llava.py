"""LLaVA (HF LlavaForConditionalGeneration): a CLIP vision tower, a two-layer projector and a language
model from llama.py (Llama, Mistral, Qwen2 text configs).

An image becomes `num_image_tokens` embeddings: the chosen vision layer's hidden states (without the
class token under vision_feature_select_strategy "default", with it under "full"), through the
projector (linear, activation, linear). Intake expands each `<image>` token of the prompt into that
many placeholder tokens; the runner puts the image's embeddings in place of the placeholders'
token embeddings, and the language model runs as for text.

Checkpoints name their tensors in two layouts, both read here:
  transformers 4.x / llava-hf:  language_model.model.*, language_model.lm_head.*, vision_tower.vision_model.*,
                                multi_modal_projector.*
  transformers 5 (saved as):    language_model.model.*, language_model.lm_head.*, vision_tower.*, ...
  transformers 5 (in memory):   model.language_model.*, lm_head.*, model.vision_tower.*, model.multi_modal_projector.*
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.models import llama
from pipeline.model.models.clip import CLIPVisionTower, VisionConfig, activation, vision_config

# text_config.model_type -> the architecture name llama.py reads its flags from
_TEXT_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SELECT_STRATEGIES = ("default", "full")


@dataclass(frozen=True, slots=True)
class LlavaSpec:
    vision: VisionConfig
    text: dict[str, Any]  # the language model's config.json, as llama.py reads it
    feature_layers: tuple[int, ...]
    select_strategy: str  # "default": drop the class token; "full": keep it
    projector_act: str
    projector_bias: bool
    image_token_id: int

    @property
    def num_image_tokens(self) -> int:
        return self.vision.num_patches + (self.select_strategy == "full")


@functools.lru_cache(maxsize=8)
def _complete(config_json: str) -> dict[str, Any]:
    # Checkpoints leave out sub-config values equal to transformers' defaults (llava-1.5's text_config
    # has no hidden_size): LlavaConfig fills them in.
    from transformers import LlavaConfig

    config = json.loads(config_json)
    return LlavaConfig(**{k: v for k, v in config.items() if k != "architectures"}).to_dict()


def complete_config(config: dict[str, Any]) -> dict[str, Any]:
    return _complete(json.dumps(config, sort_keys=True))


def llava_spec(config: dict[str, Any]) -> LlavaSpec:
    full = complete_config(config)
    text = dict(full["text_config"])
    text_type = text.get("model_type")
    if text_type not in _TEXT_ARCHITECTURES:
        raise ValueError(f"text_config.model_type must be one of {', '.join(_TEXT_ARCHITECTURES)}, got {text_type!r}")
    text["architectures"] = [_TEXT_ARCHITECTURES[text_type]]
    strategy = full.get("vision_feature_select_strategy", "default")
    if strategy not in SELECT_STRATEGIES:
        raise ValueError(f"vision_feature_select_strategy must be one of {SELECT_STRATEGIES}, got {strategy!r}")
    layers = full.get("vision_feature_layer", -2)
    image_token_id = config.get("image_token_index", config.get("image_token_id", full.get("image_token_id")))
    if image_token_id is None:
        raise ValueError("config.json names no image_token_index (the <image> placeholder's token id)")
    projector_act = full.get("projector_hidden_act", "gelu")
    activation(projector_act)
    return LlavaSpec(vision=vision_config(full["vision_config"]), text=text,
                     feature_layers=(layers,) if isinstance(layers, int) else tuple(layers),
                     select_strategy=strategy, projector_act=projector_act,
                     projector_bias=bool(full.get("multimodal_projector_bias", True)),
                     image_token_id=int(image_token_id))


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config (vocab_size, max_position_embeddings, eos_token_id, ...)."""
    return llava_spec(config).text


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    return llama.attention_shape(text_config(config))


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> LlavaForConditionalGeneration:
    return LlavaForConditionalGeneration(llava_spec(config), backend, max_positions)


@dataclass(slots=True)
class ImageEmbeddings:
    """Rows of the flat token axis that hold image placeholders, and their embeddings [len(rows), hidden]."""

    token_indices: torch.Tensor
    embeddings: torch.Tensor


class MultiModalProjector(nn.Module):
    def __init__(self, in_size: int, out_size: int, act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_size, out_size, bias=bias)
        self.linear_2 = nn.Linear(out_size, out_size, bias=bias)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(nn.Module):
    def __init__(self, spec: LlavaSpec, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__()
        self.spec = spec
        self.vision_tower = CLIPVisionTower(spec.vision, spec.feature_layers)
        text = llama.decoder_config(spec.text, max_positions)
        self.multi_modal_projector = MultiModalProjector(spec.vision.hidden_size * len(spec.feature_layers),
                                                         text.hidden_size, spec.projector_act, spec.projector_bias)
        self.language_model = llama.LlamaForCausalLM(text, backend)

    def tie_weights(self) -> None:
        self.language_model.tie_weights()

    def build_buffers(self, device: torch.device) -> None:
        self.language_model.build_buffers(device)

    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W] -> image embeddings [N, num_image_tokens, text hidden]."""
        states = self.vision_tower(pixel_values)
        if self.spec.select_strategy == "default":
            states = [state[:, 1:] for state in states]  # drop the class token
        return self.multi_modal_projector(torch.cat(states, dim=-1))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object,
                kv_caches: list[torch.Tensor], images: ImageEmbeddings | None = None) -> torch.Tensor:
        hidden = self.language_model.model.embed_tokens(input_ids)
        if images is not None:
            hidden = hidden.index_copy(0, images.token_indices, images.embeddings.to(hidden.dtype))
        return self.language_model.forward_embeddings(hidden, positions, metadata, kv_caches)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        own = dict(self.named_parameters())
        loaded: set[str] = set()
        text: list[tuple[str, torch.Tensor]] = []
        for name, tensor in weights:
            part, rest = _route(name)
            if part == "language_model":
                text.append((rest, tensor))
                continue
            target = f"{part}.{rest}"
            if target not in own:
                if part == "vision_tower" and _unused_vision_weight(rest, len(self.vision_tower.encoder.layers)):
                    continue  # layers past the deepest feature layer, and the pooled output's norm
                raise ValueError(f"unexpected weight in checkpoint: {name}")
            if own[target].shape != tensor.shape:
                raise ValueError(f"weight {name} has shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(own[target].shape)}")
            with torch.no_grad():
                own[target].copy_(tensor)
            loaded.add(target)
        self.language_model.load_weights(iter(text))
        missing = sorted(name for name in own if not name.startswith("language_model.") and name not in loaded)
        if missing:
            raise ValueError(f"checkpoint is missing weights: {missing[:8]}")


def _route(name: str) -> tuple[str, str]:
    """Checkpoint name -> (part, name inside it), for every layout in the module docstring.

    "language_model.model.layers.0.mlp.up_proj.weight" -> ("language_model", "model.layers.0.mlp.up_proj.weight")
    "model.language_model.layers.0.mlp.up_proj.weight" -> ("language_model", "model.layers.0.mlp.up_proj.weight")
    "vision_tower.vision_model.pre_layrnorm.weight"    -> ("vision_tower", "pre_layrnorm.weight")
    """
    if name.startswith("lm_head."):
        return "language_model", name
    if name.startswith("model.language_model."):
        return "language_model", "model." + name.removeprefix("model.language_model.")
    name = name.removeprefix("model.")
    part, _, rest = name.partition(".")
    if part == "vision_tower":
        rest = rest.removeprefix("vision_model.")
    if part not in ("language_model", "vision_tower", "multi_modal_projector"):
        raise ValueError(f"unexpected weight in checkpoint: {name}")
    return part, rest


def _unused_vision_weight(name: str, num_layers_used: int) -> bool:
    if name.startswith("post_layernorm."):
        return True
    if name.startswith("encoder.layers."):
        return int(name.split(".")[2]) >= num_layers_used
    return False

