"""What every tool-call parser returns, and the JSON helpers they share."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it (a string)
    id: str = field(default_factory=new_call_id)

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {"id": self.id, "type": "function",
                                "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            call["index"] = index
        return call


@dataclass(slots=True)
class ParsedToolCalls:
    content: str | None  # text outside the calls; None when there is none
    calls: list[ToolCall]


def call_from_json(value: Any, arguments_key: str = "arguments") -> ToolCall | None:
    """{"name": ..., "arguments" (or "parameters"): {...}} -> a ToolCall; None for any other shape."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get(arguments_key, value.get("parameters", value.get("arguments", {})))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string already
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def json_values(text: str) -> tuple[list[Any], str] | None:
    """Consecutive JSON values at the start of `text` (separated by whitespace or ';'), and the rest;
    None if the text does not start with one."""
    decoder = json.JSONDecoder()
    values, position = [], 0
    while True:
        while position < len(text) and text[position] in " \t\r\n;,":
            position += 1
        if position >= len(text) or text[position] not in "[{":
            break
        try:
            value, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            break
        values.append(value)
    return (values, text[position:]) if values else None


def content_or_none(text: str) -> str | None:
    return text if text.strip() else None


def marker_start(text: str, marker: str) -> int:
    """Where a call that starts with `marker` may begin in `text`: its first occurrence, or a tail
    that could grow into it, or the end."""
    found = text.find(marker)
    if found >= 0:
        return found
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return len(text) - length
    return len(text)


def before_marker(text: str, marker: str) -> int:
    """Streaming: the characters of `text` before a call that starts with `marker` may begin. Leading
    whitespace only counts once something else follows (a parser drops content that is only whitespace)."""
    found = marker_start(text, marker)
    return found if text[:found].strip() else 0


def nothing_settled(text: str, sendable: int) -> ParsedToolCalls:
    """What a streamed answer has settled while only its first `sendable` characters are sure content."""
    return ParsedToolCalls(text[:sendable], [])
