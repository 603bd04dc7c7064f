"""The gateway's OpenAPI 3.1 document (GET /openapi.json): the request bodies the parsers accept, field by field.

The routes are plain Starlette routes that parse their bodies themselves (actors/http/bodies.py), so
FastAPI cannot infer anything; this module writes the document instead. The sampling fields are read
off SamplingParams (its dataclass fields, its type groups and its range table), so a new field or a
changed range shows up here without an edit, and a field of a kind this module does not know fails
loudly. Hand-written: the message and content-part shapes, and the bounds SamplingParams checks in
code (n, best_of, top_k, ...). Rules across fields (min_tokens <= max_tokens, best_of >= n) and the
model's limits (vocabulary, context length, --max-logprobs) are in the descriptions only: a 400 names them.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, fields
from functools import cache
from typing import Any

from actors.http.bodies import _REQUEST_ID
from actors.http.completion_request import MAX_PROMPTS
from actors.http.kobold.openapi_paths import kobold_paths
from pipeline.request import sampling_params as sp
from pipeline.request.param_checks import FLOAT32_MAX, INT64_MAX, INT64_MIN
from pipeline.request.structured_output import MAX_CHOICES, MAX_SPEC_CHARS
from pipeline.request.tools import MAX_ARGUMENTS_CHARS, MAX_NAME_CHARS, MAX_TOOL_CALLS, MAX_TOOLS, MAX_TOOLS_CHARS

Schema = dict[str, Any]

_INT64: Schema = {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}
_TOKEN_ID: Schema = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
_NON_EMPTY_STRINGS: Schema = {"type": "array", "items": {"type": "string", "minLength": 1}}
_TOKEN_ID_LIST: Schema = {"anyOf": [{"type": "array", "items": _TOKEN_ID}, {"type": "null"}]}
_BASE64_DATA_URI = r"^data:[^,]*;base64,(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"

# Bounds SamplingParams checks in code (_check_counts, _check_ranges), not in its _RANGES table.
_BOUNDS_IN_CODE: dict[str, Schema] = {
    "n": {"minimum": 1, "maximum": sp.MAX_N},
    "best_of": {"minimum": 1, "maximum": sp.MAX_N, "description": f"in [n, {sp.MAX_N}]; null: n"},
    "max_tokens": {"minimum": 0, "description": "null: until the context (max_model_len) is full; 0 scores the "
                                                "prompt only (completions with echo: true)"},
    "min_tokens": {"minimum": 0, "description": "at most max_tokens"},
    "logprobs": {"minimum": 0, "description": "at most the server's --max-logprobs"},
    "prompt_logprobs": {"minimum": 0, "description": "at most the server's --max-logprobs"},
    "truncate_prompt_tokens": {"minimum": 1},
    "mirostat_mode": {"enum": [0, 2], "description": "0: off, 2: mirostat v2"},
    "dynatemp_min": {"description": "at most dynatemp_max"},
    "length_penalty": {"description": "1 unless use_beam_search"},
    "temperature": {"description": "0 with use_beam_search"},
}
# Fields of no type group of SamplingParams: their accepted JSON shapes.
_SHAPES: dict[str, Schema] = {
    "top_k": {"anyOf": [{"const": -1}, {"type": "integer", "minimum": 1, "maximum": INT64_MAX}],
              "description": "-1: off; 0 is an error"},
    "stop": {"anyOf": [{"type": "string", "minLength": 1}, _NON_EMPTY_STRINGS, {"type": "null"}]},
    "dry_sequence_breakers": {"anyOf": [_NON_EMPTY_STRINGS, {"type": "null"}]},
    "stop_token_ids": _TOKEN_ID_LIST,
    "custom_token_bans": _TOKEN_ID_LIST,
    "logit_bias": {"anyOf": [
        {"type": "object", "propertyNames": {"pattern": r"^\s*[0-9]{1,18}\s*$"},
         "additionalProperties": {"type": "number", "minimum": -sp.MAX_LOGIT_BIAS, "maximum": sp.MAX_LOGIT_BIAS}},
        {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2, "prefixItems": [
            _TOKEN_ID, {"type": "number", "minimum": -sp.MAX_LOGIT_BIAS, "maximum": sp.MAX_LOGIT_BIAS}]}},
        {"type": "null"}], "description": "token id (a decimal string key) -> bias"},
    "early_stopping": {"anyOf": [{"type": "boolean"}, {"const": "never"}], "description": "only with use_beam_search"},
}


def _structured_output_shapes() -> dict[str, Schema]:
    """Structured outputs (pipeline/request/structured_output.py): at most one of these per request.
    Their content (a schema, regex or grammar that compiles) is checked when the request is built."""
    longest = MAX_SPEC_CHARS
    text = {"anyOf": [{"type": "string", "minLength": 1, "maxLength": longest}, {"type": "null"}]}
    schema = {"anyOf": [{"type": "object"}, {"type": "string", "maxLength": longest}, {"type": "null"}],
                "description": "a JSON schema, as an object or a JSON string"}
    choices = {"anyOf": [{"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_CHOICES},
                         {"type": "null"}]}
    json_schema = {"type": "object", "required": ["name"], "additionalProperties": False,
                   "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                                  "schema": {"type": "object"}, "strict": {"type": ["boolean", "null"]}}}
    structured_outputs = {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": {
        "json": schema, "regex": text, "choice": choices, "grammar": text, "json_object": {"type": ["boolean", "null"]},
        "whitespace_pattern": text}, "description": "vLLM's form: exactly one of json, regex, choice, grammar, "
                                                    "json_object"}
    return {
        "structured_outputs": {"anyOf": [structured_outputs, {"type": "null"}]},
        "response_format": {"anyOf": [{"type": "object", "required": ["type"], "additionalProperties": False,
                                       "properties": {"type": {"enum": ["text", "json_object", "json_schema"]},
                                                      "json_schema": json_schema}}, {"type": "null"}],
                            "description": "OpenAI's: json_schema needs json_schema.name and .schema"},
        "guided_json": schema,
        "guided_regex": {**text, "description": "a regular expression the whole answer matches"},
        "guided_choice": {**choices, "description": "the answer is one of these strings"},
        "guided_grammar": {**text, "description": "a GBNF (llama.cpp) or Lark grammar"},
        "guided_whitespace_pattern": {**text, "description": "the whitespace a JSON answer may hold (a regex)"},
    }


_SHAPES.update(_structured_output_shapes())


def sampling_properties() -> dict[str, Schema]:
    """One property per SamplingParams field, typed and bounded as SamplingParams checks it."""
    ranges = {name: bounds for name, *bounds in sp._RANGES}
    sizes = {name: (most, longest) for name, most, longest in sp.LIST_LIMITS}
    properties = {}
    for field in fields(sp.SamplingParams):
        schema = {**_typed(field.name), **_range(*ranges.get(field.name, (None, None, False, False)))}
        schema.update(_BOUNDS_IN_CODE.get(field.name, {}))
        if field.name in sizes:
            _limit_size(schema, *sizes[field.name])
        if field.default is not MISSING:
            schema["default"] = list(field.default) if isinstance(field.default, tuple) else field.default
        properties[field.name] = _nullable(schema)  # null: not given (max_tokens: until the context is full)
    return properties


def _nullable(schema: Schema) -> Schema:
    """`schema` also accepting null (SDKs send nulls for the fields they leave unset)."""
    if "anyOf" in schema:
        if {"type": "null"} not in schema["anyOf"]:
            schema["anyOf"].append({"type": "null"})
        return schema
    if "enum" in schema and None not in schema["enum"]:
        schema["enum"] = [*schema["enum"], None]
    kind = schema.get("type")
    if isinstance(kind, str):
        schema["type"] = [kind, "null"]
    elif isinstance(kind, list) and "null" not in kind:
        schema["type"] = [*kind, "null"]
    return schema


def _typed(name: str) -> Schema:
    if name in _SHAPES:  # before the type groups: top_k is an int with a hole at 0
        return copy.deepcopy(_SHAPES[name])
    if name in sp._FLOAT_FIELDS:  # the sampler's rows are float32
        return {"type": "number", "minimum": -FLOAT32_MAX, "maximum": FLOAT32_MAX}
    if name in sp._INT_FIELDS:
        return dict(_INT64)
    if name in sp._OPTIONAL_INT_FIELDS:
        return {**_INT64, "type": ["integer", "null"]}
    if name in sp._BOOL_FIELDS:
        return {"type": "boolean"}
    raise ValueError(f"SamplingParams.{name} has no OpenAPI schema: give it one in actors/http/openapi.py")


def _range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> Schema:
    bounds: Schema = {}
    if low is not None:
        bounds["exclusiveMinimum" if low_open else "minimum"] = low
    if high is not None:
        bounds["exclusiveMaximum" if high_open else "maximum"] = high
    return bounds


def _limit_size(schema: Schema, most: int, longest: int | None) -> None:
    """LIST_LIMITS on each form a list field takes: items (or ids of a map), and characters per string."""
    for form in schema.get("anyOf", [schema]):
        if form.get("type") == "array":
            form["maxItems"] = most
            if longest is not None and form["items"].get("type") == "string":
                form["items"]["maxLength"] = longest
        elif form.get("type") == "object":
            form["maxProperties"] = most
        elif form.get("type") == "string" and longest is not None:
            form["maxLength"] = longest


def _gateway_fields() -> dict[str, Schema]:
    """The fields every generation body has besides the sampling ones."""
    return {
        "model": {"type": ["string", "null"],
                  "description": "the served model (GET /v1/models) or a loaded LoRA adapter; another name is a 404"},
        "user": {"description": "accepted and not used (any JSON value)"},
        "metadata": {"description": "accepted and not used (any JSON value)"},
        "store": {"description": "accepted and not used (any JSON value)"},
        "service_tier": {"description": "accepted and not used (any JSON value)"},
        "stream": {"type": ["boolean", "null"], "default": False, "description": "server-sent events"},
        "stream_options": {
            "type": ["object", "null"],
            "description": "needs stream: true; include_usage adds a last chunk with the usage, and with it "
                           "continuous_usage_stats gives every chunk the usage so far (vLLM's)",
            "properties": {"include_usage": {"type": ["boolean", "null"]},
                           "continuous_usage_stats": {"type": ["boolean", "null"]}},
            "additionalProperties": False},
    }


# vLLM's behaviour (actors/http/unknown_fields.py): other top-level fields are ignored, logged and named in
# the X-Ignored-Fields response header; `serve --strict-fields` makes them a 400.
_OTHER_FIELDS: Schema = {"additionalProperties": True,
                         "description": "a field not listed here is ignored and named in the X-Ignored-Fields "
                                        "response header (a 400 with serve --strict-fields); OpenAI's and vLLM's "
                                        "fields that this server does not implement are a 400"}


def completion_body() -> Schema:
    token_ids = {"type": "array", "items": _TOKEN_ID, "minItems": 1}
    one_of_several = {"anyOf": [{"type": "string"}, token_ids]}
    prompt = {"anyOf": [{"type": "string"}, token_ids,
                        {"type": "array", "items": one_of_several, "minItems": 1, "maxItems": MAX_PROMPTS}],
              "description": "one prompt (text of at most max_model_len x 64 characters, or token ids in the "
                             f"model's vocabulary) or a list of up to {MAX_PROMPTS} of them: one choice per "
                             "prompt x n, numbered prompt_index * n + j"}
    echo = {"type": ["boolean", "null"], "default": False,
            "description": "each choice starts with its prompt: in text and, with logprobs, in logprobs (the "
                           "prompt's first token has null logprob and top_logprobs); max_tokens 0 needs it"}
    not_yet = {"suffix": {"enum": ["", None], "description": "a suffix is not supported yet"}}
    properties = {"prompt": prompt, "echo": echo, **_gateway_fields(), **sampling_properties(), **not_yet}
    return {"type": "object", "required": ["prompt"], "properties": properties, **_OTHER_FIELDS}


_NO_LIST: Schema = {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}


def chat_body() -> Schema:
    sampling = sampling_properties()
    sampling["max_tokens"]["default"] = None  # a chat answer runs to the end of its turn unless capped
    sampling["max_tokens"] = {**sampling["max_tokens"], "minimum": 1,
                              "description": "null: until the context (max_model_len) is full"}
    sampling["logprobs"] = {"type": ["boolean", "null"], "default": False,
                            "description": "per-token logprobs of the answer"}
    chat_only = {
        "top_logprobs": {**_INT64, "type": ["integer", "null"], "minimum": 0,
                         "description": "alternatives per token; needs logprobs: true"},
        "max_completion_tokens": {**sampling["max_tokens"], "description": "max_tokens' other name; not both"},
        **_tool_fields(),
        # The deprecated function calling is not supported: only the values that ask for none of it.
        "functions": {**_NO_LIST, "description": "not supported (use tools)"},
        "function_call": {"enum": [None, "none"], "description": "not supported (use tool_choice)"},
    }
    properties = {"messages": {"type": "array", "minItems": 1, "items": _message()},
                  **_gateway_fields(), **sampling, **chat_only}
    return {"type": "object", "required": ["messages"], "properties": properties, **_OTHER_FIELDS}


def _tool_fields() -> Schema:
    function = {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS},
        "description": {"type": "string"}, "parameters": {"type": "object", "description": "a JSON schema"},
        "strict": {"type": ["boolean", "null"]}}}
    tool = {"type": "object", "required": ["type", "function"], "additionalProperties": False,
            "properties": {"type": {"const": "function"}, "function": function}}
    named = {"type": "object", "required": ["type", "function"], "additionalProperties": False, "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "additionalProperties": False,
                     "properties": {"name": {"type": "string"}}}}}
    return {
        "tools": {"anyOf": [{"type": "array", "maxItems": MAX_TOOLS, "items": tool}, {"type": "null"}],
                  "description": f"rendered by the chat template; at most {MAX_TOOLS_CHARS} characters of JSON; "
                                 "function names unique"},
        "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required", None]}, named],
                        "description": "auto (the default with tools) needs --enable-auto-tool-choice; required "
                                       "and a named function constrain the answer to the call(s); a named "
                                       "function must be among the tools"},
        "parallel_tool_calls": {"type": ["boolean", "null"], "default": True,
                                "description": "false: at most one call"},
    }


def _tool_call() -> Schema:
    text = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}
    function = {"type": "object", "required": ["name", "arguments"], "additionalProperties": False,
                "properties": {"name": text, "arguments": {"type": "string", "maxLength": MAX_ARGUMENTS_CHARS,
                                                           "description": "the text of a JSON object"}}}
    return {"type": "object", "required": ["id", "function"], "additionalProperties": False,
            "properties": {"id": text, "type": {"const": "function"}, "function": function,
                           "index": {"type": "integer", "description": "a streamed call's; not used"}}}


def _message() -> Schema:
    text_part = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
                 "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
    image_url = {"type": "object", "required": ["url"], "additionalProperties": False,
                 "properties": {"url": {"type": "string", "pattern": _BASE64_DATA_URI,
                                        "description": "a base64 data: URI; URLs are not fetched"},
                                "detail": {"enum": ["auto", None]}}}
    image_part = {"type": "object", "required": ["type", "image_url"], "additionalProperties": False,
                  "properties": {"type": {"const": "image_url"}, "image_url": image_url},
                  "description": "for vision models only (a 400 otherwise)"}
    content = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"oneOf": [text_part,
                                                                                                   image_part]}}]}
    return {"type": "object", "required": ["role"], "additionalProperties": False,
            "description": "content is required, except null in an assistant message with tool_calls",
            "properties": {"role": {"type": "string", "minLength": 1},
                           "content": {"anyOf": [content, {"type": "null"}]},
                           "name": {"type": ["string", "null"], "minLength": 1, "description": "the participant"},
                           "tool_calls": {"anyOf": [{"type": "array", "maxItems": MAX_TOOL_CALLS,
                                                     "items": _tool_call()}, {"type": "null"}],
                                          "description": "assistant messages only"},
                           "tool_call_id": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_NAME_CHARS,
                                            "description": "tool messages only (required there): the call answered"}}}


def tokenize_body() -> Schema:
    """A string prompt is tokenized as it is, and then messages is not read; unknown fields are a 400."""
    flag = {"type": ["boolean", "null"]}
    return {"type": "object", "description": "prompt (a string), or else messages (rendered by the chat template)",
            "additionalProperties": False,
            "properties": {"model": {}, "prompt": {}, "messages": {},
                           "add_special_tokens": {**flag, "description": "add the tokenizer's special tokens "
                                                  "(BOS, ...): by default for a prompt, not for messages (the "
                                                  "template writes its own), as vLLM's"},
                           "tools": {"type": ["array", "null"], "description": "messages only: OpenAI's tools, "
                                     "rendered by the chat template", "items": {
                                         "type": "object", "required": ["type", "function"],
                                         "properties": {"type": {"const": "function"}, "function": {
                                             "type": "object", "required": ["name"],
                                             "properties": {"name": {"type": "string", "minLength": 1}}}}}},
                           "add_generation_prompt": {**flag, "default": True, "description": "messages only"},
                           "continue_final_message": {**flag, "default": False,
                                                      "description": "messages only; leaves the last message open "
                                                                     "(needs add_generation_prompt: false)"}},
            "if": {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
            "else": {"required": ["messages"],
                     "properties": {"messages": {"type": "array", "minItems": 1, "items": _message()}}}}


def detokenize_body() -> Schema:
    return {"type": "object", "required": ["tokens"],
            "properties": {"tokens": {"type": "array", "items": _TOKEN_ID,
                                      "description": "token ids in the model's vocabulary"}}}


_ERROR: Schema = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
_ERROR_STATUSES = {"400": "the body or a field is invalid (the message names it)", "401": "missing or wrong API key",
                   "404": "no such model", "413": "the body is too large", "429": "too many requests in flight",
                   "503": "no worker answered, or the request queue is unreachable"}
_REQUEST_ID_CONFLICT = {"409": "X-Request-Id is in use by another request (another body, or another client)"}
_EVENT: Schema = {"type": "object", "required": ["data"], "description": "one server-sent event",
                  "properties": {"data": {"type": "string", "description": "a JSON chunk; the last is [DONE]"}}}
_GENERATION_RESPONSE: Schema = {"type": "object", "required": ["id", "object", "created", "model", "choices"],
                                "properties": {"choices": {"type": "array"}, "usage": {"type": "object"}}}


def _operation(summary: str, body: Schema, answer: Schema, *, generation: bool = False) -> Schema:
    """Generation operations also stream (SSE), and take an X-Request-Id."""
    content = {"application/json": {"schema": answer}}
    if generation:
        content["text/event-stream"] = {"schema": _EVENT}
    responses: Schema = {"200": {"description": "the answer", "content": content}}
    if generation:
        responses["200"]["headers"] = {"X-Ignored-Fields": {
            "description": "the body's unknown top-level fields, which had no effect (percent-encoded, comma-"
                           "separated, at most 32); absent when there were none", "schema": {"type": "string"}}}
    for status, description in {**_ERROR_STATUSES, **(_REQUEST_ID_CONFLICT if generation else {})}.items():
        responses[status] = {"description": description,
                             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    operation: Schema = {"summary": summary, "security": [{"apiKey": []}], "responses": responses,
                         "requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}
    if generation:
        operation["parameters"] = [{"name": "X-Request-Id", "in": "header", "required": False,
                                    "description": "an idempotency key: the same client's retry of the same "
                                                   "body attaches to the first answer",
                                    "schema": {"type": "string", "pattern": _REQUEST_ID.pattern}}]
    return operation


@cache
def _document() -> Schema:
    tokens = {"type": "object", "required": ["tokens", "count", "max_model_len"],
              "properties": {"tokens": {"type": "array", "items": {"type": "integer"}}, "count": {"type": "integer"}}}
    text = {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Aqueduct", "version": "1",
                 "description": "OpenAI-compatible completions and chat. An unknown top-level field of a "
                                "generation body is ignored and named in the X-Ignored-Fields response header "
                                "(a 400 with serve --strict-fields); elsewhere unknown fields are a 400, and so "
                                "is an integer field given a number with a fraction part or exponent (1.0 for 1)."},
        "paths": {
            "/v1/completions": {"post": _operation("Complete a prompt", completion_body(), _GENERATION_RESPONSE,
                                                   generation=True)},
            "/v1/chat/completions": {"post": _operation("Answer a chat", chat_body(), _GENERATION_RESPONSE,
                                                        generation=True)},
            "/tokenize": {"post": _operation("Tokenize a prompt or chat", tokenize_body(), tokens)},
            "/detokenize": {"post": _operation("Decode token ids", detokenize_body(), text)},
            **kobold_paths(sampling_properties()),
        },
        "components": {"schemas": {"Error": _ERROR},
                       "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer",
                                                      "description": "when the server runs with --api-key"}}},
    }


def openapi_document() -> Schema:
    """The whole document (a fresh copy: callers may edit it)."""
    return copy.deepcopy(_document())
