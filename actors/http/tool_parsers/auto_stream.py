"""A `tool_choice: auto` answer streamed as OpenAI's tool-call deltas while it is generated.

After each piece of text the parser's `settled` says which content and calls no continuation can
change; what is new of them goes out at once, each call whole with its index. At the end the whole
text is parsed as the non-streamed answer is and the rest goes out, so the streamed message equals
the non-streamed one. Calls settle whole, not argument by argument: until a call's text is complete it
may still turn out malformed (then it is content), and its arguments are sent re-serialised
(base.call_from_json), which is only known once they are complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from actors.http.tool_parsers.base import ToolCall
from actors.http.tool_parsers.plan import ToolPlan

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class AutoStream:
    plan: ToolPlan  # tool_choice auto, with its parser
    text: str = ""
    content_sent: str = ""
    calls_sent: list[ToolCall] = field(default_factory=list)

    def feed(self, piece: str) -> tuple[str, list[dict[str, Any]]]:
        """(the content, the tool-call deltas) that `piece`, the answer's next text, settles."""
        self.text += piece
        settled = self.plan.settled(self.text)
        return self._news(settled.content or "", settled.calls)

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """The rest of the content and calls, once the answer has ended."""
        parsed = self.plan.calls(self.text)
        content = parsed.content or ""
        sent = [(call.name, call.arguments) for call in self.calls_sent]
        if not content.startswith(self.content_sent) or sent != [
                (call.name, call.arguments) for call in parsed.calls[:len(sent)]]:
            log.warning("streamed tool answer is not a prefix of the parsed one", text_length=len(self.text))
        return self._news(content, parsed.calls)

    def _news(self, content: str, calls: list[ToolCall]) -> tuple[str, list[dict[str, Any]]]:
        new_content = content[len(self.content_sent):]
        self.content_sent += new_content
        first = len(self.calls_sent)
        self.calls_sent += calls[first:]
        return new_content, [call.as_openai(first + offset) for offset, call in enumerate(calls[first:])]
