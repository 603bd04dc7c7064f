"""FlexPagedAttention (torch FlexAttention over the paged cache) equals the portable torch backend
and HF transformers on CPU: decode, chunked prefill over cached context, mixed steps with padding,
GQA, sliding windows and soft-capping. torch.compile builds the kernels on first use (tens of
seconds on CPU), so these tests share one process-wide compiled function."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.model.attention import TorchPagedAttention
from pipeline.model.flex_attention import FlexPagedAttention
from pipeline.model.flex_plan import decode_plan, prefill_plan
from pipeline.step_inputs import StepInputs

NUM_BLOCKS = 48


def test_decode_plan_lists_blocks_from_the_window_start() -> None:
    tables = np.array([[7, 2, 9, 5], [4, 6, 0, 0]])
    plan = decode_plan(np.array([0, 1]), np.array([13, 3]), tables, block_size=4, window=6)
    # sequence 0: query at 12 sees 7..12 -> blocks 1..3; sequence 1: query at 2 sees 0..2 -> block 0
    assert plan.kv_num_blocks.tolist() == [3, 1]
    assert plan.kv_indices.tolist() == [[2, 9, 5], [4, 0, 0]]
    assert plan.visited_blocks.tolist() == [2, 9, 5, 4] and plan.visited_positions.tolist() == [1, 2, 3, 0]
    assert plan.query_starts.tolist() == [12, 2]


def test_prefill_plan_cuts_tiles_and_drops_pad_rows() -> None:
    tables = np.arange(8).reshape(2, 4)
    plan = prefill_plan(np.array([0, 9]), np.array([9, 3]), np.array([9, 7]), tables, block_size=4,
                        window=None, tile=4)
    assert plan.token_rows.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 8, 8, 8], [9, 10, 11, 11]]
    assert plan.query_starts.tolist() == [0, 4, 8, 4]
    assert plan.kv_num_blocks.tolist() == [1, 2, 3, 2]  # up to each tile's last query
    assert plan.out_dst.tolist() == list(range(12))
    assert plan.out_src.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 14]


def _random_step(rng: np.random.Generator, block_size: int, chunks: list[tuple[int, int]],
                 num_padding: int) -> StepInputs:
    """chunks: (cached context, new tokens) per sequence, blocks drawn without repeats."""
    free = list(rng.permutation(NUM_BLOCKS))
    ids, positions, slots, query_lens, seq_lens, tables = [], [], [], [], [], []
    for context, new in chunks:
        table = [int(free.pop()) for _ in range(-(-(context + new) // block_size))]
        pos = np.arange(context, context + new)
        ids += [0] * new
        positions += pos.tolist()
        slots += (np.array(table)[pos // block_size] * block_size + pos % block_size).tolist()
        query_lens.append(new)
        seq_lens.append(context + new)
        tables.append(table)
    width = max(len(t) for t in tables)
    block_tables = np.zeros((len(chunks), width), dtype=np.int32)
    for row, table in enumerate(tables):
        block_tables[row, :len(table)] = table
    total = len(ids)
    return StepInputs(np.zeros(total + num_padding, np.int64), np.array(positions + [0] * num_padding),
                      np.array(slots + [-1] * num_padding), np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32),
                      np.array(seq_lens, np.int32), block_tables, np.arange(total), total, max(query_lens),
                      max(seq_lens))


@pytest.mark.parametrize(("heads", "window", "softcap"), [((4, 2), None, None), ((4, 1), 7, None),
                                                          ((2, 2), 5, 10.0)])
def test_flex_matches_torch_backend_on_mixed_steps(heads: tuple[int, int], window: int | None,
                                                   softcap: float | None) -> None:
    num_heads, num_kv_heads = heads
    head_dim, block_size = 16, 4
    rng = np.random.default_rng(0)
    windows = frozenset({None, window})
    args = (num_heads, num_kv_heads, head_dim, block_size, 0.3)
    flex = FlexPagedAttention(*args, windows=windows, logit_softcap=softcap)
    reference = TorchPagedAttention(*args, windows=windows, logit_softcap=softcap)
    cache = torch.randn(2, NUM_BLOCKS, block_size, num_kv_heads, head_dim)
    # decode-only; prefill from scratch; chunks over cached context mixed with decodes and padding
    for chunks, padding in (([(5, 1), (12, 1), (0, 1)], 0), ([(0, 9), (0, 70)], 0),
                            ([(13, 1), (6, 11), (2, 1), (30, 3)], 2)):
        inputs = _random_step(rng, block_size, chunks, padding)
        tokens = len(inputs.input_ids)
        q = torch.randn(tokens, num_heads, head_dim)
        k, v = torch.randn(tokens, num_kv_heads, head_dim), torch.randn(tokens, num_kv_heads, head_dim)
        for layer_window in windows:
            flex_cache, reference_cache = cache.clone(), cache.clone()
            got = flex.forward(q, k, v, flex_cache, flex.build_metadata(inputs, torch.device("cpu")), layer_window)
            want = reference.forward(q, k, v, reference_cache,
                                     reference.build_metadata(inputs, torch.device("cpu")), layer_window)
            real = inputs.num_tokens
            torch.testing.assert_close(got[:real], want[:real], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(flex_cache, reference_cache)
