"""Intake actor: reads request entries (with admission control), validates and tokenizes them,
and hands them to Output (reply routing) and the Scheduler. Every entry is answered: each one whose
id is readable is claimed under it (actors/worker/screening.py) and then run or refused with an
error reply; one without a usable id, or whose id another request holds, is dead-lettered."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from redis.exceptions import ResponseError

from actors.kit.messages import Admit, ErrorReply, OpenReply
from actors.worker.admission import Admission
from actors.worker.recovery.ownership import Claim, Ownership
from actors.worker.recovery.resume import is_answered, resume_state
from actors.worker.reply_routes import default_reply_to
from actors.worker.screening import Screened, raw_of, screen
from pipeline.intake.request_builder import RequestBuilder
from pipeline.request.request import Request, ResumeState
from pipeline.request.structured_output import ALIASES as STRUCTURED_OUTPUT_FIELDS
from queue_adapters.base import Consumer, Delivery, Producer
from queue_adapters.codec import Malformed, WireReply, WireRequest, encode
from queue_adapters.redis_streams import retry_transient
from queue_adapters.wire_images import has_image_urls, resolve_image_urls

DeadLetter = Callable[[Malformed], Awaitable[None]]
ReplyReader = Callable[[str, str], Awaitable[list[WireReply]]]  # (reply_to, request id) -> entries so far


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
        """A read's entries are claimed in one round trip and its requests reach the scheduler
        together, as they would from memory (claimed one by one, the first would start a step alone).
        Every entry is answered: run, refused with an error reply, acked as a duplicate or dead-lettered."""
        screened: list[Screened] = []
        earlier: dict[str, str] = {}  # id -> fingerprint of the entries earlier in this read
        for delivery in deliveries:
            entry = await self._screen(delivery, earlier)
            if entry is not None:
                screened.append(entry)
                earlier[entry.request_id] = entry.fingerprint
        for entry, claim in zip(screened, await self._claim(screened), strict=True):
            await self._settle(entry, claim)

    async def _screen(self, delivery: Delivery[WireRequest | Malformed], earlier: dict[str, str]) -> Screened | None:
        """None (after answering or acking it) for an entry that is not to be claimed here."""
        entry = screen(delivery, self.prefix, self.reply_to_pattern)
        if entry is None:  # no usable id: nowhere to answer
            await self.dead_letter(delivery.message)
            await delivery.ack()
            return None
        known = earlier.get(entry.request_id)
        if known is None and entry.request_id in self.admission.in_flight_ids:
            known = self._fingerprints.get(entry.request_id, entry.fingerprint)
        if known is None:
            if entry.request is not None:
                self._remember_fingerprint(entry.request_id, entry.fingerprint)
            return entry
        if known != entry.fingerprint:
            await self._conflict(entry)
        else:  # the same request again while it runs here: its one reply stream already answers it
            self.log.info("duplicate request id ignored while in flight", request_id=entry.request_id)
            await delivery.ack()
        return None

    async def _claim(self, screened: list[Screened]) -> list[Claim]:
        if self.ownership is None:
            return [Claim.TAKEN] * len(screened)  # no owner record: the reply stream always tells
        ids, fingerprints = [e.request_id for e in screened], [e.fingerprint for e in screened]
        shared = [e.shares for e in screened]
        return await retry_transient(lambda: self.ownership.claim(ids, fingerprints, shared), "claim requests")

    def _remember_fingerprint(self, request_id: str, fingerprint: str) -> None:
        """Fingerprints of the requests in flight here (a later entry with the id must match)."""
        if len(self._fingerprints) > 2 * len(self.admission.in_flight_ids) + 64:
            self._fingerprints = {request_id: fingerprint for request_id, fingerprint in self._fingerprints.items()
                                  if request_id in self.admission.in_flight_ids}
        self._fingerprints[request_id] = fingerprint

    async def _conflict(self, entry: Screened) -> None:
        """Another request holds this id (or shares its stream): that stream is not ours to read or
        write, so this entry can only be dead-lettered (a gateway answers such a reuse with a 409
        before it gets here)."""
        reason = "the request id is in use by a different request"
        if entry.refusal is not None:
            reason = f"{entry.refusal}; not answered on the reply stream: {reason}"
        self.log.warning("request id in use by a different request; dead-lettered", request_id=entry.request_id)
        await self.dead_letter(Malformed(raw_of(entry.delivery), reason, entry.delivery.message_id,
                                         entry.request_id, None))
        await entry.delivery.ack()

    async def _settle(self, entry: Screened, claim: Claim) -> None:
        if claim is Claim.CONFLICT:
            await self._conflict(entry)
        elif claim is Claim.ELSEWHERE:
            self.log.info("request id in flight on another worker; not generated twice", request_id=entry.request_id)
            await entry.delivery.ack()
        else:
            if claim is Claim.STREAM_TAKEN:
                entry.refuse(f"reply_to {entry.reply_to!r} is the reply stream of another request "
                             f"({entry.shares!r}): a request may only name its own stream or a shared one", self.prefix)
            request = entry.request
            if request is None:
                await self._answer_refusal(entry, claim)
            else:
                await self._admit_claimed(entry.delivery, claim, request, entry.reply_to)

    async def _answer_refusal(self, entry: Screened, claim: Claim) -> None:
        """An error reply after the entries an earlier delivery of the same entry wrote, if any."""
        replies: list[WireReply] = []
        if self.reply_reader is not None and (claim is Claim.TAKEN or entry.delivery.attempt > 1):
            with contextlib.suppress(ResponseError):  # not a stream: Output answers elsewhere
                replies = await self.reply_reader(entry.reply_to, entry.request_id)
            if is_answered(replies):
                await entry.delivery.ack()
                return
        self.log.info("request refused", request_id=entry.request_id, error=entry.refusal)
        next_seq = replies[-1].seq + 1 if replies else 0
        await self.to_output.send(ErrorReply(entry.request_id, entry.reply_to, "invalid_request",
                                             entry.refusal or "", entry.delivery, next_seq))

    async def _admit_claimed(self, delivery: Delivery[Any], claim: Claim, message: WireRequest,
                             reply_to: str) -> None:
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
                await self._refuse(message, delivery, default_reply_to(self.prefix, message.id), 0,
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
        await self.to_scheduler.send(self._admit_message(request, message, resume))

    def _admit_message(self, request: Request, message: WireRequest, resume: ResumeState | None) -> Any:
        """What the next actor gets for an admitted request (the pooling graph's intake sends an Embed)."""
        return Admit.of(request, message.deadline_ms, resume)

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


def _asks_for_grammar(params: dict[str, Any]) -> bool:
    """A structured output: its grammar compiles (milliseconds to seconds) in a worker thread."""
    return any(params.get(name) is not None for name in (*STRUCTURED_OUTPUT_FIELDS, "structured_outputs"))


def _asks_for_dry(params: dict[str, Any]) -> bool:
    multiplier = params.get("dry_multiplier")
    return isinstance(multiplier, int | float) and multiplier > 0


def build_request(builder: RequestBuilder, message: WireRequest) -> Request:
    """A wire request as an engine Request; ValueError names what is wrong with it."""
    if message.embed or message.dimensions is not None:
        raise ValueError("embed: this worker generates text; embeddings need a worker started with --runner pooling")
    limits = getattr(builder.image_processor, "limits", None)
    message = resolve_image_urls(message, limits.max_bytes if limits is not None else None)
    return builder.build(message.id, builder.sampling_params(message.params), prompt=message.prompt, lora=message.lora,
                         prompt_token_ids=message.prompt_token_ids,
                         messages=[m.as_dict() for m in message.messages] if message.messages is not None else None,
                         images=message.images, tools=message.tools,
                         chat_template_kwargs=message.chat_template_kwargs, priority=message.priority,
                         tenant=message.tenant, tenant_weight=message.tenant_weight)
