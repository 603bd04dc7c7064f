"""The pooling worker's Embed actor (actors/worker/embedding.py) ends embedding requests as the scheduler
ends generation requests: a Cancel for one still waiting ends it with `abort`, one past its deadline ends
with `timeout`, and neither is embedded; one already on the device finishes and is answered. Memory
edges and an engine that embeds on a gate the test opens, so what waits while the device is busy is
chosen."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from actors.kit.message_codec import decode_message, encode_message
from actors.kit.messages import Cancel, Embed, Embedded, EmbedStopped
from actors.worker.embedding import EmbedActor
from pipeline.embedding_engine import EmbeddingJob
from queue_adapters.memory import MemoryStream


class GatedEngine:
    """Embeds each job as [its first token id]; each call waits for the gate."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.gate = threading.Event()
        self.started = threading.Event()

    def embed(self, jobs: list[EmbeddingJob]) -> list[np.ndarray]:
        self.calls.append([job.prompt_token_ids[0] for job in jobs])
        self.started.set()
        self.gate.wait(timeout=30)
        return [np.array([job.prompt_token_ids[0]], dtype=np.float32) for job in jobs]


def _embed(token: int, deadline_ms: int | None = None) -> Embed:
    return Embed(f"r{token}", [token, 0, 0], None, deadline_ms)


async def _answers(outbox: MemoryStream[Any], count: int) -> list[tuple[str, str]]:
    consumer, answers = outbox.consumer(), []
    while len(answers) < count:
        for delivery in await consumer.receive(max_count=16, timeout_s=10):
            message = delivery.message
            answers.append((message.request_id, "embedded" if isinstance(message, Embedded)
                            else message.finish_reason))
            if isinstance(message, EmbedStopped):
                assert message.num_prompt_tokens == 3
    return answers


async def test_waiting_requests_that_are_cancelled_or_past_their_deadline_are_not_embedded() -> None:
    inbox, outbox, engine = MemoryStream[Any](), MemoryStream[Any](), GatedEngine()
    with ThreadPoolExecutor(max_workers=1) as device:
        actor = EmbedActor(engine, device, inbox.consumer(), outbox.producer(), max_batch=8)  # type: ignore[arg-type]
        running = asyncio.create_task(actor.run())
        await inbox.put(_embed(1))
        await asyncio.to_thread(engine.started.wait, 10)  # r1 is on the device
        past = int(time.time() * 1000) - 1
        for message in (_embed(2), _embed(3), Cancel("r2"), _embed(4, deadline_ms=past), _embed(5, past + 60_000),
                        Cancel("r1"), Cancel("unknown")):
            await inbox.put(message)
        engine.gate.set()
        answers = await _answers(outbox, 5)
        await inbox.close()
        await asyncio.wait_for(running, timeout=10)
    assert answers == [("r1", "embedded"), ("r2", "abort"), ("r4", "timeout"), ("r3", "embedded"),
                       ("r5", "embedded")]
    assert engine.calls == [[1], [3, 5]]  # r2 and r4 never reached the device


@pytest.mark.parametrize("take, rounds", [(64, 64), (1, 1), (1, 3)])  # mail taken per receive, receives per round
async def test_a_batch_is_at_most_max_batch_and_the_rest_waits_its_turn(take: int, rounds: int) -> None:
    inbox, outbox, engine = MemoryStream[Any](), MemoryStream[Any](), GatedEngine()
    engine.gate.set()
    for token in range(1, 6):
        await inbox.put(_embed(token))
    with ThreadPoolExecutor(max_workers=1) as device:
        actor = EmbedActor(engine, device, inbox.consumer(), outbox.producer(), max_batch=2)  # type: ignore[arg-type]
        actor.batch_size, actor.max_drain_rounds = take, rounds
        running = asyncio.create_task(actor.run())
        answers = await _answers(outbox, 5)
        await inbox.close()
        await asyncio.wait_for(running, timeout=10)
    assert [request_id for request_id, _ in answers] == ["r1", "r2", "r3", "r4", "r5"]
    assert engine.calls == ([[1], [2], [3], [4], [5]] if rounds * take == 1 else [[1, 2], [3, 4], [5]])


def test_the_messages_cross_a_redis_edge_whole() -> None:
    """--redis-edges scheduler,output_events: an Embed keeps its deadline, an EmbedStopped its reason."""
    for message in (Embed("r1", [1, 2], 8, 1_700_000_000_000), EmbedStopped("r1", 2, "timeout")):
        assert decode_message(encode_message(message)) == message
