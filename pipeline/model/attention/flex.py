"""Paged attention through torch FlexAttention: each query reads only its own sequence's KV blocks.

The whole KV cache of a layer is one key sequence to FlexAttention: [1, H_kv, N * block_size, D]
(a view of the cache, no copy), and a BlockMask whose sparse KV block is one cache block says
which cache blocks each batch row visits, in logical order. Nothing is gathered.

Batch rows are "tiles" of queries of one sequence:
- decode: one tile per sequence; its G = H / H_kv query heads per KV head become the G query rows
  of one KV head (q [B, H_kv, G, D]), so each KV block is read once per KV head, not per query head;
- prefill (any query length > 1: chunks, prefix hits, cached context): the sequence's queries cut
  into tiles of PREFILL_TILE rows (q [tiles, H, tile, D], enable_gqa); the last tile's pad rows
  repeat the last token and are dropped.

The mask needs the logical position of a key from its physical slot. A block's logical index is
the same in every sequence that holds it (prefix-cache blocks are shared only by identical
prefixes, forks share their common prefix), so one table `block_positions[physical block]`,
filled for the blocks the step visits, serves all rows. Sliding window W (HF's rule): the query
at position p sees keys p - W + 1 .. p; a chunk of C (Llama 4, windows.py) keys p - p % C .. p;
blocks wholly before a tile's first visible key are not listed, so the KV manager may have freed
them. Gemma 2's soft-capping is a score_mod; gpt-oss's attention sinks rescale each row's output
by its log-sum-exp (sinks.py), which the kernel returns.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention

from pipeline.host_to_device import to_device
from pipeline.model.attention.flex_plan import TilePlan, decode_plan, pad_tiles, prefill_plan
from pipeline.model.attention.sinks import rescale_by_sinks
from pipeline.model.attention.windows import Window, first_visible_key
from pipeline.step.inputs import StepInputs

# Query rows per prefill tile: also the sparse Q block size and the kernel's BLOCK_M on CUDA.
PREFILL_TILE = 64
# The transposed (backward-pass) indices are not needed; torch versions without the switch build them.
_NO_Q_BLOCKS = ({"compute_q_blocks": False}
                if "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters else {})
# The decode kernel tile (rows = G query heads per KV head, padded by the kernel).
_DECODE_BLOCK_M = 16


@functools.cache
def compiled_flex_attention(device_type: str):
    """flex_attention compiled once per process and device type.

    CUDA: dynamic shapes, so tile counts do not recompile. CPU: static shapes (torch 2.13's CPU
    template miscompiles dynamic ones next to the mask's table lookups); tile counts are padded to
    powers of two (flex_plan.pad_tiles), so a few sizes compile, each once."""
    # One compiled entry per (decode | prefill, window, padded tile count on CPU): more than the default 8.
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # older torch
    setattr(config, name, max(getattr(config, name), 64))
    if device_type == "cpu":
        return torch.compile(flex_attention, dynamic=False)
    return torch.compile(flex_attention, dynamic=True)


def _to(array: np.ndarray, device: torch.device, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return to_device(array, device, dtype)


def tile_mask(block_positions: torch.Tensor, query_starts: torch.Tensor, block_size: int,
              window: Window, per_row: bool):
    """mask_mod: the key at logical position k is visible to row q of tile b when
    first_visible_key(p) <= k <= p (p - window < k for a sliding window, k in p's chunk for a chunk;
    windows.py), p the row's position (per_row: query_starts[b] + q; else query_starts[b]).

    Keys past a sequence's end never pass: a real row's position is below its sequence length."""

    def mask(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        key_position = block_positions[kv // block_size] * block_size + kv % block_size
        query_position = query_starts[b] + q if per_row else query_starts[b]
        visible = key_position <= query_position
        if window:
            visible = visible & (key_position >= first_visible_key(query_position, window))
        return visible

    return mask


def softcap_score(cap: float):
    def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                  kv: torch.Tensor) -> torch.Tensor:
        return torch.tanh(score / cap) * cap

    return score_mod


@dataclass(slots=True)
class FlexPass:
    """One flex_attention call: a TilePlan moved to the device, its BlockMask built on first use."""

    plan: TilePlan | None  # None in the CUDA-graph buffers (flex_graphs.py)
    token_rows: torch.Tensor  # decode: [B]; prefill: [tiles * tile] token row of each query row
    out_src: torch.Tensor | None  # prefill: real rows of the flattened tiles
    out_dst: torch.Tensor | None  # prefill: their token rows
    kv_num_blocks: torch.Tensor  # [B] blocks listed per tile
    kv_indices: torch.Tensor  # [B, nb] physical block ids, logical order
    query_starts: torch.Tensor  # [B] position of each tile's first query row
    window: Window
    block_mask: BlockMask | None = None


@dataclass(slots=True)
class FlexAttentionMetadata:
    slot_mapping: torch.Tensor  # [T'] slots written
    write_rows: torch.Tensor | None  # [T'] token rows whose K/V are written; None = rows 0..T'-1
    visited_blocks: torch.Tensor  # [V] physical blocks some tile reads, and their logical index
    visited_positions: torch.Tensor
    passes: dict[Window, tuple[FlexPass | None, FlexPass | None]]  # window -> (decode, prefill)
    all_decode_rows: bool  # one decode pass covers every token row in order
    prepared: bool = field(default=False)


class FlexPagedAttention:
    """AttentionBackend over FlexAttention (CUDA, and CPU where torch.compile has a C++ compiler)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                 scale: float, *, windows: frozenset[Window] = frozenset({None}),
                 logit_softcap: float | None = None) -> None:
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.block_size = block_size
        self.scale = scale
        self.windows = windows
        self.score_mod = softcap_score(logit_softcap) if logit_softcap else None
        # Logical index of each physical block, for the blocks of the current step (see module doc).
        # Persistent (a CUDA graph captures its address); grown when the cache is larger.
        self.block_positions = torch.zeros(0, dtype=torch.int32)

    # ---- metadata, once per step (host) --------------------------------------------------------

    def build_metadata(self, inputs: StepInputs, device: torch.device) -> FlexAttentionMetadata:
        slots = inputs.slot_mapping[: inputs.num_tokens]
        write_rows = None
        if (slots < 0).any():
            keep = np.flatnonzero(slots >= 0)
            slots, write_rows = slots[keep], _to(keep, device, torch.long)
        starts = inputs.query_start_loc[:-1].astype(np.int64)
        query_lens = np.diff(inputs.query_start_loc).astype(np.int64)
        seq_lens = inputs.seq_lens.astype(np.int64)
        passes, blocks, positions = {}, [], []
        decode_seqs, prefill_seqs = np.flatnonzero(query_lens == 1), np.flatnonzero(query_lens > 1)
        for window in self.windows:
            decode = prefill = None
            if len(decode_seqs):
                plan = decode_plan(starts[decode_seqs], seq_lens[decode_seqs], inputs.block_tables[decode_seqs],
                                   self.block_size, window)
                decode = self._pass(plan, device)
                blocks.append(plan.visited_blocks)
                positions.append(plan.visited_positions)
            if len(prefill_seqs):
                plan = prefill_plan(starts[prefill_seqs], query_lens[prefill_seqs], seq_lens[prefill_seqs],
                                    inputs.block_tables[prefill_seqs], self.block_size, window, PREFILL_TILE)
                prefill = self._pass(plan, device)
                blocks.append(plan.visited_blocks)
                positions.append(plan.visited_positions)
            passes[window] = (decode, prefill)
        all_decode_rows = (len(prefill_seqs) == 0 and len(decode_seqs) == len(inputs.input_ids)
                           and bool((starts == np.arange(len(starts))).all()))
        visited = np.concatenate(blocks) if blocks else np.zeros(0, np.int64)
        visited_positions = np.concatenate(positions) if positions else np.zeros(0, np.int64)
        return FlexAttentionMetadata(_to(slots, device, torch.long), write_rows, _to(visited, device, torch.long),
                                     _to(visited_positions, device), passes, all_decode_rows)

    def _pass(self, plan: TilePlan, device: torch.device) -> FlexPass:
        plan = pad_tiles(plan)
        out_src = out_dst = None
        if plan.out_src is not None:
            out_src, out_dst = _to(plan.out_src, device, torch.long), _to(plan.out_dst, device, torch.long)
        return FlexPass(plan, _to(plan.token_rows.reshape(-1), device, torch.long), out_src, out_dst,
                        _to(plan.kv_num_blocks, device), _to(plan.kv_indices, device),
                        _to(plan.query_starts, device), plan.window)

    # ---- device side, once per step ------------------------------------------------------------

    def _prepare(self, metadata: FlexAttentionMetadata, kv_cache: torch.Tensor) -> None:
        """Fill the block-position table and build the block masks (first layer of the step)."""
        num_blocks = kv_cache.shape[1]
        if self.block_positions.numel() < num_blocks or self.block_positions.device != kv_cache.device:
            self.block_positions = torch.zeros(num_blocks, dtype=torch.int32, device=kv_cache.device)
        self.block_positions.index_copy_(0, metadata.visited_blocks, metadata.visited_positions)
        for decode, prefill in metadata.passes.values():
            for flex_pass, tile_rows in ((decode, 1), (prefill, PREFILL_TILE)):
                if flex_pass is not None:
                    flex_pass.block_mask = self.block_mask(flex_pass.kv_num_blocks, flex_pass.kv_indices,
                                                           flex_pass.query_starts, flex_pass.window,
                                                           num_blocks, tile_rows)
        metadata.prepared = True

    def block_mask(self, kv_num_blocks: torch.Tensor, kv_indices: torch.Tensor, query_starts: torch.Tensor,
                   window: Window, num_cache_blocks: int, tile_rows: int) -> BlockMask:
        """A BlockMask over the whole cache as one key sequence; one Q block per tile.

        tile_rows 1 = decode (the rows are query heads of one token, all at query_starts[b])."""
        num_tiles, width = kv_indices.shape
        if kv_indices.device.type == "cpu" and width < num_cache_blocks:
            # The CPU kernel wants an index row as long as the key sequence has blocks.
            wide = kv_indices.new_zeros(num_tiles, num_cache_blocks)
            wide[:, :width] = kv_indices
            kv_indices = wide
        per_row = tile_rows > 1
        group = self.num_heads // self.num_kv_heads
        q_len = tile_rows if per_row else group
        # One sparse Q block per tile, a multiple of the CUDA kernel's BLOCK_M.
        q_block = tile_rows if per_row else _DECODE_BLOCK_M * -(-group // _DECODE_BLOCK_M)
        return BlockMask.from_kv_blocks(
            kv_num_blocks.view(num_tiles, 1, 1), kv_indices.view(num_tiles, 1, 1, -1),
            BLOCK_SIZE=(q_block, self.block_size),
            mask_mod=tile_mask(self.block_positions, query_starts, self.block_size, window, per_row),
            seq_lengths=(q_len, num_cache_blocks * self.block_size), **_NO_Q_BLOCKS)

    # ---- per layer -----------------------------------------------------------------------------

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                metadata: FlexAttentionMetadata, window: Window = None,
                sinks: torch.Tensor | None = None) -> torch.Tensor:
        """sinks: the layer's attention sink logits [H] (sinks.py), or None."""
        write_kv(k, v, kv_cache, metadata.slot_mapping, metadata.write_rows)
        if not metadata.prepared:
            self._prepare(metadata, kv_cache)
        decode, prefill = metadata.passes[window]
        keys, values = self.cache_as_sequence(kv_cache)
        if decode is not None and metadata.all_decode_rows:
            return self.decode(q, keys, values, decode.block_mask, sinks)
        out = torch.zeros_like(q)  # rows in no pass (padding) stay zero
        if decode is not None:
            out[decode.token_rows] = self.decode(q[decode.token_rows], keys, values, decode.block_mask, sinks)
        if prefill is not None:
            self._prefill(q, keys, values, prefill, out, sinks)
        return out

    def cache_as_sequence(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[2, N, bs, H_kv, D] -> K, V as [1, H_kv, N * bs, D] views (key index = slot)."""
        flat = kv_cache.view(2, 1, -1, self.num_kv_heads, self.head_dim)
        return flat[0].transpose(1, 2), flat[1].transpose(1, 2)

    def decode(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               block_mask: BlockMask, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """q [B, H, D] -> [B, H, D]; query head h = kv * G + g reads KV head kv (HF's repeat_kv)."""
        num_seqs, num_tiles = q.shape[0], block_mask.kv_num_blocks.shape[0]
        queries = q.view(num_seqs, self.num_kv_heads, -1, self.head_dim).to(keys.dtype)
        if num_tiles > num_seqs:  # pad tiles (pad_tiles): their rows are computed, then dropped
            queries = torch.cat([queries, queries.new_zeros(num_tiles - num_seqs, *queries.shape[1:])])
        # Sink of query head kv * G + g sits at row g of KV head kv, like its query.
        row_sinks = sinks.view(self.num_kv_heads, -1) if sinks is not None else None
        out = self._attend(queries, keys, values, block_mask, enable_gqa=False, block_m=_DECODE_BLOCK_M,
                           sinks=row_sinks)
        return out[:num_seqs].reshape(q.shape).to(q.dtype)

    def _prefill(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, prefill: FlexPass,
                 out: torch.Tensor, sinks: torch.Tensor | None = None) -> None:
        num_tiles = prefill.kv_indices.shape[0]
        queries = q[prefill.token_rows].view(num_tiles, PREFILL_TILE, self.num_heads, self.head_dim)
        # Contiguous: torch 2.13's CPU template fails to compile for a transposed query.
        queries = queries.transpose(1, 2).contiguous().to(keys.dtype)
        result = self._attend(queries, keys, values, prefill.block_mask,
                              enable_gqa=self.num_heads != self.num_kv_heads, block_m=PREFILL_TILE,
                              sinks=sinks.view(-1, 1) if sinks is not None else None)
        flat = result.transpose(1, 2).reshape(-1, self.num_heads, self.head_dim)
        out[prefill.out_dst] = flat[prefill.out_src].to(out.dtype)

    def _attend(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_mask: BlockMask,
                enable_gqa: bool, block_m: int, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """sinks: broadcastable to the rows' [heads, query rows] (sinks.py): the log-sum-exp rescales the output."""
        # On CUDA the kernel's KV tile must divide the sparse block (one cache block).
        options = {"BLOCK_M": block_m, "BLOCK_N": self.block_size} if queries.is_cuda else None
        attend = compiled_flex_attention(queries.device.type)
        if sinks is None:
            return attend(queries, keys, values, score_mod=self.score_mod, block_mask=block_mask, scale=self.scale,
                          enable_gqa=enable_gqa, kernel_options=options)
        out, aux = attend(queries, keys, values, score_mod=self.score_mod, block_mask=block_mask, scale=self.scale,
                          enable_gqa=enable_gqa, kernel_options=options, return_aux=AuxRequest(lse=True))
        return rescale_by_sinks(out, aux.lse, sinks)


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
             write_rows: torch.Tensor | None) -> None:
    """Store the step's K/V at their slots (row s of the flattened cache is slot s)."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    if write_rows is not None:
        k, v = k[write_rows], v[write_rows]
    else:
        k, v = k[: slot_mapping.shape[0]], v[: slot_mapping.shape[0]]
    kv_flat = kv_cache.view(2, -1, num_kv_heads, head_dim)
    kv_flat[0].index_copy_(0, slot_mapping, k.to(kv_cache.dtype))
    kv_flat[1].index_copy_(0, slot_mapping, v.to(kv_cache.dtype))
