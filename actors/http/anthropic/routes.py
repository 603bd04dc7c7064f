"""The Anthropic routes, on the same app as the OpenAI ones: POST /v1/messages through actors/http/generation/
(request.py's parser, shapes.py's answers) and POST /v1/messages/count_tokens."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from actors.http.anthropic.auth import caller, check_anthropic_key
from actors.http.anthropic.errors import anthropic_error_response
from actors.http.anthropic.request import (
    AnthropicRequest,
    check_fields,
    parse_messages_body,
    parse_prompt,
)
from actors.http.anthropic.shapes import AnthropicShape
from actors.http.anthropic.token_count import count_prompt_tokens
from actors.http.backends import Backend
from actors.http.errors import ApiError, invalid
from actors.http.generation.body_fields import body_adapter
from actors.http.generation.flow import Generation
from actors.http.generation.request import bounded_names
from actors.http.limits import off_loop_if_large, read_json_body
from actors.http.options import GatewayOptions
from pipeline.intake.chat_content import ChatContentGuard

log = structlog.get_logger(__name__)
Handler = Callable[[Request], Awaitable[Response]]


def add_anthropic_routes(app: FastAPI, generation: Generation, backend: Backend, options: GatewayOptions) -> None:
    shape = AnthropicShape(backend)
    # As a worker tokenizes chat messages: special-token text inside them stays text.
    content_guard = ChatContentGuard(backend.tokenizer) if backend.tokenizer is not None else None

    def model_names() -> tuple[str, ...]:
        return options.served_model_names or (backend.model_name,)

    async def parse(request: Request) -> AnthropicRequest:
        check_anthropic_key(request, options.api_key)
        body, size = await read_json_body(request, options.max_request_bytes)
        parsed = await off_loop_if_large(size, functools.partial(
            parse_messages_body, body, model_names(), backend.adapter_names(), request.headers.get("x-request-id"),
            options.request_timeout_s, options.strict_fields, options.tool_call_parser, options.reasoning_parser,
            options.default_chat_template_kwargs))
        if parsed.ignored_fields:
            log.warning("request fields ignored", request_id=parsed.wire.id,
                        fields=bounded_names(parsed.ignored_fields))
        if "x-request-id" in request.headers:
            generation.claim_ids(parsed, [parsed.response_id], caller(request), body)
        return parsed

    async def messages(request: Request) -> Response:
        return await generation.serve(request, parse, shape)

    @_anthropic_errors
    async def count_tokens(request: Request) -> Response:
        check_anthropic_key(request, options.api_key)
        body, size = await read_json_body(request, options.max_request_bytes)
        count = await off_loop_if_large(size, _count, body, model_names(), backend, content_guard, options)
        return JSONResponse({"input_tokens": count})

    # Plain Starlette routes, as the OpenAI ones: they read the request themselves.
    app.add_route("/v1/messages", messages, methods=["POST"])
    app.add_route("/v1/messages/count_tokens", count_tokens, methods=["POST"])


def _count(body: Any, model_names: tuple[str, ...], backend: Backend, content_guard: ChatContentGuard | None,
           options: GatewayOptions) -> int:
    """A Messages body's prompt tokens; its other fields are checked as a Messages request's, strictly."""
    body_adapter(body, model_names, backend.adapter_names())
    body, _ = check_fields(body, strict=True)
    try:
        conversation = parse_prompt(body, options.default_chat_template_kwargs, options.reasoning_parser)
    except ValueError as error:
        raise invalid(str(error), getattr(error, "field", None)) from error
    return count_prompt_tokens(backend.tokenizer, conversation, content_guard)


def _anthropic_errors(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as error:
            return anthropic_error_response(error)
    return wrapped
