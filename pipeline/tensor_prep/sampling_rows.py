"""A request's values for the sampler's per-row columns (tensor prep copies them into its rows).

Neutral values switch a stage off for a row. Greedy rows skip stages 4-12 of docs/sampling.md (each
keeps the top token, and XTC does not apply to them), so their values for those stages are
neutral and such a row costs those stages nothing.
"""

from __future__ import annotations

from typing import NamedTuple

from pipeline.request.sampling_params import SamplingParams


class SamplingRowValues(NamedTuple):
    """One request's values for the classic SamplingBatch columns."""

    temperature: float  # 0 = greedy; 1 for dynatemp rows (the stage computes T itself)
    top_p: float  # 1 = off
    top_k: int  # 0 = off
    min_p: float  # 0 = off
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    num_logprobs: int  # -1 = none


class AdvancedRowValues(NamedTuple):
    """One request's values for the columns of Aphrodite's samplers (SamplingBatch.advanced)."""

    top_a: float = 0.0
    tfs: float = 1.0
    eta_cutoff: float = 0.0
    epsilon_cutoff: float = 0.0
    typical_p: float = 1.0
    xtc_threshold: float = 0.1
    xtc_probability: float = 0.0
    smoothing_factor: float = 0.0
    smoothing_curve: float = 1.0
    dynatemp_min: float = 0.0
    dynatemp_max: float = 0.0
    dynatemp_exponent: float = 1.0
    mirostat: bool = False
    mirostat_tau: float = 0.0
    mirostat_eta: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_range: int = 0
    dry_sequence_breakers: tuple[str, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    repetition_penalty_range: int = 0  # 0 = the whole context
    repetition_penalty_slope: float = 1.0


NEUTRAL_ADVANCED = AdvancedRowValues()


def classic_row_values(params: SamplingParams) -> SamplingRowValues:
    greedy = params.is_greedy
    temperature = 0.0 if greedy else (1.0 if params.uses_dynatemp else params.temperature)
    return SamplingRowValues(
        temperature=temperature,
        top_p=1.0 if greedy else params.top_p,
        top_k=0 if greedy else max(params.top_k, 0),  # the batch column's off is 0
        min_p=0.0 if greedy else params.min_p,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        num_logprobs=_num_logprobs(params),
    )


def advanced_row_values(params: SamplingParams) -> AdvancedRowValues | None:
    """None when the request uses none of these samplers: then its rows keep the sampler's fast path."""
    dry = params.dry_multiplier > 0
    values = AdvancedRowValues(
        dry_multiplier=params.dry_multiplier,
        dry_base=params.dry_base if dry else NEUTRAL_ADVANCED.dry_base,
        dry_allowed_length=params.dry_allowed_length if dry else NEUTRAL_ADVANCED.dry_allowed_length,
        dry_range=params.dry_range if dry else 0,
        dry_sequence_breakers=params.dry_sequence_breakers if dry else (),
        logit_bias=params.logit_bias,
        **_repetition_window(params),
    )
    if not params.is_greedy:
        values = values._replace(**_random_row_values(params))
    return None if values == NEUTRAL_ADVANCED else values


def _repetition_window(params: SamplingParams) -> dict[str, float]:
    """A repetition window (stage 2) only matters where the penalty is on; off, it stays neutral."""
    if params.repetition_penalty == 1 or params.repetition_penalty_range == 0:
        return {}
    return {"repetition_penalty_range": params.repetition_penalty_range,
            "repetition_penalty_slope": params.repetition_penalty_slope}


def _random_row_values(params: SamplingParams) -> dict[str, float | bool]:
    """Stages 4-12, which only random rows run; a stage switched off keeps its neutral values."""
    values: dict[str, float | bool] = {"top_a": params.top_a, "tfs": params.tfs, "eta_cutoff": params.eta_cutoff,
                                       "epsilon_cutoff": params.epsilon_cutoff, "typical_p": params.typical_p,
                                       "smoothing_factor": params.smoothing_factor}
    if params.xtc_probability > 0:
        values.update(xtc_threshold=params.xtc_threshold, xtc_probability=params.xtc_probability)
    if params.smoothing_factor > 0:
        values["smoothing_curve"] = params.smoothing_curve
    if params.uses_dynatemp:
        values.update(dynatemp_min=params.dynatemp_min, dynatemp_max=params.dynatemp_max,
                      dynatemp_exponent=params.dynatemp_exponent)
    if params.uses_mirostat:
        values.update(mirostat=True, mirostat_tau=params.mirostat_tau, mirostat_eta=params.mirostat_eta)
    return values


def _num_logprobs(params: SamplingParams) -> int:
    """best_of > n ranks choices by cumulative logprob, so it needs the chosen token's logprob (0).
    (A beam needs more; the persistent batch adds them, as they depend on the model's EOS ids.)"""
    if params.logprobs is not None:
        return params.logprobs
    return 0 if params.ranks_choices else -1
