"""`sample_step`: a step's logits -> its StepResult (the sampled rows, then the prompt-logprob rows)."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.request.outputs import TokenLogprob
from pipeline.sampling.sampler import Sampler, compute_prompt_logprobs
from pipeline.step.prepared import PreparedStep
from pipeline.step.result import StepResult
from pipeline.step.sampling_batch import SamplerOutput


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
