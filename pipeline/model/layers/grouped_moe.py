"""Mixture of experts with grouped top-k routing and always-on shared experts (DeepSeek-V2/V3).

Routing, as HF transformers' DeepseekV2TopkRouter / DeepseekV3TopkRouter compute it, all in float32:
- scores: softmax (V2) or sigmoid (V3) of the router logits (hidden.float() @ weight.float()^T);
- choice scores: the scores, plus `e_score_correction_bias` for noaux_tc (V3: it steers which
  experts are picked, never their weights);
- greedy: the top k of all experts. Grouped methods first split the E experts into n_group
  contiguous groups of E / n_group, rank the groups, keep topk_group of them and pick the top k
  experts inside those: group_limited_greedy ranks a group by its best expert (masked experts
  score 0, V2), noaux_tc by the sum of its best two (masked experts -inf, V3);
- weights: the picked experts' scores (without the bias), renormalised to sum to 1 when
  norm_topk_prob (+1e-20, V3), times routed_scaling_factor.
Worked example, 8 experts in 4 groups of 2, k 2, group_limited_greedy with topk_group 1: scores
[.30 .05 | .02 .03 | .25 .20 | .10 .05] -> group bests [.30 .03 .25 .10] -> only group 0 kept ->
experts 0 (.30) and 1 (.05), where greedy takes 0 (.30) and 4 (.25).

The routed experts run grouped by expert (layers/moe.py's grouped_experts: float32 weights, the k
results summed in float32); the shared experts are one SwiGLU MLP of n_shared_experts *
moe_intermediate_size added unscaled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.moe import ExpertWeights, grouped_experts

TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
SCORING_FUNCS = ("softmax", "sigmoid")


@dataclass(frozen=True, slots=True)
class GroupedRouting:
    num_experts: int
    top_k: int
    topk_method: str = "greedy"
    scoring_func: str = "softmax"
    num_groups: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.topk_method not in TOPK_METHODS:
            raise ValueError(f"topk_method must be one of {TOPK_METHODS}, got {self.topk_method!r}")
        if self.scoring_func not in SCORING_FUNCS:
            raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {self.scoring_func!r}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok must be in 1..{self.num_experts}, got {self.top_k}")
        if self.topk_method != "greedy":
            if self.num_groups < 1 or self.num_experts % self.num_groups:
                raise ValueError(f"n_group ({self.num_groups}) must divide the {self.num_experts} routed experts")
            if not 1 <= self.topk_group <= self.num_groups:
                raise ValueError(f"topk_group must be in 1..{self.num_groups} (n_group), got {self.topk_group}")
            if self.top_k > self.topk_group * (self.num_experts // self.num_groups):
                raise ValueError(f"num_experts_per_tok ({self.top_k}) must fit in the topk_group ({self.topk_group}) "
                                 f"kept groups of {self.num_experts // self.num_groups} experts")
        if self.topk_method == "noaux_tc" and self.num_experts // self.num_groups < 2:
            raise ValueError("noaux_tc ranks a group by its best two experts: n_group must leave >= 2 per group")

    @property
    def has_correction_bias(self) -> bool:
        return self.topk_method == "noaux_tc"


def grouped_route(logits: torch.Tensor, routing: GroupedRouting,
                  correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 router logits [T, E] -> (float32 weights [T, k], expert ids [T, k]) (module docstring)."""
    scores = logits.softmax(dim=-1) if routing.scoring_func == "softmax" else logits.sigmoid()
    choice = scores + correction_bias if correction_bias is not None else scores
    if routing.topk_method != "greedy":
        choice = _keep_top_groups(choice, routing)
    expert_ids = torch.topk(choice, routing.top_k, dim=-1).indices
    weights = scores.gather(1, expert_ids)
    if routing.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routing.routed_scaling_factor, expert_ids


def _keep_top_groups(choice: torch.Tensor, routing: GroupedRouting) -> torch.Tensor:
    """The choice scores with every expert outside the topk_group best groups masked out."""
    grouped = choice.view(choice.shape[0], routing.num_groups, -1)  # [T, G, E / G]
    if routing.topk_method == "group_limited_greedy":
        group_scores, masked = grouped.max(dim=-1).values, 0.0
    else:  # noaux_tc
        group_scores, masked = grouped.topk(2, dim=-1).values.sum(dim=-1), float("-inf")
    kept_groups = torch.topk(group_scores, routing.topk_group, dim=-1).indices  # [T, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept_groups, True)  # [T, G]
    return grouped.masked_fill(~keep.unsqueeze(-1), masked).view_as(choice)


class Router(nn.Module):
    """The router's weight [E, H] (and V3's correction bias [E]); logits in float32, as HF."""

    def __init__(self, hidden_size: int, routing: GroupedRouting) -> None:
        super().__init__()
        self.routing = routing
        self.weight = nn.Parameter(torch.empty(routing.num_experts, hidden_size))
        self.e_score_correction_bias = (nn.Parameter(torch.empty(routing.num_experts))
                                        if routing.has_correction_bias else None)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.weight.float())
        bias = self.e_score_correction_bias
        return grouped_route(logits, self.routing, bias.float() if bias is not None else None)


class GroupedMoE(nn.Module):
    """x [T, H] -> the routed experts' weighted sum + the shared experts' output."""

    def __init__(self, hidden_size: int, intermediate_size: int, routing: GroupedRouting, num_shared_experts: int,
                 bias: bool = False) -> None:
        super().__init__()
        self.gate = Router(hidden_size, routing)
        self.experts = ExpertWeights(routing.num_experts, hidden_size, intermediate_size)
        self.shared_experts = (GatedMLP(hidden_size, intermediate_size * num_shared_experts, bias=bias)
                               if num_shared_experts else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = self.gate(x)
        routed = grouped_experts(x, self.experts.gate_up_proj, self.experts.down_proj, expert_ids, weights)
        return routed if self.shared_experts is None else routed + self.shared_experts(x)
