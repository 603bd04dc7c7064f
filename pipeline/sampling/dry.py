"""Stage 3 of docs/sampling.md: DRY ("don't repeat yourself") penalties, and the sequence-breaker tokens.

For a context c (the last dry_range tokens of prompt + output) with last token t: every earlier
position i with c[i] == t starts a repeat; its length n is the longest common suffix of c[:i+1]
and c that contains no sequence-breaker token. c[i+1] would extend that repeat, so it gets
multiplier * base^(n - allowed_length) subtracted when n >= allowed_length (its largest n counts),
unless c[i+1] is itself a breaker: the repeat it would extend would then cross a breaker, so a
breaker (a newline, say) is never penalised for following a repeat.

Example (no breakers), c = [5, 6, 7, 9, 5, 6, 7], allowed_length 2: t = 7 matches i = 2; the
suffixes [5, 6, 7] agree, n = 3 (position -1 would be needed for a 4th) -> token c[3] = 9 gets
multiplier * base^1.

The work is proportional to the total length of all repeats: candidates shrink as they stop
matching, and all DRY rows of a step advance together, one step back per iteration.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import structlog

log = structlog.get_logger(__name__)
_MAX_CACHED_BREAKER_SETS = 256


class SequenceBreakers:
    """Which token ids' texts contain a breaker string, per breaker set; the token texts are
    decoded once per tokenizer (on first use), each set's mask once.

    Intake builds a request's mask (`mask`, in a worker thread) before the request is scheduled,
    so the device thread finds it cached. Building is one pass of a regular expression over all
    token texts joined, so its cost follows the texts' length, not vocabulary x breakers."""

    def __init__(self, decode: Callable[[list[int]], str] | None, vocab_size: int) -> None:
        self.decode = decode
        self.vocab_size = vocab_size
        self._texts: str | None = None  # every token's text, each followed by NUL
        self._ends: np.ndarray | None = None  # [V] offset just past each token's text in _texts
        self._masks: dict[frozenset[str], np.ndarray] = {}
        self._building = threading.Lock()  # intake's thread and the device thread may both build

    def mask(self, breakers: tuple[str, ...]) -> np.ndarray:
        """[V] bool; all False without a tokenizer (no token text to look into)."""
        key = frozenset(breakers)
        found = self._masks.get(key)
        if found is not None:
            return found
        with self._building:
            found = self._masks.get(key)
            if found is None:
                found = self._build(key)
                if len(self._masks) >= _MAX_CACHED_BREAKER_SETS:
                    self._masks.pop(next(iter(self._masks)))  # oldest first: a dict keeps insertion order
                self._masks[key] = found
        return found

    def _build(self, breakers: frozenset[str]) -> np.ndarray:
        mask = np.zeros(self.vocab_size, np.bool_)
        breakers = frozenset(b for b in breakers if "\0" not in b)  # no token text holds NUL
        if self.decode is None or not breakers:
            return mask
        texts, ends = self._token_texts()
        # Longest first, so an alternative that is a prefix of another does not hide it; matches
        # never cross a token's end (no breaker holds the NUL between texts).
        pattern = re.compile("|".join(re.escape(b) for b in sorted(breakers, key=len, reverse=True)))
        starts = np.fromiter((match.start() for match in pattern.finditer(texts)), np.int64)
        # ends[i] is the first offset past token i, so the token holding offset s is the first i with ends[i] > s.
        mask[np.searchsorted(ends, starts, side="right")] = True
        return mask

    def _token_texts(self) -> tuple[str, np.ndarray]:
        if self._texts is None or self._ends is None:
            pieces = [self.decode([token_id]).replace("\0", "") + "\0" for token_id in range(self.vocab_size)]
            self._ends = np.cumsum([len(piece) for piece in pieces], dtype=np.int64)
            self._texts = "".join(pieces)
            log.info("decoded token texts for DRY sequence breakers", vocab_size=self.vocab_size)
        return self._texts, self._ends


def token_decoder(tokenizer: Any | None) -> Callable[[list[int]], str] | None:
    """A token's text as the tokenizer decodes it alone, special tokens included; "" for ids the
    tokenizer does not know (an lm_head padded past its vocabulary)."""
    if tokenizer is None:
        return None

    def decode(token_ids: list[int]) -> str:
        try:
            return tokenizer.decode(token_ids, skip_special_tokens=False)
        except (IndexError, OverflowError, TypeError, ValueError):
            return ""

    return decode


def dry_penalties(contexts: list[np.ndarray], breaker_masks: list[np.ndarray], multiplier: np.ndarray,
                  base: np.ndarray, allowed_length: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, tokens, penalties) to subtract, one triple per (row, token) with a repeat long enough.

    Inputs are per DRY row: context ids, the [V] breaker mask of its breaker set, and its knobs.
    """
    lengths = np.fromiter((len(c) for c in contexts), np.int64, len(contexts))
    if lengths.sum() == 0:
        return _no_penalties()
    flat = np.concatenate(contexts)
    is_breaker = np.concatenate([mask[c] for mask, c in zip(breaker_masks, contexts, strict=True)])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    row_of = np.repeat(np.arange(len(contexts)), lengths)
    last = (starts + lengths - 1)[row_of]  # per position: the index of its row's last token
    # Positions before their row's last token, holding that token, which is not a breaker:
    # flat [5, 6, 5 | 8, 8], last [2, 2, 2 | 4, 4] -> candidates [0, 3].
    positions = np.arange(len(flat))
    candidates = np.flatnonzero((positions < last) & (flat == flat[last]) & ~is_breaker[last])
    # A breaker token never continues a repeat: the extended repeat would cross it (candidates lie
    # before their row's last token, so candidates + 1 stays inside the row).
    candidates = candidates[~is_breaker[candidates + 1]]
    if len(candidates) == 0:
        return _no_penalties()
    repeat_lengths = _repeat_lengths(flat, is_breaker, candidates, last[candidates], starts[row_of[candidates]])
    rows, tokens, lengths_kept = _longest_per_token(row_of[candidates], flat[candidates + 1], repeat_lengths)
    long_enough = lengths_kept >= allowed_length[rows]
    rows, tokens, lengths_kept = rows[long_enough], tokens[long_enough], lengths_kept[long_enough]
    with np.errstate(over="ignore"):  # a very long repeat's penalty is inf: the token is masked
        penalties = multiplier[rows] * np.power(base[rows], (lengths_kept - allowed_length[rows]).astype(np.float64))
    return rows, tokens, penalties


def _repeat_lengths(flat: np.ndarray, is_breaker: np.ndarray, candidates: np.ndarray, last: np.ndarray,
                    row_start: np.ndarray) -> np.ndarray:
    """n per candidate: 1 (its token equals the last one) plus one per further step back on which
    both sides agree, stopping at the row's start or a breaker (equal tokens are both breakers)."""
    lengths = np.ones(len(candidates), np.int64)
    alive = np.arange(len(candidates))
    step = 1
    while len(alive) > 0:
        here, there = candidates[alive] - step, last[alive] - step
        agree = here >= row_start[alive]
        agree[agree] = (flat[here[agree]] == flat[there[agree]]) & ~is_breaker[there[agree]]
        alive = alive[agree]
        lengths[alive] += 1
        step += 1
    return lengths


def _longest_per_token(rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The largest length per (row, token): sort by (row, token, length), take each group's last."""
    order = np.lexsort((lengths, tokens, rows))
    rows, tokens, lengths = rows[order], tokens[order], lengths[order]
    group_end = np.ones(len(rows), np.bool_)
    group_end[:-1] = (rows[1:] != rows[:-1]) | (tokens[1:] != tokens[:-1])
    return rows[group_end], tokens[group_end], lengths[group_end]


def _no_penalties() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
