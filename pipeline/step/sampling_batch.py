"""SamplingBatch / SamplerOutput: the sampler's input and output, one row per sampled token.

Rows are in the order of StepInputs.logits_indices minus prompt-logprob rows (see
tensor_prep). Every array has length R. Neutral values switch a processor off for that row.
The columns of Aphrodite's samplers travel in `advanced`, which is None when no row of the
step uses any of them: then the sampler runs exactly its classic path.
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
    seeds: np.ndarray  # [R] uint64, per-request seed (docs/design.md §5)
    choice_index: np.ndarray  # [R] int64
    output_position: np.ndarray  # [R] int64, index of the token being sampled among the choice's outputs
    num_logprobs: np.ndarray  # [R] int32; -1 = none, 0 = chosen token only, k = chosen + top-k
    # Penalty inputs: one array per row (None when no row needs penalties).
    prompt_token_ids: list[np.ndarray] | None
    output_token_ids: list[np.ndarray] | None
    # (row, token) pairs whose logit is set to -inf: EOS/stop tokens before min_tokens is reached.
    banned_rows: np.ndarray  # [K] int64
    banned_tokens: np.ndarray  # [K] int64
    advanced: AdvancedColumns | None = None
    # [R] bool, beam-search rows: stages 1-3 act on the model's log-probs, not renormalised after
    # (HF transformers' beam search order); None when no row is a beam.
    beam: np.ndarray | None = None
    # Structured outputs (stage 0): the rows with a grammar and their allowed-token bitmasks, [G] int64
    # and [G, ceil(V / 32)] int32 (bit t of word t // 32 = token t allowed); None when no row has one.
    bitmask_rows: np.ndarray | None = None
    bitmasks: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return len(self.temperature)


@dataclass(slots=True)
class AdvancedColumns:
    """Per-row values of the stages of docs/sampling.md beyond the classic ones; neutral = off.

    Random-row stages (4-12) hold neutral values on greedy rows. `dry_context` and the logit
    bias triples are ragged: one array per row, and (row, token, bias) for every bias."""

    top_a: np.ndarray  # [R] float32; 0 = off
    tfs: np.ndarray  # [R] float32; 1 = off
    eta_cutoff: np.ndarray  # [R] float32, units of 1e-4; 0 = off
    epsilon_cutoff: np.ndarray  # [R] float32, units of 1e-4; 0 = off
    typical_p: np.ndarray  # [R] float32; 1 = off
    xtc_threshold: np.ndarray  # [R] float32
    xtc_probability: np.ndarray  # [R] float32; 0 = off
    smoothing_factor: np.ndarray  # [R] float32; 0 = off
    smoothing_curve: np.ndarray  # [R] float32
    dynatemp_min: np.ndarray  # [R] float32; dynatemp off when min and max are 0
    dynatemp_max: np.ndarray  # [R] float32
    dynatemp_exponent: np.ndarray  # [R] float32
    mirostat: np.ndarray  # [R] bool; mirostat v2 on
    mirostat_tau: np.ndarray  # [R] float64
    mirostat_eta: np.ndarray  # [R] float64
    mirostat_mu: np.ndarray  # [R] float64, the choice's current mu (docs/design.md §4)
    dry_multiplier: np.ndarray  # [R] float32; 0 = off
    dry_base: np.ndarray  # [R] float64
    dry_allowed_length: np.ndarray  # [R] int64
    dry_sequence_breakers: list[tuple[str, ...]]  # per row
    dry_context: list[np.ndarray]  # per row: the last dry_range tokens of prompt + output (empty: no DRY)
    bias_rows: np.ndarray  # [B] int64
    bias_tokens: np.ndarray  # [B] int64
    bias_values: np.ndarray  # [B] float32
    repetition_penalty_range: np.ndarray  # [R] int64; 0 = the whole context (stage 2)
    repetition_penalty_slope: np.ndarray  # [R] float32; 1 = the whole window at full penalty


@dataclass(slots=True)
class SamplerOutput:
    token_ids: np.ndarray  # [R] int64
    # Logprob arrays are None when no row asked for logprobs; rows that did not ask hold junk.
    chosen_logprobs: np.ndarray | None = None  # [R] float32
    chosen_ranks: np.ndarray | None = None  # [R] int64, 1 = most likely
    top_token_ids: np.ndarray | None = None  # [R, K] int64, K = max num_logprobs, best first
    top_logprobs: np.ndarray | None = None  # [R, K] float32
    # Mirostat rows' mu after this token (NaN on other rows); None when no row uses mirostat.
    mirostat_mu: np.ndarray | None = None  # [R] float64
