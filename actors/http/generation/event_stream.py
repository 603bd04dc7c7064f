"""A streamed answer's response: its status line, headers and opening events in one send, then the rest."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

from actors.http.generation.interrupts import ClientGone, Interrupter


class EventStreamResponse(StreamingResponse):
    """Server-sent events, ended by a client that leaves (the Interrupter raises ClientGone), and
    `on_closed` called however the response ends: finished, failed, or the client gone even before the
    first event (a generator that never started would never run its own `finally`).

    Starlette's own __call__ would, under uvicorn (ASGI spec 2.3), run the body in an anyio task group
    beside a disconnect listener: two more tasks and a cancel scope per response. Here the request's
    DisconnectWatch does that job, and the status line, headers and opening events leave back to back,
    so the client wakes once for its first token."""

    def __init__(self, opening: str, rest: AsyncIterator[str], interrupter: Interrupter,
                 on_closed: Callable[[], None], headers: dict[str, str]) -> None:
        super().__init__(rest, media_type="text/event-stream", headers={"Cache-Control": "no-cache", **headers})
        self.opening, self.interrupter = opening.encode(), interrupter
        self.on_closed = [on_closed]

    def also_on_closed(self, callback: Callable[[], None]) -> None:
        self.on_closed.append(callback)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            with self.interrupter:
                await self._send_events(send)
        except (ClientGone, OSError):  # OSError: a server (ASGI spec 2.4) whose send fails once the client left
            pass
        finally:
            for callback in self.on_closed:
                callback()

    async def _send_events(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.opening, "more_body": True})
        async for text in self.body_iterator:
            await send({"type": "http.response.body", "body": text.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
