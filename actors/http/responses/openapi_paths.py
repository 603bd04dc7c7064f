"""The Responses routes' part of /openapi.json (actors/http/openapi.py merges it in): POST /v1/responses, its
body as request.py, sampling.py, input_items.py and tools.py read it, and the stored responses' routes.

An input item is only an object here (input_items.py names what is wrong inside one), and so is a
function's parameters schema; rules across fields (a named function among the tools, a constraint with
tool_choice required) are in the descriptions: a 400 names them. Errors are OpenAI's shape (the
document's #/components/schemas/Error).
"""

from __future__ import annotations

from typing import Any

from actors.http.responses.listing import _MAX_LIMIT
from actors.http.responses.sampling import _EFFORTS, _KNOWN, _NOT_IN_A_RESPONSE, _SAMPLING_FIELDS
from pipeline.request.chat_template_kwargs import MAX_KWARGS
from pipeline.request.tools import MAX_NAME_CHARS
from queue_adapters.codec import PRIORITY_MAX, PRIORITY_MIN

Schema = dict[str, Any]

_NULL: Schema = {"type": "null"}
_STRING: Schema = {"type": ["string", "null"]}
_FUNCTION: Schema = {"type": "object", "required": ["type", "name"],
                     "properties": {"type": {"const": "function"},
                                    "name": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS},
                                    "parameters": {"type": ["object", "null"], "description": "a JSON schema"},
                                    "description": _STRING, "strict": {"type": ["boolean", "null"]}},
                     "description": "a function; hosted tools (web_search, file_search, mcp, ...) are a 400"}
_TEXT_FORMAT: Schema = {"type": "object", "required": ["type"],
                        "properties": {"type": {"enum": ["text", "json_object", "json_schema"]}},
                        "description": "json_schema's fields (name, schema, strict) as response_format's"}
_OWN: dict[str, Schema] = {
    "model": {"description": "the served model (GET /v1/models) or a loaded LoRA adapter; another name is a 404"},
    "input": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "object"}}],
              "description": "a string (the user's message) or items: messages (role user, system, developer or "
                             "assistant; text content), function_call, function_call_output, reasoning"},
    "instructions": {**_STRING, "description": "a system message first"},
    "previous_response_id": {**_STRING, "description": "a stored response this one continues (404 if none)"},
    "store": {"type": ["boolean", "null"], "default": True},
    "stream": {"type": ["boolean", "null"], "default": False},
    "stream_options": {"description": "accepted and not used"},
    "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
    "tools": {"type": ["array", "null"], "items": _FUNCTION, "description": "names unique"},
    "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required", None]},
                              {"type": "object", "required": ["type", "name"], "additionalProperties": False,
                               "properties": {"type": {"const": "function"}, "name": {"type": "string"}}}],
                    "description": "auto (the default with tools) needs --enable-auto-tool-choice"},
    "parallel_tool_calls": {"type": ["boolean", "null"]},
    "text": {"anyOf": [_NULL, {"type": "object", "additionalProperties": False,
                               "properties": {"format": {"anyOf": [_NULL, _TEXT_FORMAT]}, "verbosity": _NULL}}]},
    "reasoning": {"anyOf": [_NULL, {"type": "object", "properties": {"effort": {"enum": [*_EFFORTS, None]}}}]},
    "chat_template_kwargs": {"type": ["object", "null"], "maxProperties": MAX_KWARGS,
                             "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"}},
    "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    "priority": {"type": ["integer", "null"], "minimum": PRIORITY_MIN, "maximum": PRIORITY_MAX,
                 "description": "vLLM's: lower is more urgent (docs/deployment.md#priorities)"},
    "user": _STRING,
    **{name: {"description": "accepted and not used"} for name in ("service_tier", "prompt_cache_key",
                                                                    "safety_identifier")},
    # Not implemented: only the values that ask for nothing.
    "background": {"enum": [False, None]}, "truncation": {"enum": ["disabled", None]},
    "include": {"anyOf": [_NULL, {"type": "array", "maxItems": 0}]}, "top_logprobs": {"enum": [0, None]},
    "max_tool_calls": _NULL, "prompt": _NULL, "conversation": _NULL,
    **{name: _NULL for name in _NOT_IN_A_RESPONSE - {"n"}}, "n": {"enum": [1, None]},
}


def responses_body(sampling: dict[str, Schema]) -> Schema:
    """A /v1/responses body; `sampling`: the sampling parameters' property schemas (any may be given)."""
    properties = {**{name: sampling[name] for name in sorted(_SAMPLING_FIELDS)}, **_OWN}
    properties["max_output_tokens"] = {**sampling["max_tokens"], "minimum": 1, "default": None,
                                       "description": "null: until the end of the turn or of the context"}
    assert properties.keys() == _KNOWN, "a field of sampling.py is not documented"
    return {"type": "object", "required": ["input"], "properties": properties, "additionalProperties": True,
            "description": "a field not listed here is ignored and named in the X-Ignored-Fields response header "
                           "(a 400 with serve --strict-fields)"}


_ERRORS = {"400": "the body, a field or a query parameter is invalid (the message names it)",
           "401": "missing or wrong API key", "404": "no such model, or no such stored response",
           "409": "X-Request-Id is in use by another request", "413": "the body is too large",
           "429": "too many requests in flight", "503": "no worker answered, or the store is unreachable"}
_RESPONSE: Schema = {"type": "object", "required": ["id", "object", "status", "output"],
                     "properties": {"object": {"const": "response"}, "output": {"type": "array"}}}
_ID: Schema = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}


def responses_paths(sampling: dict[str, Schema]) -> dict[str, Schema]:
    """The Responses routes' operations, by path."""
    answer = {"application/json": {"schema": _RESPONSE},
              "text/event-stream": {"schema": {"type": "string", "description": "the Responses events"}}}
    deleted = {"type": "object", "required": ["id", "deleted"], "properties": {"deleted": {"const": True}}}
    page = {"type": "object", "required": ["object", "data", "has_more"],
            "properties": {"data": {"type": "array"}, "has_more": {"type": "boolean"}}}
    listing = [_ID, {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                "maximum": _MAX_LIMIT, "default": 20}},
               {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"], "default": "desc"}},
               {"name": "after", "in": "query", "schema": {"type": "string"}, "description": "an item's id"}]
    create = {"summary": "Create a response", "security": [{"apiKey": []}],
              "requestBody": {"required": True, "content": {"application/json": {"schema": responses_body(sampling)}}},
              "responses": _answers(answer, "400", "401", "404", "409", "413", "429", "503")}
    return {
        "/v1/responses": {"post": create},
        "/v1/responses/{response_id}": {
            "get": _stored("A stored response", [_ID], _json(_RESPONSE), "400", "401", "404", "503"),
            "delete": _stored("Delete a stored response", [_ID], _json(deleted), "401", "404", "503")},
        "/v1/responses/{response_id}/input_items": {
            "get": _stored("A stored response's input items", listing, _json(page), "400", "401", "404", "503")},
        "/v1/responses/{response_id}/cancel": {
            "post": _stored("Cancel a background response: none runs here (a 400 for a stored one)", [_ID], None,
                            "400", "401", "404", "503")},
    }


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def _stored(summary: str, parameters: list[Schema], content: Schema | None, *statuses: str) -> Schema:
    return {"summary": summary, "security": [{"apiKey": []}], "parameters": parameters,
            "responses": _answers(content, *statuses)}


def _answers(content: Schema | None, *statuses: str) -> Schema:
    """200 with `content` (None: never a 200), and the error statuses, in OpenAI's shape."""
    error = _json({"$ref": "#/components/schemas/Error"})
    answers = {"200": {"description": "the answer", "content": content}} if content is not None else {}
    return {**answers, **{status: {"description": _ERRORS[status], "content": error} for status in statuses}}
