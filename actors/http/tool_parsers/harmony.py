"""gpt-oss (`--tool-call-parser openai`, vLLM's name): each call is a harmony message to a function,
`to=functions.NAME` in its header and the arguments' JSON as its body.

Example: 'Checking.<|start|>assistant<|channel|>commentary to=functions.weather <|constrain|>json<|message|>
{"city": "Oslo"}<|call|>' -> content 'Checking.', one call weather({"city": "Oslo"}).

The markers are special tokens: this parser reads the content `--reasoning-parser gpt_oss` leaves,
which keeps a call's message whole, markers and all (actors/http/reasoning/harmony.py), and whose
requests keep special tokens in the text. A call's end (`<|call|>`) is a stop token, so it is usually
cut off: the body then runs to the text's end. A message that is not to a function, or whose body is
not a JSON object, stays content.
"""

from __future__ import annotations

import json
import re

from actors.http.tool_parsers.base import ParsedToolCalls, ToolCall, content_or_none, marker_start

OPENERS = ("<|start|>", "<|channel|>")
# header (markers allowed: <|channel|>, <|constrain|>), <|message|>, body, then an end, the next
# message's opener, or the text's end
_MESSAGE = re.compile(r"(?:<\|start\|>|<\|channel\|>)((?:[^<]|<\|(?:channel|constrain)\|>)*)<\|message\|>"
                      r"(.*?)(<\|call\|>|<\|end\|>|<\|return\|>|(?=<\|start\|>|<\|channel\|>)|$)", re.DOTALL)
_RECIPIENT = re.compile(r"\bto=functions\.([^\s<]+)")


def parse_openai(text: str) -> ParsedToolCalls:
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _MESSAGE.finditer(text):
        call = _call_in(match)
        if call is None:
            continue  # not a call after all: it stays in the content
        kept.append(text[position:match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    return ParsedToolCalls(content_or_none("".join(kept)) if calls else content_or_none(text), calls)


def sendable_openai(text: str) -> int:
    found = _call_start(text)
    return found if text[:found].strip() else 0


def settled_openai(text: str) -> ParsedToolCalls:
    """Streaming: the calls whose message has ended so far and the content before the next possible
    call. A message ended by the text's end may still grow (its JSON is not whole yet), so it waits."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = closed_end = 0
    for match in _MESSAGE.finditer(text):
        if not match[3] and match.end() == len(text):
            break  # ended by the text's end
        closed_end = match.end()
        call = _call_in(match)
        if call is not None:
            kept.append(text[position:match.start()])
            position = match.end()
            calls.append(call)
    tail = text[closed_end:]
    kept.append(text[position:closed_end] + tail[:_call_start(tail)])
    content = "".join(kept)
    return ParsedToolCalls(content if content.strip() else "", calls)


def _call_start(text: str) -> int:
    """Where a call may begin in `text`: its first opener, a tail that may grow into one, or the end."""
    return min(marker_start(text, opener) for opener in OPENERS)


def _call_in(match: re.Match[str]) -> ToolCall | None:
    recipient = _RECIPIENT.search(match[1])
    if recipient is None:
        return None
    try:
        arguments = json.loads(match[2])
    except (json.JSONDecodeError, RecursionError):  # nested past the decoder's depth: not a call either
        return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(recipient[1], json.dumps(arguments, ensure_ascii=False))
