"""Which keys a layer's queries see: all earlier ones, a sliding window, or their own chunk.

A layer's `Window` is None (full causal attention), an int W (a sliding window, HF's rule: the
query at position p sees keys p - W + 1 .. p, W keys including its own) or a Chunk(C) (Llama 4's
chunked local attention, HF's `chunked_attention` layers: the query at position p sees keys
p - p % C .. p, those of its own chunk of C positions up to itself). Both bound the keys from
below by a function of the query's position, so every backend masks with one rule:
key >= first_visible_key(query position) (and key <= query position).

Worked example, positions 0..9: window 3 lets the query at 7 see 5, 6, 7; Chunk(4) lets it see
4, 5, 6, 7, and the query at 8 sees only 8 (a new chunk starts), where window 3 would see 6, 7, 8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class Chunk:
    """Chunked local attention over chunks of `size` positions (Llama 4's `attention_chunk_size`)."""

    size: int

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"attention chunks must be >= 1 positions, got {self.size}")


Window = int | Chunk | None
Positions = TypeVar("Positions", np.ndarray, torch.Tensor)


def first_visible_key(positions: Positions, window: Window) -> Positions:
    """The position of the first key a query at each of `positions` sees (numpy or torch integers);
    for a sliding window it may be negative (every key from 0)."""
    if isinstance(window, Chunk):
        return positions - positions % window.size
    if window:
        return positions - (window - 1)
    return positions * 0


def window_span(window: Window) -> int | None:
    """The most keys any query of such a layer sees (None: unbounded): W, or C for chunks."""
    if isinstance(window, Chunk):
        return window.size
    return window or None


def kernel_window(window: Window) -> tuple[int, int]:
    """The native decode kernel's (window, chunk) arguments, 0 meaning none."""
    if isinstance(window, Chunk):
        return 0, window.size
    return window or 0, 0
