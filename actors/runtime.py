"""Runs a worker's actors as asyncio tasks and supervises them.

An actor that crashes is logged with its name and takes the whole worker down (exit code 1):
a worker with a dead stage would hold requests it can never answer. On SIGTERM/SIGINT the
runtime stops intake first, lets in-flight requests finish for up to `drain_timeout_s`, then
cancels the rest; unfinished request entries stay unacked in Redis for another worker.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)


class Runnable(Protocol):
    name: str

    async def run(self) -> None: ...


class ActorRuntime:
    def __init__(self, actors: list[Runnable], intake: Runnable | None, wait_idle: Callable[[], Awaitable[None]],
                 drain_timeout_s: float) -> None:
        self.actors = actors
        self.intake = intake
        self.wait_idle = wait_idle
        self.drain_timeout_s = drain_timeout_s
        self._stop = asyncio.Event()

    def request_stop(self) -> None:
        self._stop.set()

    def stop_when(self, event: asyncio.Event) -> None:
        self._stop = event

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)

    async def run(self) -> int:
        tasks = {asyncio.create_task(actor.run(), name=actor.name): actor for actor in self.actors}
        intake_task = None
        if self.intake is not None:
            intake_task = asyncio.create_task(self.intake.run(), name=self.intake.name)
            tasks[intake_task] = self.intake
        stop_task = asyncio.create_task(self._stop.wait(), name="stop")
        done, _ = await asyncio.wait([*tasks, stop_task], return_when=asyncio.FIRST_COMPLETED)
        crashed = [task for task in done if task is not stop_task]
        if crashed:
            for task in crashed:
                error = task.exception() if not task.cancelled() else None
                log.error("actor stopped unexpectedly; shutting the worker down", actor=task.get_name(),
                          exc_info=error)
            await _cancel_all([*tasks, stop_task])
            return 1
        log.info("stopping: no new requests, draining in-flight ones", drain_timeout_s=self.drain_timeout_s)
        if intake_task is not None:
            await _cancel_all([intake_task])
        try:
            await asyncio.wait_for(self.wait_idle(), timeout=self.drain_timeout_s)
            log.info("drained")
        except TimeoutError:
            log.warning("drain timeout: unfinished requests stay pending for other workers")
        await _cancel_all(list(tasks))
        return 0


async def _cancel_all(tasks: list[asyncio.Task], timeout_s: float = 5.0) -> None:
    for task in tasks:
        task.cancel()
    done, stuck = await asyncio.wait(tasks, timeout=timeout_s)
    for task in done:
        if not task.cancelled():
            task.exception()  # retrieved: it was logged where it mattered, or is the crash being handled
    if stuck:  # never let one task that ignores cancellation hold the worker up
        log.warning("tasks did not stop when cancelled", tasks=sorted(task.get_name() for task in stuck))
