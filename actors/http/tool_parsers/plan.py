"""What the gateway makes of a chat answer when the request has tools: its content and `tool_calls`,
streamed (as events, stream.py) and whole (the same events collected).

- `auto`: the server's parser (--tool-call-parser) reads the calls out of the model's own format;
- `required` / a named function: the answer was generated under tool_choice.py's constraint, so it is
  the call(s) (constrained.py).

Either way a call is one from its head on and its arguments stream as they are generated; only text
that may still be a marker (or a call's head) is held. The whole answer is the streamed events
collected, so the streamed message equals the non-streamed one, and the concatenated argument
fragments are the whole answer's arguments exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.http.tool_parsers import PARSERS
from actors.http.tool_parsers.base import ParsedToolCalls
from actors.http.tool_parsers.constrained import NamedScanner, RequiredScanner
from actors.http.tool_parsers.events import collect
from actors.http.tool_parsers.scanner import Scanner
from actors.http.tool_parsers.stream import ToolStream
from actors.http.tool_parsers.tool_choice import ToolChoice


@dataclass(frozen=True, slots=True)
class ToolPlan:
    choice: ToolChoice  # auto, required or named (none has no plan)
    parser: str | None  # auto's: a key of PARSERS
    parallel: bool = True  # parallel_tool_calls: false keeps the first call only

    def stream(self) -> ToolStream:
        """A new answer's events, as its text comes."""
        return ToolStream(self._scanner(), self.parallel)

    def calls(self, text: str) -> ParsedToolCalls:
        """The content and calls of a whole answer."""
        stream = self.stream()
        return collect([*stream.feed(text), *stream.finish()])

    def _scanner(self) -> Scanner:
        if self.choice.mode == "auto":
            assert self.parser is not None
            return PARSERS[self.parser]()
        if self.choice.mode == "named":
            assert self.choice.function is not None
            return NamedScanner(self.choice.function)
        return RequiredScanner()

    @staticmethod
    def finish_reason(finish_reason: str | None) -> str | None:
        """An answer that ended by itself with calls in it finished to call them."""
        return "tool_calls" if finish_reason == "stop" else finish_reason
