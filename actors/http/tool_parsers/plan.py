"""What the gateway makes of a chat answer when the request has tools: `tool_calls`, and how much of
a streamed answer may go out as content before the end.

- `auto`: the server's parser (--tool-call-parser) reads the calls out of the model's own format;
  while streaming, text that may still become a call is held back until the parser is sure of it
  (each call then goes out whole: auto_stream.py), or until the answer ends.
- `required` / a named function: the answer was generated under tool_choice.py's constraint, so it
  is the call(s); streamed as tool-call deltas (call_stream.py).

Either way the streamed message equals the non-streamed one: both come from the same parse of the
whole text, and the content streamed early is a prefix of the parsed content (each parser's
`sendable` promises that).
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.http.tool_parsers import PARSERS, SENDABLE, SETTLED
from actors.http.tool_parsers.base import ParsedToolCalls, content_or_none
from actors.http.tool_parsers.tool_choice import ToolChoice, calls_from_constrained


@dataclass(frozen=True, slots=True)
class ToolPlan:
    choice: ToolChoice  # auto, required or named (none has no plan)
    parser: str | None  # auto's: a key of PARSERS
    parallel: bool = True  # parallel_tool_calls: false keeps the first call only

    def calls(self, text: str) -> ParsedToolCalls:
        """The calls in a whole answer. JSON nested past the decoder's depth (a client can force such
        text), or a constrained answer of another shape than the constraint's, is not a call."""
        try:
            parsed = self._parse(text)
        except (RecursionError, KeyError, TypeError):
            return ParsedToolCalls(content_or_none(text), [])
        if not self.parallel:
            parsed.calls = parsed.calls[:1]
        return parsed

    def _parse(self, text: str) -> ParsedToolCalls:
        if self.choice.mode == "auto":
            assert self.parser is not None
            return PARSERS[self.parser](text)
        return calls_from_constrained(self.choice, text)

    def sendable(self, text: str) -> int:
        """How many leading characters of the text so far are content whatever follows."""
        if self.choice.mode != "auto":
            return 0
        assert self.parser is not None
        return SENDABLE[self.parser](text)

    def settled(self, text: str) -> ParsedToolCalls:
        """auto, streaming: the content and calls of the text so far that no continuation changes."""
        assert self.choice.mode == "auto" and self.parser is not None
        try:
            settled = SETTLED[self.parser](text)
        except (RecursionError, KeyError, TypeError):  # as in `calls`: not a call (yet)
            return ParsedToolCalls("", [])
        if not self.parallel:
            settled.calls = settled.calls[:1]
        return settled

    @staticmethod
    def finish_reason(finish_reason: str | None) -> str | None:
        """An answer that ended by itself with calls in it finished to call them."""
        return "tool_calls" if finish_reason == "stop" else finish_reason
