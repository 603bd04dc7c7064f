"""OpenAI /v1/chat/completions bodies -> wire messages, tools and sampling parameters (the answer's
`chat.completion` objects are actors/http/openai/render.py's).

Strict like completions (actors/http/openai/completion_request.py): unknown fields are an error, and
so are the chat features we do not implement (the deprecated `functions`), so nothing is silently
ignored. Content may be a string or a list of text and image_url parts (actors/http/openai/content_parts.py).
Tools (docs/http-api.md#tool-calling): `tools` travel to the chat template; `tool_choice` decides what
the gateway makes of the answer (actors/http/tool_parsers/plan.py), and `required` or a named
function add the structured-output constraint that makes the answer the call(s). `chat_template_kwargs`
and `reasoning_effort` become the template's variables (actors/http/openai/template_kwargs.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from actors.http.openai.completion_request import sampling_fields
from actors.http.openai.content_parts import parse_content
from actors.http.openai.template_kwargs import take_template_kwargs
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import check_tool_choice, check_tools, constraint_for
from pipeline.request.sampling_params import SamplingParams
from pipeline.request.structured_output import ALIASES, MAX_SPEC_CHARS
from pipeline.request.tools import MAX_NAME_CHARS, MAX_TOOL_CALLS, arguments_object
from pipeline.request.untrusted import UntrustedValueError
from queue_adapters.chat_message import ChatMessage, WireFunctionCall, WireToolCall, check_tool_roles

_UNSUPPORTED = {"functions", "function_call", "stream_options", "audio", "modalities", "prediction"}
_MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")
AUTO_NEEDS_PARSER = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


@dataclass(slots=True)
class ChatBody:
    messages: list[ChatMessage]
    params: dict[str, Any]  # wire params (a required/named tool_choice's constraint included)
    images: list[bytes]  # of image_url parts, in order
    tools: list[dict[str, Any]] | None  # for the chat template
    tool_plan: ToolPlan | None  # what becomes of the answer's text; None: it is content
    template_kwargs: dict[str, Any] | None = None  # the chat template's extra variables
    constrained: bool = False  # a structured-output constraint covers the answer (a tool_choice's included)


def parse_chat_request(body: Any, tool_parser: str | None,
                       default_template_kwargs: dict[str, Any] | None = None) -> ChatBody:
    """Every field checked, ValueError naming the field for anything we cannot run as asked.
    `tool_parser`: the server's --tool-call-parser when --enable-auto-tool-choice is on;
    `default_template_kwargs`: its --default-chat-template-kwargs."""
    params = sampling_fields(body, "messages", _UNSUPPORTED)
    template_kwargs = take_template_kwargs(params, default_template_kwargs)
    tools, tool_plan, constraint = _tool_fields(params, tool_parser)
    images: list[bytes] = []
    messages = parse_messages(body["messages"], images)
    params = _completion_names(params)
    if constraint is not None:
        params["guided_json"] = constraint
    SamplingParams.from_dict(params)  # validates every remaining field, naming it
    return ChatBody(messages, params, images, tools, tool_plan, template_kwargs, bool(_constraints(params)))


def _tool_fields(params: dict[str, Any],
                 tool_parser: str | None) -> tuple[list[dict[str, Any]] | None, ToolPlan | None, dict | None]:
    """(tools for the template, the plan for the answer, a required/named call's JSON schema)."""
    tools = params.pop("tools", None) or None  # [] asks for nothing, as SDKs send it
    tool_choice = params.pop("tool_choice", None)
    parallel = params.pop("parallel_tool_calls", None)
    if parallel is not None and not isinstance(parallel, bool):
        raise ValueError(f"parallel_tool_calls must be true or false, got {parallel!r}")
    if tools is not None:
        check_tools(tools)
    choice = check_tool_choice(tool_choice, tools)
    if choice.mode == "none":
        return tools, None, None
    assert tools is not None
    if choice.mode == "auto":
        if tool_parser is None:
            raise UntrustedValueError(AUTO_NEEDS_PARSER, "tool_choice")
        return tools, ToolPlan(choice, tool_parser, parallel is not False), None
    constrained = _constraints(params)
    if constrained:
        raise UntrustedValueError(f"tool_choice {choice.mode!r} constrains the answer to the call(s) and cannot be "
                                  f"combined with {', '.join(constrained)}", "tool_choice")
    constraint = constraint_for(choice, tools, parallel is not False)
    size = len(json.dumps(constraint, sort_keys=True))
    if size > MAX_SPEC_CHARS:
        raise UntrustedValueError(f"tools: for tool_choice {choice.mode!r} the tools' parameter schemas become a "
                                  f"constraint of at most {MAX_SPEC_CHARS} characters, got {size}", "tools")
    return tools, ToolPlan(choice, None, parallel is not False), constraint


def _constraints(params: dict[str, Any]) -> list[str]:
    """The structured-output fields that constrain the answer."""
    return sorted(name for name in (*ALIASES, "structured_outputs")
                  if params.get(name) not in (None, {"type": "text"}))  # text: no constraint


def parse_messages(messages: Any, images: list[bytes]) -> list[ChatMessage]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    return [_parse_message(message, f"messages[{index}]", images) for index, message in enumerate(messages)]


def _parse_message(message: Any, where: str, images: list[bytes]) -> ChatMessage:
    if not isinstance(message, dict):
        raise ValueError(f"{where} must be an object with role and content")
    unknown = sorted(str(key) for key in set(message) - set(_MESSAGE_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(_MESSAGE_FIELDS)})")
    role, content, name = message.get("role"), message.get("content"), message.get("name")
    if not isinstance(role, str) or not role:
        raise ValueError(f"{where}.role must be a non-empty string")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"{where}.name must be a non-empty string")
    tool_calls = _parse_tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
    tool_call_id = message.get("tool_call_id")
    if tool_call_id is not None or role == "tool":
        _check_tool_text(tool_call_id, f"{where}.tool_call_id")
    if content is None and tool_calls is not None:
        content = ""  # an assistant turn that only calls tools (OpenAI's content: null)
    parsed = ChatMessage(role=role, content=parse_content(content, f"{where}.content", images), name=name,
                         tool_calls=tool_calls, tool_call_id=tool_call_id)
    check_tool_roles(parsed, where)
    return parsed


def _parse_tool_calls(calls: Any, where: str) -> list[WireToolCall] | None:
    """An assistant message's `tool_calls`, as the response gave them (a streamed call's `index` too)."""
    if calls is None or calls == []:
        return None
    if not isinstance(calls, list) or len(calls) > MAX_TOOL_CALLS:
        raise ValueError(f"{where} must be a list of at most {MAX_TOOL_CALLS} calls")
    parsed = []
    for number, call in enumerate(calls):
        at = f"{where}[{number}]"
        if not isinstance(call, dict) or set(call) - {"id", "type", "function", "index"}:
            raise ValueError(f"{at} must be {{id, type: function, function: {{name, arguments}}}}")
        if call.get("type", "function") != "function":
            raise ValueError(f"{at}.type must be \"function\", got {call['type']!r}")
        function = call.get("function")
        if not isinstance(function, dict) or set(function) != {"name", "arguments"}:
            raise ValueError(f"{at}.function must be {{name, arguments}}")
        _check_tool_text(call.get("id"), f"{at}.id")
        _check_tool_text(function["name"], f"{at}.function.name")
        if not isinstance(function["arguments"], str):
            raise ValueError(f"{at}.function.arguments must be a string (the text of a JSON object)")
        arguments_object(function["arguments"], f"{at}.function.arguments")
        parsed.append(WireToolCall(id=call["id"], function=WireFunctionCall(function["name"], function["arguments"])))
    return parsed


def _check_tool_text(value: Any, where: str) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_CHARS:
        raise ValueError(f"{where} must be a string of 1 to {MAX_NAME_CHARS} characters")


def _completion_names(params: dict[str, Any]) -> dict[str, Any]:
    """Chat's names for sampling fields -> the engine's (completions') names.

    Chat asks for logprobs with `logprobs: true` and `top_logprobs: N` (alternatives per token);
    the engine's `logprobs: N` is the same request.
    """
    params = dict(params)
    if "max_completion_tokens" in params:
        if "max_tokens" in params:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        params["max_tokens"] = params.pop("max_completion_tokens")
    if params.get("max_tokens") == 0:  # only a completions request with echo scores a prompt alone
        raise ValueError("max_tokens must be >= 1 in a chat request, got 0")
    wants_logprobs = params.pop("logprobs", None) or False  # null: not asked
    top_logprobs = params.pop("top_logprobs", None)
    if not isinstance(wants_logprobs, bool):
        raise ValueError(f"logprobs must be true or false in a chat request, got {wants_logprobs!r}")
    if top_logprobs is not None and not wants_logprobs:
        raise ValueError("top_logprobs needs logprobs: true")
    if top_logprobs is not None and (not isinstance(top_logprobs, int) or isinstance(top_logprobs, bool)):
        raise ValueError(f"top_logprobs must be an integer, got {top_logprobs!r}")
    if wants_logprobs:
        params["logprobs"] = top_logprobs or 0
    return params
