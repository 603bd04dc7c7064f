"""gpt-oss's mixture-of-experts MLP, as HF transformers computes it (GptOssMLP, its grouped_mm experts path):

- the router has a bias; per token the top-k logits are softmaxed among themselves, in the model dtype
  (not a softmax over every expert followed by top-k, as in moe.py);
- experts have biases, and a clamped SwiGLU: gate <= limit, -limit <= up <= limit,
  out = (up + 1) * gate * sigmoid(alpha * gate);
- weights keep HF's layout, input-major: gate_up_proj [E, H, 2I] with gate and up interleaved by
  column (gate = columns 0, 2, 4, ..., up = 1, 3, 5, ...), gate_up_proj_bias [E, 2I], down_proj
  [E, I, H], down_proj_bias [E, H];
- each (token, expert) output is scaled by its routing weight and a token's k are summed, in the
  model dtype.
Experts run grouped by expert, as in moe.py (sort_by_expert, expert_matmul).
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.model.layers.moe import expert_matmul, sort_by_expert


class ClampedSwiGLUExperts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, alpha: float,
                 limit: float) -> None:
        super().__init__()
        self.alpha, self.limit = alpha, limit
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden_size, 2 * intermediate_size))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden_size))

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, H], expert_ids and weights [T, k] -> [T, H]: each token's weighted sum of its experts."""
        num_tokens, top_k = expert_ids.shape
        order, offsets = sort_by_expert(expert_ids, self.gate_up_proj.shape[0])
        experts = expert_ids.reshape(-1)[order]
        # expert_matmul takes [E, out, in]: the transposed views are HF's input-major weights as they are.
        gate_up = expert_matmul(x[order // top_k], self.gate_up_proj.transpose(-2, -1), offsets)
        gated = clamped_swiglu(gate_up + self.gate_up_proj_bias[experts], self.alpha, self.limit)
        out = expert_matmul(gated, self.down_proj.transpose(-2, -1), offsets) + self.down_proj_bias[experts]
        weighted_sorted = out * weights.reshape(-1)[order].unsqueeze(-1)
        weighted = torch.empty_like(weighted_sorted).index_copy_(0, order, weighted_sorted)  # back to pair order
        return weighted.view(num_tokens, top_k, -1).sum(dim=1).to(x.dtype)


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """[S, 2I] interleaved (gate, up) columns -> [S, I], HF's op order."""
    gate = gate_up[..., ::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


class BiasedTopKMoE(nn.Module):
    """x [T, H] -> sum over the top-k experts of softmax(top-k router logits) * expert(x)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int, *,
                 alpha: float, limit: float) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in 1..{num_experts}, got {top_k}")
        self.top_k = top_k
        self.router = nn.Linear(hidden_size, num_experts, bias=True)
        self.experts = ClampedSwiGLUExperts(num_experts, hidden_size, intermediate_size, alpha, limit)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top_logits, expert_ids = torch.topk(self.router(x), self.top_k, dim=-1)
        weights = torch.softmax(top_logits, dim=-1, dtype=top_logits.dtype)
        return self.experts(x, expert_ids, weights)
