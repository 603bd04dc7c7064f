"""The OpenAI routes' part of /openapi.json (actors/http/openapi.py merges it in): the request bodies the
parsers accept, field by field.

The routes are plain Starlette routes that parse their bodies themselves (actors/http/openai/parse.py),
so FastAPI cannot infer anything; this module writes their part instead. The sampling fields are
actors/http/sampling_schema.py's. Hand-written: the message and content-part shapes. Rules across fields
(min_tokens <= max_tokens, best_of >= n) and the model's limits (vocabulary, context length,
--max-logprobs) are in the descriptions only: a 400 names them.
"""

from __future__ import annotations

from actors.http.openai.completion_request import MAX_PROMPTS
from actors.http.openai.embedding_request import ENCODING_FORMATS, MAX_INPUTS
from actors.http.openai.parse import _REQUEST_ID
from actors.http.openai.template_kwargs import REASONING_EFFORTS
from actors.http.sampling_schema import INT64, TOKEN_ID, Schema, sampling_properties
from pipeline.request.chat_template_kwargs import MAX_KWARGS
from pipeline.request.tools import MAX_ARGUMENTS_CHARS, MAX_NAME_CHARS, MAX_TOOL_CALLS, MAX_TOOLS, MAX_TOOLS_CHARS
from queue_adapters.codec import PRIORITY_MAX, PRIORITY_MIN

_BASE64_DATA_URI = r"^data:[^,]*;base64,(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def _gateway_fields() -> dict[str, Schema]:
    """The fields every generation body has besides the sampling ones."""
    return {
        "model": {"type": ["string", "null"],
                  "description": "the served model (GET /v1/models) or a loaded LoRA adapter; another name is a 404"},
        "user": {"description": "a string splits a shared API key's fair share between end users (the tenant "
                                "becomes {tenant}/{user}, docs/deployment.md#tenants-and-fair-share); any other "
                                "JSON value is accepted and not used"},
        "metadata": {"description": "accepted and not used (any JSON value)"},
        "store": {"description": "accepted and not used (any JSON value)"},
        "service_tier": {"description": "accepted and not used (any JSON value)"},
        "priority": {"type": ["integer", "null"], "minimum": PRIORITY_MIN, "maximum": PRIORITY_MAX, "default": 0,
                     "description": "vLLM's: lower is more urgent; queued on a more urgent lane and scheduled "
                                    "first under --scheduling-policy priority (docs/deployment.md#priorities)"},
        "stream": {"type": ["boolean", "null"], "default": False, "description": "server-sent events"},
        "stream_options": {
            "type": ["object", "null"],
            "description": "needs stream: true; include_usage adds a last chunk with the usage, and with it "
                           "continuous_usage_stats gives every chunk the usage so far (vLLM's)",
            "properties": {"include_usage": {"type": ["boolean", "null"]},
                           "continuous_usage_stats": {"type": ["boolean", "null"]}},
            "additionalProperties": False},
    }


# vLLM's behaviour (actors/http/openai/unknown_fields.py): other top-level fields are ignored, logged and named in
# the X-Ignored-Fields response header; `serve --strict-fields` makes them a 400.
_OTHER_FIELDS: Schema = {"additionalProperties": True,
                         "description": "a field not listed here is ignored and named in the X-Ignored-Fields "
                                        "response header (a 400 with serve --strict-fields); OpenAI's and vLLM's "
                                        "fields that this server does not implement are a 400"}


def completion_body() -> Schema:
    token_ids = {"type": "array", "items": TOKEN_ID, "minItems": 1}
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
        "top_logprobs": {**INT64, "type": ["integer", "null"], "minimum": 0,
                         "description": "alternatives per token; needs logprobs: true"},
        "max_completion_tokens": {**sampling["max_tokens"], "description": "max_tokens' other name; not both"},
        **_tool_fields(),
        # The deprecated function calling is not supported: only the values that ask for none of it.
        "functions": {**_NO_LIST, "description": "not supported (use tools)"},
        "function_call": {"enum": [None, "none"], "description": "not supported (use tool_choice)"},
        "chat_template_kwargs": {"type": ["object", "null"], "maxProperties": MAX_KWARGS,
                                 "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"},
                                 "description": "the chat template's extra variables (e.g. enable_thinking), over "
                                                "--default-chat-template-kwargs; the template's own names are a 400"},
        "reasoning_effort": {"enum": [*REASONING_EFFORTS, None],
                             "description": "the chat template's variable reasoning_effort"},
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


def embeddings_body() -> Schema:
    """/v1/embeddings: unknown fields are a 400; the model's limits (vocabulary, context length, width for
    `dimensions`) are a 400 naming them."""
    token_ids = {"type": "array", "items": TOKEN_ID, "minItems": 1}
    text = {"type": "string", "minLength": 1}
    return {"type": "object", "required": ["input"], "additionalProperties": False, "properties": {
        "input": {"anyOf": [text, token_ids, {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS,
                                              "items": {"anyOf": [text, token_ids]}}],
                  "description": "a text or token ids, or a list of up to "
                                 f"{MAX_INPUTS} of them: one embedding each, in order"},
        "model": {"type": ["string", "null"], "description": "the served model (GET /v1/models)"},
        "encoding_format": {"enum": [*ENCODING_FORMATS, None], "default": "float",
                            "description": "float: a list of numbers; base64: the little-endian float32 bytes"},
        "dimensions": {"type": ["integer", "null"], "minimum": 1, "maximum": INT64["maximum"],
                       "description": "keep the first N entries (Matryoshka), renormalised when the model "
                                      "normalises; more than the model's width is a 400"},
        "user": {"type": ["string", "null"], "description": "accepted and not used"}}}


_EMBEDDINGS_RESPONSE: Schema = {"type": "object", "required": ["object", "data", "model", "usage"],
                                "properties": {"data": {"type": "array"}, "usage": {"type": "object"}}}


def detokenize_body() -> Schema:
    return {"type": "object", "required": ["tokens"],
            "properties": {"tokens": {"type": "array", "items": TOKEN_ID,
                                      "description": "token ids in the model's vocabulary"}}}


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


def openai_paths() -> dict[str, Schema]:
    """The OpenAI routes' operations, by path."""
    tokens = {"type": "object", "required": ["tokens", "count", "max_model_len"],
              "properties": {"tokens": {"type": "array", "items": {"type": "integer"}}, "count": {"type": "integer"}}}
    text = {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}
    return {
        "/v1/completions": {"post": _operation("Complete a prompt", completion_body(), _GENERATION_RESPONSE,
                                               generation=True)},
        "/v1/chat/completions": {"post": _operation("Answer a chat", chat_body(), _GENERATION_RESPONSE,
                                                    generation=True)},
        "/v1/embeddings": {"post": _operation("Embed texts or token ids (a server started with --runner pooling; "
                                              "others answer 400)", embeddings_body(), _EMBEDDINGS_RESPONSE)},
        "/tokenize": {"post": _operation("Tokenize a prompt or chat", tokenize_body(), tokens)},
        "/detokenize": {"post": _operation("Decode token ids", detokenize_body(), text)},
    }
