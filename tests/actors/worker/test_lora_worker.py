"""LoRA on a live worker with a real Redis: requests name adapters on the wire, adapters are loaded
and unloaded over the control stream, and bad names or adapters get error replies."""

from __future__ import annotations

import asyncio
import random
import time

import msgpack
import pytest
from transformers import AutoModelForCausalLM

from pipeline.config import LoRAConfig
from queue_adapters.codec import CodecError, decode_control
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy
from tests.support.hf_models import make_tiny_hf_model
from tests.support.lora_adapters import ADAPTER_SPECS, make_adapters, make_peft_adapter, peft_model
from tests.support.worker_helpers import push, read_replies, running_workers, tokens_of

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def lora_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-worker")
    base = make_tiny_hf_model("llama", root / "base", seed=23)
    adapters = make_adapters(base, root, ["attn8", "mlp4"])
    adapters["dora"] = make_peft_adapter(base, root / "dora", seed=9, use_dora=True, **ADAPTER_SPECS["kv2"])
    return base, adapters


async def _control(redis, prefix, entry) -> None:
    await redis.xadd(f"{prefix}:control", {"data": msgpack.packb(entry)})


async def _wait_for(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _generate(redis, prefix, request_id, prompt, lora=None, max_tokens=8):
    entry = {"id": request_id, "prompt_token_ids": prompt,
             "params": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    if lora is not None:
        entry["lora"] = lora
    await push(redis, prefix, entry)
    return await read_replies(redis, f"{prefix}:out:{request_id}")


async def test_load_serve_and_unload_adapters_over_the_control_stream(lora_models, prefix):
    base, adapters = lora_models
    prompt = [random.Random(4).randrange(3, 512) for _ in range(30)]
    config = LoRAConfig(modules=(("attn8", str(adapters["attn8"])),), max_loras=2)
    async with running_workers(base, prefix, lora=config) as (redis, engines):
        registry = engines[0].lora_registry
        started = await _generate(redis, prefix, "at-start", prompt, lora="attn8")
        await asyncio.sleep(0.3)  # the control reader starts at "$": let it block on the stream first
        await _control(redis, prefix, {"load_lora": {"name": "mlp4", "path": str(adapters["mlp4"])}})
        await _wait_for(lambda: "mlp4" in registry.names(), "mlp4 to load")
        loaded = await _generate(redis, prefix, "loaded", prompt, lora="mlp4")
        on_base = await _generate(redis, prefix, "base", prompt)
        await _control(redis, prefix, {"unload_lora": "mlp4"})
        await _wait_for(lambda: "mlp4" not in registry.names(), "mlp4 to unload")
        gone = await _generate(redis, prefix, "gone", prompt, lora="mlp4")
        await _control(redis, prefix, {"load_lora": {"name": "dora", "path": str(adapters["dora"])}})
        await _control(redis, prefix, {"load_lora": {"name": "nowhere", "path": "/nonexistent/adapter"}})
        unknown = await _generate(redis, prefix, "unknown", prompt, lora="nope")
        after_bad_loads = await _generate(redis, prefix, "after-bad", prompt, lora="attn8")
        assert "dora" not in registry.names() and "nowhere" not in registry.names()
    for request_id, entries, lora in (("at-start", started, "attn8"), ("loaded", loaded, "mlp4"),
                                      ("base", on_base, None), ("after-bad", after_bad_loads, "attn8")):
        model = peft_model(base, adapters[lora]) if lora else AutoModelForCausalLM.from_pretrained(base)
        theirs, logits = hf_greedy(model, prompt, 8)
        assert_greedy_equal(tokens_of(entries), theirs, logits, request_id)
    for entries in (gone, unknown):
        assert entries[-1]["error"]["code"] == "invalid_request"
        assert "unknown adapter" in entries[-1]["error"]["message"]



@pytest.mark.parametrize(("entry", "message"), [
    ({"load_lora": {"name": "a"}}, "path"),
    ({"load_lora": {"name": "", "path": "/x"}}, "name"),
    ({"unload_lora": "a", "cancel": "r1"}, "exactly one of cancel, load_lora, unload_lora"),
    ({}, "exactly one of"),
    ({"load_lora": {"name": "a", "path": "/x", "rank": 4}}, "rank"),
])
def test_malformed_lora_control_entries_are_named(entry, message):
    with pytest.raises(CodecError, match=message):
        decode_control(msgpack.packb(entry))


def test_lora_control_entries_decode():
    control = decode_control(msgpack.packb({"load_lora": {"name": "sql", "path": "/adapters/sql"}}))
    assert control.load_lora is not None
    assert (control.load_lora.name, control.load_lora.path) == ("sql", "/adapters/sql")
    assert decode_control(msgpack.packb({"unload_lora": "sql"})).unload_lora == "sql"
