"""PreparedStep: what tensor prep makes of a StepPlan, for the model and the sampler: the model
inputs, the sampling batch, which sequence each sampling row belongs to, the prompt-logprob rows,
and where the input ids still hold placeholders for tokens the previous step is sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.step.inputs import StepInputs
from pipeline.step.plan import StepPlan
from pipeline.step.sampling_batch import SamplingBatch

_NO_INDICES = np.zeros(0, np.int64)


@dataclass(slots=True)
class PromptLogprobSegment:
    """Prompt-logprob rows [row_start, row_start + count), counted after the sampling rows, score
    prompt tokens first_position + 1, first_position + 2, ..."""

    seq_id: int
    row_start: int
    count: int
    first_position: int
    num_logprobs: int  # alternatives per position


@dataclass(slots=True)
class PreparedStep:
    plan: StepPlan
    inputs: StepInputs
    sampling: SamplingBatch
    sample_seq_ids: list[int]  # sequence of each sampling row
    prompt_logprob_segments: list[PromptLogprobSegment]
    prompt_logprob_targets: np.ndarray  # [P] int64, token scored by each prompt-logprob row
    # Input ids still placeholders (pipeline/scheduling/lookahead.py): their flat indices and sequences.
    placeholder_indices: np.ndarray = field(default_factory=lambda: _NO_INDICES)
    placeholder_seq_ids: list[int] = field(default_factory=list)

    def fill_placeholders(self, sampled: dict[int, int]) -> None:
        """Write the tokens the previous step sampled (seq_id -> token) into the placeholders."""
        if not self.placeholder_seq_ids:
            return
        missing = [seq_id for seq_id in self.placeholder_seq_ids if seq_id not in sampled]
        if missing:
            raise RuntimeError(f"step {self.plan.step_id} was planned ahead for sequences {missing}, "
                               "which the step before it did not sample")
        self.inputs.input_ids[self.placeholder_indices] = [sampled[seq_id] for seq_id in self.placeholder_seq_ids]
