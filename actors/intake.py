"""Intake actor: reads request entries (with admission control), validates and tokenizes them,
and hands them to Output (reply routing) and the Scheduler. Bad entries get an error reply when
their id is readable, and are dead-lettered otherwise."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from actors.admission import Admission
from actors.messages import Admit, ErrorReply, OpenReply
from pipeline.intake import RequestBuilder
from queue_adapters.base import Consumer, Delivery, Producer
from queue_adapters.codec import Malformed, WireRequest

DeadLetter = Callable[[Malformed], Awaitable[None]]


class IntakeActor:
    name = "intake"

    def __init__(self, requests: Consumer[WireRequest | Malformed], builder: RequestBuilder, prefix: str,
                 admission: Admission, to_output: Producer[Any], to_scheduler: Producer[Any],
                 dead_letter: DeadLetter, max_read: int = 32) -> None:
        self.requests = requests
        self.builder = builder
        self.prefix = prefix
        self.admission = admission
        self.to_output = to_output
        self.to_scheduler = to_scheduler
        self.dead_letter = dead_letter
        self.max_read = max_read
        self.log = structlog.get_logger(__name__).bind(actor=self.name)

    async def run(self) -> None:
        while True:
            room = await self.admission.room()
            for delivery in await self.requests.receive(max_count=min(room, self.max_read), timeout_s=1.0):
                await self.admit(delivery)

    async def admit(self, delivery: Delivery[WireRequest | Malformed]) -> None:
        message = delivery.message
        if isinstance(message, Malformed):
            await self._reject_malformed(message, delivery)
            return
        reply_to = message.reply_to or f"{self.prefix}:out:{message.id}"
        if message.id in self.admission.in_flight_ids:
            # Same id again while it runs here: its one reply stream already answers it.
            self.log.info("duplicate request id ignored while in flight", request_id=message.id)
            await delivery.ack()
            return
        try:
            request = self._build(message)
        except ValueError as error:
            self.log.info("request rejected", request_id=message.id, error=str(error))
            await self.to_output.send(ErrorReply(message.id, reply_to, "invalid_request", str(error), delivery))
            return
        self.admission.take(message.id)
        # Output learns the route before the scheduler can produce the first token event.
        await self.to_output.send(OpenReply(message.id, request.prompt_token_ids, request.params, reply_to, delivery,
                                            time.perf_counter()))
        await self.to_scheduler.send(Admit.of(request, message.deadline_ms))

    def _build(self, message: WireRequest) -> Any:
        if message.lora is not None:
            raise ValueError(f"lora: unknown adapter {message.lora!r} (this worker has no LoRA adapters loaded)")
        return self.builder.build(message.id, message.sampling_params(), prompt=message.prompt,
                                  prompt_token_ids=message.prompt_token_ids,
                                  messages=[{"role": m.role, "content": m.content} for m in message.messages]
                                  if message.messages is not None else None)

    async def _reject_malformed(self, message: Malformed, delivery: Delivery[Any]) -> None:
        if message.request_id is not None:
            reply_to = message.reply_to or f"{self.prefix}:out:{message.request_id}"
            await self.to_output.send(ErrorReply(message.request_id, reply_to, "invalid_request", message.error,
                                                 delivery))
            return
        await self.dead_letter(message)
        await delivery.ack()
