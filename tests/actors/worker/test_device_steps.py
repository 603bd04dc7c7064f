"""The device thread's steps (actors/worker/stages.py DeviceSteps): a step's result is held back until the
next queued step's layers start, handed over at once when no step is queued behind it, and never
lost when a step fails."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from actors.worker import stages
from actors.worker.stages import DeviceSteps


class _Decoder:
    on_layers_start = None


class _Runner:
    """execute() starts the layers (as NativeDecoder does), noting which results were out by then."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.native_decoder = _Decoder()
        self.fail_on = fail_on
        self.calls = 0
        self.watched: list[Future] = []
        self.out_when_layers_started: list[list[bool]] = []

    def execute(self, inputs: object) -> str:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("forward failed")
        self.native_decoder.on_layers_start()
        self.out_when_layers_started.append([future.done() for future in self.watched])
        return f"logits-{self.calls}"


def _step(index: int) -> SimpleNamespace:
    return SimpleNamespace(inputs=index, fill_placeholders=lambda last_sampled: None)


@pytest.fixture(autouse=True)
def _fake_sampling(monkeypatch):
    monkeypatch.setattr(stages, "sample_step", lambda sampler, prepared, logits: SimpleNamespace(
        seq_ids=[prepared.inputs], token_ids=[7], logits=logits))


def test_a_result_is_handed_over_as_the_next_queued_steps_layers_start():
    runner = _Runner()
    steps = DeviceSteps(runner, sampler=None)
    first, second = Future(), Future()
    runner.watched = [first, second]
    steps.steps_queued = 2  # both queued before the first runs
    steps.run(_step(1), first)
    assert not first.done()  # held back: the second step is queued
    steps.run(_step(2), second)
    assert runner.out_when_layers_started == [[False, False], [True, False]]
    assert first.result().logits == "logits-1"
    assert second.result().logits == "logits-2"  # nothing queued behind it: at once


def test_without_a_queued_step_the_result_is_handed_over_at_once():
    steps = DeviceSteps(_Runner(), sampler=None)
    result = Future()
    steps.steps_queued = 1
    steps.run(_step(1), result)
    assert result.done() and steps.last_sampled == {1: 7}


def test_a_failed_step_raises_in_its_own_result_and_still_hands_over_the_one_before():
    runner = _Runner(fail_on=2)
    steps = DeviceSteps(runner, sampler=None)
    first, second = Future(), Future()
    steps.steps_queued = 2
    steps.run(_step(1), first)
    steps.run(_step(2), second)
    assert first.result().logits == "logits-1"
    with pytest.raises(RuntimeError, match="forward failed"):
        second.result()


def test_models_without_the_native_layers_call_hand_over_at_once():
    runner = _Runner()
    runner.native_decoder = None
    runner.execute = lambda inputs: "logits"
    steps = DeviceSteps(runner, sampler=None)
    result = Future()
    steps.steps_queued = 2
    steps.run(_step(1), result)
    assert result.done()


def test_a_result_whose_waiter_gave_up_is_dropped_without_breaking_the_next_step():
    steps = DeviceSteps(_Runner(), sampler=None)
    first, second = Future(), Future()
    steps.steps_queued = 2
    steps.run(_step(1), first)
    first.cancel()  # the worker is stopping: its waiter went away
    steps.run(_step(2), second)
    assert first.cancelled() and second.result().logits == "logits-2"
