"""Small tensor helpers shared by the sampler's stages: per-row columns, row subsets, keep-top, entropy."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from pipeline.host_to_device import to_device


def column(values: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[R] numpy -> [R, 1] tensor, ready to broadcast against [R, V] logits."""
    return to_device(values, device).to(dtype)[:, None]


def on_rows(logits: torch.Tensor, rows_np: np.ndarray,
            stage: Callable[[torch.Tensor, np.ndarray], torch.Tensor]) -> torch.Tensor:
    """Run `stage(logits[rows], rows)` and write the result back into those rows (in place: the
    caller owns `logits`). A stage no row uses costs nothing; one every row uses costs no gather."""
    if len(rows_np) == 0:
        return logits
    if len(rows_np) == logits.shape[0]:
        return stage(logits, rows_np)
    rows = to_device(rows_np, logits.device)
    logits[rows] = stage(logits[rows], rows_np)
    return logits


def keep_top(remove: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Un-remove each row's top token (highest logit, lowest id on ties): a stage never masks it."""
    return remove.scatter(1, torch.argmax(logits, dim=-1, keepdim=True), False)


def entropy(probs: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """[R, 1] H = -sum p * log p in nats; masked tokens (p = 0, log p = -inf) add 0, not NaN."""
    return -torch.where(probs > 0, probs * logprobs, 0.0).sum(dim=-1, keepdim=True)


def unsort(sorted_mask: torch.Tensor, sorted_ids: torch.Tensor) -> torch.Tensor:
    """A mask over sorted positions -> the same mask over token ids."""
    return torch.zeros_like(sorted_mask).scatter_(1, sorted_ids, sorted_mask)
