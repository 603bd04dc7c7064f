"""One /v1/completions or /v1/chat/completions request: parse, submit, answer (JSON or SSE), cancel.

The HTTP status is decided on the first reply entry: until it arrives nothing is sent, so an
engine refusal (a prompt longer than the context, a bad token id) is still a 400, and a worker
that never answers is a 503. A client that goes away cancels its request over the backend's
control path, whether it was streaming or waiting for the whole answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from actors.http.backends import Backend
from actors.http.bodies import GatewayRequest, parse_body
from actors.http.chunks import DONE_EVENT, ChunkWriter, event
from actors.http.errors import ApiError, from_engine_error, parse_json_body
from actors.http.gateway_metrics import GatewayMetrics
from actors.http.interrupts import ClientGone, DisconnectWatch, Interrupter, Watchdog
from actors.http.limits import PendingLimit, check_api_key, read_body_limited
from actors.http.openai_shapes import completion_body
from actors.http.options import GatewayOptions
from actors.http.request_ids import MemoryRequestIds, request_fingerprint
from queue_adapters.client import assemble
from queue_adapters.codec import WireReply

log = structlog.get_logger(__name__)


class Generation:
    def __init__(self, backend: Backend, options: GatewayOptions, metrics: GatewayMetrics) -> None:
        self.backend, self.options, self.metrics = backend, options, metrics
        self.pending = PendingLimit(options.max_pending)
        self._background: set[asyncio.Task[None]] = set()  # cancels sent from cancelled handlers
        self._local_ids = MemoryRequestIds()  # for a backend that keeps no bindings of its own

    async def handle(self, request: Request, chat: bool) -> Response:
        endpoint = "chat" if chat else "completions"
        started = time.monotonic()
        try:
            try:
                response = await self._handle(request, chat)
            except (RedisError, OSError) as error:  # Redis went away mid-request; workers go on without us
                raise ApiError(503, f"the request queue is unreachable: {error}", code="unavailable") from error
        except ApiError as error:
            response = error.response()
            log.info("request refused", endpoint=endpoint, status=error.status, code=error.code, error=error.message)
        self.metrics.requests.labels(endpoint, str(response.status_code)).inc()
        request_id = request.headers.get("x-request-id")

        def log_line() -> None:  # one line per request
            log.info("http request", endpoint=endpoint, status=response.status_code, request_id=request_id,
                     seconds=round(time.monotonic() - started, 3))

        if isinstance(response, _EventStreamResponse):
            response.also_on_closed(log_line)  # when the stream ends: not between the first token and the client
        else:
            log_line()
        return response

    async def _handle(self, request: Request, chat: bool) -> Response:
        check_api_key(request, self.options.api_key)
        raw = await read_body_limited(request, self.options.max_request_bytes)
        body = parse_json_body(raw)
        gateway_request = parse_body(body, chat, self.backend.model_name, request.headers.get("x-request-id"),
                                     self.options.request_timeout_s, self.backend.adapter_names(),
                                     aliases=self.options.served_model_names,
                                     tool_parser=self.options.tool_call_parser)
        if "x-request-id" in request.headers:
            await self._check_id_owner(gateway_request.wire.id, request.headers.get("authorization"), body)
        self.pending.acquire()
        self.metrics.in_flight.inc()
        handed_over = False
        interrupter = Interrupter()
        watch = DisconnectWatch(request.receive, interrupter)
        try:
            with interrupter:
                replies, first = await self._start(gateway_request, interrupter)
            if gateway_request.stream:
                handed_over = True  # from here the stream owns the slot and the watch
                return self._stream(gateway_request, replies, first, interrupter, watch)
            with interrupter:
                replies_so_far = await _collect(first, replies)
            return self._answer(gateway_request, replies_so_far)
        except ClientGone:
            self._client_gone(gateway_request.wire.id)
            return Response(status_code=499)  # nobody reads it; the request is cancelled
        finally:
            if not handed_over:
                watch.stop()
                self._release()

    async def _check_id_owner(self, request_id: str, authorization: str | None, body: Any) -> None:
        """A client-chosen id attaches only the same client's retry of the same request (request_ids.py)."""
        owners = getattr(self.backend, "request_ids", None) or self._local_ids
        if not await owners.bind(request_id, request_fingerprint(authorization, body)):
            raise ApiError(409, f"X-Request-Id {request_id!r} is in use by another request; choose another id",
                           param="X-Request-Id", code="request_id_conflict")

    def _release(self) -> None:
        self.pending.release()
        self.metrics.in_flight.dec()

    async def _start(self, request: GatewayRequest,
                     interrupter: Interrupter) -> tuple[AsyncIterator[WireReply], WireReply]:
        """Submit and wait for the first reply entry; its error (if any) becomes the HTTP error."""
        started = time.monotonic()
        try:
            await self.backend.submit(request.wire)
        except (RedisError, OSError) as error:
            raise ApiError(503, f"the request queue is unreachable: {error}", code="unavailable") from error
        replies = aiter(self.backend.replies(request.wire))
        first = await self._first_entry(request, replies, interrupter)
        self.metrics.time_to_first_entry.observe(time.monotonic() - started)
        if first.error is not None:
            raise from_engine_error({"code": first.error.code, "message": first.error.message})
        return replies, first

    async def _first_entry(self, request: GatewayRequest, replies: AsyncIterator[WireReply],
                           interrupter: Interrupter) -> WireReply:
        """The first reply entry; 503 when none came within --worker-timeout and no worker is alive."""

        def no_worker() -> None:
            self._cancel_later(request.wire.id)
            interrupter.interrupt(ApiError(503, f"no worker answered within {self.options.worker_timeout_s:g} s",
                                           code="no_worker"))

        watchdog = Watchdog(self.options.worker_timeout_s, self.backend.workers_alive, no_worker)
        try:
            return await anext(replies)
        finally:
            watchdog.stop()

    def _answer(self, request: GatewayRequest, replies: list[WireReply]) -> Response:
        result = assemble(request.wire.id, replies)
        if result["error"] is not None:
            raise from_engine_error(result["error"])
        return JSONResponse(completion_body(request.wire.id, result, self.backend.model_name,
                                            self.backend.tokenizer, request.chat, request.tool_plan))

    def _stream(self, request: GatewayRequest, replies: AsyncIterator[WireReply], first: WireReply,
                interrupter: Interrupter, watch: DisconnectWatch) -> Response:
        writer = ChunkWriter(request, self.backend.model_name, self.backend.tokenizer)
        finished = False

        async def rest() -> AsyncIterator[str]:
            nonlocal finished
            try:
                async for event_text in writer.rest(replies):
                    yield event_text
            except (RedisError, OSError) as error:  # the status is sent already: report in-band, end cleanly
                log.warning("request queue failed mid-stream", request_id=request.wire.id, error=str(error))
                yield event(ApiError(503, f"the request queue is unreachable: {error}", code="unavailable").body())
                yield DONE_EVENT
            # Not cancelled after a queue failure either: the worker goes on, so a retry with the same
            # X-Request-Id gets the whole answer.
            finished = True

        def closed() -> None:
            watch.stop()
            self._release()
            if not finished:
                self._client_gone(request.wire.id)

        return _EventStreamResponse(writer.opening(first), rest(), interrupter, closed)

    def _client_gone(self, request_id: str) -> None:
        log.info("client went away; cancelling", request_id=request_id)
        self.metrics.cancelled.inc()
        self._cancel_later(request_id)

    def _cancel_later(self, request_id: str) -> None:
        """Cancel from a task of its own: the handler calling this may itself be cancelled already."""
        task = asyncio.get_running_loop().create_task(self._send_cancel(request_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send_cancel(self, request_id: str) -> None:
        try:
            await self.backend.cancel(request_id)
        except Exception as error:  # a lost cancel only costs compute; never crash the gateway for it
            log.warning("cancel failed", request_id=request_id, error=str(error))


async def _collect(first: WireReply, replies: AsyncIterator[WireReply]) -> list[WireReply]:
    return [first, *[reply async for reply in replies]]


class _EventStreamResponse(StreamingResponse):
    """Server-sent events, ended by a client that leaves (the Interrupter raises ClientGone), and
    `on_closed` called however the response ends: finished, failed, or the client gone even before the
    first event (a generator that never started would never run its own `finally`).

    Starlette's own __call__ would, under uvicorn (ASGI spec 2.3), run the body in an anyio task group
    beside a disconnect listener: two more tasks and a cancel scope per response. Here the request's
    DisconnectWatch does that job, and the status line, headers and opening events leave back to back,
    so the client wakes once for its first token."""

    def __init__(self, opening: str, rest: AsyncIterator[str], interrupter: Interrupter,
                 on_closed: Callable[[], None]) -> None:
        super().__init__(rest, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
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
