"""The pooling worker's graph (--runner pooling): embeddings instead of generation.

    requests ─► EmbedIntake ─► Embed ─► Output ─► reply streams, acks
                     └──────── routes ───┘

Intake is the generation graph's (claims, idempotency, resume, refusals) with two differences: an
entry must ask for `embed`, and it becomes an `Embed` of checked token ids. The Embed actor takes
what is waiting (up to --max-num-seqs requests), embeds it in one call on the device thread, and
hands each vector to Output, which writes it as the request's one and final reply entry.

Cancels and deadlines end requests as the scheduler ends generation requests: before each device call
the actor takes all its mail, and a waiting request that a `Cancel` names (a client gone, over the
control stream) ends with `abort`, one past its `deadline_ms` with `timeout`, neither embedded. A request
already on the device is one forward (or one chunked prefill): it finishes, and its answer is written.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from actors.kit.base import Actor
from actors.kit.messages import Cancel, Embed, Embedded, EmbedStopped, RequestFailed
from actors.worker.intake import IntakeActor
from pipeline.embedding_engine import EmbeddingEngine, EmbeddingJob
from pipeline.request.request import FinishReason, Request, ResumeState
from pipeline.request.sampling_params import SamplingParams
from queue_adapters.base import Consumer, Producer
from queue_adapters.codec import WireRequest


class EmbedIntake(IntakeActor):
    def __init__(self, engine: EmbeddingEngine, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.engine = engine

    def _build(self, message: WireRequest) -> Request:
        if not message.embed:
            raise ValueError("this worker serves embeddings (--runner pooling): it takes embed requests only")
        unused = [name for name in ("messages", "images", "tools", "chat_template_kwargs", "lora")
                  if getattr(message, name) is not None] + (["params"] if message.params else [])
        if unused:
            raise ValueError(f"{unused[0]}: an embedding request takes prompt or prompt_token_ids, and dimensions")
        job = self.engine.job(message.prompt, message.prompt_token_ids, message.dimensions)
        return Request(message.id, job.prompt_token_ids, SamplingParams(), seed=0)

    def _admit_message(self, request: Request, message: WireRequest, resume: ResumeState | None) -> Any:
        return Embed(request.request_id, request.prompt_token_ids, message.dimensions, message.deadline_ms)


class EmbedActor(Actor):
    """Batches waiting Embeds into one device call; a Cancel or a deadline ends a waiting one unembedded."""

    max_drain_rounds = 64  # receives per round of mail, so a flood of it cannot hold the device back

    def __init__(self, engine: EmbeddingEngine, device: ThreadPoolExecutor, inbox: Consumer[Any],
                 to_output: Producer[Any], max_batch: int) -> None:
        super().__init__("embed", inbox)
        self.engine, self.device, self.to_output = engine, device, to_output
        self.max_batch = max_batch
        self.waiting: dict[str, Embed] = {}  # by request id, in arrival order

    async def run(self) -> None:
        while await self._take_mail():
            await self._stop_expired()
            if self.waiting:
                await self._embed(self._next_batch())

    async def handle(self, message: Any) -> None:
        if isinstance(message, Embed):
            self.waiting[message.request_id] = message
        elif isinstance(message, Cancel):
            embed = self.waiting.pop(message.request_id, None)
            if embed is not None:  # else already embedded (its answer is written) or never here
                await self._stop(embed, message.reason)
        else:
            raise TypeError(f"embed got an unexpected {type(message).__name__}")

    async def _take_mail(self) -> bool:
        """All the mail there is, waiting for it only while no Embed waits; False once the inbox is closed
        and drained and nothing waits."""
        deliveries = await self.inbox.receive(max_count=self.batch_size, timeout_s=0 if self.waiting else None)
        if not deliveries and not self.waiting:
            return False
        for round_number in range(1, self.max_drain_rounds + 1):
            for delivery in deliveries:
                await self.handle(delivery.message)
                await delivery.ack()
            if not deliveries or round_number == self.max_drain_rounds:
                break
            deliveries = await self.inbox.receive(max_count=self.batch_size, timeout_s=0)
        return True

    async def _stop_expired(self) -> None:
        now_ms = time.time() * 1000
        for embed in [embed for embed in self.waiting.values() if embed.deadline_ms is not None
                      and embed.deadline_ms <= now_ms]:
            del self.waiting[embed.request_id]
            await self._stop(embed, FinishReason.TIMEOUT)

    async def _stop(self, embed: Embed, reason: FinishReason) -> None:
        self.log.info("embedding request ended before it ran", request_id=embed.request_id, reason=str(reason))
        await self.to_output.send(EmbedStopped(embed.request_id, len(embed.prompt_token_ids), str(reason)))

    def _next_batch(self) -> list[Embed]:
        return [self.waiting.pop(request_id) for request_id in list(self.waiting)[:self.max_batch]]

    async def _embed(self, jobs: list[Embed]) -> None:
        work = [EmbeddingJob(job.prompt_token_ids, job.dimensions) for job in jobs]
        try:
            vectors = await asyncio.wrap_future(self.device.submit(self.engine.embed, work))
        except ValueError as error:  # a job the checks let through but the runner cannot take
            for job in jobs:
                await self.to_output.send(RequestFailed(job.request_id, "invalid_request", str(error)))
            return
        for job, vector in zip(jobs, vectors, strict=True):
            data = np.asarray(vector, dtype="<f4").tobytes()
            await self.to_output.send(Embedded(job.request_id, data, len(job.prompt_token_ids)))
