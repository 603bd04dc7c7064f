"""Sparse mixture-of-experts MLPs: a router picks top-k SwiGLU experts per token (Mixtral, Qwen3-MoE),
plus an always-on shared expert behind a sigmoid gate (Qwen2-MoE).

Numerics follow HF transformers v5 (its default `grouped_mm` experts path): router logits in the
model dtype, softmax over experts in float32, top-k, the k weights renormalised to sum to 1 (always
for Mixtral; Qwen's `norm_topk_prob` switches it); each (token, expert) pair is computed by its
expert, scaled by its weight, and a token's k results are summed in top-k order. Mixtral keeps the
weights in float32 (so the scaling and the sum run in float32); the Qwen MoE routers round them to
the model dtype first. Router jitter and the load-balancing loss are training-only.

Experts run grouped by expert, not per token: the T*k (token, expert) pairs are sorted by expert
so each expert's tokens are one contiguous block of rows, and every expert does one matmul over
its block (torch's grouped_mm where it exists, else a loop over the experts).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.layers.mlp import GatedMLP


class ExpertWeights(nn.Module):
    """All experts' SwiGLU weights as 3D tensors, laid out as in HF v5 (`mlp.experts.*`).

    gate_up_proj [E, 2I, H] holds rows [gate (w1); up (w3)] of each expert; down_proj [E, H, I] (w2).
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))


class SparseMoE(nn.Module):
    """x [T, H] -> sum over the top-k experts of weight * down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int, *,
                 norm_topk_prob: bool = True, round_weights: bool = False) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in 1..{num_experts}, got {top_k}")
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.round_weights = round_weights  # weights in the model dtype (Qwen) rather than float32 (Mixtral)
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)  # the router
        self.experts = ExpertWeights(num_experts, hidden_size, intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = route(self.gate(x), self.top_k, self.norm_topk_prob)
        if self.round_weights:
            weights = weights.to(x.dtype)
        return grouped_experts(x, self.experts.gate_up_proj, self.experts.down_proj, expert_ids, weights)


class SharedExpertMoE(SparseMoE):
    """Qwen2-MoE: the routed experts' sum plus sigmoid(shared_expert_gate(x)) * shared_expert(x)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 shared_intermediate_size: int, *, norm_topk_prob: bool) -> None:
        super().__init__(hidden_size, intermediate_size, num_experts, top_k, norm_topk_prob=norm_topk_prob,
                         round_weights=True)
        self.shared_expert = GatedMLP(hidden_size, shared_intermediate_size)
        self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return super().forward(x) + shared


def route(router_logits: torch.Tensor, top_k: int, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (float32 weights [T, k], expert ids [T, k]); `normalize`: weights sum to 1."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    top_probs, expert_ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True)
    return top_probs, expert_ids


def grouped_experts(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                    expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each token's weighted sum of its experts' SwiGLU outputs: x [T, H], expert_ids/weights [T, k] -> [T, H].

    T=3, k=2, expert_ids [[2, 0], [0, 1], [2, 1]]:
      pairs (flattened)   p = 0..5 -> experts [2, 0, 0, 1, 2, 1], tokens p // k = [0, 0, 1, 1, 2, 2]
      sorted by expert    order = [1, 2, 3, 5, 0, 4] -> experts [0, 0, 1, 1, 2, 2], rows x[[0, 1, 1, 2, 0, 2]]
      group ends          offsets = [2, 4, 6]: expert e owns sorted rows offsets[e-1]..offsets[e]
    then per-pair outputs go back to pair order and the k of each token are summed.
    """
    num_tokens, top_k = expert_ids.shape
    order, offsets = sort_by_expert(expert_ids, gate_up_proj.shape[0])
    rows = x[order // top_k]
    gate, up = expert_matmul(rows, gate_up_proj, offsets).chunk(2, dim=-1)
    out_sorted = expert_matmul(F.silu(gate) * up, down_proj, offsets)
    # float32 weights promote the product, so the k-way sum runs in float32 (as HF) before the cast back.
    weighted_sorted = out_sorted * weights.reshape(-1)[order].unsqueeze(-1)
    weighted = torch.empty_like(weighted_sorted).index_copy_(0, order, weighted_sorted)  # back to pair order
    return weighted.view(num_tokens, top_k, -1).sum(dim=1).to(x.dtype)


def sort_by_expert(expert_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """expert_ids [T, k] -> (order [T*k]: the flattened pairs sorted by expert, stable; offsets [E] int32:
    the end of each expert's block of sorted pairs)."""
    sorted_ids, order = torch.sort(expert_ids.reshape(-1), stable=True)
    # End of each expert's block: how many sorted ids are below e + 1 (no host sync, unlike bincount).
    bounds = torch.arange(1, num_experts + 1, device=expert_ids.device)
    return order, torch.searchsorted(sorted_ids, bounds).to(torch.int32)


def expert_matmul(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """rows [S, in] sorted by expert, weight [E, out, in], offsets [E] (group ends) -> [S, out].

    Row r of group e is rows[r] @ weight[e].T.
    """
    if _has_grouped_mm(rows):
        return F.grouped_mm(rows, weight.transpose(-2, -1), offs=offsets)
    if rows.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("mixture-of-experts layers need torch.nn.functional.grouped_mm (bfloat16 on CUDA) "
                           "inside a CUDA graph: use dtype bfloat16 or enforce_eager")
    out = rows.new_empty(rows.shape[0], weight.shape[1])
    start = 0
    for expert, end in enumerate(offsets.tolist()):
        if end > start:
            torch.mm(rows[start:end], weight[expert].t(), out=out[start:end])
        start = end
    return out


def _has_grouped_mm(rows: torch.Tensor) -> bool:
    # F.grouped_mm (torch >= 2.10): its CPU kernel takes any float dtype; on CUDA it is documented for
    # bfloat16 on SM80+ only (not run on a GPU here).
    if not hasattr(F, "grouped_mm"):
        return False
    if rows.device.type == "cpu":
        return True
    return rows.is_cuda and rows.dtype == torch.bfloat16 and _cuda_capability(rows.device.index) >= (8, 0)


@functools.cache
def _cuda_capability(device_index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def fused_expert_slot(mlp: str, expert: int, role: str, intermediate_size: int, num_experts: int,
                      name: str) -> tuple[str, tuple[int, slice]]:
    """Where a per-expert checkpoint tensor lands in the fused expert tensors of `mlp` (a module path).

    role "gate" fills rows 0..I of gate_up_proj[expert], "up" rows I..2I, "down" the whole of
    down_proj[expert]: ("model.layers.0.mlp", 2, "up", I) -> ("model.layers.0.mlp.experts.gate_up_proj",
    (2, rows I..2I)). `name` is the checkpoint's, for the error when the expert does not exist.
    """
    if expert >= num_experts:
        raise ValueError(f"unexpected weight in checkpoint: {name} (the model has {num_experts} experts)")
    if role == "down":
        return f"{mlp}.experts.down_proj", (expert, slice(None))
    rows = slice(0, intermediate_size) if role == "gate" else slice(intermediate_size, 2 * intermediate_size)
    return f"{mlp}.experts.gate_up_proj", (expert, rows)
