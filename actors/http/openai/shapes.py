"""How the OpenAI routes answer (the flow's `ResponseShape`): errors in OpenAI's shape, a whole answer as a
`text_completion` or `chat.completion` (render.py; a prompt list's results merged by prompt_results.py),
a stream as chunks (chunks.py) ended by `data: [DONE]`, even after a failure."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from actors.http.backends import Backend
from actors.http.errors import ApiError
from actors.http.generation.flow import EventWriter
from actors.http.generation.request import ignored_fields_header
from actors.http.openai.chunks import DONE_EVENT, ChunkWriter, event
from actors.http.openai.parse import OpenAIRequest
from actors.http.openai.prompt_results import merge_prompt_results
from actors.http.openai.render import completion_body


class OpenAIEvents(ChunkWriter):
    def failure(self, error: ApiError) -> str:
        return event(error.body()) + DONE_EVENT


class OpenAIShape:
    def __init__(self, backend: Backend, chat: bool) -> None:
        self.backend, self.chat = backend, chat
        self.endpoint = "chat" if chat else "completions"

    def error(self, error: ApiError) -> Response:
        return error.response()

    def answer(self, request: OpenAIRequest, results: list[dict[str, Any]]) -> Response:
        tokenizer = self.backend.tokenizer
        result = results[0] if request.chat else merge_prompt_results(results, request.n, request.prompts,
                                                                      request.echo, tokenizer)
        return JSONResponse(completion_body(request.response_id, result, self.backend.model_name, tokenizer,
                                            request.chat, request.tool_plan, request.reasoning),
                            headers=ignored_fields_header(request.ignored_fields))

    def writer(self, request: OpenAIRequest) -> EventWriter:
        return OpenAIEvents(request, self.backend.model_name, self.backend.tokenizer)
