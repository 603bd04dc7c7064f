"""The Anthropic routes' part of /openapi.json (actors/http/openapi.py merges it in): POST /v1/messages and
/v1/messages/count_tokens, their bodies as request.py, content.py, tools.py and thinking.py read them.

A content block is only an object here (content.py names what is wrong inside one), and so is a tool's
input_schema; rules across fields (the last message is the user's, budget_tokens < max_tokens, a named
tool among the tools) are in the descriptions: a 400 names them. count_tokens reads the prompt's fields
only, and refuses unknown ones. Errors are Anthropic's shape, `{"type": "error", "error": {type, message}}`.
"""

from __future__ import annotations

from typing import Any

from actors.http.anthropic.request import _NOT_IN_A_MESSAGE, _OWN_FIELDS, _SAMPLING_FIELDS, KNOWN_FIELDS
from pipeline.request.tools import MAX_NAME_CHARS

Schema = dict[str, Any]

_NULL: Schema = {"type": "null"}
_NAME: Schema = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}
_TEXT_BLOCK: Schema = {"type": "object", "required": ["type", "text"],
                       "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_CONTENT: Schema = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "object"}}],
                    "description": "a string or content blocks: text and image (base64, or a data: URI) and "
                                   "tool_result in a user turn, text and tool_use in an assistant turn; thinking "
                                   "blocks are dropped"}
_MESSAGE: Schema = {"type": "object", "required": ["role", "content"], "additionalProperties": False,
                    "properties": {"role": {"enum": ["user", "assistant"]}, "content": _CONTENT}}
_TOOL: Schema = {"type": "object", "required": ["name", "input_schema"], "additionalProperties": False,
                 "properties": {"name": _NAME, "input_schema": {"type": "object", "description": "a JSON schema"},
                                "description": {"type": ["string", "null"]}, "type": {"enum": ["custom", None]},
                                "cache_control": {"description": "accepted, no effect"}}}
# What the prompt is made of: the fields count_tokens reads too.
_PROMPT_FIELDS: dict[str, Schema] = {
    "model": {"description": "the served model (GET /v1/models) or a loaded LoRA adapter; another name is a 404"},
    "messages": {"type": "array", "minItems": 1, "items": _MESSAGE,
                 "description": "the last message is the user's (an assistant prefill is not continued)"},
    "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}, _NULL]},
    "tools": {"type": ["array", "null"], "items": _TOOL, "description": "names unique"},
    "thinking": {"anyOf": [_NULL, {"type": "object", "required": ["type"], "additionalProperties": False,
                                   "properties": {"type": {"enum": ["enabled", "disabled"]}, "budget_tokens": {}}}],
                 "description": "enabled (with budget_tokens, an integer >= 1024 and < max_tokens) needs "
                                "--reasoning-parser"},
}
# Fields known and not implemented: only the values that ask for nothing.
_REFUSED: dict[str, Schema] = {
    "mcp_servers": {"anyOf": [_NULL, {"type": "array", "maxItems": 0}]},
    "container": _NULL, "context_management": _NULL,
    **{name: _NULL for name in _NOT_IN_A_MESSAGE - {"n"}}, "n": {"enum": [1, None]},
}


def messages_body(sampling: dict[str, Schema]) -> Schema:
    """A /v1/messages body; `sampling`: the sampling parameters' property schemas (any may be given)."""
    tool_choice = {"type": "object", "required": ["type"], "additionalProperties": False,
                   "properties": {"type": {"enum": ["auto", "any", "tool", "none"]},
                                  "disable_parallel_tool_use": {"type": ["boolean", "null"]},
                                  "name": {"description": "type tool only: one of the tools"}}}
    own = {
        "max_tokens": {**_without_default(sampling["max_tokens"]), "type": "integer", "minimum": 1,
                       "description": "required"},
        "stop_sequences": {"type": ["array", "null"], "items": {"type": "string", "minLength": 1}},
        "stream": {"type": ["boolean", "null"]}, "metadata": {"type": ["object", "null"]},
        "service_tier": {"description": "accepted and not used"},
        "tool_choice": {"anyOf": [_NULL, tool_choice],
                        "description": "auto (the default with tools) needs --enable-auto-tool-choice"},
    }
    properties = {**{name: sampling[name] for name in sorted(_SAMPLING_FIELDS)}, **_PROMPT_FIELDS, **own,
                  **_REFUSED}
    assert properties.keys() == KNOWN_FIELDS, "a field of request.py is not documented"
    return {"type": "object", "required": ["messages", "max_tokens"], "properties": properties,
            "additionalProperties": True,
            "description": "a field not listed here is ignored and named in the X-Ignored-Fields response header "
                           "(a 400 with serve --strict-fields)"}


def _without_default(schema: Schema) -> Schema:
    return {key: value for key, value in schema.items() if key != "default"}


def count_tokens_body() -> Schema:
    """The prompt's fields are checked; the others are accepted as a Messages body's names, unread."""
    unread = {name: {} for name in sorted(KNOWN_FIELDS - _PROMPT_FIELDS.keys() - _REFUSED.keys())}
    assert unread.keys() <= _OWN_FIELDS | _SAMPLING_FIELDS
    return {"type": "object", "required": ["messages"], "additionalProperties": False,
            "properties": {**unread, **_PROMPT_FIELDS, **_REFUSED}}


_ERROR: Schema = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"},
    "error": {"type": "object", "required": ["type", "message"],
              "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}
_ERROR_STATUSES = {"400": "the body or a field is invalid (invalid_request_error)",
                   "401": "missing or wrong API key (x-api-key or Authorization: Bearer)",
                   "404": "no such model", "409": "X-Request-Id is in use by another request",
                   "413": "the body is too large", "429": "too many requests in flight",
                   "503": "no worker answered, or the request queue is unreachable"}
_MESSAGE_ANSWER: Schema = {"type": "object", "required": ["id", "type", "role", "content"],
                           "properties": {"content": {"type": "array"}, "usage": {"type": "object"}}}


def anthropic_paths(sampling: dict[str, Schema]) -> dict[str, Schema]:
    """The Anthropic routes' operations, by path."""
    count = {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": {"type": "integer"}}}
    answer = {"application/json": {"schema": _MESSAGE_ANSWER},
              "text/event-stream": {"schema": {"type": "string", "description": "Anthropic's events"}}}
    return {"/v1/messages": {"post": _post("Answer a conversation (Anthropic Messages)", messages_body(sampling),
                                           answer)},
            "/v1/messages/count_tokens": {"post": _post("Count a Messages body's prompt tokens", count_tokens_body(),
                                                        {"application/json": {"schema": count}})}}


def _post(summary: str, body: Schema, content: Schema) -> Schema:
    errors = {status: {"description": description, "content": {"application/json": {"schema": _ERROR}}}
              for status, description in _ERROR_STATUSES.items()}
    return {"summary": summary, "security": [{"apiKey": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": {"description": "the answer", "content": content}, **errors}}
