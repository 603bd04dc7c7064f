"""Reasoning in chat answers, streamed and not, through the gateway's own ChunkWriter and
completion_body on scripted reply entries (no model: the text is chosen, the cuts are drawn): the
message's `reasoning` and `reasoning_content` hold the reasoning and `content` what follows it; the
deltas reassemble to exactly that message however the text is cut; tool calls are read from the
content only."""

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
from actors.http.reasoning import FORMATS, ReasoningFormat, format_for_request
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import ToolChoice
from queue_adapters.client import assemble
from queue_adapters.codec import WireChoice, WireReply, WireRequest, WireUsage
from tests.support.tool_texts import add_call_deltas

CALL = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
TEXTS = ["<think>Add them.</think>\n\nIt is 4.", "Add them.</think>It is 4.", "<think>cut short",
         "No reasoning here.", "", "<think></think>", "<think>a</think>b</think>c", "  <thi", "</think>"]


def replies_of(pieces: list[str], finish_reason: str = "stop") -> list[WireReply]:
    replies = [WireReply(id="r", seq=seq, choices=[WireChoice(index=0, text=piece, token_ids=[seq])])
               for seq, piece in enumerate(pieces)]
    replies.append(WireReply(id="r", seq=len(pieces), choices=[WireChoice(index=0, finish_reason=finish_reason)],
                             usage=WireUsage(prompt_tokens=3, completion_tokens=len(pieces))))
    return replies


def whole_and_streamed(fmt: ReasoningFormat | None, text: str, cuts: list[int],
                       plan: ToolPlan | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    replies = replies_of(pieces)
    body = completion_body("r", assemble("r", replies), "m", None, chat=True, tool_plan=plan, reasoning=fmt)
    choice = body["choices"][0]
    message = choice["message"]
    assert message.get("reasoning") == message.get("reasoning_content")
    whole = {"reasoning": message.get("reasoning"), "content": message["content"],
             "calls": [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                       for c in message.get("tool_calls", [])], "finish_reason": choice["finish_reason"]}
    request = OpenAIRequest([WireRequest(id="r", prompt="p")], chat=True, stream=True, response_id="r",
                            tool_plan=plan, reasoning=fmt)
    return whole, _streamed(ChunkWriter(request, "m", None), replies)


def _streamed(writer: ChunkWriter, replies: list[WireReply]) -> dict[str, Any]:
    async def rest() -> AsyncIterator[tuple[int, WireReply]]:
        for reply in replies[1:]:
            yield 0, reply

    async def events() -> list[str]:
        return [writer.opening(replies[:1]), *[text async for text in writer.rest(rest())]]

    reasoning, content, calls, finish = None, None, dict[int, list[str]](), None
    for text in asyncio.run(events()):
        for line in text.split("\n\n"):
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                delta = choice["delta"]
                assert delta.get("reasoning") == delta.get("reasoning_content")
                assert not (delta.get("reasoning") and content), "reasoning after content"
                if delta.get("reasoning"):
                    reasoning = (reasoning or "") + delta["reasoning"]
                if delta.get("content"):
                    content = (content or "") + delta["content"]
                add_call_deltas(calls, delta.get("tool_calls", []))
                finish = choice["finish_reason"] or finish
    return {"reasoning": reasoning, "content": content, "finish_reason": finish,
            "calls": [(name, json.loads(arguments)) for name, arguments in calls.values()]}


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("text", TEXTS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_cut_streams_the_non_streamed_message(name: str, text: str, data: st.DataObject) -> None:
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(len(text) - 1, 1)), max_size=10))))
    whole, streamed = whole_and_streamed(FORMATS[name], text, [cut for cut in cuts if cut < len(text)])
    assert streamed == whole


def test_the_message_splits_reasoning_from_content() -> None:
    whole, streamed = whole_and_streamed(FORMATS["qwen3"], "<think>Add them.</think>\n\nIt is 4.", [3, 9, 17, 20])
    assert whole == streamed == {"reasoning": "Add them.", "content": "\n\nIt is 4.", "calls": [],
                                 "finish_reason": "stop"}
    cut_short, _ = whole_and_streamed(FORMATS["deepseek_r1"], "Still thinking", [5])
    assert cut_short["reasoning"] == "Still thinking" and cut_short["content"] is None
    plain, _ = whole_and_streamed(FORMATS["think"], "No reasoning here.", [2])
    assert plain["reasoning"] is None and plain["content"] == "No reasoning here."
    off, _ = whole_and_streamed(format_for_request("qwen3", {"enable_thinking": False}, False), "Hi </think>", [])
    assert off["reasoning"] is None and off["content"] == "Hi </think>"


def test_without_a_reasoning_parser_the_message_has_no_reasoning_fields() -> None:
    body = completion_body("r", assemble("r", replies_of(["<think>a</think>b"])), "m", None, chat=True)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "<think>a</think>b"}


@pytest.mark.parametrize("cuts", [[], [4], [10, 30], list(range(1, 120, 7))])
def test_tool_calls_are_read_from_the_content_only(cuts: list[int]) -> None:
    auto = ToolPlan(ToolChoice("auto"), "hermes")
    text = f"<think>I could write {CALL} here.</think>Checking. {CALL}"
    whole, streamed = whole_and_streamed(FORMATS["deepseek_r1"], text, [c for c in cuts if c < len(text)], auto)
    assert whole == streamed
    assert whole["reasoning"] == f"I could write {CALL} here."  # a call inside the reasoning is not made
    assert whole["content"] == "Checking. " and whole["calls"] == [("weather", {"city": "Oslo"})]
    assert whole["finish_reason"] == "tool_calls"
    only_thought, _ = whole_and_streamed(FORMATS["deepseek_r1"], f"{CALL}</think>Done.", [], auto)
    assert only_thought["calls"] == [] and only_thought["content"] == "Done."


def test_a_constrained_tool_answer_is_content_whatever_the_parser() -> None:
    required = ToolPlan(ToolChoice("required"), None)
    fmt = format_for_request("deepseek_r1", None, constrained=True)
    text = '[{"name": "weather", "parameters": {"city": "Oslo"}}]'
    whole, streamed = whole_and_streamed(fmt, text, [1, 12], required)
    assert whole == streamed and whole["reasoning"] is None
    assert whole["calls"] == [("weather", {"city": "Oslo"})] and whole["finish_reason"] == "tool_calls"
