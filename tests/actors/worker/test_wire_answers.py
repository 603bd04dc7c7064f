"""Every request entry gets an answer, and only where its id may write (docs/design.md §3): an entry
that does not decode is refused on its own stream, or dead-lettered when its id belongs to another
request; an answer whose reply key holds no stream goes to the request's own stream, or to the dead
letters; a reply_to naming another request's stream is refused; an entry over a size limit is
refused at the header that says so."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgpack
import pytest

from tests.support.worker_helpers import pending_count, push, read_replies, running_workers, tokens_of

pytestmark = pytest.mark.redis

PARAMS = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}


def _entry(request_id: str | bytes, **fields: object) -> bytes:
    return msgpack.packb({"id": request_id, "prompt": "Once upon a time", "params": PARAMS, **fields},
                         use_bin_type=True)


async def _dead_letters(redis, prefix: str, count: int, timeout_s: float = 5.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entries = await redis.xrange(f"{prefix}:dead")
        if len(entries) >= count:
            return [msgpack.unpackb(fields[b"data"]) for _, fields in entries]
        await asyncio.sleep(0.02)
    raise TimeoutError(f"fewer than {count} dead letters")


async def _stream(redis, key: str) -> list[dict]:
    return [msgpack.unpackb(fields[b"data"]) for _, fields in await redis.xrange(key)]


async def _served(redis, prefix: str, request_id: str) -> list[dict]:
    """A request run to its end, as the victim of the entries that follow."""
    await push(redis, prefix, _entry(request_id))
    replies = await read_replies(redis, f"{prefix}:out:{request_id}", timeout_s=10)
    assert len(tokens_of(replies)) == PARAMS["max_tokens"]
    return await _stream(redis, f"{prefix}:out:{request_id}")


async def test_a_bin_id_is_answered_on_its_own_stream_and_never_on_another_requests(
        default_model_path: Path, prefix: str) -> None:
    async with running_workers(default_model_path, prefix) as (redis, _):
        victim = await _served(redis, prefix, "victim")
        await push(redis, prefix, _entry(b"victim"))  # the same id, as bin: another entry
        await push(redis, prefix, _entry(b"bin-fresh"))
        (fresh,) = await read_replies(redis, f"{prefix}:out:bin-fresh", timeout_s=5)
        assert fresh["error"]["code"] == "invalid_request" and "id must be a string" in fresh["error"]["message"]
        (dead,) = await _dead_letters(redis, prefix, 1)
        assert dead["raw"] == _entry(b"victim") and "in use by a different request" in dead["reason"]
        assert await _stream(redis, f"{prefix}:out:victim") == victim  # nothing written into it
        assert await pending_count(redis, prefix) == 0


async def test_a_truncated_entry_is_refused_and_never_answered_on_another_requests_stream(
        default_model_path: Path, prefix: str) -> None:
    async with running_workers(default_model_path, prefix) as (redis, _):
        served = await _served(redis, prefix, "served")
        await push(redis, prefix, _entry("served")[:-3])
        await push(redis, prefix, _entry("cut")[:-3])
        (refused,) = await read_replies(redis, f"{prefix}:out:cut", timeout_s=5)
        assert refused["error"]["code"] == "invalid_request" and "truncated" in refused["error"]["message"]
        assert not tokens_of([refused])
        (dead,) = await _dead_letters(redis, prefix, 1)
        assert "truncated" in dead["reason"] and "in use by a different request" in dead["reason"]
        assert await _stream(redis, f"{prefix}:out:served") == served


async def test_trailing_bytes_after_the_map_are_refused(default_model_path: Path, prefix: str) -> None:
    async with running_workers(default_model_path, prefix) as (redis, _):
        served = await _served(redis, prefix, "served")
        await push(redis, prefix, _entry("served") + b"\xc0garbage")
        await push(redis, prefix, _entry("trailing") + msgpack.packb({"id": "smuggled"}))
        (refused,) = await read_replies(redis, f"{prefix}:out:trailing", timeout_s=5)
        assert refused["error"]["code"] == "invalid_request" and "trailing" in refused["error"]["message"]
        (dead,) = await _dead_letters(redis, prefix, 1)
        assert "trailing" in dead["reason"]
        assert await _stream(redis, f"{prefix}:out:served") == served
        assert not await redis.exists(f"{prefix}:out:smuggled")


async def test_an_answer_whose_reply_key_holds_a_string_goes_to_the_default_stream_or_the_dead_letters(
        default_model_path: Path, prefix: str) -> None:
    async with running_workers(default_model_path, prefix) as (redis, _):
        for key in ("out:a-string", "out:own-is-a-string"):
            await redis.set(f"{prefix}:{key}", "a string")
        await push(redis, prefix, _entry("to-a-string", reply_to=f"{prefix}:out:a-string"))
        await push(redis, prefix, _entry("bad-to-a-string", reply_to=f"{prefix}:out:a-string", params={"n": 0}))
        await push(redis, prefix, _entry("own-is-a-string"))
        (generated,) = await read_replies(redis, f"{prefix}:out:to-a-string", timeout_s=5)
        assert generated["error"]["code"] == "reply_unwritable"
        assert f"{prefix}:out:a-string" in generated["error"]["message"]
        (refused,) = await read_replies(redis, f"{prefix}:out:bad-to-a-string", timeout_s=5)
        assert refused["error"]["code"] == "invalid_request" and "params.n" in refused["error"]["message"]
        (dead,) = await _dead_letters(redis, prefix, 1)
        assert dead["reason"].startswith("reply_unwritable") and b"own-is-a-string" in dead["raw"]
        assert await redis.get(f"{prefix}:out:a-string") == b"a string"  # untouched
        assert await pending_count(redis, prefix) == 0
        assert len(tokens_of(await _served(redis, prefix, "after"))) == PARAMS["max_tokens"]  # still serving


async def test_a_reply_to_naming_another_requests_stream_is_refused_and_shared_streams_still_work(
        default_model_path: Path, prefix: str) -> None:
    async with running_workers(default_model_path, prefix) as (redis, _):
        victim = await _served(redis, prefix, "victim")
        await push(redis, prefix, _entry("intruder", reply_to=f"{prefix}:out:victim"))
        await push(redis, prefix, _entry("victim", reply_to="elsewhere:x"))  # its id, a refused reply_to
        (refused,) = await read_replies(redis, f"{prefix}:out:intruder", timeout_s=5)
        assert refused["error"]["code"] == "invalid_request"
        assert "reply stream of another request ('victim')" in refused["error"]["message"]
        (dead,) = await _dead_letters(redis, prefix, 1)
        assert "reply_to 'elsewhere:x' is not allowed" in dead["reason"]
        assert await _stream(redis, f"{prefix}:out:victim") == victim

        shared = f"{prefix}:out:group"
        for request_id in ("g1", "g2"):
            await push(redis, prefix, _entry(request_id, reply_to=shared))
        await push(redis, prefix, _entry("group"))  # would own the shared stream as its own
        (dead_too,) = (await _dead_letters(redis, prefix, 2))[1:]
        assert b"group" in dead_too["raw"] and "in use by a different request" in dead_too["reason"]
        finals = [entry["id"] for entry in await _stream(redis, shared) if entry.get("usage")]
        deadline = time.monotonic() + 5
        while len(finals) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            finals = [entry["id"] for entry in await _stream(redis, shared) if entry.get("usage")]
        assert sorted(finals) == ["g1", "g2"]


async def test_an_oversized_map_or_list_is_refused_at_its_header(default_model_path: Path, prefix: str) -> None:
    huge_bias = {str(token): 1.0 for token in range(290_000)}
    oversized = _entry("bias", params={**PARAMS, "logit_bias": huge_bias})
    async with running_workers(default_model_path, prefix) as (redis, _):
        started = time.monotonic()
        await push(redis, prefix, oversized)
        (refused,) = await read_replies(redis, f"{prefix}:out:bias", timeout_s=5)
        assert time.monotonic() - started < 0.5  # decoded whole first, it took about 0.9 s here
        assert refused["error"]["message"] == ("params.logit_bias holds 290000 entries; at most 1024 entries are "
                                               "accepted (--max-logit-bias)")
        # Cut inside the map: refused for its size all the same, as nothing after its header was read.
        await push(redis, prefix, _entry("bias-cut", params={**PARAMS, "logit_bias": huge_bias})[:200_000])
        (cut,) = await read_replies(redis, f"{prefix}:out:bias-cut", timeout_s=5)
        assert "--max-logit-bias" in cut["error"]["message"] and "truncated" not in cut["error"]["message"]
        await push(redis, prefix, _entry("stops", params={**PARAMS, "stop": [f"s{n}" for n in range(100_000)]}))
        (stops,) = await read_replies(redis, f"{prefix}:out:stops", timeout_s=5)
        assert stops["error"]["message"].startswith("params.stop holds 100000 items; at most 64")
        assert "--max-stop-strings" in stops["error"]["message"]
        parts = [{"type": "text", "text": "a"}] * 200_000
        await push(redis, prefix, msgpack.packb({"id": "parts", "messages": [{"role": "user", "content": parts}]}))
        (nested,) = await read_replies(redis, f"{prefix}:out:parts", timeout_s=5)
        assert nested["error"]["message"].startswith("messages holds a list of 200000 items; at most")


async def test_a_dead_letter_stream_that_is_not_a_stream_stops_nothing(default_model_path: Path, prefix: str) -> None:
    async with running_workers(default_model_path, prefix) as (redis, _):
        await redis.set(f"{prefix}:dead", "a string")
        await push(redis, prefix, b"\xc1 not msgpack")  # no id: only a dead letter can answer it
        assert len(tokens_of(await _served(redis, prefix, "after"))) == PARAMS["max_tokens"]
        assert await pending_count(redis, prefix) == 0
