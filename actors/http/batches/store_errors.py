"""The Batch API's routes answer 503 while their store (Redis) is unreachable, never a 500."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response

from actors.http.errors import ApiError

Handler = Callable[[Request], Awaitable[Response]]


def store_errors(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except (RedisError, OSError) as error:
            return ApiError(503, f"the batch store is unreachable: {error}", code="store_unavailable").response()
    return wrapped
