"""The FastAPI application: OpenAI's routes, KoboldAI's (actors/http/kobold/), /health, /metrics, /tokenize,
/detokenize."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from actors.http.backends import Backend
from actors.http.chat_request import parse_messages
from actors.http.errors import ApiError, invalid, parse_json_body
from actors.http.gateway_metrics import GatewayMetrics
from actors.http.generation import Generation
from actors.http.kobold.routes import add_kobold_routes
from actors.http.limits import check_api_key, read_body_limited
from actors.http.options import GatewayOptions
from actors.http.unknown_fields import IGNORED_FIELDS_HEADER
from actors.worker.metrics import METRICS_CONTENT_TYPE
from pipeline.intake.chat_content import ChatContentGuard
from pipeline.intake.request_builder import template_messages
from pipeline.loading.tokenizer import tokenizer_vocab_size

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

    async def completions(request: Request) -> Response:
        return await generation.handle(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generation.handle(request, chat=True)

    # Plain Starlette routes: they read the request themselves, so FastAPI's per-request dependency
    # solving would be work on every request's path to its first token for nothing.
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
    add_kobold_routes(app, generation, backend, options)

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

    @app.get("/openapi.json")
    async def openapi() -> Response:  # written by hand: the routes parse their bodies themselves
        from actors.http.openapi import openapi_document

        return JSONResponse(openapi_document())

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        if not options.metrics_open:
            check_api_key(request, options.api_key)
        text = generate_latest(metrics.registry)
        if backend.worker_metrics is not None:  # embedded: the engine's metrics too, as a worker has them
            text += backend.worker_metrics.render()
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    # As a worker tokenizes chat messages by default: special-token text inside them stays text.
    content_guard = ChatContentGuard(backend.tokenizer) if backend.tokenizer is not None else None

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        body = await _json_body(request, options)
        tokens = _tokenize(backend.tokenizer, body, content_guard)
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": backend.max_model_len})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        body = await _json_body(request, options)
        tokenizer = _tokenizer(backend)
        return JSONResponse({"prompt": tokenizer.decode(_token_ids(body.get("tokens"), tokenizer))})

    return app


async def _json_body(request: Request, options: GatewayOptions) -> dict[str, Any]:
    check_api_key(request, options.api_key)
    body = parse_json_body(await read_body_limited(request, options.max_request_bytes))
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    return body


_TOKENIZE_FIELDS = ("model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                    "continue_final_message", "tools")


def _tokenize(tokenizer: Any, body: dict[str, Any], content_guard: ChatContentGuard | None) -> list[int]:
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer", code="no_tokenizer")
    unknown = sorted(str(key) for key in body if key not in _TOKENIZE_FIELDS)
    if unknown:
        raise invalid(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(_TOKENIZE_FIELDS)})", unknown[0])
    if isinstance(body.get("prompt"), str):
        if body.get("tools") is not None:
            raise invalid("tools are rendered by the chat template: give messages, not prompt", "tools")
        return list(tokenizer.encode(body["prompt"], add_special_tokens=_flag(body, "add_special_tokens", True)))
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        if not getattr(tokenizer, "chat_template", None):
            raise invalid("this model's tokenizer has no chat template", "messages")
        chat = _chat_messages(messages)
        literals: list[str] = []
        if content_guard is not None:
            chat, literals = content_guard.protect(chat)
        text = _chat_text(tokenizer, chat, _flag(body, "add_generation_prompt", True),
                          _flag(body, "continue_final_message", False), _tools(body.get("tools")))
        # As vLLM's: the template writes BOS itself, so special tokens are added only when asked.
        add_special_tokens = _flag(body, "add_special_tokens", False)
        if literals:
            return _with_special_tokens(tokenizer, _guarded_ids(content_guard, text, literals), add_special_tokens)
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    raise invalid("give prompt (a string) or messages (a non-empty list)", "prompt")


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI's `tools` as the chat template takes them: [{type: "function", function: {name, ...}}]."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid("tools must be a list of {type: function, function: {name, description, parameters}}",
                      "tools")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise invalid(f"tools[{index}] must be {{type: function, function: {{name, ...}}}}", "tools")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise invalid(f"tools[{index}].function.name must be a non-empty string", "tools")
    return tools or None


def _with_special_tokens(tokenizer: Any, ids: list[int], add: bool) -> list[int]:
    """`ids` wrapped in the special tokens the tokenizer adds around a text (BOS, EOS, ...), when asked."""
    if not add:
        return ids
    bare = tokenizer.encode("a", add_special_tokens=False)
    wrapped = tokenizer.encode("a", add_special_tokens=True)
    start = next((i for i in range(len(wrapped) - len(bare) + 1) if wrapped[i:i + len(bare)] == bare), None)
    if start is None:  # a tokenizer whose special tokens change the text's own tokens: none to find
        return ids
    return [*wrapped[:start], *ids, *wrapped[start + len(bare):]]


def _chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """`messages` checked as a chat request's are, as a text model's worker gives them to the chat
    template (text parts joined; with image parts, as a vision model's worker does)."""
    try:
        parsed = [message.as_dict() for message in parse_messages(messages, images=[])]
        has_images = any(isinstance(m["content"], list) and any(p["type"] == "image" for p in m["content"])
                         for m in parsed)
        return template_messages(parsed, vision=has_images)
    except ValueError as error:
        raise invalid(str(error), "messages") from None


def _guarded_ids(content_guard: ChatContentGuard, text: str, literals: list[str]) -> list[int]:
    try:
        return content_guard.encode(text, literals)
    except ValueError as error:
        raise invalid(str(error), "messages") from None


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false, got {value!r}", name)
    return value


def _chat_text(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               continue_final_message: bool = False, tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt the chat template makes of `messages` (a message the template cannot render is a
    400 naming it, not a 500). `continue_final_message`: the last message left open, to be continued."""
    if add_generation_prompt and continue_final_message:
        raise invalid("add_generation_prompt and continue_final_message cannot both be true "
                      "(set add_generation_prompt: false to continue the last message)", "continue_final_message")
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message)
    except ValueError as error:  # jinja2's TemplateError is an Exception, not a ValueError
        raise invalid(str(error), "messages") from None
    except Exception as error:
        raise invalid(f"the chat template cannot render these messages: {type(error).__name__}: {error}",
                      "messages") from None


def _token_ids(tokens: Any, tokenizer: Any) -> list[int]:
    """`tokens`: a list of ids in the tokenizer's vocabulary (the decoder takes 32-bit ids)."""
    vocab_size = tokenizer_vocab_size(tokenizer)
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise invalid("tokens must be a list of token ids", "tokens")
    outside = [token for token in tokens if not 0 <= token < vocab_size]
    if outside:
        raise invalid(f"tokens must hold token ids in [0, {vocab_size}), got {outside[0]}", "tokens")
    return tokens


def _tokenizer(backend: Backend) -> Any:
    if backend.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer", code="no_tokenizer")
    return backend.tokenizer
