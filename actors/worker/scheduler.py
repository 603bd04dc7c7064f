"""Scheduler actor: owns the pipeline Scheduler; keeps up to two steps in flight.

Inbox: Admit, StepResult, StopStringFinish, Cancel. After each batch of mail it expires
deadlines and plans: with no step in flight, the next one; with one in flight, the one after it,
from predicted lengths (pipeline/scheduling/lookahead.py), so that tensor prep builds step N + 1 while the
device runs N and the device never waits on host work (`overlap=False`: one step at a time, as
the plain step loop). A step's token events go to Output only after the next plan is sent:
streams wake their readers in order, so tensor prep runs before Output processes those tokens.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from actors.kit.base import Actor
from actors.kit.messages import Admit, Cancel, RequestFailed, StepEvents
from pipeline.request.outputs import StopStringFinish
from pipeline.request.request import FinishReason
from pipeline.scheduling.scheduler import Scheduler
from pipeline.step.result import StepResult
from queue_adapters.base import Consumer, Producer


class SchedulerActor(Actor):
    tick_s = 0.05  # deadline checks while idle

    def __init__(self, scheduler: Scheduler, inbox: Consumer[Any], to_tensor_prep: Producer[Any],
                 to_output: Producer[Any], metrics: Any | None = None, max_queue_wait_ms: int | None = None,
                 overlap: bool = True) -> None:
        super().__init__("scheduler", inbox)
        self.metrics = metrics
        self.max_queue_wait_ms = max_queue_wait_ms
        self.queued_since: dict[str, float] = {}  # admitted, not scheduled yet
        self.steps_started: deque[float] = deque()  # per step in flight, oldest first
        self.max_steps_in_flight = 2 if overlap else 1
        self.scheduler = scheduler
        self.to_tensor_prep = to_tensor_prep
        self.to_output = to_output
        self.deadlines_ms: dict[str, int] = {}
        self.pending_events: list = []  # for Output, in order; sent after the next plan

    async def handle(self, message: Any) -> None:
        if isinstance(message, Admit):
            self.scheduler.add_request(message.to_request())
            self.queued_since[message.request_id] = time.monotonic()
            if self.metrics is not None and message.lora_name is not None:
                self.metrics.record_lora_request(message.lora_name)
            if message.deadline_ms is not None:
                self.deadlines_ms[message.request_id] = message.deadline_ms
        elif isinstance(message, StepResult):
            started = self.steps_started.popleft()
            generated_before = self.scheduler.num_generated_tokens
            self._emit(self.scheduler.apply_step_result(message))
            if self.metrics is not None:  # tokens emitted, not rows sampled (a verified draft samples extra rows)
                self.metrics.observe_step(time.perf_counter() - started,
                                          self.scheduler.num_generated_tokens - generated_before)
        elif isinstance(message, StopStringFinish):
            self.scheduler.finish_by_stop_string(message)
        elif isinstance(message, Cancel):
            self.deadlines_ms.pop(message.request_id, None)
            self._emit(self.scheduler.abort_request(message.request_id, message.reason))
        else:
            raise TypeError(f"scheduler got an unexpected {type(message).__name__}")

    async def after_batch(self) -> None:
        self._expire_deadlines()
        await self._expire_queue_waits()
        await self._schedule_next()
        if self.pending_events:
            events, self.pending_events = self.pending_events, []
            await self.to_output.send(StepEvents.of(events))

    async def _schedule_next(self) -> None:
        while len(self.steps_started) < self.max_steps_in_flight and self.scheduler.has_unfinished:
            plan = self.scheduler.schedule_ahead() if self.steps_started else self.scheduler.schedule()
            for failure in self.scheduler.take_failures():
                await self.to_output.send(RequestFailed(failure.request_id, failure.code, failure.message))
            if plan is None or plan.is_empty:
                return
            for new in plan.new_sequences:
                self.queued_since.pop(self.scheduler.sequences[new.seq_id].request.request_id, None)
            self.steps_started.append(time.perf_counter())
            await self.to_tensor_prep.send(plan)

    def _expire_deadlines(self) -> None:
        if not self.deadlines_ms:
            return
        now_ms = time.time() * 1000
        for request_id, deadline in list(self.deadlines_ms.items()):
            if request_id not in self.scheduler.requests:
                del self.deadlines_ms[request_id]
            elif deadline <= now_ms:
                del self.deadlines_ms[request_id]
                self._emit(self.scheduler.abort_request(request_id, FinishReason.TIMEOUT))

    async def _expire_queue_waits(self) -> None:
        """Requests that waited longer than max_queue_wait_ms without starting end with an error,
        rather than letting the waiting queue grow without bound."""
        if self.max_queue_wait_ms is None or not self.queued_since:
            return
        oldest_allowed = time.monotonic() - self.max_queue_wait_ms / 1000
        for request_id, since in list(self.queued_since.items()):
            if request_id not in self.scheduler.requests:
                del self.queued_since[request_id]
            elif since < oldest_allowed:
                del self.queued_since[request_id]
                self.scheduler.abort_request(request_id, FinishReason.ERROR)
                await self.to_output.send(RequestFailed(
                    request_id, "queue_timeout", f"waited more than {self.max_queue_wait_ms} ms for a slot"))

    def _emit(self, events: list) -> None:
        self.pending_events.extend(events)
