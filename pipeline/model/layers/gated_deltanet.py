"""The gated DeltaNet token mixer (linear attention) of Qwen3-Next and Qwen3.5, as HF transformers computes it.

For each token x: one projection gives the query, key and value channels (qkv), the output gate z and the
per-value-head b and a; qkv goes through a short causal depthwise convolution (kernel
`linear_conv_kernel_dim`, SiLU after it) that reaches back into the sequence's earlier tokens; then

    beta = sigmoid(b),  g = -exp(A_log) * softplus(a + dt_bias)       (float32)
    o = gated delta rule(q, k, v, g, beta) over the sequence's state (gated_delta.py)
    out = out_proj(RMSNorm(o) * weight * silu(z))                     per value head

The convolution window and the recurrent state live in the step's state pool (recurrent_state.py), not
in the paged KV cache. The projection fuses the checkpoint's in_proj_qkv, in_proj_z, in_proj_b and in_proj_a
(Qwen3.5's names; the family module regroups Qwen3-Next's in_proj_qkvz and in_proj_ba into them) as rows
[q | k | v | z | b | a].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.layers.gated_delta import causal_conv, gated_delta_rule
from pipeline.model.layers.recurrent_state import StateStep


class GatedRMSNorm(nn.Module):
    """RMSNorm of each value head's output, scaled by weight (not 1 + weight) and by silu(gate) in float32
    (HF's Qwen3NextRMSNormGated: normalise in float32, round, scale by the weight, then the gate)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x_f32 = x.float()
        normed = x_f32 * torch.rsqrt(x_f32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * normed.to(x.dtype) * F.silu(gate.float())).to(x.dtype)


class DepthwiseConvWeight(nn.Module):
    """Holds the convolution's weight under the checkpoint's name (`conv1d.weight`, [channels, 1, kernel])."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))


class GatedDeltaNet(nn.Module):
    def __init__(self, hidden_size: int, num_key_heads: int, num_value_heads: int, key_dim: int, value_dim: int,
                 conv_kernel: int, eps: float, state_index: int) -> None:
        super().__init__()
        if num_value_heads % num_key_heads:
            raise ValueError(f"linear_num_value_heads ({num_value_heads}) must be a multiple of "
                             f"linear_num_key_heads ({num_key_heads})")
        self.num_key_heads, self.num_value_heads = num_key_heads, num_value_heads
        self.key_dim, self.value_dim = key_dim, value_dim
        self.key_size, self.value_size = num_key_heads * key_dim, num_value_heads * value_dim
        self.conv_channels = 2 * self.key_size + self.value_size
        self.state_index = state_index  # this layer's entry in the state pool
        self.in_proj = nn.Linear(hidden_size, self.conv_channels + self.value_size + 2 * num_value_heads, bias=False)
        self.conv1d = DepthwiseConvWeight(self.conv_channels, conv_kernel)
        self.A_log = nn.Parameter(torch.empty(num_value_heads))
        self.dt_bias = nn.Parameter(torch.ones(num_value_heads))
        self.norm = GatedRMSNorm(value_dim, eps)
        self.out_proj = nn.Linear(self.value_size, hidden_size, bias=False)

    @property
    def projection_sizes(self) -> list[int]:
        """The fused projection's parts, in row order: qkv, z, b, a."""
        return [self.conv_channels, self.value_size, self.num_value_heads, self.num_value_heads]

    def forward(self, x: torch.Tensor, states: StateStep) -> torch.Tensor:
        """x [T, hidden] (rows past states.num_tokens are padding: zeros out) -> [T, hidden]."""
        num_tokens = states.num_tokens
        qkv, z, b, a = self.in_proj(x[:num_tokens]).split(self.projection_sizes, dim=-1)
        mixed = causal_conv(qkv, self.conv1d.weight[:, 0], states.conv[self.state_index], states)
        q, k, v = mixed.split([self.key_size, self.key_size, self.value_size], dim=-1)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        core = gated_delta_rule(q.reshape(num_tokens, self.num_key_heads, self.key_dim),
                                k.reshape(num_tokens, self.num_key_heads, self.key_dim),
                                v.reshape(num_tokens, self.num_value_heads, self.value_dim), g, beta,
                                states.recurrent[self.state_index], states)
        normed = self.norm(core.reshape(-1, self.value_dim), z.reshape(-1, self.value_dim))
        out = self.out_proj(normed.reshape(num_tokens, self.value_size))
        if x.shape[0] > num_tokens:
            out = F.pad(out, (0, 0, 0, x.shape[0] - num_tokens))
        return out
