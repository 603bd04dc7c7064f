"""vLLM's runtime LoRA routes on a gateway in front of Redis workers: a load or unload is a control
entry every worker applies, and the gateway answers once every live worker has answered."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx
import msgpack
import openai
import pytest
import redis.asyncio as aioredis

from actors.http.backends import RemoteBackend
from actors.http.options import GatewayOptions
from pipeline.config import LoRAConfig
from pipeline.loading.tokenizer import load_tokenizer
from tests.conftest import REDIS_URL
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.lora_adapters import ADAPTER_SPECS, make_peft_adapter
from tests.support.worker_helpers import running_workers

pytestmark = pytest.mark.redis
PROMPT = "Once upon a time"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def adapter(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_peft_adapter(default_model_path, tmp_path_factory.mktemp("lora") / "story", seed=4, strength=3.0,
                             **ADAPTER_SPECS["all16rs"])


@pytest.fixture
def backend(default_model_path: Path, prefix: str) -> RemoteBackend:
    return RemoteBackend(REDIS_URL, prefix, default_model_path.name, load_tokenizer(default_model_path))


async def _live_workers(redis: aioredis.Redis, prefix: str) -> set[str]:
    return {key.decode().rpartition(":")[2] async for key in redis.scan_iter(match=f"{prefix}:worker:*")}


async def _workers_listening(redis: aioredis.Redis, prefix: str, names: set[str]) -> None:
    """Their heartbeats are up; a control reader starts at "$", so give it a moment to block on the stream."""
    deadline = time.monotonic() + 30
    while await _live_workers(redis, prefix) != names:
        assert time.monotonic() < deadline, "the workers did not start"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)


async def test_a_load_over_http_reaches_every_worker(default_model_path, prefix, backend, adapter) -> None:
    options = GatewayOptions(api_key=API_KEY, worker_timeout_s=30, runtime_lora_updating=True)
    async with running_workers(default_model_path, prefix, count=2, lora=LoRAConfig()) as (redis, engines):
        with serving(backend, options) as base_url:
            await _workers_listening(redis, prefix, {"w0", "w1"})
            async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as http:
                loaded = await http.post("/load_lora_adapter", json={"lora_name": "story", "lora_path": str(adapter)})
                assert (loaded.status_code, loaded.text) == (200, "Success: LoRA adapter 'story' added successfully.")
                assert [engine.lora_registry.names() for engine in engines] == [["story"], ["story"]]
                story = (await http.get("/models")).json()["data"][1]
                assert (story["id"], story["root"], story["parent"]) == ("story", str(adapter), backend.model_name)

                client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
                models = ["story"] * 4 + [backend.model_name]
                texts = await asyncio.gather(*(_complete(client, model) for model in models))
                assert len(set(texts[:4])) == 1 and texts[0] != texts[4]  # greedy: whichever worker served each

                bad = await http.post("/load_lora_adapter", json={"lora_name": "bad", "lora_path": "/nonexistent/lora"})
                assert bad.status_code == 400
                message = bad.json()["error"]["message"]
                assert "worker w0: lora adapter 'bad'" in message and "worker w1: lora adapter 'bad'" in message
                assert await _live_workers(redis, prefix) == {"w0", "w1"}  # no worker stopped
                assert await _complete(client, "story") == texts[0]

                unloaded = await http.post("/unload_lora_adapter", json={"lora_name": "story"})
                assert unloaded.status_code == 200
                assert [engine.lora_registry.names() for engine in engines] == [[], []]
                with pytest.raises(openai.NotFoundError):
                    await _complete(client, "story")
                assert (await http.post("/unload_lora_adapter", json={"lora_name": "story"})).status_code == 404
                await client.close()


async def test_a_load_one_worker_refuses_is_undone_on_the_others(default_model_path, prefix, backend,
                                                                  adapter) -> None:
    options = GatewayOptions(api_key=API_KEY, worker_timeout_s=30, runtime_lora_updating=True)
    async with running_workers(default_model_path, prefix, count=1, lora=LoRAConfig()) as (redis, engines):
        await redis.set(f"{prefix}:worker:picky", 1, px=30_000)
        picky = asyncio.create_task(_refusing_worker(redis, prefix, "picky"))
        with serving(backend, options) as base_url:
            await _workers_listening(redis, prefix, {"w0", "picky"})
            async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as http:
                refused = await http.post("/load_lora_adapter", json={"lora_name": "story", "lora_path": str(adapter)})
                assert refused.status_code == 400
                message = refused.json()["error"]["message"]
                assert message == "worker picky: no room (unloaded again where it had loaded)"  # w0 had loaded it
                deadline = time.monotonic() + 10
                while engines[0].lora_registry.names():  # w0 loaded it, then applies the gateway's unload
                    assert time.monotonic() < deadline, "w0 kept the adapter"
                    await asyncio.sleep(0.05)
                assert "story" not in [model["id"] for model in (await http.get("/models")).json()["data"]]
        picky.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await picky


async def _refusing_worker(redis: aioredis.Redis, prefix: str, name: str) -> None:
    """A worker's control reader that refuses every load, answering as docs/design.md says. It reads the
    test's own control stream from its start (a reader at "$" could miss an entry added before its first
    read) and keeps its heartbeat up (a slow box once let the 30 s one lapse: the gateway then asked w0 alone)."""
    last_id = "0-0"
    while True:
        await redis.set(f"{prefix}:worker:{name}", 1, px=30_000)
        for _, entries in await redis.xread({f"{prefix}:control": last_id}, block=100) or []:
            for entry_id, fields in entries:
                last_id, entry = entry_id, msgpack.unpackb(fields[b"data"])
                if "load_lora" in entry:
                    answer = {"worker": name, "op": "load_lora", "ok": False, "id": entry["id"], "error": "no room"}
                    await redis.xadd(entry["reply_to"], {"data": msgpack.packb(answer)})


async def test_a_silent_worker_is_named_after_the_timeout_and_none_at_all_is_503(prefix, backend, adapter) -> None:
    options = GatewayOptions(api_key=API_KEY, worker_timeout_s=0.5, runtime_lora_updating=True)
    body = {"lora_name": "story", "lora_path": str(adapter)}
    with serving(backend, options) as base_url:
        async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=30) as http:
            nobody = await http.post("/load_lora_adapter", json=body)
            assert nobody.status_code == 503 and nobody.json()["error"]["code"] == "no_workers"
            async with aioredis.from_url(REDIS_URL) as redis:
                await redis.set(f"{prefix}:worker:ghost", 1, px=20_000)  # a heartbeat with no control reader
                silent = await http.post("/load_lora_adapter", json=body)
            assert silent.status_code == 504
            assert "workers ghost" in silent.json()["error"]["message"]
            assert "story" not in [model["id"] for model in (await http.get("/models")).json()["data"]]


async def _complete(client: openai.AsyncOpenAI, model: str) -> str:
    completion = await client.completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=0,
                                                 extra_body={"ignore_eos": True})
    return completion.choices[0].text
