"""A /v1/responses body -> one wire chat request (the same wire form chat completions send, so the engine
path, the chat template and the answer are the same), and what the Response object needs.

- `instructions` -> a system message first; `previous_response_id`'s stored items, then `input`'s
  (input_items.py) -> the messages (conversation.py); `tools`, `tool_choice`, `parallel_tool_calls`
  -> chat's tools and tool plan (tools.py); `text.format` -> response_format; `max_output_tokens` ->
  max_tokens (none: the answer runs to the end of its turn, as chat's); `reasoning.effort` and vLLM's
  `chat_template_kwargs` -> the template's variables, over --default-chat-template-kwargs, as chat's.
- Any other sampling parameter of the server (top_k, seed, guided_regex, ...) may be given at the top
  level, as in chat, but those with no place in one response (n, logprobs, beam search, max_tokens:
  give max_output_tokens) are a 400; so are `background: true`, `truncation: "auto"`, `include`,
  `top_logprobs`, `max_tool_calls`, `prompt` and `conversation` (not implemented).
- An unknown top-level field is ignored and named in X-Ignored-Fields, or a 400 with --strict-fields.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from actors.http.errors import invalid
from actors.http.generation.body_fields import body_adapter, bool_field
from actors.http.generation.priority import pop_priority
from actors.http.generation.request import GatewayRequest
from actors.http.options import GatewayOptions
from actors.http.reasoning import ReasoningFormat, decode_params, format_for_request
from actors.http.responses.conversation import chat_messages
from actors.http.responses.input_items import input_items, new_id
from actors.http.responses.records import Record, check_conversation
from actors.http.responses.response_object import echoed_fields
from actors.http.responses.sampling import check_body_fields, template_kwargs, wire_params
from actors.http.responses.tools import tool_answer
from actors.http.tool_parsers.plan import ToolPlan
from queue_adapters.codec import CodecError, WireRequest, check_request

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass(slots=True)
class ResponsesRequest(GatewayRequest):
    """What the Response object and the store need beyond the flow's request."""

    tool_plan: ToolPlan | None = None
    reasoning: ReasoningFormat | None = None
    created_at: int = 0
    echo: dict[str, Any] = field(default_factory=dict)  # the settings the Response object repeats
    tenant: str = ""
    store: bool = True
    input_items: list[dict[str, Any]] = field(default_factory=list)
    context: list[dict[str, Any]] = field(default_factory=list)  # previous items and the input
    context_bytes: int = 0  # its size as JSON (a record of it is encoded off the event loop when large)
    answered: dict[str, Any] | None = None  # the whole (non-streamed) Response, for the store

    def record(self, response: dict[str, Any]) -> Record:
        return Record(response, self.input_items, self.context)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks, and where: what a body alone does not say."""

    tenant: str
    request_id: str | None  # X-Request-Id: the wire id (a retry attaches to its stream)
    model_names: tuple[str, ...]  # the base model's names (--served-model-name)
    adapters: list[str]


def parse_responses_body(body: Any, previous: Record | None, caller: Caller,
                         options: GatewayOptions) -> ResponsesRequest:
    """`previous`: previous_response_id's record (routes.py loads it: a 404 when unknown)."""
    lora = body_adapter(body, caller.model_names, caller.adapters)
    if caller.request_id is not None and not _REQUEST_ID.match(caller.request_id):
        raise invalid("X-Request-Id must be 1-128 characters of [A-Za-z0-9._:-]", "X-Request-Id")
    body, ignored = check_body_fields(body, options.strict_fields)
    body = dict(body)
    stream, store = bool_field(body, "stream", False), bool_field(body, "store", True)
    response_id = new_id("resp")
    deadline_ms = int((time.time() + options.request_timeout_s) * 1000) if options.request_timeout_s else None
    try:
        priority = pop_priority(body)
        items = input_items(body.get("input"))
        context = [*(previous.continued() if previous is not None else []), *items]
        context_bytes = check_conversation(context)
        kwargs = template_kwargs(body, options.default_chat_template_kwargs)
        tools = tool_answer(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"),
                            options.tool_call_parser)
        params, constrained = wire_params(body, tools.constraint)
        params.update(decode_params(options.reasoning_parser))  # gpt_oss: its markers in the text
        wire = WireRequest(id=caller.request_id or response_id, params=params, deadline_ms=deadline_ms, lora=lora,
                           messages=chat_messages(_instructions(body), context), tools=tools.tools,
                           chat_template_kwargs=kwargs, priority=priority)
        check_request(wire, params_checked=True)  # what a worker's codec would refuse is a 400 here
    except (ValueError, CodecError, TypeError) as error:
        raise invalid(str(error), getattr(error, "field", None)) from error
    return ResponsesRequest([wire], chat=True, stream=stream, response_id=response_id, ignored_fields=ignored,
                            tool_plan=tools.plan, created_at=int(time.time()), echo=echoed_fields(body, store),
                            reasoning=format_for_request(options.reasoning_parser, kwargs, constrained),
                            tenant=caller.tenant, store=store, input_items=items, context=context,
                            context_bytes=context_bytes)


def _instructions(body: dict[str, Any]) -> str | None:
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ValueError("instructions must be a string")
    return instructions
