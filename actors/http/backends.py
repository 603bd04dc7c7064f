"""Where the gateway's requests go: the actor graph in this process, or workers behind Redis.

Both speak the wire protocol (docs/design.md §3): submit a WireRequest, read its reply entries in seq order,
cancel by id. Retrying an id that is running or done reads its reply stream from the start instead
of generating again: the workers' idempotency covers Redis; the embedded backend checks its sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from actors.http.errors import ApiError
from actors.http.request_ids import RedisRequestIds
from actors.http.tenancy.fair_gate import FairGate, MemoryShares, RedisShares
from actors.kit.messages import Cancel
from actors.kit.runtime import ActorRuntime
from actors.worker.control import apply_lora, lora_path_refusal
from actors.worker.metrics import WorkerMetrics
from actors.worker.recovery.liveness import heartbeat_key
from actors.worker.replies import MemoryReplySink
from actors.worker.run import build_graph, stats_reporters
from pipeline.embedding_engine import EmbeddingEngine
from pipeline.engine import LLMEngine
from pipeline.intake.chat_content import ChatContentGuard
from pipeline.intake.request_builder import RequestBuilder
from queue_adapters.client import AqueductClient, ControlAnswers, ReplyOrder
from queue_adapters.codec import (
    Malformed,
    WireControl,
    WireControlResult,
    WireError,
    WireReply,
    WireRequest,
    encode,
)
from queue_adapters.memory import MemoryStream, StreamClosed
from queue_adapters.placement import Placement, PrefixDirectory, PromptRenderer
from queue_adapters.redis_streams import DATA_FIELD

log = structlog.get_logger(__name__)

EMBEDDED_PREFIX = "embedded"
_KEPT_FINISHED_STREAMS = 1024  # embedded: finished reply streams kept for retries with the same id
WORKER_DIED = "worker_died"  # the error code of requests whose engine died under them (HTTP 503)


# Placement tokenizes at most this much of a prompt (about 8k tokens of English): its leading blocks
# are what placement needs, and tokenizing a 3 MB prompt here held the GIL for seconds, stalling
# every stream through the gateway. Of a cut prompt, the last ids are dropped: a token may span the cut.
PLACEMENT_MAX_CHARS = 32_768
PLACEMENT_CUT_MARGIN = 64


def prompt_renderer(tokenizer: Any, max_model_len: int | None) -> PromptRenderer | None:
    """Text and messages -> the token ids a worker will compute (pipeline/intake/request_builder.py),
    for placement: of a long prompt, those of its first PLACEMENT_MAX_CHARS characters; a message with
    image parts is not rendered (its blocks depend on the image)."""
    if tokenizer is None:
        return None
    # Only text and messages come here (token ids are placed as they are): the vocabulary bound is moot.
    builder = RequestBuilder(tokenizer, 1 << 31, frozenset(), max_model_len or 1 << 30,
                             content_guard=ChatContentGuard(tokenizer))

    def render(request: WireRequest) -> list[int]:
        messages = [message.as_dict() for message in request.messages] if request.messages is not None else None
        if messages and any(isinstance(m["content"], list) and any(part["type"] != "text" for part in m["content"])
                            for m in messages):
            raise ValueError("images: placed by any worker")
        text, ids = builder.rendered_prompt(request.prompt, request.prompt_token_ids, messages, request.tools,
                                            request.chat_template_kwargs, max_chars=PLACEMENT_MAX_CHARS)
        # Cut: the ids near the cut may not be the whole prompt's; those before it are.
        return ids[:-PLACEMENT_CUT_MARGIN] if text is not None and len(text) >= PLACEMENT_MAX_CHARS else ids

    return render


async def _constant(value: int) -> int:
    return value


def _int_or_one(value: bytes | str) -> int:
    """A heartbeat's value: the worker's --max-in-flight (1 from a worker that does not say)."""
    try:
        return max(1, int(value))
    except ValueError:
        return 1


class Backend(Protocol):
    model_name: str
    pooling: bool  # started with --runner pooling: /v1/embeddings, not completions or chat
    tokenizer: Any
    max_model_len: int | None
    worker_metrics: WorkerMetrics | None  # the engine's own metrics when it runs in this process

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def submit(self, request: WireRequest) -> None: ...

    async def submit_all(self, requests: list[WireRequest]) -> None:
        """Submit one client request's prompts, which pass the tenant's fair-share gate together."""
        ...

    def replies(self, request: WireRequest) -> AsyncIterator[WireReply]: ...

    async def cancel(self, request_id: str) -> None: ...

    async def healthy(self) -> bool: ...

    def adapter_names(self) -> list[str]:
        """LoRA adapters a request's `model` may name (besides the base model)."""
        ...

    def adapter_root(self, name: str) -> str:
        """Where adapter `name` was loaded from (/v1/models' `root`); its name when not known here."""
        ...

    async def change_lora(self, control: WireControl, lora_root: Path | None, timeout_s: float) -> ControlAnswers:
        """Apply a load_lora / unload_lora control entry (the runtime LoRA routes): in this process, or on
        every live worker; their answers, and the workers that gave none within `timeout_s`."""
        ...

    async def workers_alive(self) -> bool:
        """Whether anyone will eventually answer: a request waiting behind others is not a 503."""
        ...


_SPARE_CONNECTIONS = 32  # beyond one per streaming request: submits, cancels, health pings, heartbeat scans


class RemoteBackend:
    """A stateless gateway: requests onto `{prefix}:requests`, replies from `{prefix}:out:{id}`.

    Each request waiting for replies holds one Redis connection (a blocking XREAD on its reply stream),
    so the pool is sized for `max_pending` of them (redis-py's default of 100 would fail the 101st)."""

    def __init__(self, redis_url: str, prefix: str, model_name: str, tokenizer: Any,
                 max_model_len: int | None = None, max_pending: int = 256,
                 adapters: list[str] | None = None, pooling: bool = False,
                 placement_block_size: int | None = None) -> None:
        self.redis_url, self.prefix = redis_url, prefix
        # --placement prefix: the workers' block size, to name a prompt's blocks as they do; None: any worker.
        self.placement_block_size = None if pooling else placement_block_size
        self.pooling = pooling  # as the workers were started (--runner pooling)
        self.adapters = list(adapters or [])  # as the workers were started with (--lora-modules)
        self.adapter_paths: dict[str, str] = {}  # those loaded through this gateway
        self.model_name, self.tokenizer, self.max_model_len = model_name, tokenizer, max_model_len
        self.max_connections = max_pending + _SPARE_CONNECTIONS
        self.worker_metrics = None  # each worker serves its own /metrics
        self.client: AqueductClient | None = None
        self.gate: FairGate | None = None  # fair share between tenants across the fleet (tenancy/fair_gate.py)
        self._capacity: int | None = None
        self._capacity_read_at = float("-inf")
        self._redis: aioredis.Redis | None = None

    async def start(self) -> None:
        self._redis = aioredis.Redis.from_url(self.redis_url, max_connections=self.max_connections)
        placement = None
        if self.placement_block_size is not None:
            placement = Placement(PrefixDirectory(self._redis, self.prefix), self.placement_block_size,
                                  prompt_renderer(self.tokenizer, self.max_model_len))
        self.client = AqueductClient(self.redis_url, self.prefix, redis=self._redis, block_ms=500, placement=placement)
        self.gate = FairGate(RedisShares(self._redis, self.prefix), self.fleet_capacity)
        self.request_ids = RedisRequestIds(self._redis, self.prefix)  # shared by every gateway of the deployment

    def adapter_names(self) -> list[str]:
        return self.adapters

    def adapter_root(self, name: str) -> str:
        return self.adapter_paths.get(name, name)

    async def change_lora(self, control: WireControl, lora_root: Path | None, timeout_s: float) -> ControlAnswers:
        """Every live worker applies the entry (their own --lora-root applies); an adapter that some
        worker failed to load is unloaded again from the others, so none serves it."""
        refusal = lora_path_refusal(control.load_lora.path, lora_root) if control.load_lora is not None else None
        if refusal is not None:  # the gateway's own --lora-root: no worker need see the entry
            return ControlAnswers((WireControlResult(worker="", op="load_lora", ok=False, error=refusal),), ())
        try:
            workers = await self.live_workers()
            if not workers:
                return ControlAnswers((), ())
            outcome = await self._client().control(control, workers, self.live_workers, timeout_s)
            if control.load_lora is not None and any(not answer.ok for answer in outcome.answers):
                await self._client().redis.xadd(f"{self.prefix}:control", {
                    DATA_FIELD: encode(WireControl(unload_lora=control.load_lora.name))})
        except (ConnectionError, OSError, RedisError) as error:
            raise ApiError(503, f"Redis is unreachable: {error}", code="redis_unavailable") from None
        self._note_lora_change(control, outcome)
        return outcome

    def _note_lora_change(self, control: WireControl, outcome: ControlAnswers) -> None:
        """This gateway's adapters (what a request's `model` may name) follow its own changes: a load
        once every live worker has it, a failed load or an unload once no worker that answered has it."""
        oks = [answer.ok for answer in outcome.answers]
        if control.load_lora is not None and all(oks) and oks and not outcome.missing:
            self.adapters = [*dict.fromkeys([*self.adapters, control.load_lora.name])]
            self.adapter_paths[control.load_lora.name] = control.load_lora.path
        elif control.load_lora is not None and not all(oks):  # unloaded again everywhere (change_lora)
            self._forget_adapter(control.load_lora.name)
        elif control.unload_lora is not None and (any(oks) or not outcome.missing):
            self._forget_adapter(control.unload_lora)

    def _forget_adapter(self, name: str) -> None:
        self.adapters = [adapter for adapter in self.adapters if adapter != name]
        self.adapter_paths.pop(name, None)

    async def live_workers(self) -> set[str]:
        """The names of the workers whose heartbeat key exists (actors/worker/recovery/liveness.py)."""
        start = len(heartbeat_key(self.prefix, ""))
        pattern = heartbeat_key(self.prefix, "*")
        return {key.decode()[start:] async for key in self._client().redis.scan_iter(match=pattern, count=100)}

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    async def submit(self, request: WireRequest) -> None:
        await self.submit_all([request])

    async def submit_all(self, requests: list[WireRequest]) -> None:
        # A duplicate id is acked by the worker that owns it; replies() reads its stream from the start.
        # parse_body built the params with SamplingParams.from_dict: the codec need not check them again.
        await self._gate().enter(requests)  # a tenant beyond its share of the fleet waits here
        try:
            for request in requests:
                await self._client().submit(request, params_checked=True)
        except BaseException:
            for request in requests:
                await asyncio.shield(self._gate().leave(request.id))
            raise

    async def replies(self, request: WireRequest) -> AsyncIterator[WireReply]:
        try:
            async for reply in self._client().stream(request.id, n=request.params.get("n", 1)):
                yield reply
        finally:
            await asyncio.shield(self._gate().leave(request.id))

    async def cancel(self, request_id: str) -> None:
        await self._client().cancel(request_id)

    async def fleet_capacity(self) -> int | None:
        """The live workers' --max-in-flight summed (their heartbeat values), read at most once a second."""
        now = time.monotonic()
        if now - self._capacity_read_at > 1.0:
            keys = [key async for key in self._client().redis.scan_iter(match=heartbeat_key(self.prefix, "*"),
                                                                        count=100)]
            values = await self._client().redis.mget(keys) if keys else []
            self._capacity = sum(_int_or_one(value) for value in values if value is not None) or None
            self._capacity_read_at = now
        return self._capacity

    def _gate(self) -> FairGate:
        if self.gate is None:
            raise RuntimeError("the backend is not started")
        return self.gate

    async def healthy(self) -> bool:
        """Redis answers (whether workers do shows per request, as 503 after --worker-timeout)."""
        try:
            return bool(await self._client().redis.ping())
        except (ConnectionError, OSError, RedisError):
            return False

    async def workers_alive(self) -> bool:
        """A live worker refreshes its heartbeat key (actors/worker/recovery/liveness.py); any one will do."""
        try:
            async for _ in self._client().redis.scan_iter(match=heartbeat_key(self.prefix, "*"), count=100):
                return True
        except (ConnectionError, OSError, RedisError):
            return False
        return False

    def _client(self) -> AqueductClient:
        if self.client is None:
            raise RuntimeError("the backend is not started")
        return self.client


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
