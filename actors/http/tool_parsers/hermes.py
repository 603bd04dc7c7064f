"""Hermes (NousResearch) and Qwen 2.5+: each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Example: 'Let me check.<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
-> content 'Let me check.', one call weather({"city": "Oslo"}).
"""

from __future__ import annotations

import json
import re

from actors.http.tool_parsers.base import (
    ParsedToolCalls,
    ToolCall,
    before_marker,
    call_from_json,
    content_or_none,
    marker_start,
)

MARKER = "<tool_call>"
_END = "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> ParsedToolCalls:
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _CALL.finditer(text):
        call = _call_in(match.group(1))
        if call is None:
            continue  # not a call after all: it stays in the content
        kept.append(text[position:match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    return ParsedToolCalls(content_or_none("".join(kept)) if calls else content_or_none(text), calls)


def sendable_hermes(text: str) -> int:
    return before_marker(text, MARKER)


def settled_hermes(text: str) -> ParsedToolCalls:
    """Streaming: the calls closed by `</tool_call>` so far and the content before the next possible call.
    A closed call is final whatever follows (each is parsed on its own), so it can go out at once;
    one still open may turn out malformed (then it is content), so it waits for its end."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = closed_end = 0
    for match in _CALL.finditer(text):
        if not match.group(0).endswith(_END):
            break  # ended by the text's end: it may still close or break
        closed_end = match.end()
        call = _call_in(match.group(1))
        if call is not None:
            kept.append(text[position:match.start()])
            position = match.end()
            calls.append(call)
    tail = text[closed_end:]
    kept.append(text[position:closed_end] + tail[:marker_start(tail, MARKER)])
    content = "".join(kept)
    return ParsedToolCalls(content if content.strip() else "", calls)


def _call_in(body: str) -> ToolCall | None:
    try:
        return call_from_json(json.loads(body))
    except (json.JSONDecodeError, RecursionError):  # nested past the decoder's depth: not a call either
        return None
