"""Rotary position embedding: settings from either HF config form, inverse frequencies (default, linear,
llama3 and YaRN scaling: layers/yarn.py), and the rotation in two layouts (rotate-half, and GLM's
interleaved pairs over the leading part of a head); cos/sin computed in float32 and cast to the
activation dtype, as HF transformers does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipeline.model.layers.yarn import yarn_attention_factor, yarn_inv_freq


@dataclass(frozen=True, slots=True)
class RopeParams:
    """Rotary embedding settings, normalised from either HF config form (see loader)."""

    theta: float = 10000.0
    rope_type: str = "default"  # "default", "linear" (inv_freq / factor: Gemma 3's global layers) or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # YaRN (layers/yarn.py): the ramp's rotation bounds, whether its ends are rounded to whole dims,
    # and the factor cos and sin are multiplied by (1.0 for every other type).
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0


def parse_rope(config: dict[str, Any]) -> RopeParams:
    """Rope settings from an HF config: `rope_parameters` (v5) or `rope_theta` + `rope_scaling` (older)."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    if rope_type == "default":
        return RopeParams(theta=theta)
    if rope_type == "linear":
        return RopeParams(theta=theta, rope_type="linear", factor=float(params["factor"]))
    if rope_type == "yarn":
        return _parse_yarn(params, config, theta)
    if rope_type != "llama3":
        raise ValueError(f"rope type must be 'default', 'linear', 'llama3' or 'yarn', got {rope_type!r}")
    original = params.get("original_max_position_embeddings", config.get("max_position_embeddings", 8192))
    return RopeParams(theta=theta, rope_type="llama3", factor=float(params["factor"]),
                      low_freq_factor=float(params["low_freq_factor"]),
                      high_freq_factor=float(params["high_freq_factor"]),
                      original_max_position_embeddings=int(original))


def _parse_yarn(params: dict[str, Any], config: dict[str, Any], theta: float) -> RopeParams:
    # HF's defaults: factor from the context growth, beta_fast 32, beta_slow 1, truncated ramp ends.
    original = int(params.get("original_max_position_embeddings") or config["max_position_embeddings"])
    factor = float(params.get("factor") or config["max_position_embeddings"] / original)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = yarn_attention_factor(factor, params.get("mscale"), params.get("mscale_all_dim"))
    return RopeParams(theta=theta, rope_type="yarn", factor=factor, original_max_position_embeddings=original,
                      beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                      truncate=bool(params.get("truncate", True)), attention_factor=float(attention_factor))


def rope_inv_freq(head_dim: int, params: RopeParams) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] (float32), with linear, llama3 or YaRN scaling when asked."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (params.theta**exponents)
    if params.rope_type == "default":
        return inv_freq
    if params.rope_type == "linear":
        return inv_freq / params.factor  # HF divides in place, after the default frequencies
    if params.rope_type == "yarn":
        return yarn_inv_freq(head_dim, params.theta, params.factor, params.original_max_position_embeddings,
                             params.beta_fast, params.beta_slow, params.truncate)
    if params.rope_type != "llama3":
        raise ValueError(f"rope_type must be 'default', 'linear', 'llama3' or 'yarn', got {params.rope_type!r}")
    return _llama3_scale(inv_freq, params)


def _llama3_scale(inv_freq: torch.Tensor, params: RopeParams) -> torch.Tensor:
    # Long wavelengths are divided by `factor`, short ones kept, the band between interpolated.
    old_len = params.original_max_position_embeddings
    low_freq_wavelen = old_len / params.low_freq_factor
    high_freq_wavelen = old_len / params.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / params.factor, inv_freq)
    smooth = (old_len / wavelen - params.low_freq_factor) / (params.high_freq_factor - params.low_freq_factor)
    smoothed = (1 - smooth) * scaled / params.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Neox-style (rotate-half) rotary embedding with a cos/sin table per position.

    The table is a non-persistent buffer so it is rebuilt, not loaded; call `build` after the
    module was created on the meta device.
    """

    def __init__(self, head_dim: int, max_positions: int, params: RopeParams) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.params = params
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)

    def build(self, device: torch.device | str) -> None:
        inv_freq = rope_inv_freq(self.head_dim, self.params).to(device)
        positions = torch.arange(self.max_positions, device=device, dtype=torch.int64).float()
        freqs = positions[:, None] * inv_freq[None, :]  # [P, D/2]
        self.cos_sin = torch.stack([freqs.cos(), freqs.sin()])  # [2, P, D/2] float32
        if self.params.attention_factor != 1.0:  # YaRN: HF scales cos and sin in float32, before the cast
            self.cos_sin = self.cos_sin * self.params.attention_factor

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for each token: [T, 1, D/2], shared by every layer of one step."""
        cos_sin = self.cos_sin[:, positions].to(dtype)
        return cos_sin[0].unsqueeze(1), cos_sin[1].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, D] by per-token angles; cos/sin [T, 1, D/2].

    HF computes x * cat(cos, cos) + rotate_half(x) * cat(sin, sin) with rotate_half(x) =
    cat(-x2, x1); written on the two halves that is the same arithmetic:
        out1 = x1 * cos - x2 * sin
        out2 = x2 * cos + x1 * sin
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def apply_rotary_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of x [T, H, D]'s first 2 * cos.shape[-1] dims; the rest pass through.

    GLM-4's layout (partial rotary): HF repeats each angle twice ([c0, c0, c1, c1, ...]) and rotates
    pairs (x0, x1) -> (-x1, x0), i.e. per pair i:
        out[2i]     = x[2i] * cos_i - x[2i + 1] * sin_i
        out[2i + 1] = x[2i + 1] * cos_i + x[2i] * sin_i
    Example, head_dim 8 and cos [T, 1, 2]: dims (0, 1) turn by angle 0, (2, 3) by angle 1, 4..7 stay.
    """
    rotary_dim = 2 * cos.shape[-1]
    pairs = x[..., :rotary_dim].unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)
