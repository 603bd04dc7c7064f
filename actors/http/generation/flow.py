"""One generation request of any API: parse, submit, answer (JSON or SSE), cancel.

Each API brings its parser and its `ResponseShape` (actors/http/openai/, actors/http/kobold/); the flow
between them is the same. The HTTP status is decided on the first reply entry: until it arrives
nothing is sent, so an engine refusal (a prompt longer than the context, a bad token id) is still a
400, and a worker that never answers is a 503. A request with several prompts (an OpenAI completions
prompt list) submits one wire request per prompt and waits for each one's first entry before
answering; the shape merges their results (streamed: their replies, in arrival order). A client that
goes away cancels its request (every prompt of it) over the backend's control path, whether it was
streaming or waiting for the whole answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import structlog
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response

from actors.http.backends import Backend
from actors.http.errors import ApiError, from_engine_error
from actors.http.generation.event_stream import EventStreamResponse
from actors.http.generation.interrupts import ClientGone, DisconnectWatch, Interrupter, Watchdog
from actors.http.generation.metrics import GatewayMetrics
from actors.http.generation.reply_merge import merge_replies
from actors.http.generation.request import GatewayRequest, IdClaim, ignored_fields_header
from actors.http.limits import PendingLimit
from actors.http.options import GatewayOptions
from actors.http.request_ids import MemoryRequestIds, request_fingerprint
from actors.http.tenancy.id_namespaces import id_namespace
from actors.http.tenancy.tenants import request_tenant, stamp_tenant
from queue_adapters.client import assemble
from queue_adapters.codec import CodecError, WireReply

log = structlog.get_logger(__name__)
RequestT = TypeVar("RequestT", bound=GatewayRequest)
RequestT_contra = TypeVar("RequestT_contra", bound=GatewayRequest, contravariant=True)


class EventWriter(Protocol):
    """A request's reply entries as server-sent events, in one API's shapes."""

    def opening(self, firsts: list[WireReply]) -> str:
        """The events of each prompt's first reply entry (one prompt but for completions' prompt lists)."""
        ...

    def rest(self, replies: AsyncIterator[tuple[int, WireReply]]) -> AsyncIterator[str]:
        """The events of the later entries, each with its prompt's index."""
        ...

    def failure(self, error: ApiError) -> str:
        """The events that end a stream whose request queue failed after the status was sent."""
        ...


class ResponseShape(Protocol[RequestT_contra]):
    """How one API answers: its errors, its whole answer, its stream (actors/http/openai/shapes.py,
    actors/http/kobold/shapes.py). The flow between them (submit, first entry, cancel) is Generation's."""

    endpoint: str  # the metrics' and logs' label

    def error(self, error: ApiError) -> Response: ...

    def answer(self, request: RequestT_contra, results: list[dict[str, Any]]) -> Response:
        """The whole answer from each prompt's error-free result, in prompt order."""
        ...

    def writer(self, request: RequestT_contra) -> EventWriter: ...


Parse = Callable[[Request], Awaitable[RequestT]]


class Generation:
    def __init__(self, backend: Backend, options: GatewayOptions, metrics: GatewayMetrics) -> None:
        self.backend, self.options, self.metrics = backend, options, metrics
        self.pending = PendingLimit(options.max_pending)
        self._background: set[asyncio.Task[None]] = set()  # cancels sent from cancelled handlers
        self._local_ids = MemoryRequestIds()  # for a backend that keeps no bindings of its own

    async def serve(self, request: Request, parse: Parse[RequestT], shape: ResponseShape[RequestT]) -> Response:
        """One generation request of any API: `parse` reads and checks it, `shape` writes the answer."""
        endpoint = shape.endpoint
        started = time.monotonic()
        try:
            try:
                response = await self._handle(request, parse, shape)
            except (RedisError, OSError) as error:  # Redis went away mid-request; workers go on without us
                raise ApiError(503, f"the request queue is unreachable: {error}", code="unavailable") from error
        except ApiError as error:
            response = shape.error(error)
            log.info("request refused", endpoint=endpoint, status=error.status, code=error.code, error=error.message)
        self.metrics.requests.labels(endpoint, str(response.status_code)).inc()
        request_id = request.headers.get("x-request-id")

        def log_line() -> None:  # one line per request
            log.info("http request", endpoint=endpoint, status=response.status_code, request_id=request_id,
                     seconds=round(time.monotonic() - started, 3))

        if isinstance(response, EventStreamResponse):
            response.also_on_closed(log_line)  # when the stream ends: not between the first token and the client
        else:
            log_line()
        return response

    async def _handle(self, request: Request, parse: Parse[RequestT], shape: ResponseShape[RequestT]) -> Response:
        gateway_request = await parse(request)
        tenant = request_tenant(request, self.options.api_key, gateway_request.user)
        stamp_tenant(gateway_request.wires, tenant)
        await self._bind_ids(gateway_request, id_namespace(tenant))
        self.pending.acquire()
        self.metrics.in_flight.inc()
        handed_over = False
        interrupter = Interrupter()
        watch = DisconnectWatch(request.receive, interrupter)
        try:
            with interrupter:
                replies, firsts = await self._start(gateway_request, interrupter)
            if gateway_request.stream:
                handed_over = True  # from here the stream owns the slot and the watch
                return self._stream(shape.writer(gateway_request), gateway_request, replies, firsts, interrupter,
                                    watch)
            with interrupter:
                replies_so_far = [await _collect(first, rest) for first, rest in zip(firsts, replies, strict=True)]
            return self._answer(shape, gateway_request, replies_so_far)
        except ClientGone:
            self._client_gone(gateway_request)
            return Response(status_code=499)  # nobody reads it; the request is cancelled
        finally:
            if not handed_over:
                watch.stop()
                self._release()

    @staticmethod
    def claim_ids(parsed: GatewayRequest, request_ids: list[str], authorization: str | None, body: Any) -> None:
        """Mark a request's ids as the client's own choice (`request_ids`: the client's id and every id
        derived from it); they are bound to the client once its tenant is known (`_bind_ids`)."""
        parsed.id_claim = IdClaim(list(dict.fromkeys(request_ids)), request_fingerprint(authorization, body))

    async def _bind_ids(self, request: GatewayRequest, namespace: str) -> None:
        """A client-chosen id, and every id derived from it, attaches only the same client's retry of the
        same request (request_ids.py), within its tenant's namespace (tenancy/id_namespaces.py)."""
        claim = request.id_claim
        if claim is None:
            return
        if namespace:
            for wire in request.wires:
                wire.id = namespace + wire.id
        owners = getattr(self.backend, "request_ids", None) or self._local_ids
        for request_id in claim.request_ids:
            if not await owners.bind(namespace + request_id, claim.fingerprint):
                raise ApiError(409, f"X-Request-Id {request_id!r} is in use by another request; choose another id",
                               param="X-Request-Id", code="request_id_conflict")

    def _release(self) -> None:
        self.pending.release()
        self.metrics.in_flight.dec()

    async def _start(self, request: GatewayRequest,
                     interrupter: Interrupter) -> tuple[list[AsyncIterator[WireReply]], list[WireReply]]:
        """Submit every prompt and wait for each one's first reply entry; the first error (in prompt
        order) becomes the HTTP error, and the other prompts are cancelled."""
        started = time.monotonic()
        try:
            await self.backend.submit_all(request.wires)
        except (RedisError, OSError) as error:
            raise ApiError(503, f"the request queue is unreachable: {error}", code="unavailable") from error
        except CodecError as error:  # the parsers run the codec's checks: only a rule they missed gets here
            raise ApiError(400, str(error), code="invalid_request") from error
        replies = [aiter(self.backend.replies(wire)) for wire in request.wires]
        firsts = [await self._first_entry(request, stream, interrupter) for stream in replies]
        self.metrics.time_to_first_entry.observe(time.monotonic() - started)
        for index, first in enumerate(firsts):
            if first.error is not None:
                if len(request.wires) > 1:
                    self._cancel_all(request)
                raise engine_refusal(request, index, first)
        return replies, firsts

    async def _first_entry(self, request: GatewayRequest, replies: AsyncIterator[WireReply],
                           interrupter: Interrupter) -> WireReply:
        """The first reply entry; 503 when none came within --worker-timeout and no worker is alive."""

        def no_worker() -> None:
            self._cancel_all(request)
            interrupter.interrupt(ApiError(503, f"no worker answered within {self.options.worker_timeout_s:g} s",
                                           code="no_worker"))

        watchdog = Watchdog(self.options.worker_timeout_s, self.backend.workers_alive, no_worker)
        try:
            return await anext(replies)
        finally:
            watchdog.stop()

    @staticmethod
    def _answer(shape: ResponseShape[RequestT], request: RequestT, replies: list[list[WireReply]]) -> Response:
        results = [assemble(wire.id, entries) for wire, entries in zip(request.wires, replies, strict=True)]
        errors = [result["error"] for result in results if result["error"] is not None]
        if errors:  # the first, in prompt order
            raise from_engine_error(errors[0])
        return shape.answer(request, results)

    def _stream(self, writer: EventWriter, request: GatewayRequest, replies: list[AsyncIterator[WireReply]],
                firsts: list[WireReply], interrupter: Interrupter, watch: DisconnectWatch) -> Response:
        finished = False

        async def rest() -> AsyncIterator[str]:
            nonlocal finished
            try:
                async for event_text in writer.rest(merge_replies(replies)):
                    yield event_text
            except (RedisError, OSError) as error:  # the status is sent already: report in-band, end cleanly
                log.warning("request queue failed mid-stream", request_id=request.wire.id, error=str(error))
                yield writer.failure(ApiError(503, f"the request queue is unreachable: {error}", code="unavailable"))
            # Not cancelled after a queue failure either: the worker goes on, so a retry with the same
            # X-Request-Id gets the whole answer.
            finished = True

        def closed() -> None:
            watch.stop()
            self._release()
            if not finished:
                self._client_gone(request)

        return EventStreamResponse(writer.opening(firsts), rest(), interrupter, closed,
                                   ignored_fields_header(request.ignored_fields))

    def _client_gone(self, request: GatewayRequest) -> None:
        log.info("client went away; cancelling", request_id=request.response_id)
        self.metrics.cancelled.inc()
        self._cancel_all(request)

    def _cancel_all(self, request: GatewayRequest) -> None:
        for wire in request.wires:
            self._cancel_later(wire.id)

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


def engine_refusal(request: GatewayRequest, prompt_index: int, first: WireReply) -> ApiError:
    """A worker's refusal of one prompt; but for chat its `prompt_token_ids` is the client's `prompt` (OpenAI
    completions' field, and Kobold's)."""
    assert first.error is not None
    error = from_engine_error({"code": first.error.code, "message": first.error.message})
    if request.chat:
        return error
    field = "prompt" if len(request.wires) == 1 else f"prompt[{prompt_index}]"
    if error.message.startswith("prompt"):  # about the prompt itself: its length, a token id
        error.param = "prompt"
    error.message = error.message.replace("prompt_token_ids", field)
    if len(request.wires) > 1 and not error.message.startswith(field):
        error.message = f"{field}: {error.message}"  # which prompt the worker refused
    return error
