"""YaRN rope scaling (https://arxiv.org/abs/2309.00071), as HF transformers' `_compute_yarn_parameters`.

Frequencies that turn fewer than `beta_slow` times over the original context are interpolated
(divided by `factor`), those turning more than `beta_fast` times kept, and a linear ramp over the
dimensions between blends the two. cos and sin are then multiplied by an attention factor
(0.1 * ln(factor) + 1 by default), which scales every q . k by its square.
"""

from __future__ import annotations

import math

import torch


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """The cos/sin multiplier when the config gives no `attention_factor` (DeepSeek's pair of mscales, or
    the paper's 0.1 * ln(factor) + 1)."""
    if mscale and mscale_all_dim:
        return _mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
    return _mscale(factor)


def _mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(dim: int, theta: float, factor: float, original_max_positions: int, beta_fast: float,
                  beta_slow: float, truncate: bool) -> torch.Tensor:
    """Inverse frequencies [dim // 2] (float32), with HF's op order (1 / (factor * base^e), not inv_freq / factor)."""
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    extrapolated = 1.0 / pos_freqs
    interpolated = 1.0 / (factor * pos_freqs)
    low, high = _correction_range(beta_fast, beta_slow, dim, theta, original_max_positions, truncate)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: the dimension keeps its frequency, 0: it is interpolated
    return interpolated * (1 - keep) + extrapolated * keep


def _correction_range(beta_fast: float, beta_slow: float, dim: int, theta: float, original_max_positions: int,
                      truncate: bool) -> tuple[float, float]:
    """The dimensions where the ramp starts and ends: those turning beta_fast and beta_slow times."""

    def dim_of(rotations: float) -> float:
        return dim * math.log(original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)
