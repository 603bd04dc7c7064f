"""The FastAPI application: OpenAI's routes plus /health, /metrics, /tokenize, /detokenize."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
from fastapi import FastAPI
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from actors.http.backends import Backend
from actors.http.errors import ApiError, invalid
from actors.http.gateway_metrics import GatewayMetrics
from actors.http.generation import Generation
from actors.http.limits import check_api_key, read_body_limited
from actors.http.options import GatewayOptions
from actors.metrics import METRICS_CONTENT_TYPE

log = structlog.get_logger(__name__)
_PLAYGROUND = Path(__file__).with_name("playground.html")  # a chat page for trying the server in a browser


def create_app(backend: Backend, options: GatewayOptions) -> FastAPI:
    metrics = GatewayMetrics()
    generation = Generation(backend, options, metrics)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        try:
            yield
        finally:
            await backend.close()

    app = FastAPI(title="Aqueduct", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.backend, app.state.generation = backend, generation

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> Response:
        return error.response()

    @app.exception_handler(Exception)
    async def bug(_: Request, error: Exception) -> Response:
        log.error("unhandled error in a request", exc_info=error)
        return ApiError(500, f"internal error: {type(error).__name__}", code="internal_error").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> Response:
        return ApiError(error.status_code, str(error.detail)).response()  # 404/405 in OpenAI's shape too

    async def completions(request: Request) -> Response:
        return await generation.handle(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generation.handle(request, chat=True)

    # Plain Starlette routes: they read the request themselves, so FastAPI's per-request dependency
    # solving would be work on every request's path to its first token for nothing.
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        check_api_key(request, options.api_key)
        base = {"id": backend.model_name, "object": "model", "created": started, "owned_by": "aqueduct",
                "max_model_len": backend.max_model_len}
        adapters = [{**base, "id": name, "parent": backend.model_name} for name in backend.adapter_names()]
        return JSONResponse({"object": "list", "data": [base, *adapters]})

    @app.get("/")
    async def playground() -> Response:
        return HTMLResponse(_PLAYGROUND.read_text(encoding="utf-8"))

    @app.get("/health")
    async def health() -> Response:
        alive = await backend.healthy()
        return JSONResponse({"status": "ok" if alive else "down"}, status_code=200 if alive else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        text = generate_latest(metrics.registry)
        if backend.worker_metrics is not None:  # embedded: the engine's metrics too, as a worker has them
            text += backend.worker_metrics.render()
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        body = await _json_body(request, options)
        tokens = _tokenize(backend.tokenizer, body)
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": backend.max_model_len})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        body = await _json_body(request, options)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and t >= 0 for t in tokens):
            raise invalid("tokens must be a list of token ids", "tokens")
        return JSONResponse({"prompt": _tokenizer(backend).decode(tokens)})

    return app


async def _json_body(request: Request, options: GatewayOptions) -> dict[str, Any]:
    check_api_key(request, options.api_key)
    try:
        body = json.loads(await read_body_limited(request, options.max_request_bytes))
    except ValueError as error:
        raise invalid(f"the body is not valid JSON: {error}") from error
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    return body


def _tokenize(tokenizer: Any, body: dict[str, Any]) -> list[int]:
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer", code="no_tokenizer")
    if isinstance(body.get("prompt"), str):
        return list(tokenizer.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True)))
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        if not getattr(tokenizer, "chat_template", None):
            raise invalid("this model's tokenizer has no chat template", "messages")
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))  # the template wrote BOS already
    raise invalid("give prompt (a string) or messages (a non-empty list)", "prompt")


def _tokenizer(backend: Backend) -> Any:
    if backend.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer", code="no_tokenizer")
    return backend.tokenizer
