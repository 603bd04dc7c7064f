"""A worker trims its request stream of the requests it has answered and acknowledged (actors/worker/
stream_trimmer.py), so a long-running deployment's streams do not grow without bound; requests it has
not finished stay."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from actors.worker import stream_trimmer
from tests.support.worker_helpers import push, read_replies, running_workers, tokens_of

pytestmark = pytest.mark.redis

PARAMS = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}


async def test_answered_requests_leave_the_stream(default_model_path: Path, prefix: str, monkeypatch) -> None:
    monkeypatch.setattr(stream_trimmer, "TRIM_INTERVAL_S", 0.2)
    async with running_workers(default_model_path, prefix) as (redis, _):
        for index in range(6):
            await push(redis, prefix, {"id": f"r{index}", "prompt": "Once upon a time", "params": PARAMS})
        for index in range(6):
            assert len(tokens_of(await read_replies(redis, f"{prefix}:out:r{index}"))) == 4
        deadline = time.monotonic() + 20
        while await redis.xlen(f"{prefix}:requests") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert await redis.xlen(f"{prefix}:requests") == 0
        await push(redis, prefix, {"id": "after", "prompt": "Once upon a time", "params": PARAMS})
        assert len(tokens_of(await read_replies(redis, f"{prefix}:out:after"))) == 4  # still serving
