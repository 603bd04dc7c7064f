"""HF's side of the structured-output oracle: the same grammar through llguidance directly, no engine code."""

from __future__ import annotations

import llguidance
import numpy as np
import torch
import transformers


class GrammarMask(transformers.LogitsProcessor):
    """Masks the tokens the grammar forbids, advancing its matcher by each token HF generated."""

    def __init__(self, tokenizer_json: str, grammar: str, vocab_size: int, eos: list[int]) -> None:
        self.matcher = llguidance.LLMatcher(llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                                                   eos_token=eos), grammar)
        self.vocab_size, self.prompt_len = vocab_size, None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prompt_len is None:
            self.prompt_len = input_ids.shape[1]
        elif input_ids.shape[1] > self.prompt_len:
            self.matcher.consume_token(int(input_ids[0, -1]))
        bits = np.frombuffer(self.matcher.compute_bitmask(), np.uint8)
        allowed = torch.from_numpy(np.unpackbits(bits, bitorder="little", count=self.vocab_size).astype(bool))
        return scores.masked_fill(~allowed[: scores.shape[1]], float("-inf"))
