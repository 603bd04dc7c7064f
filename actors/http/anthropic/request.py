"""Anthropic /v1/messages bodies -> one wire chat request (the same wire form chat completions send, so
the engine path is the same), and the fields checked as the OpenAI routes check theirs.

- `system` and `messages` -> wire messages and images (content.py); `tools` and `tool_choice` -> wire
  tools, the plan for the answer and, for any / tool, a structured-output constraint (tools.py).
- `max_tokens` (required, >= 1), `temperature`, `top_p`, `top_k` keep their names on the wire;
  `stop_sequences` becomes `stop`, whose match the wire reply names (message.py's stop_sequence).
- Any other sampling parameter of the server (min_p, seed, guided_regex, ...) may be given at the top
  level, as in chat completions, but those with no place in one message (n, logprobs, beam search, and
  `stop`: give stop_sequences) are a 400. `metadata` and `service_tier` are accepted and not used;
  `mcp_servers`, `container` and `context_management` are a 400.
- `thinking` -> the chat template's `enable_thinking` (thinking.py); with --reasoning-parser the answer's
  reasoning is split off into a thinking block (`reasoning`, the request's format).
- An unknown top-level field is ignored and named in X-Ignored-Fields, or a 400 with --strict-fields.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from actors.http.anthropic.content import parse_conversation
from actors.http.anthropic.thinking import check_budget, template_kwargs
from actors.http.anthropic.tools import tool_answer, wire_tools
from actors.http.errors import invalid
from actors.http.generation.body_fields import body_adapter, bool_field
from actors.http.generation.request import GatewayRequest
from actors.http.reasoning import ReasoningFormat, decode_params, format_for_request
from actors.http.tool_parsers.plan import ToolPlan
from pipeline.request.sampling_params import SamplingParams
from pipeline.request.structured_output import ALIASES
from queue_adapters.chat_message import ChatMessage
from queue_adapters.codec import CodecError, WireRequest, check_request

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_OWN_FIELDS = frozenset({"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p",
                         "top_k", "stream", "metadata", "tools", "tool_choice", "service_tier", "thinking"})
# Anthropic fields this server does not implement, and the values that ask for nothing.
_NOT_IMPLEMENTED: dict[str, tuple[Any, ...]] = {"mcp_servers": ([],), "container": (), "context_management": ()}
# Sampling parameters with no place in one message: one answer, no logprobs, stop_sequences for stop.
_NOT_IN_A_MESSAGE = frozenset({"n", "best_of", "use_beam_search", "length_penalty", "early_stopping", "logprobs",
                               "prompt_logprobs", "stop"})
_SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__) - _NOT_IN_A_MESSAGE
KNOWN_FIELDS = _OWN_FIELDS | _NOT_IMPLEMENTED.keys() | _NOT_IN_A_MESSAGE | _SAMPLING_FIELDS


@dataclass(slots=True)
class AnthropicRequest(GatewayRequest):
    """What Anthropic's answers need beyond the flow's request."""

    tool_plan: ToolPlan | None = None  # tools with tool_choice auto, any or tool: what the answer's text becomes
    stop_sequences: tuple[str, ...] = ()
    reasoning: ReasoningFormat | None = None  # --reasoning-parser: how the answer splits into thinking and text


@dataclass(slots=True)
class Conversation:
    """The prompt's part of a body: what the chat template renders (count_tokens needs only this)."""

    messages: list[ChatMessage]
    images: list[bytes]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any] | None = None  # the chat template's variables (enable_thinking, ...)


def parse_messages_body(body: Any, model_names: tuple[str, ...], adapters: list[str], request_id: str | None,
                        timeout_s: float | None, strict_fields: bool = False,
                        tool_parser: str | None = None, reasoning_parser: str | None = None,
                        default_template_kwargs: dict[str, Any] | None = None) -> AnthropicRequest:
    """`model_names`: the base model's names (--served-model-name); `tool_parser`: --tool-call-parser;
    `reasoning_parser`: --reasoning-parser; `default_template_kwargs`: --default-chat-template-kwargs."""
    lora = body_adapter(body, model_names, adapters)
    body, ignored = check_fields(body, strict_fields)
    stream = bool_field(body, "stream")
    response_id = _response_id(request_id)
    deadline_ms = int((time.time() + timeout_s) * 1000) if timeout_s else None
    try:
        conversation = parse_prompt(body, default_template_kwargs, reasoning_parser)
        answer = tool_answer(body.get("tool_choice"), conversation.tools, tool_parser)
        params = {**_sampling(body, answer.constraint), **decode_params(reasoning_parser)}
        check_budget(body.get("thinking"), params["max_tokens"])
        wire = WireRequest(id=response_id, params=params, deadline_ms=deadline_ms, lora=lora,
                           messages=conversation.messages, images=conversation.images or None,
                           tools=conversation.tools, chat_template_kwargs=conversation.template_kwargs)
        check_request(wire, params_checked=True)  # what a worker's codec would refuse is a 400 here
    except (ValueError, CodecError, TypeError) as error:
        raise invalid(str(error), getattr(error, "field", None)) from error
    return AnthropicRequest([wire], chat=True, stream=stream, response_id=response_id, ignored_fields=ignored,
                            tool_plan=answer.plan, stop_sequences=tuple(params.get("stop", ())),
                            reasoning=format_for_request(reasoning_parser, conversation.template_kwargs,
                                                         _constrained(params)))


def parse_prompt(body: dict[str, Any], default_template_kwargs: dict[str, Any] | None = None,
                 reasoning_parser: str | None = None) -> Conversation:
    """`system`, `messages`, `tools` and `thinking`; ValueError naming the field."""
    images: list[bytes] = []
    messages = parse_conversation(body.get("system"), body.get("messages"), images)
    kwargs = template_kwargs(body.get("thinking"), default_template_kwargs, reasoning_parser)
    return Conversation(messages, images, wire_tools(body.get("tools")), kwargs)


def check_fields(body: dict[str, Any], strict: bool) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the body without unknown fields, their names); fields known and not implemented are a 400."""
    for name, asks_nothing in _NOT_IMPLEMENTED.items():
        if body.get(name) is not None and not _asks_nothing(body[name], asks_nothing):
            raise invalid(f"{name} is not supported by this server", name)
    for name in sorted(_NOT_IN_A_MESSAGE & body.keys()):
        if body[name] is not None and not (name == "n" and _asks_nothing(body[name], (1,))):
            hint = "give stop_sequences" if name == "stop" else "use /v1/chat/completions"
            raise invalid(f"{name} is not available in the Messages API ({hint})", name)
    unknown = tuple(sorted(str(key) for key in body if key not in KNOWN_FIELDS))
    if unknown and strict:
        raise invalid(f"unknown field(s) {', '.join(unknown)}", unknown[0])
    return {key: value for key, value in body.items() if key not in unknown}, unknown


def _asks_nothing(value: Any, values: tuple[Any, ...]) -> bool:
    """Whether `value` is one of `values`, a bool matching only a bool (True is not n 1, 0 not background false)."""
    return any(value == asks and isinstance(value, bool) == isinstance(asks, bool) for asks in values)


def _sampling(body: dict[str, Any], constraint: dict[str, Any] | None) -> dict[str, Any]:
    """The wire params: Anthropic's sampling fields, the server's extras, a tool choice's constraint."""
    params = {key: value for key, value in body.items() if key in _SAMPLING_FIELDS and value is not None}
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"max_tokens is required: an integer >= 1, got {max_tokens!r}")
    stop_sequences = body.get("stop_sequences")
    if stop_sequences is not None:
        if not isinstance(stop_sequences, list) or not all(isinstance(stop, str) and stop for stop in stop_sequences):
            raise ValueError("stop_sequences must be a list of non-empty strings")
        params["stop"] = stop_sequences
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError("metadata must be an object")
    if constraint is not None:
        constrained = sorted(name for name in (*ALIASES, "structured_outputs") if name in params)
        if constrained:
            raise ValueError(f"tool_choice any or tool constrains the answer to the call(s) and cannot be combined "
                             f"with {', '.join(constrained)}")
        params["guided_json"] = constraint
    SamplingParams.from_dict(params)  # validates every field, naming it
    return params


def _constrained(params: dict[str, Any]) -> bool:
    """Whether a structured-output constraint (a tool choice's included) covers the answer."""
    return any(params.get(name) not in (None, {"type": "text"}) for name in (*ALIASES, "structured_outputs"))


def _response_id(request_id: str | None) -> str:
    if request_id is None:
        return f"msg_{uuid.uuid4().hex}"
    if not _REQUEST_ID.match(request_id):
        raise invalid("X-Request-Id must be 1-128 characters of [A-Za-z0-9._:-]", "X-Request-Id")
    return request_id
