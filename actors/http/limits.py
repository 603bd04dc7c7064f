"""The gateway's guards before any work: API key, body size, in-flight limit."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from actors.http.errors import ApiError


def check_api_key(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    # Constant-time comparison: the key must not leak through response timing.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", code="invalid_api_key")


async def read_body_limited(request: Request, max_bytes: int) -> bytes:
    """The body, refused (413) as soon as it is known to exceed `max_bytes`: before parsing, and before
    reading all of it when the client declared its length."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"the request body exceeds {max_bytes} bytes", code="request_too_large")


class PendingLimit:
    """Counts requests in flight; refuses (429) above the limit instead of queueing without bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def acquire(self) -> None:
        if self.count >= self.limit:
            raise ApiError(429, f"too many requests in flight (limit {self.limit}); retry shortly",
                           code="rate_limit_exceeded", headers={"Retry-After": "1"})
        self.count += 1

    def release(self) -> None:
        self.count -= 1
