"""Draft-model speculation through the engine on tiny random models: a draft with the target's own
weights (every draft token accepted), and a different small model with the same vocabulary (few
accepted). Either way every request's tokens and logprobs equal those without speculation, and
greedy output equals HF's."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from pipeline.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from pipeline.model.runner import ModelRunner
from pipeline.request.sampling_params import SamplingParams
from pipeline.speculative.draft_model import DraftModelProposer
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, make_engine, run_requests
from tests.support.hf_models import make_tiny_hf_model
from tests.support.lora_adapters import make_peft_adapter, run_with_adapters
from tests.support.speculative_helpers import compare_with_plain

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18, 40, 41, 99, 7, 300, 301, 5, 6]
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("target"), seed=5)


@pytest.fixture(scope="module")
def other_draft_dir(tmp_path_factory):
    """A smaller, differently drawn model with the target's vocabulary."""
    return make_tiny_hf_model("qwen2", tmp_path_factory.mktemp("draft"), seed=11, hidden_size=32,
                              intermediate_size=64, num_hidden_layers=1)


def _draft(path, k: int = 4, **extra) -> SpeculativeConfig:
    return SpeculativeConfig.from_dict({"model": str(path), "num_speculative_tokens": k, **extra})


def test_the_target_as_its_own_draft_accepts_every_greedy_token_and_equals_hf(target_dir):
    requests = {"g": (PROMPT, SamplingParams(max_tokens=40, **GREEDY))}
    engine, outputs = compare_with_plain(target_dir, _draft(target_dir), requests, block_size=4)
    stats = engine.stats
    assert stats.num_draft_tokens >= 30  # (at most 40 / 5 steps without a draft)
    assert stats.num_accepted_tokens == stats.num_draft_tokens
    assert stats.num_steps < 40 / 2
    hf = AutoModelForCausalLM.from_pretrained(target_dir, torch_dtype=torch.float32).eval()
    theirs, logits = hf_greedy(hf, PROMPT, 40)
    assert_greedy_equal(outputs["g"]["choices"][0]["token_ids"], theirs, logits, "llama")


def test_a_different_draft_changes_no_token_greedy_or_sampled(target_dir, other_draft_dir):
    sampled = {"max_tokens": 32, "ignore_eos": True}
    requests = {
        "greedy": (PROMPT, SamplingParams(logprobs=2, **GREEDY, max_tokens=32)),
        "seeded": (PROMPT, SamplingParams(temperature=0.7, seed=3, n=2, logprobs=1, **sampled)),
        "penalties": (PROMPT[3:], SamplingParams(temperature=0.5, seed=4, repetition_penalty=1.2,
                                                 presence_penalty=0.3, **sampled)),
        "off": (PROMPT, SamplingParams(temperature=0.3, seed=5, speculative=False, **sampled)),
    }
    engine, _ = compare_with_plain(target_dir, _draft(other_draft_dir, k=3), requests, block_size=4)
    stats = engine.stats
    assert stats.num_draft_tokens > 0
    assert stats.num_accepted_tokens < stats.num_draft_tokens / 2  # a random stranger rarely agrees


def test_sampled_requests_with_the_target_as_draft(target_dir):
    """A greedy draft of the target itself is often rejected by a sampled row, and output is unchanged."""
    requests = {f"s{i}": (PROMPT, SamplingParams(temperature=0.4 * i, seed=i, max_tokens=30, ignore_eos=True))
                for i in range(1, 4)}
    engine, _ = compare_with_plain(target_dir, _draft(target_dir), requests)
    assert 0 < engine.stats.num_accepted_tokens < engine.stats.num_draft_tokens


def test_preemption_with_a_tiny_kv_cache(target_dir):
    requests = {f"r{i}": (PROMPT[i:] * 2, SamplingParams(max_tokens=40, temperature=0.3 * (i % 2), seed=i,
                                                          ignore_eos=True))
                for i in range(6)}
    engine, _ = compare_with_plain(target_dir, _draft(target_dir), requests, block_size=4, num_kv_blocks=40,
                         max_num_batched_tokens=64)
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats.num_accepted_tokens > 0
    assert engine.scheduler.kv_cache.num_free_blocks == 40
    draft = engine.draft_model
    assert draft is not None and not draft.states  # every finished sequence gave its draft blocks back
    assert len(draft.free_blocks) == draft.runner.num_kv_blocks


def test_stop_tokens_and_max_tokens_inside_an_accepted_run(target_dir):
    free = run_requests(make_engine(target_dir), {"free": (PROMPT, SamplingParams(max_tokens=40, **GREEDY))})
    tokens = free["free"]["choices"][0]["token_ids"]
    stop = tokens[25]
    first_stop = tokens.index(stop)
    requests = {f"max{m}": (PROMPT, SamplingParams(max_tokens=m, **GREEDY)) for m in (7, 13, 22)}
    requests["stop"] = (PROMPT, SamplingParams(max_tokens=40, stop_token_ids=[stop], **GREEDY))
    engine, outputs = compare_with_plain(target_dir, _draft(target_dir), requests)
    # Every draft matches; only each request's last one may be cut short by its stop or max_tokens.
    stats = engine.stats
    assert 0 < stats.num_draft_tokens - stats.num_accepted_tokens <= 4 * len(requests)
    for m in (7, 13, 22):
        assert outputs[f"max{m}"]["choices"][0]["token_ids"] == tokens[:m]
    assert outputs["stop"]["choices"][0]["token_ids"] == tokens[:first_stop + 1]


def test_a_draft_model_with_another_vocabulary_is_a_config_error(target_dir, tmp_path):
    other = make_tiny_hf_model("llama", tmp_path / "other", seed=1, vocab_size=300)
    with pytest.raises(ValueError, match=r"speculative_config\.model: the draft model's vocabulary has 300 tokens, "
                                         r"the target's 512"):
        make_engine(target_dir, speculative=_draft(other))


def test_a_missing_draft_model_is_a_config_error(target_dir, tmp_path):
    with pytest.raises(ValueError, match=r"speculative_config\.model: "):
        make_engine(target_dir, speculative=_draft(tmp_path / "nowhere"))


def test_lora_requests_verify_with_their_adapter_while_the_draft_runs_without(target_dir, tmp_path):
    """The base model drafts for an adapter's request: fewer drafts match, no token changes."""
    adapter = make_peft_adapter(target_dir, tmp_path / "adapter", seed=1, r=8, lora_alpha=16,
                                target_modules=["q_proj", "v_proj", "down_proj"])
    lora = LoRAConfig(modules=(("a", str(adapter)),))
    requests = {"base": (PROMPT, SamplingParams(max_tokens=24, **GREEDY), None),
                "adapted": (PROMPT, SamplingParams(max_tokens=24, **GREEDY), "a"),
                "sampled": (PROMPT, SamplingParams(max_tokens=24, temperature=0.5, seed=2, ignore_eos=True), "a")}
    plain = run_with_adapters(make_engine(target_dir, lora=lora), requests)
    engine = make_engine(target_dir, lora=lora, speculative=_draft(target_dir))
    speculating = run_with_adapters(engine, requests)
    for request_id in requests:
        assert speculating[request_id]["tokens"] == plain[request_id]["tokens"], request_id
    assert plain["adapted"]["tokens"] != plain["base"]["tokens"]  # the adapter matters
    assert 0 < engine.stats.num_accepted_tokens < engine.stats.num_draft_tokens


def test_a_full_draft_cache_evicts_the_least_recently_drafted_sequence(target_dir):
    """Eight 4-token blocks hold one 16-token context and its 4-token draft: a second sequence evicts
    the first, which recomputes its context and drafts the same tokens again."""
    runner = ModelRunner(ModelConfig(model=str(target_dir)), CacheConfig(block_size=4, num_kv_blocks=8),
                         SchedulerConfig(), str(target_dir))
    proposer = DraftModelProposer(runner)
    first = proposer.propose(1, PROMPT, 4)
    second = proposer.propose(2, PROMPT[::-1], 4)
    assert list(proposer.states) == [2]
    assert proposer.propose(1, PROMPT, 4) == first  # recomputed after eviction
    assert list(proposer.states) == [1]
    assert proposer.propose(1, PROMPT + first[:2], 4)[:2] == first[2:]  # continues from its cache
    assert proposer.propose(2, PROMPT[::-1], 4) == second
    assert proposer.propose(3, PROMPT * 3, 4) == []  # more than the whole pool: no draft, nothing held
    assert 3 not in proposer.states


def test_unseeded_samples_are_distributed_as_without_speculation(target_dir, other_draft_dir):
    """The issue's statistical check, beside the per-seed identity above: unseeded requests draw fresh
    randomness, so runs with and without a draft model give different samples, and a two-sample
    chi-square test over the first three tokens (top_k 3: 27 outcomes) finds their distributions
    alike. A biased verification (accepting a draft token more often than the target would draw it)
    fails it: the draft's greedy tokens would then be over-represented."""
    from scipy.stats import chi2

    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=3, ignore_eos=True)
    requests = {f"r{i}": (PROMPT, params) for i in range(600)}
    samples = []
    for speculative in (None, _draft(other_draft_dir, k=2, disable_by_batch_size=None)):
        engine = make_engine(target_dir, speculative=speculative)
        results = run_requests(engine, requests)
        samples.append([tuple(result["choices"][0]["token_ids"]) for result in results.values()])
    assert engine.stats.num_draft_tokens > 0
    outcomes = sorted(set(samples[0]) | set(samples[1]))
    plain = torch.tensor([samples[0].count(outcome) for outcome in outcomes], dtype=torch.float64)
    drafted = torch.tensor([samples[1].count(outcome) for outcome in outcomes], dtype=torch.float64)
    statistic = float(((plain - drafted) ** 2 / (plain + drafted)).sum())  # equal sample sizes
    assert len(outcomes) > 5  # a real spread, not one dominant path
    assert chi2.sf(statistic, len(outcomes) - 1) > 1e-3, (statistic, len(outcomes))
