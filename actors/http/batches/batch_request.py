"""POST /v1/batches' body, checked: `input_file_id`, `endpoint`, `completion_window`, and optionally `metadata`
and `output_expires_after`, as OpenAI takes them. Unknown fields are a 400.

`completion_window` is the batch's deadline: OpenAI's `24h`, or any `{N}s`, `{N}m`, `{N}h` from 1 s to
MAX_WINDOW_S. `endpoint` is the batch's kind (shown on it); its lines may name any url this server batches,
which must be served here: embeddings on a server started with --runner pooling, completions and chat on the
others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from actors.http.batches.input_lines import EMBEDDINGS_URL, URLS
from actors.http.batches.records import FILE_TTL_S
from actors.http.errors import invalid

MAX_WINDOW_S = 7 * 24 * 3600
MIN_OUTPUT_TTL_S, MAX_OUTPUT_TTL_S = 3600, 30 * 24 * 3600  # OpenAI's bounds on expires_after.seconds
MAX_METADATA, MAX_KEY_CHARS, MAX_VALUE_CHARS = 16, 64, 512
_FIELDS = ("input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after")
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smh])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


@dataclass(slots=True)
class BatchRequest:
    input_file_id: str
    endpoint: str
    completion_window: str
    window_s: int
    metadata: dict[str, str] | None
    output_ttl_s: int


def parse_batch_request(body: dict[str, Any], pooling: bool) -> BatchRequest:
    unknown = sorted(str(key) for key in body if key not in _FIELDS)
    if unknown:
        raise invalid(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(_FIELDS)})", unknown[0])
    input_file_id = body.get("input_file_id")
    if not isinstance(input_file_id, str) or not input_file_id:
        raise invalid("input_file_id must be the id of a file uploaded with purpose batch", "input_file_id")
    window = body.get("completion_window")
    return BatchRequest(input_file_id, _endpoint(body.get("endpoint"), pooling), str(window), _window_s(window),
                        _metadata(body.get("metadata")), _output_ttl_s(body.get("output_expires_after")))


def _endpoint(value: Any, pooling: bool) -> str:
    if value not in URLS:
        raise invalid(f"endpoint must be one of {', '.join(URLS)}, got {str(value)[:100]!r}", "endpoint")
    if (value == EMBEDDINGS_URL) != pooling:
        served = "embeddings only (--runner pooling)" if pooling else "completions and chat (no --runner pooling)"
        raise invalid(f"this server cannot run {value} lines: it serves {served}", "endpoint")
    return str(value)


def _window_s(value: Any) -> int:
    match = _WINDOW.match(value) if isinstance(value, str) else None
    seconds = int(match[1]) * _UNIT_S[match[2]] if match else 0
    if not 1 <= seconds <= MAX_WINDOW_S:
        raise invalid(f"completion_window must be like 24h, 90m or 30s (at most {MAX_WINDOW_S // 3600}h), got "
                      f"{str(value)[:100]!r}", "completion_window")
    return seconds


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise invalid(f"metadata must be an object of at most {MAX_METADATA} string values", "metadata")
    for key, item in value.items():
        if len(key) > MAX_KEY_CHARS or not isinstance(item, str) or len(item) > MAX_VALUE_CHARS:
            raise invalid(f"metadata keys must be at most {MAX_KEY_CHARS} characters and values strings of at most "
                          f"{MAX_VALUE_CHARS}", "metadata")
    return dict(value)


def _output_ttl_s(value: Any) -> int:
    if value is None:
        return FILE_TTL_S
    seconds = value.get("seconds") if isinstance(value, dict) else None
    if not isinstance(value, dict) or set(value) - {"anchor", "seconds"} or value.get("anchor") != "created_at" \
            or isinstance(seconds, bool) or not isinstance(seconds, int) \
            or not MIN_OUTPUT_TTL_S <= seconds <= MAX_OUTPUT_TTL_S:
        raise invalid(f"output_expires_after must be {{anchor: created_at, seconds: {MIN_OUTPUT_TTL_S} to "
                      f"{MAX_OUTPUT_TTL_S}}}", "output_expires_after")
    return seconds
