"""An embedding request's input: a text or token ids -> the prompt's token ids, checked.

The same rules as a generation prompt's (not empty, ids in the vocabulary, a text refused before
tokenizing when it cannot fit), except that the whole context is the prompt's: nothing is generated.
`dimensions` (Matryoshka) may not exceed the model's width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class EmbeddingInput:
    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int, hidden_size: int,
                 max_prompt_chars_per_token: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.hidden_size = hidden_size
        self.max_prompt_chars = max_model_len * max_prompt_chars_per_token

    def prompt_ids(self, prompt: str | None, token_ids: Sequence[int] | None) -> list[int]:
        """The prompt's token ids; ValueError naming the field and the rule."""
        if prompt is not None:
            ids = self._tokenize(prompt)
        elif token_ids is not None:
            ids = self._check_ids(token_ids)
        else:
            raise ValueError("an embedding request needs prompt or prompt_token_ids")
        if len(ids) > self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; the limit is {self.max_model_len} (max_model_len)")
        return ids

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is not None and not 1 <= dimensions <= self.hidden_size:
            raise ValueError(f"dimensions must be between 1 and the model's embedding width {self.hidden_size}, "
                             f"got {dimensions}")

    def _tokenize(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: send prompt_token_ids instead of text")
        if not prompt:
            raise ValueError("prompt must not be empty")
        if len(prompt) > self.max_prompt_chars:
            raise ValueError(f"prompt has {len(prompt)} characters; at most {self.max_prompt_chars} are accepted "
                             "(max_model_len x --max-prompt-chars-per-token)")
        return list(self.tokenizer.encode(prompt))

    def _check_ids(self, token_ids: Sequence[int]) -> list[int]:
        ids = list(token_ids)
        if not ids:
            raise ValueError("prompt_token_ids must not be empty")
        outside = next((token for token in ids if not 0 <= token < self.vocab_size), None)
        if outside is not None:
            raise ValueError(f"prompt_token_ids must hold token ids in [0, {self.vocab_size}), got {outside}")
        return ids
