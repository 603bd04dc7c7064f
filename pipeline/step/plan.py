"""StepPlan: the Scheduler's message to TensorPrep for one step.

New sequences (first schedule, or resumed after preemption) travel in full; running ones as
diffs: the tokens sampled since they were last scheduled and the blocks added since then.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.request.image_input import ImageInput
from pipeline.request.sampling_params import SamplingParams

# The input id of a token still being sampled by the step before (pipeline/scheduling/lookahead.py);
# the device thread writes the real id over it just before the forward.
PLACEHOLDER_TOKEN = -1

@dataclass(slots=True)
class NewSequence:
    seq_id: int
    token_ids: list[int]  # prompt + outputs so far
    num_prompt_tokens: int
    block_ids: list[int]
    num_computed_tokens: int  # before this step (prefix-cache hits count as computed)
    params: SamplingParams
    seed: int
    choice_index: int
    stop_token_ids: tuple[int, ...]  # EOS (unless ignore_eos) + stop_token_ids: banned before min_tokens
    mirostat_mu: float | None = None  # the choice's mu so far (a preempted or resumed one); None = start at 2 tau
    lora_slot: int = -1  # device slot of the request's LoRA adapter; -1 = the base model
    images: tuple[ImageInput, ...] = ()  # the request's images (vision-language models)


@dataclass(slots=True)
class RunningSequence:
    seq_id: int
    new_token_ids: list[int]  # token ids from index token_start on (a placeholder's real value is sent again)
    new_block_ids: list[int]
    num_computed_tokens: int  # before this step
    mirostat_mu: float | None = None  # mu after the new tokens (mirostat choices); None = unchanged
    token_start: int | None = None  # index of new_token_ids[0] in the sequence; None = after the known ones
    # Speculative decoding: tokens drafted after the last one, computed (and sampled at) in this step
    # too; num_scheduled_tokens counts them. They are not part of the sequence until accepted.
    draft_token_ids: list[int] = field(default_factory=list)
    # index of new_block_ids[0] in the block table; None = after the blocks sent so far. (A verified
    # draft gives back the blocks only its rejected tokens used, so the table can shrink.)
    block_start: int | None = None


@dataclass(slots=True)
class StepPlan:
    step_id: int
    new_sequences: list[NewSequence] = field(default_factory=list)
    running_sequences: list[RunningSequence] = field(default_factory=list)
    # Batch order: seq_id -> tokens computed this step (running first, then new).
    num_scheduled_tokens: dict[int, int] = field(default_factory=dict)
    # Sequences gone since the last plan (finished, aborted, preempted): TensorPrep drops their rows.
    removed_seq_ids: list[int] = field(default_factory=list)
    # LoRA slot -> adapter id to copy into it before this step's forward.
    lora_loads: dict[int, int] = field(default_factory=dict)
    # Structured outputs: seq_id -> the allowed-token bitmask of its next token (int32 words as bytes,
    # bit t of word t // 32 = token t), for the sequences that sample in this step and have a grammar.
    token_bitmasks: dict[int, bytes] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens
