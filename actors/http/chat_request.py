"""OpenAI /v1/chat/completions bodies in a batch file: parsing into wire messages and sampling
parameters, and the `chat.completion` choice objects of the output.

Strict like completions (actors/http/completion_request.py): unknown fields are an error, and so are
the chat features we do not implement (tools), so nothing is silently ignored.
Content may be a string or a list of text and image_url parts (actors/http/content_parts.py).
"""

from __future__ import annotations

from typing import Any

from actors.http.completion_request import sampling_fields
from actors.http.content_parts import parse_content
from pipeline.request.sampling_params import SamplingParams
from queue_adapters.codec import ChatMessage

CHAT_URL = "/v1/chat/completions"
_UNSUPPORTED = {"tools", "tool_choice", "functions", "function_call", "parallel_tool_calls",
                "stream_options", "audio", "modalities", "prediction"}


def parse_chat_body(body: Any) -> tuple[list[ChatMessage], dict[str, Any], list[bytes]]:
    """(messages, wire params, the images of image_url parts in order); ValueError naming the field
    for anything we cannot run as asked."""
    params = sampling_fields(body, "messages", _UNSUPPORTED)
    images: list[bytes] = []
    messages = parse_messages(body["messages"], images)
    params = _completion_names(params)
    SamplingParams.from_dict(params)  # validates every remaining field, naming it
    return messages, params, images


def parse_messages(messages: Any, images: list[bytes]) -> list[ChatMessage]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{index}] must be an object with role and content")
        unknown = sorted(set(message) - {"role", "content", "name"})
        if unknown:
            raise ValueError(f"messages[{index}]: only role, content and name are supported, got {', '.join(unknown)}")
        role, content, name = message.get("role"), message.get("content"), message.get("name")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{index}].role must be a non-empty string")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"messages[{index}].name must be a non-empty string")
        parsed.append(ChatMessage(role=role, content=parse_content(content, f"messages[{index}].content", images),
                                  name=name))
    return parsed


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


def chat_choice(choice: dict[str, Any], tokenizer: Any | None) -> dict[str, Any]:
    """A `chat.completion` choice from an assembled result's choice (plus token_ids, as completions have)."""
    entries = choice["logprobs"]
    return {"index": choice["index"], "message": {"role": "assistant", "content": choice["text"]},
            "logprobs": chat_logprobs(entries, tokenizer) if entries is not None else None,
            "finish_reason": choice["finish_reason"], "stop_reason": choice["stop_reason"],
            "token_ids": choice["token_ids"]}


def chat_logprobs(entries: list[dict[str, Any]], tokenizer: Any | None) -> dict[str, Any]:
    """Chat's logprobs object (`content` entries) for some of a choice's tokens."""
    return {"content": [_content_logprob(entry, tokenizer) for entry in entries]}


def _content_logprob(entry: dict[str, Any], tokenizer: Any | None) -> dict[str, Any]:
    return {**_token_logprob(entry["token_id"], entry["logprob"], tokenizer),
            "top_logprobs": [_token_logprob(token_id, logprob, tokenizer) for token_id, logprob in entry["top"]]}


def _token_logprob(token_id: int, logprob: float, tokenizer: Any | None) -> dict[str, Any]:
    token = tokenizer.decode([token_id]) if tokenizer is not None else f"token_id:{token_id}"
    # A token that ends inside a UTF-8 character decodes to U+FFFD; its bytes say so, as vLLM's do.
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
