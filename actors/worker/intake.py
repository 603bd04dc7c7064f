"""Intake actor: reads request entries (with admission control), validates and tokenizes them,
and hands them to Output (reply routing) and the Scheduler. Bad entries get an error reply when
their id is readable, and are dead-lettered otherwise."""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from redis.exceptions import ResponseError

from actors.kit.messages import Admit, ErrorReply, OpenReply
from actors.worker.admission import Admission
from actors.worker.recovery.ownership import Claim, Ownership, fingerprint_of
from actors.worker.recovery.resume import is_answered, resume_state
from pipeline.intake.request_builder import RequestBuilder
from pipeline.request.request import Request
from pipeline.request.structured_output import ALIASES as STRUCTURED_OUTPUT_FIELDS
from queue_adapters.base import Consumer, Delivery, Producer
from queue_adapters.codec import Malformed, WireReply, WireRequest, encode
from queue_adapters.redis_streams import retry_transient
from queue_adapters.wire_images import has_image_urls, resolve_image_urls

DeadLetter = Callable[[Malformed], Awaitable[None]]
ReplyReader = Callable[[str, str], Awaitable[list[WireReply]]]  # (reply_to, request id) -> entries so far


def reply_to_allowed(reply_to: str, prefix: str, pattern: str | None = None) -> bool:
    """Whether a worker may write replies to `reply_to`: a key under `{prefix}:out:`, or matching `pattern`
    (a glob, e.g. 'myapp:replies:*') when one is set, and never the deployment's own request, control or
    dead-letter streams (a client must not be able to make a worker write into them)."""
    if reply_to in (f"{prefix}:requests", f"{prefix}:control", f"{prefix}:dead"):
        return False
    if pattern is not None:
        return fnmatch.fnmatchcase(reply_to, pattern)
    return reply_to.startswith(f"{prefix}:out:")


class IntakeActor:
    name = "intake"

    def __init__(self, requests: Consumer[WireRequest | Malformed], builder: RequestBuilder, prefix: str,
                 admission: Admission, to_output: Producer[Any], to_scheduler: Producer[Any],
                 dead_letter: DeadLetter, reply_reader: ReplyReader | None = None, max_attempts: int = 3,
                 ownership: Ownership | None = None, max_read: int = 32, reply_to_pattern: str | None = None) -> None:
        self.requests = requests
        self.builder = builder
        self.prefix = prefix
        self.admission = admission
        self.to_output = to_output
        self.to_scheduler = to_scheduler
        self.dead_letter = dead_letter
        self.reply_reader = reply_reader
        self.max_attempts = max_attempts
        self.ownership = ownership
        self.max_read = max_read
        self.reply_to_pattern = reply_to_pattern
        self._fingerprints: dict[str, str] = {}  # request id -> fingerprint_of, for ids in flight here
        self.log = structlog.get_logger(__name__).bind(actor=self.name)

    async def run(self) -> None:
        while True:
            wanted = min(await self.admission.room(), self.max_read)
            deliveries = await self.requests.receive(max_count=wanted, timeout_s=1.0)
            if 0 < len(deliveries) < wanted:
                # A blocked read wakes on the first entry of a burst (Redis serves it after that one
                # XADD); the rest is usually there by now, and admitted with it they share a step.
                deliveries += await self.requests.receive(max_count=wanted - len(deliveries), timeout_s=0)
            await self.admit_all(deliveries)

    async def admit(self, delivery: Delivery[WireRequest | Malformed]) -> None:
        await self.admit_all([delivery])

    async def admit_all(self, deliveries: list[Delivery[WireRequest | Malformed]]) -> None:
        """A read's requests are claimed in one round trip and reach the scheduler together, as
        they would from memory (claimed one by one, the first would start a step alone)."""
        admissible: list[Delivery[WireRequest]] = []
        admissible_ids: set[str] = set()
        for delivery in deliveries:
            if await self._admissible(delivery, admissible_ids):
                admissible.append(delivery)
                admissible_ids.add(delivery.message.id)
        if self.ownership is None:
            claims = [Claim.TAKEN] * len(admissible)  # no owner record: the reply stream always tells
        else:
            ids, fingerprints = [d.message.id for d in admissible], [fingerprint_of(d.message) for d in admissible]
            claims = await retry_transient(lambda: self.ownership.claim(ids, fingerprints), "claim requests")
        for delivery, claim in zip(admissible, claims, strict=True):
            await self._admit_claimed(delivery, claim)

    async def _admissible(self, delivery: Delivery[WireRequest | Malformed], earlier_ids: set[str]) -> bool:
        """False (after answering or acking it) for an entry that is not to be generated here.
        `earlier_ids`: the admissible ids earlier in the same read."""
        message = delivery.message
        if isinstance(message, Malformed):
            await self._reject_malformed(message, delivery)
            return False
        reply_to = message.reply_to or f"{self.prefix}:out:{message.id}"
        if not reply_to_allowed(reply_to, self.prefix, self.reply_to_pattern):
            await self._refuse_reply_to(message.id, reply_to, delivery)
            return False
        if message.id in self.admission.in_flight_ids or message.id in earlier_ids:
            if self._fingerprints.get(message.id, fingerprint_of(message)) != fingerprint_of(message):
                await self._conflict(message, delivery)
                return False
            # Same id again while it runs here: its one reply stream already answers it.
            self.log.info("duplicate request id ignored while in flight", request_id=message.id)
            await delivery.ack()
            return False
        self._remember_fingerprint(message)
        return True

    def _remember_fingerprint(self, message: WireRequest) -> None:
        """Fingerprints of the requests in flight here (a later entry with the id must match)."""
        if len(self._fingerprints) > 2 * len(self.admission.in_flight_ids) + 64:
            self._fingerprints = {request_id: fingerprint for request_id, fingerprint in self._fingerprints.items()
                                  if request_id in self.admission.in_flight_ids}
        self._fingerprints[message.id] = fingerprint_of(message)

    async def _conflict(self, message: WireRequest, delivery: Delivery[Any]) -> None:
        """Another request holds this id: its reply stream is not ours to read or write, so this one
        can only be dead-lettered (a gateway answers such a reuse with a 409 before it gets here)."""
        self.log.warning("request id in use by a different request; dead-lettered", request_id=message.id)
        await self.dead_letter(Malformed(encode(message), "the request id is in use by a different request",
                                         delivery.message_id, message.id, None))
        await delivery.ack()

    async def _admit_claimed(self, delivery: Delivery[WireRequest], claim: Claim) -> None:
        message = delivery.message
        reply_to = message.reply_to or f"{self.prefix}:out:{message.id}"
        if claim is Claim.CONFLICT:
            await self._conflict(message, delivery)
            return
        if claim is Claim.ELSEWHERE:
            self.log.info("request id in flight on another worker; not generated twice", request_id=message.id)
            await delivery.ack()
            return
        if delivery.attempt > self.max_attempts:
            # Before the reply stream is read for resuming: whatever made the earlier attempts fail must
            # not get another chance to (a redelivered entry must never crash-loop the workers).
            await self._give_up(message, delivery, reply_to)
            return
        replies: list[WireReply] = []
        # An id held before (a resubmission, or claimed from a dead worker) resumes from its reply
        # stream; a fresh one has none to read.
        if self.reply_reader is not None and (claim is Claim.TAKEN or delivery.attempt > 1):
            try:
                replies = await self.reply_reader(reply_to, message.id)
            except ResponseError as error:  # e.g. WRONGTYPE: the key holds something else than a stream
                await self._refuse(message, delivery, f"{self.prefix}:out:{message.id}", 0,
                                   ValueError(f"reply_to {reply_to!r} cannot be read as a stream: {error}"))
                return
            if is_answered(replies):
                self.log.info("request already answered; not generated again", request_id=message.id)
                await delivery.ack()
                return
        next_seq = replies[-1].seq + 1 if replies else 0
        try:
            # Decoding and resizing images takes milliseconds per picture, a DRY breaker mask a pass
            # over the vocabulary's texts (once per breaker set), a grammar its compile: off the event loop.
            slow = bool(message.images) or has_image_urls(message) or _asks_for_dry(message.params) \
                or _asks_for_grammar(message.params)
            request = await asyncio.to_thread(self._build, message) if slow else self._build(message)
        except Exception as error:
            await self._refuse(message, delivery, reply_to, next_seq, error)
            return
        resume = resume_state(replies, request.params.n) if replies else None
        self.admission.take(message.id)
        # Output learns the route before the scheduler can produce the first token event.
        await self.to_output.send(OpenReply(message.id, request.prompt_token_ids, request.params, reply_to, delivery,
                                            time.perf_counter(), resume))
        await self.to_scheduler.send(Admit.of(request, message.deadline_ms, resume))

    async def _refuse(self, message: WireRequest, delivery: Delivery[Any], reply_to: str, next_seq: int,
                      error: Exception) -> None:
        """Whatever this request's data made the tokenizer, the chat template or the image decoder
        raise is this request's error reply: never the actor's (one request must not stop intake).
        Our own checks raise ValueError naming the field; anything else is logged with its traceback,
        as a check is missing at the edge."""
        if isinstance(error, ValueError):
            self.log.info("request rejected", request_id=message.id, error=str(error))
            text = str(error)
        else:
            self.log.warning("request failed at intake", request_id=message.id, exc_info=error)
            text = f"the request could not be prepared: {type(error).__name__}: {error}"
        await self.to_output.send(ErrorReply(message.id, reply_to, "invalid_request", text, delivery, next_seq))

    async def _give_up(self, message: WireRequest, delivery: Delivery[Any], reply_to: str) -> None:
        """A poison request: delivered max_attempts times without finishing. It is dead-lettered
        whatever its reply stream holds; that stream is read only for the error entry's seq."""
        next_seq = 0
        if self.reply_reader is not None:
            try:
                replies = await self.reply_reader(reply_to, message.id)
                next_seq = replies[-1].seq + 1 if replies else 0
            except Exception as error:  # an unreadable key: the entry still goes to the dead letters
                self.log.warning("poison request's reply stream unreadable", request_id=message.id, error=str(error))
        reason = f"delivered {delivery.attempt} times without finishing (max_attempts {self.max_attempts})"
        self.log.warning("poison request dead-lettered", request_id=message.id, attempt=delivery.attempt)
        await self.dead_letter(Malformed(encode(message), reason, delivery.message_id, message.id, reply_to))
        await self.to_output.send(ErrorReply(message.id, reply_to, "poison", reason, delivery, next_seq))

    def _build(self, message: WireRequest) -> Request:
        return build_request(self.builder, message)

    async def _refuse_reply_to(self, request_id: str, reply_to: str, delivery: Delivery[Any]) -> None:
        """The error goes to the request's default reply stream, never to the key it named."""
        allowed = self.reply_to_pattern or f"{self.prefix}:out:*"
        self.log.info("reply_to refused", request_id=request_id, reply_to=reply_to)
        await self.to_output.send(ErrorReply(request_id, f"{self.prefix}:out:{request_id}", "invalid_request",
                                             f"reply_to {reply_to!r} is not allowed: it must match {allowed!r}",
                                             delivery))

    async def _reject_malformed(self, message: Malformed, delivery: Delivery[Any]) -> None:
        if message.request_id is not None:
            reply_to = message.reply_to or f"{self.prefix}:out:{message.request_id}"
            if not reply_to_allowed(reply_to, self.prefix, self.reply_to_pattern):
                reply_to = f"{self.prefix}:out:{message.request_id}"
            await self.to_output.send(ErrorReply(message.request_id, reply_to, "invalid_request", message.error,
                                                 delivery))
            return
        await self.dead_letter(message)
        await delivery.ack()


def _asks_for_grammar(params: dict[str, Any]) -> bool:
    """A structured output: its grammar compiles (milliseconds to seconds) in a worker thread."""
    return any(params.get(name) is not None for name in (*STRUCTURED_OUTPUT_FIELDS, "structured_outputs"))


def _asks_for_dry(params: dict[str, Any]) -> bool:
    multiplier = params.get("dry_multiplier")
    return isinstance(multiplier, int | float) and multiplier > 0


def build_request(builder: RequestBuilder, message: WireRequest) -> Request:
    """A wire request as an engine Request; ValueError names what is wrong with it."""
    limits = getattr(builder.image_processor, "limits", None)
    message = resolve_image_urls(message, limits.max_bytes if limits is not None else None)
    return builder.build(message.id, builder.sampling_params(message.params), prompt=message.prompt, lora=message.lora,
                         prompt_token_ids=message.prompt_token_ids,
                         messages=[m.as_dict() for m in message.messages] if message.messages is not None else None,
                         images=message.images, tools=message.tools)
