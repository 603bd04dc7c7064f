"""DraftProposer: where a speculating sequence's draft comes from.

The scheduler's Speculator (pipeline/speculative/speculator.py) asks a proposer for up to k tokens
that continue a sequence's context. Prompt lookup (PromptLookupProposer) copies them from the context;
a draft model (pipeline/speculative/draft_model.py, built by the engine) decodes them greedily. Whatever the
proposer, the draft must be a deterministic function of the context: verification accepts draft
token j exactly when the target's own sample at that position equals it, which is exact only when
the draft does not depend on the target's randomness (docs/speculative.md).

A proposer may also draft in batches, `propose_many([(seq_id, token_ids, k), ...]) -> {seq_id: draft}`
(the draft model does); the Speculator then asks once per step for every decoding sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from pipeline.speculative.ngram import propose_draft


class DraftProposer(Protocol):
    def propose(self, seq_id: int, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that continue `token_ids` (the sequence's prompt and output); [] for none."""
        ...

    def forget(self, seq_id: int) -> None:
        """The sequence finished: drop whatever the proposer keeps for it."""
        ...


class PromptLookupProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seq_id: int, token_ids: Sequence[int], k: int) -> list[int]:
        return propose_draft(np.asarray(token_ids, np.int64), k, self.min_n, self.max_n)

    def forget(self, seq_id: int) -> None:
        pass  # stateless
