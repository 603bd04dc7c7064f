"""Tenants' shares of a step (pipeline/scheduling/tenant_shares.py): the tenant holding the most seats
(then the most work) is held to half the busiest other's tokens (at least the floor, at most what the
others leave of the budget), its decode rows in turn; nobody is held with one tenant or with the
shares off."""

import itertools

from pipeline.scheduling.tenant_shares import seat_shares
from tests.support.engine_sim import make_request, make_scheduler, run_step

_FIRST_TOKENS = itertools.count(0, 13)  # 13 is prime to make_request's 97: no two prompts alike, so no cache hits


def _request(request_id, tenant, prompt_len=4, max_tokens=40, weight=1.0, **params):
    request = make_request(request_id, prompt_len=prompt_len, max_tokens=max_tokens,
                           first_token=next(_FIRST_TOKENS) % 97, **params)
    request.tenant, request.tenant_weight = tenant, weight
    return request


def _decoding(scheduler, tenant_counts, **request_args):
    """Each tenant's requests added in turn, each tenant's prompts computed in the step after (a
    later tenant's prompts are within the first one's level), then one step more: all decoding."""
    for tenant, count in tenant_counts.items():
        for index in range(count):
            scheduler.add_request(_request(f"{tenant}{index}", tenant, **request_args))
        run_step(scheduler)
    run_step(scheduler)
    assert all(seq.num_computed_tokens + 1 == seq.num_tokens for seq in scheduler.running)
    assert not scheduler.waiting


def _rows_by_tenant(scheduler, plan):
    rows = {}
    for seq_id in plan.num_scheduled_tokens:
        tenant = scheduler.sequences[seq_id].request.tenant
        rows[tenant] = rows.get(tenant, 0) + 1
    return rows


def test_the_busiest_tenant_is_held_to_half_the_next_ones_level_and_its_rows_take_turns():
    scheduler = make_scheduler(num_blocks=512, max_num_batched_tokens=256, max_num_seqs=32,
                               scheduling_policy="priority", fair_step_tokens=2)
    _decoding(scheduler, {"alice": 20, "bob": 6})
    stepped = {seq.seq_id: 0 for seq in scheduler.running if seq.request.tenant == "alice"}
    assert len(stepped) == 20
    for _ in range(14):
        plan = run_step(scheduler)
        assert _rows_by_tenant(scheduler, plan) == {"alice": 3, "bob": 6}
        for seq_id in plan.num_scheduled_tokens:
            if seq_id in stepped:
                stepped[seq_id] += 1
    assert min(stepped.values()) >= 2 and max(stepped.values()) <= 3  # 42 rows over 20 sequences, in turn


def test_weights_scale_the_level():
    scheduler = make_scheduler(num_blocks=512, max_num_batched_tokens=256, max_num_seqs=32,
                               scheduling_policy="priority", fair_step_tokens=1)
    for index in range(20):
        scheduler.add_request(_request(f"a{index}", "alice", weight=2.0))
    run_step(scheduler)
    for index in range(4):
        scheduler.add_request(_request(f"b{index}", "bob"))
    for _ in range(3):
        run_step(scheduler)
    assert _rows_by_tenant(scheduler, run_step(scheduler)) == {"alice": 4, "bob": 4}  # 2 x 4 x 1/2


def test_the_floor_keeps_a_busy_tenant_moving_beside_a_single_request():
    scheduler = make_scheduler(num_blocks=512, max_num_batched_tokens=256, max_num_seqs=32,
                               scheduling_policy="priority", fair_step_tokens=8)
    _decoding(scheduler, {"alice": 20, "bob": 1})
    assert _rows_by_tenant(scheduler, run_step(scheduler)) == {"alice": 8, "bob": 1}


def test_a_newcomers_prefill_beside_a_decoding_tenant_is_not_held():
    scheduler = make_scheduler(num_blocks=512, max_num_batched_tokens=256, max_num_seqs=32,
                               scheduling_policy="priority", fair_step_tokens=4)
    _decoding(scheduler, {"alice": 12})
    scheduler.add_request(_request("long", "bob", prompt_len=61))
    plan = run_step(scheduler)
    bob = next(seq for seq in scheduler.running if seq.request.tenant == "bob")
    assert plan.num_scheduled_tokens[bob.seq_id] == 61  # alice holds the seats: she is the one held,
    assert _rows_by_tenant(scheduler, plan)["alice"] == 12  # to half bob's 61, which her 12 rows are within


def test_the_tenant_holding_more_seats_is_held_even_with_less_work():
    scheduler = make_scheduler(num_blocks=512, max_num_batched_tokens=256, max_num_seqs=32,
                               scheduling_policy="priority", fair_step_tokens=2)
    _decoding(scheduler, {"alice": 20, "bob": 2})
    scheduler.add_request(_request("bob-long", "bob", prompt_len=40))
    plan = run_step(scheduler)
    tokens = {}
    for seq_id, count in plan.num_scheduled_tokens.items():
        tenant = scheduler.sequences[seq_id].request.tenant
        tokens[tenant] = tokens.get(tenant, 0) + count
    assert tokens == {"alice": 20, "bob": 42}  # bob's 42 set the level: alice's 20 rows are within half of it
    plan = run_step(scheduler)
    assert _rows_by_tenant(scheduler, plan) == {"alice": 2, "bob": 3}  # decoding again: alice held to the floor


def test_the_busiest_leaves_the_budget_to_the_others_work():
    scheduler = make_scheduler(num_blocks=512, max_num_batched_tokens=64, max_num_seqs=32,
                               scheduling_policy="priority", fair_step_tokens=4)
    for index in range(20):  # 400 prompt tokens waiting
        scheduler.add_request(_request(f"a{index}", "alice", prompt_len=20))
    for index in range(3):  # 60: half their level (30) would not fit beside them in a budget of 64
        scheduler.add_request(_request(f"b{index}", "bob", prompt_len=20))
    plan = run_step(scheduler)
    tokens = {}
    for seq_id, count in plan.num_scheduled_tokens.items():
        tenant = scheduler.sequences[seq_id].request.tenant
        tokens[tenant] = tokens.get(tenant, 0) + count
    assert tokens == {"alice": 4, "bob": 60}  # the floor, and bob's prompts whole


def test_no_shares_with_one_tenant_or_when_off():
    alone = make_scheduler(num_blocks=512, max_num_batched_tokens=256, max_num_seqs=32,
                           scheduling_policy="priority", fair_step_tokens=1)
    _decoding(alone, {"alice": 20})
    assert _rows_by_tenant(alone, run_step(alone)) == {"alice": 20}
    off = make_scheduler(num_blocks=512, max_num_batched_tokens=256, max_num_seqs=32,
                         scheduling_policy="priority", fair_step_tokens=None)
    _decoding(off, {"alice": 20, "bob": 3})
    assert _rows_by_tenant(off, run_step(off)) == {"alice": 20, "bob": 3}


def test_every_request_of_both_tenants_completes_with_all_its_tokens():
    scheduler = make_scheduler(num_blocks=512, max_num_batched_tokens=64, max_num_seqs=8,
                               scheduling_policy="priority", fair_step_tokens=2)
    requests = [_request(f"a{index}", "alice", prompt_len=9, max_tokens=12) for index in range(30)]
    requests += [_request(f"b{index}", "bob", prompt_len=21, max_tokens=7) for index in range(5)]
    for request in requests:
        scheduler.add_request(request)
    for _ in range(5000):
        if not scheduler.has_unfinished:
            break
        run_step(scheduler)
    assert not scheduler.has_unfinished
    assert all(seq.num_output_tokens == request.params.max_tokens
               for request in requests for seq in request.sequences)


def test_seat_shares_split_the_seats_by_weight():
    scheduler = make_scheduler(num_blocks=512, max_num_batched_tokens=256, max_num_seqs=12,
                               scheduling_policy="priority", fair_step_tokens=None)
    _decoding(scheduler, {"alice": 12})
    for index in range(5):
        scheduler.add_request(_request(f"b{index}", "bob", weight=2.0))
    shares = seat_shares(scheduler.running, scheduler.waiting, 12)
    assert shares.excess == {"alice": 8} and shares.room == {"bob": 8}  # shares of 12: 4 and 8
    run_step(scheduler)
    tenants = [seq.request.tenant for seq in scheduler.running]
    assert tenants.count("bob") == 5 and tenants.count("alice") == 7


def test_a_more_urgent_request_of_a_tenant_over_its_share_is_not_held_back_by_seats():
    scheduler = make_scheduler(num_blocks=512, max_num_batched_tokens=256, max_num_seqs=4,
                               scheduling_policy="priority", fair_step_tokens=None)
    _decoding(scheduler, {"alice": 4})
    for index in range(2):
        scheduler.add_request(_request(f"b{index}", "bob"))
    urgent = _request("urgent", "alice", priority=-1)
    scheduler.add_request(urgent)
    run_step(scheduler)
    assert "urgent" in {seq.request.request_id for seq in scheduler.running}  # priority first
    run_step(scheduler)
    running = {seq.request.request_id for seq in scheduler.running}
    assert "urgent" in running and {"b0", "b1"} <= running  # then bob's seat share, from alice's others
