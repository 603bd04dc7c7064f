"""One line through the backend the HTTP routes use, answered as its route answers a call that does not stream:
every prompt submitted, its reply entries read to the end, a worker's refusal turned into the route's error
(actors/http/generation/flow.py's rules), the results rendered by the route's shape.

Submitting a line again (after a gateway restart, or by a gateway that took a batch over) reads the reply
stream the workers already wrote: its wire id is the same, and the workers generate an id once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from actors.http.backends import Backend
from actors.http.batches.line_request import LineRequest
from actors.http.errors import ApiError, from_engine_error
from actors.http.generation.flow import engine_refusal
from queue_adapters.client import assemble
from queue_adapters.codec import CodecError, WireReply


async def answer_line(backend: Backend, line: LineRequest) -> tuple[int, dict[str, Any]]:
    """(HTTP status, response body). Redis errors propagate: the caller retries, the line's id unchanged."""
    request = line.request
    try:
        await backend.submit_all(request.wires)
    except CodecError as error:  # the parsers run the codec's checks: only a rule they missed gets here
        return 400, ApiError(400, str(error), code="invalid_request").body()
    replies = await asyncio.gather(*(_entries(backend.replies(wire)) for wire in request.wires))
    try:
        _raise_first_error(line, replies)
        results = [assemble(wire.id, entries) for wire, entries in zip(request.wires, replies, strict=True)]
        response = line.shape.answer(request, results)
    except ApiError as error:
        return error.status, error.body()
    return response.status_code, json.loads(bytes(response.body))


async def _entries(replies: AsyncIterator[WireReply]) -> list[WireReply]:
    return [reply async for reply in replies]


def _raise_first_error(line: LineRequest, replies: list[list[WireReply]]) -> None:
    """As the route: a refusal in a first entry (in prompt order) is the answer, then any later error."""
    for index, entries in enumerate(replies):
        if entries and entries[0].error is not None:
            raise engine_refusal(line.request, index, entries[0])
    for entries in replies:
        for entry in entries:
            if entry.error is not None:
                raise from_engine_error({"code": entry.error.code, "message": entry.error.message})
