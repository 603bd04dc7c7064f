"""The API key as Anthropic's clients send it, in `x-api-key`, or as OpenAI's do, `Authorization: Bearer`
(the Anthropic SDK's `auth_token`): either header, compared in constant time."""

from __future__ import annotations

from starlette.requests import Request

from actors.http.errors import ApiError
from actors.http.limits import check_api_key, key_matches
from actors.http.tenancy.api_keys import ApiKeys

_WRONG_KEY = "missing or wrong API key (x-api-key: KEY, or Authorization: Bearer KEY)"


def check_anthropic_key(request: Request, api_key: str | ApiKeys | None) -> None:
    if api_key is None:
        return
    given = request.headers.get("x-api-key")
    if given is None:
        try:
            check_api_key(request, api_key)
        except ApiError as error:
            raise ApiError(401, _WRONG_KEY, code=error.code) from None
        return
    if not key_matches(given.strip(), api_key):
        raise ApiError(401, _WRONG_KEY, code="invalid_api_key")


def caller(request: Request) -> str | None:
    """Who sent the request, for binding a client-chosen X-Request-Id to its owner (request_ids.py)."""
    return request.headers.get("authorization") or request.headers.get("x-api-key")
