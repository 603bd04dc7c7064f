"""Tensor parallelism for DeepSeek-V2/V3: multi-head latent attention split by heads, and the grouped
mixture of experts split by intermediate columns.

Attention: every rank keeps the whole low-rank down-projections (q_a_proj, kv_a_proj_with_mqa and
their norms), so each rank computes and caches the same latent row per token: the latent cache is
replicated, not split (it is one row for all heads). A rank keeps its heads' rows of q_proj (or
q_b_proj) and of kv_b_proj, and o_proj's columns of its heads (row-parallel, summed by an all-reduce).
Worked example, 4 heads over 2 ranks, qk_head_dim 56, v_head_dim 24: rank 1 keeps q rows 112..224,
kv_b_proj rows 2 * (40 + 24)..4 * (40 + 24), o_proj columns 48..96.

Mixture of experts: the router runs whole on every rank (the same inputs give the same choices);
each routed expert keeps its slice of the intermediate size (gate and up rows, down columns), as
does the shared MLP; the partial outputs of both are summed by one all-reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from pipeline.model.layers.grouped_moe import GroupedMoE
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.moe import grouped_experts


def shard_latent_attention(attention: nn.Module, q_start: int, num_heads: int) -> slice:
    """Keep heads q_start .. q_start + num_heads of a LatentAttention (models/deepseek_attention.py);
    returns the columns of o_proj that they feed, for the caller's row-parallel o_proj."""
    qk_dim = attention.nope_dim + attention.rope_dim
    q = attention.q_proj if attention.q_lora_rank is None else attention.q_b_proj
    q.weight.data = q.weight.data[q_start * qk_dim:(q_start + num_heads) * qk_dim].contiguous()
    q.out_features = q.weight.shape[0]
    up = attention.kv_b_proj
    per_head = up.weight.shape[0] // up.num_heads  # nope + v rows
    up.weight.data = up.weight.data[q_start * per_head:(q_start + num_heads) * per_head].contiguous()
    up.num_heads = num_heads
    attention.num_heads = num_heads
    return slice(q_start * attention.v_dim, (q_start + num_heads) * attention.v_dim)


class ParallelGroupedMoE(nn.Module):
    """A GroupedMoE whose experts and shared MLP hold one rank's intermediate slice; all-reduced once."""

    def __init__(self, moe: GroupedMoE, rank: int, world: int) -> None:
        super().__init__()
        self.gate = moe.gate
        self.experts = moe.experts
        _keep_intermediate_slice(moe.experts.gate_up_proj, moe.experts.down_proj, rank, world)
        self.experts.intermediate_size = moe.experts.down_proj.shape[-1]
        self.shared_experts = moe.shared_experts
        if self.shared_experts is not None:
            _shard_shared_mlp(self.shared_experts, rank, world)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = self.gate(x)
        out = grouped_experts(x, self.experts.gate_up_proj, self.experts.down_proj, expert_ids, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        dist.all_reduce(out)
        return out


def _keep_intermediate_slice(gate_up: torch.Tensor, down: torch.Tensor, rank: int, world: int) -> None:
    """gate_up [..., 2I, H] keeps rows part and I + part; down [..., H, I] keeps columns part.

    I 32 over 2 ranks, rank 1: gate rows 16..32 and up rows 48..64; down columns 16..32.
    """
    size = down.shape[-1]
    if size % world:
        raise ValueError(f"tensor_parallel_size {world} must divide the experts' intermediate size ({size})")
    part = torch.arange(rank * size // world, (rank + 1) * size // world, device=gate_up.device)
    gate_up.data = gate_up.data.index_select(-2, torch.cat([part, size + part])).contiguous()
    down.data = down.data.index_select(-1, part).contiguous()


def _shard_shared_mlp(mlp: GatedMLP, rank: int, world: int) -> None:
    if mlp.gate_up_proj.bias is not None or mlp.down_proj.bias is not None:
        raise ValueError("tensor parallelism does not support shared experts with biases (mlp_bias) yet")
    _keep_intermediate_slice(mlp.gate_up_proj.weight, mlp.down_proj.weight, rank, world)
    mlp.gate_up_proj.out_features = mlp.gate_up_proj.weight.shape[0]
    mlp.down_proj.in_features = mlp.down_proj.weight.shape[1]
    mlp.intermediate_size = mlp.down_proj.in_features
