"""Where reply entries go: a Redis stream per request (the product), or memory (embedded/tests)."""

from __future__ import annotations

import asyncio
import hashlib
from collections import defaultdict
from collections.abc import Callable
from typing import Protocol

import hiredis
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from pipeline.request.outputs import RequestDelta, TokenLogprob
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
        prompt_tokens=delta.num_prompt_tokens,
        error=WireError(**delta.error) if delta.error is not None else None,
        prompt_logprobs=([None if e is None else _logprobs([e])[0] for e in delta.prompt_logprobs]
                         if delta.prompt_logprobs is not None else None),
        prompt_token_ids=delta.prompt_token_ids,
        embedding=delta.embedding,
    )


def _logprobs(entries: list[TokenLogprob] | None) -> list[dict] | None:
    if entries is None:
        return None
    return [{"token_id": e.token_id, "logprob": e.logprob, "rank": e.rank, "top": [list(t) for t in e.top]}
            for e in entries]


class ReplySink(Protocol):
    async def write(self, batch: list[tuple[str, WireReply]]) -> list[str]:
        """Append entries (reply stream key, reply) in order; final entries start the expiry clock.
        Returns the request ids whose entries could not be written (their key holds no stream)."""
        ...


# One step's reply entries in one script call: XADD each (capped at ~MAXLEN), and EXPIRE the
# streams whose entry is final, with the owner keys that follow the stream keys in KEYS (those of
# each final entry, when the sink keeps owner keys). ARGV: maxlen, expire seconds, field, then
# (data, "1" if final, how many owner keys it has) per stream key. A key that holds something other
# than a stream (a client may name any key in reply_to, or SET one) is skipped, not an error that
# would fail the whole step's write and the worker with it; the script returns the positions it skipped.
_WRITE_REPLIES = """
local maxlen, expire_s, field = ARGV[1], ARGV[2], ARGV[3]
local num_streams = (#ARGV - 3) / 3
local next_owner = num_streams + 1
local skipped = {}
for i = 1, num_streams do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  local final = ARGV[3 * i + 2] == '1'
  if kind == 'stream' or kind == 'none' then
    redis.call('XADD', KEYS[i], 'MAXLEN', '~', maxlen, '*', field, ARGV[3 * i + 1])
    if final then
      redis.call('EXPIRE', KEYS[i], expire_s)
    end
  else
    skipped[#skipped + 1] = i
  end
  for _ = 1, tonumber(ARGV[3 * i + 3]) do
    redis.call('EXPIRE', KEYS[next_owner], expire_s)
    next_owner = next_owner + 1
  end
end
return skipped
"""


class RedisReplySink:
    """Writes a step's entries with one server-side script call (EVALSHA; a pipeline of one XADD
    per entry cost ~4x the CPU), on a connection of its own, packed by hiredis in one C call:
    through redis-py's generic command path (its per-argument encoding, its pool's bookkeeping)
    the same call cost the event loop about twice the CPU (186 vs ~95 us for one entry, 331 vs
    ~160 us for 32, measured here), and that time holds the GIL the forward needs. The script
    names every key it writes, so it needs one Redis node, not a cluster (as the consumer group does).

    `owner_key` (request id -> its owner key, see actors/worker/recovery/ownership.py): a final entry
    gives the request's owner key the stream's expiry, so the owner record lasts as long as the stream;
    `stream_owner_key` (reply stream -> the owner key that guards it, or None) does the same for the
    record of a stream other requests share."""

    def __init__(self, redis: aioredis.Redis, expire_s: int = 3600, maxlen: int = 10_000,
                 owner_key: Callable[[str], str] | None = None,
                 stream_owner_key: Callable[[str], str | None] | None = None) -> None:
        self.redis = redis
        self.expire_s = expire_s
        self.maxlen = maxlen
        self.owner_key = owner_key
        self.stream_owner_key = stream_owner_key
        self._sha = hashlib.sha1(_WRITE_REPLIES.encode()).hexdigest()
        pool = redis.connection_pool
        self._connection = pool.connection_class(**pool.connection_kwargs)
        self._lock = asyncio.Lock()

    async def write(self, batch: list[tuple[str, WireReply]]) -> list[str]:
        """Written once Redis has them; during an outage this waits (and the actor's inbox buffers).
        A retry after a failed call may repeat entries: readers drop repeated seqs (docs/design.md §3).
        Returns the ids of the entries skipped because their key is not a stream."""
        if not batch:
            return []
        keys = [key for key, _ in batch]
        args: list[int | bytes | str] = [self.maxlen, self.expire_s, DATA_FIELD]
        for key, reply in batch:
            final = reply.usage is not None or reply.error is not None
            owner_keys = self._owner_keys(key, reply.id) if final else []
            args += [encode(reply), "1" if final else "0", len(owner_keys)]
            keys += owner_keys
        packed = hiredis.pack_command(("EVALSHA", self._sha, len(keys), *keys, *args))
        async with self._lock:
            skipped = await retry_transient(lambda: self._call(packed), "write replies")
        return [batch[position - 1][1].id for position in skipped or ()]

    def _owner_keys(self, reply_to: str, request_id: str) -> list[str]:
        keys = [self.owner_key(request_id)] if self.owner_key is not None else []
        guard = self.stream_owner_key(reply_to) if self.stream_owner_key is not None else None
        return [*keys, guard] if guard is not None and guard not in keys else keys

    async def _call(self, packed: bytes, load_first: bool = False) -> list[int]:
        if load_first:
            await self.redis.script_load(_WRITE_REPLIES)
        try:
            await self._connection.send_packed_command(packed, check_health=False)
            return await self._connection.read_response()
        except NoScriptError:
            if load_first:
                raise
            # Not loaded yet, or Redis restarted: nothing was written; load it and run it again.
            return await self._call(packed, load_first=True)
        except BaseException:
            await self._connection.disconnect()  # a reply half read must not meet the next call
            raise

    async def close(self) -> None:
        await self._connection.disconnect()


class MemoryReplySink:
    """Keeps every reply per stream key and lets readers wait for new ones."""

    def __init__(self) -> None:
        self.streams: dict[str, list[WireReply]] = defaultdict(list)
        self.writer_gone = False  # nothing will be written any more (the actor graph died)
        self._changed = asyncio.Condition()

    async def write(self, batch: list[tuple[str, WireReply]]) -> list[str]:
        for key, reply in batch:
            self.streams[key].append(reply)
        async with self._changed:
            self._changed.notify_all()
        return []  # every key here is a stream

    async def wait_first(self, key: str) -> WireReply:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self.streams.get(key)))
        return self.streams[key][0]

    async def wait_beyond(self, key: str, count: int) -> list[WireReply]:
        """The stream's entries once it holds more than `count` (a reader that has seen `count`), or
        at once, with no more than `count`, once the writer is gone."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.streams.get(key, ())) > count or self.writer_gone)
        return self.streams.get(key, [])

    async def mark_writer_gone(self) -> None:
        async with self._changed:
            self.writer_gone = True
            self._changed.notify_all()

    async def wait_final(self, key: str) -> list[WireReply]:
        async with self._changed:
            await self._changed.wait_for(lambda: any(r.usage is not None or r.error is not None
                                                     for r in self.streams.get(key, [])))
        return self.streams[key]
