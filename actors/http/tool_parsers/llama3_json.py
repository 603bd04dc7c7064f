"""Llama 3.1+ JSON tool calls: the message is `{"name": ..., "parameters": {...}}` (several separated
by ';'), optionally after the `<|python_tag|>` marker.

Example: '<|python_tag|>{"name": "weather", "parameters": {"city": "Oslo"}}' -> one call, no content.
"""

from __future__ import annotations

from actors.http.tool_parsers.base import (
    ParsedToolCalls,
    before_marker,
    call_from_json,
    content_or_none,
    json_values,
    nothing_settled,
)

_PYTHON_TAG = "<|python_tag|>"


def parse_llama3_json(text: str) -> ParsedToolCalls:
    prefix, tagged, body = text.partition(_PYTHON_TAG)
    if not tagged:
        prefix, body = "", text
    found = json_values(body.strip())
    if found is None:
        return ParsedToolCalls(content_or_none(text), [])
    values, rest = found
    calls = [call_from_json(value, "parameters") for value in values]
    if any(call is None for call in calls) or rest.strip():
        return ParsedToolCalls(content_or_none(text), [])  # JSON, but not (only) calls: plain content
    return ParsedToolCalls(content_or_none(prefix), [call for call in calls if call is not None])


def sendable_llama3_json(text: str) -> int:
    """Nothing while the message may be JSON calls from its start (json_values skips these separators)."""
    rest = text.lstrip(" \t\r\n;,")
    if not rest or rest[0] in "[{":
        return 0
    return before_marker(text, _PYTHON_TAG)


def settled_llama3_json(text: str) -> ParsedToolCalls:
    """Streaming: no call is settled before the answer ends, as any text after the JSON values makes the
    whole message content."""
    return nothing_settled(text, sendable_llama3_json(text))
