"""Anthropic's `system` and `messages` -> wire chat messages (queue_adapters/chat_message.py) and image bytes.

    system "Be brief." (or [{"type": "text", "text": "Be brief."}])   -> ChatMessage(system, "Be brief.")
    {"role": "user", "content": [{"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO..."}}]}
                                                   -> ChatMessage(user, [TextPart, ImagePart]) + the bytes
    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}]}
                          -> ChatMessage(assistant, "Let me look.", tool_calls=[toolu_1: weather({"city": "Oslo"})])
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}]}
                                                   -> ChatMessage(tool, "Sunny", tool_call_id="toolu_1")

A tool result becomes a `tool` message, as in an OpenAI conversation, so chat templates render it as
they render OpenAI's. Images travel as openai/content_parts.py's do: decoded here, each an ImagePart
slot plus its bytes, in order; an image URL other than a base64 data: URI is not fetched. Earlier
turns' `thinking` blocks are dropped, as Anthropic's API drops them for most models: the answer's own
reasoning is not fed back (and this server's carry no signature to check). A last assistant turn
(Anthropic's prefill, which the answer continues) is refused: a worker's template always opens a new turn.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.request.tools import MAX_NAME_CHARS, MAX_TOOL_CALLS, arguments_object
from queue_adapters.chat_message import ChatMessage, ImagePart, TextPart, WireFunctionCall, WireToolCall
from queue_adapters.data_uri import decode_data_uri

Part = TextPart | ImagePart
_EXTRAS = {"cache_control", "citations"}  # prompt-caching hints and citations: accepted, no effect here
_BLOCK_FIELDS = {"text": {"type", "text"}, "image": {"type", "source"},
                 "tool_use": {"type", "id", "name", "input"},
                 "tool_result": {"type", "tool_use_id", "content", "is_error"}}
_DROPPED = ("thinking", "redacted_thinking")


def parse_conversation(system: Any, messages: Any, images: list[bytes]) -> list[ChatMessage]:
    """The system prompt (when given) and the messages, in order; ValueError naming the field."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    if isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
        # Anthropic continues such a turn; the worker's template always opens a new one
        raise ValueError("messages: the last message must be the user's (continuing an assistant prefill "
                         "is not supported)")
    conversation = [] if system is None else [ChatMessage(role="system", content=_system_text(system))]
    for index, message in enumerate(messages):
        conversation += _parse_message(message, f"messages[{index}]", images)
    return conversation


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise ValueError("system must be a string or a list of text blocks")
    return "\n".join(_text(block, f"system[{index}]") for index, block in enumerate(system))


def _parse_message(message: Any, where: str, images: list[bytes]) -> list[ChatMessage]:
    if not isinstance(message, dict) or set(message) - {"role", "content"}:
        raise ValueError(f"{where} must be an object with role and content (only)")
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise ValueError(f"{where}.role must be \"user\" or \"assistant\", got {role!r} (the system prompt is "
                         "the top-level system field)")
    if isinstance(content, str):
        return [ChatMessage(role=role, content=content)]
    if not isinstance(content, list) or not content:
        raise ValueError(f"{where}.content must be a string or a non-empty list of content blocks")
    blocks = [(block, f"{where}.content[{index}]") for index, block in enumerate(content)
              if not (isinstance(block, dict) and block.get("type") in _DROPPED)]
    if role == "assistant":
        return [_assistant_turn(blocks, where)]
    return _user_turn(blocks, images)


def _user_turn(blocks: list[tuple[Any, str]], images: list[bytes]) -> list[ChatMessage]:
    """Text and images as user messages, each tool result as a `tool` message, in the blocks' order."""
    turn: list[ChatMessage] = []
    parts: list[Part] = []
    for block, where in blocks:
        kind = _kind(block, where, ("text", "image", "tool_result"))
        if kind == "tool_result":
            if parts:
                turn.append(ChatMessage(role="user", content=parts))
                parts = []
            turn.append(_tool_result(block, where, images))
        else:
            parts.append(_part(block, where, images))
    if parts or not turn:
        turn.append(ChatMessage(role="user", content=parts or ""))
    return turn


def _assistant_turn(blocks: list[tuple[Any, str]], where: str) -> ChatMessage:
    texts, calls = [], []
    for block, at in blocks:
        if _kind(block, at, ("text", "tool_use")) == "text":
            texts.append(_text(block, at))
        else:
            calls.append(_tool_call(block, at))
    if len(calls) > MAX_TOOL_CALLS:
        raise ValueError(f"{where}.content may hold at most {MAX_TOOL_CALLS} tool_use blocks, got {len(calls)}")
    return ChatMessage(role="assistant", content="\n".join(texts), tool_calls=calls or None)


def _kind(block: Any, where: str, allowed: tuple[str, ...]) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind not in allowed:
        raise ValueError(f"{where}.type must be one of {', '.join(allowed)} here, got {kind!r}")
    # null is "not given": an SDK's dumped block carries its unset fields (a tool_use's caller) as null
    unknown = sorted(key for key, value in block.items()
                     if key not in _BLOCK_FIELDS[kind] and key not in _EXTRAS and value is not None)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    return kind


def _text(block: Any, where: str) -> str:
    _kind(block, where, ("text",))
    if not isinstance(block.get("text"), str):
        raise ValueError(f"{where}.text must be a string")
    return block["text"]


def _part(block: dict[str, Any], where: str, images: list[bytes]) -> Part:
    if block["type"] == "text":
        return TextPart(text=_text(block, where))
    images.append(_image_bytes(block.get("source"), f"{where}.source"))
    return ImagePart()


def _image_bytes(source: Any, where: str) -> bytes:
    """{type: base64, media_type, data} or {type: url, url: a data: URI}."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and set(source) == {"type", "media_type", "data"}:
        media_type, data = source["media_type"], source["data"]
        if not isinstance(media_type, str) or not isinstance(data, str):
            raise ValueError(f"{where}.media_type and {where}.data must be strings")
        return decode_data_uri(f"data:{media_type};base64,{data}", f"{where}.data")
    if kind == "url" and set(source) == {"type", "url"} and isinstance(source["url"], str):
        return decode_data_uri(source["url"], f"{where}.url")
    raise ValueError(f"{where} must be {{type: base64, media_type, data}} or {{type: url, url}}")


def _tool_call(block: dict[str, Any], where: str) -> WireToolCall:
    _check_name(block.get("id"), f"{where}.id")
    _check_name(block.get("name"), f"{where}.name")
    if not isinstance(block.get("input"), dict):
        raise ValueError(f"{where}.input must be an object")
    arguments = json.dumps(block["input"], ensure_ascii=False)
    arguments_object(arguments, f"{where}.input")  # bounded, plain values
    return WireToolCall(id=block["id"], function=WireFunctionCall(block["name"], arguments))


def _tool_result(block: dict[str, Any], where: str, images: list[bytes]) -> ChatMessage:
    _check_name(block.get("tool_use_id"), f"{where}.tool_use_id")
    if not isinstance(block.get("is_error", False), bool | None):
        raise ValueError(f"{where}.is_error must be true or false")
    content = block.get("content")
    if content is None or isinstance(content, str):
        return ChatMessage(role="tool", content=content or "", tool_call_id=block["tool_use_id"])
    if not isinstance(content, list) or not content:
        raise ValueError(f"{where}.content must be a string or a non-empty list of text and image blocks")
    parts = []
    for index, item in enumerate(content):
        at = f"{where}.content[{index}]"
        _kind(item, at, ("text", "image"))
        parts.append(_part(item, at, images))
    return ChatMessage(role="tool", content=parts, tool_call_id=block["tool_use_id"])


def _check_name(value: Any, where: str) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_CHARS:
        raise ValueError(f"{where} must be a string of 1 to {MAX_NAME_CHARS} characters")
