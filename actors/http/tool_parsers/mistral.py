"""Mistral: `[TOOL_CALLS]` followed by a JSON list of {"name", "arguments"} objects.

Example: 'Sure.[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]' -> content 'Sure.',
one call.
"""

from __future__ import annotations

from actors.http.tool_parsers.base import (
    ParsedToolCalls,
    before_marker,
    call_from_json,
    content_or_none,
    json_values,
)

MARKER = "[TOOL_CALLS]"


def parse_mistral(text: str) -> ParsedToolCalls:
    if MARKER not in text:
        return ParsedToolCalls(content_or_none(text), [])
    before, _, after = text.partition(MARKER)
    found = json_values(after.strip())
    if found is None:
        return ParsedToolCalls(content_or_none(text), [])
    values, _ = found
    items = values[0] if len(values) == 1 and isinstance(values[0], list) else values
    calls = [call_from_json(item) for item in items]
    if not calls or any(call is None for call in calls):
        return ParsedToolCalls(content_or_none(text), [])
    return ParsedToolCalls(content_or_none(before), [call for call in calls if call is not None])


def sendable_mistral(text: str) -> int:
    return before_marker(text, MARKER)
