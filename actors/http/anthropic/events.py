"""A streamed message as Anthropic's server-sent events, each with its `event:` and `data:` lines:

    event: message_start        {"message": {..., "content": [], "usage": {"input_tokens": N, "output_tokens": 0}}}
    event: ping
    (--reasoning-parser, an answer that reasons: its thinking block first)
    event: content_block_start  {"index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
    event: content_block_delta  {"index": 0, "delta": {"type": "thinking_delta", "thinking": "Hm"}}
    event: content_block_delta  {"index": 0, "delta": {"type": "signature_delta", "signature": ""}}
    event: content_block_stop   {"index": 0}
    event: content_block_start  {"index": 1, "content_block": {"type": "text", "text": ""}}
    event: content_block_delta  {"index": 1, "delta": {"type": "text_delta", "text": "Hel"}}
    event: content_block_stop   {"index": 1}
    event: content_block_start  {"index": 2, "content_block": {"type": "tool_use", "id", "name", "input": {}}}
    event: content_block_delta  {"index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"ci"}}
    event: content_block_stop   {"index": 2}
    event: message_delta        {"delta": {"stop_reason", "stop_sequence"}, "usage": {"output_tokens": M}}
    event: message_stop

The blocks come from blocks.py, as the whole message's do. An error after the first event (the status
is sent already) is an `event: error` with Anthropic's error body, and ends the stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from actors.http.anthropic.blocks import BlockStep, InputPiece, ReasonedBlocks, TextPiece, ThinkingPiece
from actors.http.anthropic.errors import error_event, sse_event
from actors.http.anthropic.message import message_envelope, stop_reason
from actors.http.anthropic.request import AnthropicRequest
from actors.http.errors import ApiError, from_engine_error
from queue_adapters.codec import WireChoice, WireReply

_PING = sse_event({"type": "ping"})


class MessageEvents:
    """One answer's reply entries as events (a message has one answer: n is 1)."""

    def __init__(self, request: AnthropicRequest, model_name: str) -> None:
        self.request, self.model_name = request, model_name
        self.blocks = ReasonedBlocks(request.tool_plan, request.reasoning)
        self.open_index, self.open_type = -1, ""  # the block being written ("": none)
        self.input_tokens = self.output_tokens = 0

    def opening(self, firsts: list[WireReply]) -> str:
        first = firsts[0]
        self.input_tokens = first.usage.prompt_tokens if first.usage is not None else first.prompt_tokens or 0
        start = sse_event({"type": "message_start", "message": {
            **message_envelope(self.request, self.model_name), "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}})
        return start + _PING + self._entry(first)

    async def rest(self, replies: AsyncIterator[tuple[int, WireReply]]) -> AsyncIterator[str]:
        async for _, reply in replies:
            events = self._entry(reply)
            if events:
                yield events

    def failure(self, error: ApiError) -> str:
        return error_event(error)

    def _entry(self, reply: WireReply) -> str:
        if reply.error is not None:
            return error_event(from_engine_error({"code": reply.error.code, "message": reply.error.message}))
        events = []
        for choice in reply.choices:
            self.output_tokens += len(choice.token_ids)
            events += [self._step(step) for step in self.blocks.feed(choice.text)]
            if choice.finish_reason is not None:
                events += [self._step(step) for step in self.blocks.finish()]
                events += self._ending(choice, reply)
        return "".join(events)

    def _step(self, step: BlockStep) -> str:
        if isinstance(step, InputPiece):
            return self._delta({"type": "input_json_delta", "partial_json": step.partial_json})
        if isinstance(step, ThinkingPiece):
            opened = "" if self.open_type == "thinking" else self._open({"type": "thinking", "thinking": "",
                                                                          "signature": ""})
            return opened + self._delta({"type": "thinking_delta", "thinking": step.thinking})
        if isinstance(step, TextPiece):
            opened = "" if self.open_type == "text" else self._open({"type": "text", "text": ""})
            return opened + self._delta({"type": "text_delta", "text": step.text})
        return self._open({"type": "tool_use", "id": step.id, "name": step.name, "input": {}})

    def _open(self, block: dict[str, Any]) -> str:
        closed = self._close()
        self.open_index, self.open_type = self.open_index + 1, block["type"]
        return closed + sse_event({"type": "content_block_start", "index": self.open_index, "content_block": block})

    def _close(self) -> str:
        if not self.open_type:
            return ""
        # Anthropic ends a thinking block with its signature; this server signs nothing.
        signed = self._delta({"type": "signature_delta", "signature": ""}) if self.open_type == "thinking" else ""
        self.open_type = ""
        return signed + sse_event({"type": "content_block_stop", "index": self.open_index})

    def _delta(self, delta: dict[str, Any]) -> str:
        return sse_event({"type": "content_block_delta", "index": self.open_index, "delta": delta})

    def _ending(self, choice: WireChoice, reply: WireReply) -> list[str]:
        output_tokens = reply.usage.completion_tokens if reply.usage is not None else self.output_tokens
        reason, sequence = stop_reason(choice.finish_reason, choice.stop_reason, self.request.stop_sequences,
                                       called=self.blocks.num_calls > 0)
        return [self._close(),
                sse_event({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                           "usage": {"input_tokens": self.input_tokens, "output_tokens": output_tokens}}),
                sse_event({"type": "message_stop"})]
