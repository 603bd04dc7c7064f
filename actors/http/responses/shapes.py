"""How POST /v1/responses answers (the flow's `ResponseShape`): errors in OpenAI's shape, a whole answer as
a Response object (answer.py; routes.py stores it), a stream as Responses events (events.py)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from actors.http.backends import Backend
from actors.http.errors import ApiError
from actors.http.generation.flow import EventWriter
from actors.http.generation.request import ignored_fields_header
from actors.http.responses.answer import whole_response
from actors.http.responses.events import ResponseEvents, Save
from actors.http.responses.request import ResponsesRequest


class ResponsesShape:
    endpoint = "responses"

    def __init__(self, backend: Backend, save: Save) -> None:
        self.backend, self.save = backend, save

    def error(self, error: ApiError) -> Response:
        return error.response()

    def answer(self, request: ResponsesRequest, results: list[dict[str, Any]]) -> Response:
        request.answered = whole_response(request, results[0], self.backend.model_name)
        return JSONResponse(request.answered, headers=ignored_fields_header(request.ignored_fields))

    def writer(self, request: ResponsesRequest) -> EventWriter:
        return ResponseEvents(request, self.backend.model_name, self.save)
