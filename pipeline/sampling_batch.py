"""SamplingBatch / SamplerOutput: the sampler's input and output, one row per sampled token.

Rows are in the order of StepInputs.logits_indices minus prompt-logprob rows (see
tensor_prep). Every array has length R. Neutral values switch a processor off for that row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class SamplingBatch:
    temperature: np.ndarray  # [R] float32; 0 = greedy (argmax)
    top_p: np.ndarray  # [R] float32; 1 = off
    top_k: np.ndarray  # [R] int32; 0 = off
    min_p: np.ndarray  # [R] float32; 0 = off
    presence_penalty: np.ndarray  # [R] float32; 0 = off
    frequency_penalty: np.ndarray  # [R] float32; 0 = off
    repetition_penalty: np.ndarray  # [R] float32; 1 = off
    seeds: np.ndarray  # [R] uint64, per-request seed (DESIGN §5)
    choice_index: np.ndarray  # [R] int64
    output_position: np.ndarray  # [R] int64, index of the token being sampled among the choice's outputs
    num_logprobs: np.ndarray  # [R] int32; -1 = none, 0 = chosen token only, k = chosen + top-k
    # Penalty inputs: one array per row (None when no row needs penalties).
    prompt_token_ids: list[np.ndarray] | None
    output_token_ids: list[np.ndarray] | None
    # (row, token) pairs whose logit is set to -inf: EOS/stop tokens before min_tokens is reached.
    banned_rows: np.ndarray  # [K] int64
    banned_tokens: np.ndarray  # [K] int64

    @property
    def num_rows(self) -> int:
        return len(self.temperature)


@dataclass(slots=True)
class SamplerOutput:
    token_ids: np.ndarray  # [R] int64
    # Logprob arrays are None when no row asked for logprobs; rows that did not ask hold junk.
    chosen_logprobs: np.ndarray | None = None  # [R] float32
    chosen_ranks: np.ndarray | None = None  # [R] int64, 1 = most likely
    top_token_ids: np.ndarray | None = None  # [R, K] int64, K = max num_logprobs, best first
    top_logprobs: np.ndarray | None = None  # [R, K] float32
