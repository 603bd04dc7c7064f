"""The three device-side stage actors: TensorPrep, GPU and Sampling.

All device work (forward and sampling) runs on one dedicated thread, so the event loop never
blocks on the device and the device sees one stream of work in order. Like kernels on a CUDA
stream, work is queued there without waiting for what is ahead of it: the GPU actor queues a
step (its forward, then its sampling) and hands the sampling actor the pending result. The next
step (planned ahead while this one runs, pipeline/scheduling/lookahead.py) can be queued right behind it: its
placeholder input ids are filled on the device thread with the tokens this step sampled, just
before its forward.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Any

import torch

from actors.kit.base import Actor
from actors.kit.messages import PendingStep
from pipeline.model.runner import ModelRunner
from pipeline.sampling.sampler import Sampler
from pipeline.sampling.step_sampling import sample_step
from pipeline.step.plan import StepPlan
from pipeline.step.prepared import PreparedStep
from pipeline.step.result import StepResult
from pipeline.tensor_prep.prepare import TensorPrep
from queue_adapters.base import Consumer, Producer


class TensorPrepActor(Actor):
    def __init__(self, tensor_prep: TensorPrep, inbox: Consumer[StepPlan], to_gpu: Producer[PreparedStep]) -> None:
        super().__init__("tensor_prep", inbox)
        self.tensor_prep = tensor_prep
        self.to_gpu = to_gpu

    async def handle(self, message: StepPlan) -> None:
        await self.to_gpu.send(self.tensor_prep.prepare(message))


class DeviceSteps:
    """A step's forward and sampling, as run on the device thread (and only there), in step order.

    A step's result reaches the event loop (its future resolves) when the next step's layers start,
    if that step is queued by then, else at once. Resolving it wakes the event loop for a burst of
    Python (scheduling, tensor prep, output) that holds the GIL; started just after sampling, that
    burst fell on the next step's Python prelude, which then waited for the GIL; held back until the
    layers start (native_decode.py's on_layers_start), it runs beside the native layers call, which
    runs without the GIL. SmolLM2, one request, one compute thread: the graph's forward ran ~5% longer
    than the loop's with the result handed over at once.
    """

    def __init__(self, runner: ModelRunner, sampler: Sampler) -> None:
        self.runner = runner
        self.sampler = sampler
        self.last_sampled: dict[int, int] = {}  # seq_id -> token of the step sampled last
        self.steps_queued = 0  # counted on the event loop as steps are queued here
        self.steps_started = 0
        self._held_back: list[tuple[Future[StepResult], StepResult]] = []
        decoder = runner.native_decoder
        self._hold_back = decoder is not None
        if decoder is not None:
            decoder.on_layers_start = self._hand_over

    def run(self, prepared: PreparedStep, result: Future[StepResult]) -> None:
        """Forward and sample `prepared`; its outcome (tokens or the exception) goes to `result`."""
        self.steps_started += 1
        try:
            try:
                logits = self.forward(prepared)
            finally:
                self._hand_over()  # the previous step's result, if the layers did not start
            outcome = sample_step(self.sampler, prepared, logits)
        except BaseException as error:
            with contextlib.suppress(InvalidStateError):  # cancelled: the worker is stopping
                result.set_exception(error)
            return
        self.last_sampled = dict(zip(outcome.seq_ids, outcome.token_ids, strict=True))
        if self._hold_back and self.steps_started < self.steps_queued:
            self._held_back.append((result, outcome))  # the next step is queued: hand over as its layers start
        else:
            _settle(result, outcome)

    def forward(self, prepared: PreparedStep) -> torch.Tensor:
        prepared.fill_placeholders(self.last_sampled)
        return self.runner.execute(prepared.inputs)

    def _hand_over(self) -> None:
        held, self._held_back = self._held_back, []
        for result, outcome in held:
            _settle(result, outcome)


def _settle(result: Future[StepResult], outcome: StepResult) -> None:
    with contextlib.suppress(InvalidStateError):  # cancelled by its waiter: the worker is stopping
        result.set_result(outcome)


class GPUActor(Actor):
    def __init__(self, runner: ModelRunner, sampler: Sampler, device: ThreadPoolExecutor,
                 inbox: Consumer[PreparedStep], to_sampling: Producer[PendingStep]) -> None:
        super().__init__("gpu", inbox)
        self.steps = DeviceSteps(runner, sampler)
        self.device = device
        self.to_sampling = to_sampling

    async def handle(self, message: PreparedStep) -> None:
        # Queued without waiting for the steps ahead of it; a failed step raises where sampling waits.
        result: Future[StepResult] = Future()
        self.steps.steps_queued += 1  # before the submit: a step it follows may hold its result back for it
        self.device.submit(self.steps.run, message, result)
        await self.to_sampling.send(PendingStep(message.plan.step_id, result))


class SamplingActor(Actor):
    """Waits for each step's sampled tokens (off the event loop) and sends them to the scheduler."""

    def __init__(self, inbox: Consumer[PendingStep], to_scheduler: Producer[Any]) -> None:
        super().__init__("sampling", inbox)
        self.to_scheduler = to_scheduler

    async def handle(self, message: PendingStep) -> None:
        await self.to_scheduler.send(await asyncio.wrap_future(message.result))
