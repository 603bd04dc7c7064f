"""Runs a worker's actors as asyncio tasks and supervises them.

An actor that crashes is logged with its name and takes the whole worker down (exit code 1):
a worker with a dead stage would hold requests it can never answer. `on_crash` hears of it at
once, before the other actors are cancelled: the embedded gateway answers its clients from there,
and the CLI's worker arms `exit_after`, so a task that ignores cancellation cannot keep a dead
worker alive. On SIGTERM/SIGINT the runtime stops intake first, lets in-flight requests finish
for up to `drain_timeout_s`, then cancels the rest; unfinished request entries stay unacked in
Redis for another worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)

CRASH_EXIT_S = 10.0  # `aqueduct worker`/`serve`: a process whose actor died is gone by then, whatever still runs


class Runnable(Protocol):
    name: str

    async def run(self) -> None: ...


class ActorRuntime:
    def __init__(self, actors: list[Runnable], intake: Runnable | None, wait_idle: Callable[[], Awaitable[None]],
                 drain_timeout_s: float, on_crash: Callable[[str], None] | None = None) -> None:
        self.actors = actors
        self.intake = intake
        self.wait_idle = wait_idle
        self.drain_timeout_s = drain_timeout_s
        self.on_crash = on_crash  # called with the dead actor's name, before the rest are cancelled
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
            if self.on_crash is not None:
                self.on_crash(crashed[0].get_name())
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


async def _cancel_all(tasks: list[asyncio.Task], timeout_s: float = 5.0, recancel_s: float = 0.5) -> None:
    """Cancels `tasks`, and again every `recancel_s` those still running: Python 3.11's asyncio.wait_for
    (redis-py awaits one per command sent) drops a cancellation that lands as its inner future finishes,
    and the task then runs on as if never cancelled. (This reaches the tasks given, not their children:
    retry_transient re-raises such a lost cancellation where it happens.)"""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    running = set(tasks)
    while running and (left_s := deadline - loop.time()) > 0:
        for task in running:
            task.cancel()
        _, running = await asyncio.wait(running, timeout=min(recancel_s, left_s))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: it was logged where it mattered, or is the crash being handled
    if running:  # never let one task that ignores cancellation hold the worker up
        log.warning("tasks did not stop when cancelled", tasks=sorted(task.get_name() for task in running))


def exit_after(seconds: float, code: int) -> None:
    """Ends the process with `code` in `seconds`, unless it has ended by then: the last resort of a
    process whose actor died, should a task that ignores cancellation (or a hung connection) keep
    its event loop from finishing. A thread, so a blocked event loop cannot hold it up."""

    def force() -> None:
        log.error("the process did not exit in time after an actor died; forcing it", seconds=seconds, code=code)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(seconds, force)
    timer.daemon = True
    timer.start()
