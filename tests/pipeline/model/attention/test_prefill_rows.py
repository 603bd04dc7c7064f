"""Short float32 prefills through the native decode kernel, one query row at a time (groups.py's
rows_as_sequences): the same attention as SDPA's prefill groups, which longer sequences keep."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.model.attention.groups import rows_as_sequences
from pipeline.model.attention.paged import PREFILL_ROWS_MAX_LEN, TorchPagedAttention
from pipeline.model.attention.selection import make_backend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.cpu.kernels import load_decode_kernel
from pipeline.step.inputs import StepInputs

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 6, 2, 32, 16
needs_kernel = pytest.mark.skipif(load_decode_kernel() is None, reason="no C compiler: the CPU kernel is not built")


def test_each_query_row_becomes_a_sequence_of_its_causal_length() -> None:
    tables = np.array([[4, 5], [7, 0]], dtype=np.int32)
    rows, lens, owned = rows_as_sequences(np.array([0, 3]), np.array([3, 1]), np.array([5, 9]), tables)
    assert rows.tolist() == [0, 1, 2, 3]
    assert lens.tolist() == [3, 4, 5, 9]
    assert owned.tolist() == [[4, 5], [4, 5], [4, 5], [7, 0]]


@needs_kernel
def test_only_float32_models_with_plain_attention_prefill_by_rows() -> None:
    def limit(dtype: torch.dtype, windows: tuple = (None, None), **features: object) -> int:
        shape = AttentionShape(2, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, windows, **features)
        return make_backend("torch", shape, BLOCK_SIZE, torch.device("cpu"), dtype).prefill_rows_max_len

    assert limit(torch.float32) == PREFILL_ROWS_MAX_LEN
    assert limit(torch.bfloat16) == 0  # HF's bfloat16 SDPA rounds where the kernel does not
    assert limit(torch.float32, attention_sinks=True) == 0
    assert limit(torch.float32, logit_softcap=30.0) == 0
    assert limit(torch.float32, windows=(8, None)) == 0


def _step(chunks: list[tuple[int, int]], rng: np.random.Generator) -> tuple[StepInputs, int]:
    """(cached context, new tokens) per sequence; blocks drawn at random without repeats."""
    counts = [-(-(context + new) // BLOCK_SIZE) for context, new in chunks]
    free = rng.permutation(sum(counts) + 2).tolist()
    tables = [[free.pop() for _ in range(count)] for count in counts]
    positions = np.concatenate([np.arange(context, context + new) for context, new in chunks])
    owners = np.repeat(np.arange(len(chunks)), [new for _, new in chunks])
    slots = np.array([tables[seq][pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
                      for seq, pos in zip(owners, positions, strict=True)])
    width = max(counts)
    query_lens = [new for _, new in chunks]
    inputs = StepInputs(
        input_ids=np.zeros(len(positions), dtype=np.int64), positions=positions.astype(np.int64),
        slot_mapping=slots.astype(np.int64),
        query_start_loc=np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32),
        seq_lens=np.array([context + new for context, new in chunks], dtype=np.int32),
        block_tables=np.array([table + [0] * (width - len(table)) for table in tables], dtype=np.int32),
        logits_indices=np.arange(len(positions), dtype=np.int64), num_tokens=len(positions),
        max_query_len=max(query_lens), max_seq_len=max(context + new for context, new in chunks))
    return inputs, sum(counts) + 2


@needs_kernel
def test_prefill_rows_give_what_sdpa_groups_give() -> None:
    """Decodes, fresh prefills and prefills after cached context, one sequence past the limit."""
    chunks = [(0, 1), (40, 1), (0, 37), (21, 50), (0, 2), (300, PREFILL_ROWS_MAX_LEN - 300 + 40), (3, 1)]
    inputs, num_blocks = _step(chunks, np.random.default_rng(0))
    generator = torch.Generator().manual_seed(0)
    kv_cache = torch.randn(2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=generator)
    q = torch.randn(inputs.num_tokens, NUM_HEADS, HEAD_DIM, generator=generator)
    starts = inputs.query_start_loc
    prefill_rows = [row for seq, (_, new) in enumerate(chunks) if new > 1
                    for row in range(starts[seq], starts[seq + 1])]
    long_rows = list(range(starts[5], starts[6]))
    outs = []
    for max_len in (PREFILL_ROWS_MAX_LEN, 0):
        backend = TorchPagedAttention(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, HEAD_DIM**-0.5)
        backend.decode_kernel = load_decode_kernel()
        backend.prefill_rows_max_len = max_len
        metadata = backend.build_metadata(inputs, torch.device("cpu"))
        sdpa_rows = sorted(row for group in metadata.views[None].prefills for row in group.out_dst.tolist())
        # By rows, SDPA keeps only the sequence past the limit; without, every prefill row.
        assert sdpa_rows == (long_rows if max_len else prefill_rows)
        flat = kv_cache.view(2, -1, NUM_KV_HEADS, HEAD_DIM)
        k_rows, v_rows = flat[0][metadata.slot_mapping], flat[1][metadata.slot_mapping]
        outs.append(backend.forward(q, k_rows, v_rows, kv_cache, metadata, kv_written=True))
    torch.testing.assert_close(outs[0], outs[1], atol=2e-5, rtol=1e-5)


def _kernel_rows(chunks: list[tuple[int, int]], num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 seed: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """A step's rows as the kernel gets them (rows_as_sequences), with a random cache: kv, q, tables, lens."""
    inputs, num_blocks = _step(chunks, np.random.default_rng(seed))
    starts = inputs.query_start_loc
    _, lens, tables = rows_as_sequences(starts[:-1].astype(np.int64), np.diff(starts).astype(np.int64),
                                        inputs.seq_lens.astype(np.int64), inputs.block_tables)
    generator = torch.Generator().manual_seed(seed)
    kv_cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator).to(dtype)
    q = torch.randn(len(lens), NUM_HEADS, head_dim, generator=generator)
    return kv_cache, q, np.ascontiguousarray(tables), lens.astype(np.int32)


@needs_kernel
@pytest.mark.parametrize(("num_kv_heads", "head_dim", "dtype"), [
    (2, 32, torch.float32), (3, 64, torch.float32), (2, 128, torch.float32), (6, 40, torch.float32),
    (1, 64, torch.float32), (3, 64, torch.bfloat16)])
@pytest.mark.parametrize("features", [{}, {"softcap": 30.0, "sinks": True}])
def test_runs_of_prefill_rows_in_tiles_equal_row_by_row_bit_for_bit(num_kv_heads: int, head_dim: int,
                                                                    dtype: torch.dtype, features: dict) -> None:
    """Rows of one sequence in order (a run: the kernel takes them in tiles of rows) against the same rows
    in reverse order (no runs: one row at a time): the same bits. Runs of 1-20 rows (partial tiles), keys
    ending mid-block, context before the chunk, and decodes of other sequences in the same call."""
    chunks = [(0, 37), (0, 1), (21, 50), (40, 1), (0, 2), (5, 9), (130, 20), (3, 1), (0, 8)]
    kv_cache, q, tables, lens = _kernel_rows(chunks, num_kv_heads, head_dim, dtype, seed=head_dim)
    sinks = torch.randn(NUM_HEADS) if features.get("sinks") else None
    softcap = features.get("softcap", 0.0)
    kernel = load_decode_kernel()

    def attend(order: np.ndarray) -> torch.Tensor:
        out = kernel(q[order].contiguous(), kv_cache, torch.from_numpy(tables[order]),
                     torch.from_numpy(lens[order]), int(lens.max()), head_dim**-0.5, softcap=softcap, sinks=sinks)
        return out[np.argsort(order)]

    in_runs = attend(np.arange(len(lens)))
    assert torch.equal(in_runs, attend(np.arange(len(lens))[::-1].copy()))
    # And both are attention: against explicit float32 math on one row of the long run.
    row = 37 + 1 + 50 - 1  # the last row of the third chunk: position 70, keys 0..70
    block_ids = torch.from_numpy(tables[row][: -(-int(lens[row]) // BLOCK_SIZE)].astype(np.int64))
    keys, values = (kv_cache[i][block_ids].reshape(-1, num_kv_heads, head_dim)[: lens[row]].float() for i in (0, 1))
    scores = torch.einsum("hd,khd->hk", q[row],
                          keys.repeat_interleave(NUM_HEADS // num_kv_heads, dim=1)) * head_dim**-0.5
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if sinks is not None:
        weights = torch.softmax(torch.cat([scores, sinks[:, None]], dim=1), dim=1)[:, :-1]
    else:
        weights = torch.softmax(scores, dim=1)
    expected = torch.einsum("hk,khd->hd", weights, values.repeat_interleave(NUM_HEADS // num_kv_heads, dim=1))
    torch.testing.assert_close(in_runs[row], expected, atol=2e-5, rtol=1e-5)
