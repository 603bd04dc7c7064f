"""A tool call as the protocols send it, and an answer's content and calls."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as generated (OpenAI sends it as a string)
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
