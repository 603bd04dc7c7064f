"""AqueductClient against a real Redis; no worker exists, so the tests write the reply entries themselves."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import redis
import redis.asyncio as aioredis

from queue_adapters.client import AqueductClient, ReplyOrder, SyncAqueductClient, assemble
from queue_adapters.codec import (
    CodecError,
    WireChoice,
    WireError,
    WireReply,
    WireUsage,
    decode_cancel,
    decode_request,
    encode,
)
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


def step(seq: int, *choices: tuple[int, list[int], str, str | None], usage: bool = False,
         request_id: str = "r1") -> WireReply:
    return WireReply(id=request_id, seq=seq, choices=[
        WireChoice(index=index, token_ids=tokens, text=text, finish_reason=finish)
        for index, tokens, text, finish in choices],
        usage=WireUsage(prompt_tokens=3, completion_tokens=4, cached_tokens=1) if usage else None)


async def write_replies(client: aioredis.Redis, key: str, replies: list[WireReply]) -> None:
    for reply in replies:
        await client.xadd(key, {"data": encode(reply)})


def test_submit_validates_and_writes_the_request(prefix: str) -> None:
    async def scenario() -> None:
        async with AqueductClient(REDIS_URL, prefix) as client:
            assert await client.submit({"id": "r1", "prompt": "hi", "params": {"max_tokens": 4}}) == "r1"
            with pytest.raises(CodecError, match=r"params\.max_tokens must be >= 0"):
                await client.submit({"id": "r2", "prompt": "hi", "params": {"max_tokens": -1}})
            [(_, fields)] = await client.redis.xrange(f"{prefix}:requests")
            assert decode_request(fields[b"data"]).params == {"max_tokens": 4}

    asyncio.run(scenario())


def test_submit_many_checks_every_request_before_sending_any(prefix: str) -> None:
    async def scenario() -> None:
        async with AqueductClient(REDIS_URL, prefix) as client:
            with pytest.raises(CodecError, match=r"params\.temperature"):
                await client.submit_many([{"id": "ok", "prompt": "hi"},
                                          {"id": "bad", "prompt": "hi", "params": {"temperature": -1}}])
            assert await client.redis.xlen(f"{prefix}:requests") == 0
            ids = await client.submit_many([{"id": f"r{i}", "prompt_token_ids": [1, i + 2], "params": {"n": 2}}
                                            for i in range(3)])
            assert ids == ["r0", "r1", "r2"]
            written = [decode_request(fields[b"data"]) for _, fields in await client.redis.xrange(f"{prefix}:requests")]
            assert [(r.id, r.prompt_token_ids) for r in written] == [("r0", [1, 2]), ("r1", [1, 3]), ("r2", [1, 4])]
            assert client._submitted["r2"] == (None, 2)  # remembered like submit's: n for a later stream
            many = await client.submit_many([{"id": f"m{i}", "prompt_token_ids": [1]} for i in range(2500)])
            assert len(many) == 2500 and await client.redis.xlen(f"{prefix}:requests") == 2503  # three round trips

    asyncio.run(scenario())


def test_stream_yields_entries_as_they_arrive_dropping_duplicates(prefix: str) -> None:
    async def scenario() -> None:
        async with AqueductClient(REDIS_URL, prefix, block_ms=100) as client:
            await client.submit({"id": "r1", "prompt": "hi"})
            key = client.reply_key("r1")
            received: list[int] = []

            async def read() -> None:
                async for reply in client.stream("r1", timeout_s=5):
                    received.append(reply.seq)

            reader = asyncio.create_task(read())
            await write_replies(client.redis, key, [step(0, (0, [1], "a", None))])
            await asyncio.sleep(0.05)
            assert received == [0]  # streamed before the request completed
            await write_replies(client.redis, key, [
                step(0, (0, [1], "a", None)),  # a resumed worker rewrote seq 0
                step(1, (0, [2], "b", None)),
                step(1, (0, [2], "b", None)),
                step(0, (0, [7], "x", None), request_id="other"),  # shared reply stream
                step(2, (0, [3], "c", "stop"), usage=True),
            ])
            await asyncio.wait_for(reader, timeout=5)
            assert received == [0, 1, 2]

    asyncio.run(scenario())


def test_out_of_order_entries_are_held_until_the_gap_fills() -> None:
    order = ReplyOrder(num_choices=1)
    assert order.push(step(1, (0, [2], "b", None))) == []
    assert order.push(step(2, (0, [3], "c", "stop"))) == []
    assert [r.seq for r in order.push(step(0, (0, [1], "a", None)))] == [0, 1, 2]
    assert order.done
    assert order.push(step(3, (0, [4], "d", None))) == []


def test_completion_waits_for_every_choice() -> None:
    order = ReplyOrder(num_choices=2)
    order.push(step(0, (0, [1], "a", "length"), (1, [5], "x", None)))
    assert not order.done
    order.push(step(1, (1, [6], "y", "stop")))
    assert order.done
    failed = ReplyOrder(num_choices=2)
    failed.push(WireReply(id="r1", seq=0, error=WireError(code="oom", message="out of blocks")))
    assert failed.done


def test_result_assembles_text_tokens_finish_reasons_and_usage(prefix: str) -> None:
    async def scenario() -> None:
        async with AqueductClient(REDIS_URL, prefix) as client:
            await client.submit({"id": "r1", "prompt": "hi", "params": {"n": 2}, "reply_to": f"{prefix}:mine"})
            await write_replies(client.redis, f"{prefix}:mine", [
                step(1, (0, [2], " world", "stop"), (1, [6], "y", None)),
                step(0, (0, [1], "hello", None), (1, [5], "x", None)),
                step(2, (1, [7], "z", "length"), usage=True),
            ])
            result = await client.result("r1", timeout_s=5)
        assert [(c["text"], c["token_ids"], c["finish_reason"]) for c in result["choices"]] == [
            ("hello world", [1, 2], "stop"), ("xyz", [5, 6, 7], "length")]
        assert result["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "cached_tokens": 1}
        assert result["error"] is None

    asyncio.run(scenario())


def test_error_entry_ends_the_stream(prefix: str) -> None:
    async def scenario() -> None:
        async with AqueductClient(REDIS_URL, prefix) as client:
            await write_replies(client.redis, client.reply_key("r1"), [
                step(0, (0, [1], "a", None)),
                WireReply(id="r1", seq=1, error=WireError(code="timeout", message="deadline passed"))])
            result = await client.result("r1", timeout_s=5)
        assert result["error"] == {"code": "timeout", "message": "deadline passed"}

    asyncio.run(scenario())


def test_stream_times_out_when_the_request_never_completes(prefix: str) -> None:
    async def scenario() -> None:
        async with AqueductClient(REDIS_URL, prefix, block_ms=50) as client:
            with pytest.raises(TimeoutError):
                await client.result("never", timeout_s=0.2)

    asyncio.run(scenario())


def test_cancel_writes_a_control_entry(prefix: str) -> None:
    async def scenario() -> None:
        async with AqueductClient(REDIS_URL, prefix) as client:
            await client.cancel("r1")
            [(_, fields)] = await client.redis.xrange(f"{prefix}:control")
        assert decode_cancel(fields[b"data"]).cancel == "r1"
        assert msgspec.msgpack.decode(fields[b"data"]) == {"cancel": "r1"}

    asyncio.run(scenario())


def test_sync_client_submits_streams_and_cancels(prefix: str) -> None:
    with SyncAqueductClient(REDIS_URL, prefix) as client:
        request_id = client.submit({"id": "r1", "prompt_token_ids": [1, 2]})
        sync = redis.Redis.from_url(REDIS_URL)
        for reply in (step(0, (0, [1], "a", None)), step(1, (0, [2], "b", "stop"), usage=True)):
            sync.xadd(f"{prefix}:out:{request_id}", {"data": encode(reply)})
        assert [reply.seq for reply in client.stream(request_id, timeout_s=5)] == [0, 1]
        assert client.result(request_id, timeout_s=5)["choices"][0]["text"] == "ab"
        client.cancel(request_id)
        assert sync.xlen(f"{prefix}:control") == 1
        sync.close()


def test_assemble_concatenates_logprobs() -> None:
    replies = [WireReply(id="r", seq=0, choices=[WireChoice(token_ids=[1], text="a", logprobs=[{"1": -0.5}])]),
               WireReply(id="r", seq=1, choices=[WireChoice(token_ids=[2], text="b", logprobs=[{"2": -0.1}],
                                                            finish_reason="stop")])]
    assert assemble("r", replies)["choices"][0]["logprobs"] == [{"1": -0.5}, {"2": -0.1}]
