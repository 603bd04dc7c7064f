"""Hermes (NousResearch) and Qwen 2.5+: each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Example: 'Let me check.<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
-> content 'Let me check.', one call weather('{"city": "Oslo"}').

A call is one from its head on (`<tool_call>{"name": "weather", "arguments": {"`); its arguments are the
object as written, up to its closing brace (or, JSON that never closes, up to `</tool_call>`); the rest
of the call's object and `</tool_call>` belong to the call. A region whose head is not a call's stays
content.
"""

from __future__ import annotations

from actors.http.tool_parsers.scanner import Scanner

MARKER = "<tool_call>"
_END = "</tool_call>"


class HermesScanner(Scanner):
    openers = (MARKER,)
    argument_ends = (_END, MARKER)
    closers = (_END,)
