"""Prompt-lookup drafting: copy what followed the latest earlier occurrence of the context's suffix.

For the longest n in [min_n, max_n] such that the last n tokens occurred earlier in the context,
the draft is the (up to) `k` tokens that followed that occurrence; the latest occurrence wins, as
it reflects the text being copied now. Example, min_n 1, max_n 3, k 2:
context [4 5 6 9 4 5 6] -> suffix [4 5 6] occurred at 0..2, followed by [9 4] -> draft [9, 4].

One vectorized pass per suffix length over the occurrences of the last token: O(context) per call.
"""

from __future__ import annotations

import numpy as np


def propose_draft(token_ids: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k draft tokens for the context `token_ids` (1-D int array); [] when no suffix of at
    least min_n tokens occurred before."""
    length = len(token_ids)
    if k < 1 or length < min_n + 1:
        return []
    # Candidate starts of an earlier occurrence end at c (c < length - 1, so a token follows it).
    ends = np.flatnonzero(token_ids[:-1] == token_ids[-1])
    best: np.ndarray | None = ends if min_n <= 1 and len(ends) else None
    for n in range(2, min(max_n, length - 1) + 1):
        ends = ends[ends >= n - 1]
        ends = ends[token_ids[ends - (n - 1)] == token_ids[length - n]]
        if len(ends) == 0:
            break
        if n >= min_n:
            best = ends
    if best is None:
        return []
    start = int(best[-1]) + 1
    return token_ids[start:start + k].tolist()
