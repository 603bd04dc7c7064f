"""Stages 4-8 of docs/sampling.md: truncation samplers. Each masks tokens (-inf) and keeps the top token.

Every function takes the logits of the rows that use the stage ([r, V] float32, r >= 1) and that
stage's columns for those rows (numpy [r]), and returns new logits; p is recomputed from the
current logits by each stage. Sorts are stable, so tokens with equal logits keep token-id order
and a row truncates the same in any batch.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.sampling.row_ops import column, entropy, keep_top, unsort

_MINUS_INF = float("-inf")


def apply_top_p_k_min_a(logits: torch.Tensor, top_p: np.ndarray, top_k: np.ndarray, min_p: np.ndarray,
                        top_a: np.ndarray | None = None) -> torch.Tensor:
    """Stage 4: min-p and top-a, top-p, top-k, all on one temperature-1 distribution, in one sort.

    Each keeps a prefix of the tokens sorted by probability, so applying them one after another
    equals intersecting the prefixes. threshold = max(min_p * p_max, top_a * p_max^2) drops
    p < threshold; top-p drops tokens whose mass before them exceeds top_p; top-k keeps k.
    Worked example, sorted probs [0.5, 0.3, 0.15, 0.05] with top_p 0.8: mass before each token
    [0, 0.5, 0.8, 0.95] -> keep [T, T, T, F] (0.8 does not exceed 0.8).
    """
    device, vocab_size = logits.device, logits.shape[1]
    if not ((top_p < 1).any() or ((top_k > 0) & (top_k < vocab_size)).any()):
        return _apply_min_p_top_a(logits, min_p, top_a)
    sorted_logits, sorted_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    mass_before[:, 0] = 0.0
    top_p_column = column(top_p, device, torch.float32)
    keep = (mass_before <= top_p_column) | (top_p_column >= 1)  # p = 1 must not drop a rounding-error tail
    p_max = sorted_probs[:, :1]
    threshold = column(min_p, device, torch.float32) * p_max
    if top_a is not None and (top_a > 0).any():
        threshold = torch.maximum(threshold, column(top_a, device, torch.float32) * p_max * p_max)
    keep &= sorted_probs >= threshold
    top_k_column = column(top_k, device, torch.int64)
    ranks = torch.arange(vocab_size, device=device)[None, :]
    keep &= (ranks < top_k_column) | (top_k_column <= 0)
    keep[:, 0] = True  # top-a > 1 / p_max would drop the top token
    return logits.masked_fill(unsort(~keep, sorted_ids), _MINUS_INF)


def _apply_min_p_top_a(logits: torch.Tensor, min_p: np.ndarray, top_a: np.ndarray | None) -> torch.Tensor:
    """Stage 4 when no row uses top-p or top-k: thresholds need only p_max, so no sort (a sort of
    [R, V] costs ~20x the rest of the stage on CPU). Drops the same tokens as the sorted path:
    p < max(min_p * p_max, top_a * p_max^2), the top token (lowest id among equals) kept."""
    device = logits.device
    probs = logits.softmax(dim=-1)
    p_max = probs.max(dim=-1, keepdim=True).values
    threshold = column(min_p, device, torch.float32) * p_max
    if top_a is not None and (top_a > 0).any():
        threshold = torch.maximum(threshold, column(top_a, device, torch.float32) * p_max * p_max)
    return logits.masked_fill(keep_top(probs < threshold, logits), _MINUS_INF)


def apply_tfs(logits: torch.Tensor, tfs: np.ndarray) -> torch.Tensor:
    """Stage 5, tail-free sampling: on the sorted probabilities p, the curvature d = |p'' | (length
    V - 2) normalized to sum 1; sorted position j + 1 is dropped where cumsum(d)[j] > tfs, and the
    last sorted token always is. Example, sorted p [0.5, 0.3, 0.15, 0.05, 0]: first differences
    [-0.2, -0.15, -0.1, -0.05], d = [0.05, 0.05, 0.05] -> cumsum [1/3, 2/3, 1]; tfs 0.5 drops
    positions 2, 3 (and 4, the last). A flat d (sum 0) gives NaN, which exceeds nothing."""
    sorted_logits, sorted_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(dim=-1)
    remove = torch.zeros_like(probs, dtype=torch.bool)
    vocab_size = probs.shape[1]
    if vocab_size >= 3:
        curvature = probs.diff(dim=-1).diff(dim=-1).abs()
        cumulative = torch.cumsum(curvature / curvature.sum(dim=-1, keepdim=True), dim=-1)
        remove[:, 1:-1] = cumulative > column(tfs, logits.device, torch.float32)
    if vocab_size >= 2:
        remove[:, -1] = True
    return logits.masked_fill(unsort(remove, sorted_ids), _MINUS_INF)


def apply_eta(logits: torch.Tensor, eta_cutoff: np.ndarray) -> torch.Tensor:
    """Stage 6: e = eta_cutoff * 1e-4; drop p < min(e, sqrt(e) * exp(-H))."""
    logprobs = torch.log_softmax(logits, dim=-1)
    probs = logprobs.exp()
    epsilon = column(eta_cutoff, logits.device, torch.float32) * 1e-4
    threshold = torch.minimum(epsilon, epsilon.sqrt() * torch.exp(-entropy(probs, logprobs)))
    return logits.masked_fill(keep_top(probs < threshold, logits), _MINUS_INF)


def apply_epsilon(logits: torch.Tensor, epsilon_cutoff: np.ndarray) -> torch.Tensor:
    """Stage 7: drop p < epsilon_cutoff * 1e-4."""
    probs = logits.softmax(dim=-1)
    threshold = column(epsilon_cutoff, logits.device, torch.float32) * 1e-4
    return logits.masked_fill(keep_top(probs < threshold, logits), _MINUS_INF)


def apply_typical(logits: torch.Tensor, typical_p: np.ndarray) -> torch.Tensor:
    """Stage 8, locally typical sampling: sort by |H + log p| ascending (masked tokens, at +inf,
    last); drop from the first token at which the cumulative p reaches typical_p, that token
    included; the most typical token is always kept. Example, p in that order [0.4, 0.35, 0.25]
    with typical_p 0.7: cumsum [0.4, 0.75, 1.0] -> keep [T, F, F]."""
    logprobs = torch.log_softmax(logits, dim=-1)
    probs = logprobs.exp()
    deviation = (entropy(probs, logprobs) + logprobs).abs()
    _, order = torch.sort(deviation, dim=-1, stable=True)
    cumulative = torch.cumsum(probs.gather(1, order), dim=-1)
    remove_sorted = cumulative >= column(typical_p, logits.device, torch.float32)
    remove_sorted[:, 0] = False
    return logits.masked_fill(unsort(remove_sorted, order), _MINUS_INF)
