"""Paged attention: a small backend interface and a portable torch implementation.

KV cache of one layer: a tensor [2, num_blocks, block_size, num_kv_heads, head_dim]
(index 0 = K, 1 = V). Token slot s lives at block s // block_size, offset s % block_size.

`TorchPagedAttention` splits a step's sequences into groups, each handled by one
scaled_dot_product_attention call per layer:
- decode (query length 1): K/V gathered through the block tables into [B, L, H_kv, D], a
  boolean mask from seq_lens;
- prefill (query length > 1, which covers chunked prefill and prefix-cache hits): a prompt's first
  chunk of groups.ALONE_MIN_TOKENS or more alone (causal, its rows read in place, as HF runs one unpadded
  prompt); shorter ones and chunks after a cached context grouped, queries padded to the longest
  chunk of the group, causal mask offset by each sequence's context. Sequences of very different
  cost go to separate groups so padding stays bounded.
Where the native decode kernel is loaded (CPU), it takes the decodes in one call per layer, and in
float32 models without windows, soft-capping or sinks also the prefills of sequences up to
`prefill_rows_max_len` tokens, each query row as a sequence of one query (groups.rows_as_sequences); a step
of decodes and such prefills then also qualifies for the native decoder layers (native_decode.py).
All index tensors and masks are built once per step (`build_metadata`), never per layer, and
once per distinct window of the model's layers (a layer passes its window to `forward`).

Sliding window W (HF's rule, see shape.py): the query at position p sees keys
p - W + 1 .. p; a chunk of C (Llama 4) lets it see p - p % C .. p (windows.py). Each sequence's
keys are gathered from the first block that holds a key some query of the step can see, so blocks
before it are never read (the KV manager frees them; their block-table entries may be -1).
Gemma 2's logit soft-capping (scores -> c * tanh(scores / c)) and gpt-oss's attention sinks
(sinks.py) are not in SDPA, so such layers compute attention with explicit matmuls; the native
decode kernel does both itself.

fp8 KV cache (fp8_kv.py): a layer's cache is then an Fp8KVCache; K/V are written quantized
(x / scale, saturated) and every read dequantizes (the gathers here, the C decode kernel in C).
A first prefill chunk attends to its own fresh K/V, unquantized (as vLLM does); the cache still
gets the quantized copy for later steps.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.model.attention.fp8_kv import KERNEL_FORMATS, Fp8KVCache, calculated_scale, dequantize_into, quantize
from pipeline.model.attention.groups import (
    AttentionView,
    DecodeGroup,
    PrefillGroup,
    TorchAttentionMetadata,
    as_tensor,
    first_key_blocks,
    gather_block_ids,
    prefill_groups,
    rows_as_sequences,
    split_decodes,
)
from pipeline.model.attention.sinks import sink_softmax
from pipeline.model.attention.windows import Window, first_visible_key, kernel_window
from pipeline.model.cpu.kernels import DecodeKernel, RopeKVKernel
from pipeline.step.inputs import StepInputs

# One layer's cache: a tensor in the model's dtype, or fp8 bytes with their scales.
KVCache = torch.Tensor | Fp8KVCache


class AttentionBackend(Protocol):
    """What a model layer needs from an attention implementation (FlashAttention etc. later)."""

    def build_metadata(self, inputs: StepInputs, device: torch.device) -> object: ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: KVCache, metadata: object, window: Window = None) -> torch.Tensor:
        """q [T, H, D], k/v [T, H_kv, D] -> [T, H, D]; writes k/v into kv_cache first.
        `window`: the layer's sliding window or chunk (None = full attention; windows.py)."""
        ...


# Float32 prefills of sequences up to this long (context included) go through the decode kernel, each
# query row as a one-query sequence over its sequence's blocks (rows_as_sequences). The kernel takes a
# sequence's consecutive rows in tiles of 8, each block of keys read once a tile (as SDPA's flash kernel
# shares them across a block of rows), and computes no masked squares, where SDPA computes each block of
# rows against whole blocks of keys. SmolLM2 float32,
# 32 requests of 16-256 prompt tokens (`aqueduct batch`'s benchmark workload), Zen 4 VM: its prefill
# steps 6.33-6.41 s against 6.96-7.30 s through SDPA (then in padded groups of several prompts).
# Single sequences past this length are faster through SDPA (one of 2,040 tokens, bfloat16: 3.84
# against 2.59 s a step). bfloat16 models keep SDPA: the kernel computes in float32, where HF's
# bfloat16 SDPA rounds, and their prefill logits would leave HF's (tests/pipeline/model/models'
# bfloat16 checks).
PREFILL_ROWS_MAX_LEN = 512

class TorchPagedAttention:
    """Portable backend built on torch indexing and F.scaled_dot_product_attention."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                 scale: float, *, windows: frozenset[Window] = frozenset({None}),
                 logit_softcap: float | None = None) -> None:
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.scale = scale
        self.windows = windows
        self.logit_softcap = logit_softcap
        # Reused gather buffers (K, V, then dequantized K, V for fp8): a fresh multi-MB tensor per
        # layer costs page faults that took longer than the gather itself on CPU. Grown on demand.
        self._workspace: list[torch.Tensor] = [torch.empty(0) for _ in range(4)]
        # Native decode kernel (float32, bfloat16 or fp8 K/V, on CPU); the runner sets it when it applies.
        self.decode_kernel: DecodeKernel | None = None
        # Prefills of sequences up to this long go through the decode kernel by rows (selection.py sets
        # PREFILL_ROWS_MAX_LEN where it applies; 0 = never).
        self.prefill_rows_max_len = 0
        # Rope fused with the KV write (CPU, float32/bfloat16 caches; an fp8 cache keeps the quantizing
        # torch write); models that rotate q/k in the usual way use it when set (the runner sets it).
        self.rope_kv_kernel: RopeKVKernel | None = None

    # ---- metadata, once per step -------------------------------------------------------------

    def build_metadata(self, inputs: StepInputs, device: torch.device) -> TorchAttentionMetadata:
        slots = inputs.slot_mapping[: inputs.num_tokens]
        write_rows = None
        if (slots < 0).any():
            keep = np.flatnonzero(slots >= 0)
            slots, write_rows = slots[keep], as_tensor(keep, device)
        views = {window: self._view(inputs, window, device) for window in self.windows}
        return TorchAttentionMetadata(as_tensor(slots.astype(np.int64), device), write_rows, views)

    def _view(self, inputs: StepInputs, window: Window, device: torch.device) -> AttentionView:
        starts = inputs.query_start_loc[:-1].astype(np.int64)
        query_lens = np.diff(inputs.query_start_loc).astype(np.int64)
        seq_lens = inputs.seq_lens.astype(np.int64)
        if self.decode_kernel is not None and query_lens.max() == 1:  # decodes only: each query row is its sequence
            return AttentionView([self._kernel_decode_group(starts, seq_lens, inputs.block_tables,
                                                            len(inputs.input_ids), window)], [])
        decodes = []
        decode_seqs = np.flatnonzero(query_lens == 1)
        if self.decode_kernel is not None:
            # Decodes and short prefills, every query row a sequence of its own for the kernel.
            by_rows = seq_lens <= self.prefill_rows_max_len
            kernel_seqs = np.flatnonzero((query_lens == 1) | by_rows)
            if len(kernel_seqs):
                rows, lens, tables = rows_as_sequences(starts[kernel_seqs], query_lens[kernel_seqs],
                                                       seq_lens[kernel_seqs], inputs.block_tables[kernel_seqs])
                decodes.append(self._kernel_decode_group(rows, lens, tables, len(inputs.input_ids), window))
            query_lens = np.where(by_rows, 1, query_lens)  # no prefill groups for them
        elif len(decode_seqs):
            visible = seq_lens - np.maximum(first_visible_key(seq_lens - 1, window), 0)  # keys each decode reads
            for group in split_decodes(visible[decode_seqs]):
                seqs = decode_seqs[group]
                decodes.append(self._decode_group(starts[seqs], seq_lens[seqs], inputs.block_tables[seqs],
                                                  len(inputs.input_ids), window, device))
        prefill_seqs = np.flatnonzero(query_lens > 1)
        groups = [prefill_seqs[group] for group in prefill_groups(query_lens[prefill_seqs], seq_lens[prefill_seqs])]
        prefills = [self._prefill_group(starts[seqs], query_lens[seqs], seq_lens[seqs], inputs.block_tables[seqs],
                                        window, device) for seqs in groups]
        return AttentionView(decodes, prefills)

    def _decode_group(self, rows: np.ndarray, seq_lens: np.ndarray, block_tables: np.ndarray,
                      total_rows: int, window: Window, device: torch.device) -> DecodeGroup:
        first_keys = first_visible_key(seq_lens - 1, window)  # the query sits at seq_len - 1
        first_blocks = first_key_blocks(first_keys, self.block_size)
        end_blocks = -(-seq_lens // self.block_size)
        block_ids = gather_block_ids(block_tables, first_blocks, end_blocks)
        num_blocks = block_ids.shape[1]
        # Key j of sequence i sits at position first_blocks[i] * block_size + j.
        # seq_lens [3, 5], no window, block_size 4, 2 blocks -> [[T T T F F F F F], [T T T T T F F F]]
        key_positions = first_blocks[:, None] * self.block_size + np.arange(num_blocks * self.block_size)[None, :]
        mask = (key_positions < seq_lens[:, None]) & (key_positions >= first_keys[:, None])
        all_rows = len(rows) == total_rows and bool((rows == np.arange(len(rows))).all())
        return DecodeGroup(as_tensor(rows, device), as_tensor(block_ids.astype(np.int64).reshape(-1), device),
                           as_tensor(mask[:, None, None, :], device), all_rows)

    def _kernel_decode_group(self, rows: np.ndarray, seq_lens: np.ndarray, block_tables: np.ndarray,
                             total_rows: int, window: Window) -> DecodeGroup:
        num_blocks = -(-int(seq_lens.max()) // self.block_size)
        kernel_window_size, kernel_chunk = kernel_window(window)
        all_rows = len(rows) == total_rows and bool((rows == np.arange(len(rows))).all())
        return DecodeGroup(torch.from_numpy(rows), None, None, all_rows,
                           block_tables=torch.from_numpy(np.ascontiguousarray(block_tables[:, :num_blocks],
                                                                             dtype=np.int32)),
                           seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),
                           max_seq_len=int(seq_lens.max()), window=kernel_window_size, chunk=kernel_chunk)

    def _prefill_group(self, starts: np.ndarray, query_lens: np.ndarray, seq_lens: np.ndarray,
                       block_tables: np.ndarray, window: Window, device: torch.device) -> PrefillGroup:
        max_q = int(query_lens.max())
        offsets = np.arange(max_q)[None, :]  # [1, Q]
        valid = offsets < query_lens[:, None]  # [P, Q]
        # Pad queries repeat the sequence's last token so gathers stay in range.
        # starts [0, 7], query_lens [3, 2], Q=3 -> rows [[0, 1, 2], [7, 8, 8]]
        rows = starts[:, None] + np.minimum(offsets, query_lens[:, None] - 1)
        contexts = seq_lens - query_lens
        query_positions = contexts[:, None] + offsets  # [P, Q]
        out_src, out_dst = np.flatnonzero(valid.reshape(-1)), rows[valid]
        if not contexts.any():
            block_ids = None
            first_positions = np.zeros_like(seq_lens)  # keys are the step's own tokens, from position 0
            keys_len, key_end = max_q, query_lens
        else:
            # The first query (position contexts[p]) sees keys from contexts[p] - W + 1 on (or its chunk's start).
            first_blocks = first_key_blocks(first_visible_key(contexts, window), self.block_size)
            ids = gather_block_ids(block_tables, first_blocks, -(-seq_lens // self.block_size))
            block_ids = as_tensor(ids.astype(np.int64).reshape(-1), device)
            first_positions = first_blocks * self.block_size
            keys_len, key_end = ids.shape[1] * self.block_size, seq_lens
        mask = None
        if len(starts) > 1 or contexts.any() or window:
            # Query i of sequence p sits at position contexts[p] + i and sees keys at positions
            # <= that (and > that - window, or in its chunk).
            # Context 2, query len 2, no window -> [[T T T F], [T T T T]]
            key_positions = (first_positions[:, None] + np.arange(keys_len)[None, :])[:, None, :]  # [P, 1, L]
            mask = (key_positions <= query_positions[:, :, None]) & (key_positions < key_end[:, None, None])
            if window:
                mask &= key_positions >= first_visible_key(query_positions, window)[:, :, None]
            mask = as_tensor(mask[:, None], device)
        first_row = int(starts[0]) if len(starts) == 1 else None
        return PrefillGroup(as_tensor(rows, device), as_tensor(out_src, device), as_tensor(out_dst, device),
                            block_ids, mask, first_row)

    def static_decode_metadata(self, slot_mapping: torch.Tensor, seq_lens: torch.Tensor,
                               block_tables: torch.Tensor) -> TorchAttentionMetadata:
        """Decode-only metadata from device tensors of fixed shape (CUDA-graph capture).

        Every row is a decode token and every slot is written (padding rows must point at a
        scratch slot); every sequence gathers all block_tables.shape[1] blocks (entries of blocks
        outside a window must be valid ids: they are read, then masked).
        """
        num_seqs, max_blocks = block_tables.shape
        key_positions = torch.arange(max_blocks * self.block_size, device=seq_lens.device)[None, :]
        rows = torch.arange(num_seqs, device=seq_lens.device)
        views = {}
        for window in self.windows:
            mask = key_positions < seq_lens[:, None]
            if window:
                mask = mask & (key_positions >= first_visible_key(seq_lens[:, None] - 1, window))
            decode = DecodeGroup(rows, block_tables.reshape(-1).long(), mask[:, None, None, :], all_rows=True)
            views[window] = AttentionView([decode], [])
        return TorchAttentionMetadata(slot_mapping, None, views)

    # ---- per layer ---------------------------------------------------------------------------

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: KVCache, metadata: TorchAttentionMetadata, window: Window = None,
                kv_written: bool = False, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """kv_written: the caller already wrote this step's k, v into kv_cache (rope_kv_kernel).
        sinks: the layer's attention sink logits [H] (sinks.py), or None."""
        if not kv_written:
            self._write_kv(k, v, kv_cache, metadata)
        view = metadata.views[window]
        decodes = view.decodes
        if len(decodes) == 1 and decodes[0].all_rows:
            return self._decode(q, kv_cache, decodes[0], sinks)
        out = torch.zeros_like(q)  # rows in no group (graph padding) stay zero
        for decode in decodes:
            out[decode.token_rows] = self._decode(q[decode.token_rows], kv_cache, decode, sinks)
        for group in view.prefills:
            self._prefill(q, k, v, kv_cache, group, out, sinks)
        return out

    def rope_and_write_kv(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache,
                          metadata: TorchAttentionMetadata, num_heads: int) -> bool:
        """Rotate q and k inside qkv and write k, v into the cache in one native call, when the kernel
        is loaded and applies (every row has a slot entry, the cache is float32/bfloat16, not fp8);
        False: nothing done, use the torch path."""
        kernel = self.rope_kv_kernel
        if (kernel is None or metadata.write_rows is not None or isinstance(kv_cache, Fp8KVCache)
                or not kernel.applies(qkv, cos, kv_cache, metadata.slot_mapping)):
            return False
        kernel(qkv, cos, sin, kv_cache, metadata.slot_mapping, num_heads, self.num_kv_heads, self.head_dim)
        return True

    def _write_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache,
                  metadata: TorchAttentionMetadata) -> None:
        num_written = metadata.slot_mapping.shape[0]
        if metadata.write_rows is not None:
            k, v = k[metadata.write_rows], v[metadata.write_rows]
        else:
            k, v = k[:num_written], v[:num_written]
        if isinstance(kv_cache, Fp8KVCache):
            self._write_fp8(k, v, kv_cache, metadata.slot_mapping)
            return
        # [2, N, bs, H, D] -> [2, N * bs, H, D]: row s is slot s.
        kv_flat = kv_cache.view(2, -1, self.num_kv_heads, self.head_dim)
        kv_flat[0].index_copy_(0, metadata.slot_mapping, k.to(kv_cache.dtype))
        kv_flat[1].index_copy_(0, metadata.slot_mapping, v.to(kv_cache.dtype))

    def _write_fp8(self, k: torch.Tensor, v: torch.Tensor, cache: Fp8KVCache, slots: torch.Tensor) -> None:
        if cache.pending_scales and slots.shape[0] > 0:
            cache.k_scale.copy_(calculated_scale(k, cache.dtype))
            cache.v_scale.copy_(calculated_scale(v, cache.dtype))
            cache.pending_scales = False
        # index_copy_ has no fp8 kernel: copy the bytes through a uint8 view.
        kv_flat = cache.data.view(torch.uint8).view(2, -1, self.num_kv_heads, self.head_dim)
        for half, x in ((0, k), (1, v)):
            stored = quantize(x, cache.scale(half), cache.dtype).view(torch.uint8)
            kv_flat[half].index_copy_(0, slots, stored)

    def _gather(self, kv_cache: KVCache, block_ids: torch.Tensor, num_seqs: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of whole blocks per sequence, as [B, H_kv, L, D] views in `dtype`."""
        # index_select on each half's leading axis is several times faster on CPU than
        # fancy indexing kv_cache[:, block_tables].
        fp8 = isinstance(kv_cache, Fp8KVCache)
        # fp8 bytes are gathered as uint8 (index_select has no fp8 kernel on every device).
        data = kv_cache.data.view(torch.uint8) if fp8 else kv_cache
        gathered = []
        for half in (0, 1):
            shape = (block_ids.shape[0], *data.shape[2:])
            out = self._buffer(half, shape, data.dtype, data.device)
            torch.index_select(data[half], 0, block_ids, out=out)
            if fp8:
                out = dequantize_into(self._buffer(half + 2, shape, dtype, data.device), out.view(kv_cache.dtype),
                                      kv_cache.scale(half))
            gathered.append(out.view(num_seqs, -1, self.num_kv_heads, self.head_dim).transpose(1, 2))
        return gathered[0], gathered[1]

    def _buffer(self, index: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = math.prod(shape)
        buffer = self._workspace[index]
        if buffer.numel() < numel or buffer.dtype != dtype or buffer.device != device:
            buffer = self._workspace[index] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(shape)

    def _decode(self, q: torch.Tensor, kv_cache: KVCache, group: DecodeGroup,
                sinks: torch.Tensor | None = None) -> torch.Tensor:
        if group.block_tables is not None:
            return self._kernel_decode(q, kv_cache, group, sinks)
        num_seqs = q.shape[0]
        keys, values = self._gather(kv_cache, group.block_ids, num_seqs, q.dtype)
        # Query heads h = kv * G + g share KV head kv (as HF's repeat_kv), so the G heads of a
        # group become G query rows against one KV head: K/V are read once per group, ~1.3x faster
        # on CPU than enable_gqa. [B, H, D] -> [B, H_kv, G, D]; the mask broadcasts over rows.
        queries = q.reshape(num_seqs, self.num_kv_heads, -1, self.head_dim)
        # Sink of query head kv * G + g sits at row g of KV head kv, like its query.
        row_sinks = sinks.view(1, self.num_kv_heads, -1, 1) if sinks is not None else None
        out = self._attend(queries, keys, values, group.mask, sinks=row_sinks)
        return out.reshape(q.shape)

    def _kernel_decode(self, q: torch.Tensor, kv_cache: KVCache, group: DecodeGroup,
                       sinks: torch.Tensor | None) -> torch.Tensor:
        assert self.decode_kernel is not None and group.block_tables is not None and group.seq_lens is not None
        scales: dict[str, float | int] = {}
        if isinstance(kv_cache, Fp8KVCache):
            scales = {"kv_format": KERNEL_FORMATS[kv_cache.dtype], "k_scale": float(kv_cache.k_scale),
                      "v_scale": float(kv_cache.v_scale)}
            kv_cache = kv_cache.data
        return self.decode_kernel(q, kv_cache, group.block_tables, group.seq_lens, group.max_seq_len, self.scale,
                                  window=group.window, chunk=group.chunk, softcap=self.logit_softcap or 0.0,
                                  sinks=sinks, **scales)

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache,
                 group: PrefillGroup, out: torch.Tensor, sinks: torch.Tensor | None = None) -> None:
        num_seqs, max_q = group.query_rows.shape
        rows = slice(group.first_row, group.first_row + max_q) if group.first_row is not None else None
        queries = (q[rows].unsqueeze(0) if rows else q[group.query_rows]).transpose(1, 2)  # [P, H, Q, D]
        if group.block_ids is None:
            keys, values = ((k[rows].unsqueeze(0), v[rows].unsqueeze(0)) if rows else
                            (k[group.query_rows], v[group.query_rows]))
            keys, values = keys.transpose(1, 2), values.transpose(1, 2)
        else:
            keys, values = self._gather(kv_cache, group.block_ids, num_seqs, q.dtype)
        head_sinks = sinks.view(1, -1, 1, 1) if sinks is not None else None
        result = self._attend(queries, keys, values, group.mask, grouped_heads=True, sinks=head_sinks)  # [P, H, Q, D]
        flat = result.transpose(1, 2).reshape(num_seqs * max_q, *q.shape[1:])
        if rows:
            out[rows] = flat.to(out.dtype)
        else:
            out[group.out_dst] = flat[group.out_src].to(out.dtype)

    def _attend(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                grouped_heads: bool = False, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of queries [B, Hq, Q, D] over keys/values [B, H_kv, L, D]; mask None = causal.
        grouped_heads: query head h reads KV head h // (Hq / H_kv) (otherwise Hq == H_kv).
        sinks: sink logits broadcastable to [B, Hq, Q, 1] (sinks.py)."""
        if self.logit_softcap is None and sinks is None:
            return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, is_causal=mask is None,
                                                  scale=self.scale, enable_gqa=grouped_heads)
        if grouped_heads and queries.shape[1] != keys.shape[1]:
            group = queries.shape[1] // keys.shape[1]
            keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        # HF's eager order: (q k^T) * scale, / cap, tanh, * cap, mask, softmax in float32.
        scores = torch.matmul(queries, keys.transpose(-1, -2)) * self.scale
        if self.logit_softcap is not None:
            scores = torch.tanh(scores / self.logit_softcap) * self.logit_softcap
        if mask is None:
            mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        if sinks is not None:
            return torch.matmul(sink_softmax(scores, sinks).to(queries.dtype), values)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(queries.dtype)
        return torch.matmul(weights, values)
