"""The pooling worker's graph (--runner pooling): embeddings instead of generation.

    requests ─► EmbedIntake ─► Embed ─► Output ─► reply streams, acks
                     └──────── routes ───┘

Intake is the generation graph's (claims, idempotency, resume, refusals) with two differences: an
entry must ask for `embed`, and it becomes an `Embed` of checked token ids. The Embed actor takes
what is waiting (up to --max-num-seqs requests), embeds it in one call on the device thread, and
hands each vector to Output, which writes it as the request's one and final reply entry. A request
is one forward (or one chunked prefill), so a cancel has nothing to stop: its result is dropped
with its route.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from actors.kit.base import Actor
from actors.kit.messages import Embed, Embedded, RequestFailed
from actors.worker.intake import IntakeActor
from pipeline.embedding_engine import EmbeddingEngine, EmbeddingJob
from pipeline.request.request import Request, ResumeState
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
        return Embed(request.request_id, request.prompt_token_ids, message.dimensions)


class EmbedActor(Actor):
    """Batches waiting Embeds into one device call; cancels (from Output or Control) are ignored."""

    def __init__(self, engine: EmbeddingEngine, device: ThreadPoolExecutor, inbox: Consumer[Any],
                 to_output: Producer[Any], max_batch: int) -> None:
        super().__init__("embed", inbox)
        self.engine, self.device, self.to_output = engine, device, to_output
        self.max_batch = max_batch

    async def run(self) -> None:
        while deliveries := await self.inbox.receive(max_count=self.max_batch):  # []: closed and drained
            jobs = [delivery.message for delivery in deliveries if isinstance(delivery.message, Embed)]
            if jobs:
                await self._embed(jobs)
            for delivery in deliveries:
                await delivery.ack()

    async def handle(self, message: Any) -> None:
        if isinstance(message, Embed):
            await self._embed([message])

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
