"""The gateway's guards before any work: API key, body size, large bodies off the event loop,
in-flight limit."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import Request

from actors.http.errors import ApiError, invalid, parse_json_body
from actors.http.tenancy.api_keys import ApiKeys

T = TypeVar("T")

# A body at least this large is parsed and checked in a worker thread, so the event loop keeps serving
# every other stream meanwhile: the GIL passes between the two every few milliseconds, where parsing
# a 4 MB logit_bias or 100,000 stop strings on the loop held every stream for most of a second.
OFF_LOOP_BYTES = 65_536


def check_api_key(request: Request, api_key: str | ApiKeys | None) -> None:
    """`api_key`: --api-key's one key, or --api-keys' file (actors/http/tenancy/api_keys.py)."""
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not key_matches(token.strip(), api_key):
        raise ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", code="invalid_api_key")


def key_matches(given: str, api_key: str | ApiKeys) -> bool:
    """Constant-time for the one key, by digest for a key file: a key must not leak through response timing."""
    if isinstance(api_key, ApiKeys):
        return api_key.tenant_of(given) is not None
    return hmac.compare_digest(given.encode(), api_key.encode())


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


async def read_json_body(request: Request, max_bytes: int) -> tuple[Any, int]:
    """The body parsed as JSON (a 400 naming the field when it is not), and its size in bytes."""
    raw = await read_body_limited(request, max_bytes)
    return await off_loop_if_large(len(raw), parse_json_body, raw), len(raw)


async def read_json_object(request: Request, api_key: str | ApiKeys | None, max_bytes: int) -> dict[str, Any]:
    """A small route's body: the API key checked, then the body parsed, which must be a JSON object."""
    check_api_key(request, api_key)
    body, _ = await read_json_body(request, max_bytes)
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    return body


async def off_loop_if_large(size: int, work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` here for a small body, in a worker thread for one of OFF_LOOP_BYTES or more."""
    if size < OFF_LOOP_BYTES:
        return work(*args)
    return await asyncio.to_thread(work, *args)


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
