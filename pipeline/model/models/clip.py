"""CLIP's vision encoder (HF CLIPVisionModel), as LLaVA uses it: the hidden states of chosen layers.

An image [3, H, W] is cut into (H / patch) x (W / patch) patches by a strided convolution; a learned
class embedding is put in front, learned position embeddings added, then a pre-layernorm and the
encoder layers (pre-norm attention over all patches, no mask, and a two-layer MLP). With image_size
32 and patch_size 8: 16 patches + the class token = 17 positions.

`hidden_states[0]` is the input of the first layer (after the pre-layernorm) and `hidden_states[i]`
the output of layer i, as in HF, so a negative `vision_feature_layer` counts from the end of the
whole encoder (-2: the output of the second-to-last layer). Only the layers up to the deepest one
asked for are built and run; the post-layernorm (used for CLIP's pooled output) is never needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "quick_gelu": quick_gelu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


@dataclass(frozen=True, slots=True)
class VisionConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int  # in the checkpoint
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int
    layer_norm_eps: float
    hidden_act: str

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def layer_index(self, feature_layer: int) -> int:
        """A vision_feature_layer (negative: from the end) as an index into hidden_states [0, num_layers]."""
        index = feature_layer + self.num_layers + 1 if feature_layer < 0 else feature_layer
        if not 0 <= index <= self.num_layers:
            raise ValueError(f"vision_feature_layer {feature_layer} is outside the encoder's "
                             f"{self.num_layers + 1} hidden states")
        return index


def vision_config(config: dict[str, Any]) -> VisionConfig:
    """VisionConfig from a complete CLIPVisionConfig dict (LLaVA's `vision_config`)."""
    model_type = config.get("model_type", "clip_vision_model")
    if model_type != "clip_vision_model":
        raise ValueError(f"vision_config.model_type must be clip_vision_model, got {model_type!r}")
    if config["image_size"] % config["patch_size"]:
        raise ValueError(f"vision_config.image_size {config['image_size']} must be a multiple of "
                         f"patch_size {config['patch_size']}")
    if config.get("num_channels", 3) != 3:
        raise ValueError(f"vision_config.num_channels must be 3 (images are decoded as RGB), "
                         f"got {config['num_channels']}")
    activation(config["hidden_act"])  # fail at load time, naming the activation
    return VisionConfig(hidden_size=config["hidden_size"], intermediate_size=config["intermediate_size"],
                        num_layers=config["num_hidden_layers"], num_heads=config["num_attention_heads"],
                        image_size=config["image_size"], patch_size=config["patch_size"],
                        num_channels=3,
                        layer_norm_eps=float(config.get("layer_norm_eps", 1e-5)), hidden_act=config["hidden_act"])


class VisionEmbeddings(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.class_embedding = nn.Parameter(torch.empty(config.hidden_size))
        self.patch_embedding = nn.Conv2d(config.num_channels, config.hidden_size, kernel_size=config.patch_size,
                                         stride=config.patch_size, bias=False)
        self.position_embedding = nn.Embedding(config.num_patches + 1, config.hidden_size,
                                               _weight=torch.empty(config.num_patches + 1, config.hidden_size))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W] -> [N, 1 + patches, hidden]: class token first, patches in row-major order."""
        patches = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))
        patches = patches.flatten(2).transpose(1, 2)  # [N, hidden, h, w] -> [N, h * w, hidden]
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


class VisionAttention(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # [N, L, hidden] -> [N, heads, L, head_dim]
            return t.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, hidden))


class VisionMLP(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionEncoderLayer(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = VisionAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = VisionMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoder(nn.Module):
    def __init__(self, config: VisionConfig, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionEncoderLayer(config) for _ in range(num_layers))


class CLIPVisionTower(nn.Module):
    """Module names follow HF's CLIPVisionModel (`embeddings`, `pre_layrnorm`, `encoder.layers`)."""

    def __init__(self, config: VisionConfig, feature_layers: tuple[int, ...]) -> None:
        super().__init__()
        self.config = config
        self.feature_indices = tuple(config.layer_index(layer) for layer in feature_layers)
        self.embeddings = VisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.encoder = VisionEncoder(config, num_layers=max(self.feature_indices))

    def forward(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """[N, C, H, W] -> the hidden states [N, 1 + patches, hidden] of each feature layer, in order."""
        hidden = self.pre_layrnorm(self.embeddings(pixel_values))
        states = [hidden]
        for layer in self.encoder.layers:
            hidden = layer(hidden)
            states.append(hidden)
        return [states[index] for index in self.feature_indices]
