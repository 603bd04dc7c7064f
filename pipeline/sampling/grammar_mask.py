"""Stage 0 of docs/sampling.md: the grammar's allowed-token mask (structured outputs).

Disallowed tokens get -inf before any other stage, so bans, penalties, truncation, mirostat and
the processed logprobs all see the constrained distribution. The masks arrive as llguidance's
bitmasks: int32 words, bit t % 32 of word t // 32 set when token t is allowed.

Example: vocabulary of 40, word 0 = 0b101 (tokens 0 and 2), word 1 = 1 << 3 (token 35): every
other token of that row becomes -inf.
"""

from __future__ import annotations

import numpy as np
import torch


def apply_token_bitmasks(logits: torch.Tensor, rows: np.ndarray, bitmasks: np.ndarray) -> torch.Tensor:
    """`logits` [R, V] with the rows in `rows` masked by `bitmasks` [len(rows), ceil(V / 32)], in place."""
    vocab_size = logits.shape[1]
    # Little-endian words, little bit order: byte k's bit b is token 8k + b, as in the words' layout.
    allowed = np.unpackbits(bitmasks.view(np.uint8), axis=1, bitorder="little", count=vocab_size).view(bool)
    disallowed = ~torch.from_numpy(allowed).to(logits.device)
    if len(rows) == logits.shape[0]:
        return logits.masked_fill_(disallowed, float("-inf"))
    row_index = torch.from_numpy(rows).to(logits.device)
    logits[row_index] = logits[row_index].masked_fill(disallowed, float("-inf"))
    return logits
