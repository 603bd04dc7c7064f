"""Output actor: detokenize and stop-check via the pipeline OutputProcessor, write reply entries,
then ack the request entry and free its admission slot once its final entry is written.

A step's events are detokenized a slice of requests at a time, yielding to the event loop between
slices: the next step's tensor prep and forward are queued meanwhile, so the device never waits
for a whole step's output work (a few ms for hundreds of requests on a small CPU). The step's
reply entries are then written together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from actors.kit.base import Actor
from actors.kit.messages import Cancel, Embedded, EmbedStopped, ErrorReply, OpenReply, RequestFailed, StepEvents
from actors.worker.admission import Admission
from actors.worker.replies import ReplySink, to_wire
from actors.worker.reply_routes import default_reply_to
from actors.worker.screening import raw_of
from pipeline.output.output_processor import OutputProcessor
from pipeline.request.outputs import RequestDelta
from pipeline.request.request import FinishReason
from queue_adapters.base import Consumer, Delivery, Producer
from queue_adapters.codec import Malformed
from queue_adapters.memory import MemoryConsumer


@dataclass(slots=True)
class _Route:
    reply_to: str
    delivery: Delivery | None
    arrival_s: float
    first_token_s: float | None = None


def request_slices(events: list[Any], requests_per_slice: int) -> list[list[Any]]:
    """Events grouped by request (each request's own order kept), then cut every n requests.

    [a1 b1 a2 c1], n=2 -> [[a1 a2 b1], [c1]]: a request's events stay in one slice, so it gets
    one reply entry per step.
    """
    by_request: dict[str, list[Any]] = {}
    for event in events:
        by_request.setdefault(event.request_id, []).append(event)
    groups = list(by_request.values())
    return [[event for group in groups[start:start + requests_per_slice] for event in group]
            for start in range(0, len(groups), requests_per_slice)]


class OutputActor(Actor):
    """Two inboxes: step events (plain data, may be a Redis stream) and routes (OpenReply /
    ErrorReply from Intake, always memory: they carry ack handles).

    Each inbox has a reader that waits on it without a timer: a polling timer woke the event loop
    every 10 ms between steps, and each wake took the GIL from the device thread's forward (a third
    of the event loop's GIL time on a one-request SmolLM2 run). Messages are handled under one lock,
    and routes are taken only under it, so step events never overtake the route they need."""

    requests_per_slice = 32

    def __init__(self, outputs: OutputProcessor, sink: ReplySink, inbox: Consumer[StepEvents],
                 routes: MemoryConsumer[Any],
                 to_scheduler: Producer[Any], admission: Admission, metrics: Any | None = None,
                 prefix: str = "aqueduct", dead_letter: Callable[[Malformed], Awaitable[None]] | None = None) -> None:
        super().__init__("output", inbox)
        self.prefix = prefix
        self.dead_letter = dead_letter
        self.routes_inbox = routes
        self.outputs = outputs
        self.sink = sink
        self.to_scheduler = to_scheduler
        self.admission = admission
        self.metrics = metrics
        self.routes: dict[str, _Route] = {}
        self._handling = asyncio.Lock()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as readers:
            readers.create_task(self._read_routes())
            readers.create_task(self._read_events())

    async def _read_events(self) -> None:
        while deliveries := await self.inbox.receive(max_count=self.batch_size):  # []: closed and drained
            async with self._handling:
                # Intake queues a request's route before the scheduler hears of the request, so once
                # we hold its events, draining the routes first guarantees the route is known.
                await self._drain_routes()
                for delivery in deliveries:
                    await self.handle(delivery.message)
                    await delivery.ack()

    async def _read_routes(self) -> None:
        """Routes that come while no step does (an intake error's reply) are handled at once."""
        while await self.routes_inbox.wait_ready():
            async with self._handling:
                await self._drain_routes()

    async def _drain_routes(self) -> None:
        while deliveries := await self.routes_inbox.receive(max_count=self.batch_size, timeout_s=0):
            for delivery in deliveries:
                await self.handle(delivery.message)
                await delivery.ack()

    async def handle(self, message: Any) -> None:
        if isinstance(message, OpenReply):
            await self._open(message)
        elif isinstance(message, StepEvents):
            deltas: list[RequestDelta] = []
            for index, events in enumerate(request_slices(message.all(), self.requests_per_slice)):
                if index:
                    await asyncio.sleep(0)  # between slices (not after the last: the write follows)
                slice_deltas, finishes = self.outputs.process(events)
                deltas.extend(slice_deltas)
                for finish in finishes:
                    await self.to_scheduler.send(finish)
                for request_id in self.outputs.take_failed():  # answered with an error: stop generating it
                    await self.to_scheduler.send(Cancel(request_id, FinishReason.ERROR))
            await self._write(deltas)  # one sink write (one Redis round trip) per step
        elif isinstance(message, Embedded):
            delta = self.outputs.embedding_delta(message.request_id, message.embedding, message.num_prompt_tokens)
            await self._write([delta])
        elif isinstance(message, EmbedStopped):
            await self._write([self.outputs.embedding_delta(message.request_id, None, message.num_prompt_tokens,
                                                            message.finish_reason)])
        elif isinstance(message, ErrorReply):
            await self._write_error(message)
        elif isinstance(message, RequestFailed):
            if message.request_id in self.routes:
                await self._write([self.outputs.error_delta(message.request_id, message.code, message.message)])
        else:
            raise TypeError(f"output got an unexpected {type(message).__name__}")

    async def _open(self, message: OpenReply) -> None:
        self.routes[message.request_id] = _Route(message.reply_to, message.delivery, message.arrival_s)
        try:
            self.outputs.add_request(message.request_id, message.prompt_token_ids, message.params, message.resume)
        except Exception as error:  # this request's detokenizer or stop matcher: its error, not the actor's
            self.log.warning("output state could not be set up for a request", request_id=message.request_id,
                             exc_info=error)
            await self.to_scheduler.send(Cancel(message.request_id, FinishReason.ERROR))
            await self._write([self.outputs.error_delta(message.request_id, "request_failed",
                                                        f"{type(error).__name__}: {error}")])

    async def _write(self, deltas: list[RequestDelta]) -> None:
        routed = [(self.routes[delta.request_id], delta) for delta in deltas if delta.request_id in self.routes]
        unwritable = set(await self.sink.write([(route.reply_to, to_wire(delta)) for route, delta in routed]))
        for _, delta in routed:
            if delta.request_id in unwritable:
                await self._abandon(delta.request_id, delta.seq)
        now = time.perf_counter()
        for route, delta in routed:
            if delta.request_id in unwritable:
                continue
            self._observe(route, delta, now)
            if delta.finished:
                del self.routes[delta.request_id]
                if route.delivery is not None:
                    await route.delivery.ack()
                await self.admission.release(delta.request_id)

    async def _abandon(self, request_id: str, seq: int) -> None:
        """A request whose reply key holds no stream (a client SET it, or named a key of another type):
        it stops here, is answered elsewhere, and its entry is acked, never redelivered to crash-loop
        a worker."""
        route = self.routes.pop(request_id, None)
        if route is None:
            return
        self.log.warning("reply key is not a stream; request abandoned", request_id=request_id, key=route.reply_to)
        self.outputs.error_delta(request_id, "reply_unwritable", "")  # forgets its output state
        await self.to_scheduler.send(Cancel(request_id, FinishReason.ERROR))
        await self._answer_elsewhere(request_id, route.reply_to, route.delivery, seq, "reply_unwritable",
                                     "the request was stopped: no reply can be written to its reply_to")
        if route.delivery is not None:
            await route.delivery.ack()
        await self.admission.release(request_id)

    async def _write_error(self, message: ErrorReply) -> None:
        delta = RequestDelta(message.request_id, message.seq, [],
                             error={"code": message.code, "message": message.message})
        if await self.sink.write([(message.reply_to, to_wire(delta))]):
            await self._answer_elsewhere(message.request_id, message.reply_to, message.delivery, message.seq,
                                         message.code, message.message)
        if message.delivery is not None:
            await message.delivery.ack()
        if self.metrics is not None:
            self.metrics.record_error(message.code)

    async def _answer_elsewhere(self, request_id: str, reply_to: str, delivery: Delivery | None, seq: int,
                                code: str, text: str) -> None:
        """An answer whose reply key holds no stream goes to the request's own stream instead (Intake
        claimed the id, so that stream is its to write), or, when that is the key, to the dead letters:
        never nowhere, or the client would wait forever."""
        own = default_reply_to(self.prefix, request_id)
        note = f" (answered on {own!r}: reply_to {reply_to!r} holds a key that is not a stream)"
        if reply_to != own:
            delta = RequestDelta(request_id, seq, [], error={"code": code, "message": text + note})
            if not await self.sink.write([(own, to_wire(delta))]):
                return
        self.log.warning("no reply stream can be written; dead-lettered", request_id=request_id)
        if self.dead_letter is not None:
            reason = f"{code}: {text} (no reply stream can be written: {own!r} holds a key that is not a stream)"
            await self.dead_letter(Malformed(raw_of(delivery), reason, delivery.message_id if delivery else None,
                                             request_id, reply_to))

    def _observe(self, route: _Route, delta: RequestDelta, now: float) -> None:
        if self.metrics is None:
            return
        if route.first_token_s is None and any(choice.token_ids for choice in delta.choices):
            route.first_token_s = now
            self.metrics.observe_first_token(now - route.arrival_s)
        if delta.usage is not None:
            for choice in delta.choices:
                if choice.finish_reason is not None:
                    self.metrics.record_finish(choice.finish_reason)
            generated = delta.usage.completion_tokens
            if route.first_token_s is not None and generated > 1:
                self.metrics.observe_output_token_interval((now - route.first_token_s) / (generated - 1))
