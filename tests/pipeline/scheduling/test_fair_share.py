"""Fair share between tenants under the priority policy: equal priorities are admitted by weighted
start-time fair queueing; a tenant under its seat share takes seats from one over it, never back;
fcfs ignores tenants."""

from pipeline.scheduling.fair_share import FairShare, request_cost
from tests.support.engine_sim import make_request, make_scheduler, run_step


def _tenant_request(request_id, tenant, weight=1.0, priority=0, first_token=1, max_tokens=2):
    request = make_request(request_id, prompt_len=4, max_tokens=max_tokens, first_token=first_token, priority=priority)
    request.tenant, request.tenant_weight = tenant, weight
    return request


def _admission_order(scheduler):
    """Request ids in the order they first got a step."""
    order, step = [], 0
    while scheduler.has_unfinished:
        plan = run_step(scheduler)
        for seq_id in plan.num_scheduled_tokens:
            request_id = scheduler.sequences[seq_id].request.request_id if seq_id in scheduler.sequences else None
            if request_id is not None and request_id not in order:
                order.append(request_id)
        step += 1
        assert step < 10_000
    return order


def _flood_then_few(policy="priority", weight_a=1.0, weight_b=1.0, num_a=150, num_b=10, **config):
    scheduler = make_scheduler(num_blocks=256, max_num_batched_tokens=16, max_num_seqs=2,
                               scheduling_policy=policy, **config)
    for index in range(num_a):
        scheduler.add_request(_tenant_request(f"a{index}", "alice", weight_a, first_token=index))
    for index in range(num_b):
        scheduler.add_request(_tenant_request(f"b{index}", "bob", weight_b, first_token=index + 200))
    return scheduler


def _admitted_before_last_b(order):
    last_b = max(index for index, request_id in enumerate(order) if request_id.startswith("b"))
    return sum(1 for request_id in order[:last_b] if request_id.startswith("a"))


def test_a_flooding_tenant_does_not_delay_another_beyond_its_share():
    order = _admission_order(_flood_then_few())
    # Equal weights: bob's 10 interleave with alice's 150, one for one.
    assert order[:6] == ["a0", "b0", "a1", "b1", "a2", "b2"]
    assert _admitted_before_last_b(order) <= 10


def test_a_tenant_arriving_behind_a_flood_starts_at_the_current_virtual_time():
    scheduler = _flood_then_few(num_b=0)
    for _ in range(40):  # alice alone for a while: she owes nothing for it
        run_step(scheduler)
    for index in range(10):
        scheduler.add_request(_tenant_request(f"b{index}", "bob", first_token=index + 200))
    waiting_a = {seq.request.request_id for seq in scheduler.waiting if seq.request.tenant == "alice"}
    order = [request_id for request_id in _admission_order(scheduler)
             if request_id.startswith("b") or request_id in waiting_a]
    assert _admitted_before_last_b(order) <= 11


def test_weights_three_to_one_admit_about_three_to_one():
    order = _admission_order(_flood_then_few(weight_a=3.0, num_b=20))
    contended = order[:order.index("b19") + 1]  # while both tenants had requests waiting
    num_a = sum(1 for request_id in contended if request_id.startswith("a"))
    assert 20 * 3 - 6 <= num_a <= 20 * 3 + 6


def test_fcfs_ignores_tenants():
    order = _admission_order(_flood_then_few(policy="fcfs", num_a=30, num_b=3))
    assert order == [f"a{i}" for i in range(30)] + ["b0", "b1", "b2"]


def test_priority_still_comes_before_fair_share():
    scheduler = make_scheduler(max_num_batched_tokens=16, max_num_seqs=1, scheduling_policy="priority")
    for index in range(5):
        scheduler.add_request(_tenant_request(f"a{index}", "alice", first_token=index))
    scheduler.add_request(_tenant_request("b_low", "bob", priority=1, first_token=50))
    order = _admission_order(scheduler)
    assert order[-1] == "b_low"  # bob's share does not lift a priority-1 request over priority 0


def test_a_tenant_under_its_seat_share_takes_seats_only_from_one_over_it():
    scheduler = make_scheduler(max_num_batched_tokens=64, max_num_seqs=4, scheduling_policy="priority")
    alice = [_tenant_request(f"a{index}", "alice", first_token=index, max_tokens=6) for index in range(8)]
    for request in alice:
        scheduler.add_request(request)
    run_step(scheduler)  # alice holds all 4 seats
    bob = [_tenant_request(f"b{index}", "bob", first_token=40 + index, max_tokens=6) for index in range(6)]
    for request in bob:
        scheduler.add_request(request)
    run_step(scheduler)
    running = [seq.request.tenant for seq in scheduler.running]
    assert running.count("bob") == 2 and running.count("alice") == 2  # shares of 4 seats: 2 and 2
    _admission_order(scheduler)
    # Bob's seats came from alice's newest sequences, never the reverse: no evictions in turn.
    assert all(seq.num_preemptions == 0 for request in bob for seq in request.sequences)
    assert 1 <= scheduler.num_preemptions <= 4
    assert sum(seq.num_preemptions for request in alice for seq in request.sequences) == scheduler.num_preemptions


def test_one_tenant_alone_never_preempts_itself_for_fairness():
    scheduler = make_scheduler(max_num_batched_tokens=64, max_num_seqs=2, scheduling_policy="priority")
    for index in range(6):
        scheduler.add_request(_tenant_request(f"a{index}", "alice", first_token=index))
    _admission_order(scheduler)
    assert scheduler.num_preemptions == 0


def test_requests_without_a_tenant_share_one_and_keep_arrival_order():
    scheduler = make_scheduler(max_num_batched_tokens=8, max_num_seqs=1, scheduling_policy="priority")
    for index in range(5):
        scheduler.add_request(make_request(f"r{index}", prompt_len=4, max_tokens=2, first_token=index * 7))
    assert _admission_order(scheduler) == [f"r{i}" for i in range(5)]


def test_cost_counts_prompt_and_capped_output_per_choice():
    assert request_cost(make_request("x", prompt_len=10, max_tokens=6)) == 16
    assert request_cost(make_request("y", prompt_len=10, max_tokens=6, n=2)) == 22
    assert request_cost(make_request("z", prompt_len=10, max_tokens=100_000)) == 10 + 1024


def test_idle_tenants_are_forgotten():
    share = FairShare()
    for index in range(100):
        share.tag(_tenant_request(f"t{index}", f"tenant{index}"))
    assert share.num_tenants == 100
    share.forget_idle(anything_waiting=False)
    assert share.num_tenants == 0
    late = _tenant_request("late", "tenant0")
    share.tag(late)
    assert late.virtual_start == share.virtual_time  # no debt carried over an idle queue


def test_a_request_preempted_by_aging_does_not_take_its_seat_back_at_equal_priority():
    # One seat. `short` ages past `long` and takes its seat; `long`, back in the queue with an earlier
    # arrival and virtual start, waits for the seat rather than evicting `short` in turn.
    scheduler = make_scheduler(max_num_batched_tokens=16, max_num_seqs=1, scheduling_policy="priority",
                               priority_aging_steps=4)
    scheduler.add_request(_tenant_request("long", "alice", max_tokens=30))
    run_step(scheduler)
    scheduler.add_request(_tenant_request("short", "bob", first_token=60))
    _admission_order(scheduler)
    assert scheduler.num_preemptions == 1


def test_prefill_order_shortest_admits_the_fewest_prompt_tokens_first():
    scheduler = make_scheduler(max_num_batched_tokens=64, max_num_seqs=1, scheduling_policy="priority",
                               prefill_order="shortest")
    for request_id, prompt_len in (("long", 20), ("short", 3), ("middle", 9)):
        scheduler.add_request(make_request(request_id, prompt_len=prompt_len, max_tokens=2, first_token=prompt_len))
    assert _admission_order(scheduler) == ["short", "middle", "long"]


def test_prefill_order_shortest_still_puts_priority_first():
    scheduler = make_scheduler(max_num_batched_tokens=64, max_num_seqs=1, scheduling_policy="priority",
                               prefill_order="shortest")
    scheduler.add_request(make_request("urgent-long", prompt_len=20, max_tokens=2, priority=-1))
    scheduler.add_request(make_request("short", prompt_len=3, max_tokens=2, first_token=50))
    assert _admission_order(scheduler) == ["urgent-long", "short"]


def test_prefill_order_burst_admits_one_steps_arrivals_fewest_prompt_tokens_first():
    scheduler = make_scheduler(max_num_batched_tokens=64, max_num_seqs=1, scheduling_policy="priority",
                               prefill_order="burst")
    for request_id, prompt_len in (("long", 20), ("short", 3), ("middle", 9), ("short-too", 3)):
        scheduler.add_request(make_request(request_id, prompt_len=prompt_len, max_tokens=2, first_token=prompt_len))
    assert _admission_order(scheduler) == ["short", "short-too", "middle", "long"]  # arrival breaks ties


def test_prefill_order_burst_never_puts_a_later_arrival_first():
    """Unlike "shortest": a prompt waiting since an earlier step keeps its place before later, shorter ones."""
    for order, expected in (("burst", ["running", "long", "short"]), ("shortest", ["running", "short", "long"])):
        scheduler = make_scheduler(max_num_batched_tokens=64, max_num_seqs=1, scheduling_policy="priority",
                                   prefill_order=order)
        scheduler.add_request(make_request("running", prompt_len=4, max_tokens=6, first_token=1))
        run_step(scheduler)
        scheduler.add_request(make_request("long", prompt_len=20, max_tokens=2, first_token=20))
        run_step(scheduler)  # "long" waits a step for the only seat
        scheduler.add_request(make_request("short", prompt_len=3, max_tokens=2, first_token=3))
        assert _admission_order(scheduler) == expected, order


def test_prefill_order_burst_keeps_each_tenants_share():
    """A step's arrivals from two tenants: each tenant's own come shortest first, at the places fair share
    gives its requests by their cost (alice's cost 5, 6, 7 tokens: starts 0, 5, 11; bob's 12, 13, 14:
    starts 0, 12, 25), as in arrival order."""
    scheduler = make_scheduler(num_blocks=256, max_num_batched_tokens=64, max_num_seqs=1,
                               scheduling_policy="priority", prefill_order="burst")
    for tenant, lengths in (("alice", (3, 4, 5)), ("bob", (12, 10, 11))):
        for length in lengths:
            request = make_request(f"{tenant}-{length}", prompt_len=length, max_tokens=2, first_token=length)
            request.tenant = tenant
            scheduler.add_request(request)
    assert _admission_order(scheduler) == ["alice-3", "bob-10", "alice-4", "alice-5", "bob-11", "bob-12"]


def test_an_aborted_arrival_is_not_tagged_by_burst_order():
    scheduler = make_scheduler(max_num_batched_tokens=64, max_num_seqs=1, scheduling_policy="priority",
                               prefill_order="burst")
    scheduler.add_request(make_request("gone", prompt_len=5, max_tokens=2))
    scheduler.abort_request("gone")
    run_step(scheduler)
    assert scheduler.waiting.fair_share.num_tenants == 0
