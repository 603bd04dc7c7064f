"""Where reply entries go: a Redis stream per request (the product), or memory (embedded/tests)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Protocol

import redis.asyncio as aioredis

from pipeline.outputs import RequestDelta, TokenLogprob
from queue_adapters.codec import WireChoice, WireError, WireReply, WireUsage, encode
from queue_adapters.redis_streams import DATA_FIELD, retry_transient


def to_wire(delta: RequestDelta) -> WireReply:
    return WireReply(
        id=delta.request_id,
        seq=delta.seq,
        choices=[WireChoice(index=c.index, token_ids=c.token_ids, text=c.text,
                            logprobs=_logprobs(c.logprobs), finish_reason=c.finish_reason,
                            stop_reason=c.stop_reason, mirostat_mu=c.mirostat_mu) for c in delta.choices],
        usage=(WireUsage(prompt_tokens=delta.usage.prompt_tokens, completion_tokens=delta.usage.completion_tokens,
                         cached_tokens=delta.usage.cached_tokens) if delta.usage is not None else None),
        error=WireError(**delta.error) if delta.error is not None else None,
        prompt_logprobs=([None if e is None else _logprobs([e])[0] for e in delta.prompt_logprobs]
                         if delta.prompt_logprobs is not None else None),
    )


def _logprobs(entries: list[TokenLogprob] | None) -> list[dict] | None:
    if entries is None:
        return None
    return [{"token_id": e.token_id, "logprob": e.logprob, "rank": e.rank, "top": [list(t) for t in e.top]}
            for e in entries]


class ReplySink(Protocol):
    async def write(self, batch: list[tuple[str, WireReply]]) -> None:
        """Append entries (reply stream key, reply) in order; final entries start the expiry clock."""
        ...


class RedisReplySink:
    def __init__(self, redis: aioredis.Redis, expire_s: int = 3600, maxlen: int = 10_000) -> None:
        self.redis = redis
        self.expire_s = expire_s
        self.maxlen = maxlen

    async def write(self, batch: list[tuple[str, WireReply]]) -> None:
        """Written once Redis has them; during an outage this waits (and the actor's inbox buffers).
        A retry after a partial write may repeat entries: readers drop repeated seqs (DESIGN §3)."""
        if not batch:
            return
        encoded = [(key, encode(reply), reply.usage is not None or reply.error is not None) for key, reply in batch]

        async def execute() -> None:
            # One round trip per step for all requests; order within a stream is preserved.
            pipe = self.redis.pipeline(transaction=False)
            for key, data, final in encoded:
                pipe.xadd(key, {DATA_FIELD: data}, maxlen=self.maxlen, approximate=True)
                if final:
                    pipe.expire(key, self.expire_s)
            await pipe.execute()

        await retry_transient(execute, "write replies")


class MemoryReplySink:
    """Keeps every reply per stream key and lets readers wait for new ones."""

    def __init__(self) -> None:
        self.streams: dict[str, list[WireReply]] = defaultdict(list)
        self._changed = asyncio.Condition()

    async def write(self, batch: list[tuple[str, WireReply]]) -> None:
        for key, reply in batch:
            self.streams[key].append(reply)
        async with self._changed:
            self._changed.notify_all()

    async def wait_first(self, key: str) -> WireReply:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self.streams.get(key)))
        return self.streams[key][0]

    async def wait_beyond(self, key: str, count: int) -> list[WireReply]:
        """The stream's entries once it holds more than `count` (a reader that has seen `count`)."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.streams.get(key, ())) > count)
        return self.streams[key]

    async def wait_final(self, key: str) -> list[WireReply]:
        async with self._changed:
            await self._changed.wait_for(lambda: any(r.usage is not None or r.error is not None
                                                     for r in self.streams.get(key, [])))
        return self.streams[key]
