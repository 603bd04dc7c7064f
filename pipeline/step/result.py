"""StepResult: what the Sampling stage sends the Scheduler after a step (plain data, no tensors).

`sample_step` turns a step's logits into it: sampled token ids per sequence, their logprobs
when asked, and the prompt logprobs computed in this step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.request.outputs import TokenLogprob
from pipeline.sampling.sampler import Sampler, compute_prompt_logprobs
from pipeline.step.sampling_batch import SamplerOutput
from pipeline.tensor_prep.prepare import PreparedStep


@dataclass(slots=True)
class StepResult:
    step_id: int
    seq_ids: list[int]  # sequences that sampled, in row order
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]  # per row; None where the sequence asked for none
    # seq_id -> entries for the prompt positions scored this step (in prompt order)
    prompt_logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    # seq_id -> mirostat's mu after this step's token, for the choices that use mirostat
    mirostat_mu: dict[int, float] = field(default_factory=dict)


def sample_step(sampler: Sampler, prepared: PreparedStep, logits: torch.Tensor) -> StepResult:
    num_rows = len(prepared.sample_seq_ids)
    sampled = sampler(logits[:num_rows], prepared.sampling)
    token_ids = sampled.token_ids.tolist()
    num_logprobs = prepared.sampling.num_logprobs.tolist()
    logprobs = [_row_logprob(sampled, row, k) for row, k in enumerate(num_logprobs)]
    return StepResult(
        step_id=prepared.plan.step_id,
        seq_ids=list(prepared.sample_seq_ids),
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_logprobs=_prompt_logprobs(prepared, logits[num_rows:]),
        mirostat_mu=_mirostat_mu(prepared, sampled),
    )


def _mirostat_mu(prepared: PreparedStep, sampled: SamplerOutput) -> dict[int, float]:
    if sampled.mirostat_mu is None:
        return {}
    return {prepared.sample_seq_ids[row]: float(sampled.mirostat_mu[row])
            for row in np.flatnonzero(~np.isnan(sampled.mirostat_mu))}


def _row_logprob(sampled: SamplerOutput, row: int, num_logprobs: int) -> TokenLogprob | None:
    if num_logprobs < 0 or sampled.chosen_logprobs is None:
        return None
    top: list[tuple[int, float]] = []
    if num_logprobs and sampled.top_token_ids is not None:
        top = list(zip(sampled.top_token_ids[row, :num_logprobs].tolist(),
                       sampled.top_logprobs[row, :num_logprobs].tolist(), strict=True))
    return TokenLogprob(int(sampled.token_ids[row]), float(sampled.chosen_logprobs[row]),
                        int(sampled.chosen_ranks[row]), top)


def _prompt_logprobs(prepared: PreparedStep, logits: torch.Tensor) -> dict[int, list[TokenLogprob]]:
    segments = prepared.prompt_logprob_segments
    if not segments:
        return {}
    max_k = max(segment.num_logprobs for segment in segments)
    targets = prepared.prompt_logprob_targets
    chosen, ranks, top_ids, top_logprobs = compute_prompt_logprobs(logits, targets, max_k)
    result = {}
    for segment in segments:
        k = segment.num_logprobs
        rows = range(segment.row_start, segment.row_start + segment.count)
        result[segment.seq_id] = [
            TokenLogprob(int(targets[r]), float(chosen[r]), int(ranks[r]),
                         list(zip(top_ids[r, :k].tolist(), top_logprobs[r, :k].tolist(), strict=True)))
            for r in rows
        ]
    return result
