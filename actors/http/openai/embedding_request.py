"""OpenAI's /v1/embeddings body -> one wire request per input (`{id}:{index}` for several, as completions'
prompt lists; parse.prompt_ids).

`input`: a string, a list of strings, token ids, or a list of token-id lists, each not empty;
`encoding_format`: float (a list of numbers) or base64 (the little-endian float32 bytes);
`dimensions`: a Matryoshka width (the worker refuses one wider than the model); `user` and `model` as
everywhere. Unknown fields are a 400 (this body has no sampling fields to pass through).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from actors.http.errors import invalid
from actors.http.generation.body_fields import served_adapter
from actors.http.generation.request import GatewayRequest
from actors.http.openai.parse import _REQUEST_ID, prompt_ids
from queue_adapters.codec import CodecError, WireRequest, check_request

EMBEDDING_FIELDS = ("input", "model", "encoding_format", "dimensions", "user")
ENCODING_FORMATS = ("float", "base64")
MAX_INPUTS = 2048  # OpenAI's limit on a list of inputs


@dataclass(slots=True)
class EmbeddingRequest(GatewayRequest):
    encoding_format: str = "float"


def parse_embedding_body(body: Any, model_names: tuple[str, ...], request_id: str | None,
                         request_timeout_s: float | None = None) -> EmbeddingRequest:
    """The body as wire requests; a 400 naming the field for anything else, a 404 for another model.
    `request_timeout_s` (--request-timeout) becomes each wire request's deadline, as a generation's."""
    if not isinstance(body, dict):
        raise invalid(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(str(key) for key in body if key not in EMBEDDING_FIELDS)
    if unknown:
        raise invalid(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(EMBEDDING_FIELDS)})", unknown[0])
    served_adapter(body.get("model"), model_names, [])  # a 404 for a model not served (no adapters here)
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise invalid("user must be a string", "user")
    encoding_format = body.get("encoding_format")
    if encoding_format is None:
        encoding_format = "float"
    if encoding_format not in ENCODING_FORMATS:
        raise invalid(f"encoding_format must be float or base64, got {encoding_format!r}", "encoding_format")
    dimensions = _dimensions(body.get("dimensions"))
    inputs = _inputs(body.get("input"))
    response_id = _response_id(request_id)
    deadline_ms = int((time.time() + request_timeout_s) * 1000) if request_timeout_s else None
    wires = []
    for wire_id, item in zip(prompt_ids(response_id, len(inputs)), inputs, strict=True):
        field = {"prompt": item} if isinstance(item, str) else {"prompt_token_ids": item}
        wire = WireRequest(id=wire_id, embed=True, dimensions=dimensions, deadline_ms=deadline_ms, **field)
        try:
            check_request(wire)
        except CodecError as error:
            raise invalid(str(error), "input") from None
        wires.append(wire)
    # chat=True: the flow passes a worker's refusal on as it is (it renames `prompt` fields for completions only).
    return EmbeddingRequest(wires, chat=True, stream=False, response_id=response_id,
                            encoding_format=encoding_format)


def _dimensions(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(f"dimensions must be a positive integer, got {value!r}", "dimensions")
    return value


def _inputs(value: Any) -> list[str | list[int]]:
    """Each input: a non-empty string or a non-empty list of token ids."""
    if isinstance(value, str) or _is_token_ids(value):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(isinstance(v, str) or _is_token_ids(v) for v in value):
        items = value
    else:
        raise invalid("input must be a string, a list of strings, a list of token ids, or a list of token-id "
                      "lists, none of them empty", "input")
    if len(items) > MAX_INPUTS:
        raise invalid(f"input holds {len(items)} items; at most {MAX_INPUTS} are accepted", "input")
    if any(len(item) == 0 for item in items):
        raise invalid("input must not hold an empty string or an empty list of token ids", "input")
    return items


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(token, int) and not isinstance(token, bool) for token in value)


def _response_id(request_id: str | None) -> str:
    if request_id is None:
        return f"embd-{uuid.uuid4().hex}"
    if not _REQUEST_ID.match(request_id):
        raise invalid("X-Request-Id must be 1-128 characters of [A-Za-z0-9._:-]", "X-Request-Id")
    return request_id
