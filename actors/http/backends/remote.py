"""The stateless gateway's backend: workers behind Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from actors.http.backends.prompt_render import prompt_renderer
from actors.http.errors import ApiError
from actors.http.request_ids import RedisRequestIds
from actors.http.tenancy.fair_gate import FairGate, RedisShares
from actors.worker.control import lora_path_refusal
from actors.worker.recovery.liveness import heartbeat_key
from queue_adapters.client import AqueductClient, ControlAnswers
from queue_adapters.codec import WireControl, WireControlResult, WireReply, WireRequest, encode
from queue_adapters.placement import Placement, PrefixDirectory
from queue_adapters.redis_streams import DATA_FIELD

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


def _int_or_one(value: bytes | str) -> int:
    """A heartbeat's value: the worker's --max-in-flight (1 from a worker that does not say)."""
    try:
        return max(1, int(value))
    except ValueError:
        return 1
