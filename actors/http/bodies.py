"""HTTP request bodies -> wire requests, through the batch file's parsers (the same fields and checks).

The HTTP-only fields (`stream`, `stream_options`) are taken off first; everything else is the
batch file's body, so a field means the same thing in both places.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from actors.http.chat_request import parse_chat_request
from actors.http.completion_request import parse_completion_body
from actors.http.errors import ApiError, invalid
from actors.http.tool_parsers.plan import ToolPlan
from queue_adapters.codec import CodecError, WireRequest

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass(slots=True)
class GatewayRequest:
    wire: WireRequest
    chat: bool
    stream: bool
    include_usage: bool
    tool_plan: ToolPlan | None = None  # chat with tools: what the answer's text becomes

    @property
    def num_choices(self) -> int:
        return int(self.wire.params.get("n", 1) or 1)


def parse_body(body: Any, chat: bool, model_name: str, request_id: str | None,
               timeout_s: float | None, adapters: list[str] | None = None,
               aliases: tuple[str, ...] = (), tool_parser: str | None = None) -> GatewayRequest:
    """`tool_parser`: --tool-call-parser, when --enable-auto-tool-choice is on."""
    if not isinstance(body, dict):
        raise invalid(f"the body must be a JSON object, got {type(body).__name__}")
    lora = _check_model(body.get("model"), aliases or (model_name,), adapters or [])
    body = dict(body)
    stream = _pop_bool(body, "stream")
    include_usage = _pop_stream_options(body, stream)
    wire_id = _wire_id(request_id, chat)
    prompt_fields, params, tool_plan = _parse(body, chat, tool_parser)
    deadline_ms = int((time.time() + timeout_s) * 1000) if timeout_s else None
    try:
        wire = WireRequest(id=wire_id, params=params, deadline_ms=deadline_ms, lora=lora, **prompt_fields)
    except (CodecError, ValueError, TypeError) as error:
        raise invalid(str(error)) from error
    return GatewayRequest(wire, chat, stream, include_usage, tool_plan)


def _parse(body: dict[str, Any], chat: bool,
           tool_parser: str | None) -> tuple[dict[str, Any], dict[str, Any], ToolPlan | None]:
    try:
        if chat:
            parsed = parse_chat_request(body, tool_parser)
            # A chat answer runs to the end of its turn unless the client caps it (OpenAI's default).
            parsed.params.setdefault("max_tokens", None)
            return ({"messages": parsed.messages, "images": parsed.images or None, "tools": parsed.tools},
                    parsed.params, parsed.tool_plan)
        prompt, params = parse_completion_body(body)
    except (ValueError, CodecError) as error:
        raise invalid(str(error), getattr(error, "field", None) or _field_named_in(str(error), body)) from error
    return {"prompt" if isinstance(prompt, str) else "prompt_token_ids": prompt}, params, None


def _check_model(model: Any, model_names: tuple[str, ...], adapters: list[str]) -> str | None:
    """The LoRA adapter `model` names (None: the base model, by any of its names); 404 for a model not served."""
    if model is None or model in model_names:
        return None
    if model in adapters:
        return str(model)
    served = ", ".join(repr(name) for name in [*model_names, *adapters])
    raise ApiError(404, f"the model {model!r} does not exist; this server serves {served}",
                   param="model", code="model_not_found")


def _pop_bool(body: dict[str, Any], name: str) -> bool:
    value = body.pop(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false, got {value!r}", name)
    return value


def _pop_stream_options(body: dict[str, Any], stream: bool) -> bool:
    options = body.pop("stream_options", None)
    if options is None:
        return False
    if not stream:
        raise invalid("stream_options needs stream: true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise invalid("stream_options supports include_usage only", "stream_options")
    return bool(options.get("include_usage", False))


def _wire_id(request_id: str | None, chat: bool) -> str:
    if request_id is None:
        return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    if not _REQUEST_ID.match(request_id):
        raise invalid("X-Request-Id must be 1-128 characters of [A-Za-z0-9._:-]", "X-Request-Id")
    return request_id


def _field_named_in(message: str, body: dict[str, Any]) -> str | None:
    """The body field an error message starts with or names, for OpenAI's `param`."""
    for field in sorted(body, key=len, reverse=True):
        if field in message:
            return field
    return None
