"""The embedded backend: the worker's actor graph over memory streams, in this process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import structlog

from actors.http.tenancy.fair_gate import FairGate, MemoryShares
from actors.kit.messages import Cancel
from actors.kit.runtime import ActorRuntime
from actors.worker.control import apply_lora
from actors.worker.metrics import WorkerMetrics
from actors.worker.replies import MemoryReplySink
from actors.worker.run import build_graph, stats_reporters
from pipeline.embedding_engine import EmbeddingEngine
from pipeline.engine import LLMEngine
from queue_adapters.client import ControlAnswers, ReplyOrder
from queue_adapters.codec import Malformed, WireControl, WireError, WireReply, WireRequest
from queue_adapters.memory import MemoryStream, StreamClosed

log = structlog.get_logger(__name__)

EMBEDDED_PREFIX = "embedded"
_KEPT_FINISHED_STREAMS = 1024  # embedded: finished reply streams kept for retries with the same id
WORKER_DIED = "worker_died"  # the error code of requests whose engine died under them (HTTP 503)


class EmbeddedBackend:
    """The worker's actor graph over memory streams, in this process (one engine, no Redis).

    Should an actor die (a bug), nothing will answer again: /health turns 503 at once, every request
    waiting for replies and every new one gets a `worker_died` error entry, and `on_death` is called
    (`aqueduct serve` then exits non-zero, for its supervisor to restart it)."""

    def __init__(self, engine: LLMEngine | EmbeddingEngine, device: ThreadPoolExecutor | None = None) -> None:
        self.engine = engine
        self.device = device
        self.pooling = isinstance(engine, EmbeddingEngine)  # --runner pooling: embeddings, not generation
        self.model_name, self.tokenizer = engine.model_name, engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.sink = MemoryReplySink()
        self.worker_metrics = WorkerMetrics()
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._submitted: set[str] = set()
        self._running: asyncio.Task[int] | None = None
        self._stop = asyncio.Event()
        self.died: str | None = None  # why the graph stopped unexpectedly (not through close())
        lora = engine.config.lora
        self.adapter_paths: dict[str, str] = dict(lora.modules) if lora is not None else {}
        self.on_death: Callable[[], None] | None = None
        self._failing: asyncio.Task[None] | None = None

    def adapter_names(self) -> list[str]:
        registry = self.engine.lora_registry
        return registry.names() if registry is not None else []

    def adapter_root(self, name: str) -> str:
        return self.adapter_paths.get(name, name)

    async def change_lora(self, control: WireControl, lora_root: Path | None, timeout_s: float) -> ControlAnswers:
        """As a worker's control actor applies the entry: files read on the device thread, between steps."""
        answer = await apply_lora(control, self.engine.lora_registry, self.device, lora_root, worker_name="")
        if answer.ok and control.load_lora is not None:
            self.adapter_paths[control.load_lora.name] = control.load_lora.path
        elif answer.ok:
            self.adapter_paths.pop(control.unload_lora or "", None)
        return ControlAnswers((answer,), ())

    async def start(self) -> None:
        max_in_flight = 2 * self.engine.config.scheduler.max_num_seqs
        self.gate = FairGate(MemoryShares(), functools.partial(_constant, max_in_flight))
        self.inbox: MemoryStream[WireRequest | Malformed] = MemoryStream(maxsize=4 * max_in_flight)
        self.producer = self.inbox.producer()
        graph = build_graph(self.engine, self.inbox.consumer(), self.sink, EMBEDDED_PREFIX, self._no_dead_letters,
                            max_in_flight=max_in_flight, metrics=self.worker_metrics, device=self.device)
        self.to_scheduler, self.device = graph.to_scheduler, graph.device
        stats = stats_reporters(self.engine, self.worker_metrics, interval_s=10.0)
        runtime = ActorRuntime([*graph.actors, *stats], graph.intake, graph.admission.wait_idle, drain_timeout_s=5.0,
                               on_crash=self._graph_died)
        runtime.stop_when(self._stop)
        self._running = asyncio.create_task(runtime.run(), name="embedded-graph")
        self._running.add_done_callback(self._graph_ended)

    async def close(self) -> None:
        self._stop.set()
        if self._running is not None:
            await self._running
        if self._failing is not None:
            await self._failing

    async def healthy(self) -> bool:
        return self.died is None and self._running is not None and not self._running.done()

    async def workers_alive(self) -> bool:
        return await self.healthy()

    async def submit(self, request: WireRequest) -> None:
        await self.submit_all([request])

    async def submit_all(self, requests: list[WireRequest]) -> None:
        if self.died is not None:
            return  # replies() says so
        # A retry attaches to the reply stream already being written.
        fresh = [request for request in requests if request.id not in self._submitted]
        await self.gate.enter(fresh)  # a tenant beyond its share of the engine waits here
        for request in fresh:
            self._submitted.add(request.id)
            with contextlib.suppress(StreamClosed):  # the graph died while this waited for room: replies() says so
                await self.producer.send(request)

    async def replies(self, request: WireRequest) -> AsyncIterator[WireReply]:
        key = f"{EMBEDDED_PREFIX}:out:{request.id}"
        order, seen = ReplyOrder(request.params.get("n", 1)), 0
        try:
            while not order.done:
                entries = await self.sink.wait_beyond(key, seen)
                if len(entries) == seen:  # nothing new and nothing to come: the graph died
                    yield WireReply(id=request.id, seq=order.next_seq,
                                    error=WireError(code=WORKER_DIED, message=self.died or "the engine stopped"))
                    return
                # `entries` is the live stream: it may grow while this generator waits at a yield.
                new, seen = entries[seen:], len(entries)
                for entry in new:
                    for ready in order.push(entry):
                        yield ready
        finally:  # finished or abandoned (a cancelled request's stream still gets its final entry)
            self._remember_finished(request.id)
            await self.gate.leave(request.id)

    def _remember_finished(self, request_id: str) -> None:
        """Keep the last finished streams for retries; forget older ones so memory stays bounded."""
        self._finished[request_id] = None
        self._finished.move_to_end(request_id)
        while len(self._finished) > _KEPT_FINISHED_STREAMS:
            old_id, _ = self._finished.popitem(last=False)
            self._submitted.discard(old_id)
            self.sink.streams.pop(f"{EMBEDDED_PREFIX}:out:{old_id}", None)

    async def cancel(self, request_id: str) -> None:
        if self.died is None:  # dead, its inbox could be full for good
            await self.to_scheduler.send(Cancel(request_id))

    def _graph_ended(self, task: asyncio.Task[int]) -> None:
        """on_crash's backstop: the runtime itself failed, or it stopped without close()."""
        if not self._stop.is_set() and not task.cancelled():
            self._graph_died("embedded-graph")

    def _graph_died(self, actor: str) -> None:
        if self.died is not None:
            return
        self.died = f"the engine stopped: its actor {actor!r} died"
        log.error("the embedded engine died; failing its requests", actor=actor)
        self._failing = asyncio.get_running_loop().create_task(self._fail_everything(), name="embedded-failing")
        if self.on_death is not None:
            self.on_death()

    async def _fail_everything(self) -> None:
        await self.inbox.close()  # a submit waiting for room gives up
        await self.sink.mark_writer_gone()  # every replies() answers with the error

    @staticmethod
    async def _no_dead_letters(message: Malformed) -> None:
        log.error("an undecodable request reached the embedded graph", error=message.error)


async def _constant(value: int) -> int:
    return value
