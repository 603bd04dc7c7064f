"""Stages 9-12 of docs/sampling.md: XTC, smoothing, dynamic temperature and mirostat v2.

Like the truncation stages, each function takes the logits of the rows that use it ([r, V]
float32) and their columns (numpy [r]). Quantities that feed a temperature or mirostat's mu are
computed in float64: they scale every logit of the row, so their rounding would show in every
returned logprob.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pipeline.sampling.row_ops import column, entropy, keep_top, unsort

_MINUS_INF = float("-inf")
_LN2 = math.log(2.0)


def apply_xtc(logits: torch.Tensor, xtc_threshold: np.ndarray) -> torch.Tensor:
    """Stage 9, exclude top choices (for rows whose coin came up): when two or more tokens have
    p >= threshold, drop all of them but the least probable. In the stable descending order the
    kept one is the last above the threshold, so a position is dropped when the next one is
    above: sorted p [0.4, 0.3, 0.2, 0.1], threshold 0.2 -> drop [T, T, F, F]."""
    sorted_logits, sorted_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(dim=-1)
    remove = torch.zeros_like(probs, dtype=torch.bool)
    remove[:, :-1] = probs[:, 1:] >= column(xtc_threshold, logits.device, torch.float32)
    return logits.masked_fill(unsort(remove, sorted_ids), _MINUS_INF)


def apply_smoothing(logits: torch.Tensor, factor: np.ndarray, curve: np.ndarray) -> torch.Tensor:
    """Stage 10, quadratic/cubic smoothing around the top logit: with d = l - max(l) <= 0,
    l = max - k d^2 + s d^3, k = f (3 - c) / 2, s = f (c - 1) / 2; -inf stays -inf.
    Example, f = 0.5, c = 1 (k = 0.5, s = 0): logits [2, 1, -1] -> d [0, -1, -3] -> [2, 1.5, -2.5]."""
    device = logits.device
    f, c = column(factor, device, torch.float32), column(curve, device, torch.float32)
    top = logits.max(dim=-1, keepdim=True).values
    distance = logits - top
    if (curve == 1).all():  # the usual case, s = 0, k = f > 0: -inf gives top - f * inf = -inf as it is
        return top - f * distance.square()
    # d^2 first, as above: a c = 1 row (k = f exactly, s = 0) gets the same bits in a batch that
    # takes this path as alone ((k d) d would round differently from k (d d)).
    k, s = f * (3 - c) / 2, f * (c - 1) / 2
    squared = distance.square()
    smoothed = top - k * squared + s * squared * distance
    return torch.where(torch.isfinite(logits), smoothed, logits)


def dynamic_temperatures(logits: torch.Tensor, low: np.ndarray, high: np.ndarray,
                         exponent: np.ndarray) -> torch.Tensor:
    """Stage 11 for dynatemp rows: [r] float64 T = low + (high - low) (H / ln #finite)^exponent,
    T = low when one token is finite. Example: 4 equally likely tokens, H = ln 4 -> T = high."""
    device = logits.device
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    normalized = entropy(logprobs.exp(), logprobs).squeeze(1)
    num_finite = torch.isfinite(logits).sum(dim=-1)
    several = num_finite > 1
    normalized = torch.where(several, normalized / torch.log(num_finite.clamp(min=2).double()), 0.0)
    low_t, high_t = (torch.from_numpy(np.asarray(v, np.float64)).to(device) for v in (low, high))
    exponent_t = torch.from_numpy(np.asarray(exponent, np.float64)).to(device)
    temperatures = low_t + (high_t - low_t) * normalized.pow(exponent_t)
    return torch.where(several, temperatures, low_t)


def apply_mirostat(logits: torch.Tensor, mu: np.ndarray) -> torch.Tensor:
    """Stage 12, mirostat v2's mask: drop tokens whose surprise -log2 p exceeds mu; keep top."""
    surprise = -torch.log_softmax(logits, dim=-1) / _LN2
    remove = surprise > column(mu, logits.device, torch.float32)
    return logits.masked_fill(keep_top(remove, logits), _MINUS_INF)


def mirostat_update(final_logits: torch.Tensor, token_ids: torch.Tensor, mu: np.ndarray, tau: np.ndarray,
                    eta: np.ndarray) -> np.ndarray:
    """mu <- mu - eta (s_x - tau), with s_x the chosen token's surprise (bits) under the
    distribution after the mirostat mask. [r] float64 on the host: mu goes back to the scheduler."""
    logprobs = torch.log_softmax(final_logits.double(), dim=-1)
    surprise = (-logprobs.gather(1, token_ids[:, None]).squeeze(1) / _LN2).cpu().numpy()
    return mu - eta * (surprise - tau)
