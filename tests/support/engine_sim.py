"""A model-free driver for scheduler tests: 'samples' a deterministic token for every sequence
whose scheduled tokens reach its end, exactly as the engine would after a forward pass."""

from __future__ import annotations

from pipeline.config import SchedulerConfig
from pipeline.request.request import Request
from pipeline.request.sampling_params import SamplingParams
from pipeline.scheduling.kv_cache_manager import KVCacheManager
from pipeline.scheduling.scheduler import Scheduler
from pipeline.step.plan import StepPlan


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_num_batched_tokens: int = 32,
                   max_num_seqs: int = 8, max_model_len: int = 256, prefix_caching: bool = True,
                   **policy: object) -> Scheduler:
    """`policy`: scheduling_policy, priority_aging_steps (SchedulerConfig's defaults otherwise)."""
    kv = KVCacheManager(num_blocks, block_size, prefix_caching)
    config = SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                             **policy)  # type: ignore[arg-type]
    return Scheduler(config, kv, max_model_len)


def make_request(request_id: str, prompt_len: int, max_tokens: int = 8, first_token: int = 1,
                 priority: int = 0, **params: object) -> Request:
    prompt = [(first_token + i) % 97 + 3 for i in range(prompt_len)]
    sampling = SamplingParams(**{"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0, **params})
    return Request(request_id=request_id, prompt_token_ids=prompt, params=sampling, seed=0, priority=priority)


def fake_token(seq_id: int, position: int) -> int:
    return (seq_id * 31 + position * 7) % 89 + 5


def run_step(scheduler: Scheduler) -> StepPlan:
    """Schedule one step and append a token to every sequence that completed its known tokens."""
    plan = scheduler.schedule()
    for seq_id in plan.num_scheduled_tokens:
        seq = scheduler.sequences[seq_id]
        if seq.num_computed_tokens == seq.num_tokens:
            scheduler.append_token(seq, fake_token(seq.seq_id, seq.num_tokens))
    return plan


def run_to_completion(scheduler: Scheduler, max_steps: int = 10_000) -> list[StepPlan]:
    plans = []
    while scheduler.has_unfinished:
        plans.append(run_step(scheduler))
        assert len(plans) < max_steps, "scheduler made no progress"
    return plans
