"""StepInputs: what TensorPrep hands the GPU actor for one engine step (numpy, host memory).

The batch is a flat list of B scheduled sequences; sequence b contributes tokens
query_start_loc[b]:query_start_loc[b+1] of the flat token arrays. Worked example, three
sequences where the first is a 3-token prefill chunk starting at position 4 (4 tokens cached),
the other two decodes:

    query_start_loc = [0, 3, 4, 5]        query lengths [3, 1, 1]
    seq_lens        = [7, 10, 2]          tokens in the KV cache after this step, per sequence
    positions       = [4, 5, 6, 9, 1]
    logits_indices  = [2, 3, 4]           last token of each sequence that samples
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.request.image_input import ImageInput


@dataclass(frozen=True, slots=True)
class ImageSlice:
    """Placeholder tokens of one image computed this step: the image's embeddings
    [first, first + count) go to flat token rows [token_index, token_index + count).

    A chunk covering positions 10..19 of a sequence whose image sits at 4..15 (flat rows of the
    sequence starting at 30): first 6, count 6, token_index 30."""

    image: ImageInput
    first: int
    count: int
    token_index: int


@dataclass(slots=True)
class StepInputs:
    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64, absolute position of each token in its sequence
    slot_mapping: np.ndarray  # [T] int64, block_id * block_size + offset; -1 = padding, never written
    query_start_loc: np.ndarray  # [B + 1] int32, cumulative query lengths
    seq_lens: np.ndarray  # [B] int32, context + new tokens per sequence
    block_tables: np.ndarray  # [B, max_blocks_per_seq] int32, unused entries 0
    logits_indices: np.ndarray  # [R] int64, rows of the flat token axis whose logits are needed
    num_tokens: int  # T without graph padding
    max_query_len: int
    max_seq_len: int
    lora_slots: np.ndarray | None = None  # [T] int32 LoRA slot per token (-1 = base); None: no adapter this step
    lora_loads: dict[int, int] = field(default_factory=dict)  # slot -> adapter id to load before the forward
    images: list[ImageSlice] = field(default_factory=list)  # vision-language models: image placeholders this step
    # [B] int32: each sequence's slot in the runner's recurrent-state pool (its persistent-batch row), for
    # models with linear-attention layers (pipeline/model/layers/recurrent_state.py); None: no slots sent.
    state_slots: np.ndarray | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)
