"""Kobold's answers: `{"results": [{"text", "finish_reason"}]}`, and its stream of server-sent events,

    event: message
    data: {"token": " Hel"}
    ...
    event: message
    data: {"token": "", "finish_reason": "length"}

(no [DONE]: the stream ends with the connection). An engine error after the first event goes
in-band as `event: error` with Kobold's error body.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse, Response

from actors.http.errors import ApiError, from_engine_error
from actors.http.generation.flow import EventWriter
from actors.http.generation.request import GatewayRequest
from actors.http.kobold.errors import kobold_error_body, kobold_error_response
from queue_adapters.codec import WireReply

_ENCODER = json.JSONEncoder(ensure_ascii=False)


def message_event(payload: dict[str, Any]) -> str:
    return f"event: message\ndata: {_ENCODER.encode(payload)}\n\n"


def error_event(error: ApiError) -> str:
    return f"event: error\ndata: {_ENCODER.encode(kobold_error_body(error))}\n\n"


class KoboldEvents:
    """One choice's text as `token` events (a Kobold stream carries one text: n is 1)."""

    def opening(self, firsts: list[WireReply]) -> str:
        return "".join(self._entry(first) for first in firsts)  # a Kobold request has one prompt

    async def rest(self, replies: AsyncIterator[tuple[int, WireReply]]) -> AsyncIterator[str]:
        async for _, reply in replies:
            events = self._entry(reply)
            if events:
                yield events

    def failure(self, error: ApiError) -> str:
        return error_event(error)

    @staticmethod
    def _entry(reply: WireReply) -> str:
        if reply.error is not None:  # the status is sent already: report in-band
            return error_event(from_engine_error({"code": reply.error.code, "message": reply.error.message}))
        events = []
        for choice in reply.choices:
            if choice.text:
                events.append(message_event({"token": choice.text}))
            if choice.finish_reason is not None:
                events.append(message_event({"token": "", "finish_reason": choice.finish_reason}))
        return "".join(events)


class KoboldShape:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def error(self, error: ApiError) -> Response:
        return kobold_error_response(error)

    def answer(self, request: GatewayRequest, results: list[dict[str, Any]]) -> Response:
        return JSONResponse({"results": [{"text": choice["text"], "finish_reason": choice["finish_reason"]}
                                         for result in results for choice in result["choices"]]})

    def writer(self, request: GatewayRequest) -> EventWriter:
        return KoboldEvents()
