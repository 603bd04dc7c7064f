"""How a step's sequences are grouped for paged attention, and the metadata the layers read.

A step's decode sequences are grouped by length and its prefill sequences by cost, so that the
padding each group's one attention call per layer brings stays bounded (split_decodes,
prefill_groups, split_prefills); the groups' index tensors are built once per step (attention.py's
TorchPagedAttention.build_metadata), never per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.model.attention.windows import Window

# A prompt's first chunk (no cached context) of at least this many tokens is a prefill group of its
# own (prefill_groups): SDPA reads its rows in place, causal, with no padding and no gathered copy. 8
# bfloat16 prompts of 180-300 tokens, SmolLM2's heads, 30 layers (2-core Zen 4 VM): 284-380 ms against
# 504-553 as one padded group. Below it a call's own cost outweighs the padding it saves: 64 prompts
# of 8-16 tokens took 56-64 ms one call each against 37-42 ms in one padded call; 32 of 18-64 tokens
# 78-81 against 113-133 ms; 24 of 34-95, 121-128 against 213-214 ms.
ALONE_MIN_TOKENS = 32
# A prefill group may cost at most this many times its unpadded attention work, and pad at most this
# many query x key pairs (scores per head) in all. The bound matters where one chunk is long: a 1,024-token
# chunk over 4,096 keys beside a 200-token one fits the ratio (2 x 1024 x 4096 <= 2 x the real work),
# and padding the short one to its size nearly doubled the step (SmolLM2 bfloat16, a 5,000-word prompt
# in prefill under --long-prefill-token-threshold 1024 while 32 prompts arrive: steps of 5.0-6.5 s
# against 3.3-3.8 s with the bound). A call costs ~30 us a layer on a 2-core box, ~650 padded query x key
# pairs' worth for SmolLM2's 9 heads at SDPA's ~50 GFLOP/s; grouping won only for tiny prompts (64 of
# 8-16 tokens: ~7k padded pairs against 63 calls saved), hence 16k.
MAX_PADDING_RATIO = 2.0
MAX_PADDED_SCORES = 16_384
# Decode groups: padded keys at most this many times the real ones, but at least this many
# sequences per group (each group is one more SDPA call per layer).
DECODE_PADDING_RATIO = 1.25
MIN_DECODE_GROUP = 16


@dataclass(slots=True)
class DecodeGroup:
    token_rows: torch.Tensor  # [Bd] rows of the flat token axis
    block_ids: torch.Tensor | None  # [Bd * nb] block ids, nb blocks per sequence, flattened
    mask: torch.Tensor | None  # [Bd, 1, 1, nb * block_size] bool, True = attend
    all_rows: bool  # token_rows == arange(T): no gather/scatter of q and out needed
    # Inputs of the native CPU kernel (set instead of block_ids/mask when it is used).
    block_tables: torch.Tensor | None = None  # [Bd, nb] int32
    seq_lens: torch.Tensor | None = None  # [Bd] int32
    max_seq_len: int = 0
    window: int = 0  # the kernel's sliding window (0 = none)
    chunk: int = 0  # the kernel's attention chunk (0 = none; windows.py)


@dataclass(slots=True)
class PrefillGroup:
    query_rows: torch.Tensor  # [P, Q] token row of each padded query (pads repeat the last row)
    out_src: torch.Tensor  # [n] indices into the flattened [P * Q] queries that are real
    out_dst: torch.Tensor  # [n] their token rows
    block_ids: torch.Tensor | None  # [P * nb]; None = no cached context, keys are the new tokens
    mask: torch.Tensor | None  # [P, 1, Q, L] bool; None = plain causal (one sequence, no context)
    # One sequence: its query rows are first_row .. first_row + Q - 1, read and written as slices
    # (no gather or scatter: on a 2-core box each indexing op of a 16-token prefill took ~90 us).
    first_row: int | None = None


@dataclass(slots=True)
class AttentionView:
    """The groups of one step as seen by the layers of one window (None = full attention; windows.py)."""

    decodes: list[DecodeGroup]
    prefills: list[PrefillGroup]


@dataclass(slots=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T'] slots written (padding already removed)
    write_rows: torch.Tensor | None  # [T'] token rows whose K/V are written; None = rows 0..T'-1
    views: dict[Window, AttentionView]  # by window


def as_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)


def prefill_groups(query_lens: np.ndarray, seq_lens: np.ndarray) -> list[np.ndarray]:
    """Prefill sequences' groups (indices into the arrays): each first chunk of ALONE_MIN_TOKENS or more
    alone, the rest by split_prefills. query_lens [40, 8, 50], seq_lens [40, 8, 90] -> [[0], [1, 2]]."""
    alone = (query_lens == seq_lens) & (query_lens >= ALONE_MIN_TOKENS)
    rest = np.flatnonzero(~alone)
    grouped = [rest[group] for group in split_prefills(query_lens[rest], seq_lens[rest])] if len(rest) else []
    return [np.array([seq]) for seq in np.flatnonzero(alone)] + grouped


def split_prefills(query_lens: np.ndarray, seq_lens: np.ndarray) -> list[np.ndarray]:
    """Group prefill sequences (indices into the arrays) so padding wastes at most ~2x, and little.

    Sorted by cost, a group grows while padded work (n * max_q * max_kv) stays within
    MAX_PADDING_RATIO of the real work (sum of q * kv) and exceeds it by at most MAX_PADDED_SCORES.
    Worked example, no cached context: query lens [300, 290, 8] -> groups [[0, 1], [2]]. The 290-token
    chunk pads 2 * 300^2 - (300^2 + 290^2) = 5,900 scores beside the 300-token one (within both
    bounds); the 8-token chunk would pad 3 * 300^2 - (300^2 + 290^2 + 8^2) = 95,836, within 2x of the
    real work but past MAX_PADDED_SCORES, so it starts a group of its own.
    """
    order = np.argsort(-(query_lens * seq_lens), kind="stable")
    groups: list[list[int]] = []
    real = max_q = max_kv = 0
    for seq in order.tolist():
        q_len, kv_len = int(query_lens[seq]), int(seq_lens[seq])
        grown = len(groups[-1]) + 1 if groups else 0
        padded = grown * max(max_q, q_len) * max(max_kv, kv_len)
        grown_real = real + q_len * kv_len
        if groups and padded <= MAX_PADDING_RATIO * grown_real and padded - grown_real <= MAX_PADDED_SCORES:
            groups[-1].append(seq)
            real, max_q, max_kv = grown_real, max(max_q, q_len), max(max_kv, kv_len)
        else:
            groups.append([seq])
            real, max_q, max_kv = q_len * kv_len, q_len, kv_len
    return [np.array(group, dtype=np.int64) for group in groups]


def split_decodes(seq_lens: np.ndarray) -> list[np.ndarray]:
    """Group decode sequences (indices) by length so gathered keys are mostly real, not padding.

    Sorted by length, a group grows while len(group) * longest <= ratio * sum(lengths), or while
    it is smaller than MIN_DECODE_GROUP. Worked example with ratio 1.25 and min size 2:
    seq_lens [500, 40, 480, 60, 45] -> [[0, 2], [3, 4, 1]].
    """
    order = np.argsort(-seq_lens, kind="stable")
    groups: list[list[int]] = []
    total = longest = 0
    for seq in order.tolist():
        length = int(seq_lens[seq])
        if groups and (len(groups[-1]) < MIN_DECODE_GROUP
                       or (len(groups[-1]) + 1) * longest <= DECODE_PADDING_RATIO * (total + length)):
            groups[-1].append(seq)
            total += length
        else:
            groups.append([seq])
            total = longest = length
    return [np.array(group, dtype=np.int64) for group in groups]


def first_key_blocks(first_key_positions: np.ndarray, block_size: int) -> np.ndarray:
    """The block of each sequence's first visible key: where its gather starts."""
    return np.maximum(first_key_positions, 0) // block_size


def gather_block_ids(block_tables: np.ndarray, first_blocks: np.ndarray, end_blocks: np.ndarray) -> np.ndarray:
    """Per sequence, block ids first_blocks[i] .. first_blocks[i] + nb - 1, nb = max(end - first),
    entries at or past end_blocks[i] replaced by block 0 (padding, masked out).

    block_tables [[7, 2, 9], [4, 5, 0]], first [1, 0], end [3, 1] -> nb 2 -> [[2, 9], [4, 0]]
    """
    num_blocks = int((end_blocks - first_blocks).max())
    index = first_blocks[:, None] + np.arange(num_blocks)[None, :]  # [B, nb]
    valid = index < end_blocks[:, None]
    clipped = np.minimum(index, block_tables.shape[1] - 1)
    return np.where(valid, np.take_along_axis(block_tables, clipped, axis=1), 0)


def rows_as_sequences(starts: np.ndarray, query_lens: np.ndarray, seq_lens: np.ndarray,
                      block_tables: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each query row of the given sequences as a sequence of one query: its token row, the keys it
    sees (causal: its position + 1) and its sequence's block table.
    starts [0, 3], query_lens [3, 1], seq_lens [5, 9] -> rows [0, 1, 2, 3], lens [3, 4, 5, 9]."""
    owner = np.repeat(np.arange(len(starts)), query_lens)
    offsets = np.arange(len(owner)) - np.repeat(np.cumsum(query_lens) - query_lens, query_lens)
    rows = starts[owner] + offsets
    lens = (seq_lens - query_lens)[owner] + offsets + 1
    return rows, lens, block_tables[owner]
