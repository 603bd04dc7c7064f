"""Trimming a request stream of what every consumer group has read and acknowledged.

A request entry (its prompt included) stays in its stream after the worker that served it acks it:
nothing else removes it, so a long-running deployment's streams would grow without bound. An entry
may go once no group can need it again: every group has read past it (its last-delivered id) and no
group still holds it pending (its oldest pending id; a pending entry is what crash claims re-deliver).
So the stream is trimmed (XTRIM MINID) below the smallest of those ids over all its groups. A stream
without groups is left alone: nobody has read it yet.

Example: group `workers` has delivered up to 1700-5 and still holds 1700-2 pending (a worker is
generating it): entries before 1700-2 go; 1700-2 and everything after it stay. Once 1700-2 is acked,
everything up to 1700-5 goes.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import ResponseError


def _stream_id(value: bytes | str) -> tuple[int, int]:
    text = value.decode() if isinstance(value, bytes) else value
    milliseconds, _, sequence = text.partition("-")
    return int(milliseconds), int(sequence or 0)


def _field(info: dict, name: str) -> object:
    return info.get(name, info.get(name.encode()))


async def safe_trim_point(redis: aioredis.Redis, stream_key: str) -> tuple[int, int] | None:
    """The smallest id any group may still need on `stream_key` (entries below it may go); None when the
    stream has no groups or does not exist."""
    try:
        groups = await redis.xinfo_groups(stream_key)
    except ResponseError:  # no such stream
        return None
    if not groups:
        return None
    points = []
    for group in groups:
        milliseconds, sequence = _stream_id(_field(group, "last-delivered-id"))
        point = (milliseconds, sequence + 1)  # the last delivered entry itself may go, once acked
        if int(_field(group, "pending") or 0):
            summary = await redis.xpending(stream_key, _field(group, "name"))
            point = min(point, _stream_id(summary["min"]))
        points.append(point)
    return min(points)


async def trim_acknowledged(redis: aioredis.Redis, stream_key: str) -> int:
    """Drop the entries below `safe_trim_point`; returns how many went."""
    point = await safe_trim_point(redis, stream_key)
    if point is None or point <= (0, 1):
        return 0
    return int(await redis.xtrim(stream_key, minid=f"{point[0]}-{point[1]}", approximate=False))
