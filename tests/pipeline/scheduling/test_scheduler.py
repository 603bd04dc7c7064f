import pytest

from pipeline.request.request import FinishReason, SequenceStatus
from tests.support.engine_sim import make_request, make_scheduler, run_step, run_to_completion


def _check_block_accounting(scheduler):
    pool = scheduler.kv_cache.pool
    live = [seq for seq in scheduler.sequences.values()]
    owned = sum(len(seq.block_ids) for seq in live)
    assert int(pool.ref_counts.sum()) == owned
    assert pool.num_free_blocks == int((pool.ref_counts == 0).sum())


def test_long_prompt_is_chunked_under_the_token_budget():
    scheduler = make_scheduler(max_num_batched_tokens=16)
    scheduler.add_request(make_request("long", prompt_len=50, max_tokens=3))
    plans = run_to_completion(scheduler)
    chunks = [plan.total_num_scheduled_tokens for plan in plans]
    assert chunks == [16, 16, 16, 2, 1, 1]


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_long_prefill_token_threshold_caps_each_prompt_chunk_and_leaves_the_budget_to_others(policy):
    """vLLM's long_prefill_token_threshold: no sequence computes more than 12 prompt tokens a step, so
    the short prompt behind the long one is not kept waiting for the long one's whole prompt."""
    scheduler = make_scheduler(max_num_batched_tokens=32, num_blocks=64, long_prefill_token_threshold=12,
                               scheduling_policy=policy, prefill_order="arrival")
    scheduler.add_request(make_request("long", prompt_len=30, max_tokens=2))
    scheduler.add_request(make_request("short", prompt_len=8, max_tokens=2, first_token=50))
    long_seq = scheduler.requests["long"].sequences[0]
    short_seq = scheduler.requests["short"].sequences[0]
    first = run_step(scheduler)
    assert first.num_scheduled_tokens == {long_seq.seq_id: 12, short_seq.seq_id: 8}
    assert [run_step(scheduler).num_scheduled_tokens[long_seq.seq_id] for _ in range(2)] == [12, 6]
    run_to_completion(scheduler)
    assert long_seq.num_output_tokens == 2 and short_seq.num_output_tokens == 2
    _check_block_accounting(scheduler)


def test_without_the_threshold_the_first_prompt_takes_the_budget():
    scheduler = make_scheduler(max_num_batched_tokens=32, num_blocks=64, prefill_order="arrival")
    scheduler.add_request(make_request("long", prompt_len=30, max_tokens=2))
    scheduler.add_request(make_request("short", prompt_len=8, max_tokens=2, first_token=50))
    first = run_step(scheduler)
    assert first.num_scheduled_tokens == {scheduler.requests["long"].sequences[0].seq_id: 30,
                                          scheduler.requests["short"].sequences[0].seq_id: 2}


def test_decodes_keep_running_beside_a_chunked_prefill():
    scheduler = make_scheduler(max_num_batched_tokens=16, prefix_caching=False)
    scheduler.add_request(make_request("short", prompt_len=4, max_tokens=10))
    run_step(scheduler)  # prefill of "short"; it now decodes
    scheduler.add_request(make_request("long", prompt_len=40, first_token=50))
    plan = run_step(scheduler)
    short, long = (scheduler.requests[r].sequences[0] for r in ("short", "long"))
    assert plan.num_scheduled_tokens == {short.seq_id: 1, long.seq_id: 15}
    plan = run_step(scheduler)
    assert plan.num_scheduled_tokens == {short.seq_id: 1, long.seq_id: 15}


def test_budget_and_sequence_cap_hold_every_step():
    scheduler = make_scheduler(max_num_batched_tokens=20, max_num_seqs=3)
    for i in range(7):
        scheduler.add_request(make_request(f"r{i}", prompt_len=5 + 3 * i, max_tokens=4, first_token=i * 11))
    for plan in run_to_completion(scheduler):
        assert plan.total_num_scheduled_tokens <= 20
        assert len(plan.num_scheduled_tokens) <= 3


def test_out_of_blocks_preempts_the_newest_and_resumes_it():
    # 10 blocks of 4 tokens; each request needs up to 4 blocks (8 prompt + 8 output tokens).
    scheduler = make_scheduler(num_blocks=10, block_size=4, max_num_batched_tokens=64, prefix_caching=False)
    requests = [make_request(f"r{i}", prompt_len=8, max_tokens=8, first_token=i * 13) for i in range(3)]
    for request in requests:
        scheduler.add_request(request)
    run_step(scheduler)
    assert len(scheduler.running) == 3
    preempted_at = None
    for step in range(100):
        plan = run_step(scheduler)
        _check_block_accounting(scheduler)
        if plan.removed_seq_ids and preempted_at is None:
            preempted_at = step
            victim = requests[2].sequences[0]
            assert plan.removed_seq_ids == [victim.seq_id]
            assert victim.status is SequenceStatus.WAITING or victim.status is SequenceStatus.PREEMPTED
            assert victim.num_computed_tokens == 0 and victim.block_ids == []
        if not scheduler.has_unfinished:
            break
    assert preempted_at is not None
    assert scheduler.num_preemptions >= 1
    for request in requests:
        seq = request.sequences[0]
        assert seq.finish_reason is FinishReason.LENGTH and seq.num_output_tokens == 8
    assert scheduler.kv_cache.num_free_blocks == 10


def test_preempted_sequence_keeps_its_tokens_and_recomputes_them():
    scheduler = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64, prefix_caching=False)
    a = make_request("a", prompt_len=8, max_tokens=8)
    b = make_request("b", prompt_len=8, max_tokens=8, first_token=40)
    scheduler.add_request(a)
    scheduler.add_request(b)
    outputs_before = None
    while scheduler.has_unfinished:
        plan = run_step(scheduler)
        seq_b = b.sequences[0]
        if seq_b.seq_id in plan.removed_seq_ids and not seq_b.is_finished:
            outputs_before = list(seq_b.output_token_ids)
        if outputs_before is not None and seq_b.seq_id in {n.seq_id for n in plan.new_sequences}:
            new = next(n for n in plan.new_sequences if n.seq_id == seq_b.seq_id)
            assert new.token_ids[8:] == outputs_before  # resumes with prompt + outputs so far
            assert new.num_computed_tokens == 0
    assert outputs_before is not None
    assert b.sequences[0].num_output_tokens == 8


def test_prefix_cache_hit_skips_cached_blocks():
    scheduler = make_scheduler(block_size=4)
    scheduler.add_request(make_request("a", prompt_len=13, max_tokens=1))
    run_to_completion(scheduler)
    scheduler.add_request(make_request("b", prompt_len=13, max_tokens=1))
    plan = run_step(scheduler)
    [new] = plan.new_sequences
    assert new.num_computed_tokens == 12 and plan.total_num_scheduled_tokens == 1
    assert scheduler.requests.get("b") is None  # finished after its one token
    _check_block_accounting(scheduler)


def test_prompt_that_cannot_fit_is_rejected():
    scheduler = make_scheduler(max_model_len=32)
    with pytest.raises(ValueError, match="limit is 31"):
        scheduler.add_request(make_request("x", prompt_len=32))


def test_sequences_stop_at_max_model_len():
    scheduler = make_scheduler(max_model_len=20)
    request = make_request("x", prompt_len=15, max_tokens=100)
    scheduler.add_request(request)
    run_to_completion(scheduler)
    seq = request.sequences[0]
    assert seq.num_tokens == 20 and seq.finish_reason is FinishReason.LENGTH


def test_stop_tokens_respect_min_tokens():
    scheduler = make_scheduler()
    request = make_request("x", prompt_len=4, max_tokens=10, stop_token_ids=[7], min_tokens=2)
    scheduler.add_request(request)
    scheduler.schedule()
    seq = request.sequences[0]
    scheduler.append_token(seq, 7)  # output position 0 < min_tokens: does not stop
    scheduler.append_token(seq, 7)  # position 1 < min_tokens
    assert not seq.is_finished
    scheduler.append_token(seq, 7)
    assert seq.finish_reason is FinishReason.STOP and seq.stop_reason == 7


def test_abort_frees_blocks():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("x", prompt_len=10, max_tokens=50))
    run_step(scheduler)
    scheduler.abort_request("x")
    assert scheduler.kv_cache.num_free_blocks == scheduler.kv_cache.pool.num_blocks
    assert not scheduler.has_unfinished
