"""PersistentBatch: preallocated per-row state of the running sequences, patched by each StepPlan.

A row is taken when a sequence is (re)scheduled as new and given back when the plan says it
left (finished, aborted, preempted). Rows are reused, so steady-state steps allocate nothing
per sequence.
"""

from __future__ import annotations

import numpy as np

from pipeline.request.image_input import ImageInput
from pipeline.step.plan import NewSequence, StepPlan
from pipeline.step.sampling_batch import SamplingBatch
from pipeline.tensor_prep.advanced_rows import AdvancedRows
from pipeline.tensor_prep.sampling_rows import advanced_row_values, classic_row_values

_EMPTY = np.zeros(0, np.int64)
_INT32_MAX = int(np.iinfo(np.int32).max)


class PersistentBatch:
    def __init__(self, max_num_seqs: int, max_model_len: int, block_size: int) -> None:
        max_blocks = -(-max_model_len // block_size)
        self.token_ids = np.zeros((max_num_seqs, max_model_len), np.int32)
        self.block_table = np.zeros((max_num_seqs, max_blocks), np.int32)
        self.num_blocks = np.zeros(max_num_seqs, np.int32)
        self.num_tokens = np.zeros(max_num_seqs, np.int32)
        self.num_prompt_tokens = np.zeros(max_num_seqs, np.int32)
        self.num_computed = np.zeros(max_num_seqs, np.int32)
        self.temperature = np.zeros(max_num_seqs, np.float32)
        self.top_p = np.ones(max_num_seqs, np.float32)
        self.top_k = np.zeros(max_num_seqs, np.int32)
        self.min_p = np.zeros(max_num_seqs, np.float32)
        self.presence_penalty = np.zeros(max_num_seqs, np.float32)
        self.frequency_penalty = np.zeros(max_num_seqs, np.float32)
        self.repetition_penalty = np.ones(max_num_seqs, np.float32)
        self.seeds = np.zeros(max_num_seqs, np.uint64)
        self.choice_index = np.zeros(max_num_seqs, np.int64)
        self.num_logprobs = np.full(max_num_seqs, -1, np.int32)
        self.beam = np.zeros(max_num_seqs, np.bool_)
        self.prompt_logprobs = np.full(max_num_seqs, -1, np.int32)
        self.min_tokens = np.zeros(max_num_seqs, np.int32)
        self.lora_slot = np.full(max_num_seqs, -1, np.int32)
        self.stop_token_ids: list[np.ndarray] = [_EMPTY] * max_num_seqs
        self.custom_token_bans: list[np.ndarray] = [_EMPTY] * max_num_seqs
        self.has_custom_bans = np.zeros(max_num_seqs, np.bool_)
        self.advanced = AdvancedRows(max_num_seqs)
        self.images: list[tuple[ImageInput, ...]] = [()] * max_num_seqs
        self.has_images = np.zeros(max_num_seqs, np.bool_)
        self.row_of: dict[int, int] = {}
        self._free_rows = list(range(max_num_seqs - 1, -1, -1))

    def apply(self, plan: StepPlan) -> None:
        for seq_id in plan.removed_seq_ids:
            row = self.row_of.pop(seq_id, None)
            if row is not None:
                self._free_rows.append(row)
        for new in plan.new_sequences:
            self._add(new)
        for running in plan.running_sequences:
            row = self.row_of[running.seq_id]
            self._append_tokens(row, running.new_token_ids, running.token_start)
            if running.draft_token_ids:  # past the row's tokens: inputs of this step only
                end = self.num_tokens[row]
                self.token_ids[row, end:end + len(running.draft_token_ids)] = running.draft_token_ids
            self._append_blocks(row, running.new_block_ids, running.block_start)
            self.num_computed[row] = running.num_computed_tokens
            self.advanced.set_mirostat_mu(row, running.mirostat_mu)

    def _add(self, new: NewSequence) -> None:
        row = self._free_rows.pop()
        self.row_of[new.seq_id] = row
        self.num_tokens[row] = 0
        self.num_blocks[row] = 0
        self._append_tokens(row, new.token_ids)
        self._append_blocks(row, new.block_ids)
        self.num_prompt_tokens[row] = new.num_prompt_tokens
        self.num_computed[row] = new.num_computed_tokens
        values = classic_row_values(new.params)
        self.temperature[row] = values.temperature
        self.top_p[row] = values.top_p
        # Clipped, not rejected: any top_k >= vocab keeps every token and any min_tokens past
        # max_model_len bans EOS for the whole request, so int32's ceiling means the same thing.
        self.top_k[row] = min(values.top_k, _INT32_MAX)
        self.min_p[row] = values.min_p
        self.presence_penalty[row] = values.presence_penalty
        self.frequency_penalty[row] = values.frequency_penalty
        self.repetition_penalty[row] = values.repetition_penalty
        self.seeds[row] = new.seed
        self.choice_index[row] = new.choice_index
        self.num_logprobs[row] = values.num_logprobs
        self.beam[row] = new.params.use_beam_search
        if new.params.use_beam_search:  # a beam's best W + #stop-token continuations (pipeline/request/beam_search.py)
            self.num_logprobs[row] = max(values.num_logprobs, new.params.best_of + len(new.stop_token_ids))
        prompt_logprobs = new.params.prompt_logprobs
        self.prompt_logprobs[row] = -1 if prompt_logprobs is None else prompt_logprobs
        self.min_tokens[row] = min(new.params.min_tokens, _INT32_MAX)
        self.lora_slot[row] = new.lora_slot
        self.stop_token_ids[row] = np.asarray(new.stop_token_ids, np.int64)
        self.custom_token_bans[row] = np.asarray(new.params.custom_token_bans, np.int64)
        self.has_custom_bans[row] = len(new.params.custom_token_bans) > 0
        self.advanced.set(row, advanced_row_values(new.params), new.mirostat_mu)
        self.images[row] = new.images
        self.has_images[row] = len(new.images) > 0

    def _append_tokens(self, row: int, token_ids: list[int], start: int | None = None) -> None:
        start = self.num_tokens[row] if start is None else start
        self.token_ids[row, start:start + len(token_ids)] = token_ids
        self.num_tokens[row] = start + len(token_ids)

    def _append_blocks(self, row: int, block_ids: list[int], start: int | None = None) -> None:
        start = self.num_blocks[row] if start is None else start
        self.block_table[row, start:start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def sampling_batch(self, rows: np.ndarray, contexts: np.ndarray | None = None) -> SamplingBatch:
        """Sampling rows for batch rows `rows`; `contexts[i]`: the tokens sampling row i sees (its
        row's tokens by default; a row verifying a draft repeats, seeing one more draft token each time)."""
        contexts = self.num_tokens[rows] if contexts is None else contexts
        output_position = (contexts - self.num_prompt_tokens[rows]).astype(np.int64)
        banned_rows, banned_tokens = self._bans(rows, output_position)
        prompt_ids, output_ids = self._penalty_inputs(rows, contexts)
        return SamplingBatch(
            temperature=self.temperature[rows],
            top_p=self.top_p[rows],
            top_k=self.top_k[rows],
            min_p=self.min_p[rows],
            presence_penalty=self.presence_penalty[rows],
            frequency_penalty=self.frequency_penalty[rows],
            repetition_penalty=self.repetition_penalty[rows],
            seeds=self.seeds[rows],
            choice_index=self.choice_index[rows],
            output_position=output_position,
            num_logprobs=self.num_logprobs[rows],
            prompt_token_ids=prompt_ids,
            output_token_ids=output_ids,
            banned_rows=banned_rows,
            banned_tokens=banned_tokens,
            advanced=self.advanced.batch_columns(rows, self.token_ids, contexts),
            beam=self.beam[rows] if self.beam[rows].any() else None,
        )

    def _bans(self, rows: np.ndarray, output_position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, token) pairs to mask: custom_token_bans, and EOS/stop tokens of rows still below
        min_tokens. Rows [0, 1] with bans [[7], []], row 1 below min_tokens with stops [2, 3]
        -> rows [0, 1, 1], tokens [7, 2, 3]."""
        below = output_position < self.min_tokens[rows]
        banning = np.flatnonzero(below | self.has_custom_bans[rows])
        if len(banning) == 0:
            return _EMPTY, _EMPTY
        per_row = [(self.custom_token_bans[rows[i]], self.stop_token_ids[rows[i]] if below[i] else _EMPTY)
                   for i in banning]
        counts = [len(bans) + len(stops) for bans, stops in per_row]
        banned_rows = np.repeat(banning, counts).astype(np.int64)
        return banned_rows, np.concatenate([ids for pair in per_row for ids in pair]).astype(np.int64)

    def _penalty_inputs(self, rows: np.ndarray, contexts: np.ndarray,
                        ) -> tuple[list[np.ndarray] | None, list[np.ndarray] | None]:
        penalized = ((self.presence_penalty[rows] != 0) | (self.frequency_penalty[rows] != 0)
                     | (self.repetition_penalty[rows] != 1))
        if not penalized.any():
            return None, None
        prompt_ids, output_ids = [], []
        for row, wanted, num_tokens in zip(rows, penalized, contexts, strict=True):
            if not wanted:
                prompt_ids.append(_EMPTY)
                output_ids.append(_EMPTY)
                continue
            num_prompt = self.num_prompt_tokens[row]
            prompt_ids.append(self.token_ids[row, :num_prompt].astype(np.int64))
            output_ids.append(self.token_ids[row, num_prompt:num_tokens].astype(np.int64))
        return prompt_ids, output_ids
