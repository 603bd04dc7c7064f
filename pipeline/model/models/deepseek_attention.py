"""DeepSeek's multi-head latent attention (MLA) with absorbed up-projections, over a latent KV cache.

HF's DeepseekV2Attention / DeepseekV3Attention, per token and head h (N = qk_nope_head_dim,
P = qk_rope_head_dim, R = kv_lora_rank, V = v_head_dim):
    q_h = [q_nope_h (N), rope(q_pe_h) (P)]                  from q_proj, or q_a_proj -> norm -> q_b_proj
    c = kv_a_layernorm(kv_a[:R]),  k_pe = rope(kv_a[R:])    kv_a = kv_a_proj_with_mqa(x), shared by all heads
    k_h = [W_UK[h] c, k_pe],  v_h = W_UV[h] c               kv_b_proj's rows: per head N of W_UK, V of W_UV
    out = o_proj(concat_h softmax(q_h . k_h * scale) @ v_h)
Since q_nope_h . (W_UK[h] c) = (W_UK[h]^T q_nope_h) . c, and sum_j p_j W_UV[h] c_j = W_UV[h] sum_j p_j c_j,
each head can attend over the one row [c, k_pe] that every head shares, with the query
[W_UK[h]^T q_nope_h (R), rope(q_pe_h) (P)], and the value c; W_UV[h] is applied to the R-dim result
afterwards. That row (R + P values) is all the cache holds (attention/latent.py). The scale is
HF's: qk_head_dim ** -0.5 (times YaRN's mscale ** 2, see deepseek_config.py), not (R + P) ** -0.5.

Rope: V2 and V3 with rope_interleave (its default) rotate adjacent pairs; HF's V3 then writes the
pairs' halves apart where V2 keeps them paired, which permutes q_pe and k_pe alike and leaves
q_pe . k_pe unchanged, so one pairwise rotation serves both. V3 without rope_interleave rotates halves.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.model.attention.latent import LatentPagedAttention
from pipeline.model.layers.norms import RMSNorm
from pipeline.model.layers.rope import apply_rotary, apply_rotary_interleaved
from pipeline.model.models.deepseek_config import DeepseekConfig

# HF builds q_a_layernorm and kv_a_layernorm with RMSNorm's default eps, not rms_norm_eps.
LATENT_NORM_EPS = 1e-6


class LatentUpProjection(nn.Module):
    """kv_b_proj's weight [H * (N + V), R], read per head as W_UK [H, N, R] and W_UV [H, V, R].

    Not an nn.Linear: it is never applied as one, so the CPU linear packing and quantization leave it be.
    """

    def __init__(self, num_heads: int, nope_dim: int, v_dim: int, latent_dim: int) -> None:
        super().__init__()
        self.num_heads, self.nope_dim = num_heads, nope_dim
        self.weight = nn.Parameter(torch.empty(num_heads * (nope_dim + v_dim), latent_dim))

    def absorb_query(self, q_nope: torch.Tensor) -> torch.Tensor:
        """q_nope [T, H, N] -> [T, H, R]: per head q_nope_h @ W_UK[h]."""
        w_uk = self.weight.view(self.num_heads, -1, self.weight.shape[1])[:, :self.nope_dim]  # [H, N, R]
        return torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)

    def expand_output(self, latent_out: torch.Tensor) -> torch.Tensor:
        """latent_out [T, H, R] -> [T, H, V]: per head latent_out_h @ W_UV[h]^T."""
        w_uv = self.weight.view(self.num_heads, -1, self.weight.shape[1])[:, self.nope_dim:]  # [H, V, R]
        return torch.bmm(latent_out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)


class LatentAttention(nn.Module):
    def __init__(self, config: DeepseekConfig, backend: LatentPagedAttention, window: int | None = None) -> None:
        super().__init__()
        self.window = window
        self.backend = backend
        self.num_heads = config.num_heads
        self.nope_dim, self.rope_dim = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.latent_dim, self.v_dim = config.kv_lora_rank, config.v_head_dim
        self.rope_interleave = config.rope_interleave
        hidden, heads, qk_dim = config.hidden_size, config.num_heads, self.nope_dim + self.rope_dim
        bias = config.attention_bias
        self.q_lora_rank = config.q_lora_rank
        if config.q_lora_rank is None:  # V2-Lite: one projection
            self.q_proj = nn.Linear(hidden, heads * qk_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, config.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(config.q_lora_rank, heads * qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.latent_dim + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.latent_dim, LATENT_NORM_EPS)
        self.kv_b_proj = LatentUpProjection(heads, self.nope_dim, self.v_dim, self.latent_dim)
        self.o_proj = nn.Linear(heads * self.v_dim, hidden, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_pe = q.view(num_tokens, self.num_heads, -1).split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.latent_dim, self.rope_dim], dim=-1)
        # q_pe's H heads and the shared k_pe rotated in one pass: [T, H + 1, P].
        roped = self._rotate(torch.cat([q_pe, k_pe.unsqueeze(1)], dim=1), cos, sin)
        rows = torch.cat([self.kv_a_layernorm(latent), roped[:, -1]], dim=-1)  # [T, R + P]: the cached row
        queries = torch.cat([self.kv_b_proj.absorb_query(q_nope), roped[:, :-1]], dim=-1)  # [T, H, R + P]
        latent_out = self.backend.forward(queries, rows, kv_cache, metadata, window=self.window)  # [T, H, R]
        return self.o_proj(self.kv_b_proj.expand_output(latent_out).reshape(num_tokens, -1))

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rotary_interleaved(x, cos, sin) if self.rope_interleave else apply_rotary(x, cos, sin)
