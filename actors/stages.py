"""The three device-side stage actors: TensorPrep, GPU and Sampling.

All device work (forward and sampling) runs on one dedicated thread, so the event loop never
blocks on the device and the device sees one stream of work in order. Like kernels on a CUDA
stream, work is queued there without waiting for what is ahead of it: the GPU actor hands the
sampling actor the pending forward, and sampling is queued right behind it. So a step's forward
and sampling run back to back, however busy the event loop is (say, with the previous step's
output) when the forward ends.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from actors.base import Actor
from actors.messages import ForwardOutput
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


class GPUActor(Actor):
    def __init__(self, runner: ModelRunner, device: ThreadPoolExecutor, inbox: Consumer[PreparedStep],
                 to_sampling: Producer[ForwardOutput]) -> None:
        super().__init__("gpu", inbox)
        self.runner = runner
        self.device = device
        self.to_sampling = to_sampling

    async def handle(self, message: PreparedStep) -> None:
        # Not awaited here: a failed forward raises where sampling waits on it (a crash either way).
        pending_logits = self.device.submit(self.runner.execute, message.inputs)
        await self.to_sampling.send(ForwardOutput(message, pending_logits))


class SamplingActor(Actor):
    def __init__(self, sampler: Sampler, device: ThreadPoolExecutor, inbox: Consumer[ForwardOutput],
                 to_scheduler: Producer[Any]) -> None:
        super().__init__("sampling", inbox)
        self.sampler = sampler
        self.device = device
        self.to_scheduler = to_scheduler

    async def handle(self, message: ForwardOutput) -> None:
        pending = self.device.submit(_sample_after_forward, self.sampler, message.prepared, message.logits)
        await self.to_scheduler.send(await asyncio.wrap_future(pending))


def _sample_after_forward(sampler: Sampler, prepared: PreparedStep, pending_logits: Future[torch.Tensor]) -> StepResult:
    # The device thread runs work in order, so the forward queued before us has finished.
    return sample_step(sampler, prepared, pending_logits.result())
