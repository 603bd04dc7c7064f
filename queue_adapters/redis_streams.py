"""Redis Streams transport: XADD producer, consumer-group consumer, stale-entry claiming, dead letters.

Every entry has one field, `data` (docs/design.md §3). Settling follows Redis' model:
- ack = XACK. Call it only once the work is durable (for a request: after its final reply entry).
- nack = nothing: Redis has no "give back". The entry stays in this consumer's pending list, and
  any consumer (this one included) gets it again from `claim_stale` once it has been idle for
  `min_idle_ms`, with the attempt (= Redis' delivery counter) raised by one.
An entry read but never handed out (the read was cancelled, the process died) is pending in the
same way, so nothing is lost: it comes back through `claim_stale`.

Clients must be created with `decode_responses=False`: `data` is binary msgpack.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Generic, TypeVar

import msgspec
import redis.asyncio as aioredis
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from queue_adapters.base import Delivery
from queue_adapters.codec import Malformed

T = TypeVar("T")
R = TypeVar("R")
log = structlog.get_logger(__name__)

DATA_FIELD = b"data"
_TRANSIENT_ERRORS = (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError)
TRANSIENT_ERRORS = _TRANSIENT_ERRORS


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStreamProducer(Generic[T]):
    """XADD `data=encode(message)` to one stream, trimmed to about `maxlen` entries (None = never).

    The Redis client is shared and owned by the caller, so `close` does not close it."""

    def __init__(self, redis: aioredis.Redis, stream_key: str, encode: Callable[[T], bytes],
                 maxlen: int | None = 100_000) -> None:
        self.redis = redis
        self.stream_key = stream_key
        self.encode = encode
        self.maxlen = maxlen

    async def send(self, message: T) -> None:
        await self.publish(message)

    async def publish(self, message: T) -> str:
        """Like `send`, returning the new entry id."""
        data = self.encode(message)
        entry_id = await retry_transient(
            lambda: self.redis.xadd(self.stream_key, {DATA_FIELD: data}, maxlen=self.maxlen, approximate=True),
            f"xadd {self.stream_key}")
        return _text(entry_id)

    async def close(self) -> None:
        return None


class Backoff:
    """Capped exponential delays with full jitter; `reset` after a success."""

    def __init__(self, base_s: float = 0.05, cap_s: float = 5.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0

    def next_delay_s(self) -> float:
        self.failures += 1
        ceiling = min(self.cap_s, self.base_s * 2 ** min(self.failures - 1, 30))
        # Full jitter spreads reconnects of many consumers after a Redis restart.
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


ClientSource = str | Callable[[], aioredis.Redis]


def _reraise_if_cancelled() -> None:
    """A cancelled read can surface from the client as a connection error; retrying it would keep
    a task alive that its owner is shutting down."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def retry_transient(operation: Callable[[], Awaitable[R]], what: str, backoff: Backoff | None = None) -> R:
    """Run a Redis operation until it succeeds, waiting out outages (capped, jittered backoff).

    For writes that must not be lost (replies, acks): the caller simply waits while Redis is down;
    its own input queues are what buffers in the meantime, and they are bounded."""
    backoff = backoff or Backoff()
    while True:
        try:
            result = await operation()
            # Python 3.11's asyncio.wait_for (redis-py awaits one per command sent) drops a cancellation
            # that lands as the send finishes: the task would run on, and its owner wait for it in vain.
            _reraise_if_cancelled()
            return result
        except _TRANSIENT_ERRORS as error:
            _reraise_if_cancelled()
            delay_s = backoff.next_delay_s()
            log.warning("redis unavailable, retrying", operation=what, error=repr(error), retry_in_s=round(delay_s, 3))
            await asyncio.sleep(delay_s)


def _make_client(source: ClientSource, block_ms: int, name: str) -> aioredis.Redis:
    if not isinstance(source, str):
        return source()
    # No built-in retries: `_read` owns reconnecting, with backoff and a log line per retry.
    # The socket timeout must outlast BLOCK, or every idle read would look like a failure.
    return aioredis.Redis.from_url(source, retry=Retry(NoBackoff(), 0), socket_timeout=block_ms / 1000 + 10,
                                   socket_keepalive=True, client_name=name)


class RedisStreamConsumer(Generic[T]):
    """One member of a consumer group; `receive` returns Delivery[T | Malformed].

    `source` is a redis URL or a factory of clients; it gives the dedicated connection that
    blocks in XREADGROUP, so acks/claims (on `client`, or a second client from `source`) never
    wait behind a blocking read."""

    def __init__(self, source: ClientSource, stream_key: str, group: str, consumer_name: str,
                 decode: Callable[[bytes], T], *, block_ms: int = 2000, client: aioredis.Redis | None = None,
                 group_start_id: str = "0", backoff: Backoff | None = None) -> None:
        if block_ms < 1:
            raise ValueError(f"block_ms must be >= 1, got {block_ms}")
        self.stream_key = stream_key
        self.group = group
        self.consumer_name = consumer_name
        self.decode = decode
        self.block_ms = block_ms
        self.group_start_id = group_start_id
        self.backoff = backoff or Backoff()
        self._reader = _make_client(source, block_ms, f"aqueduct-reader-{consumer_name}")
        self._owns_client = client is None
        self.client = client if client is not None else _make_client(source, block_ms, f"aqueduct-{consumer_name}")
        self._group_ready = False
        self._claim_cursor = "0-0"
        self._log = log.bind(stream=stream_key, group=group, consumer=consumer_name)

    async def ensure_group(self) -> None:
        """Create the group (and the stream) unless it exists; any error but BUSYGROUP propagates."""
        try:
            await self.client.xgroup_create(self.stream_key, self.group, id=self.group_start_id, mkstream=True)
        except ResponseError as error:
            if not str(error).startswith("BUSYGROUP"):
                raise
        self._group_ready = True

    async def receive(self, max_count: int = 1, timeout_s: float | None = None) -> list[Delivery[T | Malformed]]:
        if max_count < 1:
            raise ValueError(f"max_count must be >= 1, got {max_count}")
        if not self._group_ready:
            await self.ensure_group()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            block_ms = self._block_ms_until(deadline)
            entries = await self._read(max_count, block_ms)
            if entries:
                return [self._delivery(entry_id, fields, attempt=1) for entry_id, fields in entries]
            if deadline is not None and time.monotonic() >= deadline:
                return []

    async def read_now(self, max_count: int) -> list[Delivery[T | Malformed]]:
        """Up to `max_count` new entries, without blocking ([] after a transient failure)."""
        if not self._group_ready:
            await self.ensure_group()
        return [self.new_delivery(entry_id, fields) for entry_id, fields in await self._read(max_count, None)]

    def new_delivery(self, entry_id: bytes | str, fields: dict[bytes, bytes] | None) -> Delivery[T | Malformed]:
        """The delivery of an entry read from this stream for the first time (by a read over several)."""
        return self._delivery(entry_id, fields, attempt=1)

    def _block_ms_until(self, deadline: float | None) -> int | None:
        if deadline is None:
            return self.block_ms
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        return None if remaining_ms <= 0 else min(self.block_ms, remaining_ms)  # None = don't block

    async def _read(self, max_count: int, block_ms: int | None) -> list[tuple[Any, dict[bytes, bytes] | None]]:
        """One XREADGROUP; [] after a transient failure (having slept the backoff delay)."""
        response = await self.read_group({self.stream_key: self}, max_count, block_ms)
        return stream_entries(response)

    async def read_group(self, streams: dict[str, RedisStreamConsumer[Any]], count: int, block_ms: int | None) -> Any:
        """One XREADGROUP over `streams` (key -> that stream's consumer, of this group and name), on this
        reader: the raw response, or None after a transient failure (having slept the backoff delay)
        or after recreating a missing group."""
        try:
            response = await self._reader.xreadgroup(self.group, self.consumer_name, dict.fromkeys(streams, ">"),
                                                     count=count, block=block_ms)
        except _TRANSIENT_ERRORS as error:
            _reraise_if_cancelled()
            await self._sleep_before_retry(error)
            return None
        except ResponseError as error:
            if not str(error).startswith("NOGROUP"):
                raise
            # A stream or group was deleted under us (a trim or a cleanup): recreate and go on.
            self._log.warning("consumer group missing, recreating", error=str(error))
            for consumer in streams.values():
                await consumer.ensure_group()
            return None
        self.backoff.reset()
        return response

    async def _sleep_before_retry(self, error: Exception) -> None:
        delay_s = self.backoff.next_delay_s()
        self._log.warning("stream read failed, reconnecting", error=repr(error),
                          retry=self.backoff.failures, delay_s=round(delay_s, 3))
        await asyncio.sleep(delay_s)

    async def claim_stale(self, min_idle_ms: int, count: int = 10) -> list[Delivery[T | Malformed]]:
        """Take over up to `count` entries pending (unacked) for at least `min_idle_ms` in any consumer.

        Each delivery's attempt is Redis' delivery counter after the claim (2 for an entry whose
        first reader died). Entries deleted from the stream while pending are dropped from the
        pending list by Redis and are not returned."""
        if not self._group_ready:
            await self.ensure_group()
        response = await self.client.xautoclaim(self.stream_key, self.group, self.consumer_name,
                                                min_idle_time=min_idle_ms, start_id=self._claim_cursor, count=count)
        # XAUTOCLAIM scans a bounded slice of the pending list per call; the cursor walks the rest
        # on later calls and comes back to 0-0 at the end.
        self._claim_cursor = _text(response[0])
        claimed = [(entry_id, fields) for entry_id, fields in response[1] if entry_id is not None]
        if not claimed:
            return []
        attempts = await self._delivery_counts(entry_id for entry_id, _ in claimed)
        return [self._delivery(entry_id, fields, attempts.get(_text(entry_id), 2)) for entry_id, fields in claimed]

    async def pending(self, min_idle_ms: int, count: int = 100) -> list[tuple[str, str]]:
        """(entry id, consumer) of entries unacked for at least min_idle_ms, oldest first."""
        rows = await self.client.xpending_range(self.stream_key, self.group, min="-", max="+", count=count,
                                                idle=min_idle_ms)
        return [(_text(row["message_id"]), _text(row["consumer"])) for row in rows]

    async def claim(self, entry_ids: list[str], min_idle_ms: int) -> list[Delivery[T | Malformed]]:
        """Take over these pending entries (XCLAIM; ones another consumer touched since are skipped)."""
        if not entry_ids:
            return []
        response = await self.client.xclaim(self.stream_key, self.group, self.consumer_name,
                                            min_idle_time=min_idle_ms, message_ids=entry_ids)
        claimed = [(entry_id, fields) for entry_id, fields in response if entry_id is not None]
        if not claimed:
            return []
        attempts = await self._delivery_counts(entry_id for entry_id, _ in claimed)
        return [self._delivery(entry_id, fields, attempts.get(_text(entry_id), 2)) for entry_id, fields in claimed]

    async def _delivery_counts(self, entry_ids: Iterable[bytes | str]) -> dict[str, int]:
        async with self.client.pipeline(transaction=False) as pipe:
            for entry_id in entry_ids:
                pipe.xpending_range(self.stream_key, self.group, min=entry_id, max=entry_id, count=1)
            rows = await pipe.execute()
        return {_text(row[0]["message_id"]): int(row[0]["times_delivered"]) for row in rows if row}

    def _delivery(self, entry_id: bytes | str, fields: dict[bytes, bytes] | None,
                  attempt: int) -> Delivery[T | Malformed]:
        entry_id = _text(entry_id)
        message = self._decode_entry(entry_id, fields)

        async def ack() -> None:
            await retry_transient(lambda: self.client.xack(self.stream_key, self.group, entry_id), "xack")

        async def nack() -> None:
            # Left pending on purpose: claim_stale hands it out again (see the module docstring).
            self._log.debug("entry nacked, left pending", entry_id=entry_id, attempt=attempt)

        return Delivery(message, attempt, entry_id, ack, nack)

    def _decode_entry(self, entry_id: str, fields: dict[bytes, bytes] | None) -> T | Malformed:
        fields = fields or {}
        raw = fields.get(DATA_FIELD)
        if raw is None:
            names = ", ".join(sorted(_text(name) for name in fields)) or "none"
            return Malformed(None, f"entry has no data field (fields: {names})", entry_id)
        try:
            return self.decode(raw)
        except Exception as error:  # any decode failure: a poison entry must never stop the consumer
            self._log.warning("undecodable entry", entry_id=entry_id, error=str(error))
            return Malformed.from_error(raw, error, entry_id)

    async def close(self) -> None:
        await self._reader.aclose()
        if self._owns_client:
            await self.client.aclose()


def stream_entries(response: Any) -> list[tuple[Any, dict[bytes, bytes] | None]]:
    """The (entry id, fields) pairs of an XREAD/XREADGROUP response, from a RESP2 list or a RESP3 map."""
    return [entry for entries in entries_per_stream(response).values() for entry in entries]


def entries_per_stream(response: Any) -> dict[str, list[tuple[Any, dict[bytes, bytes] | None]]]:
    """Stream key -> its (entry id, fields) pairs, of an XREAD/XREADGROUP response over several streams."""
    if not response:
        return {}
    pairs = response.items() if isinstance(response, dict) else response
    found = {}
    for key, entries in pairs:
        # Some redis-py versions wrap a RESP3 stream's entry list in a one-item list.
        wrapped = len(entries) == 1 and isinstance(entries[0], list)
        found[_text(key)] = entries[0] if wrapped else entries
    return found


async def dead_letter(redis: aioredis.Redis, prefix: str, entry_id: str | None, raw: bytes | None, reason: str,
                      *, source: str | None = None, maxlen: int | None = 100_000) -> str:
    """Record an entry that cannot be processed in `{prefix}:dead`; returns the dead entry's id.

    Like every stream entry it has one field `data`, a msgpack map: the original bytes (which may
    not be msgpack at all) travel as a binary value next to where they came from and why."""
    record = {"entry_id": entry_id, "source": source, "reason": reason, "raw": raw}
    dead_id = await redis.xadd(f"{prefix}:dead", {DATA_FIELD: msgspec.msgpack.encode(record)},
                               maxlen=maxlen, approximate=True)
    log.warning("entry dead-lettered", prefix=prefix, entry_id=entry_id, source=source, reason=reason)
    return _text(dead_id)
