"""Workers on a real Redis, driven by a plain msgpack client written from docs/design.md §3 alone."""

from __future__ import annotations

import asyncio
import json
import random
import time

import msgpack
import pytest
import redis.asyncio as aioredis
import torch
from transformers import AutoModelForCausalLM

import actors.worker.run as worker_module
from actors.worker.recovery.resume import read_reply_stream
from queue_adapters.client import AqueductClient
from tests.conftest import REDIS_URL
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, make_engine
from tests.support.hf_models import make_tiny_hf_model
from tests.support.worker_helpers import pending_count, push, read_replies, running_workers, tokens_of

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model("qwen2", tmp_path_factory.mktemp("qwen2"), seed=31, num_hidden_layers=3)


async def test_plain_msgpack_requests_get_hf_exact_greedy_tokens(model_dir, prefix):
    rng = random.Random(5)
    requests = {f"req-{i}": ([rng.randrange(3, 512) for _ in range(rng.randint(2, 70))], rng.randint(3, 20))
                for i in range(10)}
    async with running_workers(model_dir, prefix, block_size=4, max_num_batched_tokens=32) as (redis, _):
        for request_id, (prompt, max_tokens) in requests.items():
            await push(redis, prefix, {"id": request_id, "prompt_token_ids": prompt,
                                       "params": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}})
        replies = {r: await read_replies(redis, f"{prefix}:out:{r}") for r in requests}
        pending = await pending_count(redis, prefix)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for request_id, (prompt, max_tokens) in requests.items():
        entries = replies[request_id]
        assert [e["seq"] for e in entries] == list(range(len(entries)))
        theirs, logits = hf_greedy(hf, prompt, max_tokens)
        assert_greedy_equal(tokens_of(entries), theirs, logits, request_id)
        assert entries[-1]["usage"]["completion_tokens"] == max_tokens
        assert entries[-1]["choices"][-1]["finish_reason"] == "length"
    assert pending == 0  # every entry acked after its final reply


async def test_two_workers_share_requests_each_answered_exactly_once(model_dir, prefix):
    async with running_workers(model_dir, prefix, count=2, max_num_seqs=4) as (redis, engines):
        for i in range(40):
            await push(redis, prefix, {"id": f"r{i}", "prompt_token_ids": [5 + i, 6, 7, 8 + i],
                                       "params": {"max_tokens": 6, "temperature": 0.7, "seed": i,
                                                  "ignore_eos": True}})
        for i in range(40):
            entries = await read_replies(redis, f"{prefix}:out:r{i}")
            assert [e["seq"] for e in entries] == list(range(len(entries)))
            assert len(tokens_of(entries)) == 6
        await asyncio.sleep(0.3)
        for i in range(40):
            assert await redis.xlen(f"{prefix}:out:r{i}") == len(await read_replies(redis, f"{prefix}:out:r{i}"))
    served = [engine.scheduler.num_generated_tokens for engine in engines]
    assert sum(served) == 40 * 6 and all(count > 0 for count in served), served


async def test_malformed_entries_are_answered_or_dead_lettered_and_the_worker_keeps_serving(model_dir, prefix):
    bad_with_id = {
        "wrong-type": {"id": "wrong-type", "prompt_token_ids": "abc"},
        "unknown-key": {"id": "unknown-key", "prompt": [1, 2], "colour": "red"},
        "bad-param": {"id": "bad-param", "prompt_token_ids": [1, 2], "params": {"temperature": -1}},
        "unknown-param": {"id": "unknown-param", "prompt_token_ids": [1, 2], "params": {"temprature": 1}},
        "unknown-lora": {"id": "unknown-lora", "prompt_token_ids": [1, 2], "lora": "nope"},
        "empty-prompt": {"id": "empty-prompt", "prompt_token_ids": []},
        "too-long": {"id": "too-long", "prompt_token_ids": [1] * 5000},
        "out-of-vocab": {"id": "out-of-vocab", "prompt_token_ids": [1, 100000]},
        "no-tokenizer": {"id": "no-tokenizer", "prompt": "text needs a tokenizer"},
        "two-prompts": {"id": "two-prompts", "prompt": "a", "prompt_token_ids": [1]},
    }
    unreadable = [b"\xc1 not msgpack", msgpack.packb([1, 2, 3]), msgpack.packb({"id": "bad id!", "prompt": "x"})]
    async with running_workers(model_dir, prefix) as (redis, _):
        for entry in bad_with_id.values():
            await push(redis, prefix, entry)
        for raw in unreadable:
            await push(redis, prefix, raw)
        await redis.xadd(f"{prefix}:requests", {"other": b"no data field"})
        await push(redis, prefix, {"id": "good", "prompt_token_ids": [3, 4, 5],
                                   "params": {"max_tokens": 4, "ignore_eos": True}})
        for request_id in bad_with_id:
            [entry] = await read_replies(redis, f"{prefix}:out:{request_id}")
            assert entry["error"]["code"] == "invalid_request" and entry["error"]["message"], request_id
        good = await read_replies(redis, f"{prefix}:out:good")
        assert len(tokens_of(good)) == 4
        assert await pending_count(redis, prefix) == 0
        dead = await redis.xrange(f"{prefix}:dead")
        assert len(dead) == len(unreadable) + 1


async def test_cancel_and_deadline_end_requests_early(model_dir, prefix):
    async with running_workers(model_dir, prefix) as (redis, engines):
        await push(redis, prefix, {"id": "cancel-me", "prompt_token_ids": [3, 4],
                                   "params": {"max_tokens": 1000, "ignore_eos": True}})
        await push(redis, prefix, {"id": "late", "prompt_token_ids": [3, 4], "deadline_ms": int(time.time() * 1000),
                                   "params": {"max_tokens": 1000, "ignore_eos": True}})
        first = await redis.xread({f"{prefix}:out:cancel-me": "0"}, block=10_000, count=1)
        assert first, "no token before cancel"
        await redis.xadd(f"{prefix}:control", {"data": msgpack.packb({"cancel": "cancel-me"})})
        cancelled = await read_replies(redis, f"{prefix}:out:cancel-me")
        late = await read_replies(redis, f"{prefix}:out:late")
        assert cancelled[-1]["choices"][-1]["finish_reason"] == "abort"
        assert late[-1]["choices"][-1]["finish_reason"] == "timeout"
        assert len(tokens_of(cancelled)) < 1000
        await asyncio.sleep(0.2)
        kv = engines[0].scheduler.kv_cache
        assert kv.num_free_blocks == kv.pool.num_blocks


async def test_every_plain_data_edge_over_redis_gives_the_same_tokens(model_dir, prefix):
    rng = random.Random(9)
    entries = [{"id": f"e{i}", "prompt_token_ids": [rng.randrange(3, 512) for _ in range(rng.randint(2, 40))],
                "params": {"max_tokens": rng.randint(3, 12), "ignore_eos": True, "n": rng.choice([1, 2]),
                           "temperature": rng.choice([0.0, 0.8]), "logprobs": rng.choice([None, 2]),
                           "prompt_logprobs": rng.choice([None, 1])}}
               for i in range(8)]
    for entry in entries:
        entry["params"] = {k: v for k, v in entry["params"].items() if v is not None}
    results = {}
    for label, edges in (("memory", frozenset()), ("redis", frozenset({"scheduler", "tensor_prep", "output_events"}))):
        async with running_workers(model_dir, f"{prefix}-{label}", redis_edges=edges, block_size=4,
                                   max_num_batched_tokens=24) as (redis, _):
            for entry in entries:
                await push(redis, f"{prefix}-{label}", entry)
            results[label] = {e["id"]: await read_replies(redis, f"{prefix}-{label}:out:{e['id']}") for e in entries}
            if label == "redis":
                edge_keys = [key async for key in redis.scan_iter(f"{prefix}-{label}:edge:*")]
                assert len(edge_keys) == 3  # the edges really ran over Redis
    for entry in entries:
        memory, redis_ = results["memory"][entry["id"]], results["redis"][entry["id"]]
        for index in range(entry["params"].get("n", 1)):
            assert tokens_of(redis_, index) == tokens_of(memory, index), entry
        assert redis_[-1]["usage"] == memory[-1]["usage"]


async def test_batch_file_through_a_deployment_matches_the_embedded_run(model_dir, prefix, tmp_path):
    from tqdm import tqdm

    from actors.cli.batch import read_batch_file, run_embedded, run_remote, write_results

    rng = random.Random(4)
    lines = [json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                         "body": {"prompt": [rng.randrange(3, 512) for _ in range(rng.randint(2, 30))],
                                  "max_tokens": 6, "temperature": rng.choice([0, 0.9]), "seed": i, "n": 1 + i % 2,
                                  "ignore_eos": True, "logprobs": 1}})
             for i in range(6)]
    lines.append(json.dumps({"custom_id": "bad", "method": "POST", "url": "/v1/completions",
                             "body": {"prompt": [1, 99999]}}))
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    batch = read_batch_file(source)
    requests = [line.request for line in batch if line.request is not None]
    engine = make_engine(model_dir)
    embedded = await run_embedded(engine, requests, tqdm(disable=True))
    async with running_workers(model_dir, prefix) as _:
        remote = await run_remote(REDIS_URL, prefix, requests, tqdm(disable=True))
    outputs = {}
    for label, results in (("embedded", embedded), ("remote", remote)):
        write_results(batch, results, tmp_path / f"{label}.jsonl", "tiny", None)
        outputs[label] = [json.loads(line) for line in (tmp_path / f"{label}.jsonl").read_text().splitlines()]
    for a, b in zip(outputs["embedded"], outputs["remote"], strict=True):
        assert a["custom_id"] == b["custom_id"]
        if a["error"] is not None:
            assert a["error"] == b["error"] and "must be an int in [0, 512)" in a["error"]["message"]
            continue
        choices_a, choices_b = a["response"]["body"]["choices"], b["response"]["body"]["choices"]
        assert [c["token_ids"] for c in choices_a] == [c["token_ids"] for c in choices_b]
        assert all(len(c["logprobs"]["token_logprobs"]) == 6 for c in choices_a)


async def test_same_id_submitted_twice_while_running_generates_once(model_dir, prefix):
    entry = {"id": "twice", "prompt_token_ids": [7, 8, 9], "params": {"max_tokens": 40, "ignore_eos": True}}
    async with running_workers(model_dir, prefix) as (redis, engines):
        await push(redis, prefix, entry)
        await redis.xread({f"{prefix}:out:twice": "0"}, block=10_000, count=1)  # it is running
        await push(redis, prefix, entry)
        replies = await read_replies(redis, f"{prefix}:out:twice")
        assert await pending_count(redis, prefix) == 0  # the duplicate entry was acked too
    assert [r["seq"] for r in replies] == list(range(len(replies)))
    assert len(tokens_of(replies)) == 40
    assert engines[0].scheduler.num_generated_tokens == 40


async def test_a_request_delivered_too_often_is_dead_lettered_with_an_error_reply(model_dir, prefix):
    redis = aioredis.from_url(REDIS_URL)
    stream = f"{prefix}:requests"
    await redis.xgroup_create(stream, "workers", id="0", mkstream=True)
    await push(redis, prefix, {"id": "poison", "prompt_token_ids": [3, 4], "params": {"max_tokens": 4}})
    await redis.xreadgroup("workers", "ghost", {stream: ">"}, count=1)  # a worker that died on it...
    [[entry_id, _]] = (await redis.xrange(stream))
    for _ in range(2):  # ...and two more that did too: delivered 3 times, no heartbeat anywhere
        await redis.xclaim(stream, "workers", "ghost", min_idle_time=0, message_ids=[entry_id])
    await redis.aclose()
    async with running_workers(model_dir, prefix, claim_idle_ms=200) as (redis, _):
        await push(redis, prefix, {"id": "healthy", "prompt_token_ids": [5, 6], "params": {"max_tokens": 3}})
        [error_entry] = await read_replies(redis, f"{prefix}:out:poison")
        healthy = await read_replies(redis, f"{prefix}:out:healthy")
        dead = await redis.xrange(f"{prefix}:dead")
        assert await pending_count(redis, prefix) == 0
    assert error_entry["error"]["code"] == "poison" and "delivered 4 times" in error_entry["error"]["message"]
    assert len(tokens_of(healthy)) == 3
    assert len(dead) == 1 and msgpack.unpackb(dead[0][1][b"data"])["entry_id"] == entry_id.decode()


async def test_same_id_on_two_workers_and_after_completion_generates_once(model_dir, prefix):
    entry = {"id": "dup", "prompt_token_ids": [9, 8, 7], "params": {"max_tokens": 30, "ignore_eos": True}}
    async with running_workers(model_dir, prefix, count=2) as (redis, engines):
        await push(redis, prefix, entry)
        await push(redis, prefix, entry)  # both workers may read one copy each
        replies = await read_replies(redis, f"{prefix}:out:dup")
        await push(redis, prefix, entry)  # resubmitted after it finished
        assert await pending_count(redis, prefix) == 0
        await asyncio.sleep(0.3)
        assert await redis.xlen(f"{prefix}:out:dup") == len(replies)
    assert [r["seq"] for r in replies] == list(range(len(replies)))
    assert sum(engine.scheduler.num_generated_tokens for engine in engines) == 30


async def test_requests_that_wait_too_long_end_with_an_error_and_the_queue_stays_bounded(model_dir, prefix):
    async with running_workers(model_dir, prefix, max_num_seqs=1, max_in_flight=3, max_queue_wait_ms=300) as (
            redis, _):
        # Urgent, so aging (a priority level per 256 steps) cannot give its one seat to the queued
        # requests before its 400 tokens are done: they wait, and time out.
        await push(redis, prefix, {"id": "long", "prompt_token_ids": [3, 4], "priority": -2,
                                   "params": {"max_tokens": 400, "ignore_eos": True}})
        for i in range(6):
            await push(redis, prefix, {"id": f"queued-{i}", "prompt_token_ids": [5, 6],
                                       "params": {"max_tokens": 2, "ignore_eos": True}})
        await asyncio.sleep(0.2)
        assert (await redis.xpending(f"{prefix}:requests", "workers"))["pending"] <= 3  # the rest wait in Redis
        long = await read_replies(redis, f"{prefix}:out:long")
        outcomes = [(await read_replies(redis, f"{prefix}:out:queued-{i}"))[-1] for i in range(6)]
    assert long[-1]["usage"]["completion_tokens"] == 400
    timed_out = [o for o in outcomes if o.get("error")]
    assert timed_out and all(o["error"]["code"] == "queue_timeout" for o in timed_out)


async def test_reply_to_outside_the_allowed_keys_is_an_error_on_the_default_stream(model_dir, prefix):
    params = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}
    refused = {"to-requests": f"{prefix}:requests", "to-control": f"{prefix}:control", "elsewhere": "other-app:x"}
    async with running_workers(model_dir, prefix) as (redis, _):
        for request_id, reply_to in refused.items():
            await push(redis, prefix, {"id": request_id, "prompt_token_ids": [5, 6], "params": params,
                                       "reply_to": reply_to})
        await push(redis, prefix, {"id": "ok", "prompt_token_ids": [5, 6], "params": params,
                                   "reply_to": f"{prefix}:out:mine"})
        for request_id in refused:
            (entry,) = await read_replies(redis, f"{prefix}:out:{request_id}")
            assert entry["error"]["code"] == "invalid_request" and "reply_to" in entry["error"]["message"]
        assert len(tokens_of(await read_replies(redis, f"{prefix}:out:mine"))) == 3
        assert await redis.xlen(f"{prefix}:requests") == 4  # only what we pushed: no reply written there
        assert not await redis.exists("other-app:x")
        assert await pending_count(redis, prefix) == 0


async def test_reply_to_pattern_replaces_the_default_keys(model_dir, prefix):
    params = {"max_tokens": 2, "temperature": 0, "ignore_eos": True}
    async with running_workers(model_dir, prefix, reply_to_pattern=f"{prefix}:mine:*") as (redis, _):
        await push(redis, prefix, {"id": "a", "prompt_token_ids": [5], "params": params,
                                   "reply_to": f"{prefix}:mine:a"})
        await push(redis, prefix, {"id": "b", "prompt_token_ids": [5], "params": params,
                                   "reply_to": f"{prefix}:out:b"})
        assert len(tokens_of(await read_replies(redis, f"{prefix}:mine:a"))) == 2
        (entry,) = await read_replies(redis, f"{prefix}:out:b")
        assert entry["error"]["code"] == "invalid_request" and f"{prefix}:mine:*" in entry["error"]["message"]


async def test_new_requests_on_a_shared_reply_stream_do_not_read_it_and_a_resubmission_does(
        model_dir, prefix, monkeypatch):
    """A fresh id has no replies to resume from: reading a shared stream per admitted request would
    cost the whole stream each time. A resubmitted id is looked up (and found answered)."""
    reads: list[str] = []

    async def counted_read(redis, reply_to, request_id):
        reads.append(request_id)
        return await read_reply_stream(redis, reply_to, request_id)

    monkeypatch.setattr(worker_module, "read_reply_stream", counted_read)
    params = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
    shared = f"{prefix}:out:shared"
    entries = [{"id": f"s{i}", "prompt_token_ids": [5, 6 + i], "params": params, "reply_to": shared}
               for i in range(6)]
    async with running_workers(model_dir, prefix) as (redis, engines):
        for entry in entries:
            await push(redis, prefix, entry)
        finals, last_id, deadline = set(), "0", time.monotonic() + 60
        while len(finals) < len(entries):
            assert time.monotonic() < deadline, f"finished only {sorted(finals)}"
            for _, stream_entries in await redis.xread({shared: last_id}, block=10_000, count=100) or []:
                for entry_id, fields in stream_entries:
                    last_id = entry_id
                    reply = msgpack.unpackb(fields[b"data"])
                    if reply.get("usage") is not None:
                        finals.add(reply["id"])
        assert await pending_count(redis, prefix) == 0
        assert reads == []  # no reply stream read for a new request
        await push(redis, prefix, entries[0])  # the same id again, after it finished
        deadline = time.monotonic() + 10
        while not reads and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert reads == ["s0"]
        assert await pending_count(redis, prefix) == 0
        assert await redis.xlen(shared) == 6 * 4  # answered already: nothing generated again
    assert engines[0].scheduler.num_generated_tokens == 6 * 4


async def test_one_id_twice_in_one_read_generates_once(model_dir, prefix):
    entry = {"id": "pair", "prompt_token_ids": [7, 8], "params": {"max_tokens": 6, "ignore_eos": True}}
    redis = aioredis.from_url(REDIS_URL)
    await push(redis, prefix, entry)  # both wait before the worker starts, so its first read takes both
    await push(redis, prefix, entry)
    await redis.aclose()
    async with running_workers(model_dir, prefix) as (redis, engines):
        replies = await read_replies(redis, f"{prefix}:out:pair")
        assert await pending_count(redis, prefix) == 0
    assert [r["seq"] for r in replies] == list(range(len(replies)))
    assert engines[0].scheduler.num_generated_tokens == 6


async def test_a_burst_of_requests_starts_in_one_step(model_dir, prefix):
    """A blocked read wakes on the burst's first entry; the rest, already in Redis, is admitted with
    it, so all of them prefill in the first step (as from memory), not one step after it."""
    async with running_workers(model_dir, prefix) as (redis, engines):
        scheduler = engines[0].scheduler
        first_steps: list[int] = []
        plan_step = scheduler.schedule

        def recording_schedule(*args, **kwargs):
            plan = plan_step(*args, **kwargs)
            if plan is not None and plan.new_sequences:
                first_steps.append(len(plan.new_sequences))
            return plan

        scheduler.schedule = recording_schedule
        await asyncio.sleep(0.3)  # the worker is blocked in its read
        async with AqueductClient(REDIS_URL, prefix) as client:
            await client.submit_many([{"id": f"b{i}", "prompt_token_ids": [5, 6, 7 + i], "params": {"max_tokens": 2}}
                                      for i in range(6)])
        for i in range(6):
            assert len(tokens_of(await read_replies(redis, f"{prefix}:out:b{i}"))) == 2
    assert first_steps[0] == 6, first_steps
