"""Paged multi-head latent attention (MLA: DeepSeek-V2/V3) over a cache of compressed latents.

One layer's cache is [num_blocks, block_size, 1, D], D = kv_lora_rank + qk_rope_head_dim: per token
only the normalised KV latent c (kv_lora_rank values) and the rotated rope key k_pe shared by all
heads. With the key and value up-projections absorbed into the query and the output
(models/deepseek_attention.py), every head attends over that one row: multi-query attention with a
single KV head whose key is [c, k_pe] (D values) and whose value is c, the row's first kv_lora_rank
values. So the cache stores the key row alone and reads the value as a prefix view of it.

V3's sizes (128 heads, nope 128, rope 64, v 128, kv_lora_rank 512): 576 values per token and layer
here, against 128 * (192 + 128) = 40960 for expanded per-head K and V.

The absorbed form serves every step, prefills included: one code path for decodes, chunks after
cached context and prefix-cache hits, and the cache is read only as it is stored. The expanded form
(HF's: decompress per-head K and V for the chunk and its whole cached context) would take fewer
FLOPs for long prefills (score dim 192 instead of 576 at V3's sizes) but needs the context
decompressed again per chunk and per layer. Both are exact up to float rounding: the absorbed
scores are q_nope . (W_UK c) regrouped as (W_UK^T q_nope) . c.

Which tokens attend to which (decode and prefill groups, block gathers, causal and window masks)
is TorchPagedAttention's metadata, built by one held for that only (no native kernels: the C decode
kernel reads a [2, ...] K/V cache); this class writes the rows and attends.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pipeline.model.attention.groups import DecodeGroup, PrefillGroup, TorchAttentionMetadata
from pipeline.model.attention.paged import TorchPagedAttention
from pipeline.step.inputs import StepInputs


class LatentPagedAttention:
    """Torch paged attention of H absorbed query heads over one cached latent row per token."""

    def __init__(self, num_heads: int, head_dim: int, latent_dim: int, block_size: int, scale: float, *,
                 windows: frozenset[int | None] = frozenset({None})) -> None:
        if not 0 < latent_dim <= head_dim:
            raise ValueError(f"latent_dim must be in 1..{head_dim}, got {latent_dim}")
        self.num_heads = num_heads
        self.head_dim = head_dim  # the cached row: latent + rope key
        self.latent_dim = latent_dim  # the value: the row's first latent_dim values
        self.block_size = block_size
        self.scale = scale
        self.windows = windows
        self._metadata = TorchPagedAttention(num_heads, 1, head_dim, block_size, scale, windows=windows)
        self._workspace = torch.empty(0)  # reused gather buffer (see TorchPagedAttention._workspace)

    def build_metadata(self, inputs: StepInputs, device: torch.device) -> TorchAttentionMetadata:
        return self._metadata.build_metadata(inputs, device)

    def static_decode_metadata(self, slot_mapping: torch.Tensor, seq_lens: torch.Tensor,
                               block_tables: torch.Tensor) -> TorchAttentionMetadata:
        return self._metadata.static_decode_metadata(slot_mapping, seq_lens, block_tables)

    def forward(self, q: torch.Tensor, rows: torch.Tensor, kv_cache: torch.Tensor,
                metadata: TorchAttentionMetadata, window: int | None = None) -> torch.Tensor:
        """q [T, H, D] absorbed queries, rows [T, D] this step's latent rows -> [T, H, latent_dim].

        Writes the rows into kv_cache first; a query sees the rows of its sequence up to its own."""
        self._write(rows, kv_cache, metadata)
        view = metadata.views[window]
        if len(view.decodes) == 1 and view.decodes[0].all_rows:
            return self._decode(q, kv_cache, view.decodes[0])
        out = q.new_zeros(q.shape[0], self.num_heads, self.latent_dim)  # rows in no group stay zero
        for decode in view.decodes:
            out[decode.token_rows] = self._decode(q[decode.token_rows], kv_cache, decode)
        for group in view.prefills:
            self._prefill(q, rows, kv_cache, group, out)
        return out

    def _write(self, rows: torch.Tensor, kv_cache: torch.Tensor, metadata: TorchAttentionMetadata) -> None:
        rows = rows[metadata.write_rows] if metadata.write_rows is not None else rows[:metadata.slot_mapping.shape[0]]
        # [N, bs, 1, D] -> [N * bs, D]: row s is slot s.
        kv_cache.view(-1, self.head_dim).index_copy_(0, metadata.slot_mapping, rows.to(kv_cache.dtype))

    def _gather(self, kv_cache: torch.Tensor, block_ids: torch.Tensor, num_seqs: int,
                dtype: torch.dtype) -> torch.Tensor:
        """The rows of whole blocks per sequence: [B, 1, nb * block_size, D] (one KV head)."""
        shape = (block_ids.shape[0], *kv_cache.shape[1:])
        numel = math.prod(shape)
        if self._workspace.numel() < numel or self._workspace.dtype != kv_cache.dtype \
                or self._workspace.device != kv_cache.device:
            self._workspace = torch.empty(numel, dtype=kv_cache.dtype, device=kv_cache.device)
        gathered = torch.index_select(kv_cache, 0, block_ids, out=self._workspace[:numel].view(shape))
        return gathered.view(num_seqs, 1, -1, self.head_dim).to(dtype)

    def _decode(self, q: torch.Tensor, kv_cache: torch.Tensor, group: DecodeGroup) -> torch.Tensor:
        assert group.block_ids is not None  # no native kernel here: always gathered
        num_seqs = q.shape[0]
        keys = self._gather(kv_cache, group.block_ids, num_seqs, q.dtype)
        # The H heads of a sequence are H query rows against its one KV head; the [B, 1, 1, L] mask
        # broadcasts over them. [B, H, D] -> [B, 1, H, D].
        out = F.scaled_dot_product_attention(q.unsqueeze(1), keys, keys[..., :self.latent_dim],
                                             attn_mask=group.mask, scale=self.scale)
        return out.squeeze(1)

    def _prefill(self, q: torch.Tensor, rows: torch.Tensor, kv_cache: torch.Tensor, group: PrefillGroup,
                 out: torch.Tensor) -> None:
        num_seqs, max_q = group.query_rows.shape
        span = slice(group.first_row, group.first_row + max_q) if group.first_row is not None else None
        queries = (q[span].unsqueeze(0) if span is not None else q[group.query_rows]).transpose(1, 2)  # [P, H, Q, D]
        if group.block_ids is None:  # no cached context: the keys are the step's own rows, [P, 1, Q, D]
            keys = (rows[span].unsqueeze(0) if span is not None else rows[group.query_rows]).unsqueeze(1)
        else:
            keys = self._gather(kv_cache, group.block_ids, num_seqs, q.dtype)
        result = F.scaled_dot_product_attention(queries, keys, keys[..., :self.latent_dim], attn_mask=group.mask,
                                                is_causal=group.mask is None, scale=self.scale, enable_gqa=True)
        flat = result.transpose(1, 2).reshape(num_seqs * max_q, self.num_heads, self.latent_dim)
        if span is not None:
            out[span] = flat.to(out.dtype)
        else:
            out[group.out_dst] = flat[group.out_src].to(out.dtype)
