"""Pooling: one vector per prompt from its final hidden states (MEAN, CLS or LAST), then L2-normalised
when the model asks (docs/http-api.md#embeddings).

A decoder's prompt may arrive in chunks (chunked prefill over the paged cache), so a prompt's pooled
state is kept as it goes: the first token's row (CLS), the latest row (LAST), or a running float32
sum and count (MEAN); `PooledState.vector` reads it once the whole prompt has been seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline.loading.pooling_config import PoolingConfig


@dataclass(slots=True)
class PooledState:
    """One prompt's pooling so far; `add` takes the rows of positions [start, start + len(rows))."""

    pooling_type: str
    total: torch.Tensor | None = None  # MEAN: sum of rows; CLS: row 0; LAST: the latest row
    count: int = 0

    def add(self, rows: torch.Tensor, start: int) -> None:
        rows = rows.float()
        if self.pooling_type == "MEAN":
            chunk = rows.sum(dim=0)
            self.total = chunk if self.total is None else self.total + chunk
        elif self.pooling_type == "CLS":
            if start == 0:
                self.total = rows[0].clone()  # a copy: a view would keep the step's hidden states alive
        else:
            self.total = rows[-1].clone()
        self.count += rows.shape[0]

    def vector(self) -> torch.Tensor:
        if self.total is None:
            raise ValueError("no hidden states were pooled for this prompt")
        return self.total / self.count if self.pooling_type == "MEAN" else self.total


def pool_padded(hidden: torch.Tensor, lengths: torch.Tensor, pooling_type: str) -> torch.Tensor:
    """hidden [B, T, H] of right-padded prompts with `lengths` [B] -> float32 [B, H].

    lengths [3, 1], MEAN -> row 0 the mean of positions 0..2, row 1 position 0 alone."""
    hidden = hidden.float()
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if pooling_type == "CLS":
        return hidden[:, 0]
    if pooling_type == "LAST":
        return hidden[rows, lengths - 1]
    mask = torch.arange(hidden.shape[1], device=hidden.device)[None, :] < lengths[:, None]
    return (hidden * mask[..., None]).sum(dim=1) / lengths[:, None].to(hidden.dtype)


def finish(pooled: torch.Tensor, config: PoolingConfig) -> torch.Tensor:
    """[B, H] pooled -> what the model returns (L2-normalised when its config says so)."""
    return F.normalize(pooled, p=2, dim=-1) if config.normalize else pooled
