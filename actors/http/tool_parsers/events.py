"""What a tool answer's text becomes, piece by piece as it comes, in no protocol's shape: content, a call
opened (its name and id), its arguments' next characters, the call closed (its arguments are whole).

OpenAI's chat chunks (actors/http/openai/tool_deltas.py), Anthropic's content blocks and the Responses
output items each map these events onto their own shapes, and the whole answer is the same events
collected (`collect`), so a streamed answer equals the non-streamed one by construction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from actors.http.tool_parsers.base import ParsedToolCalls, ToolCall


@dataclass(frozen=True, slots=True)
class ContentText:
    text: str


@dataclass(frozen=True, slots=True)
class CallOpened:
    name: str
    id: str
    index: int = 0  # the call's place in the answer (set by stream.py)


@dataclass(frozen=True, slots=True)
class CallArguments:
    text: str  # the next characters of the call's arguments (a JSON object's text, as generated)
    index: int = 0


@dataclass(frozen=True, slots=True)
class CallClosed:
    """The call's arguments are whole; a call still open when the answer ends was cut short."""

    index: int = 0


ToolEvent = ContentText | CallOpened | CallArguments | CallClosed


def collect(events: Iterable[ToolEvent]) -> ParsedToolCalls:
    """A whole answer from its events: the content joined (None when there is none) and the calls."""
    content: list[str] = []
    calls: list[ToolCall] = []
    for event in events:
        if isinstance(event, ContentText):
            content.append(event.text)
        elif isinstance(event, CallOpened):
            calls.append(ToolCall(event.name, "", event.id))
        elif isinstance(event, CallArguments):
            calls[event.index].arguments += event.text
    return ParsedToolCalls("".join(content) or None, calls)
