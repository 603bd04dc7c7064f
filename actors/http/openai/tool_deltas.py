"""A tool answer's events (actors/http/tool_parsers/events.py) as chat chunk deltas, in OpenAI's shape:

    {"content": "Sure."}                                                 content as it comes
    {"tool_calls": [{"index": 0, "id": "call_...", "type": "function",
                     "function": {"name": "weather", "arguments": ""}}]}  a call opens
    {"tool_calls": [{"index": 0, "function": {"arguments": "{\"ci"}}]}   its arguments, piece by piece

One reply entry may make several deltas: a new one starts after each call's opening, so no delta names
a call twice (the openai SDK's stream accumulator takes the first `tool_calls` list it sees as it is).
"""

from __future__ import annotations

from typing import Any

from actors.http.tool_parsers.events import CallArguments, CallOpened, ContentText, ToolEvent


def chat_deltas(events: list[ToolEvent]) -> list[dict[str, Any]]:
    """The deltas of one reply entry's events (at least one, maybe empty)."""
    deltas: list[dict[str, Any]] = [{}]
    for event in events:
        delta = deltas[-1]
        if isinstance(event, ContentText):
            delta["content"] = delta.get("content", "") + event.text
        elif isinstance(event, CallOpened):
            delta.setdefault("tool_calls", []).append(
                {"index": event.index, "id": event.id, "type": "function",
                 "function": {"name": event.name, "arguments": ""}})
            deltas.append({})
        elif isinstance(event, CallArguments):
            _add_arguments(delta.setdefault("tool_calls", []), event)
    return deltas


def _add_arguments(calls: list[dict[str, Any]], event: CallArguments) -> None:
    if calls and calls[-1]["index"] == event.index:
        calls[-1]["function"]["arguments"] += event.text
    else:
        calls.append({"index": event.index, "function": {"arguments": event.text}})
