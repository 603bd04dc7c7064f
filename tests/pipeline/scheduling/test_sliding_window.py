"""Sliding-window attention: HF-exact outputs, KV blocks released outside the window, prefix hits
that need only the blocks inside it."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from pipeline.config import SchedulerConfig
from pipeline.request.request import Request
from pipeline.request.sampling_params import SamplingParams
from pipeline.scheduling.kv_cache_manager import NULL_BLOCK, KVCacheManager
from pipeline.scheduling.scheduler import Scheduler
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, make_engine, run_requests
from tests.support.hf_models import make_tiny_hf_model

WINDOW = 21


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    path = make_tiny_hf_model("mistral", tmp_path_factory.mktemp("mistral"), seed=5, sliding_window=WINDOW)
    return path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def test_long_generation_holds_only_the_blocks_its_window_needs(mistral):
    path, hf = mistral
    prompt = [random.Random(1).randrange(3, 512) for _ in range(30)]
    engine = make_engine(path, block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, max_num_seqs=4)
    engine.add_request("long", prompt, _greedy(300))
    tokens: list[int] = []
    peak_blocks = 0
    while engine.has_unfinished:
        for delta in engine.step():
            tokens += delta.choices[0].token_ids
        peak_blocks = max(peak_blocks, engine.scheduler.kv_cache.num_used_blocks)
    # 20 visible old tokens + up to 16 new ones over blocks of 4: at most 10 blocks; 330 tokens
    # without the window would need 83 blocks, more than the whole cache.
    assert peak_blocks <= engine.scheduler.kv_cache.max_blocks_per_sequence(16) == 10
    theirs, logits = hf_greedy(hf, prompt, 300)
    assert_greedy_equal(tokens, theirs, logits, "long generation")


def test_mixed_batch_with_chunked_prefill_and_preemption_matches_hf(mistral):
    path, hf = mistral
    rng = random.Random(2)
    requests = {f"r{i}": ([rng.randrange(3, 512) for _ in range(rng.randint(1, 90))], _greedy(rng.randint(4, 40)))
                for i in range(12)}
    engine = make_engine(path, block_size=4, num_kv_blocks=36, max_num_batched_tokens=20, max_num_seqs=6)
    results = run_requests(engine, requests)
    assert engine.scheduler.num_preemptions > 0
    for request_id, (prompt, params) in requests.items():
        theirs, logits = hf_greedy(hf, prompt, params.max_tokens)
        assert_greedy_equal(results[request_id]["choices"][0]["token_ids"], theirs, logits, request_id)
    assert engine.scheduler.kv_cache.num_free_blocks == 36


def test_prefix_hit_beyond_the_window_survives_eviction_of_early_blocks(mistral):
    path, hf = mistral
    rng = random.Random(3)
    shared = [rng.randrange(3, 512) for _ in range(64)]
    engine = make_engine(path, block_size=4, num_kv_blocks=40, max_num_batched_tokens=16)
    run_requests(engine, {"first": (shared, _greedy(2))})
    # The first request released its early blocks while it ran; they sit at the head of the free
    # queue, so the next allocation evicts them from the prefix cache.
    run_requests(engine, {"filler": ([rng.randrange(3, 512) for _ in range(20)], _greedy(2))})
    prompt = [*shared, 7, 8, 9]
    results = run_requests(engine, {"hit": (prompt, _greedy(10))})
    assert results["hit"]["usage"].cached_tokens == 64
    theirs, logits = hf_greedy(hf, prompt, 10)
    assert_greedy_equal(results["hit"]["choices"][0]["token_ids"], theirs, logits, "hit")


def _request(tokens: list[int]) -> Request:
    return Request(request_id=f"r{len(tokens)}", prompt_token_ids=tokens, params=_greedy(4), seed=0)


def test_cached_prefix_needs_only_the_blocks_inside_the_window():
    kv = KVCacheManager(num_blocks=32, block_size=4, sliding_window=6)
    tokens = list(range(10, 30))  # 5 full blocks
    owner = _request(tokens).sequences[0]
    assert kv.allocate(owner, len(tokens))
    kv.free(owner)
    block_ids = list(range(5))  # a fresh pool hands out blocks 0, 1, 2, ...
    kv.pool._evict(block_ids[0])  # as if reused for other tokens
    # 17 tokens: 4 full blocks count (the last token is always computed). The token at position 16
    # sees positions 11..16, so blocks 2 and 3 are needed and the evicted block 0 is not.
    hit = kv.find_cached_prefix(_request(tokens[:17]).sequences[0])
    assert hit == [NULL_BLOCK, NULL_BLOCK, block_ids[2], block_ids[3]]
    # Without a window the evicted first block ends the prefix at once.
    plain = KVCacheManager(num_blocks=32, block_size=4)
    seq = _request(tokens).sequences[0]
    assert plain.allocate(seq, len(tokens))
    plain.free(seq)
    plain.pool._evict(0)
    assert plain.find_cached_prefix(_request(tokens[:17]).sequences[0]) == []


def test_a_windowed_sequence_may_be_longer_than_the_cache():
    kv = KVCacheManager(num_blocks=16, block_size=4, sliding_window=8)
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4), kv, max_model_len=1000)
    assert scheduler.max_model_len == 1000  # needs at most cdiv(7 + 16, 4) + 1 = 7 of 16 blocks
    unbounded = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4),
                          KVCacheManager(num_blocks=16, block_size=4), max_model_len=1000)
    assert unbounded.max_model_len == 64
