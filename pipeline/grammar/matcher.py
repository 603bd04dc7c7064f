"""GrammarMatcher: one choice's position in its grammar.

`fill_bitmask` writes the tokens allowed next as a bitmask (bit t of word t // 32 set = token t
allowed; llguidance's layout), `accept` advances by the sampled token, `is_finished` says the
grammar can take no further token but EOS. A matcher is
rebuilt by replaying a choice's output tokens, so preemption and crash resume need no saved state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class GrammarMatcher:
    def __init__(self, ll_tokenizer: Any, grammar: str, vocab_size: int) -> None:
        import llguidance

        self._matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
        self.vocab_size = vocab_size
        if self._matcher.is_error():
            raise ValueError(f"structured output: {self._matcher.get_error()}")

    def replay(self, token_ids: Sequence[int]) -> None:
        """Advance over tokens already generated (a resumed or recomputed choice)."""
        for token_id in token_ids:
            if not self.accept(token_id):
                return

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False once the grammar is finished or the token was not allowed."""
        if self._matcher.is_stopped():
            return False
        return bool(self._matcher.consume_token(token_id))

    def fill_bitmask(self, also_allowed: Sequence[int] = ()) -> bytes:
        """The allowed next tokens, as int32 little-endian words (see the module docstring), with
        `also_allowed` (e.g. the request's stop tokens where the grammar could end) added."""
        mask = np.empty(bitmask_words(self.vocab_size), np.int32)
        self._matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        for token_id in also_allowed:
            if 0 <= token_id < self.vocab_size:
                mask[token_id // 32] |= np.int32(np.uint32(1 << (token_id % 32)).view(np.int32))
        return mask.tobytes()

    @property
    def is_accepting(self) -> bool:
        """The text so far is a complete answer (it may still continue)."""
        return bool(self._matcher.is_accepting())

    @property
    def is_finished(self) -> bool:
        """Nothing more can follow: the grammar is complete (or the matcher hit an error)."""
        return self._matcher.is_stopped() or self._matcher.is_error()

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None
