"""Mistral: `[TOOL_CALLS]` followed by a JSON list of {"name", "arguments"} objects. Call ids are 9
letters and digits: Mistral's chat templates refuse any other id when the conversation comes back.

Example: 'Sure.[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]' -> content 'Sure.',
one call.
"""

from __future__ import annotations

import secrets
import string

from actors.http.tool_parsers.base import (
    ParsedToolCalls,
    before_marker,
    call_from_json,
    content_or_none,
    json_values,
    nothing_settled,
)

MARKER = "[TOOL_CALLS]"
_ID_CHARACTERS = string.ascii_letters + string.digits


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
    found_calls = [call for call in calls if call is not None]
    for call in found_calls:
        call.id = "".join(secrets.choice(_ID_CHARACTERS) for _ in range(9))
    return ParsedToolCalls(content_or_none(before), found_calls)


def sendable_mistral(text: str) -> int:
    return before_marker(text, MARKER)


def settled_mistral(text: str) -> ParsedToolCalls:
    """Streaming: the calls are all or none of the list's items (one that is not a call, or another
    JSON value after the list, makes the whole text content), so they are settled only once text that
    cannot continue the JSON values follows them; until then, the content before the marker."""
    _, marker, after = text.partition(MARKER)
    try:
        found = json_values(after.strip()) if marker else None
    except RecursionError:
        found = None
    if found is None or found[1].lstrip(" \t\r\n;,")[:1] in ("", "[", "{"):
        return nothing_settled(text, sendable_mistral(text))
    parsed = parse_mistral(text)
    if parsed.calls:
        return ParsedToolCalls(parsed.content or "", parsed.calls)
    return nothing_settled(text, len(text) if text.strip() else 0)  # content, whatever follows
