"""Tensor parallelism: split a loaded decoder-family model across the ranks of a torch.distributed group.

Each rank keeps (Megatron's layout, as vLLM uses it):
- qkv_proj (column-parallel): its query heads and its KV heads; KV heads are split when there are
  at least as many as ranks, else each is replicated over world / kv_heads ranks;
- o_proj and down_proj (row-parallel): the input columns of its heads / intermediate slice; the
  partial outputs are summed with an all-reduce, and the bias is added once, after it;
- gate_up_proj (column-parallel): its slice of the gate rows and of the up rows;
- embed_tokens (vocab-parallel): its rows of the vocabulary; other ids embed to zero, and an
  all-reduce of the (exact) zeros and vectors gives every rank the full embeddings;
- lm_head: its vocabulary rows; the logits are all-gathered (the driver samples).
Worked example, 8 query heads, 2 KV heads, 4 ranks: rank 3 holds query heads 6, 7 and KV head 1
(KV heads replicated on ranks 0-1 and 2-3); with 4 KV heads it would hold KV head 3.
DeepSeek's latent attention and grouped experts split their own way (latent_sharding.py).

The model is loaded whole and then cut down (`shard_model`), so loading briefly needs the full
weights per rank; the attention backend and KV cache of a rank are sized by `local_heads`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.grouped_moe import GroupedMoE
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.parallel.latent_sharding import ParallelGroupedMoE, shard_latent_attention


@dataclass(frozen=True, slots=True)
class LocalHeads:
    """The heads one rank holds: query heads [q_start, q_start + num_heads), KV heads likewise."""

    num_heads: int
    q_start: int
    num_kv_heads: int
    kv_start: int


def local_heads(shape: AttentionShape, rank: int, world: int) -> LocalHeads:
    """This rank's heads; ValueError naming the rule when `world` cannot split the model's heads."""
    heads, kv_heads = shape.num_heads, shape.num_kv_heads
    if heads % world:
        raise ValueError(f"tensor_parallel_size {world} must divide the model's {heads} attention heads")
    if kv_heads >= world and kv_heads % world:
        raise ValueError(f"tensor_parallel_size {world} must divide the model's {kv_heads} KV heads "
                         "(or be a multiple of them)")
    if kv_heads < world and world % kv_heads:
        raise ValueError(f"tensor_parallel_size {world} must be a multiple of the model's {kv_heads} KV heads "
                         "(or divide them)")
    per_rank = heads // world
    if kv_heads >= world:
        kv_per_rank = kv_heads // world
        return LocalHeads(per_rank, rank * per_rank, kv_per_rank, rank * kv_per_rank)
    return LocalHeads(per_rank, rank * per_rank, 1, rank * kv_heads // world)


def check_tensor_parallel(config: dict[str, Any], shape: AttentionShape, world: int) -> None:
    """Every rule `shard_model` needs, checked on config.json before any rank process starts."""
    if "vision_config" in config:
        raise ValueError("tensor parallelism does not support vision-language models yet "
                         "(run them with tensor_parallel_size 1)")
    if shape.latent_dim is not None:  # DeepSeek-V2/V3 (latent_sharding.py): experts split by columns
        _split(int(config.get("moe_intermediate_size") or 0), 0, world, "moe_intermediate_size")
    if config.get("num_local_experts") or config.get("num_experts"):  # Mixtral, Qwen3-MoE; Qwen2-MoE
        raise ValueError("tensor parallelism does not support mixture-of-experts models yet "
                         "(run them with tensor_parallel_size 1)")
    local_heads(shape, 0, world)
    _split(config["intermediate_size"], 0, world, "intermediate_size")


def _split(size: int, rank: int, world: int, what: str) -> slice:
    if size % world:
        raise ValueError(f"tensor_parallel_size {world} must divide the model's {what} ({size})")
    part = size // world
    return slice(rank * part, (rank + 1) * part)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local @ W_local^T) + b: each rank holds some input columns of W."""

    def __init__(self, linear: nn.Linear, columns: slice) -> None:
        super().__init__()
        weight = linear.weight.data[:, columns].contiguous()
        self.linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device,
                                dtype=weight.dtype)
        self.linear.weight.data = weight
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.data.clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        dist.all_reduce(out)
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + n) of the embedding table; ids outside embed to zero before the all-reduce."""

    def __init__(self, weight: torch.Tensor, start: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.start = start

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        out = out * inside.unsqueeze(-1).to(out.dtype)
        dist.all_reduce(out)
        return out


class GatheredLMHead(nn.Module):
    """Logits of this rank's vocabulary rows, all-gathered into [R, vocab_size] on every rank.

    Shards are equal (vocab_size rounded up to a multiple of world, the last padded with zero rows),
    as all_gather wants; the padding columns are cut off.
    """

    def __init__(self, weight: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device,
                                dtype=weight.dtype)
        self.linear.weight.data = weight
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = self.linear(hidden).contiguous()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        return torch.cat(parts, dim=-1)[..., : self.vocab_size]


def _vocab_rows(weight: torch.Tensor, rank: int, world: int) -> tuple[torch.Tensor, int]:
    """This rank's rows of a [vocab, hidden] table, padded with zero rows to an equal share; and the first row."""
    share = -(-weight.shape[0] // world)
    rows = weight[rank * share: (rank + 1) * share]
    padded = torch.zeros(share, weight.shape[1], dtype=weight.dtype, device=weight.device)
    padded[: rows.shape[0]] = rows
    return padded, rank * share


def _shard_attention(attention: nn.Module, heads: LocalHeads, head_dim: int, total_heads: int,
                     total_kv_heads: int) -> None:
    if not hasattr(attention, "qkv_proj"):
        # Separate q/k/v projections whose head sizes vary by layer (Gemma 4): not split by heads yet.
        raise ValueError(f"tensor parallelism does not support {type(attention).__name__} layers yet; "
                         "run the model with tensor_parallel_size 1")
    q_norm = getattr(attention, "q_norm", None)
    if q_norm is not None and q_norm.weight.shape[0] != head_dim:
        # A norm over the whole q projection (OLMo 2) needs every head's values: not split by heads.
        raise ValueError(f"tensor parallelism does not support {type(attention).__name__} layers yet (their "
                         "q/k norms span every head); run the model with tensor_parallel_size 1")
    q_rows = slice(heads.q_start * head_dim, (heads.q_start + heads.num_heads) * head_dim)
    k_offset = total_heads * head_dim
    v_offset = k_offset + total_kv_heads * head_dim
    kv = slice(heads.kv_start * head_dim, (heads.kv_start + heads.num_kv_heads) * head_dim)
    rows = torch.cat([torch.arange(total_heads * head_dim)[q_rows],
                      k_offset + torch.arange(total_kv_heads * head_dim)[kv],
                      v_offset + torch.arange(total_kv_heads * head_dim)[kv]])
    qkv = attention.qkv_proj
    qkv.weight.data = qkv.weight.data[rows.to(qkv.weight.device)].contiguous()
    if qkv.bias is not None:
        qkv.bias.data = qkv.bias.data[rows.to(qkv.bias.device)].contiguous()
    qkv.out_features = qkv.weight.shape[0]
    attention.o_proj = RowParallelLinear(attention.o_proj, q_rows)
    attention.num_heads, attention.num_kv_heads = heads.num_heads, heads.num_kv_heads
    attention.q_size, attention.kv_size = heads.num_heads * head_dim, heads.num_kv_heads * head_dim


def _shard_mlp(mlp: nn.Module, rank: int, world: int) -> None:
    if not isinstance(mlp, GatedMLP):
        raise ValueError(f"tensor parallelism does not support {type(mlp).__name__} layers yet "
                         "(mixture-of-experts models run with tensor_parallel_size 1)")
    size = mlp.intermediate_size
    part = _split(size, rank, world, "intermediate_size")
    rows = torch.cat([torch.arange(size)[part], size + torch.arange(size)[part]])
    gate_up = mlp.gate_up_proj
    gate_up.weight.data = gate_up.weight.data[rows.to(gate_up.weight.device)].contiguous()
    if gate_up.bias is not None:
        gate_up.bias.data = gate_up.bias.data[rows.to(gate_up.bias.device)].contiguous()
    gate_up.out_features = gate_up.weight.shape[0]
    mlp.intermediate_size = part.stop - part.start
    mlp.down_proj = RowParallelLinear(mlp.down_proj, part)


def shard_model(model: nn.Module, shape: AttentionShape, rank: int, world: int) -> None:
    """Cut a loaded LlamaForCausalLM-family model down to this rank's share, in place."""
    heads = local_heads(shape, rank, world)
    decoder = model.model
    for layer in decoder.layers:
        if shape.latent_dim is not None:  # DeepSeek's multi-head latent attention (latent_sharding.py)
            columns = shard_latent_attention(layer.self_attn, heads.q_start, heads.num_heads)
            layer.self_attn.o_proj = RowParallelLinear(layer.self_attn.o_proj, columns)
        else:
            _shard_attention(layer.self_attn, heads, shape.head_dim, shape.num_heads, shape.num_kv_heads)
        if isinstance(layer.mlp, GroupedMoE):
            layer.mlp = ParallelGroupedMoE(layer.mlp, rank, world)
        else:
            _shard_mlp(layer.mlp, rank, world)
    vocab_size = decoder.embed_tokens.weight.shape[0]
    embed_rows, start = _vocab_rows(decoder.embed_tokens.weight.data, rank, world)
    head_rows, _ = _vocab_rows(model.lm_head.weight.data, rank, world)
    decoder.embed_tokens = VocabParallelEmbedding(embed_rows, start)
    model.lm_head = GatheredLMHead(head_rows, vocab_size)
