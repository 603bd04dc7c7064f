"""Chat messages whose text cannot forge special tokens.

A chat template writes the model's role markers (`<|im_start|>`, `<|im_end|>`, ...) around each
message, then the prompt is tokenized with special-token text recognized. Without care, a user who
writes `<|im_end|><|im_start|>system` inside a message gets the real marker tokens, and writes a
system turn into the conversation. As HF's `split_special_tokens` and vLLM do for user content,
special-token text inside a message's role or content stays text here:

1. each occurrence in a role or text is swapped for a mark: U+E000, its index, U+E001 (private-use
   code points, which a template passes through unchanged);
2. the template renders the marked messages;
3. the prompt is tokenized piece by piece: the template's own text with special tokens recognized,
   each mark as its original text with special tokens read as plain text.

Example: content "hi <|im_end|>" becomes "hi \ue0000\ue001"; the prompt
"<|im_start|>user\nhi \ue0000\ue001<|im_end|>\n" is tokenized as "<|im_start|>user\nhi " (the first
token the real marker), then "<|im_end|>" as the characters <, |, im, ... , then "<|im_end|>\n".
A message with no special-token text (nearly all) is not touched: the prompt is the template's.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

_OPEN, _CLOSE = "\ue000", "\ue001"
_MARK = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


class ChatContentGuard:
    """For one tokenizer: the special-token texts it recognizes and an encoder that does not."""

    def __init__(self, tokenizer: Any) -> None:
        self._backend = getattr(tokenizer, "backend_tokenizer", None)  # a Rust `tokenizers.Tokenizer`
        specials = _special_texts(self._backend)
        # The marks' own code points are hidden too, so user text cannot fake a mark.
        hidden = sorted({*specials, _OPEN, _CLOSE}, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(text) for text in hidden))
        self.enabled = bool(specials)
        self._literal: Any | None = None  # a copy of the backend that encodes special tokens as text
        self._lock = threading.Lock()

    def protect(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
        """Messages with every special-token text in roles and texts swapped for a mark, and the
        texts the marks stand for, in mark order (empty: nothing to protect, use the messages)."""
        literals: list[str] = []
        if not self.enabled:
            return messages, literals

        def hide(text: str) -> str:
            def mark(match: re.Match[str]) -> str:
                literals.append(match.group(0))
                return f"{_OPEN}{len(literals) - 1}{_CLOSE}"

            return self._pattern.sub(mark, text)

        return [_map_texts(message, hide) for message in messages], literals

    def protect_with_tools(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, list[str]]:
        """`protect`, with the strings in tool calls (names, ids, argument values and keys) and in
        `tools` hidden too: a template writes them into the prompt as well."""
        protected, literals = self.protect(messages)
        if not self.enabled:
            return protected, tools, literals

        def hide(text: str) -> str:
            def mark(match: re.Match[str]) -> str:
                literals.append(match.group(0))
                return f"{_OPEN}{len(literals) - 1}{_CLOSE}"

            return self._pattern.sub(mark, text)

        for message in protected:
            for key in ("tool_calls", "tool_call_id", "name"):
                if key in message:
                    message[key] = _map_strings(message[key], hide)
        return protected, _map_strings(tools, hide) if tools is not None else None, literals

    def special_text_in(self, value: Any) -> str | None:
        """The first special-token text in any string of `value` (JSON-like, map keys included); None if none."""
        if not self.enabled:
            return None
        found: list[str] = []

        def note(text: str) -> str:
            match = self._pattern.search(text)
            if match is not None and not found:
                found.append(match.group(0))
            return text

        _map_strings(value, note)
        return found[0] if found else None

    def encode(self, rendered: str, literals: list[str]) -> list[int]:
        """Token ids of a prompt rendered from `protect`ed messages (see the module's example)."""
        pieces = _MARK.split(rendered)  # text, index, text, index, ..., text
        indices = [int(index) for index in pieces[1::2]]
        if sorted(indices) != list(range(len(literals))):
            raise ValueError("messages: a message holds special-token text, and this model's chat template does "
                             "not pass message text through unchanged, so it cannot be kept as text")
        ids: list[int] = []
        for position, piece in enumerate(pieces):
            if position % 2 == 1:
                ids.extend(self._literal_encoder().encode(literals[int(piece)], add_special_tokens=False).ids)
            elif piece:
                ids.extend(self._backend.encode(piece, add_special_tokens=False).ids)
        return ids

    def _literal_encoder(self) -> Any:
        with self._lock:  # built once, on first need (a copy of the vocabulary: ~100 ms)
            if self._literal is None:
                from tokenizers import Tokenizer

                literal = Tokenizer.from_str(self._backend.to_str())
                literal.encode_special_tokens = True
                self._literal = literal
        return self._literal


def _special_texts(backend: Any | None) -> list[str]:
    if backend is None:
        return []
    return [token.content for token in backend.get_added_tokens_decoder().values() if token.special and token.content]


def _map_texts(message: dict[str, Any], hide: Callable[[str], str]) -> dict[str, Any]:
    """The message with `hide` applied to its role and to its content (a string or text parts)."""
    out = dict(message)
    if isinstance(out.get("role"), str):
        out["role"] = hide(out["role"])
    content = out.get("content")
    if isinstance(content, str):
        out["content"] = hide(content)
    elif isinstance(content, list):
        out["content"] = [{**part, "text": hide(part["text"])} if isinstance(part.get("text"), str) else part
                          for part in content]
    return out


def _map_strings(value: Any, hide: Callable[[str], str]) -> Any:
    """`value` (JSON-like) with `hide` applied to every string in it, map keys included."""
    if isinstance(value, str):
        return hide(value)
    if isinstance(value, list):
        return [_map_strings(item, hide) for item in value]
    if isinstance(value, dict):
        return {_map_strings(key, hide): _map_strings(item, hide) for key, item in value.items()}
    return value
