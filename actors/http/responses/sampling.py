"""A Responses body's fields: which are known, and the sampling ones as the wire's params and the chat
template's variables (request.py puts them together)."""

from __future__ import annotations

from typing import Any

from actors.http.errors import invalid
from pipeline.request.chat_template_kwargs import check_chat_template_kwargs
from pipeline.request.sampling_params import SamplingParams
from pipeline.request.structured_output import ALIASES
from pipeline.request.untrusted import UntrustedValueError

_OWN_FIELDS = frozenset({"model", "input", "instructions", "previous_response_id", "store", "max_output_tokens",
                         "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "text", "stream",
                         "stream_options", "metadata", "user", "service_tier", "reasoning", "prompt_cache_key",
                         "safety_identifier", "chat_template_kwargs", "priority"})
# OpenAI fields this server does not implement, and the values that ask for nothing.
_NOT_IMPLEMENTED: dict[str, tuple[Any, ...]] = {"background": (False,), "truncation": ("disabled",),
                                                "include": ([],), "top_logprobs": (0,), "max_tool_calls": (),
                                                "prompt": (), "conversation": ()}
# Sampling parameters with no place in one response: one answer, no logprobs, max_output_tokens for max_tokens.
_NOT_IN_A_RESPONSE = frozenset({"n", "best_of", "use_beam_search", "length_penalty", "early_stopping", "logprobs",
                                "prompt_logprobs", "max_tokens"})
_SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__) - _NOT_IN_A_RESPONSE
_KNOWN = _OWN_FIELDS | _NOT_IMPLEMENTED.keys() | _NOT_IN_A_RESPONSE | _SAMPLING_FIELDS
_EFFORTS = ("low", "medium", "high")


def check_body_fields(body: dict[str, Any], strict: bool) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the body without unknown fields, their names); fields known and not implemented are a 400."""
    for name, asks_nothing in _NOT_IMPLEMENTED.items():
        if body.get(name) is not None and not _asks_nothing(body[name], asks_nothing):
            raise invalid(f"{name} is not supported by this server", name)
    for name in sorted(_NOT_IN_A_RESPONSE & body.keys()):
        if body[name] is not None and not (name == "n" and _asks_nothing(body[name], (1,))):
            hint = "give max_output_tokens" if name == "max_tokens" else "use /v1/chat/completions"
            raise invalid(f"{name} is not available in the Responses API ({hint})", name)
    unknown = tuple(sorted(str(key) for key in body if key not in _KNOWN))
    if unknown and strict:
        raise invalid(f"unknown field(s) {', '.join(unknown)}", unknown[0])
    _check_bookkeeping(body)
    return {key: value for key, value in body.items() if key not in unknown}, unknown


def _asks_nothing(value: Any, values: tuple[Any, ...]) -> bool:
    """Whether `value` is one of `values`, a bool matching only a bool (True is not n 1, 0 not background false)."""
    return any(value == asks and isinstance(value, bool) == isinstance(asks, bool) for asks in values)


def wire_params(body: dict[str, Any], tool_constraint: dict[str, Any] | None) -> tuple[dict[str, Any], bool]:
    """(the wire params, whether a structured-output constraint covers the answer)."""
    params = {key: value for key, value in body.items() if key in _SAMPLING_FIELDS and value is not None}
    params["max_tokens"] = _max_output_tokens(body.get("max_output_tokens"))
    text_format = _text_format(body.get("text"))
    if text_format is not None:
        params["response_format"] = text_format
    constrained = sorted(name for name in (*ALIASES, "structured_outputs")
                         if params.get(name) not in (None, {"type": "text"}))
    if tool_constraint is not None:
        if constrained:
            raise ValueError(f"tool_choice required or a named function constrains the answer to the call(s) and "
                             f"cannot be combined with {', '.join(constrained)}")
        params["guided_json"] = tool_constraint
    try:
        SamplingParams.from_dict(params)  # validates every field, naming it
    except ValueError as error:
        if text_format is None or "response_format" not in str(error):
            raise
        message = str(error).replace("response_format.json_schema", "text.format").replace("response_format", "text")
        raise UntrustedValueError(message, "text") from None
    return params, bool(constrained) or tool_constraint is not None


def template_kwargs(body: dict[str, Any], defaults: dict[str, Any] | None) -> dict[str, Any] | None:
    """The chat template's variables: the server's, then reasoning.effort's, then chat_template_kwargs."""
    given = body.get("chat_template_kwargs")
    if given is not None:
        check_chat_template_kwargs(given)
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise ValueError("reasoning must be an object {effort, summary}")
    effort = (reasoning or {}).get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise ValueError(f"reasoning.effort must be one of {', '.join(_EFFORTS)}, got {effort!r}")
    merged = {**(defaults or {}), **({"reasoning_effort": effort} if effort is not None else {}), **(given or {})}
    return merged or None


def _max_output_tokens(value: Any) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"max_output_tokens must be an integer >= 1, got {value!r}")
    return value


def _text_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as the engine's response_format (None: plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"} or text.get("verbosity") is not None:
        raise ValueError("text must be an object {format} (verbosity is not supported)")
    text_format = text.get("format")
    if text_format is None:
        return None
    if not isinstance(text_format, dict):
        raise ValueError("text.format must be an object {type: text | json_object | json_schema, ...}")
    kind = text_format.get("type")
    if kind in ("text", "json_object") and set(text_format) == {"type"}:
        return None if kind == "text" else {"type": "json_object"}
    if kind != "json_schema":
        raise ValueError(f"text.format must be {{type: text | json_object | json_schema, ...}}, got {kind!r}")
    schema = {key: value for key, value in text_format.items() if key != "type" and value is not None}
    return {"type": "json_schema", "json_schema": schema}  # its fields are checked as response_format's


def _check_bookkeeping(body: dict[str, Any]) -> None:
    """Fields only repeated in the Response object: checked so they repeat well-formed."""
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise invalid("metadata must be an object of strings", "metadata")
    for name in ("user", "previous_response_id", "instructions"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise invalid(f"{name} must be a string", name)
