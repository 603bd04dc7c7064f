"""OpenAI's HTTP request bodies -> wire requests, through the batch file's parsers (the same fields and checks).

The HTTP-only fields (`stream`, `stream_options`) and the unknown ones (unknown_fields.py) are taken
off first; everything else is the batch file's body, so a field means the same thing in both places.
A completions body with several prompts becomes one wire request per prompt, `{id}:{prompt index}`
(one prompt keeps the id itself).
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from actors.http.errors import invalid
from actors.http.generation.body_fields import served_adapter
from actors.http.generation.priority import PriorityError, pop_priority
from actors.http.generation.request import GatewayRequest
from actors.http.openai.chat_request import parse_chat_request
from actors.http.openai.completion_request import Prompt, parse_completion_body, prompt_field
from actors.http.openai.unknown_fields import take_unknown_fields
from actors.http.reasoning import ReasoningFormat, decode_params, format_for_request
from actors.http.tenancy.id_namespaces import NAMESPACE_LENGTH
from actors.http.tool_parsers.plan import ToolPlan
from queue_adapters.codec import MAX_ID_LENGTH, CodecError, WireRequest, check_request

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
MAX_CLIENT_ID_LENGTH = MAX_ID_LENGTH - NAMESPACE_LENGTH  # a prompt's `{id}:{index}`, before the tenant's namespace


@dataclass(slots=True)
class OpenAIRequest(GatewayRequest):
    """What OpenAI's answers need beyond the flow's request."""

    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    echo: bool = False
    prompts: list[Prompt] | None = None  # completions: as the client gave them (echo prepends them)
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage so far in every chunk
    tool_plan: ToolPlan | None = None  # chat with tools: what the answer's text becomes
    reasoning: ReasoningFormat | None = None  # chat under --reasoning-parser: how the answer splits


def parse_body(body: Any, chat: bool, model_name: str, request_id: str | None,
               timeout_s: float | None, adapters: list[str] | None = None,
               aliases: tuple[str, ...] = (), strict_fields: bool = False,
               tool_parser: str | None = None, reasoning_parser: str | None = None,
               template_kwargs: dict[str, Any] | None = None) -> OpenAIRequest:
    """`tool_parser`: --tool-call-parser, when --enable-auto-tool-choice is on; `reasoning_parser`:
    --reasoning-parser; `template_kwargs`: --default-chat-template-kwargs."""
    if not isinstance(body, dict):
        raise invalid(f"the body must be a JSON object, got {type(body).__name__}")
    lora = served_adapter(body.get("model"), aliases or (model_name,), adapters or [])
    body = dict(body)
    try:
        priority = pop_priority(body)
    except PriorityError as error:
        raise invalid(str(error), error.field) from error
    body, ignored = take_unknown_fields(body, strict_fields, chat)
    stream = _pop_bool(body, "stream")
    include_usage, continuous_usage = _pop_stream_options(body, stream)
    response_id = _wire_id(request_id, chat)
    deadline_ms = int((time.time() + timeout_s) * 1000) if timeout_s else None
    user = body.get("user")  # any JSON value is accepted, as OpenAI's; only a string names a user
    options = {"response_id": response_id, "include_usage": include_usage, "continuous_usage": continuous_usage,
               "ignored_fields": ignored, "user": user if isinstance(user, str) else None}
    try:
        if chat:
            parsed = parse_chat_request(body, tool_parser, template_kwargs)
            # A chat answer runs to the end of its turn unless the client caps it (OpenAI's default).
            parsed.params.setdefault("max_tokens", None)
            parsed.params.update(decode_params(reasoning_parser))  # gpt_oss: its markers in the text
            wire = WireRequest(id=response_id, params=parsed.params, deadline_ms=deadline_ms, lora=lora,
                               messages=parsed.messages, images=parsed.images or None, tools=parsed.tools,
                               chat_template_kwargs=parsed.template_kwargs, priority=priority)
            check_request(wire, params_checked=True)  # what a worker's codec would refuse is a 400 here
            reasoning = format_for_request(reasoning_parser, parsed.template_kwargs, parsed.constrained)
            return OpenAIRequest([wire], chat, stream, tool_plan=parsed.tool_plan, reasoning=reasoning, **options)
        completion = parse_completion_body(body)
    except (ValueError, CodecError, TypeError) as error:
        raise invalid(str(error), getattr(error, "field", None) or _field_named_in(str(error), body)) from error
    ids = prompt_ids(response_id, len(completion.prompts))
    try:
        wires = [WireRequest(id=wire_id, params=dict(completion.params), deadline_ms=deadline_ms, lora=lora,
                             priority=priority, **prompt_field(prompt))
                 for wire_id, prompt in zip(ids, completion.prompts, strict=True)]
        for wire in wires:
            check_request(wire, params_checked=True)
    except (CodecError, ValueError, TypeError) as error:
        raise invalid(str(error)) from error
    return OpenAIRequest(wires, chat, stream, echo=completion.echo, prompts=completion.prompts, **options)


def prompt_ids(response_id: str, num_prompts: int) -> list[str]:
    """The wire ids of a request's prompts: its own id for one, `{id}:{index}` for several."""
    if num_prompts == 1:
        return [response_id]
    if len(f"{response_id}:{num_prompts - 1}") > MAX_CLIENT_ID_LENGTH:
        raise invalid(f"X-Request-Id must be at most {MAX_CLIENT_ID_LENGTH - 1 - len(str(num_prompts - 1))} characters "
                      f"for {num_prompts} prompts (each gets `:index` appended)", "X-Request-Id")
    return [f"{response_id}:{index}" for index in range(num_prompts)]


def _pop_bool(body: dict[str, Any], name: str) -> bool:
    value = body.pop(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false, got {value!r}", name)
    return value


def _pop_stream_options(body: dict[str, Any], stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats). As vLLM reads them, usage in every chunk needs both."""
    options = body.pop("stream_options", None)
    if options is None:
        return False, False
    if not stream:
        raise invalid("stream_options needs stream: true", "stream_options")
    if not isinstance(options, dict):
        raise invalid("stream_options must be an object", "stream_options")
    unknown = sorted(str(key) for key in options if key not in ("include_usage", "continuous_usage_stats"))
    if unknown:
        raise invalid(f"stream_options: unknown field(s) {', '.join(unknown)} (known: include_usage, "
                      "continuous_usage_stats)", "stream_options")
    include_usage = _option_flag(options, "include_usage")
    return include_usage, include_usage and _option_flag(options, "continuous_usage_stats")


def _option_flag(options: dict[str, Any], name: str) -> bool:
    value = options.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"stream_options.{name} must be true or false, got {value!r}", f"stream_options.{name}")
    return value


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
