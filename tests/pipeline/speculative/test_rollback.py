"""The scheduler's side of verification, without a model: a rejected draft leaves the sequence and
the KV cache as plain decoding of the same tokens would."""

from __future__ import annotations

import pytest

from pipeline.config import SchedulerConfig, SpeculativeConfig
from pipeline.request.request import Request
from pipeline.request.sampling_params import SamplingParams
from pipeline.scheduling.kv_cache_manager import KVCacheManager
from pipeline.scheduling.scheduler import Scheduler, SchedulerFeatures
from pipeline.speculative.speculator import Speculator, can_speculate
from pipeline.step.result import StepResult

PROMPT = [3, 4, 5, 6, 7] * 3  # 15 tokens: after a sampled 3, the draft copies 4 5 6 7


def _scheduler(speculative: SpeculativeConfig | None, budget: int = 64) -> Scheduler:
    kv = KVCacheManager(32, 4, enable_prefix_caching=True)
    speculator = Speculator(speculative) if speculative is not None else None
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget), kv, 256, SchedulerFeatures(speculator=speculator))


def _step(scheduler: Scheduler, tokens_per_seq: list[int]):
    """Schedule; every scheduled row of the one sequence 'samples' the given tokens in order."""
    plan = scheduler.schedule()
    (seq_id, count), = plan.num_scheduled_tokens.items()
    seq = scheduler.sequences[seq_id]
    rows = 1 + len(seq.draft_token_ids) if seq.num_computed_tokens == seq.num_tokens else 0
    tokens = tokens_per_seq[:rows]
    scheduler.apply_step_result(StepResult(plan.step_id, [seq_id] * rows, tokens, [None] * rows))
    return plan, count


def _state(scheduler: Scheduler) -> tuple:
    seq = scheduler.requests["r"].sequences[0]
    return (list(seq.token_ids), seq.num_computed_tokens, len(seq.block_ids), seq.num_published_blocks,
            scheduler.kv_cache.num_free_blocks, sorted(scheduler.kv_cache.pool._block_of_hash))


def _start(speculative: SpeculativeConfig | None) -> Scheduler:
    scheduler = _scheduler(speculative)
    scheduler.add_request(Request("r", list(PROMPT), SamplingParams(max_tokens=20, temperature=0, ignore_eos=True),
                                  seed=0))
    _step(scheduler, [3])  # prefill; samples 3
    return scheduler


@pytest.mark.parametrize(("sampled", "num_accepted"), [
    ([99, 1, 1, 1, 1], 0),  # all rejected: the target's own token only
    ([4, 5, 88, 1, 1], 2),  # two accepted, then the target's token
    ([4, 5, 6, 7, 42], 4),  # all accepted, plus the bonus token
])
def test_verification_leaves_what_plain_decoding_of_the_emitted_tokens_leaves(sampled, num_accepted):
    speculating = _start(SpeculativeConfig(num_speculative_tokens=4))
    plan, count = _step(speculating, sampled)
    assert plan.running_sequences[0].draft_token_ids == [4, 5, 6, 7]
    assert count == 5
    emitted = sampled[:num_accepted + 1]
    assert speculating.requests["r"].sequences[0].output_token_ids == [3, *emitted]
    assert speculating.speculator.num_draft_tokens == 4
    assert speculating.speculator.num_accepted_tokens == num_accepted

    plain = _start(None)
    for token in emitted:
        _step(plain, [token])
    assert _state(speculating) == _state(plain)


def test_the_draft_fits_the_token_budget_and_max_tokens():
    scheduler = _scheduler(SpeculativeConfig(num_speculative_tokens=8), budget=3)
    scheduler.add_request(Request("r", list(PROMPT), SamplingParams(max_tokens=20, temperature=0, ignore_eos=True),
                                  seed=0))
    while not scheduler.requests["r"].sequences[0].output_token_ids:
        _step(scheduler, [3])
    plan, count = _step(scheduler, [4, 5, 6])
    assert count == 3 and plan.running_sequences[0].draft_token_ids == [4, 5]

    scheduler = _scheduler(SpeculativeConfig(num_speculative_tokens=8))
    request = Request("r", list(PROMPT), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), seed=0)
    scheduler.add_request(request)
    _step(scheduler, [3])
    plan, count = _step(scheduler, [4, 5])
    assert plan.running_sequences[0].draft_token_ids == [4]  # 2 outputs left: one draft + the bonus
    seq = request.sequences[0]
    assert seq.is_finished and seq.output_token_ids == [3, 4, 5]
    assert scheduler.kv_cache.num_free_blocks == 32


def test_speculative_false_and_excluded_samplers_never_draft():
    for params in (SamplingParams(max_tokens=20, temperature=0, speculative=False),
                   SamplingParams(max_tokens=20, temperature=1.0, mirostat_mode=2, mirostat_tau=3.0)):
        scheduler = _scheduler(SpeculativeConfig(num_speculative_tokens=4))
        scheduler.add_request(Request("r", list(PROMPT), params, seed=0))
        _step(scheduler, [3])
        plan, count = _step(scheduler, [4])
        assert count == 1 and plan.running_sequences[0].draft_token_ids == []
    assert not can_speculate(SamplingParams(guided_regex="[0-9]+"))
    assert not can_speculate(SamplingParams(temperature=0, use_beam_search=True, best_of=2))
    assert can_speculate(SamplingParams(temperature=0.7, repetition_penalty=1.2, dry_multiplier=0.8, logprobs=3))


def test_no_step_is_planned_ahead_while_a_draft_is_verified():
    scheduler = _start(SpeculativeConfig(num_speculative_tokens=4))
    plan = scheduler.schedule()
    assert plan.running_sequences[0].draft_token_ids
    assert scheduler.schedule_ahead() is None


def test_no_drafts_while_more_sequences_run_than_disable_by_batch_size():
    scheduler = _scheduler(SpeculativeConfig(num_speculative_tokens=4, disable_by_batch_size=2))
    for name in ("a", "b", "c"):
        scheduler.add_request(Request(name, list(PROMPT), SamplingParams(max_tokens=20, temperature=0,
                                                                         ignore_eos=True), seed=0))
    plan = scheduler.schedule()
    scheduler.apply_step_result(StepResult(plan.step_id, list(plan.num_scheduled_tokens), [3, 3, 3], [None] * 3))
    plan = scheduler.schedule()
    assert all(not running.draft_token_ids for running in plan.running_sequences)
    assert list(plan.num_scheduled_tokens.values()) == [1, 1, 1]
    scheduler.apply_step_result(StepResult(plan.step_id, list(plan.num_scheduled_tokens), [4, 4, 4], [None] * 3))
    assert scheduler.schedule_ahead() is not None  # nothing would draft: planning ahead goes on
