"""Stopping a request's awaits from outside: the client leaving, or no worker answering in time.

A request's work (submit, wait for the first reply entry, stream or collect the rest) runs in the
request's own task, in a cancel scope; a side event cancels the scope, and where the guarded block
ends that becomes the event's exception (ClientGone, a 503).

Not a task per piece of work raced against a watcher with asyncio.wait: each such task costs
event-loop rounds (its first step, its done callback, the waiter's wake-up) between the worker's
first token and the client's first byte, while a scope costs nothing until it is cancelled.
The scope is anyio's, not a bare Task.cancel: it cancels again for as long as the block runs, and on
Python 3.11 one cancellation can be lost (asyncio.wait_for, which redis-py wraps around each
command's send, returns normally when cancelled just as the send completes).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from types import TracebackType

import anyio
from starlette.types import Receive


@functools.cache
def _cancel_scope_class() -> type[anyio.CancelScope]:
    """The running backend's CancelScope class. anyio.CancelScope() looks the backend up on every call
    (sniffio: about three times the cost of entering and leaving the scope here); the gateway runs on
    asyncio alone, so once is enough."""
    return type(anyio.CancelScope())


class ClientGone(Exception):
    """The client closed the connection before its answer was complete."""


class Interrupter:
    """Raises an exception in one task's guarded block from elsewhere (a callback, another task).

    `with interrupter:` guards a block; `interrupt(error)` raises `error` out of that block at its
    current await, or at the start of the next block when none runs now. The first interrupt wins."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self._scope: anyio.CancelScope | None = None

    def __enter__(self) -> None:
        if self.error is not None:
            raise self.error
        self._scope = _cancel_scope_class()()
        self._scope.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> bool:
        scope, self._scope = self._scope, None
        if scope is None:
            return False
        caught = bool(scope.__exit__(exc_type, exc, traceback))
        if self.error is not None and (caught or exc_type is None):
            raise self.error from None
        return caught

    def interrupt(self, error: BaseException) -> None:
        if self.error is not None:
            return
        self.error = error
        if self._scope is not None:
            self._scope.cancel()


class DisconnectWatch:
    """Interrupts with ClientGone when the client closes the connection; start it once the body is read
    (from then on the server's only message is `http.disconnect`). `stop` it before the response ends:
    uvicorn reports a completed response as a disconnect too."""

    def __init__(self, receive: Receive, interrupter: Interrupter) -> None:
        self.interrupter = interrupter
        self._watching = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.interrupter.interrupt(ClientGone())

    def stop(self) -> None:
        self._watching.cancel()


class Watchdog:
    """Every `period_s` until stopped, asks `still_fine`; calls `on_failed` (once) when it says no.

    A timer, not a task waiting beside the work: nothing runs while the work is on time."""

    def __init__(self, period_s: float, still_fine: Callable[[], Awaitable[bool]],
                 on_failed: Callable[[], None]) -> None:
        self.period_s, self.still_fine, self.on_failed = period_s, still_fine, on_failed
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(period_s, self._check)
        self._checking: asyncio.Task[None] | None = None

    def _check(self) -> None:
        self._timer = None
        self._checking = self._loop.create_task(self._ask())

    async def _ask(self) -> None:
        if await self.still_fine():
            self._timer = self._loop.call_later(self.period_s, self._check)
        else:
            self.on_failed()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._checking is not None:
            self._checking.cancel()
