"""Streamed tool calls equal the non-streamed answer for every parser, however the text is cut into
reply entries: the content sent early is never taken back, a parser's calls come whole at the end, a
constrained answer's calls come as deltas (each `required` call once complete, a named call's arguments
piece by piece), and text that cannot start a call streams as it comes. Driven through the gateway's own ChunkWriter and
completion_body on scripted reply entries (no model: the text is chosen, the cuts are drawn)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.http.openai.chunks import ChunkWriter
from actors.http.openai.parse import OpenAIRequest
from actors.http.openai.render import completion_body
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import ToolChoice
from queue_adapters.client import assemble
from queue_adapters.codec import WireChoice, WireReply, WireRequest, WireUsage

CALL = {"hermes": '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>',
        "llama3_json": '<|python_tag|>{"name": "weather", "parameters": {"city": "Oslo"}}',
        "mistral": '[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]'}
TEXTS = {parser: [call, "  " + call, "Sure thing. " + call, "No call here, only words.", "  \n",
                  call[: len(call) // 2], call[:5] + " and more", "<" + call]
         for parser, call in CALL.items()}
TEXTS["llama3_json"] += ['{"answer": 42}', ' ; {"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}']
DEEP = "[" * 5000  # past the JSON decoder's recursion limit: a 500 if it escaped
TEXTS["llama3_json"].append(DEEP)
TEXTS["hermes"].append("<tool_call>" + DEEP)
TEXTS["mistral"].append("[TOOL_CALLS]" + DEEP)


def stream_and_whole(plan: ToolPlan, text: str, cuts: list[int]) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(the non-streamed message and finish, the same accumulated from the stream, content deltas
    sent before the last entry)."""
    pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    replies = [WireReply(id="r", seq=seq, choices=[WireChoice(index=0, text=piece, token_ids=[seq])])
               for seq, piece in enumerate(pieces)]
    replies.append(WireReply(id="r", seq=len(pieces), choices=[WireChoice(index=0, finish_reason="stop")],
                             usage=WireUsage(prompt_tokens=3, completion_tokens=len(pieces))))
    request = OpenAIRequest([WireRequest(id="r", prompt="p")], chat=True, stream=True, include_usage=False,
                            response_id="r", tool_plan=plan)
    body = completion_body("r", assemble("r", replies), "m", None, chat=True, tool_plan=plan)
    choice = body["choices"][0]
    whole = {"content": choice["message"]["content"], "calls": _calls(choice["message"].get("tool_calls", [])),
             "finish_reason": choice["finish_reason"]}
    return whole, *_streamed(ChunkWriter(request, "m", None), replies)


def _streamed(writer: ChunkWriter, replies: list[WireReply]) -> tuple[dict[str, Any], int]:
    async def rest() -> AsyncIterator[tuple[int, WireReply]]:
        for reply in replies[1:]:
            yield 0, reply  # one prompt: index 0

    async def events() -> list[str]:
        return [writer.opening(replies[:1]), *[text async for text in writer.rest(rest())]]

    content, calls, finish, early = None, {}, None, 0
    for text in asyncio.run(events()):
        for line in text.split("\n\n"):
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                delta = choice["delta"]
                if delta.get("content"):
                    content = (content or "") + delta["content"]
                    early += choice["finish_reason"] is None
                for call in delta.get("tool_calls", []):  # OpenAI's deltas: the first names the call
                    if "id" in call:
                        assert call["index"] not in calls
                        calls[call["index"]] = [call["function"]["name"], ""]
                    calls[call["index"]][1] += call["function"]["arguments"]
                finish = choice["finish_reason"] or finish
    assert sorted(calls) == list(range(len(calls)))
    return {"content": content or None, "calls": [(calls[index][0], _arguments(calls[index][1]))
                                                  for index in sorted(calls)], "finish_reason": finish}, early


def _calls(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(call["function"]["name"], _arguments(call["function"]["arguments"])) for call in calls]


def _arguments(text: str) -> Any:
    """The arguments object, or the text itself where max_tokens cut it."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@pytest.mark.parametrize("parser, text", [(parser, text) for parser, texts in TEXTS.items() for text in texts])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_cut_of_the_text_streams_the_same_answer(parser: str, text: str, data: st.DataObject) -> None:
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(len(text) - 1, 1)), max_size=12))))
    whole, streamed, _ = stream_and_whole(ToolPlan(ToolChoice("auto"), parser), text, [c for c in cuts
                                                                                       if c < len(text)])
    assert streamed == whole


@pytest.mark.parametrize("parser", sorted(CALL))
def test_calls_are_found_and_plain_text_streams_early(parser: str) -> None:
    plan = ToolPlan(ToolChoice("auto"), parser)
    whole, _, _ = stream_and_whole(plan, "Sure thing. " + CALL[parser], [3, 8])
    assert whole["calls"] == [("weather", {"city": "Oslo"})] and whole["finish_reason"] == "tool_calls"
    text = "No call here, only words."
    whole, streamed, early = stream_and_whole(plan, text, list(range(1, len(text))))
    assert whole == streamed == {"content": text, "calls": [], "finish_reason": "stop"}
    assert early >= len(text) - 2  # all but a tail that might have begun a call went out at once


def test_required_and_named_answers_stream_as_call_deltas() -> None:
    required = ToolPlan(ToolChoice("required"), None)
    text = '[{"name": "weather", "parameters": {"city": "Oslo"}}, {"name": "clock", "parameters": {}}]'
    whole, streamed, early = stream_and_whole(required, text, [5, 20, 40])
    assert whole == streamed and early == 0
    assert whole["calls"] == [("weather", {"city": "Oslo"}), ("clock", {})]
    single = ToolPlan(ToolChoice("required"), None, parallel=False)
    assert stream_and_whole(single, text, [7])[0]["calls"] == [("weather", {"city": "Oslo"})]
    assert stream_and_whole(required, DEEP, [9])[0]["content"] == DEEP  # cut while nested: text
    named = ToolPlan(ToolChoice("named", "weather"), None)
    whole, streamed, _ = stream_and_whole(named, '{"city": "Lima"}', [4])
    assert whole == streamed == {"content": None, "calls": [("weather", {"city": "Lima"})],
                                 "finish_reason": "tool_calls"}
    cut = '{"city": "Li'  # max_tokens ran out: still the call, its arguments as generated (vLLM's answer)
    whole, streamed, _ = stream_and_whole(named, cut, [4])
    assert whole == streamed and whole["content"] is None and whole["calls"] == [("weather", cut)]
