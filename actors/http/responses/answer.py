"""An answer's text -> the Response object's output items and the object itself, whole (the stream's
events.py runs the same machines piece by piece)."""

from __future__ import annotations

from typing import Any

from actors.http.responses.output import Event, OutputBuilder
from actors.http.responses.request import ResponsesRequest
from actors.http.responses.response_object import item_status, response_body, usage_body
from actors.http.responses.steps import AnswerSteps


class AnswerOutput:
    """One answer's output items and the events that build them, as its text comes."""

    def __init__(self, request: ResponsesRequest) -> None:
        self.steps = AnswerSteps(request.tool_plan, request.reasoning)
        self.builder = OutputBuilder()

    def feed(self, text: str) -> list[Event]:
        return self.builder.apply(self.steps.feed(text))

    def finish(self, finish_reason: str | None) -> list[Event]:
        return self.builder.apply(self.steps.finish()) + self.builder.close(item_status(finish_reason))

    @property
    def items(self) -> list[dict[str, Any]]:
        return self.builder.output


def whole_response(request: ResponsesRequest, result: dict[str, Any], model_name: str) -> dict[str, Any]:
    """The Response object of a finished, error-free result (one answer: n is 1)."""
    choice = result["choices"][0]
    output = AnswerOutput(request)
    output.feed(choice["text"])
    output.finish(choice["finish_reason"])
    return response_body(request.response_id, request.created_at, model_name, request.echo, output.items,
                         choice["finish_reason"], usage_body(result["usage"]))
