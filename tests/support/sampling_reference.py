"""A plain numpy reference of the sampler specification (SAMPLING.md, summarised in docs/sampling.md),
written from the document alone, one row at a time.

Float64 throughout, loops where the document describes loops; no code is shared with
pipeline/sampling/sampler.py and its stages. `reference_row` returns what the sampler must return for
one row: the final logits (whose log_softmax are the processed logprobs), the chosen token and,
for mirostat rows, the next mu.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

NEG_INF = -np.inf


@dataclass
class Knobs:
    """The parameters of docs/sampling.md, defaults off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0
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
    mirostat_mode: int = 0
    mirostat_tau: float = 0.0
    mirostat_eta: float = 0.0
    repetition_penalty: float = 1.0
    repetition_penalty_range: int = 0
    repetition_penalty_slope: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    custom_token_bans: list[int] = field(default_factory=list)
    logit_bias: dict[int, float] = field(default_factory=dict)
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_range: int = 0


@dataclass
class RowResult:
    logits: np.ndarray  # final, float64
    token: int
    next_mu: float | None = None

    @property
    def logprobs(self) -> np.ndarray:
        return log_softmax(self.logits)


def softmax(logits: np.ndarray) -> np.ndarray:
    finite = np.isfinite(logits)
    shifted = np.where(finite, np.exp(logits - logits[finite].max()), 0.0)
    return shifted / shifted.sum()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    top = logits[np.isfinite(logits)].max()
    return logits - (top + math.log(np.exp(logits - top).sum()))


def entropy(logits: np.ndarray) -> float:
    probs = softmax(logits)
    logprobs = log_softmax(logits)
    return float(-sum(p * lp for p, lp in zip(probs, logprobs, strict=True) if p > 0))


def descending(logits: np.ndarray) -> np.ndarray:
    """Token ids by decreasing logit; equal logits in id order."""
    return np.argsort(-logits, kind="stable")


def top_token(logits: np.ndarray) -> int:
    return int(np.argmax(logits))  # the first maximal id


def masked(logits: np.ndarray, mask: np.ndarray, keep_top: bool = True) -> np.ndarray:
    mask = mask.copy()
    if keep_top:
        mask[top_token(logits)] = False
    return np.where(mask, NEG_INF, logits)


# ---- stages 1-3 ------------------------------------------------------------------------------

def bans_and_bias(logits: np.ndarray, knobs: Knobs, min_tokens_bans: list[int]) -> np.ndarray:
    logits = logits.copy()
    for token in knobs.custom_token_bans:
        logits[token] = NEG_INF
    for token, bias in knobs.logit_bias.items():
        logits[token] += bias
    for token in min_tokens_bans:
        logits[token] = NEG_INF
    return logits


def penalties(logits: np.ndarray, knobs: Knobs, prompt: list[int], output: list[int]) -> np.ndarray:
    logits = logits.copy()
    for token, penalty in repetition_penalties(knobs, prompt + output).items():
        value = logits[token]
        logits[token] = value / penalty if value > 0 else value * penalty
    for token in set(output):
        count = output.count(token)
        logits[token] -= knobs.frequency_penalty * count + knobs.presence_penalty
    return logits


def repetition_penalties(knobs: Knobs, context: list[int]) -> dict[int, float]:
    """token -> its repetition penalty: r over the whole context, or over the last `range` tokens, whose
    older half (rounded up) gets 1 + (r - 1) * slope when r > 1; a token in the newer half gets r."""
    r = np.float32(knobs.repetition_penalty)
    if knobs.repetition_penalty_range == 0:
        return {token: r for token in context}
    window = context[-knobs.repetition_penalty_range:]
    split = (len(window) + 1) // 2
    reduced = np.float32(1) + (r - np.float32(1)) * np.float32(knobs.repetition_penalty_slope) if r > 1 else r
    penalties = {token: reduced for token in window[:split]}
    penalties.update({token: r for token in window[split:]})
    return penalties


def dry(logits: np.ndarray, knobs: Knobs, context: list[int], is_breaker: np.ndarray) -> np.ndarray:
    if knobs.dry_range > 0:
        context = context[-knobs.dry_range:]
    length = len(context)
    longest: dict[int, int] = {}
    for i in range(length - 1):
        if context[i] != context[-1]:
            continue
        n = 0  # common suffix of context[:i+1] and context, without a breaker token in it
        while i - n >= 0 and context[i - n] == context[length - 1 - n] and not is_breaker[context[i - n]]:
            n += 1
        following = context[i + 1]
        if is_breaker[following]:
            continue  # extending the repeat by a breaker would cross it
        longest[following] = max(longest.get(following, 0), n)
    logits = logits.copy()
    for token, n in longest.items():
        if n >= knobs.dry_allowed_length:
            logits[token] -= knobs.dry_multiplier * knobs.dry_base ** (n - knobs.dry_allowed_length)
    return logits


# ---- stages 4-8 ------------------------------------------------------------------------------

def truncation(logits: np.ndarray, knobs: Knobs) -> np.ndarray:
    probs = softmax(logits)
    p_max = probs.max()
    mask = probs < max(knobs.min_p * p_max, knobs.top_a * p_max * p_max)
    order = descending(logits)
    if knobs.top_p < 1:
        mass_before = 0.0
        for token in order:
            if mass_before > knobs.top_p:
                mask[token] = True
            mass_before += probs[token]
    if knobs.top_k >= 1:
        mask[order[knobs.top_k:]] = True
    return masked(logits, mask)


def tail_free(logits: np.ndarray, tfs: float) -> np.ndarray:
    order = descending(logits)
    sorted_probs = softmax(logits)[order]
    mask = np.zeros(len(logits), bool)
    curvature = np.abs(np.diff(np.diff(sorted_probs)))
    if len(curvature) > 0 and curvature.sum() > 0:
        cumulative = np.cumsum(curvature / curvature.sum())
        for j, value in enumerate(cumulative):
            if value > tfs:
                mask[order[j + 1]] = True
    if len(logits) >= 2:
        mask[order[-1]] = True
    return masked(logits, mask)


def eta(logits: np.ndarray, eta_cutoff: float) -> np.ndarray:
    epsilon = eta_cutoff * 1e-4
    threshold = min(epsilon, math.sqrt(epsilon) * math.exp(-entropy(logits)))
    return masked(logits, softmax(logits) < threshold)


def epsilon(logits: np.ndarray, epsilon_cutoff: float) -> np.ndarray:
    return masked(logits, softmax(logits) < epsilon_cutoff * 1e-4)


def typical(logits: np.ndarray, typical_p: float) -> np.ndarray:
    probs, deviation = softmax(logits), np.abs(entropy(logits) + log_softmax(logits))
    order = np.argsort(deviation, kind="stable")
    mask = np.zeros(len(logits), bool)
    cumulative = 0.0
    for position, token in enumerate(order):
        cumulative += probs[token]
        if cumulative >= typical_p:
            mask[order[position:]] = True
            break
    mask[order[0]] = False
    return np.where(mask, NEG_INF, logits)


# ---- stages 9-12 -----------------------------------------------------------------------------

def xtc(logits: np.ndarray, threshold: float) -> np.ndarray:
    probs = softmax(logits)
    above = [token for token in descending(logits) if probs[token] >= threshold]
    mask = np.zeros(len(logits), bool)
    if len(above) >= 2:
        mask[above[:-1]] = True  # all but the least probable of them
    return np.where(mask, NEG_INF, logits)


def smoothing(logits: np.ndarray, factor: float, curve: float) -> np.ndarray:
    k, s = factor * (3 - curve) / 2, factor * (curve - 1) / 2
    top = logits[np.isfinite(logits)].max()
    result = logits.copy()
    for token in np.flatnonzero(np.isfinite(logits)):
        d = logits[token] - top
        result[token] = top - k * d * d + s * d ** 3
    return result


def temperature_of(logits: np.ndarray, knobs: Knobs) -> float:
    if knobs.dynatemp_min > 0 or knobs.dynatemp_max > 0:
        num_finite = int(np.isfinite(logits).sum())
        if num_finite == 1:
            return knobs.dynatemp_min
        normalized = entropy(logits) / math.log(num_finite)
        return knobs.dynatemp_min + (knobs.dynatemp_max - knobs.dynatemp_min) * normalized ** knobs.dynatemp_exponent
    return knobs.temperature


def mirostat_mask(logits: np.ndarray, mu: float) -> np.ndarray:
    surprise = -log_softmax(logits) / math.log(2)
    return masked(logits, surprise > mu)


def pick(logits: np.ndarray, uniform: float) -> int:
    cdf = np.cumsum(softmax(logits))
    return int(np.argmax(cdf > uniform * cdf[-1]))


# ---- the chain -------------------------------------------------------------------------------

def is_greedy(knobs: Knobs) -> bool:
    return knobs.temperature < 1e-5 and not (knobs.dynatemp_min > 0 or knobs.dynatemp_max > 0)


def reference_row(raw_logits: np.ndarray, knobs: Knobs, *, prompt: list[int], output: list[int],
                  is_breaker: np.ndarray | None = None, min_tokens_bans: list[int] = (),
                  uniform: float = 0.5, xtc_uniform: float = 0.0, mu: float | None = None) -> RowResult:
    """docs/sampling.md for one row. `mu`: the choice's mu so far (None: 2 tau)."""
    logits = bans_and_bias(raw_logits.astype(np.float64), knobs, list(min_tokens_bans))
    logits = penalties(logits, knobs, prompt, output)
    if knobs.dry_multiplier > 0:
        breakers = is_breaker if is_breaker is not None else np.zeros(len(logits), bool)
        logits = dry(logits, knobs, [*prompt, *output], breakers)
    if is_greedy(knobs):
        return RowResult(logits, top_token(logits))
    logits = truncation(logits, knobs)
    if knobs.tfs < 1:
        logits = tail_free(logits, knobs.tfs)
    if knobs.eta_cutoff > 0:
        logits = eta(logits, knobs.eta_cutoff)
    if knobs.epsilon_cutoff > 0:
        logits = epsilon(logits, knobs.epsilon_cutoff)
    if knobs.typical_p < 1:
        logits = typical(logits, knobs.typical_p)
    if xtc_uniform < knobs.xtc_probability:
        logits = xtc(logits, knobs.xtc_threshold)
    if knobs.smoothing_factor > 0:
        logits = smoothing(logits, knobs.smoothing_factor, knobs.smoothing_curve)
    temperature = temperature_of(logits, knobs)
    if temperature >= 1e-5:
        logits = logits / temperature
    if knobs.mirostat_mode != 2:
        return RowResult(logits, pick(logits, uniform))
    mu = 2 * knobs.mirostat_tau if mu is None else mu
    logits = mirostat_mask(logits, mu)
    token = pick(logits, uniform)
    surprise = -log_softmax(logits)[token] / math.log(2)
    return RowResult(logits, token, mu - knobs.mirostat_eta * (surprise - knobs.mirostat_tau))
