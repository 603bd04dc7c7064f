"""Sampler: logits -> tokens (+ logprobs, + mirostat's mu), one row per sampled token, vectorized over rows.

The chain is docs/sampling.md's, in its order: the grammar mask -> bans and logit bias -> penalties -> DRY -> top-p,
min-p, top-a, top-k -> tfs -> eta -> epsilon -> typical -> XTC -> smoothing -> temperature /
dynatemp -> mirostat. Each stage runs only on the rows that use it, and only when some row does,
so a step in which every row keeps to the classic knobs runs exactly the classic path. Greedy
rows (temperature 0, no dynatemp) skip stages 4-12 and take the argmax (lowest id on ties).

Randomness (docs/design.md §5): a random row uses exactly one uniform u = rng.uniforms(seed, choice,
position) and takes the first token, in token-id order, whose float64 cumulative probability
exceeds u * total; XTC's coin is a uniform of its own stream. Every operation is row-wise, so a
row's token, logprobs and mu do not depend on the rest of the batch.

Returned logprobs are log_softmax of the processed logits ("processed_logprobs", Aphrodite's
meaning: for greedy rows after stages 1-3), or of the model's logits ("raw_logprobs").
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.config import LOGPROBS_MODES
from pipeline.host_to_device import to_device
from pipeline.request.sampling_params import GREEDY_TEMPERATURE
from pipeline.sampling import rng
from pipeline.sampling.dry import SequenceBreakers, dry_penalties
from pipeline.sampling.grammar_mask import apply_token_bitmasks
from pipeline.sampling.logit_penalties import apply_bans, apply_logit_bias, apply_penalties, needs_penalties
from pipeline.sampling.reshaping import (
    apply_mirostat,
    apply_smoothing,
    apply_xtc,
    dynamic_temperatures,
    mirostat_update,
)
from pipeline.sampling.row_ops import column, on_rows
from pipeline.sampling.token_choice import argmax_rows, compute_prompt_logprobs, sample_inverse_cdf, top_logprobs
from pipeline.sampling.truncation import apply_epsilon, apply_eta, apply_tfs, apply_top_p_k_min_a, apply_typical
from pipeline.step.sampling_batch import AdvancedColumns, SamplerOutput, SamplingBatch

__all__ = ["Sampler", "compute_prompt_logprobs"]


class Sampler:
    """Turns [R, V] logits and a SamplingBatch into a SamplerOutput (numpy, host memory)."""

    def __init__(self, vocab_size: int, *, logprobs_mode: str = "processed_logprobs",
                 breakers: SequenceBreakers | None = None) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        self.vocab_size = vocab_size
        self.logprobs_mode = logprobs_mode
        self.breakers = breakers or SequenceBreakers(None, vocab_size)

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        logits = self._trim(logits)
        if self._is_plain_greedy(batch):
            return SamplerOutput(token_ids=argmax_rows(logits).cpu().numpy().astype(np.int64))
        processed = self.process_logits(logits, batch)
        token_ids = self._choose_tokens(processed, batch)
        output = SamplerOutput(token_ids=token_ids.cpu().numpy().astype(np.int64))
        if batch.advanced is not None and batch.advanced.mirostat.any():
            output.mirostat_mu = self._next_mirostat_mu(processed, token_ids, batch.advanced)
        if (batch.num_logprobs >= 0).any():
            scored = processed if self.logprobs_mode == "processed_logprobs" else logits.float()
            if batch.beam is not None and self.logprobs_mode != "processed_logprobs":
                beam_rows = torch.from_numpy(np.flatnonzero(batch.beam)).to(processed.device)
                scored = scored.clone()
                scored[beam_rows] = processed[beam_rows]  # beams rank by the processed scores in every mode
            self._fill_logprobs(output, scored, token_ids, batch)
        return output

    def process_logits(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Stages 0-12 of docs/sampling.md; a new float32 tensor (the caller's is never written)."""
        logits = self._trim(logits).float()
        advanced = batch.advanced
        if (advanced is not None or len(batch.banned_rows) > 0 or batch.beam is not None
                or batch.bitmask_rows is not None):
            logits = logits.clone()  # the stages below write in place
        if batch.bitmask_rows is not None:
            logits = apply_token_bitmasks(logits, batch.bitmask_rows, batch.bitmasks)
        if batch.beam is not None:
            logits = on_rows(logits, np.flatnonzero(batch.beam), lambda sub, rows: torch.log_softmax(sub, dim=-1))
        if advanced is not None and len(advanced.bias_rows) > 0:
            logits = apply_logit_bias(logits, advanced)
        if len(batch.banned_rows) > 0:
            logits = apply_bans(logits, batch.banned_rows, batch.banned_tokens)
        if needs_penalties(batch):
            logits = apply_penalties(logits, batch)
        if advanced is not None and (advanced.dry_multiplier > 0).any():
            logits = self._apply_dry(logits, advanced)
        if self._needs_truncation(batch):
            top_a = advanced.top_a if advanced is not None else None
            logits = apply_top_p_k_min_a(logits, batch.top_p, batch.top_k, batch.min_p, top_a)
        if advanced is not None:
            logits = _apply_stages_5_to_10(logits, batch, advanced)
        logits = _apply_temperature(logits, batch)
        if advanced is not None:
            mirostat = advanced.mirostat
            logits = on_rows(logits, np.flatnonzero(mirostat),
                             lambda sub, rows: apply_mirostat(sub, advanced.mirostat_mu[rows]))
        return logits

    def _trim(self, logits: torch.Tensor) -> torch.Tensor:
        # lm_heads are often padded past the tokenizer's vocabulary; those ids must never win.
        if logits.ndim != 2 or logits.shape[1] < self.vocab_size:
            raise ValueError(f"logits must be [R, >= {self.vocab_size}], got {tuple(logits.shape)}")
        return logits[:, : self.vocab_size]

    def _is_plain_greedy(self, batch: SamplingBatch) -> bool:
        return bool(batch.advanced is None and (batch.temperature == 0).all() and len(batch.banned_rows) == 0
                    and not needs_penalties(batch) and (batch.num_logprobs < 0).all() and batch.bitmask_rows is None)

    def _needs_truncation(self, batch: SamplingBatch) -> bool:
        top_k_active = (batch.top_k > 0) & (batch.top_k < self.vocab_size)
        top_a_active = batch.advanced is not None and (batch.advanced.top_a > 0).any()
        return bool((batch.top_p < 1).any() or (batch.min_p > 0).any() or top_k_active.any() or top_a_active)

    def _apply_dry(self, logits: torch.Tensor, advanced: AdvancedColumns) -> torch.Tensor:
        dry_rows = np.flatnonzero(advanced.dry_multiplier > 0)
        rows, tokens, penalties = dry_penalties(
            [advanced.dry_context[row] for row in dry_rows],
            [self.breakers.mask(advanced.dry_sequence_breakers[row]) for row in dry_rows],
            advanced.dry_multiplier[dry_rows].astype(np.float64), advanced.dry_base[dry_rows],
            advanced.dry_allowed_length[dry_rows])
        if len(rows) > 0:
            device = logits.device
            batch_rows = to_device(dry_rows[rows], device)
            logits[batch_rows, to_device(tokens, device)] -= to_device(penalties, device, torch.float32)
        return logits

    def _choose_tokens(self, processed: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        device = processed.device
        token_ids = torch.empty(processed.shape[0], dtype=torch.int64, device=device)
        greedy_np = batch.temperature == 0
        greedy_rows = to_device(np.flatnonzero(greedy_np), device)
        random_rows_np = np.flatnonzero(~greedy_np)
        random_rows = to_device(random_rows_np, device)
        if len(greedy_rows) > 0:
            token_ids[greedy_rows] = argmax_rows(processed[greedy_rows])
        if len(random_rows_np) > 0:
            uniforms_np = rng.uniforms(batch.seeds[random_rows_np], batch.choice_index[random_rows_np],
                                       batch.output_position[random_rows_np])
            uniforms = to_device(uniforms_np, device)
            token_ids[random_rows] = sample_inverse_cdf(processed[random_rows], uniforms)
        return token_ids

    def _next_mirostat_mu(self, processed: torch.Tensor, token_ids: torch.Tensor,
                          advanced: AdvancedColumns) -> np.ndarray:
        next_mu = np.full(processed.shape[0], np.nan)
        rows_np = np.flatnonzero(advanced.mirostat)
        rows = torch.from_numpy(rows_np).to(processed.device)
        next_mu[rows_np] = mirostat_update(processed[rows], token_ids[rows], advanced.mirostat_mu[rows_np],
                                           advanced.mirostat_tau[rows_np], advanced.mirostat_eta[rows_np])
        return next_mu

    def _fill_logprobs(self, output: SamplerOutput, scored: torch.Tensor, token_ids: torch.Tensor,
                       batch: SamplingBatch) -> None:
        num_rows = scored.shape[0]
        num_alternatives = min(int(batch.num_logprobs.max()), self.vocab_size)
        rows_np = np.flatnonzero(batch.num_logprobs >= 0)
        rows = torch.from_numpy(rows_np).to(scored.device)
        logprobs = torch.log_softmax(scored[rows], dim=-1)
        if batch.beam is not None:  # a beam's scores are already log-probs, processed after (HF's order)
            beam_among_rows = torch.from_numpy(np.flatnonzero(batch.beam[rows_np])).to(scored.device)
            logprobs[beam_among_rows] = scored[rows[beam_among_rows]]
        chosen, ranks, top_ids, top_values = top_logprobs(logprobs, token_ids[rows], num_alternatives)
        # Rows that did not ask keep zeros (the contract allows junk there).
        output.chosen_logprobs = np.zeros(num_rows, dtype=np.float32)
        output.chosen_ranks = np.zeros(num_rows, dtype=np.int64)
        output.top_token_ids = np.zeros((num_rows, num_alternatives), dtype=np.int64)
        output.top_logprobs = np.zeros((num_rows, num_alternatives), dtype=np.float32)
        output.chosen_logprobs[rows_np] = chosen.cpu().numpy()
        output.chosen_ranks[rows_np] = ranks.cpu().numpy()
        output.top_token_ids[rows_np] = top_ids.cpu().numpy()
        output.top_logprobs[rows_np] = top_values.cpu().numpy()


def _apply_stages_5_to_10(logits: torch.Tensor, batch: SamplingBatch, advanced: AdvancedColumns) -> torch.Tensor:
    """tfs -> eta -> epsilon -> typical -> XTC -> smoothing, each on the rows that use it.
    Greedy rows hold neutral values for these stages, so they never run on one."""
    a = advanced
    logits = on_rows(logits, np.flatnonzero(a.tfs < 1), lambda sub, rows: apply_tfs(sub, a.tfs[rows]))
    logits = on_rows(logits, np.flatnonzero(a.eta_cutoff > 0), lambda sub, rows: apply_eta(sub, a.eta_cutoff[rows]))
    logits = on_rows(logits, np.flatnonzero(a.epsilon_cutoff > 0),
                     lambda sub, rows: apply_epsilon(sub, a.epsilon_cutoff[rows]))
    logits = on_rows(logits, np.flatnonzero(a.typical_p < 1),
                     lambda sub, rows: apply_typical(sub, a.typical_p[rows]))
    logits = on_rows(logits, _xtc_rows(batch, a), lambda sub, rows: apply_xtc(sub, a.xtc_threshold[rows]))
    return on_rows(logits, np.flatnonzero(a.smoothing_factor > 0),
                   lambda sub, rows: apply_smoothing(sub, a.smoothing_factor[rows], a.smoothing_curve[rows]))


def _xtc_rows(batch: SamplingBatch, advanced: AdvancedColumns) -> np.ndarray:
    """Rows whose XTC coin (its own counter-based stream, docs/design.md §5) comes up: u < xtc_probability."""
    candidates = np.flatnonzero(advanced.xtc_probability > 0)
    if len(candidates) == 0:
        return candidates
    coins = rng.uniforms(batch.seeds[candidates], batch.choice_index[candidates],
                         batch.output_position[candidates], stream=rng.XTC_STREAM)
    return candidates[coins < advanced.xtc_probability[candidates]]


def _apply_temperature(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Stage 11: divide random rows by T; dynatemp rows by their T of this step. A T below
    GREEDY_TEMPERATURE divides nothing (docs/sampling.md); greedy rows are left as they are."""
    temperature = np.where(batch.temperature == 0, 1.0, batch.temperature)  # greedy rows: as is
    advanced = batch.advanced
    dynatemp_rows = (np.flatnonzero((advanced.dynatemp_min > 0) | (advanced.dynatemp_max > 0))
                     if advanced is not None else np.zeros(0, np.int64))
    if len(dynatemp_rows) == 0:
        if (temperature == 1).all():
            return logits
        return logits / column(temperature, logits.device, torch.float32)
    divisor = column(temperature, logits.device, torch.float32)
    rows = torch.from_numpy(dynatemp_rows).to(logits.device)
    dynamic = dynamic_temperatures(logits[rows], advanced.dynatemp_min[dynatemp_rows],
                                   advanced.dynatemp_max[dynatemp_rows], advanced.dynatemp_exponent[dynatemp_rows])
    divisor[rows] = torch.where(dynamic >= GREEDY_TEMPERATURE, dynamic, 1.0).float()[:, None]
    return logits / divisor
