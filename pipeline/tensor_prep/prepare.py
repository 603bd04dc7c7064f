"""TensorPrep: StepPlan -> StepInputs + SamplingBatch, vectorized over a persistent batch.

Every running sequence owns a row of preallocated arrays (its token ids, block table and
sampling parameters). A plan only patches rows (new rows in full, running rows by diff), and
the flat per-token arrays of the step are then built with numpy gathers, no loop over tokens.
"""

from __future__ import annotations

import numpy as np

from pipeline.request.image_input import overlapping
from pipeline.step.inputs import ImageSlice, StepInputs
from pipeline.step.plan import PLACEHOLDER_TOKEN, StepPlan
from pipeline.step.prepared import PreparedStep, PromptLogprobSegment
from pipeline.tensor_prep.persistent_batch import PersistentBatch

_NO_INDICES = np.zeros(0, np.int64)


class TensorPrep:
    def __init__(self, max_num_seqs: int, max_model_len: int, block_size: int) -> None:
        self.block_size = block_size
        self.batch = PersistentBatch(max_num_seqs, max_model_len, block_size)

    def prepare(self, plan: StepPlan) -> PreparedStep:
        batch = self.batch
        batch.apply(plan)
        row_of = batch.row_of
        rows = np.fromiter((row_of[s] for s in plan.num_scheduled_tokens), np.int64,
                           len(plan.num_scheduled_tokens))
        num_scheduled = np.fromiter(plan.num_scheduled_tokens.values(), np.int64, len(rows))
        # A sequence samples when this step computes its last known token; one verifying a draft
        # (computed past its tokens) samples after its last token and after each draft token too.
        num_tokens = batch.num_tokens[rows].astype(np.int64)
        reach = batch.num_computed[rows] + num_scheduled
        num_samples = np.where(reach >= num_tokens, reach - num_tokens + 1, 0)
        # The common decode step: one token each, each sampled once. Repeats by counts of 1 are then
        # the arrays themselves and offsets within a group are 0, so the gathers below are skipped.
        ones = bool((num_scheduled == 1).all() and (num_samples == 1).all())
        inputs = self._build_inputs(rows, num_scheduled, num_samples, ones)
        inputs.lora_loads = plan.lora_loads
        # sample j of a row sees its tokens and j draft tokens: [2 samples at 7 tokens, 1 at 5] -> [7, 8, 5]
        sample_rows = rows if ones else rows.repeat(num_samples)
        contexts = num_tokens if ones else num_tokens.repeat(num_samples) + _offsets_within(num_samples)
        segments, targets = self._prompt_logprob_rows(plan, rows, num_scheduled, inputs)
        batch.num_computed[rows] = inputs.seq_lens
        seq_ids = list(plan.num_scheduled_tokens)
        placeholders = (inputs.input_ids == PLACEHOLDER_TOKEN).nonzero()[0]
        # flat token index -> its sequence: query_start_loc [0, 2, 7], index 5 -> sequence 1
        placeholder_seqs = inputs.query_start_loc.searchsorted(placeholders, side="right") - 1
        sample_seq_ids = seq_ids if ones else [seq_ids[i] for i in np.arange(len(rows)).repeat(num_samples)]
        sampling = batch.sampling_batch(sample_rows, contexts)
        if plan.token_bitmasks:
            sampling.bitmask_rows, sampling.bitmasks = _bitmasks(plan.token_bitmasks, sample_seq_ids)
        if not ones and (num_samples > 1).any():
            _split_verifying_queries(inputs, num_scheduled, num_samples)
        return PreparedStep(
            plan=plan,
            inputs=inputs,
            sampling=sampling,
            sample_seq_ids=sample_seq_ids,
            prompt_logprob_segments=segments,
            prompt_logprob_targets=targets,
            placeholder_indices=placeholders,
            placeholder_seq_ids=[seq_ids[i] for i in placeholder_seqs],
        )

    def _build_inputs(self, rows: np.ndarray, num_scheduled: np.ndarray, num_samples: np.ndarray,
                      ones: bool) -> StepInputs:
        """`ones`: every sequence computes one token and samples once (no repeats needed)."""
        batch, block_size = self.batch, self.block_size
        # num_scheduled [2, 5, 3] -> query_start_loc [0, 2, 7, 10]
        query_start_loc = np.zeros(len(rows) + 1, np.int32)
        num_scheduled.cumsum(out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        num_computed = batch.num_computed[rows]
        if ones:
            token_rows, positions = rows, num_computed.astype(np.int64)
            token_lora_slots = batch.lora_slot[rows]
            logits_indices = np.arange(num_tokens, dtype=np.int64)
        else:
            # token -> its row: [0, 0, 1, 1, 1, 1, 1, 2, 2, 2]; offset in chunk: [0, 1, 0, 1, 2, 3, 4, 0, 1, 2]
            token_rows = rows.repeat(num_scheduled)
            offsets = np.arange(num_tokens) - query_start_loc[:-1].repeat(num_scheduled)
            positions = num_computed.repeat(num_scheduled) + offsets
            # [slot 1 row, base row, slot 0 row] with lengths [2, 1, 3] -> [1, 1, -1, 0, 0, 0]
            token_lora_slots = batch.lora_slot[rows].repeat(num_scheduled)
            # the last num_samples tokens of each chunk: chunk ends [2, 7, 10], samples [1, 0, 2] -> [1, 8, 9]
            logits_indices = ((query_start_loc[1:] - num_samples).repeat(num_samples)
                              + _offsets_within(num_samples)).astype(np.int64)
        block_ids = batch.block_table[token_rows, positions // block_size]
        seq_lens = (num_computed + num_scheduled).astype(np.int32)
        max_seq_len = int(seq_lens.max())
        max_blocks = -(-max_seq_len // block_size)
        images = self._image_slices(rows, num_computed, num_scheduled, query_start_loc)
        return StepInputs(
            input_ids=batch.token_ids[token_rows, positions].astype(np.int64),
            positions=positions,
            slot_mapping=block_ids.astype(np.int64) * block_size + positions % block_size,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_tables=batch.block_table[rows, :max_blocks],
            logits_indices=logits_indices,
            num_tokens=num_tokens,
            max_query_len=int(num_scheduled.max()),
            max_seq_len=max_seq_len,
            lora_slots=token_lora_slots if (token_lora_slots >= 0).any() else None,
            images=images,
            state_slots=rows.astype(np.int32),  # a row is its sequence's state slot while it runs
        )

    def _image_slices(self, rows: np.ndarray, num_computed: np.ndarray, num_scheduled: np.ndarray,
                      query_start_loc: np.ndarray) -> list[ImageSlice]:
        """The image placeholders each scheduled chunk covers (a loop over image rows only)."""
        slices = []
        for i in self.batch.has_images[rows].nonzero()[0]:
            start, end = int(num_computed[i]), int(num_computed[i] + num_scheduled[i])
            for image in overlapping(self.batch.images[rows[i]], start, end):
                first, last = max(start, image.offset), min(end, image.end)
                slices.append(ImageSlice(image, first - image.offset, last - first,
                                         int(query_start_loc[i]) + first - start))
        return slices

    def _prompt_logprob_rows(self, plan: StepPlan, rows: np.ndarray, num_scheduled: np.ndarray,
                             inputs: StepInputs) -> tuple[list[PromptLogprobSegment], np.ndarray]:
        """Append logits rows for prompt positions of sequences that asked for prompt logprobs.
        Position p's logits score prompt token p + 1, so the last prompt position scores nothing."""
        batch = self.batch
        wanted = (batch.prompt_logprobs[rows] >= 0).nonzero()[0]
        segments: list[PromptLogprobSegment] = []
        extra_indices: list[np.ndarray] = []
        targets: list[np.ndarray] = []
        next_row = 0
        seq_ids = list(plan.num_scheduled_tokens)
        for i in wanted:
            row, start = rows[i], int(inputs.positions[inputs.query_start_loc[i]])
            end = min(start + int(num_scheduled[i]), int(batch.num_prompt_tokens[row]) - 1)
            if end <= start:
                continue
            count = end - start
            extra_indices.append(np.arange(count) + inputs.query_start_loc[i])
            targets.append(batch.token_ids[row, start + 1:end + 1].astype(np.int64))
            segments.append(PromptLogprobSegment(seq_ids[i], next_row, count, start, int(batch.prompt_logprobs[row])))
            next_row += count
        if segments:
            inputs.logits_indices = np.concatenate([inputs.logits_indices, *extra_indices]).astype(np.int64)
            return segments, np.concatenate(targets)
        return segments, np.zeros(0, np.int64)


def _split_verifying_queries(inputs: StepInputs, num_scheduled: np.ndarray, num_samples: np.ndarray) -> None:
    """Attention sees a sequence verifying a draft (1 + k query tokens, each sampled) as 1 + k
    one-token queries over the same block table, query j seeing the keys up to its own position:
    the same causal attention, but decode-shaped, so the step keeps the decode kernels (and CUDA
    graphs) instead of the prefill path. Every layer writes all of a step's keys before attending.
    Done last: the rest of tensor prep indexes these arrays by scheduled sequence.
    Example: num_scheduled [1, 3], seq_lens [9, 12] -> query_start_loc [0, 1, 2, 3, 4], seq_lens [9, 10, 11, 12]."""
    split = (num_samples > 1) & (num_samples == num_scheduled)
    pieces = np.where(split, num_scheduled, 1)
    owner = np.repeat(np.arange(len(num_scheduled)), pieces)
    offsets = _offsets_within(pieces)
    query_lens = np.where(split[owner], 1, num_scheduled[owner])
    first_len = inputs.seq_lens[owner] - num_scheduled[owner] + 1
    inputs.seq_lens = np.where(split[owner], first_len + offsets, inputs.seq_lens[owner]).astype(np.int32)
    inputs.block_tables = inputs.block_tables[owner]
    inputs.query_start_loc = np.zeros(len(owner) + 1, np.int32)
    np.cumsum(query_lens, out=inputs.query_start_loc[1:])
    inputs.max_query_len = int(query_lens.max())


def _offsets_within(counts: np.ndarray) -> np.ndarray:
    """Each item's index within its group: counts [2, 0, 3] -> [0, 1, 0, 1, 2]."""
    total = int(counts.sum())
    return np.arange(total) - (counts.cumsum() - counts).repeat(counts)


def _bitmasks(token_bitmasks: dict[int, bytes], sample_seq_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The sampling rows whose sequence sent a grammar bitmask, and those masks stacked in row order."""
    rows = [row for row, seq_id in enumerate(sample_seq_ids) if seq_id in token_bitmasks]
    masks = [np.frombuffer(token_bitmasks[sample_seq_ids[row]], np.int32) for row in rows]
    return np.asarray(rows, np.int64), np.stack(masks)
