"""The reply streams of a request's prompts as one stream of (prompt index, entry), as entries arrive.

One prompt (every chat request, most completions) is passed through without tasks, so the common
path costs nothing extra. Several are read by one task each into a queue; the first failure of any
stream (the queue unreachable) is raised to the reader, and leaving the merged stream early (the
client went away) stops every task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from queue_adapters.codec import WireReply

_ENDED = object()  # a stream's last item in the queue


async def merge_replies(streams: list[AsyncIterator[WireReply]]) -> AsyncIterator[tuple[int, WireReply]]:
    if len(streams) == 1:
        async for reply in streams[0]:
            yield 0, reply
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
    tasks = [asyncio.create_task(_pump(index, stream, queue)) for index, stream in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is _ENDED:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                assert isinstance(item, WireReply)
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _pump(index: int, stream: AsyncIterator[WireReply], queue: asyncio.Queue[tuple[int, object]]) -> None:
    try:
        async for reply in stream:
            queue.put_nowait((index, reply))
    except Exception as error:  # handed to the reader, which raises it in the response's task
        queue.put_nowait((index, error))
        return
    queue.put_nowait((index, _ENDED))
