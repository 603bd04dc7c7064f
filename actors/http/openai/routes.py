"""The OpenAI routes: /v1/completions and /v1/chat/completions (through actors/http/generation/ with
parse.py's parser and shapes.py's answers), /v1/embeddings (embeddings.py), /v1/models,
vLLM's /tokenize and /detokenize, and vLLM's
runtime LoRA routes (lora_routes.py)."""

from __future__ import annotations

import functools
import time
from typing import Any

import structlog
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from actors.http.backends import Backend
from actors.http.errors import ApiError, invalid
from actors.http.generation.flow import Generation
from actors.http.generation.request import bounded_names
from actors.http.limits import check_api_key, off_loop_if_large, read_json_body, read_json_object
from actors.http.openai.embeddings import add_embedding_route
from actors.http.openai.lora_routes import add_lora_routes
from actors.http.openai.parse import OpenAIRequest, parse_body
from actors.http.openai.shapes import OpenAIShape
from actors.http.openai.tokenize_request import token_ids, tokenized
from actors.http.options import GatewayOptions
from pipeline.intake.chat_content import ChatContentGuard

log = structlog.get_logger(__name__)


def add_openai_routes(app: FastAPI, generation: Generation, backend: Backend, options: GatewayOptions) -> None:
    _add_generation_routes(app, generation, backend, options)
    add_embedding_route(app, generation, backend, options)
    started = int(time.time())

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        check_api_key(request, options.api_key)
        base = {"id": backend.model_name, "object": "model", "created": started, "owned_by": "aqueduct",
                "root": backend.model_name, "parent": None, "max_model_len": backend.max_model_len}
        adapters = [{**base, "id": name, "root": backend.adapter_root(name), "parent": backend.model_name}
                    for name in backend.adapter_names()]
        return JSONResponse({"object": "list", "data": [base, *adapters]})

    _add_token_routes(app, backend, options)
    add_lora_routes(app, backend, options)


def _add_generation_routes(app: FastAPI, generation: Generation, backend: Backend, options: GatewayOptions) -> None:
    completions_shape, chat_shape = OpenAIShape(backend, chat=False), OpenAIShape(backend, chat=True)

    async def parse(request: Request, chat: bool) -> OpenAIRequest:
        check_api_key(request, options.api_key)
        if getattr(backend, "pooling", False):
            endpoint = "/v1/chat/completions" if chat else "/v1/completions"
            raise invalid(f"{endpoint} is not served by a pooling model (--runner pooling): use /v1/embeddings")
        body, size = await read_json_body(request, options.max_request_bytes)
        parsed = await off_loop_if_large(size, functools.partial(
            parse_body, body, chat, backend.model_name, request.headers.get("x-request-id"),
            options.request_timeout_s, backend.adapter_names(), aliases=options.served_model_names,
            strict_fields=options.strict_fields, tool_parser=options.tool_call_parser,
            reasoning_parser=options.reasoning_parser, template_kwargs=options.default_chat_template_kwargs))
        if parsed.ignored_fields:
            log.warning("request fields ignored", request_id=parsed.wire.id,
                        fields=bounded_names(parsed.ignored_fields))
        if "x-request-id" in request.headers:  # the client's id and each prompt's `{id}:{index}`
            ids = [parsed.response_id or parsed.wire.id, *(wire.id for wire in parsed.wires)]
            generation.claim_ids(parsed, ids, request.headers.get("authorization"), body)
        return parsed

    async def completions(request: Request) -> Response:
        return await generation.serve(request, functools.partial(parse, chat=False), completions_shape)

    async def chat_completions(request: Request) -> Response:
        return await generation.serve(request, functools.partial(parse, chat=True), chat_shape)

    # Plain Starlette routes: they read the request themselves, so FastAPI's per-request dependency
    # solving would be work on every request's path to its first token for nothing.
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])


def _add_token_routes(app: FastAPI, backend: Backend, options: GatewayOptions) -> None:
    # As a worker tokenizes chat messages by default: special-token text inside them stays text.
    content_guard = ChatContentGuard(backend.tokenizer) if backend.tokenizer is not None else None

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        body = await read_json_object(request, options.api_key, options.max_request_bytes)
        tokens = tokenized(backend.tokenizer, body, content_guard)
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": backend.max_model_len})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        body = await read_json_object(request, options.api_key, options.max_request_bytes)
        tokenizer = _tokenizer(backend)
        return JSONResponse({"prompt": tokenizer.decode(token_ids(body.get("tokens"), tokenizer))})


def _tokenizer(backend: Backend) -> Any:
    if backend.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer", code="no_tokenizer")
    return backend.tokenizer
