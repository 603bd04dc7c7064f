"""The actor runtime: a crashing actor takes the worker down; a stop drains in-flight work first."""

from __future__ import annotations

import asyncio

from actors.kit.runtime import ActorRuntime
from actors.worker.admission import Admission


class Forever:
    def __init__(self, name: str) -> None:
        self.name = name
        self.cancelled = False

    async def run(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class Crashes:
    name = "crasher"

    async def run(self) -> None:
        await asyncio.sleep(0.01)
        raise RuntimeError("boom")


async def test_a_crashing_actor_stops_the_worker_with_exit_code_1():
    survivor = Forever("survivor")
    runtime = ActorRuntime([survivor, Crashes()], None, lambda: asyncio.sleep(0), drain_timeout_s=1)
    assert await asyncio.wait_for(runtime.run(), timeout=5) == 1
    assert survivor.cancelled


async def test_stop_cancels_intake_first_and_waits_for_in_flight_requests():
    admission = Admission(4)
    admission.take("r1")
    intake, stage = Forever("intake"), Forever("stage")
    runtime = ActorRuntime([stage], intake, admission.wait_idle, drain_timeout_s=5)
    running = asyncio.create_task(runtime.run())
    await asyncio.sleep(0.01)
    runtime.request_stop()
    await asyncio.sleep(0.05)
    assert intake.cancelled and not stage.cancelled and not running.done()  # draining r1
    await admission.release("r1")
    assert await asyncio.wait_for(running, timeout=5) == 0
    assert stage.cancelled


async def test_drain_gives_up_after_the_timeout():
    admission = Admission(4)
    admission.take("stuck")
    runtime = ActorRuntime([Forever("stage")], Forever("intake"), admission.wait_idle, drain_timeout_s=0.1)
    runtime.request_stop()
    assert await asyncio.wait_for(runtime.run(), timeout=5) == 0


async def test_admission_blocks_at_capacity_until_a_release():
    admission = Admission(2)
    admission.take("a")
    admission.take("b")
    waiter = asyncio.create_task(admission.room())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await admission.release("a")
    assert await asyncio.wait_for(waiter, timeout=1) == 1
