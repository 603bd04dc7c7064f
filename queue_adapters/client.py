"""What users call: submit requests, stream or collect their replies, cancel them (docs/design.md §3).

Reply order policy. Entries are handed out strictly in `seq` order, each seq once:
- a seq already handed out (or already buffered) is a duplicate and is dropped: a worker that
  resumes a crashed one may rewrite an entry, and the client must see each token once;
- a seq beyond the next expected one is held back until the gap is filled, so `text` deltas are
  always concatenated in order. Workers write seq densely, so a gap that never fills is a bug;
  it shows up as a TimeoutError when `timeout_s` is set.
Entries of other request ids (a `reply_to` stream shared by several requests) are skipped.

The stream ends after the entry that completes the request: one carrying `error`, or one after
which every choice has a finish_reason. The number of choices is `params.n` when the request was
submitted through this client (or `n` is passed); otherwise it is the choices seen so far.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import redis.asyncio as aioredis
import structlog

from queue_adapters.codec import (
    CodecError,
    WireCancel,
    WireControl,
    WireControlResult,
    WireReply,
    WireRequest,
    decode_reply,
    decode_request,
    encode,
)
from queue_adapters.placement import Placement
from queue_adapters.priority_lanes import request_key
from queue_adapters.redis_streams import DATA_FIELD, stream_entries

log = structlog.get_logger(__name__)
R = TypeVar("R")
_MAX_REMEMBERED = 4096  # submitted requests whose reply_to / n we keep for a later `stream`
_PIPELINE_CHUNK = 1024  # submit_many: XADDs per round trip
_CONTROL_ANSWERS_TTL_S = 600  # a control entry's answer stream, once read (late answers land in it too)


class ReplyOrder:
    """Puts reply entries of one request in seq order, drops duplicates, knows when it is complete."""

    def __init__(self, num_choices: int | None = None) -> None:
        self.num_choices = num_choices
        self.next_seq = 0
        self.done = False
        self._held: dict[int, WireReply] = {}
        self._seen: set[int] = set()
        self._finished: set[int] = set()

    def push(self, reply: WireReply) -> list[WireReply]:
        """The entries that became deliverable, in order; [] for a duplicate or a gap."""
        if self.done or reply.seq < self.next_seq or reply.seq in self._held:
            return []
        self._held[reply.seq] = reply
        ready: list[WireReply] = []
        while not self.done and self.next_seq in self._held:
            entry = self._held.pop(self.next_seq)
            self.next_seq += 1
            self._note(entry)
            ready.append(entry)
        return ready

    def _note(self, reply: WireReply) -> None:
        for choice in reply.choices:
            self._seen.add(choice.index)
            if choice.finish_reason is not None:
                self._finished.add(choice.index)
        # Counts, not range(n): n comes from the request and must not size a set.
        all_finished = bool(self._seen) and self._finished == self._seen
        self.done = reply.error is not None or (all_finished and len(self._finished) >= (self.num_choices or 0))


def assemble(request_id: str, replies: list[WireReply]) -> dict[str, Any]:
    """Concatenate in-order reply entries into the final result of a request."""
    choices: dict[int, dict[str, Any]] = {}
    usage = error = prompt_logprobs = prompt_token_ids = embedding = None
    for reply in replies:
        embedding = reply.embedding if reply.embedding is not None else embedding
        if reply.prompt_logprobs is not None:
            prompt_logprobs, prompt_token_ids = reply.prompt_logprobs, reply.prompt_token_ids
        for delta in reply.choices:
            choice = choices.setdefault(delta.index, {"index": delta.index, "text": "", "token_ids": [],
                                                      "logprobs": None, "finish_reason": None, "stop_reason": None})
            choice["text"] += delta.text
            choice["token_ids"].extend(delta.token_ids)
            if delta.logprobs is not None:
                choice["logprobs"] = (choice["logprobs"] or []) + list(delta.logprobs)
            if delta.finish_reason is not None:
                choice["finish_reason"], choice["stop_reason"] = delta.finish_reason, delta.stop_reason
        usage = msgspec.structs.asdict(reply.usage) if reply.usage is not None else usage
        error = msgspec.structs.asdict(reply.error) if reply.error is not None else error
    return {"id": request_id, "choices": [choices[index] for index in sorted(choices)], "usage": usage,
            "error": error, "prompt_logprobs": prompt_logprobs, "prompt_token_ids": prompt_token_ids,
            "embedding": embedding}


class AqueductClient:
    """Async client over Redis. Use `async with AqueductClient(url) as client:` or call `close`."""

    def __init__(self, redis_url: str = "redis://127.0.0.1:6379", prefix: str = "aqueduct", *,
                 redis: aioredis.Redis | None = None, block_ms: int = 1000,
                 placement: Placement | None = None) -> None:
        self.prefix = prefix
        self.block_ms = block_ms
        self._owns_redis = redis is None
        self.redis = redis if redis is not None else aioredis.Redis.from_url(redis_url)
        # Offer requests to the worker caching their prompt's prefix (queue_adapters/placement.py);
        # None: every request goes to its priority's shared lane.
        self.placement = placement
        self._submitted: dict[str, tuple[str | None, int | None]] = {}  # id -> (reply_to, n)

    async def __aenter__(self) -> AqueductClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def reply_key(self, request_id: str, reply_to: str | None = None) -> str:
        return reply_to or f"{self.prefix}:out:{request_id}"

    async def submit(self, request: dict[str, Any] | WireRequest, *, params_checked: bool = False) -> str:
        """Validate (raising CodecError naming the field), XADD to its priority's lane (`{prefix}:requests`
        at priority 0, queue_adapters/priority_lanes.py); returns the id. `params_checked`: see
        codec.decode_request."""
        raw = encode(request)
        # The worker's exact check, so a bad request fails here, not later.
        checked = decode_request(raw, params_checked=params_checked)
        await self._send(raw, checked)
        self._remember(checked)
        return checked.id

    async def _send(self, raw: bytes, request: WireRequest) -> None:
        placement = self.placement
        keys: list[bytes] = []
        if placement is not None:
            # Rendering a chat template and tokenizing take milliseconds: off the event loop.
            keys = placement.keys_of(request) if request.prompt_token_ids is not None or placement.render is None \
                else await asyncio.to_thread(placement.keys_of, request)
        if placement is not None and keys:
            await placement.submit(raw, request, keys)
        else:
            if placement is not None:
                placement.outcomes["unplaced"] += 1  # its blocks cannot be named here
            await self.redis.xadd(request_key(self.prefix, request.priority), {DATA_FIELD: raw})

    async def submit_many(self, requests: list[dict[str, Any] | WireRequest], *,
                          params_checked: bool = False) -> list[str]:
        """`submit` for a batch: every request is checked before any is sent (a CodecError names the
        first bad one), then they go in pipelined round trips of up to 1,024, so a worker finds them
        together (and a batch file of any size is not buffered whole)."""
        raws = [encode(request) for request in requests]
        checked = [decode_request(raw, params_checked=params_checked) for raw in raws]
        if self.placement is not None:  # one directory lookup each: sent one by one
            for raw, request in zip(raws, checked, strict=True):
                await self._send(raw, request)
                self._remember(request)
            return [request.id for request in checked]
        for start in range(0, len(raws), _PIPELINE_CHUNK):
            async with self.redis.pipeline(transaction=False) as pipe:
                for raw, request in zip(raws[start:start + _PIPELINE_CHUNK], checked[start:start + _PIPELINE_CHUNK],
                                        strict=True):
                    pipe.xadd(request_key(self.prefix, request.priority), {DATA_FIELD: raw})
                await pipe.execute()
        for request in checked:
            self._remember(request)
        return [request.id for request in checked]

    def _remember(self, request: WireRequest) -> None:
        if len(self._submitted) >= _MAX_REMEMBERED:
            self._submitted.pop(next(iter(self._submitted)))
        num_choices = request.params.get("n", 1)
        self._submitted[request.id] = (request.reply_to, num_choices if isinstance(num_choices, int) else None)

    async def cancel(self, request_id: str) -> None:
        await self.redis.xadd(f"{self.prefix}:control", {DATA_FIELD: encode(WireCancel(cancel=request_id))})

    async def stream(self, request_id: str, reply_to: str | None = None, *, n: int | None = None,
                     timeout_s: float | None = None) -> AsyncIterator[WireReply]:
        """Reply entries of one request as they arrive, in seq order, each once (see module docstring)."""
        remembered_reply_to, remembered_n = self._submitted.get(request_id, (None, None))
        key = self.reply_key(request_id, reply_to or remembered_reply_to)
        order = ReplyOrder(n or remembered_n)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last_id: bytes | str = "0"
        while not order.done:
            response = await self.redis.xread({key: last_id}, count=256, block=self._block_ms(deadline, request_id))
            for entry_id, fields in stream_entries(response):
                last_id = entry_id
                reply = _decode_entry(entry_id, fields)
                if reply.id != request_id:
                    continue
                for ready in order.push(reply):
                    yield ready
                if order.done:
                    break
        self._submitted.pop(request_id, None)

    async def control(self, control: WireControl, workers: set[str], alive: Callable[[], Awaitable[set[str]]],
                      timeout_s: float) -> ControlAnswers:
        """Send a load_lora / unload_lora entry (every worker applies it) with an answer stream of its
        own, and wait up to `timeout_s` for the answers of `workers`; one that `alive` stops listing
        (a dead worker never answers) is not waited for."""
        control_id = f"control-{uuid.uuid4().hex}"
        key = f"{self.prefix}:out:{control_id}"  # workers answer on a reply_to only under {prefix}:out:
        entry = msgspec.structs.replace(control, id=control_id, reply_to=key)
        await self.redis.xadd(f"{self.prefix}:control", {DATA_FIELD: encode(entry)})
        answers: dict[str, WireControlResult] = {}
        deadline, last_id = time.monotonic() + timeout_s, "0"
        while workers - answers.keys() and (remaining_s := deadline - time.monotonic()) > 0:
            block_ms = max(1, min(self.block_ms, int(remaining_s * 1000)))
            response = await self.redis.xread({key: last_id}, count=64, block=block_ms)
            for entry_id, fields in stream_entries(response):
                last_id = entry_id
                answer = _control_answer(fields)
                if answer is not None and answer.id == control_id:
                    answers[answer.worker] = answer
            if not response:
                workers = workers & await alive()
        await self.redis.expire(key, _CONTROL_ANSWERS_TTL_S)
        return ControlAnswers(tuple(answers.values()), tuple(sorted(workers - answers.keys())))

    def _block_ms(self, deadline: float | None, request_id: str) -> int:
        if deadline is None:
            return self.block_ms
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise TimeoutError(f"request {request_id} did not complete in time")
        return min(self.block_ms, remaining_ms)

    async def result(self, request_id: str, reply_to: str | None = None, *, n: int | None = None,
                     timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for completion; {id, choices: [{index, text, token_ids, logprobs, finish_reason,
        stop_reason}], usage, error}."""
        replies = [reply async for reply in self.stream(request_id, reply_to, n=n, timeout_s=timeout_s)]
        return assemble(request_id, replies)

    async def close(self) -> None:
        if self._owns_redis:
            await self.redis.aclose()


@dataclass(frozen=True, slots=True)
class ControlAnswers:
    """The workers' answers to one control entry, and the workers that gave none in time."""

    answers: tuple[WireControlResult, ...]
    missing: tuple[str, ...]


def _control_answer(fields: dict[bytes, bytes] | None) -> WireControlResult | None:
    try:
        return msgspec.msgpack.decode((fields or {}).get(DATA_FIELD, b""), type=WireControlResult)
    except msgspec.MsgspecError:  # not an answer: skipped
        return None


def _decode_entry(entry_id: bytes | str, fields: dict[bytes, bytes] | None) -> WireReply:
    raw = (fields or {}).get(DATA_FIELD)
    if raw is None:
        raise CodecError(f"reply entry {entry_id!r} has no data field")
    return decode_reply(raw)


class SyncAqueductClient:
    """Blocking wrapper: the async client runs on a private event loop in a daemon thread, so it
    also works from code that already runs an event loop (notebooks)."""

    def __init__(self, redis_url: str = "redis://127.0.0.1:6379", prefix: str = "aqueduct", **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="aqueduct-client", daemon=True)
        self._thread.start()
        self.client = AqueductClient(redis_url, prefix, **kwargs)

    def __enter__(self) -> SyncAqueductClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(self, request: dict[str, Any] | WireRequest) -> str:
        return self._run(self.client.submit(request))

    def cancel(self, request_id: str) -> None:
        self._run(self.client.cancel(request_id))

    def result(self, request_id: str, reply_to: str | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._run(self.client.result(request_id, reply_to, **kwargs))

    def stream(self, request_id: str, reply_to: str | None = None, **kwargs: Any) -> Iterator[WireReply]:
        replies = self.client.stream(request_id, reply_to, **kwargs)

        async def next_reply() -> WireReply:
            return await anext(replies)

        try:
            while True:
                try:
                    yield self._run(next_reply())
                except StopAsyncIteration:
                    return
        finally:
            self._run(replies.aclose())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self.client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
