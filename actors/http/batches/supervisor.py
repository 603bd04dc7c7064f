"""Which batches this gateway runs: every couple of seconds (and at once when a batch is created or cancelled)
it renews its hold on the batches it runs and takes up active ones nobody holds, oldest first, up to
--batch-max-running (a batch with a cancel asked for is taken up beyond that: ending it is quick).

A hold is a lease in the batch store that expires unless renewed (BatchOptions.lease_s), so the batches of a
gateway that died are taken up by another, or by itself once restarted, within that time; one that stops
cleanly lets go at once. A runner whose hold was lost stops without cancelling anything: whoever took the
batch over submits its lines again and reads what the workers wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import structlog
from redis.exceptions import RedisError

from actors.http.batches.runner import BatchContext, BatchRunner

log = structlog.get_logger(__name__)
SWEEP_S = 2.0


class BatchSupervisor:
    def __init__(self, context: BatchContext, sweep_s: float = SWEEP_S) -> None:
        self.context, self.sweep_s = context, sweep_s
        self.holder = f"gateway-{uuid.uuid4().hex}"
        self.running: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._letting_go: set[asyncio.Task[None]] = set()

    def launch(self) -> None:
        """Start sweeping (on the running event loop)."""
        self._loop = asyncio.create_task(self._sweep_forever(), name="batch-supervisor")

    async def stop(self) -> None:
        """Stop every runner here (their lines stay with the workers) and let go of their batches."""
        held = list(self.running)
        tasks = [task for task in (self._loop, *self.running.values()) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for batch_id in held:
            try:
                await self.context.batches.release(batch_id, self.holder)
            except (RedisError, OSError) as error:  # its lease lapses instead
                log.warning("could not let go of a batch", batch_id=batch_id, error=str(error))
        self.running.clear()

    def wake(self) -> None:
        """Look for work now (a batch was created or a cancel asked for)."""
        self._wake.set()

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self._sweep()
            except (RedisError, OSError) as error:
                log.warning("batch sweep: Redis error", error=str(error))
            except Exception:  # never let a bug end the sweeps: the batches would stall
                log.exception("batch sweep failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.sweep_s)
            self._wake.clear()

    async def _sweep(self) -> None:
        batches, lease_s = self.context.batches, self.context.options.lease_s
        for batch_id, task in list(self.running.items()):
            if not await batches.claim(batch_id, self.holder, lease_s):
                log.warning("lost the hold on a batch; another gateway runs it", batch_id=batch_id)
                task.cancel()
        for batch_id in await batches.active():
            if batch_id in self.running or not await self._room_for(batch_id):
                continue
            if await batches.claim(batch_id, self.holder, lease_s):
                self._run(batch_id)

    async def _room_for(self, batch_id: str) -> bool:
        if len(self.running) < self.context.options.max_running:
            return True
        record = await self.context.batches.load(batch_id)
        return record is not None and record.cancelling_at is not None

    def _run(self, batch_id: str) -> None:
        task = asyncio.create_task(BatchRunner(self.context, batch_id).run(), name=f"batch-{batch_id}")
        self.running[batch_id] = task
        task.add_done_callback(lambda done: self._ended(batch_id, done))

    def _ended(self, batch_id: str, task: asyncio.Task[None]) -> None:
        if self.running.get(batch_id) is task:
            del self.running[batch_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("a batch runner failed; it will be taken up again", batch_id=batch_id,
                      exc_info=task.exception())
        if not task.cancelled():  # finished (or failed): free for the next sweep, here or elsewhere
            letting_go = asyncio.get_running_loop().create_task(self._let_go(batch_id))
            self._letting_go.add(letting_go)
            letting_go.add_done_callback(self._letting_go.discard)

    async def _let_go(self, batch_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.context.batches.release(batch_id, self.holder)
        self.wake()
