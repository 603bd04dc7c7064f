"""The actor graph plans step N + 1 while N runs (pipeline/scheduling/lookahead.py); its answers must be exactly
those of the plain step loop, through preemption, stop strings, EOS, seeds and cancels."""

from __future__ import annotations

import json

import pytest
from tqdm import tqdm

from actors.cli.batch import read_batch_file, run_embedded, run_offline
from pipeline.request.request import Request
from pipeline.request.sampling_params import SamplingParams
from pipeline.scheduling.kv_cache_manager import KVCacheManager
from pipeline.scheduling.scheduler import Scheduler
from pipeline.step.plan import PLACEHOLDER_TOKEN
from pipeline.step.result import StepResult
from pipeline.tensor_prep.prepare import TensorPrep
from tests.actors.cli.test_batch_offline import _assert_same_results
from tests.support.engine_helpers import make_engine

MIXED = {
    **{f"greedy-{i}": {"prompt": [(i * 53 + k * 7) % 4000 + 3 for k in range(20 + 9 * i)], "max_tokens": 24 + i,
                       "temperature": 0, "ignore_eos": True} for i in range(6)},
    "greedy-eos": {"prompt": "The river runs", "max_tokens": 40, "temperature": 0},
    "seeded-n2": {"prompt": "Water under", "max_tokens": 20, "n": 2, "temperature": 0.9, "top_p": 0.9, "seed": 11},
    "stop-string": {"prompt": "A bridge", "max_tokens": 40, "temperature": 0.8, "seed": 2, "stop": [" the", "e"]},
    "min-tokens": {"prompt": [4, 5, 6], "max_tokens": 12, "temperature": 1.0, "min_tokens": 6, "seed": 4,
                   "logprobs": 2},
    "penalties": {"prompt": [9, 10, 11, 12, 13], "max_tokens": 14, "temperature": 1.0, "top_k": 20,
                  "repetition_penalty": 1.3, "min_tokens": 4},
    "long-prompt": {"prompt": [(i * 37) % 4000 + 3 for i in range(200)], "max_tokens": 10, "ignore_eos": True,
                    "temperature": 0},
}


@pytest.fixture(scope="module")
def mixed_requests(tmp_path_factory):
    source = tmp_path_factory.mktemp("overlap") / "in.jsonl"
    source.write_text("\n".join(json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                                            "body": body}) for custom_id, body in MIXED.items()) + "\n")
    return [line.request for line in read_batch_file(source)]


async def test_graph_with_overlap_answers_as_the_step_loop(default_model_path, mixed_requests, monkeypatch):
    # 24 blocks of 16 tokens for up to 8 sequences of up to ~260 tokens: preemption is certain.
    engine = make_engine(default_model_path, num_kv_blocks=24, max_num_batched_tokens=96, max_num_seqs=8)
    ahead = {"plans": 0, "placeholders": 0}
    real_schedule_ahead = engine.scheduler.schedule_ahead

    def counting_schedule_ahead():
        plan = real_schedule_ahead()
        if plan is not None and not plan.is_empty:
            ahead["plans"] += 1
            ahead["placeholders"] += sum(seq.has_placeholder for seq in engine.scheduler.running)
        return plan

    monkeypatch.setattr(engine.scheduler, "schedule_ahead", counting_schedule_ahead)
    graph = await run_embedded(engine, mixed_requests, tqdm(disable=True))
    graph_preemptions = engine.scheduler.num_preemptions
    loop = run_offline(engine, mixed_requests, tqdm(disable=True))
    _assert_same_results(graph, loop)
    assert graph_preemptions > 0 and ahead["plans"] > 10 and ahead["placeholders"] > 0
    stopped = graph["batch-line-9"]["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] in (" the", "e")
    assert not engine.has_unfinished and engine.scheduler.kv_cache.pool.num_free_blocks == 24


# ---- the pipeline side, without a model ---------------------------------------------------------

def _scheduler(num_blocks: int = 16, block_size: int = 4) -> Scheduler:
    from pipeline.config import SchedulerConfig

    return Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4),
                     KVCacheManager(num_blocks, block_size), max_model_len=64)


def _request(request_id: str, prompt: list[int], max_tokens: int = 8, **params) -> Request:
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0, **params), seed=0,
                   eos_token_ids=frozenset({2}))


def test_a_planned_ahead_step_reads_the_previous_steps_token_from_the_device_thread():
    scheduler, prep = _scheduler(), TensorPrep(4, 64, 4)
    scheduler.add_request(_request("a", [5, 6, 7]))
    first = prep.prepare(scheduler.schedule())
    second_plan = scheduler.schedule_ahead()
    [seq] = scheduler.running
    assert seq.token_ids == [5, 6, 7, PLACEHOLDER_TOKEN] and second_plan.num_scheduled_tokens == {seq.seq_id: 1}
    second = prep.prepare(second_plan)
    assert second.inputs.input_ids.tolist() == [PLACEHOLDER_TOKEN] and second.inputs.positions.tolist() == [3]
    second.fill_placeholders({seq.seq_id: 9})  # what the device thread does with the first step's token
    assert second.inputs.input_ids.tolist() == [9]
    scheduler.apply_step_result(StepResult(first.plan.step_id, [seq.seq_id], [9], [None]))
    assert seq.token_ids == [5, 6, 7, 9] and not seq.has_placeholder
    third = prep.prepare(scheduler.schedule_ahead())  # the batch learns the real token in the next plan
    assert prep.batch.token_ids[prep.batch.row_of[seq.seq_id], :5].tolist() == [5, 6, 7, 9, PLACEHOLDER_TOKEN]
    assert third.placeholder_seq_ids == [seq.seq_id]


def test_a_block_is_offered_to_the_prefix_cache_only_once_its_placeholder_is_known():
    scheduler = _scheduler(block_size=4)
    scheduler.add_request(_request("a", [5, 6, 7]))
    scheduler.schedule()
    scheduler.schedule_ahead()  # block 0 = [5, 6, 7, P] is full but not known
    [seq] = scheduler.running
    assert seq.num_published_blocks == 0
    scheduler.apply_step_result(StepResult(0, [seq.seq_id], [9], [None]))
    scheduler.apply_step_result(StepResult(1, [seq.seq_id], [10], [None]))
    scheduler.schedule()
    assert seq.num_published_blocks == 1 and seq.block_hashes[0] == hash((hash(("aqueduct-root", None)),
                                                                          (5, 6, 7, 9)))


def test_a_sequence_that_stops_drops_its_placeholder_and_the_wasted_token():
    scheduler = _scheduler()
    request = _request("a", [5, 6, 7])
    scheduler.add_request(request)
    scheduler.schedule()
    scheduler.schedule_ahead()
    [seq] = scheduler.running
    events = scheduler.apply_step_result(StepResult(0, [seq.seq_id], [2], [None]))  # EOS
    assert events[0].finish_reason == "stop" and seq.token_ids == [5, 6, 7, 2]
    assert scheduler.apply_step_result(StepResult(1, [seq.seq_id], [8], [None])) == []
    assert scheduler.kv_cache.pool.num_free_blocks == 16


def test_nothing_is_planned_ahead_for_sampling_that_reads_the_last_token_or_a_sure_finish():
    scheduler = _scheduler()
    scheduler.add_request(_request("pen", [5, 6, 7], repetition_penalty=1.2))
    scheduler.schedule()
    assert scheduler.schedule_ahead() is None and not scheduler.running[0].has_placeholder
    other = _scheduler()
    other.add_request(_request("last", [5, 6, 7], max_tokens=1))
    other.schedule()
    assert other.schedule_ahead().is_empty and not other.running[0].has_placeholder


def test_nothing_is_planned_ahead_of_a_long_step_where_a_limit_is_set():
    for limit, planned_ahead in ((None, True), (8, False)):
        scheduler = _scheduler(num_blocks=32)
        scheduler.plan_ahead_max_tokens = limit
        scheduler.add_request(_request("long", list(range(3, 23))))  # a 20-token prefill step
        scheduler.schedule()
        assert (scheduler.schedule_ahead() is not None) is planned_ahead
    short = _scheduler()
    short.plan_ahead_max_tokens = 8
    short.add_request(_request("short", [5, 6, 7]))
    short.schedule()
    assert short.schedule_ahead() is not None  # a 3-token step: planned ahead as ever
