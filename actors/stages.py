"""The three device-side stage actors: TensorPrep, GPU and Sampling.

All device work (forward and sampling) runs on one dedicated thread, so the event loop never
blocks on the device and the device sees one stream of work in order. Like kernels on a CUDA
stream, work is queued there without waiting for what is ahead of it: the GPU actor queues a
step's forward and its sampling back to back, and hands the sampling actor the pending result.
So a step's forward and sampling run back to back, and the next step (planned ahead while this
one runs, pipeline/lookahead.py) can be queued right behind them: its placeholder input ids are
filled on the device thread with the tokens this step sampled, just before its forward.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from actors.base import Actor
from actors.messages import PendingStep
from pipeline.model.runner import ModelRunner
from pipeline.sampler import Sampler
from pipeline.step_plan import StepPlan
from pipeline.step_result import StepResult, sample_step
from pipeline.tensor_prep import PreparedStep, TensorPrep
from queue_adapters.base import Consumer, Producer


class TensorPrepActor(Actor):
    def __init__(self, tensor_prep: TensorPrep, inbox: Consumer[StepPlan], to_gpu: Producer[PreparedStep]) -> None:
        super().__init__("tensor_prep", inbox)
        self.tensor_prep = tensor_prep
        self.to_gpu = to_gpu

    async def handle(self, message: StepPlan) -> None:
        await self.to_gpu.send(self.tensor_prep.prepare(message))


class DeviceSteps:
    """A step's forward and sampling, as run on the device thread (and only there), in step order."""

    def __init__(self, runner: ModelRunner, sampler: Sampler) -> None:
        self.runner = runner
        self.sampler = sampler
        self.last_sampled: dict[int, int] = {}  # seq_id -> token of the step sampled last

    def forward(self, prepared: PreparedStep) -> torch.Tensor:
        prepared.fill_placeholders(self.last_sampled)
        return self.runner.execute(prepared.inputs)

    def sample(self, prepared: PreparedStep, pending_logits: Future[torch.Tensor]) -> StepResult:
        # The device thread runs work in order, so the forward queued before us has finished.
        result = sample_step(self.sampler, prepared, pending_logits.result())
        self.last_sampled = dict(zip(result.seq_ids, result.token_ids, strict=True))
        return result


class GPUActor(Actor):
    def __init__(self, runner: ModelRunner, sampler: Sampler, device: ThreadPoolExecutor,
                 inbox: Consumer[PreparedStep], to_sampling: Producer[PendingStep]) -> None:
        super().__init__("gpu", inbox)
        self.steps = DeviceSteps(runner, sampler)
        self.device = device
        self.to_sampling = to_sampling

    async def handle(self, message: PreparedStep) -> None:
        # Queued back to back, nothing awaited: a failed forward raises where sampling waits on it.
        pending_logits = self.device.submit(self.steps.forward, message)
        pending_result = self.device.submit(self.steps.sample, message, pending_logits)
        await self.to_sampling.send(PendingStep(message.plan.step_id, pending_result))


class SamplingActor(Actor):
    """Waits for each step's sampled tokens (off the event loop) and sends them to the scheduler."""

    def __init__(self, inbox: Consumer[PendingStep], to_scheduler: Producer[Any]) -> None:
        super().__init__("sampling", inbox)
        self.to_scheduler = to_scheduler

    async def handle(self, message: PendingStep) -> None:
        await self.to_scheduler.send(await asyncio.wrap_future(message.result))
