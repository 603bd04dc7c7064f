"""DecoderPooling: a decoder family used as an embedder (Qwen3-Embedding, gte-Qwen2, e5-mistral).

Each prompt runs as chunked prefill through the runner's paged KV cache, with no decode and no
sampling: a step packs chunks of the waiting prompts under `max_num_batched_tokens`, and each
prompt's pooled state (pooler.PooledState) takes its rows chunk by chunk, so a prompt longer than a
step's budget pools exactly as it would in one piece. Prompts run in waves whose blocks fit the
cache; the cache holds nothing between waves (no prefix caching here).

Three prompts of 5, 2 and 9 tokens, budget 8: step 1 runs 5 + 2 + the first 1 of the third, step 2
the other 8 of it (positions 1..8, attending to position 0 in the cache).
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.loading.pooling_config import PoolingConfig
from pipeline.model.pooler import PooledState, finish
from pipeline.model.runner import ModelRunner
from pipeline.step.inputs import StepInputs

Chunk = tuple[int, int, int]  # (prompt index in the wave, first position, token count)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class DecoderPooling:
    def __init__(self, runner: ModelRunner, pooling: PoolingConfig, max_num_batched_tokens: int,
                 max_num_seqs: int) -> None:
        if runner.has_recurrent_state:  # its steps would need state slots, which only generation hands out
            raise ValueError(f"pooling is not supported for models with linear-attention layers "
                             f"({runner.info.architecture}): use --runner generate")
        self.runner, self.pooling = runner, pooling
        self.block_size = runner.block_size
        self.max_num_batched_tokens, self.max_num_seqs = max_num_batched_tokens, max_num_seqs
        self.hidden_size = runner.info.hidden_size
        self.vocab_size = runner.vocab_size
        # A prompt's blocks must fit the cache together.
        self.max_model_len = min(runner.max_model_len, runner.num_kv_blocks * self.block_size)

    def embed(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """One float32 vector [hidden_size] per prompt, in order."""
        vectors: list[torch.Tensor] = []
        for wave in self._waves(prompts):
            vectors.extend(self._run_wave(wave))
        return vectors

    def _waves(self, prompts: list[list[int]]) -> list[list[list[int]]]:
        waves: list[list[list[int]]] = []
        blocks_used = 0
        for prompt in prompts:
            if not 1 <= len(prompt) <= self.max_model_len:
                raise ValueError(f"a prompt of {len(prompt)} tokens cannot be pooled (1 to {self.max_model_len})")
            blocks = _cdiv(len(prompt), self.block_size)
            if not waves or blocks_used + blocks > self.runner.num_kv_blocks or len(waves[-1]) == self.max_num_seqs:
                waves.append([])
                blocks_used = 0
            waves[-1].append(prompt)
            blocks_used += blocks
        return waves

    def _run_wave(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        first_blocks = np.cumsum([0] + [_cdiv(len(p), self.block_size) for p in prompts])
        states = [PooledState(self.pooling.pooling_type) for _ in prompts]
        done = [0] * len(prompts)
        while any(done[i] < len(p) for i, p in enumerate(prompts)):
            chunks = self._next_chunks(prompts, done)
            hidden = self.runner.hidden_states(self._inputs(prompts, chunks, first_blocks))
            offset = 0
            for index, start, count in chunks:
                states[index].add(hidden[offset:offset + count], start)
                offset += count
                done[index] += count
        pooled = torch.stack([state.vector() for state in states])
        return list(finish(pooled, self.pooling).cpu())

    def _next_chunks(self, prompts: list[list[int]], done: list[int]) -> list[Chunk]:
        chunks: list[Chunk] = []
        budget = self.max_num_batched_tokens
        for index, prompt in enumerate(prompts):
            count = min(len(prompt) - done[index], budget)
            if count > 0:
                chunks.append((index, done[index], count))
                budget -= count
            if budget == 0:
                break
        return chunks

    def _inputs(self, prompts: list[list[int]], chunks: list[Chunk], first_blocks: np.ndarray) -> StepInputs:
        """The step's flat inputs: each chunk's tokens, positions and cache slots (its prompt's own blocks)."""
        width = max(_cdiv(start + count, self.block_size) for _, start, count in chunks)
        tables = np.zeros((len(chunks), width), dtype=np.int32)
        ids, positions, slots = [], [], []
        for row, (index, start, count) in enumerate(chunks):
            blocks = np.arange(first_blocks[index], first_blocks[index + 1], dtype=np.int64)
            tables[row, :min(len(blocks), width)] = blocks[:width]
            span = np.arange(start, start + count, dtype=np.int64)
            ids.append(np.asarray(prompts[index][start:start + count], dtype=np.int64))
            positions.append(span)
            slots.append(blocks[span // self.block_size] * self.block_size + span % self.block_size)
        counts = np.array([count for _, _, count in chunks], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        seq_lens = np.array([start + count for _, start, count in chunks], dtype=np.int32)
        return StepInputs(input_ids=np.concatenate(ids), positions=np.concatenate(positions),
                          slot_mapping=np.concatenate(slots), query_start_loc=starts, seq_lens=seq_lens,
                          block_tables=tables, logits_indices=(starts[1:] - 1).astype(np.int64),
                          num_tokens=int(starts[-1]), max_query_len=int(counts.max()),
                          max_seq_len=int(seq_lens.max()))
