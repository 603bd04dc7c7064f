"""The event loop of every `aqueduct` process: uvloop where installed (with uvicorn[standard], on Linux
and macOS), else asyncio's own.

A worker's actors and a gateway's streams are many small awaits per token (stream reads and
writes, queue hand-offs, socket sends); uvloop runs each of those for less CPU than asyncio's
pure-Python loop, and the gateway's HTTP parsing moves to httptools the same way (uvicorn picks
it when installed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
