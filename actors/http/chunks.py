"""Server-sent events for streamed completions: one chunk per choice per reply entry, OpenAI's shapes.

    data: {"object": "text_completion", "choices": [{"index": 0, "text": " Hel", ...}], ...}
    data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "lo"}}], ...}
    data: {"choices": [], "usage": {...}}        (stream_options.include_usage)
    (with stream_options.continuous_usage_stats too, every chunk carries `usage` so far, as vLLM's do:
     the prompt's tokens and that choice's completion tokens; the last chunk has the totals)
    data: [DONE]
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from actors.http.bodies import GatewayRequest
from actors.http.chat_request import chat_logprobs
from actors.http.errors import from_engine_error
from actors.http.openai_shapes import completion_logprobs, usage_object
from queue_adapters.codec import WireChoice, WireReply

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
        self._prompt_tokens: int | None = None  # from the first entry (continuous usage)
        self._completion_tokens: dict[int, int] = {}  # choice -> tokens sent (continuous usage)

    def opening(self, first: WireReply) -> str:
        """The events of the first reply entry (after chat's role announcement), as one text: they go
        out in one write with the headers."""
        self._prompt_tokens = first.prompt_tokens if first.usage is None else first.usage.prompt_tokens
        opening = self._entry(first)
        if self.request.chat:  # chat announces the role once per choice, before any content
            opening.insert(0, event({**self.envelope, "choices": [
                {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None} for index in range(self.request.num_choices)], **self._usage_so_far(None)}))
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
        events = [event({**self.envelope, "choices": [self._choice(choice)], **self._usage_so_far(choice)})
                  for choice in reply.choices if choice.token_ids or choice.text or choice.finish_reason is not None]
        if reply.usage is not None and self.request.include_usage:
            usage = {"prompt_tokens": reply.usage.prompt_tokens, "completion_tokens": reply.usage.completion_tokens,
                     "cached_tokens": reply.usage.cached_tokens}
            events.append(event({**self.envelope, "choices": [], "usage": usage_object(usage)}))
        return events

    def _usage_so_far(self, choice: WireChoice | None) -> dict[str, Any]:
        """`{"usage": ...}` for a chunk of `choice` (None: of none yet) when the client asked for
        continuous usage stats; {} otherwise, or when the worker did not say the prompt's length."""
        if not self.request.continuous_usage or self._prompt_tokens is None:
            return {}
        completion_tokens = 0
        if choice is not None:
            completion_tokens = self._completion_tokens.get(choice.index, 0) + len(choice.token_ids)
            self._completion_tokens[choice.index] = completion_tokens
        return {"usage": {"prompt_tokens": self._prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": self._prompt_tokens + completion_tokens}}

    def _choice(self, choice: WireChoice) -> dict[str, Any]:
        entries = list(choice.logprobs) if choice.logprobs is not None else None
        ending = {"finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason}
        if self.request.chat:
            return {"index": choice.index, "delta": {"content": choice.text} if choice.text else {},
                    "logprobs": chat_logprobs(entries, self.tokenizer) if entries is not None else None,
                    "token_ids": list(choice.token_ids), **ending}
        offset = self._text_offsets.get(choice.index, 0)
        self._text_offsets[choice.index] = offset + len(choice.text)
        return {"index": choice.index, "text": choice.text, "token_ids": list(choice.token_ids),
                "logprobs": completion_logprobs(entries, self.tokenizer, offset) if entries is not None else None,
                **ending}
