"""Reads a reply stream to learn how far a request got before its worker died (docs/design.md §3)."""

from __future__ import annotations

import redis.asyncio as aioredis

from pipeline.request.request import ResumeState
from queue_adapters.codec import CodecError, WireReply, decode_reply
from queue_adapters.redis_streams import DATA_FIELD


async def read_reply_stream(redis: aioredis.Redis, reply_to: str, request_id: str) -> list[WireReply]:
    """This request's entries, deduplicated by seq, in seq order."""
    by_seq: dict[int, WireReply] = {}
    for _, fields in await redis.xrange(reply_to):
        try:
            reply = decode_reply(fields.get(DATA_FIELD, b""))
        except CodecError:
            continue  # not ours to judge; a reader skips what it cannot read
        if reply.id == request_id:
            by_seq.setdefault(reply.seq, reply)
    return [by_seq[seq] for seq in sorted(by_seq)]


def is_answered(replies: list[WireReply]) -> bool:
    return any(reply.usage is not None or reply.error is not None for reply in replies)


def resume_state(replies: list[WireReply], n: int) -> ResumeState:
    outputs: list[list[int]] = [[] for _ in range(n)]
    reasons: list[str | None] = [None] * n
    stop_reasons: list[int | str | None] = [None] * n
    mirostat_mu: list[float | None] = [None] * n
    for reply in replies:
        for choice in reply.choices:
            if choice.index < n:
                outputs[choice.index].extend(choice.token_ids)
                if choice.mirostat_mu is not None:  # the latest value: mu after the tokens so far
                    mirostat_mu[choice.index] = choice.mirostat_mu
                if choice.finish_reason is not None:
                    reasons[choice.index], stop_reasons[choice.index] = choice.finish_reason, choice.stop_reason
    next_seq = replies[-1].seq + 1 if replies else 0
    return ResumeState(next_seq, outputs, reasons, stop_reasons, mirostat_mu)
