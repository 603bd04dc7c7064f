"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the matching status."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from pipeline.request.untrusted import UntrustedValueError, loads_json

# Engine error codes (wire `error.code`) -> HTTP status; anything else is a bug or an outage.
# lora_unavailable: the adapter named as the model was unloaded or failed to load while the request waited.
_STATUS_OF_ENGINE_CODE = {"invalid_request": 400, "lora_unavailable": 404, "queue_timeout": 503, "poison": 500,
                          "worker_died": 503}
_TYPE_OF_STATUS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 409: "conflict",
                   413: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable",
                   500: "internal_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _TYPE_OF_STATUS.get(self.status, "error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def from_engine_error(error: dict[str, Any]) -> ApiError:
    """An error reply of the engine (a too-long prompt, a token id outside the vocabulary, ...)."""
    code = error.get("code") or "error"
    return ApiError(_STATUS_OF_ENGINE_CODE.get(code, 500), error.get("message") or code, code=code)


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_request")


def parse_json_body(raw: bytes) -> Any:
    """A request body as JSON, checked once at the edge (pipeline/request/untrusted.py): valid Unicode,
    64-bit integers, finite numbers, bounded nesting; anything else is a 400 naming the field."""
    try:
        return loads_json(raw)
    except UntrustedValueError as error:
        raise invalid(str(error), error.field) from None
