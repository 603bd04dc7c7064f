"""A streamed response as OpenAI's server-sent events, each `event: <type>` and `data: {..., "sequence_number"}`:

    response.created, response.in_progress          {"response": {... "status": "in_progress", "output": []}}
    response.output_item.added ... .done            the output items, as output.py builds them
    response.completed | response.incomplete        {"response": the whole Response, usage included}

The last event's response is the one the whole answer would be (the same machines, answer.py), and it
is stored before that event is sent, so a client that reads it can continue from it at once. An
error after the first event (the status is sent already: a worker's error reply, the queue or the
store failing) is an `error` event {code, message, param}, and ends the stream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import structlog

from actors.http.errors import ApiError, from_engine_error
from actors.http.responses.answer import AnswerOutput
from actors.http.responses.output import Event
from actors.http.responses.request import ResponsesRequest
from actors.http.responses.response_object import response_body, usage_body
from queue_adapters.codec import WireReply

log = structlog.get_logger(__name__)
_ENCODER = json.JSONEncoder(ensure_ascii=False)
Save = Callable[[ResponsesRequest, dict[str, Any]], Awaitable[None]]


class ResponseEvents:
    def __init__(self, request: ResponsesRequest, model_name: str, save: Save) -> None:
        self.request, self.model_name, self.save = request, model_name, save
        self.output = AnswerOutput(request)
        self.sequence_number = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.failed = False

    def opening(self, firsts: list[WireReply]) -> str:
        started = self._response()
        return (self._event({"type": "response.created", "response": started})
                + self._event({"type": "response.in_progress", "response": started}) + self._entry(firsts[0]))

    async def rest(self, replies: AsyncIterator[tuple[int, WireReply]]) -> AsyncIterator[str]:
        async for _, reply in replies:
            events = self._entry(reply)
            if events:
                yield events
        if self.finish_reason is not None and not self.failed:
            yield await self._last()

    def failure(self, error: ApiError) -> str:
        self.failed = True
        return self._event({"type": "error", "code": error.code, "message": error.message, "param": error.param})

    def _entry(self, reply: WireReply) -> str:
        if reply.error is not None:
            return self.failure(from_engine_error({"code": reply.error.code, "message": reply.error.message}))
        events: list[Event] = []
        for choice in reply.choices:
            events += self.output.feed(choice.text)
            if choice.finish_reason is not None:
                events += self.output.finish(choice.finish_reason)
                self.finish_reason = choice.finish_reason
        if reply.usage is not None:
            usage = reply.usage
            self.usage = usage_body({"prompt_tokens": usage.prompt_tokens, "cached_tokens": usage.cached_tokens,
                                     "completion_tokens": usage.completion_tokens})
        return "".join(self._event(event) for event in events)

    async def _last(self) -> str:
        response = self._response(self.finish_reason, self.usage)
        if self.request.store:
            try:
                await self.save(self.request, response)
            except Exception as error:  # the answer is sent; its record is not: say so, in-band
                log.warning("response not stored", response_id=self.request.response_id, error=str(error))
                return self.failure(ApiError(503, f"the response could not be stored: {error}",
                                             code="store_unavailable"))
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return self._event({"type": kind, "response": response})

    def _response(self, finish_reason: str | None = None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        output = self.output.items if finish_reason is not None else []
        return response_body(self.request.response_id, self.request.created_at, self.model_name, self.request.echo,
                             output, finish_reason, usage)

    def _event(self, event: Event) -> str:
        event = {**event, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        return f"event: {event['type']}\ndata: {_ENCODER.encode(event)}\n\n"
