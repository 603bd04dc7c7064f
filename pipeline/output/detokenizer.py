"""Incremental detokenization: token ids in, text deltas out, O(1) work per token.

Decoding the whole output every step costs O(n) per token. Instead we keep a short window of
recent ids and two offsets into it:

    window:  [ ... context ... | already emitted | new ids ]
                               ^ prefix_offset   ^ read_offset

`decode(window[prefix:read])` is text we have emitted; `decode(window[prefix:])` is that text plus
what the new ids add, so the delta is the difference. Decoding from `prefix` rather than `read`
gives the tokenizer a little left context (SentencePiece decoders strip a leading space from the
first piece; byte-level BPE tokens may start mid-character).

Byte-level BPE can split one UTF-8 character over several tokens; decoding a partial character
yields U+FFFD at the end of the text. Such ids are held back until a later id completes the
character, so no delta ever contains a replacement character that the full decode would not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

REPLACEMENT_CHAR = "\ufffd"
# Left context kept before the first output token (vLLM uses the same small number).
_INITIAL_CONTEXT_TOKENS = 5
# A UTF-8 character has at most 4 bytes and every token has at least one, so more pending ids
# than this cannot all be waiting on one character: some ends in genuinely invalid bytes.
_MAX_PENDING_TOKENS = 4
# Drop ids left of prefix_offset once this many pile up, so the window stays small.
_TRIM_THRESHOLD = 64
# The sealed-part search tries at most this many split points, the last ones: a split that seals
# text sits just before the trailing partial character, a few tokens from the end. Unbounded, a
# lone lead byte followed by ids that decode to nothing (skipped special tokens, e.g. EOS under
# ignore_eos) made every new id try every split: 180k decodes for 600 ids.
_SEAL_SEARCH_SPLITS = 8


class Decoder(Protocol):
    """The part of a tokenizer this module needs (a transformers tokenizer satisfies it)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ..., **kwargs: bool) -> str: ...


class IncrementalDetokenizer:
    """Turns a stream of output token ids into text deltas whose concatenation is the full decode."""

    def __init__(
        self,
        tokenizer: Decoder,
        prompt_token_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # vLLM's option, passed to an HF tokenizer's decode only when set to False. Fast (Rust)
        # tokenizers have no such option, and transformers 5's tokenizers ignore it: same text.
        self._decode_options = {} if spaces_between_special_tokens else {"spaces_between_special_tokens": False}
        prompt = list(prompt_token_ids or ())
        context_start = max(len(prompt) - _INITIAL_CONTEXT_TOKENS, 0)
        self._window: list[int] = prompt[context_start:]
        self._prefix_offset = 0
        self._read_offset = len(self._window)
        self._pieces: list[str] = []
        self.num_output_tokens = 0

    @property
    def text(self) -> str:
        """All output text emitted so far (not including held-back partial characters)."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def add(self, new_token_ids: Sequence[int]) -> str:
        """Append output ids; return the text they complete (possibly "")."""
        if not new_token_ids:
            return ""
        self._window.extend(new_token_ids)
        self.num_output_tokens += len(new_token_ids)
        emitted_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset, len(self._window))
        if not full_text.endswith(REPLACEMENT_CHAR):
            return self._emit(full_text[len(emitted_text):], len(self._window))
        if len(self._window) - self._read_offset > _MAX_PENDING_TOKENS:
            return self._emit_sealed_part(emitted_text, full_text)
        return ""

    def finish(self) -> str:
        """Flush held-back ids at the end of the sequence, decoded as the tokenizer would."""
        emitted_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset, len(self._window))
        return self._emit(full_text[len(emitted_text):], len(self._window))

    def _emit_sealed_part(self, emitted_text: str, full_text: str) -> str:
        """Emit the pending ids before the trailing partial character, keeping the window bounded.

        Reached only when invalid bytes keep the text ending in U+FFFD. Text up to a split point
        is final when it is a strict prefix of the full text: a later character already follows
        it, so no future byte can change how it decodes.
        """
        last_tried = max(self._read_offset, len(self._window) - 1 - _SEAL_SEARCH_SPLITS)
        for split in range(len(self._window) - 1, last_tried, -1):
            split_text = self._decode(self._prefix_offset, split)
            if len(emitted_text) < len(split_text) < len(full_text) and full_text.startswith(split_text):
                return self._emit(split_text[len(emitted_text):], split)
        return ""

    def _emit(self, delta: str, new_read_offset: int) -> str:
        self._prefix_offset = self._read_offset
        self._read_offset = new_read_offset
        self._trim_window()
        if delta:
            self._pieces.append(delta)
        return delta

    def _trim_window(self) -> None:
        if self._prefix_offset >= _TRIM_THRESHOLD:
            del self._window[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0

    def _decode(self, start: int, stop: int) -> str:
        if start >= stop:
            return ""
        return self.tokenizer.decode(self._window[start:stop], skip_special_tokens=self.skip_special_tokens,
                                     **self._decode_options)


class _BackendDecoder:
    """A fast tokenizer's Rust decoder called directly: the transformers wrapper around it costs
    several times the decode itself, per token, on the output path."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **_hf_options: bool) -> str:
        # The Rust decoder has no spaces_between_special_tokens (HF's fast tokenizers ignore it too).
        return self._backend.decode(token_ids, skip_special_tokens=skip_special_tokens)


def fast_decoder(tokenizer: Any) -> Decoder:
    """The tokenizer's backend decoder where that gives the same text, else the tokenizer itself."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return tokenizer  # the wrapper post-processes the text: keep it
    return _BackendDecoder(backend)
