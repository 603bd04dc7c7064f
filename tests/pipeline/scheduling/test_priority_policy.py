"""The priority scheduling policy: lower priority first, ties in arrival order, the least urgent
preempted first, a waiting urgent request taking a less urgent one's place, aging against starvation."""

import pytest

from pipeline.config import SchedulerConfig
from pipeline.request.request import FinishReason
from tests.support.engine_sim import make_request, make_scheduler, run_step, run_to_completion


def _run_recording_firsts(scheduler, ids):
    seen = {}
    step = 0
    while scheduler.has_unfinished:
        plan = run_step(scheduler)
        for request_id in ids:
            request = scheduler.requests.get(request_id)
            if request is not None and any(seq.seq_id in plan.num_scheduled_tokens for seq in request.sequences):
                seen.setdefault(request_id, step)
        step += 1
        assert step < 10_000
    return seen


def test_more_urgent_waiting_requests_start_first():
    scheduler = make_scheduler(max_num_batched_tokens=8, max_num_seqs=1, scheduling_policy="priority")
    for index, priority in enumerate([5, 0, 3, 0, -1]):
        scheduler.add_request(make_request(f"r{index}", prompt_len=4, max_tokens=2, first_token=index * 7,
                                           priority=priority))
    firsts = _run_recording_firsts(scheduler, [f"r{i}" for i in range(5)])
    order = sorted(firsts, key=firsts.get)
    assert order == ["r4", "r1", "r3", "r2", "r0"]  # -1, then the two 0s in arrival order, 3, 5


def test_fcfs_ignores_priority():
    scheduler = make_scheduler(max_num_batched_tokens=8, max_num_seqs=1, scheduling_policy="fcfs")
    for index, priority in enumerate([5, 0, -1]):
        scheduler.add_request(make_request(f"r{index}", prompt_len=4, max_tokens=2, first_token=index * 7,
                                           priority=priority))
    firsts = _run_recording_firsts(scheduler, ["r0", "r1", "r2"])
    assert sorted(firsts, key=firsts.get) == ["r0", "r1", "r2"]


def test_urgent_arrival_takes_the_seat_of_the_least_urgent_running_request():
    scheduler = make_scheduler(max_num_batched_tokens=64, max_num_seqs=2, scheduling_policy="priority")
    scheduler.add_request(make_request("bulk_a", prompt_len=4, max_tokens=20, priority=10))
    scheduler.add_request(make_request("bulk_b", prompt_len=4, max_tokens=20, first_token=9, priority=5))
    run_step(scheduler)
    assert len(scheduler.running) == 2
    scheduler.add_request(make_request("urgent", prompt_len=4, max_tokens=3, first_token=30, priority=0))
    plan = run_step(scheduler)
    urgent = scheduler.requests["urgent"].sequences[0]
    bulk_a = scheduler.requests["bulk_a"].sequences[0]
    assert urgent.seq_id in plan.num_scheduled_tokens
    assert bulk_a.num_preemptions == 1  # priority 10 made room, not priority 5
    assert scheduler.num_preemptions == 1
    run_to_completion(scheduler)
    for request_id in ("bulk_a", "bulk_b", "urgent"):
        assert scheduler.sequences.get(request_id) is None
    assert bulk_a.finish_reason is FinishReason.LENGTH and bulk_a.num_output_tokens == 20


def test_out_of_blocks_preempts_the_least_urgent_not_the_newest():
    # 10 blocks of 4 tokens; each request grows to 4 blocks. The newest (r2) is the most urgent.
    scheduler = make_scheduler(num_blocks=10, block_size=4, max_num_batched_tokens=64, prefix_caching=False,
                               scheduling_policy="priority")
    requests = [make_request(f"r{i}", prompt_len=8, max_tokens=8, first_token=i * 13, priority=p)
                for i, p in enumerate([3, 7, 0])]
    for request in requests:
        scheduler.add_request(request)
    first_victim = None
    while scheduler.has_unfinished:
        run_step(scheduler)
        preempted = [request.request_id for request in requests if request.sequences[0].num_preemptions]
        first_victim = first_victim or (preempted[0] if preempted else None)
    assert first_victim == "r1"  # priority 7, not the newest (r2, priority 0)
    assert requests[2].sequences[0].num_preemptions == 0
    for request in requests:
        assert request.sequences[0].num_output_tokens == 8


def test_a_waiting_urgent_request_frees_blocks_held_by_a_less_urgent_one():
    # 6 blocks of 4: the bulk request holds 4 (16 tokens); the urgent one needs 3.
    scheduler = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64, prefix_caching=False,
                               scheduling_policy="priority")
    scheduler.add_request(make_request("bulk", prompt_len=16, max_tokens=4, priority=10))
    run_step(scheduler)
    scheduler.add_request(make_request("urgent", prompt_len=12, max_tokens=2, first_token=40, priority=-5))
    plan = run_step(scheduler)
    urgent = scheduler.requests["urgent"].sequences[0]
    bulk = scheduler.requests["bulk"].sequences[0]
    assert plan.num_scheduled_tokens.get(urgent.seq_id) == 12
    assert bulk.num_preemptions == 1 and bulk.seq_id in plan.removed_seq_ids
    run_to_completion(scheduler)
    assert bulk.num_output_tokens == 4 and urgent.num_output_tokens == 2


def test_equal_priorities_never_preempt_for_admission():
    scheduler = make_scheduler(max_num_batched_tokens=64, max_num_seqs=1, scheduling_policy="priority")
    scheduler.add_request(make_request("first", prompt_len=4, max_tokens=5))
    run_step(scheduler)
    scheduler.add_request(make_request("second", prompt_len=4, max_tokens=5, first_token=20))
    run_to_completion(scheduler)
    assert scheduler.num_preemptions == 0


def test_aging_bounds_the_wait_of_a_low_priority_request():
    # One seat; a priority-3 request waits while priority-0 requests keep arriving. With aging every
    # 4 steps it starts once it has waited 3 x 4 steps and its aged priority reaches 0 ... and wins
    # the tie with any later 0 by arrival.
    scheduler = make_scheduler(max_num_batched_tokens=8, max_num_seqs=1, scheduling_policy="priority",
                               priority_aging_steps=4)
    scheduler.add_request(make_request("low", prompt_len=4, max_tokens=1, priority=3))
    scheduler.add_request(make_request("u0", prompt_len=4, max_tokens=1, first_token=50, priority=0))
    started = None
    for step in range(60):
        scheduler.add_request(make_request(f"u{step + 1}", prompt_len=4, max_tokens=1, first_token=step,
                                           priority=0))
        plan = run_step(scheduler)
        low = scheduler.requests.get("low")
        if low is None or low.sequences[0].seq_id in plan.num_scheduled_tokens:
            started = step
            break
    assert started is not None and started <= 3 * 4 + 1


def test_without_aging_the_low_priority_request_waits_behind_the_stream():
    scheduler = make_scheduler(max_num_batched_tokens=8, max_num_seqs=1, scheduling_policy="priority",
                               priority_aging_steps=10_000)
    scheduler.add_request(make_request("low", prompt_len=4, max_tokens=1, priority=3))
    for step in range(30):
        scheduler.add_request(make_request(f"u{step}", prompt_len=4, max_tokens=1, first_token=step, priority=0))
        plan = run_step(scheduler)
        assert scheduler.requests["low"].sequences[0].seq_id not in plan.num_scheduled_tokens


def test_policy_is_validated():
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        SchedulerConfig(scheduling_policy="lifo")


def test_bulk_prefill_takes_at_most_its_share_of_a_step_and_others_are_not_held():
    """Priority > 0 prompts share max_bulk_prefill_tokens a step (so a bulk step stays short); a
    priority-0 prompt and every decode take the rest of the budget as before."""
    scheduler = make_scheduler(max_num_batched_tokens=256, max_num_seqs=8, scheduling_policy="priority",
                               max_bulk_prefill_tokens=24)
    for index in range(3):
        scheduler.add_request(make_request(f"bulk{index}", prompt_len=20, max_tokens=4, first_token=index * 20,
                                           priority=10))
    scheduler.add_request(make_request("normal", prompt_len=60, max_tokens=4, first_token=100))
    plan = run_step(scheduler)
    tokens = {request_id: sum(plan.num_scheduled_tokens.get(seq.seq_id, 0)
                              for seq in scheduler.requests[request_id].sequences)
              for request_id in ("normal", "bulk0", "bulk1", "bulk2")}
    assert tokens["normal"] == 60  # the whole prompt: not bulk
    assert tokens["bulk0"] + tokens["bulk1"] + tokens["bulk2"] == 24  # 20 + 4, the third none
    assert tokens["bulk2"] == 0
    run_to_completion(scheduler)
    for request_id in tokens:
        assert scheduler.requests.get(request_id) is None


def test_fcfs_does_not_cap_bulk_prefill():
    scheduler = make_scheduler(max_num_batched_tokens=256, max_num_seqs=8, scheduling_policy="fcfs",
                               max_bulk_prefill_tokens=24)
    for index in range(3):
        scheduler.add_request(make_request(f"bulk{index}", prompt_len=20, max_tokens=4, first_token=index * 20,
                                           priority=10))
    plan = run_step(scheduler)
    assert sum(plan.num_scheduled_tokens.values()) == 60
