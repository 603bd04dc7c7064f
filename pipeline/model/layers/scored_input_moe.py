"""Llama 4's mixture-of-experts MLP, as HF transformers computes it (Llama4TextMoe):

- the router (a Linear without bias) picks the top-k logits per token; each picked expert's score is
  sigmoid(logit), computed in float32 and rounded to the model dtype (not a softmax: scores need not
  sum to 1, and the other experts score sigmoid(-inf) = 0);
- the score multiplies the expert's *input*, not its output: a token sends x * score to each picked
  expert, and the expert's SwiGLU runs on that (down(silu(gate(x s)) * up(x s)), no biases: an
  expert given 0 returns 0, which is why HF can run every expert on every token);
- a shared SwiGLU expert sees every token unscaled; the output is shared(x) + the sum of the k
  routed outputs, in the model dtype;
- the experts' weights keep HF's layout, input-major: gate_up_proj [E, H, 2I] (gate = columns
  0..I, up = I..2I) and down_proj [E, I, H].
Experts run grouped by expert, as in moe.py (sort_by_expert, expert_matmul).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.moe import expert_matmul, sort_by_expert


class InputMajorExperts(nn.Module):
    """All experts' SwiGLU weights in HF's Llama 4 layout (`feed_forward.experts.*`)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden_size, 2 * intermediate_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """x [T, H], expert_ids and scores [T, k] -> [T, H]: the sum of each token's experts run on x * score."""
        num_tokens, top_k = expert_ids.shape
        order, offsets = sort_by_expert(expert_ids, self.gate_up_proj.shape[0])
        rows = x[order // top_k] * scores.reshape(-1)[order].unsqueeze(-1)  # the scaled inputs, by expert
        # expert_matmul takes [E, out, in]: the transposed views are HF's input-major weights as they are.
        gate, up = expert_matmul(rows, self.gate_up_proj.transpose(-2, -1), offsets).chunk(2, dim=-1)
        out_sorted = expert_matmul(F.silu(gate) * up, self.down_proj.transpose(-2, -1), offsets)
        out = torch.empty_like(out_sorted).index_copy_(0, order, out_sorted)  # back to pair order
        return out.view(num_tokens, top_k, -1).sum(dim=1)


class ScoredInputMoE(nn.Module):
    """x [T, H] -> shared_expert(x) + sum over the top-k experts e of expert_e(x * sigmoid(logit_e))."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 shared_intermediate_size: int) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in 1..{num_experts}, got {top_k}")
        self.top_k = top_k
        self.router = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = InputMajorExperts(num_experts, hidden_size, intermediate_size)
        self.shared_expert = GatedMLP(hidden_size, shared_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top_logits, expert_ids = torch.topk(self.router(x), self.top_k, dim=-1)
        scores = torch.sigmoid(top_logits.float()).to(x.dtype)
        return self.shared_expert(x) + self.experts(x, expert_ids, scores)
