"""Build sampler batches the way tensor prep does (SamplingParams -> PersistentBatch -> SamplingBatch),
and the matching inputs of the reference (tests/support/sampling_reference.py)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from pipeline.request.sampling_params import SamplingParams
from pipeline.sampling import rng
from pipeline.step.plan import NewSequence, StepPlan
from pipeline.step.sampling_batch import SamplingBatch
from pipeline.tensor_prep.persistent_batch import PersistentBatch
from tests.support.sampling_reference import Knobs, RowResult, reference_row


@dataclass
class Row:
    params: SamplingParams
    prompt: list[int]
    output: list[int]
    seed: int = 1
    choice_index: int = 0
    mirostat_mu: float | None = None
    stop_token_ids: tuple[int, ...] = ()  # EOS + stop_token_ids: banned while below min_tokens

    @property
    def output_position(self) -> int:
        return len(self.output)


def batch_of(rows: list[Row], gather: np.ndarray | None = None) -> SamplingBatch:
    """A SamplingBatch of `rows` (or of rows[gather[i]] for each i: repeats are cheap)."""
    max_len = max(len(row.prompt) + len(row.output) for row in rows) + 1
    persistent = PersistentBatch(len(rows), max_len, 16)
    plan = StepPlan(step_id=0)
    for seq_id, row in enumerate(rows):
        plan.new_sequences.append(NewSequence(
            seq_id, [*row.prompt, *row.output], len(row.prompt), [], 0, row.params, row.seed, row.choice_index,
            row.stop_token_ids, row.mirostat_mu))
    persistent.apply(plan)
    order = np.arange(len(rows)) if gather is None else np.asarray(gather, np.int64)
    return persistent.sampling_batch(np.asarray([persistent.row_of[i] for i in order], np.int64))


def knobs_of(params: SamplingParams) -> Knobs:
    names = {f.name for f in fields(Knobs)} - {"custom_token_bans", "logit_bias"}
    return Knobs(**{name: getattr(params, name) for name in names},
                 custom_token_bans=list(params.custom_token_bans), logit_bias=dict(params.logit_bias))


def reference_of(row: Row, logits: np.ndarray, is_breaker: np.ndarray | None = None) -> RowResult:
    """The reference's result for `row`, with the same counter-based uniforms as the sampler."""
    counters = (np.array([row.seed], np.uint64), np.array([row.choice_index]), np.array([row.output_position]))
    bans = list(row.stop_token_ids) if row.output_position < row.params.min_tokens else []
    return reference_row(logits, knobs_of(row.params), prompt=row.prompt, output=row.output, is_breaker=is_breaker,
                         min_tokens_bans=bans, uniform=float(rng.uniforms(*counters)[0]),
                         xtc_uniform=float(rng.uniforms(*counters, stream=rng.XTC_STREAM)[0]),
                         mu=row.mirostat_mu)
