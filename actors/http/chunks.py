"""Server-sent events for streamed completions: one chunk per choice per reply entry, OpenAI's shapes.

    data: {"object": "text_completion", "choices": [{"index": 0, "text": " Hel", ...}], ...}
    data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "lo"}}], ...}
    data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [
              {"index": 0, "id": "call_...", "type": "function", "function": {"name": ..., "arguments": ...}}]},
              "finish_reason": "tool_calls"}], ...}     (a request with tools: calls come whole, at the end)
    data: {"choices": [], "usage": {...}}        (stream_options.include_usage)
    data: [DONE]
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import structlog

from actors.http.bodies import GatewayRequest
from actors.http.chat_request import chat_logprobs
from actors.http.errors import from_engine_error
from actors.http.openai_shapes import completion_logprobs, usage_object
from actors.http.tool_parsers.plan import ToolPlan
from queue_adapters.codec import WireChoice, WireReply

log = structlog.get_logger(__name__)
DONE_EVENT = "data: [DONE]\n\n"
# json.dumps(payload, ensure_ascii=False) builds an encoder per call; this one gives the same text.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


def event(payload: dict[str, Any]) -> str:
    return f"data: {_ENCODER.encode(payload)}\n\n"


class ChunkWriter:
    """Turns a request's reply entries into SSE events; remembers per-choice state across entries."""

    def __init__(self, request: GatewayRequest, model_name: str, tokenizer: Any) -> None:
        self.request, self.tokenizer = request, tokenizer
        self.envelope = {"id": request.wire.id, "object": "chat.completion.chunk" if request.chat
                         else "text_completion", "created": int(time.time()), "model": model_name}
        self._text_offsets: dict[int, int] = {}  # choice -> characters sent (completions' text_offset)
        self._answers: dict[int, _HeldAnswer] = {}  # choice -> its text so far (chat with tools)

    def opening(self, first: WireReply) -> str:
        """The events of the first reply entry (after chat's role announcement), as one text: they go
        out in one write with the headers."""
        opening = self._entry(first)
        if self.request.chat:  # chat announces the role once per choice, before any content
            opening.insert(0, event({**self.envelope, "choices": [
                {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None} for index in range(self.request.num_choices)]}))
        return "".join(opening)

    async def rest(self, replies: AsyncIterator[WireReply]) -> AsyncIterator[str]:
        """The events of each later entry (one text per entry: one write), then [DONE]."""
        async for reply in replies:
            events = self._entry(reply)
            if events:
                yield "".join(events)
        yield DONE_EVENT

    def _entry(self, reply: WireReply) -> list[str]:
        if reply.error is not None:  # after the first token: the status is sent already, so report in-band
            return [event(from_engine_error({"code": reply.error.code, "message": reply.error.message}).body())]
        events = [event({**self.envelope, "choices": [self._choice(choice)]}) for choice in reply.choices
                  if choice.token_ids or choice.text or choice.finish_reason is not None]
        if reply.usage is not None and self.request.include_usage:
            usage = {"prompt_tokens": reply.usage.prompt_tokens, "completion_tokens": reply.usage.completion_tokens,
                     "cached_tokens": reply.usage.cached_tokens}
            events.append(event({**self.envelope, "choices": [], "usage": usage_object(usage)}))
        return events

    def _choice(self, choice: WireChoice) -> dict[str, Any]:
        entries = list(choice.logprobs) if choice.logprobs is not None else None
        ending = {"finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason}
        if self.request.chat:
            delta: dict[str, Any] = {"content": choice.text} if choice.text else {}
            if self.request.tool_plan is not None:
                delta, ending["finish_reason"] = self._tool_delta(choice, self.request.tool_plan)
            return {"index": choice.index, "delta": delta,
                    "logprobs": chat_logprobs(entries, self.tokenizer) if entries is not None else None,
                    "token_ids": list(choice.token_ids), **ending}
        offset = self._text_offsets.get(choice.index, 0)
        self._text_offsets[choice.index] = offset + len(choice.text)
        return {"index": choice.index, "text": choice.text, "token_ids": list(choice.token_ids),
                "logprobs": completion_logprobs(entries, self.tokenizer, offset) if entries is not None else None,
                **ending}

    def _tool_delta(self, choice: WireChoice, plan: ToolPlan) -> tuple[dict[str, Any], str | None]:
        """Content that cannot become a call goes out at once; the rest waits for the answer's end,
        where the whole text is parsed as the non-streamed answer is (actors/http/tool_parsers/plan.py)."""
        answer = self._answers.setdefault(choice.index, _HeldAnswer())
        answer.text += choice.text
        if choice.finish_reason is None:
            upto = max(plan.sendable(answer.text), answer.sent)
            content, answer.sent = answer.text[answer.sent:upto], upto
            return ({"content": content} if content else {}), None
        parsed = plan.calls(answer.text)
        if not (parsed.content or "").startswith(answer.text[:answer.sent]):
            log.warning("streamed content is not a prefix of the parsed content", request_id=self.request.wire.id)
        delta: dict[str, Any] = {}
        rest = (parsed.content or "")[answer.sent:]
        if rest:
            delta["content"] = rest
        if not parsed.calls:
            return delta, choice.finish_reason
        delta["tool_calls"] = [call.as_openai(index) for index, call in enumerate(parsed.calls)]
        return delta, plan.finish_reason(choice.finish_reason)


@dataclass(slots=True)
class _HeldAnswer:
    text: str = ""  # the choice's text so far
    sent: int = 0  # characters of it sent as content
