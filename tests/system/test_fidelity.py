"""Fidelity against HF transformers on tiny random models of each supported architecture."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, make_engine, run_requests
from tests.support.hf_models import ARCHS, RECURRENT_ARCHS, make_tiny_hf_model


@pytest.fixture(scope="module", params=ARCHS)
def arch_model(request, tmp_path_factory):
    path = make_tiny_hf_model(request.param, tmp_path_factory.mktemp(request.param), seed=11,
                              shard=request.param == "qwen2")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return request.param, path, hf


def _workload(seed: int, count: int = 16, max_prompt: int = 80, max_output: int = 24):
    rng = random.Random(seed)
    return {
        f"r{i}": ([rng.randrange(3, 512) for _ in range(rng.randint(1, max_prompt))],
                  SamplingParams(max_tokens=rng.randint(4, max_output), temperature=0.0, ignore_eos=True))
        for i in range(count)
    }


def _check_against_hf(hf, requests, results, label):
    for request_id, (prompt, params) in requests.items():
        theirs, logits = hf_greedy(hf, prompt, params.max_tokens)
        ours = results[request_id]["choices"][0]["token_ids"]
        assert_greedy_equal(ours, theirs, logits, f"{label}/{request_id}")


def test_greedy_batch_of_mixed_lengths_matches_hf(arch_model):
    arch, path, hf = arch_model
    requests = _workload(seed=1)
    results = run_requests(make_engine(path, max_num_batched_tokens=256), requests)
    _check_against_hf(hf, requests, results, arch)


def test_greedy_matches_hf_with_preemption_and_chunked_prefill(arch_model):
    arch, path, hf = arch_model
    requests = _workload(seed=2)
    engine = make_engine(path, block_size=4, num_kv_blocks=40, max_num_batched_tokens=24, max_num_seqs=8)
    results = run_requests(engine, requests)
    assert engine.scheduler.num_preemptions > 0
    _check_against_hf(hf, requests, results, arch)
    assert engine.scheduler.kv_cache.num_free_blocks == 40


def test_prefix_cache_hits_give_the_same_tokens(arch_model):
    arch, path, hf = arch_model
    rng = random.Random(3)
    shared = [rng.randrange(3, 512) for _ in range(40)]
    engine = make_engine(path, block_size=8)
    first = {"a": ([*shared, 7, 8], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))}
    run_requests(engine, first)
    second = {f"b{i}": (shared + [rng.randrange(3, 512) for _ in range(i + 1)],
                        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)) for i in range(4)}
    results = run_requests(engine, second)
    # Models with a recurrent state per sequence (Qwen3-Next, Qwen3.5) run without prefix caching.
    cached = 0 if arch in RECURRENT_ARCHS else 40
    assert all(results[r]["usage"].cached_tokens == cached for r in second)
    _check_against_hf(hf, second, results, arch)


def test_logprobs_are_hf_log_softmax(arch_model):
    _arch, path, hf = arch_model
    prompt = list(range(5, 40))
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3)
    results = run_requests(make_engine(path), {"x": (prompt, params)})
    choice = results["x"]["choices"][0]
    theirs, logits = hf_greedy(hf, prompt, 6)
    expected = torch.log_softmax(logits, dim=-1)
    assert choice["token_ids"] == theirs
    for step, entry in enumerate(choice["logprobs"]):
        assert entry.rank == 1
        assert abs(entry.logprob - float(expected[step, entry.token_id])) < 1e-4
        top_ids = [token_id for token_id, _ in entry.top]
        assert top_ids == torch.topk(expected[step], 3).indices.tolist()
        for token_id, logprob in entry.top:
            assert abs(logprob - float(expected[step, token_id])) < 1e-4


def test_prompt_logprobs_are_hf_log_softmax(arch_model):
    _arch, path, hf = arch_model
    prompt = list(range(9, 60))
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=2)
    # A small budget splits the prompt over several steps.
    results = run_requests(make_engine(path, max_num_batched_tokens=16), {"x": (prompt, params)})
    entries = results["x"]["prompt_logprobs"]
    with torch.inference_mode():
        expected = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    assert len(entries) == len(prompt) and entries[0] is None
    for position in range(1, len(prompt)):
        entry = entries[position]
        assert entry.token_id == prompt[position]
        assert abs(entry.logprob - float(expected[position - 1, prompt[position]])) < 1e-4


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(arch_model):
    _arch, path, hf = arch_model
    prompt = list(range(30, 70))
    params = SamplingParams(max_tokens=0, prompt_logprobs=1, n=2)
    results = run_requests(make_engine(path, max_num_batched_tokens=16), {"x": (prompt, params)})
    with torch.inference_mode():
        expected = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    entries = results["x"]["prompt_logprobs"]
    assert [entry.logprob for entry in entries[1:]] == pytest.approx(
        [float(expected[i - 1, prompt[i]]) for i in range(1, len(prompt))], abs=1e-4)
    for choice in results["x"]["choices"].values():
        assert choice["token_ids"] == [] and choice["text"] == "" and choice["finish_reason"] == "length"
    assert results["x"]["usage"].completion_tokens == 0 and results["x"]["usage"].prompt_tokens == len(prompt)


def test_stop_tokens_and_min_tokens_match_hf_eos_semantics(arch_model):
    arch, path, hf = arch_model
    prompt = list(range(20, 50))
    free_run, _ = hf_greedy(hf, prompt, 12)
    stop_token = free_run[4]  # a token greedy decoding is known to produce
    engine = make_engine(path)
    requests = {
        "stop": (prompt, SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_token])),
        "min": (prompt, SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_token],
                                       min_tokens=6)),
    }
    results = run_requests(engine, requests)
    eos = [stop_token, *engine.eos_token_ids]
    theirs, logits = hf_greedy(hf, prompt, 12, eos_token_id=eos)
    assert_greedy_equal(results["stop"]["choices"][0]["token_ids"], theirs, logits, f"{arch}/stop")
    assert results["stop"]["choices"][0]["finish_reason"] == "stop"
    assert results["stop"]["choices"][0]["stop_reason"] == stop_token
    theirs, logits = hf_greedy(hf, prompt, 12, eos_token_id=eos, min_new_tokens=6)
    assert_greedy_equal(results["min"]["choices"][0]["token_ids"], theirs, logits, f"{arch}/min_tokens")


def test_n_greedy_choices_are_each_hf_greedy(arch_model):
    arch, path, hf = arch_model
    prompt = list(range(30, 47))
    results = run_requests(make_engine(path), {"x": (prompt, SamplingParams(
        n=3, max_tokens=7, temperature=0.0, ignore_eos=True))})
    theirs, logits = hf_greedy(hf, prompt, 7)
    choices = results["x"]["choices"]
    assert sorted(choices) == [0, 1, 2]
    for index in range(3):
        assert_greedy_equal(choices[index]["token_ids"], theirs, logits, f"{arch}/choice{index}")
    assert results["x"]["seqs"] == list(range(len(results["x"]["seqs"])))
