"""A worker serving a model with a recurrent state per sequence (Qwen3.5's gated DeltaNet layers): the actor
graph plans steps ahead, runs tensor prep apart from the device thread, preempts and cancels, and every
sequence's state still follows it from slot to slot: HF's greedy tokens over a real Redis."""

from __future__ import annotations

import random

import msgpack
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.support.engine_helpers import assert_greedy_equal, hf_greedy
from tests.support.hf_models import make_tiny_hf_model
from tests.support.worker_helpers import push, read_replies, running_workers, tokens_of

pytestmark = pytest.mark.redis


async def test_greedy_tokens_equal_hf_through_the_worker_with_a_cancel_and_preemption(tmp_path, prefix):
    model_dir = make_tiny_hf_model("qwen3_5", tmp_path / "qwen3_5", seed=21)
    rng = random.Random(9)
    requests = {f"req-{i}": ([rng.randrange(3, 512) for _ in range(rng.randint(2, 90))], rng.randint(3, 16))
                for i in range(10)}
    async with running_workers(model_dir, prefix, block_size=4, num_kv_blocks=48, max_num_batched_tokens=24,
                               max_num_seqs=4) as (redis, engines):
        await push(redis, prefix, {"id": "cancelled", "prompt_token_ids": list(range(3, 83)),
                                   "params": {"max_tokens": 100, "ignore_eos": True}})
        for request_id, (prompt, max_tokens) in requests.items():
            await push(redis, prefix, {"id": request_id, "prompt_token_ids": prompt,
                                       "params": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}})
        assert await redis.xread({f"{prefix}:out:cancelled": "0"}, block=30_000, count=1), "no token before cancel"
        await redis.xadd(f"{prefix}:control", {"data": msgpack.packb({"cancel": "cancelled"})})
        replies = {r: await read_replies(redis, f"{prefix}:out:{r}") for r in requests}
        cancelled = await read_replies(redis, f"{prefix}:out:cancelled")
        assert cancelled[-1]["choices"][-1]["finish_reason"] == "abort"
        assert not engines[0].scheduler.kv_cache.enable_prefix_caching
        assert engines[0].scheduler.num_preemptions > 0
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for request_id, (prompt, max_tokens) in requests.items():
        theirs, logits = hf_greedy(hf, prompt, max_tokens)
        assert_greedy_equal(tokens_of(replies[request_id]), theirs, logits, request_id)
