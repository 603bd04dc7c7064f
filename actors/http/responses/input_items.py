"""A Responses body's `input` -> its items, each as OpenAI lists them (GET .../input_items) and with an id:

    "Hello"  ->  [{"id": "msg_...", "type": "message", "role": "user", "status": "completed",
                   "content": [{"type": "input_text", "text": "Hello"}]}]
    {"role": "assistant", "content": "Hi"}      -> a message with an output_text part
    {"type": "function_call", "call_id", "name", "arguments"}            -> as given, with "fc_..."
    {"type": "function_call_output", "call_id", "output"}                -> as given, with "fco_..."
    {"type": "reasoning", ...}                                           -> kept, not rendered

An item's own fields are strict (a null counts as not given), so a typo is a 400 naming it; the ids
and statuses a client sends back from an earlier response's output are kept. Images and files are
not taken yet.
"""

from __future__ import annotations

import uuid
from typing import Any

from pipeline.request.tools import MAX_NAME_CHARS, arguments_object

ROLES = ("user", "system", "developer", "assistant")
_FIELDS = {"message": {"type", "role", "content", "id", "status", "phase"},
           "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
           "function_call_output": {"type", "call_id", "output", "id", "status"},
           "reasoning": {"type", "id", "summary", "content", "encrypted_content", "status"}}
_ID_PREFIX = {"function_call": "fc", "function_call_output": "fco"}
_PART_FIELDS = {"input_text": {"type", "text"}, "output_text": {"type", "text", "annotations", "logprobs"},
                "refusal": {"type", "refusal"}}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def input_items(value: Any) -> list[dict[str, Any]]:
    """`input` as items; ValueError naming the field."""
    if isinstance(value, str):
        return [_message({"role": "user", "content": value}, "input")]
    if not isinstance(value, list) or not value:
        raise ValueError("input must be a string or a non-empty list of items")
    return [_item(item, f"input[{index}]") for index, item in enumerate(value)]


def _item(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be an object (a message or a function_call / function_call_output item)")
    item = {key: value for key, value in item.items() if value is not None}
    kind = item.get("type", "message")  # OpenAI's "easy" messages have no type
    if kind not in _FIELDS:
        raise ValueError(f"{where}.type {kind!r} is not supported (message, function_call, function_call_output, "
                         "reasoning)")
    unknown = sorted(set(item) - _FIELDS[kind])
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} for a {kind} item")
    _check_id(item.get("id"), f"{where}.id")
    if kind == "message":
        return _message(item, where)
    if kind == "reasoning":
        return {"id": new_id("rs"), **item}
    return _tool_item(kind, item, where)


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role, content = item.get("role"), item.get("content")
    if role not in ROLES:
        raise ValueError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
    kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        parts = [_text_part(kind, content)]
    elif isinstance(content, list) and content:
        parts = [_text_part(kind, _part_text(part, f"{where}.content[{index}]")) for index, part in enumerate(content)]
    else:
        raise ValueError(f"{where}.content must be a string or a non-empty list of input_text parts")
    return {"id": item.get("id") or new_id("msg"), "type": "message", "role": role, "content": parts,
            "status": "completed"}


def _text_part(kind: str, text: str) -> dict[str, Any]:
    return {"type": kind, "text": text, **({"annotations": []} if kind == "output_text" else {})}


def _part_text(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in _PART_FIELDS:
        raise ValueError(f"{where}.type must be input_text, output_text or refusal, got {kind!r} (images and files "
                         "are not supported yet)")
    unknown = sorted(key for key, value in part.items() if key not in _PART_FIELDS[kind] and value is not None)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    text = part.get("refusal" if kind == "refusal" else "text")
    if not isinstance(text, str):
        raise ValueError(f"{where}.{'refusal' if kind == 'refusal' else 'text'} must be a string")
    return text


def _tool_item(kind: str, item: dict[str, Any], where: str) -> dict[str, Any]:
    _check_name(item.get("call_id"), f"{where}.call_id")
    if kind == "function_call":
        _check_name(item.get("name"), f"{where}.name")
        if not isinstance(item.get("arguments"), str):
            raise ValueError(f"{where}.arguments must be a string (the text of a JSON object)")
        arguments_object(item["arguments"], f"{where}.arguments")
    else:
        item["output"] = _output_text(item.get("output"), f"{where}.output")
    return {"id": item.get("id") or new_id(_ID_PREFIX[kind]), **item, "status": "completed"}


def _output_text(output: Any, where: str) -> str:
    """A function's result: a string, or a list of text parts (joined)."""
    if isinstance(output, str):
        return output
    if isinstance(output, list) and output:
        return "".join(_part_text(part, f"{where}[{index}]") for index, part in enumerate(output))
    raise ValueError(f"{where} must be a string or a list of input_text parts")


def _check_id(value: Any, where: str) -> None:
    if value is not None:
        _check_name(value, where)


def _check_name(value: Any, where: str) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_CHARS:
        raise ValueError(f"{where} must be a string of 1 to {MAX_NAME_CHARS} characters")
