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
)

MARKER = "<tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> ParsedToolCalls:
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _CALL.finditer(text):
        try:
            call = call_from_json(json.loads(match.group(1)))
        except json.JSONDecodeError:
            call = None
        if call is None:
            continue  # not a call after all: it stays in the content
        kept.append(text[position:match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    return ParsedToolCalls(content_or_none("".join(kept)) if calls else content_or_none(text), calls)


def sendable_hermes(text: str) -> int:
    return before_marker(text, MARKER)
