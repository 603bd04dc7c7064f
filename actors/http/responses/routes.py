"""The Responses routes, on the same app as the OpenAI ones: POST /v1/responses through
actors/http/generation/ (request.py's parser, shapes.py's answers), and the stored responses' routes:
GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items, POST /v1/responses/{id}/cancel."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from fastapi import FastAPI
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from actors.http.backends import Backend
from actors.http.errors import ApiError, invalid
from actors.http.generation.flow import Generation
from actors.http.generation.request import bounded_names
from actors.http.limits import check_api_key, off_loop_if_large, read_json_body
from actors.http.options import GatewayOptions
from actors.http.responses.listing import input_items_page
from actors.http.responses.records import Record, is_response_id
from actors.http.responses.request import Caller, ResponsesRequest, parse_responses_body
from actors.http.responses.shapes import ResponsesShape
from actors.http.responses.store import ResponseStore, tenant_of
from actors.http.responses.store_choice import LazyStore

log = structlog.get_logger(__name__)
Handler = Callable[[Request], Awaitable[Response]]


def add_responses_routes(app: FastAPI, generation: Generation, backend: Backend, options: GatewayOptions) -> None:
    store = LazyStore(backend)  # the backend's Redis exists once it has started

    async def save(request: ResponsesRequest, response: dict[str, Any]) -> None:
        record = await off_loop_if_large(request.context_bytes, request.record(response).encode)
        await store.get().save(request.tenant, request.response_id, record)

    shape = ResponsesShape(backend, save)

    async def parse(request: Request) -> ResponsesRequest:
        check_api_key(request, options.api_key)
        body, size = await read_json_body(request, options.max_request_bytes)
        tenant = tenant_of(request)
        previous, previous_size = await _previous(store.get(), tenant, body)
        caller = Caller(tenant, request.headers.get("x-request-id"),
                        options.served_model_names or (backend.model_name,), backend.adapter_names())
        parsed = await off_loop_if_large(size + previous_size, parse_responses_body, body, previous, caller, options)
        if parsed.ignored_fields:
            log.warning("request fields ignored", request_id=parsed.wire.id,
                        fields=bounded_names(parsed.ignored_fields))
        if "x-request-id" in request.headers:
            generation.claim_ids(parsed, [parsed.wire.id], request.headers.get("authorization"), body)
        return parsed

    async def create(request: Request) -> Response:
        parsed: list[ResponsesRequest] = []

        async def parse_and_keep(request: Request) -> ResponsesRequest:
            parsed.append(await parse(request))
            return parsed[0]

        response = await generation.serve(request, parse_and_keep, shape)
        if parsed and parsed[0].answered is not None and parsed[0].store:  # a whole answer: stored before it goes
            try:
                await save(parsed[0], parsed[0].answered)
            except (RedisError, OSError) as error:
                return _store_unavailable(error).response()
        return response

    @_store_errors
    async def retrieve(request: Request) -> Response:
        if request.query_params.get("stream") in ("true", "1"):
            raise invalid("streaming a stored response again is not supported", "stream")
        return JSONResponse((await _stored(request, store.get(), options)).response)

    @_store_errors
    async def delete(request: Request) -> Response:
        check_api_key(request, options.api_key)
        response_id = request.path_params["response_id"]
        if not is_response_id(response_id) or not await store.get().delete(tenant_of(request), response_id):
            raise _not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @_store_errors
    async def input_items(request: Request) -> Response:
        record = await _stored(request, store.get(), options)
        return JSONResponse(input_items_page(record.input_items, request.query_params))

    @_store_errors
    async def cancel(request: Request) -> Response:
        await _stored(request, store.get(), options)
        raise invalid("only responses created with background: true can be cancelled, and this server runs none in "
                      "the background (a streamed response is cancelled by closing its connection)")

    app.add_route("/v1/responses", create, methods=["POST"])
    app.add_route("/v1/responses/{response_id}", retrieve, methods=["GET"])
    app.add_route("/v1/responses/{response_id}", delete, methods=["DELETE"])
    app.add_route("/v1/responses/{response_id}/input_items", input_items, methods=["GET"])
    app.add_route("/v1/responses/{response_id}/cancel", cancel, methods=["POST"])


async def _previous(store: ResponseStore, tenant: str, body: Any) -> tuple[Record | None, int]:
    """previous_response_id's record and its size; a 404 when this tenant has no such stored response."""
    previous_id = body.get("previous_response_id") if isinstance(body, dict) else None
    if previous_id is None:
        return None, 0
    if not isinstance(previous_id, str):
        raise invalid("previous_response_id must be a string", "previous_response_id")
    try:
        text = await store.load(tenant, previous_id) if is_response_id(previous_id) else None
    except (RedisError, OSError) as error:
        raise _store_unavailable(error) from error
    if text is None:
        raise ApiError(404, f"previous response {previous_id!r} not found (unknown, expired, deleted, or created with "
                            "store: false)", param="previous_response_id", code="previous_response_not_found")
    return await off_loop_if_large(len(text), Record.decode, text), len(text)


async def _stored(request: Request, store: ResponseStore, options: GatewayOptions) -> Record:
    check_api_key(request, options.api_key)
    response_id = request.path_params["response_id"]
    text = await store.load(tenant_of(request), response_id) if is_response_id(response_id) else None
    if text is None:
        raise _not_found(response_id)
    return await off_loop_if_large(len(text), Record.decode, text)


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"response {response_id!r} not found (unknown, expired or deleted)", code="not_found")


def _store_unavailable(error: Exception) -> ApiError:
    return ApiError(503, f"the response store is unreachable: {error}", code="store_unavailable")


def _store_errors(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except (RedisError, OSError) as error:
            return _store_unavailable(error).response()
    return wrapped
