"""A chat message on the wire (docs/design.md §3): its content parts (text, an image slot, OpenAI's
image_url part) and an earlier turn's tool calls, as msgspec Structs that validate on decode, and the
message as chat templates take it (queue_adapters/codec.py decodes whole requests).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from pipeline.request.tools import MAX_ARGUMENTS_CHARS, MAX_NAME_CHARS, MAX_TOOL_CALLS


class _Wire(Struct, forbid_unknown_fields=True, kw_only=True):
    """Unknown keys are an error at every level (a typo never silently does nothing)."""


class TextPart(_Wire, tag_field="type", tag="text"):
    text: str


class ImagePart(_Wire, tag_field="type", tag="image"):
    """Where one of the request's `images` goes (in order); the gateway turns image_url parts into these."""


class ImageUrl(_Wire, omit_defaults=True):
    url: str  # a base64 data: URI (queue_adapters/data_uri.py); URLs are not fetched
    detail: Literal["auto"] | None = None  # LLaVA sees one resolution: "low"/"high" would mean nothing


class ImageUrlPart(_Wire, tag_field="type", tag="image_url"):
    """OpenAI's image part, as clients send it to the gateway: one request shape everywhere. A worker
    decodes it into an ImagePart and its bytes before anything else (queue_adapters/wire_images.py)."""

    image_url: ImageUrl


ToolText = Annotated[str, Meta(min_length=1, max_length=MAX_NAME_CHARS)]


class WireFunctionCall(_Wire):
    name: ToolText
    arguments: Annotated[str, Meta(max_length=MAX_ARGUMENTS_CHARS)]  # the text of a JSON object, as OpenAI's


class WireToolCall(_Wire):
    """A call the assistant made earlier in the conversation (OpenAI's `tool_calls` items)."""

    id: ToolText
    function: WireFunctionCall
    type: Literal["function"] = "function"


class ChatMessage(_Wire, omit_defaults=True):
    role: Annotated[str, Meta(min_length=1)]
    content: str | list[TextPart | ImagePart | ImageUrlPart]
    name: Annotated[str, Meta(min_length=1)] | None = None  # the participant's name (OpenAI's `name`)
    tool_calls: Annotated[list[WireToolCall], Meta(min_length=1, max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: ToolText | None = None  # a `tool` message: the call it answers

    def as_dict(self) -> dict[str, Any]:
        """The message as chat templates take it: content a string, or a list of {type, text} parts."""
        named = {"name": self.name} if self.name is not None else {}
        named.update(self._tool_fields())
        if isinstance(self.content, str):
            return {"role": self.role, "content": self.content, **named}
        return {"role": self.role, "content": [{"type": "text", "text": part.text} if isinstance(part, TextPart)
                                               else {"type": "image"} for part in self.content], **named}

    def _tool_fields(self) -> dict[str, Any]:
        """As transformers' chat templates take them: arguments as an object (templates iterate it)."""
        fields: dict[str, Any] = {}
        if self.tool_calls is not None:
            fields["tool_calls"] = [{"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": json.loads(call.function.arguments)}}
                for call in self.tool_calls]
        if self.tool_call_id is not None:
            fields["tool_call_id"] = self.tool_call_id
        return fields


def check_tool_roles(message: ChatMessage, where: str) -> None:
    """tool_calls belong to assistant messages, tool_call_id to tool messages (as OpenAI has them)."""
    if message.tool_calls is not None and message.role != "assistant":
        raise ValueError(f"{where}.tool_calls is only for assistant messages, not {message.role!r}")
    if message.tool_call_id is not None and message.role != "tool":
        raise ValueError(f"{where}.tool_call_id is only for tool messages, not {message.role!r}")
