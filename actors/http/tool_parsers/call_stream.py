"""A constrained tool answer streamed as tool-call deltas, as OpenAI and vLLM stream them.

- a named function: the first piece of text opens the call (id, name, the first characters of its
  arguments), each later piece adds to `arguments`;
- `required`: each call goes out whole as soon as its list item is complete (tool_choice.py's
  `complete_items`), with its own index.
The deltas add up to the non-streamed answer's calls (the same parse of the same text), and an answer
cut before its first call ends as content, as the non-streamed one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actors.http.tool_parsers.base import ToolCall, new_call_id
from actors.http.tool_parsers.tool_choice import ToolChoice, complete_items, required_call


@dataclass(slots=True)
class CallStream:
    choice: ToolChoice  # required or named
    text: str = ""
    num_calls_sent: int = 0
    scanned: int = 0  # required: where the next list item begins in `text`
    call_id: str = field(default_factory=new_call_id)  # named: its one call's id

    def feed(self, piece: str) -> list[dict[str, Any]]:
        """The tool-call deltas `piece`, the answer's next text, completes."""
        self.text += piece
        if self.choice.mode == "named":
            return self._named(piece)
        return self._required()

    def finish(self) -> tuple[list[dict[str, Any]], str | None]:
        """The last deltas and the content left, once the answer has ended."""
        if self.choice.mode == "named":
            return (self._named("") if self.num_calls_sent == 0 else []), None
        return [], (self.text or None) if self.num_calls_sent == 0 else None

    def _named(self, piece: str) -> list[dict[str, Any]]:
        if self.num_calls_sent:
            return [{"index": 0, "function": {"arguments": piece}}] if piece else []
        self.num_calls_sent = 1
        assert self.choice.function is not None
        return [ToolCall(self.choice.function, piece, self.call_id).as_openai(0)]

    def _required(self) -> list[dict[str, Any]]:
        try:
            items, self.scanned = complete_items(self.text, self.scanned)
            calls = [required_call(item) for item in items]
        except (RecursionError, KeyError, TypeError):  # not the constraint's shape: the end parses it as text
            return []
        deltas = [call.as_openai(self.num_calls_sent + offset) for offset, call in enumerate(calls)]
        self.num_calls_sent += len(calls)
        return deltas
