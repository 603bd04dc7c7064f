"""How the Messages route answers (the flow's `ResponseShape`): errors in Anthropic's shape (errors.py),
a whole answer as a message object (message.py), a stream as Anthropic's events (events.py)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from actors.http.anthropic.errors import anthropic_error_response
from actors.http.anthropic.events import MessageEvents
from actors.http.anthropic.message import message_body
from actors.http.anthropic.request import AnthropicRequest
from actors.http.backends import Backend
from actors.http.errors import ApiError
from actors.http.generation.flow import EventWriter
from actors.http.generation.request import ignored_fields_header


class AnthropicShape:
    endpoint = "messages"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def error(self, error: ApiError) -> Response:
        return anthropic_error_response(error)

    def answer(self, request: AnthropicRequest, results: list[dict[str, Any]]) -> Response:
        return JSONResponse(message_body(request, results[0], self.backend.model_name),
                            headers=ignored_fields_header(request.ignored_fields))

    def writer(self, request: AnthropicRequest) -> EventWriter:
        return MessageEvents(request, self.backend.model_name)
