"""Chunked local attention (Llama 4, attention/windows.py): the query at position p sees keys
p - p % C .. p. The torch backend (decode and prefill groups, with and without the native decode
kernel), the kernel itself, FlexAttention's block plans and the CUDA-graph decode metadata against a
dense reference; blocks before a query's chunk are never read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.model.attention.flex_plan import decode_plan, prefill_plan
from pipeline.model.attention.paged import TorchPagedAttention
from pipeline.model.attention.shape import AttentionShape, layer_windows
from pipeline.model.attention.windows import Chunk, first_visible_key, kernel_window, window_span
from pipeline.model.cpu.kernels import load_decode_kernel
from pipeline.step.inputs import StepInputs

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 16
SCALE = HEAD_DIM**-0.5


def test_first_visible_key_is_the_chunk_start_or_the_window_start() -> None:
    positions = np.arange(10)
    assert first_visible_key(positions, Chunk(4)).tolist() == [0, 0, 0, 0, 4, 4, 4, 4, 8, 8]
    assert first_visible_key(positions, 3).tolist() == [-2, -1, 0, 1, 2, 3, 4, 5, 6, 7]
    assert first_visible_key(positions, None).tolist() == [0] * 10
    assert first_visible_key(torch.arange(10), Chunk(4)).tolist() == [0, 0, 0, 0, 4, 4, 4, 4, 8, 8]


def test_a_chunk_spans_its_size_for_block_freeing_and_the_kernel_takes_it_apart() -> None:
    assert window_span(Chunk(8)) == 8 and window_span(5) == 5 and window_span(None) is None
    assert kernel_window(Chunk(8)) == (0, 8) and kernel_window(5) == (5, 0) and kernel_window(None) == (0, 0)
    shape = AttentionShape(2, 4, 2, 16, 0.25, layer_windows=(Chunk(8), Chunk(8)))
    assert shape.kv_window == 8 and shape.windows == frozenset({Chunk(8)})
    mixed = AttentionShape(2, 4, 2, 16, 0.25, layer_windows=(Chunk(8), None))
    assert mixed.kv_window is None
    with pytest.raises(ValueError, match="attention chunks must be >= 1"):
        Chunk(0)


def test_layer_types_name_chunked_layers() -> None:
    config = {"layer_types": ["chunked_attention", "full_attention"], "attention_chunk_size": 8}
    assert layer_windows(config, 2) == (Chunk(8), None)
    with pytest.raises(ValueError, match="chunked_attention layers but attention_chunk_size is not set"):
        layer_windows({"layer_types": ["chunked_attention"]}, 1)


def _step(rng: np.random.Generator, block_size: int, chunks: list[tuple[int, int]]) -> tuple[StepInputs, int]:
    """chunks: (cached context, new tokens) per sequence, blocks drawn without repeats; the number of blocks."""
    num_blocks = sum(-(-(context + new) // block_size) for context, new in chunks) + 3
    free = list(rng.permutation(num_blocks))
    positions, slots, query_lens, seq_lens, tables = [], [], [], [], []
    for context, new in chunks:
        table = [int(free.pop()) for _ in range(-(-(context + new) // block_size))]
        pos = np.arange(context, context + new)
        positions += pos.tolist()
        slots += (np.array(table)[pos // block_size] * block_size + pos % block_size).tolist()
        query_lens.append(new)
        seq_lens.append(context + new)
        tables.append(table)
    width = max(len(table) for table in tables)
    block_tables = np.array([table + [0] * (width - len(table)) for table in tables], dtype=np.int32)
    num_tokens = len(positions)
    inputs = StepInputs(
        input_ids=np.zeros(num_tokens, dtype=np.int64), positions=np.array(positions, dtype=np.int64),
        slot_mapping=np.array(slots, dtype=np.int64),
        query_start_loc=np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32),
        seq_lens=np.array(seq_lens, dtype=np.int32), block_tables=block_tables,
        logits_indices=np.arange(num_tokens, dtype=np.int64), num_tokens=num_tokens,
        max_query_len=max(query_lens), max_seq_len=max(seq_lens))
    return inputs, num_blocks


def _reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
               chunk: int) -> torch.Tensor:
    """One sequence: queries at `positions` over all its keys [L, H_kv, D], masked to each query's chunk."""
    key_positions = torch.arange(keys.shape[0])
    visible = (key_positions[None, :] <= positions[:, None]) & (key_positions[None, :] // chunk
                                                                 == positions[:, None] // chunk)
    group = NUM_HEADS // NUM_KV_HEADS
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,lhd->hql", q, keys) * SCALE
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.einsum("hql,lhd->qhd", weights, values)


@pytest.mark.parametrize("use_kernel", [False, True], ids=["torch", "kernel"])
@pytest.mark.parametrize(("chunk", "block_size"), [(5, 4), (8, 4), (16, 16), (3, 1)])
def test_torch_backend_matches_dense_chunk_masks(chunk: int, block_size: int, use_kernel: bool) -> None:
    """Decodes at, just past and well past chunk starts; chunks of prefill that start mid-chunk, end on a
    chunk edge, or span several chunks, after cached context."""
    if use_kernel and load_decode_kernel() is None:
        pytest.skip("no C compiler: the CPU kernel is not built here")
    rng = np.random.default_rng(chunk * block_size)
    generator = torch.Generator().manual_seed(chunk)
    chunks = [(0, 1), (chunk - 1, 1), (chunk, 1), (2 * chunk + 1, 1), (0, 3 * chunk + 2), (chunk - 2, chunk + 4),
              (2 * chunk, chunk), (7, 1)]
    inputs, num_blocks = _step(rng, block_size, chunks)
    backend = TorchPagedAttention(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, block_size, SCALE,
                                  windows=frozenset({Chunk(chunk), None}))
    backend.decode_kernel = load_decode_kernel() if use_kernel else None
    kv_cache = torch.zeros(2, num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    flat = kv_cache.view(2, -1, NUM_KV_HEADS, HEAD_DIM)
    q_rows, k_rows, v_rows, expected = [], [], [], []
    for seq, (context, new) in enumerate(chunks):
        keys = torch.randn(context + new, NUM_KV_HEADS, HEAD_DIM, generator=generator)
        values = torch.randn(context + new, NUM_KV_HEADS, HEAD_DIM, generator=generator)
        q = torch.randn(new, NUM_HEADS, HEAD_DIM, generator=generator) * 2
        table = torch.from_numpy(inputs.block_tables[seq].astype(np.int64))
        cached = torch.arange(context)
        slots = table[cached // block_size] * block_size + cached % block_size
        flat[0, slots], flat[1, slots] = keys[:context], values[:context]  # the context, written by earlier steps
        q_rows.append(q)
        k_rows.append(keys[context:])
        v_rows.append(values[context:])
        expected.append(_reference(q, keys, values, torch.arange(context, context + new), chunk))
    metadata = backend.build_metadata(inputs, torch.device("cpu"))
    out = backend.forward(torch.cat(q_rows), torch.cat(k_rows), torch.cat(v_rows), kv_cache, metadata,
                          window=Chunk(chunk))
    torch.testing.assert_close(out, torch.cat(expected), atol=2e-5, rtol=1e-5)


def test_kernel_reads_only_the_last_tokens_chunk() -> None:
    """Blocks wholly before a sequence's chunk hold -1 in its table (as if freed) and are never read."""
    kernel = load_decode_kernel()
    if kernel is None:
        pytest.skip("no C compiler: the CPU kernel is not built here")
    generator = torch.Generator().manual_seed(0)
    block_size, chunk = 4, 10
    seq_lens = torch.tensor([1, 9, 10, 11, 20, 21, 37], dtype=torch.int32)
    max_blocks = -(-int(seq_lens.max()) // block_size)
    num_blocks = len(seq_lens) * max_blocks
    kv_cache = torch.randn(2, num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM, generator=generator)
    block_tables = torch.randperm(num_blocks, generator=generator).reshape(len(seq_lens), max_blocks).to(torch.int32)
    q = torch.randn(len(seq_lens), NUM_HEADS, HEAD_DIM, generator=generator) * 2
    expected = []
    for seq, length in enumerate(seq_lens.tolist()):
        positions = torch.arange(length)
        blocks = block_tables[seq, positions // block_size].long()
        keys, values = kv_cache[0, blocks, positions % block_size], kv_cache[1, blocks, positions % block_size]
        expected.append(_reference(q[seq:seq + 1], keys, values, torch.tensor([length - 1]), chunk))
        block_tables[seq, : (length - 1) // chunk * chunk // block_size] = -1
    out = kernel(q, kv_cache, block_tables, seq_lens, int(seq_lens.max()), SCALE, chunk=chunk)
    torch.testing.assert_close(out, torch.cat(expected), atol=2e-5, rtol=1e-5)


def test_static_decode_metadata_masks_to_the_chunk() -> None:
    backend = TorchPagedAttention(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, 4, SCALE, windows=frozenset({Chunk(6)}))
    metadata = backend.static_decode_metadata(torch.zeros(2, dtype=torch.long), torch.tensor([6, 14]),
                                              torch.zeros(2, 4, dtype=torch.int32))
    mask = metadata.views[Chunk(6)].decodes[0].mask[:, 0, 0]
    assert mask[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5]  # position 5: chunk 0..5
    assert mask[1].nonzero().flatten().tolist() == [12, 13]  # position 13: chunk 12..17


def test_flex_plans_list_blocks_from_the_chunk_start() -> None:
    tables = np.array([[7, 2, 9, 5], [4, 6, 0, 0]])
    plan = decode_plan(np.array([0, 1]), np.array([13, 3]), tables, block_size=4, window=Chunk(8))
    # sequence 0: query at 12 sees 8..12 -> blocks 2..3; sequence 1: query at 2 sees 0..2 -> block 0
    assert plan.kv_num_blocks.tolist() == [2, 1] and plan.kv_indices.tolist() == [[9, 5], [4, 0]]
    prefill = prefill_plan(np.array([0]), np.array([11]), np.array([16]), tables[:1], block_size=4,
                           window=Chunk(8), tile=4)
    # tiles of positions 5..8 (5 sees 0.. -> blocks 0..2), 9..12 and 13..15 (9 and 13 see 8.. -> blocks 2..3)
    assert prefill.query_starts.tolist() == [5, 9, 13] and prefill.kv_num_blocks.tolist() == [3, 2, 2]
    assert prefill.kv_indices.tolist() == [[7, 2, 9], [9, 5, 0], [9, 5, 0]]
