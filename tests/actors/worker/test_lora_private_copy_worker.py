"""A live worker keeps serving an adapter loaded over the control stream as it was when loaded, after
its files in --lora-root were rewritten and its symlink re-pointed outside the root, and after it
left host memory and came back (one slot, one host-memory place)."""

from __future__ import annotations

import asyncio
import time

import msgpack
import pytest
import redis.asyncio as aioredis

from actors.worker.run import WorkerOptions, run_worker
from pipeline.config import LoRAConfig
from tests.conftest import REDIS_URL
from tests.support.engine_helpers import make_engine
from tests.support.hf_models import make_tiny_hf_model
from tests.support.lora_adapters import ALL_PROJECTIONS, make_peft_adapter
from tests.support.worker_helpers import push, read_replies, tokens_of

pytestmark = pytest.mark.redis
PROMPT = [7, 19, 3, 88, 41, 5, 230, 17, 64, 9, 150, 33]


def _adapter(base, path, seed):
    return make_peft_adapter(base, path, seed=seed, strength=2.0, r=4, lora_alpha=8, target_modules=ALL_PROJECTIONS)


async def _generate(redis, prefix, request_id, lora=None):
    entry = {"id": request_id, "prompt_token_ids": PROMPT,
             "params": {"max_tokens": 8, "temperature": 0, "ignore_eos": True}}
    if lora is not None:
        entry["lora"] = lora
    await push(redis, prefix, entry)
    return tokens_of(await read_replies(redis, f"{prefix}:out:{request_id}"))


async def _load(redis, prefix, registry, name, path) -> None:
    await redis.xadd(f"{prefix}:control", {"data": msgpack.packb({"load_lora": {"name": name, "path": str(path)}})})
    deadline = time.monotonic() + 30
    while name not in registry.names() or not registry.is_ready(registry.id_of(name)):
        assert time.monotonic() < deadline, f"{name} did not load"
        await asyncio.sleep(0.05)


async def test_rewritten_and_repointed_adapter_serves_what_was_loaded(tmp_path, monkeypatch, prefix):
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(tmp_path / "cache"))
    base = make_tiny_hf_model("llama", tmp_path / "base", seed=5)
    root = (tmp_path / "root").resolve()
    root.mkdir()
    (root / "current").symlink_to(_adapter(base, root / "v1", seed=1))
    _adapter(base, root / "other", seed=2)
    engine = make_engine(base, num_kv_blocks=64, lora=LoRAConfig(max_loras=1, max_cpu_loras=1, max_lora_rank=8))
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(engine, WorkerOptions(REDIS_URL, prefix, name="w0", lora_root=str(root)),
                                            stop))
    redis = aioredis.from_url(REDIS_URL)
    try:
        await asyncio.sleep(0.3)  # the control reader starts at "$": let it block on the stream first
        await _load(redis, prefix, engine.lora_registry, "linked", root / "current")
        await _load(redis, prefix, engine.lora_registry, "other", root / "other")
        before = await _generate(redis, prefix, "before", "linked")
        _adapter(base, root / "v1", seed=7)  # the loaded directory rewritten in place
        (root / "current").unlink()
        (root / "current").symlink_to(_adapter(base, tmp_path / "outside", seed=8))
        assert len(await _generate(redis, prefix, "evict", "other")) == 8
        after = await _generate(redis, prefix, "after", "linked")
        assert len(await _generate(redis, prefix, "base")) == 8
    finally:
        stop.set()
        code = await asyncio.wait_for(worker, timeout=30)
        await redis.aclose()
    assert after == before and len(before) == 8
    assert code == 0
