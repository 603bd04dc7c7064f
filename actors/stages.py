"""The three device-side stage actors: TensorPrep, GPU and Sampling.

All device work (forward and sampling) runs on one dedicated thread, so the event loop never
blocks on the device and the device sees one stream of work in order.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from actors.base import Actor
from actors.messages import ForwardOutput
from pipeline.model.runner import ModelRunner
from pipeline.sampler import Sampler
from pipeline.step_plan import StepPlan
from pipeline.step_result import sample_step
from pipeline.tensor_prep import PreparedStep, TensorPrep
from queue_adapters.base import Consumer, Producer


def device_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="aqueduct-device")


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
        loop = asyncio.get_running_loop()
        logits = await loop.run_in_executor(self.device, self.runner.execute, message.inputs)
        await self.to_sampling.send(ForwardOutput(message, logits))


class SamplingActor(Actor):
    def __init__(self, sampler: Sampler, device: ThreadPoolExecutor, inbox: Consumer[ForwardOutput],
                 to_scheduler: Producer[Any]) -> None:
        super().__init__("sampling", inbox)
        self.sampler = sampler
        self.device = device
        self.to_scheduler = to_scheduler

    async def handle(self, message: ForwardOutput) -> None:
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self.device, sample_step, self.sampler, message.prepared, message.logits)
        await self.to_scheduler.send(result)
