"""The KoboldAI routes, on the same app as the OpenAI ones (`/api/v1/...`, also under `/api/latest/...`
as KoboldAI serves them). Generation goes through actors/http/generation/ with Kobold's parser and shapes."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from actors.http.backends import Backend
from actors.http.errors import ApiError, invalid, parse_json_body
from actors.http.generation.flow import Generation
from actors.http.generation.request import GatewayRequest
from actors.http.kobold.errors import kobold_error_response
from actors.http.kobold.fields import KoboldFieldError, kobold_name, parse_generate_body
from actors.http.kobold.genkeys import Genkeys
from actors.http.kobold.shapes import KoboldShape
from actors.http.limits import check_api_key, off_loop_if_large, read_body_limited, read_json_body
from actors.http.options import GatewayOptions
from pipeline.request.sampling_params import SamplingParams
from queue_adapters.codec import CodecError, WireRequest, check_request

KOBOLD_API_VERSION = "1.2.4"  # KoboldAI United's API level: stop_sequence and use_default_badwordsids
KOBOLDCPP_VERSION = "1.63"  # what Aphrodite reports: clients enable streaming, tokencount, grammar, min_p by it
_PREFIXES = ("/api/v1", "/api/latest")
Handler = Callable[[Request], Awaitable[Response]]


def add_kobold_routes(app: FastAPI, generation: Generation, backend: Backend, options: GatewayOptions) -> None:
    genkeys = Genkeys()
    generate_shape, stream_shape = KoboldShape("kobold"), KoboldShape("kobold_stream")

    async def parse(request: Request, stream: bool) -> GatewayRequest:
        body, size = await _json_body(request, options)
        wire = await off_loop_if_large(size, _wire_request, body, backend, options, stream)
        genkey = body.get("genkey")
        if isinstance(genkey, str):
            genkeys.bind(request.headers.get("authorization"), genkey, wire.id)
        return GatewayRequest([wire], chat=False, stream=stream, response_id=wire.id)

    async def generate(request: Request) -> Response:
        return await generation.serve(request, functools.partial(parse, stream=False), generate_shape)

    async def generate_stream(request: Request) -> Response:
        return await generation.serve(request, functools.partial(parse, stream=True), stream_shape)

    @_kobold_errors
    async def abort(request: Request) -> Response:
        check_api_key(request, options.api_key)
        raw = await read_body_limited(request, options.max_request_bytes)
        body = parse_json_body(raw) if raw.strip() else {}
        genkey = body.get("genkey") if isinstance(body, dict) else None
        if not isinstance(genkey, str):
            raise invalid("genkey (a string) is required: this server runs many generations at once; a client "
                          "that closes its connection cancels its own", "genkey")
        request_id = genkeys.request_id(request.headers.get("authorization"), genkey)
        if request_id is not None:
            try:
                await backend.cancel(request_id)
            except (RedisError, OSError) as error:
                raise ApiError(503, f"the request queue is unreachable: {error}", code="unavailable") from error
        return JSONResponse({"success": request_id is not None})

    @_kobold_errors
    async def tokencount(request: Request) -> Response:
        body, _ = await _json_body(request, options)
        if set(body) - {"prompt"} or not isinstance(body.get("prompt"), str):
            raise invalid("the body must be {\"prompt\": a string}", "prompt")
        if backend.tokenizer is None:
            raise ApiError(400, "this model has no tokenizer", code="no_tokenizer")
        ids = list(backend.tokenizer.encode(body["prompt"], add_special_tokens=False))
        return JSONResponse({"value": len(ids), "ids": ids})

    def info(answer: Callable[[], dict[str, Any]]) -> Handler:
        @_kobold_errors
        async def route(request: Request) -> Response:
            check_api_key(request, options.api_key)
            return JSONResponse(answer())
        return route

    context = info(lambda: {"value": backend.max_model_len})
    for prefix in _PREFIXES:
        app.add_route(f"{prefix}/generate", generate, methods=["POST"])
        app.add_route(f"{prefix}/model", info(lambda: {"result": f"aqueduct/{backend.model_name}"}), methods=["GET"])
        app.add_route(f"{prefix}/info/version", info(lambda: {"result": KOBOLD_API_VERSION}), methods=["GET"])
        app.add_route(f"{prefix}/config/max_context_length", context, methods=["GET"])
        app.add_route(f"{prefix}/config/max_length", context, methods=["GET"])
    app.add_route("/api/extra/true_max_context_length", context, methods=["GET"])
    app.add_route("/api/extra/version", info(lambda: {"result": "KoboldCpp", "version": KOBOLDCPP_VERSION}),
                  methods=["GET"])
    app.add_route("/api/extra/generate/stream", generate_stream, methods=["POST"])
    app.add_route("/api/extra/abort", abort, methods=["POST"])
    app.add_route("/api/extra/tokencount", tokencount, methods=["POST"])


def _kobold_errors(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as error:
            return kobold_error_response(error)
    return wrapped


async def _json_body(request: Request, options: GatewayOptions) -> tuple[dict[str, Any], int]:
    """The body (a JSON object) and its size in bytes."""
    check_api_key(request, options.api_key)
    body, size = await read_json_body(request, options.max_request_bytes)
    if not isinstance(body, dict):
        raise invalid(f"the body must be a JSON object, got {type(body).__name__}")
    return body, size


def _wire_request(body: dict[str, Any], backend: Backend, options: GatewayOptions, stream: bool) -> WireRequest:
    try:
        kobold = parse_generate_body(body, backend.max_model_len)
    except KoboldFieldError as error:
        raise invalid(str(error), error.field) from None
    if stream and kobold.params.get("n", 1) != 1:
        raise invalid(f"n must be 1 to stream (a Kobold stream carries one text), got {kobold.params['n']!r}", "n")
    _check_sampling(kobold.params)
    timeout_s = options.request_timeout_s
    deadline_ms = int((time.time() + timeout_s) * 1000) if timeout_s else None
    try:
        wire = WireRequest(id=f"kai-{uuid.uuid4().hex}", params=kobold.params, deadline_ms=deadline_ms,
                           prompt=kobold.prompt)
        check_request(wire, params_checked=True)  # what a worker's codec would refuse is a 400 here
        return wire
    except (CodecError, ValueError, TypeError) as error:
        raise invalid(str(error)) from error


def _check_sampling(params: dict[str, Any]) -> None:
    """SamplingParams' own checks; the message and `param` name the Kobold field the value came from."""
    try:
        SamplingParams.from_dict(params)
    except ValueError as error:
        message = str(error)
        ours = message.split(" ", 1)[0]
        kobold = kobold_name(ours) if ours in params else None
        if kobold is not None and kobold != ours:
            message = f"{kobold}: {message}"
        raise invalid(message, kobold) from None
