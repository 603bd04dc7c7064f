"""Wires one worker: the actor graph of docs/design.md §2 over the engine's pipeline objects.

    requests ─► Intake ─► Scheduler ─► TensorPrep ─► GPU ─► Sampling ─┐
                  │           ▲                                       │
                  │           └──────────── StepResult ◄──────────────┘
                  └─► Output ◄── StepEvents ── Scheduler;  Output ─► reply streams, acks

Internal edges are memory streams; requests come from a Redis consumer group (or a memory
stream when embedded) and replies go to Redis streams (or memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError, ResponseError

from actors.kit.base import arm_test_crash
from actors.kit.device import device_thread, draft_on_device
from actors.kit.edges import Edges
from actors.kit.runtime import ActorRuntime, Runnable, exit_after
from actors.worker.admission import Admission
from actors.worker.control import ControlActor
from actors.worker.embedding import EmbedActor, EmbedIntake
from actors.worker.intake import DeadLetter, IntakeActor, ReplyReader
from actors.worker.metrics import WorkerMetrics
from actors.worker.output import OutputActor
from actors.worker.placement import AffinityClaimer, PrefixPublisher
from actors.worker.recovery.claimer import Claimer
from actors.worker.recovery.liveness import Heartbeat, heartbeat_key
from actors.worker.recovery.ownership import Ownership
from actors.worker.recovery.resume import read_reply_stream
from actors.worker.replies import RedisReplySink, ReplySink
from actors.worker.scheduler import SchedulerActor
from actors.worker.stages import GPUActor, SamplingActor, TensorPrepActor
from actors.worker.stream_trimmer import StreamTrimmer
from actors.worker.tenant_metrics import requests_by_tenant
from pipeline.embedding_engine import EmbeddingEngine
from pipeline.engine import LLMEngine
from queue_adapters.base import Consumer, Producer
from queue_adapters.codec import Malformed, WireReply, WireRequest, decode_request
from queue_adapters.placement import affinity_keys
from queue_adapters.priority_lanes import LANES, LanedConsumer, LanePlacement, lane_key
from queue_adapters.redis_streams import RedisStreamConsumer, dead_letter, retry_transient
from queue_adapters.stealing import AffinityStreams, Stealer
from queue_adapters.wire_limits import WireLimits

log = structlog.get_logger(__name__)

REQUESTS_GROUP = "workers"


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    redis_url: str
    prefix: str = "aqueduct"
    name: str | None = None  # default: hostname-pid (stable per container)
    health_host: str = "127.0.0.1"  # the health port shows metrics: this host only unless asked
    health_port: int | None = None
    drain_timeout_s: float = 30.0
    max_in_flight: int | None = None  # default: 2 x max_num_seqs
    reply_expire_s: int = 3600
    stats_interval_s: float = 10.0
    redis_edges: frozenset[str] = frozenset()  # internal edges to run over Redis (see actors/kit/edges.py)
    claim_idle_ms: int = 30_000  # take over requests of workers silent for this long
    max_attempts: int = 3  # deliveries of one request before it is dead-lettered
    max_queue_wait_ms: int | None = None  # a request not started within this ends with an error
    reply_to_pattern: str | None = None  # glob a request's reply_to must match (default: {prefix}:out:*)
    lora_root: str | None = None  # load_lora control entries may only name directories under it
    crash_exit_s: float | None = None  # the CLI: a crashed worker still running this long after is os._exit(1)ed
    placement: str = "prefix"  # prefix: take offers and publish cached prefixes (queue_adapters/placement.py); any
    placement_wait_ms: int = 100  # an offer its worker leaves unread this long may be taken by any worker

    @property
    def consumer_name(self) -> str:
        return self.name or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(slots=True)
class Graph:
    actors: list[Runnable]
    intake: IntakeActor
    admission: Admission
    to_scheduler: Producer[Any]  # for control messages (cancels)
    device: ThreadPoolExecutor  # the device thread (LoRA loads run there)


def build_graph(engine: LLMEngine | EmbeddingEngine, requests: Consumer[WireRequest | Malformed], sink: ReplySink,
                prefix: str, dead_letter_fn: DeadLetter, max_in_flight: int, metrics: WorkerMetrics | None = None,
                edges: Edges | None = None, reply_reader: ReplyReader | None = None, max_attempts: int = 3,
                ownership: Ownership | None = None, max_queue_wait_ms: int | None = None,
                device: ThreadPoolExecutor | None = None, reply_to_pattern: str | None = None) -> Graph:
    """The actors of one worker around `engine`'s pipeline objects (its model, scheduler, ...).

    `device`: the thread the engine was built on (actors/kit/device.py); a new one when None."""
    edges = edges or Edges()
    if isinstance(engine, EmbeddingEngine):
        return _pooling_graph(engine, requests, sink, prefix, dead_letter_fn, max_in_flight, metrics, edges,
                              reply_reader, max_attempts, ownership, device, reply_to_pattern)
    (to_scheduler, scheduler_inbox), (to_prep, prep_inbox), (to_gpu, gpu_inbox), (to_sampling, sampling_inbox), \
        (to_events, events_inbox), (to_routes, routes_inbox) = (edges.make(name) for name in (
            "scheduler", "tensor_prep", "gpu", "sampling", "output_events", "output_routes"))
    admission = Admission(max_in_flight)
    device = device or device_thread()
    draft_on_device(engine, device)
    actors: list[Runnable] = [
        SchedulerActor(engine.scheduler, scheduler_inbox, to_prep, to_events, metrics, max_queue_wait_ms),
        TensorPrepActor(engine.tensor_prep, prep_inbox, to_gpu),
        GPUActor(engine.runner, engine.sampler, device, gpu_inbox, to_sampling),
        SamplingActor(sampling_inbox, to_scheduler),
        OutputActor(engine.outputs, sink, events_inbox, routes_inbox, to_scheduler, admission, metrics, prefix,
                    dead_letter_fn),
    ]
    intake = IntakeActor(requests, engine.builder, prefix, admission, to_routes, to_scheduler, dead_letter_fn,
                         reply_reader, max_attempts, ownership, reply_to_pattern=reply_to_pattern)
    arm_test_crash(actors)
    return Graph(actors, intake, admission, to_scheduler, device)


def _pooling_graph(engine: EmbeddingEngine, requests: Consumer[WireRequest | Malformed], sink: ReplySink,
                   prefix: str, dead_letter_fn: DeadLetter, max_in_flight: int, metrics: WorkerMetrics | None,
                   edges: Edges, reply_reader: ReplyReader | None, max_attempts: int, ownership: Ownership | None,
                   device: ThreadPoolExecutor | None, reply_to_pattern: str | None) -> Graph:
    """--runner pooling: Intake -> Embed -> Output (actors/worker/embedding.py)."""
    (to_embed, embed_inbox), (to_events, events_inbox), (to_routes, routes_inbox) = (
        edges.make(name) for name in ("scheduler", "output_events", "output_routes"))
    admission = Admission(max_in_flight)
    device = device or device_thread()
    actors: list[Runnable] = [
        EmbedActor(engine, device, embed_inbox, to_events, engine.config.scheduler.max_num_seqs),
        OutputActor(engine.outputs, sink, events_inbox, routes_inbox, to_embed, admission, metrics, prefix,
                    dead_letter_fn),
    ]
    intake = EmbedIntake(engine, requests, None, prefix, admission, to_routes, to_embed, dead_letter_fn,
                         reply_reader, max_attempts, ownership, reply_to_pattern=reply_to_pattern)
    arm_test_crash(actors)
    return Graph(actors, intake, admission, to_embed, device)


def stats_reporters(engine: LLMEngine | EmbeddingEngine, metrics: WorkerMetrics, interval_s: float) -> list[Runnable]:
    """The stats line and queue gauges of a generation engine (a pooling engine keeps no queues)."""
    return [] if isinstance(engine, EmbeddingEngine) else [StatsReporter(engine, metrics, interval_s)]


async def run_worker(engine: LLMEngine | EmbeddingEngine, options: WorkerOptions, stop: asyncio.Event | None = None,
                     device: ThreadPoolExecutor | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or until `stop` is set, when given: embedding and tests)."""
    redis = aioredis.from_url(options.redis_url)
    decode = functools.partial(decode_request, limits=wire_limits(engine))
    lanes = [RedisStreamConsumer(options.redis_url, lane_key(options.prefix, lane), REQUESTS_GROUP,
                                 options.consumer_name, decode, client=redis) for lane in LANES]
    affinity = _affinity_streams(engine, options, redis, decode)
    metrics = WorkerMetrics()
    consumer = LanedConsumer(lanes, _lane_placement(affinity, options) if affinity is not None else None,
                             on_taken=metrics.record_placement)
    await consumer.ensure_group()

    async def dead_letter_fn(message: Malformed) -> None:
        metrics.record_dead_letter()
        try:
            await retry_transient(lambda: dead_letter(redis, options.prefix, message.entry_id, message.raw,
                                                      message.error, source=f"{options.prefix}:requests"),
                                  "dead letter")
        except ResponseError as error:  # e.g. a client SET {prefix}:dead: logged, never the worker's end
            log.error("dead letter not written", entry_id=message.entry_id, reason=message.error, error=str(error))

    max_in_flight = options.max_in_flight or 2 * engine.config.scheduler.max_num_seqs
    edges = Edges(options.redis_edges, options.redis_url, redis, options.prefix, options.consumer_name)
    async def reply_reader(reply_to: str, request_id: str) -> list[WireReply]:
        return await retry_transient(lambda: read_reply_stream(redis, reply_to, request_id), "read replies")

    name = options.consumer_name
    ownership = Ownership(redis, options.prefix, name, options.reply_expire_s)
    sink = RedisReplySink(redis, options.reply_expire_s, owner_key=ownership.key, stream_owner_key=ownership.stream_key)
    graph = build_graph(engine, consumer, sink, options.prefix,
                        dead_letter_fn, max_in_flight, metrics, edges, reply_reader, options.max_attempts, ownership,
                        options.max_queue_wait_ms, device, options.reply_to_pattern)
    await edges.start()
    actors = [*graph.actors, *stats_reporters(engine, metrics, options.stats_interval_s),
              ControlActor(redis, options.prefix, graph.to_scheduler, loras=engine.lora_registry, device=graph.device,
                           worker_name=options.consumer_name, lora_root=options.lora_root),
              Heartbeat(redis, options.prefix, name, options.claim_idle_ms, max_in_flight),
              *(Claimer(redis, lane, graph.intake.admit, graph.admission, options.prefix, options.claim_idle_ms)
                for lane in lanes),
              StreamTrimmer(redis, [lane.stream_key for lane in lanes]
                            + (affinity_keys(options.prefix, name) if affinity is not None else []))]
    publisher = None
    if affinity is not None:
        assert isinstance(engine, LLMEngine)
        publisher = PrefixPublisher(redis, options.prefix, name, engine.scheduler.kv_cache.pool, graph.admission,
                                    options.claim_idle_ms)
        actors += [publisher, AffinityClaimer(affinity, Claimer(redis, lanes[0], graph.intake.admit, graph.admission,
                                                                options.prefix, options.claim_idle_ms),
                                              options.claim_idle_ms)]
    runtime = ActorRuntime(actors, graph.intake, graph.admission.wait_idle, options.drain_timeout_s,
                           on_crash=_crash_exit(options.crash_exit_s))
    if stop is None:
        runtime.install_signal_handlers()
    else:
        runtime.stop_when(stop)
    health = await _start_health(options, metrics, redis)
    structlog.contextvars.bind_contextvars(worker=options.consumer_name)
    log.info("worker started", prefix=options.prefix, consumer=options.consumer_name, max_in_flight=max_in_flight)
    try:
        return await runtime.run()
    finally:
        # Gone now: other workers may claim what is still pending at once, not after claim_idle_ms.
        with contextlib.suppress(RedisError, OSError):
            if publisher is not None:
                await publisher.withdraw()
            await redis.delete(heartbeat_key(options.prefix, name))
        if health is not None:
            await health.stop()
        await edges.close()
        await consumer.close()
        if affinity is not None:
            await affinity.close()
        await sink.close()
        await redis.aclose()


def _affinity_streams(engine: LLMEngine | EmbeddingEngine, options: WorkerOptions, redis: aioredis.Redis,
                      decode: Any) -> AffinityStreams[WireRequest | Malformed] | None:
    """This worker's view of the affinity streams under --placement prefix, and its cache's journal
    switched on; None when it takes no offers (--placement any, a pooling or prefix-cache-less engine)."""
    if options.placement != "prefix":
        return None
    if not isinstance(engine, LLMEngine) or not engine.scheduler.kv_cache.enable_prefix_caching:
        log.info("prefix placement off: this worker keeps no prefix cache", placement=options.placement)
        return None
    engine.scheduler.kv_cache.publish_prefix_keys()
    return AffinityStreams(options.redis_url, redis, options.prefix, REQUESTS_GROUP, options.consumer_name, decode)


def _lane_placement(affinity: AffinityStreams[Any], options: WorkerOptions) -> LanePlacement:
    own = [affinity.consumer(key) for key in affinity_keys(options.prefix, options.consumer_name)]
    stealers: list[Any] = [Stealer(affinity, lane, options.placement_wait_ms) for lane in LANES]
    return LanePlacement(own, stealers, affinity.other_workers, options.placement_wait_ms)


def wire_limits(engine: LLMEngine | EmbeddingEngine) -> WireLimits:
    """The sizes a request entry may have on this worker, checked before it is decoded."""
    limits = engine.config.limits
    return WireLimits.of(max_prompt_chars=engine.max_model_len * limits.max_prompt_chars_per_token,
                         max_image_bytes=engine.config.model.max_image_bytes, max_stop_strings=limits.max_stop_strings,
                         max_logit_bias=limits.max_logit_bias, max_token_bans=limits.max_token_bans)


def _crash_exit(seconds: float | None) -> Callable[[str], None] | None:
    """Its claimed requests stay unacked in Redis for other workers, as after kill -9; nothing may
    keep the process from exiting for longer than `seconds` (None: in-process, never forced)."""
    if seconds is None:
        return None
    return lambda _actor: exit_after(seconds, 1)


async def _start_health(options: WorkerOptions, metrics: WorkerMetrics, redis: aioredis.Redis) -> Any:
    if options.health_port is None:
        return None
    from actors.worker.health import HealthServer

    async def ready() -> bool:
        return bool(await redis.ping())  # the model is loaded before the event loop starts

    server = HealthServer(options.health_host, options.health_port, metrics, ready)
    await server.start()
    log.info("health endpoint listening", host=options.health_host, port=server.port)
    return server


class StatsReporter:
    """Keeps the queue gauges fresh and logs one stats line per interval (never per token)."""

    name = "stats"

    def __init__(self, engine: LLMEngine, metrics: WorkerMetrics, interval_s: float) -> None:
        self.engine = engine
        self.metrics = metrics
        self.interval_s = interval_s

    async def run(self) -> None:
        scheduler = self.engine.scheduler
        pool = scheduler.kv_cache.pool
        last_log, last_tokens = time.monotonic(), scheduler.num_generated_tokens
        lora_tokens_seen: dict[str, int] = {}
        speculation_seen = (0, 0)  # (drafted, accepted) already counted
        while True:
            await asyncio.sleep(1.0)
            self.metrics.set_queue_state(len(scheduler.waiting), len(scheduler.running), pool.num_used_blocks,
                                         pool.num_blocks)
            tenants = self.metrics.tenants
            tenants.set_queues(requests_by_tenant(scheduler.waiting), requests_by_tenant(scheduler.running))
            tenants.add_tokens(scheduler.take_tenant_tokens())
            lora_token_counts = scheduler.adapters.token_counts if scheduler.adapters is not None else {}
            for adapter, count in list(lora_token_counts.items()):
                self.metrics.record_lora_tokens(adapter, count - lora_tokens_seen.get(adapter, 0))
                lora_tokens_seen[adapter] = count
            if scheduler.speculator is not None:
                speculation = (scheduler.speculator.num_draft_tokens, scheduler.speculator.num_accepted_tokens)
                self.metrics.record_speculation(speculation[0] - speculation_seen[0],
                                                speculation[1] - speculation_seen[1])
                speculation_seen = speculation
            now = time.monotonic()
            if now - last_log >= self.interval_s:
                tokens = scheduler.num_generated_tokens
                log.info("stats", running=len(scheduler.running), waiting=len(scheduler.waiting),
                         kv_used=round(pool.num_used_blocks / pool.num_blocks, 3),
                         tokens_per_s=round((tokens - last_tokens) / (now - last_log), 1),
                         **self._lora_fields())
                last_log, last_tokens = now, tokens

    def _lora_fields(self) -> dict[str, Any]:
        """The adapters resident in device slots, for the stats line (nothing when LoRA is off)."""
        slots, registry = self.engine.lora_slots, self.engine.lora_registry
        if slots is None or registry is None:
            return {}
        return {"lora_resident": [registry.name_of(adapter_id) for adapter_id in slots.resident()]}
