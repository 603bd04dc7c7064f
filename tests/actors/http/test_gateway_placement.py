"""Prefix placement through a gateway: it names a chat request's prompt blocks exactly as the worker
that renders, tokenizes and caches them, so the next turn of the conversation is offered there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

from actors.http.backends import RemoteBackend, prompt_renderer
from actors.http.options import GatewayOptions
from pipeline.loading.tokenizer import load_tokenizer
from pipeline.scheduling.prefix_keys import prefix_keys
from queue_adapters.codec import WireRequest, decode_request, encode
from queue_adapters.placement import affinity_key, blocks_key
from tests.conftest import REDIS_URL
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.worker_helpers import running_workers

pytestmark = pytest.mark.redis

SYSTEM = "You are a careful assistant. " * 12


async def _cached_on(redis, prefix: str, worker: str, keys: list[bytes]) -> bool:
    for _ in range(100):  # the worker publishes every 50 ms
        if all(await redis.smismember(blocks_key(prefix, worker), keys)):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_the_next_turn_is_offered_to_the_worker_caching_the_conversation(default_model_path: Path,
                                                                              prefix: str) -> None:
    tokenizer = load_tokenizer(default_model_path)
    backend = RemoteBackend(REDIS_URL, prefix, default_model_path.name, tokenizer, placement_block_size=16)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name three rivers."}]
    async with running_workers(default_model_path, prefix, count=2) as (redis, _):
        with serving(backend, GatewayOptions(api_key=API_KEY, worker_timeout_s=30)) as base_url:
            client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
            first = await client.chat.completions.create(model=backend.model_name, messages=messages, max_tokens=8,
                                                         temperature=0)
            wire = decode_request(encode(WireRequest(id="probe", messages=messages)))
            keys = prefix_keys(prompt_renderer(tokenizer, None)(wire), 16)
            assert len(keys) >= 4
            holders = [worker for worker in ("w0", "w1") if await _cached_on(redis, prefix, worker, keys)]
            assert len(holders) == 1, "the gateway's keys are not the worker's"
            messages += [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": "And three more."}]
            streams = [affinity_key(prefix, "normal", worker) for worker in (holders[0], "w1" if holders[0] == "w0"
                                                                             else "w0")]
            before = [await redis.xlen(stream) for stream in streams]
            second = await client.chat.completions.create(model=backend.model_name, messages=messages,
                                                          max_tokens=8, temperature=0)
            # Offered to the worker holding the first turn, and to no other.
            assert [await redis.xlen(stream) - count for stream, count in zip(streams, before, strict=True)] == [1, 0]
            assert second.usage.prompt_tokens_details.cached_tokens >= 16 * len(keys) - 16
            await client.close()


def test_a_long_prompt_is_named_by_its_first_blocks_without_tokenizing_it_whole(default_model_path: Path) -> None:
    """Tokenizing a 3 MB prompt for placement held the gateway's GIL for seconds (every stream stalled):
    only its first PLACEMENT_MAX_CHARS are tokenized, and the ids near the cut dropped."""
    tokenizer = load_tokenizer(default_model_path)
    text = " ".join(f"word{index % 97}" for index in range(40_000))  # ~270k characters
    ids = prompt_renderer(tokenizer, None)(WireRequest(id="long", prompt=text))
    whole = tokenizer.encode(text)
    assert 1_000 < len(ids) < len(whole) and ids == whole[:len(ids)]
