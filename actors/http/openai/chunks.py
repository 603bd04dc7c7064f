"""Server-sent events for streamed completions: one chunk per choice per reply entry, OpenAI's shapes.

    data: {"object": "text_completion", "choices": [{"index": 0, "text": " Hel", ...}], ...}
    data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "lo"}}], ...}
    data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [
              {"index": 0, "id": "call_...", "type": "function", "function": {"name": ..., "arguments": ""}}]},
              ...}], ...}                       (with tools: a call opens once its head is read, then
    data: {... "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"ci"}}]} ...}
                                                 its arguments stream as they come: tool_deltas.py)
    data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"reasoning": "Hm",
              "reasoning_content": "Hm"}}], ...}  (--reasoning-parser: the reasoning, then content)
    data: {"choices": [], "usage": {...}}        (stream_options.include_usage)
    (with stream_options.continuous_usage_stats too, every chunk carries `usage` so far, as vLLM's do:
     the prompt's tokens and that choice's completion tokens; the last chunk has the totals)
    data: [DONE]

A completions request with several prompts streams each prompt's choices as they come, numbered
`prompt_index * n + j`; its usage chunk (summed) follows the last prompt's. With `echo`, a choice's
first chunk starts with its prompt (text, and with logprobs the prompt's tokens, the first null).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from actors.http.errors import from_engine_error
from actors.http.openai.parse import OpenAIRequest
from actors.http.openai.prompt_results import prompt_text
from actors.http.openai.render import (
    chat_logprobs,
    completion_logprobs,
    echo_entries,
    reasoning_delta,
    usage_object,
    vllm_prompt_logprobs,
)
from actors.http.openai.tool_deltas import chat_deltas
from actors.http.reasoning import ReasoningSplitter
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.stream import ToolStream
from queue_adapters.codec import WireChoice, WireReply, WireUsage

DONE_EVENT = "data: [DONE]\n\n"
# json.dumps(payload, ensure_ascii=False) builds an encoder per call; this one gives the same text.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


def event(payload: dict[str, Any]) -> str:
    return f"data: {_ENCODER.encode(payload)}\n\n"


class ChunkWriter:
    """Turns a request's reply entries into SSE events; remembers per-choice state across entries."""

    def __init__(self, request: OpenAIRequest, model_name: str, tokenizer: Any) -> None:
        self.request, self.tokenizer = request, tokenizer
        self.envelope = {"id": request.response_id or request.wire.id, "object": "chat.completion.chunk"
                         if request.chat else "text_completion", "created": int(time.time()), "model": model_name}
        self._text_offsets: dict[int, int] = {}  # choice -> characters sent (completions' text_offset)
        self._prompts: dict[int, dict[str, Any]] = {}  # prompt index -> its prompt_logprobs and token ids
        self._usages: dict[int, WireUsage] = {}  # prompt index -> its usage, once finished
        self._prompt_tokens: dict[int, int] = {}  # prompt index -> its length (continuous usage)
        self._completion_tokens: dict[int, int] = {}  # choice -> tokens sent (continuous usage)
        self._tools: dict[int, ToolStream] = {}  # choice -> its tool answer so far (chat with tools)
        self._splitters: dict[int, ReasoningSplitter] = {}  # choice -> its reasoning split (--reasoning-parser)

    def opening(self, firsts: list[WireReply]) -> str:
        """The events of each prompt's first reply entry (after chat's role announcement), as one
        text: they go out in one write with the headers."""
        for index, first in enumerate(firsts):
            prompt_tokens = first.prompt_tokens if first.usage is None else first.usage.prompt_tokens
            if prompt_tokens is not None:
                self._prompt_tokens[index] = prompt_tokens
        opening = [text for index, first in enumerate(firsts) for text in self._entry(index, first)]
        if self.request.chat:  # chat announces the role once per choice, before any content
            opening.insert(0, event({**self.envelope, "choices": [
                {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None} for index in range(self.request.num_choices)], **self._usage_so_far(0, None)}))
        return "".join(opening)

    async def rest(self, replies: AsyncIterator[tuple[int, WireReply]]) -> AsyncIterator[str]:
        """The events of each later entry, by prompt index (one text per entry: one write), then [DONE]."""
        async for prompt_index, reply in replies:
            events = self._entry(prompt_index, reply)
            if events:
                yield "".join(events)
        yield DONE_EVENT

    def _entry(self, prompt_index: int, reply: WireReply) -> list[str]:
        if reply.error is not None:  # after the first token: the status is sent already, so report in-band
            return [event(from_engine_error({"code": reply.error.code, "message": reply.error.message}).body())]
        if reply.prompt_logprobs is not None:
            self._prompts[prompt_index] = {"prompt_logprobs": list(reply.prompt_logprobs),
                                           "prompt_token_ids": reply.prompt_token_ids}
        events = []
        for choice in reply.choices:
            if choice.token_ids or choice.text or choice.finish_reason is not None:
                usage = self._usage_so_far(prompt_index, choice)
                events += [event({**self.envelope, "choices": [part], **usage})
                           for part in self._choices(prompt_index, choice)]
        if reply.usage is not None:
            self._usages[prompt_index] = reply.usage
            if self.request.include_usage and len(self._usages) == len(self.request.wires):
                events.append(event({**self.envelope, "choices": [], "usage": usage_object(self._summed_usage())}))
        return events

    def _summed_usage(self) -> dict[str, int]:
        usages = self._usages.values()
        return {"prompt_tokens": sum(usage.prompt_tokens for usage in usages),
                "completion_tokens": sum(usage.completion_tokens for usage in usages),
                "cached_tokens": sum(usage.cached_tokens for usage in usages)}

    def _usage_so_far(self, prompt_index: int, choice: WireChoice | None) -> dict[str, Any]:
        """`{"usage": ...}` for a chunk of `choice` (None: of none yet) of prompt `prompt_index` when the
        client asked for continuous usage stats: that prompt's tokens and the choice's completion tokens so
        far; {} otherwise, or when the worker did not say the prompt's length."""
        prompt_tokens = self._prompt_tokens.get(prompt_index)
        if not self.request.continuous_usage or prompt_tokens is None:
            return {}
        completion_tokens = 0
        if choice is not None:
            index = prompt_index * self.request.n + choice.index
            completion_tokens = self._completion_tokens.get(index, 0) + len(choice.token_ids)
            self._completion_tokens[index] = completion_tokens
        return {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    def _choices(self, prompt_index: int, choice: WireChoice) -> list[dict[str, Any]]:
        """The chunk choices of one reply entry's choice: one, but for chat with tools, whose entry may
        open calls (tool_deltas.py): the deltas before the last go first, bare."""
        if not self.request.chat:
            return [self._completion_choice(prompt_index, choice)]
        entries = list(choice.logprobs) if choice.logprobs is not None else None
        ending = {"finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason}
        text, delta = choice.text, {}
        if self.request.reasoning is not None:
            text, delta = self._reasoning_delta(choice)
        deltas = [delta]
        if self.request.tool_plan is not None:
            calls, ending["finish_reason"] = self._tool_deltas(choice.index, text, choice.finish_reason,
                                                               self.request.tool_plan)
            delta.update(calls[0])
            deltas += calls[1:]
        elif text:
            delta["content"] = text
        bare = [{"index": choice.index, "delta": early, "logprobs": None, "token_ids": [], "finish_reason": None,
                 "stop_reason": None} for early in deltas[:-1]]
        return [*bare, {"index": choice.index, "delta": deltas[-1],
                        "logprobs": chat_logprobs(entries, self.tokenizer) if entries is not None else None,
                        "token_ids": list(choice.token_ids), **ending}]

    def _completion_choice(self, prompt_index: int, choice: WireChoice) -> dict[str, Any]:
        entries = list(choice.logprobs) if choice.logprobs is not None else None
        ending = {"finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason}
        index = prompt_index * self.request.n + choice.index
        first_chunk = index not in self._text_offsets
        text, extra = choice.text, {}
        if first_chunk:
            text, entries, extra = self._with_prompt(prompt_index, text, entries)
        offset = self._text_offsets.get(index, 0)
        self._text_offsets[index] = offset + len(text)
        return {"index": index, "text": text, "token_ids": list(choice.token_ids),
                "logprobs": completion_logprobs(entries, self.tokenizer, offset) if entries is not None else None,
                **ending, **extra}

    def _with_prompt(self, prompt_index: int, text: str, entries: list[Any] | None,
                     ) -> tuple[str, list[Any] | None, dict[str, Any]]:
        """A choice's first chunk: its prompt's logprobs (when scored) and, for echo, the prompt first."""
        prompt = self._prompts.get(prompt_index, {})
        extra = ({"prompt_logprobs": vllm_prompt_logprobs(prompt["prompt_logprobs"], self.tokenizer)}
                 if prompt else {})
        if not self.request.echo or self.request.prompts is None:
            return text, entries, extra
        text = prompt_text(self.request.prompts[prompt_index], self.tokenizer) + text
        if entries is not None:
            entries = [*echo_entries(prompt), *entries]
        return text, entries, extra

    def _reasoning_delta(self, choice: WireChoice) -> tuple[str, dict[str, Any]]:
        """(the content part of this entry's text, a delta with its reasoning part): the split of
        actors/http/reasoning/splitter.py, which holds back what may still be a marker until it is sure."""
        assert self.request.reasoning is not None
        splitter = self._splitters.setdefault(choice.index, ReasoningSplitter(self.request.reasoning))
        split = splitter.feed(choice.text)
        if choice.finish_reason is not None:
            split += splitter.finish()
        return split.content, reasoning_delta(split.reasoning)

    def _tool_deltas(self, index: int, text: str, finish_reason: str | None,
                     plan: ToolPlan) -> tuple[list[dict[str, Any]], str | None]:
        """The deltas `text`, the choice's new content (after any reasoning), makes: content as it comes,
        each call as it opens and its arguments as they come (the tool plan's stream), the rest at the
        answer's end. `finish_reason` becomes tool_calls when the answer called."""
        stream = self._tools.setdefault(index, plan.stream())
        events = stream.feed(text)
        if finish_reason is not None:
            events += stream.finish()
        return chat_deltas(events), plan.finish_reason(finish_reason) if stream.num_calls else finish_reason
