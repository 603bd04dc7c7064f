"""A reply key that holds no stream (a client SET it, or named a key of another type in reply_to)
can stop neither the worker nor the other requests' replies: the request is abandoned and its entry
acked, so it is never redelivered to crash the next worker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgpack
import pytest

from actors.worker.control import RESULTS_MAXLEN
from tests.support.worker_helpers import push, read_replies, running_workers, tokens_of

pytestmark = pytest.mark.redis

PARAMS = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}


async def _pending(redis, prefix: str) -> int:
    return (await redis.xpending(f"{prefix}:requests", "workers"))["pending"]


async def test_reply_keys_of_another_type_abandon_only_their_request(default_model_path: Path, prefix: str) -> None:
    async with running_workers(default_model_path, prefix) as (redis, _):
        await redis.set(f"{prefix}:out:taken", "a string")  # the default reply key of request 'taken'
        await redis.hset(f"{prefix}:out:hash", mapping={"a": "b"})
        await push(redis, prefix, {"id": "good-1", "prompt": "Once upon a time", "params": PARAMS})
        await push(redis, prefix, {"id": "taken", "prompt": "Once upon a time", "params": PARAMS})
        await push(redis, prefix, {"id": "custom", "prompt": "Once upon a time", "params": PARAMS,
                                   "reply_to": f"{prefix}:out:hash"})
        await push(redis, prefix, {"id": "good-2", "prompt": "Once upon a time", "params": PARAMS})
        first = await read_replies(redis, f"{prefix}:out:good-1")
        second = await read_replies(redis, f"{prefix}:out:good-2")
        assert len(tokens_of(first)) == 6 and tokens_of(first) == tokens_of(second)
        deadline = time.monotonic() + 10
        while await _pending(redis, prefix) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert await _pending(redis, prefix) == 0  # the abandoned ones are acked: no redelivery
        assert await redis.get(f"{prefix}:out:taken") == b"a string"  # untouched
        await push(redis, prefix, {"id": "good-3", "prompt": "Once upon a time", "params": PARAMS})
        assert tokens_of(await read_replies(redis, f"{prefix}:out:good-3")) == tokens_of(first)  # still serving


async def _results(redis, key: str, count: int, timeout_s: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entries = await redis.xrange(key)
        if len(entries) >= count:
            return [msgpack.unpackb(fields[b"data"]) for _, fields in entries]
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{key}: fewer than {count} control answers")


async def test_every_control_entry_is_answered(default_model_path: Path, prefix: str) -> None:
    """Without --enable-lora a load is still answered (with why not), as is an entry that does not
    decode; a reply_to outside {prefix}:out: falls back to the results stream."""
    assert RESULTS_MAXLEN > 0
    async with running_workers(default_model_path, prefix) as (redis, _):
        await asyncio.sleep(0.3)  # the control reader starts at "$"
        control = f"{prefix}:control"
        await redis.xadd(control, {"data": msgpack.packb({"load_lora": {"name": "a", "path": "/x"}, "id": "op-1"})})
        await redis.xadd(control, {"data": msgpack.packb({"unload_lora": "a", "id": "op-2",
                                                          "reply_to": f"{prefix}:out:mine"})})
        await redis.xadd(control, {"data": msgpack.packb({"load_lora": {"name": "a"}, "id": "op-3"})})
        await redis.xadd(control, {"data": b"\xc1 not msgpack"})
        await redis.xadd(control, {"data": msgpack.packb({"unload_lora": "a", "reply_to": f"{prefix}:requests"})})
        results = await _results(redis, f"{prefix}:control:results", 4)
        mine = await _results(redis, f"{prefix}:out:mine", 1)
    assert [(r.get("id"), r["op"], r["ok"]) for r in results] == [("op-1", "load_lora", False),
                                                                   ("op-3", "invalid", False),
                                                                   (None, "invalid", False),
                                                                   (None, "unload_lora", False)]
    assert "--enable-lora" in results[0]["error"] and "path" in results[1]["error"]
    assert mine[0]["id"] == "op-2" and mine[0]["worker"] == "w0"


async def test_a_wire_request_reusing_a_live_id_never_touches_its_stream(default_model_path: Path,
                                                                          prefix: str) -> None:
    """Same id, another body: dead-lettered, not attached (it would read the first request's output)
    and not written into the first one's reply stream. The same body again attaches, as always."""
    async with running_workers(default_model_path, prefix) as (redis, _):
        victim = {"id": "shared-id", "prompt": "Once upon a time", "params": {**PARAMS, "max_tokens": 24}}
        await push(redis, prefix, victim)
        await push(redis, prefix, {**victim, "prompt": "Something else entirely"})
        await push(redis, prefix, {"id": "alone", "prompt": "Once upon a time", "params": {**PARAMS, "max_tokens": 24}})
        replies = await read_replies(redis, f"{prefix}:out:shared-id")
        alone = await read_replies(redis, f"{prefix}:out:alone")
        assert tokens_of(replies) == tokens_of(alone) and len(tokens_of(replies)) == 24
        assert sorted(reply["seq"] for reply in replies) == list(range(len(replies)))  # nothing foreign
        deadline = time.monotonic() + 10
        while not await redis.xlen(f"{prefix}:dead") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        dead = [msgpack.unpackb(fields[b"data"]) for _, fields in await redis.xrange(f"{prefix}:dead")]
        assert len(dead) == 1 and "in use by a different request" in str(dead[0])
