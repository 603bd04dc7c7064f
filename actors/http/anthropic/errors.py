"""Errors in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`, with the status our
other routes give: the error type follows the status as Anthropic's do (400 invalid_request_error,
401 authentication_error, 404 not_found_error, 429 rate_limit_error, 503 overloaded_error, ...)."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from actors.http.errors import ApiError

_TYPE_OF_STATUS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                   503: "overloaded_error", 529: "overloaded_error"}
_ENCODER = json.JSONEncoder(ensure_ascii=False)


def error_type(status: int) -> str:
    if status in _TYPE_OF_STATUS:
        return _TYPE_OF_STATUS[status]
    return "api_error" if status >= 500 else "invalid_request_error"  # 409: an X-Request-Id already in use


def anthropic_error_body(error: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(error.status), "message": error.message}}


def anthropic_error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(anthropic_error_body(error), status_code=error.status, headers=error.headers)


def sse_event(payload: dict[str, Any]) -> str:
    """One server-sent event as Anthropic sends it: its type on the `event:` line and in the data."""
    return f"event: {payload['type']}\ndata: {_ENCODER.encode(payload)}\n\n"


def error_event(error: ApiError) -> str:
    """An error after the stream started (the status is sent already): reported in-band."""
    return sse_event(anthropic_error_body(error))
