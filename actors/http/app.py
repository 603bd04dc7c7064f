"""The FastAPI application: each protocol's routes, mounted from its package (actors/http/openai/,
actors/http/kobold/), and the server's own: /health, /metrics, /openapi.json and the playground page."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import structlog
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from actors.http.anthropic.routes import add_anthropic_routes
from actors.http.backends import Backend
from actors.http.batches.routes import add_batch_api
from actors.http.batches.service import BatchService
from actors.http.errors import ApiError
from actors.http.generation.flow import Generation
from actors.http.generation.metrics import GatewayMetrics
from actors.http.generation.request import IGNORED_FIELDS_HEADER
from actors.http.kobold.routes import add_kobold_routes
from actors.http.limits import check_api_key
from actors.http.openai.routes import add_openai_routes
from actors.http.options import GatewayOptions
from actors.http.responses.routes import add_responses_routes
from actors.worker.metrics import METRICS_CONTENT_TYPE

log = structlog.get_logger(__name__)
_PLAYGROUND = Path(__file__).with_name("playground.html")  # a chat page for trying the server in a browser


def create_app(backend: Backend, options: GatewayOptions) -> FastAPI:
    metrics = GatewayMetrics()
    generation = Generation(backend, options, metrics)
    batches = BatchService(backend, options)  # the Batch API's stores and runners, started after the backend

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        await batches.start()
        try:
            yield
        finally:
            await batches.stop()
            await backend.close()

    app = FastAPI(title="Aqueduct", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.backend, app.state.generation = backend, generation
    if options.served_model_names:  # --served-model-name: responses report the first
        backend.model_name = options.served_model_names[0]
    if options.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(options.allowed_origins), allow_methods=["*"],
                           allow_headers=["*"], expose_headers=["X-Request-Id", IGNORED_FIELDS_HEADER])

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

    add_openai_routes(app, generation, backend, options)
    add_kobold_routes(app, generation, backend, options)
    add_anthropic_routes(app, generation, backend, options)
    add_responses_routes(app, generation, backend, options)
    add_batch_api(app, batches, options)

    @app.get("/")
    async def playground() -> Response:
        return HTMLResponse(_PLAYGROUND.read_text(encoding="utf-8"))

    @app.get("/health")
    async def health() -> Response:
        alive = await backend.healthy()
        return JSONResponse({"status": "ok" if alive else "down"}, status_code=200 if alive else 503)

    @app.get("/openapi.json")
    async def openapi() -> Response:  # written by hand: the routes parse their bodies themselves
        from actors.http.openapi import openapi_document

        return JSONResponse(openapi_document(runtime_lora=options.runtime_lora_updating))

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        if not options.metrics_open:
            check_api_key(request, options.api_key)
        text = generate_latest(metrics.registry)
        if backend.worker_metrics is not None:  # embedded: the engine's metrics too, as a worker has them
            text += backend.worker_metrics.render()
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    return app
