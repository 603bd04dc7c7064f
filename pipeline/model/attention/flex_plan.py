"""Host-side (numpy) plans of FlexAttention tiles: which cache blocks each tile of queries visits.

A tile is a run of queries of one sequence (flex.py explains why). For each tile the
plan lists, in logical order, the physical blocks holding keys some row of the tile may see:
from the block of the first visible key (sliding window or chunk, windows.py) to the block of the
last query.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.model.attention.windows import Window, first_visible_key


@dataclass(slots=True)
class TilePlan:
    token_rows: np.ndarray  # decode [B]; prefill [tiles, tile] token row of each query row (pads repeat)
    kv_num_blocks: np.ndarray  # [tiles] blocks listed per tile
    kv_indices: np.ndarray  # [tiles, nb] physical block ids, 0 past kv_num_blocks
    query_starts: np.ndarray  # [tiles] position of the tile's first query
    window: Window
    visited_blocks: np.ndarray  # [V] every listed block ...
    visited_positions: np.ndarray  # [V] ... and its logical index in its sequence
    out_src: np.ndarray | None = None  # prefill: real rows of the flattened [tiles * tile] queries
    out_dst: np.ndarray | None = None  # prefill: their token rows


def _list_blocks(block_tables: np.ndarray, first_blocks: np.ndarray,
                 end_blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Blocks first .. end - 1 of each row's table, left-aligned and padded with 0.

    tables [[7, 2, 9], [4, 5, 0]], first [1, 0], end [3, 1] ->
    indices [[2, 9], [4, 0]], counts [2, 1], visited [2, 9, 4] at logical indices [1, 2, 0]
    """
    counts = end_blocks - first_blocks
    logical = first_blocks[:, None] + np.arange(max(int(counts.max()), 1))[None, :]
    valid = logical < end_blocks[:, None]
    clipped = np.minimum(logical, block_tables.shape[1] - 1)
    indices = np.where(valid, np.take_along_axis(block_tables, clipped, axis=1), 0)
    return indices.astype(np.int32), counts.astype(np.int32), indices[valid].astype(np.int64), logical[valid]


def _first_visible_blocks(first_query_positions: np.ndarray, window: Window, block_size: int) -> np.ndarray:
    return np.maximum(first_visible_key(first_query_positions, window), 0) // block_size


def decode_plan(rows: np.ndarray, seq_lens: np.ndarray, block_tables: np.ndarray, block_size: int,
                window: Window) -> TilePlan:
    """One tile per decode sequence; its query sits at position seq_len - 1."""
    positions = seq_lens - 1
    first = _first_visible_blocks(positions, window, block_size)
    indices, counts, visited, logical = _list_blocks(block_tables, first, -(-seq_lens // block_size))
    return TilePlan(rows, counts, indices, positions.astype(np.int32), window, visited, logical)


def prefill_plan(starts: np.ndarray, query_lens: np.ndarray, seq_lens: np.ndarray, block_tables: np.ndarray,
                 block_size: int, window: Window, tile: int) -> TilePlan:
    """Each sequence's queries cut into tiles of `tile` rows.

    starts [0, 9], query_lens [9, 3], seq_lens [9, 7], tile 4 -> tiles of sequences [0, 0, 0, 1],
    first query positions [0, 4, 8, 4], real rows [4, 4, 1, 3],
    token rows [[0 1 2 3], [4 5 6 7], [8 8 8 8], [9 10 11 11]]
    """
    tiles_per_seq = -(-query_lens // tile)
    seq_of_tile = np.repeat(np.arange(len(query_lens)), tiles_per_seq)
    tile_in_seq = np.arange(len(seq_of_tile)) - np.repeat(np.cumsum(tiles_per_seq) - tiles_per_seq, tiles_per_seq)
    offsets = tile_in_seq * tile  # first query of the tile, counted from the chunk's start
    real_rows = np.minimum(tile, query_lens[seq_of_tile] - offsets)
    first_positions = (seq_lens - query_lens)[seq_of_tile] + offsets
    last_positions = first_positions + real_rows - 1
    first = _first_visible_blocks(first_positions, window, block_size)
    indices, counts, visited, logical = _list_blocks(block_tables[seq_of_tile], first,
                                                     last_positions // block_size + 1)
    row_in_tile = np.arange(tile)[None, :]
    token_rows = (starts[seq_of_tile] + offsets)[:, None] + np.minimum(row_in_tile, real_rows[:, None] - 1)
    real = row_in_tile < real_rows[:, None]
    return TilePlan(token_rows, counts, indices, first_positions.astype(np.int32), window, visited, logical,
                    out_src=np.flatnonzero(real.reshape(-1)), out_dst=token_rows[real])


def pad_tiles(plan: TilePlan) -> TilePlan:
    """Plan with its tile count padded to a power of two (at least 8) by empty tiles: they list
    no blocks and their rows are dropped, so a compiled kernel sees few distinct batch sizes.

    3 tiles -> 8 (5 empty), 9 -> 16
    """
    count = len(plan.kv_num_blocks)
    padded = max(8, 1 << (count - 1).bit_length())
    extra = padded - count
    if extra == 0:
        return plan

    def grow(array: np.ndarray) -> np.ndarray:
        return np.concatenate([array, np.zeros((extra, *array.shape[1:]), dtype=array.dtype)])

    token_rows = plan.token_rows if plan.out_src is None else grow(plan.token_rows)  # decode rows stay real
    return TilePlan(token_rows, grow(plan.kv_num_blocks), grow(plan.kv_indices), grow(plan.query_starts),
                    plan.window, plan.visited_blocks, plan.visited_positions, plan.out_src, plan.out_dst)
