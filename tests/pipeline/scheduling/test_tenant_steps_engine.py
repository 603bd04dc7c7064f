"""Tenants sharing steps on a real model: with seats taken from a flooding tenant and its decode rows
held to another's level (tenant_shares.py), every answer is what the same requests get with one tenant,
through the actor graph that plans steps ahead and through the plain step loop."""

from __future__ import annotations

import dataclasses

from tqdm import tqdm

from actors.cli.batch import run_embedded, run_offline
from queue_adapters.codec import WireRequest
from tests.actors.cli.test_batch_offline import _assert_same_results
from tests.support.engine_helpers import make_engine


def _requests(tenants: bool) -> list[WireRequest]:
    flood = [WireRequest(id=f"flood-{i}", prompt_token_ids=[(i * 41 + k * 5) % 3000 + 3 for k in range(12 + i)],
                         params={"max_tokens": 20 + i % 5, "temperature": 0, "ignore_eos": True},
                         tenant="flood" if tenants else None) for i in range(14)]
    few = [WireRequest(id=f"few-{i}", prompt_token_ids=[(i * 17 + k * 3) % 3000 + 3 for k in range(30)],
                       params={"max_tokens": 16, "temperature": 0.9, "seed": i, "ignore_eos": True},
                       tenant="few" if tenants else None) for i in range(3)]
    return flood + few


def _engine_counting_held_steps(model_path):
    """An engine of 8 seats, tenants held to each other's level from 2 tokens on, whose scheduler counts
    the steps in which the flood was held below the tokens it could have used."""
    engine = make_engine(model_path, max_num_batched_tokens=64, max_num_seqs=8)
    engine.scheduler.config = dataclasses.replace(engine.scheduler.config, fair_step_tokens=2)
    held = {"steps": 0}
    schedule = engine.scheduler.schedule

    def counting_schedule():
        plan = schedule()
        shares = engine.scheduler._step_shares
        held["steps"] += shares is not None and "flood" in shares.tokens_left
        return plan

    engine.scheduler.schedule = counting_schedule
    return engine, held


async def test_two_tenants_get_the_answers_of_one(default_model_path):
    one_tenant = run_offline(make_engine(default_model_path, max_num_batched_tokens=64, max_num_seqs=8),
                             _requests(tenants=False), tqdm(disable=True))
    engine, held = _engine_counting_held_steps(default_model_path)
    shared = await run_embedded(engine, _requests(tenants=True), tqdm(disable=True))
    _assert_same_results(shared, one_tenant)
    assert held["steps"] > 0  # the flood was held while the few ran
    loop_engine, loop_held = _engine_counting_held_steps(default_model_path)
    loop = run_offline(loop_engine, _requests(tenants=True), tqdm(disable=True))
    _assert_same_results(loop, one_tenant)
    assert loop_held["steps"] > 0
