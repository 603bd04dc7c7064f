"""Streamed tool calls through the gateway's own ChunkWriter and completion_body on scripted reply entries
(no model: the text is chosen, the cuts are drawn): for every parser and for `required` and a named
function, a call opens with OpenAI's first delta (`index`, `id`, `type`, `function.name`, arguments "")
as soon as its head is read, its arguments follow as `function.arguments` fragments while they are
generated, and the fragments add up to the non-streamed arguments exactly, however the text is cut
(at every character boundary too); content streams as it comes, never taken back."""

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
from actors.http.tool_parsers import PARSERS
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import ToolChoice
from queue_adapters.client import assemble
from queue_adapters.codec import WireChoice, WireReply, WireRequest, WireUsage
from tests.support.tool_texts import (
    CALLS,
    NAMED,
    REQUIRED,
    TEXTS,
    add_call_deltas,
    answer_texts,
    cut_at,
    drawn_cuts,
    one_by_one,
)

HERMES_TWO = TEXTS["hermes"][-2]


def stream_and_whole(plan: ToolPlan, pieces: list[str],
                     finish_reason: str = "stop") -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """(the non-streamed message and finish, the same accumulated from the stream, the stream's chunk choices)."""
    replies = _replies(pieces, finish_reason)
    body = completion_body("r", assemble("r", replies), "m", None, chat=True, tool_plan=plan)
    choice = body["choices"][0]
    whole = {"content": choice["message"]["content"], "calls": _calls(choice["message"].get("tool_calls", [])),
             "finish_reason": choice["finish_reason"]}
    choices = _chunk_choices(plan, replies)
    return whole, _streamed(choices), choices


def _replies(pieces: list[str], finish_reason: str) -> list[WireReply]:
    """The pieces as reply entries, then an entry that ends the answer (no text)."""
    replies = [WireReply(id="r", seq=seq, choices=[WireChoice(index=0, text=piece, token_ids=[seq])])
               for seq, piece in enumerate(pieces)]
    replies.append(WireReply(id="r", seq=len(pieces), choices=[WireChoice(index=0, finish_reason=finish_reason)],
                             usage=WireUsage(prompt_tokens=3, completion_tokens=len(pieces))))
    return replies


def _chunk_choices(plan: ToolPlan, replies: list[WireReply]) -> list[dict[str, Any]]:
    """The streamed chunks' choices, in order, from the gateway's own ChunkWriter."""
    request = OpenAIRequest([WireRequest(id="r", prompt="p")], chat=True, stream=True, include_usage=False,
                            response_id="r", tool_plan=plan)
    writer = ChunkWriter(request, "m", None)

    async def rest() -> AsyncIterator[tuple[int, WireReply]]:
        for reply in replies[1:]:
            yield 0, reply  # one prompt: index 0

    async def events() -> list[str]:
        return [writer.opening(replies[:1]), *[text async for text in writer.rest(rest())]]

    return [choice for text in asyncio.run(events()) for line in text.split("\n\n")
            if line.startswith("data: {") for choice in json.loads(line.removeprefix("data: "))["choices"]]


def _streamed(choices: list[dict[str, Any]]) -> dict[str, Any]:
    """The message as a client accumulates it, checking OpenAI's delta shapes on the way."""
    content, calls, finish = None, dict[int, list[str]](), None
    for choice in choices:
        delta = choice["delta"]
        if delta.get("content"):
            content = (content or "") + delta["content"]
        add_call_deltas(calls, delta.get("tool_calls", []))
        finish = choice["finish_reason"] or finish
    return {"content": content, "calls": [tuple(calls[index]) for index in sorted(calls)], "finish_reason": finish}


def _calls(calls: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(call["function"]["name"], call["function"]["arguments"]) for call in calls]


def auto(parser: str) -> ToolPlan:
    return ToolPlan(ToolChoice("auto"), parser)


@pytest.mark.parametrize("parser, text", [(parser, text) for parser, texts in TEXTS.items() for text in texts])
def test_every_text_streams_its_whole_answer_at_every_boundary(parser: str, text: str) -> None:
    whole, streamed, _ = stream_and_whole(auto(parser), one_by_one(text))
    assert streamed == whole


@pytest.mark.parametrize("parser", sorted(PARSERS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_text_cut_anywhere_streams_the_whole_answer(parser: str, data: st.DataObject) -> None:
    text = data.draw(answer_texts(parser))
    whole, streamed, _ = stream_and_whole(auto(parser), drawn_cuts(data, text))
    assert streamed == whole


@pytest.mark.parametrize("parser", sorted(CALLS))
def test_a_call_s_arguments_stream_before_it_ends(parser: str) -> None:
    text = "Sure thing. " + CALLS[parser] + (" " if parser == "llama3_json" else "")
    whole, streamed, choices = stream_and_whole(auto(parser), one_by_one(text))
    assert streamed == whole and whole["calls"] == [("weather", '{"city": "Oslo"}')]
    assert whole["finish_reason"] == "tool_calls" and whole["content"] == "Sure thing. "
    deltas = [call for choice in choices for call in choice["delta"].get("tool_calls", [])]
    assert deltas[0]["function"] == {"name": "weather", "arguments": ""}
    fragments = [delta["function"]["arguments"] for delta in deltas[1:]]
    assert fragments == ['{"', *'city": "Oslo"}']  # as they came (`{"` makes the head whole)
    last_argument = max(index for index, choice in enumerate(choices) if choice["delta"].get("tool_calls"))
    assert choices[last_argument]["finish_reason"] is None  # not held for the answer's end


def test_a_head_and_its_first_arguments_in_one_entry_open_the_call_in_a_chunk_of_its_own() -> None:
    whole, streamed, choices = stream_and_whole(auto("hermes"), [HERMES_TWO])
    assert streamed == whole and [name for name, _ in whole["calls"]] == ["weather", "clock"]
    with_calls = [choice["delta"]["tool_calls"] for choice in choices if choice["delta"].get("tool_calls")]
    assert [[set(call) for call in calls] for calls in with_calls] == [
        [{"index", "id", "type", "function"}], [{"index", "function"}, {"index", "id", "type", "function"}],
        [{"index", "function"}]]
    assert with_calls[2][0]["function"]["arguments"] == '{"zone": "CET"}'  # decoded from its JSON string


def test_plain_text_streams_as_it_comes() -> None:
    text = "No call here, only words."
    for parser in sorted(PARSERS):
        whole, streamed, choices = stream_and_whole(auto(parser), one_by_one(text))
        assert whole == streamed == {"content": text, "calls": [], "finish_reason": "stop"}
        early = sum(bool(choice["delta"].get("content")) for choice in choices if choice["finish_reason"] is None)
        assert early >= len(text) - 2  # all but a tail that might have begun a marker went out at once


def test_parallel_false_streams_the_first_call_only() -> None:
    plan = ToolPlan(ToolChoice("auto"), "hermes", parallel=False)
    whole, streamed, _ = stream_and_whole(plan, one_by_one(HERMES_TWO))
    assert whole == streamed and [name for name, _ in whole["calls"]] == ["weather"]


@pytest.mark.parametrize("plan, text", [(ToolPlan(ToolChoice("required"), None), REQUIRED),
                                        (ToolPlan(ToolChoice("named", "weather"), None), NAMED)])
def test_required_and_named_answers_stream_their_arguments_as_fragments(plan: ToolPlan, text: str) -> None:
    for cut in range(len(text) + 1):
        whole, streamed, _ = stream_and_whole(plan, cut_at(text, [cut]))
        assert whole == streamed and whole["content"] is None and whole["finish_reason"] == "tool_calls"
    whole, streamed, choices = stream_and_whole(plan, one_by_one(text))
    assert whole == streamed
    fragments = [call for choice in choices for call in choice["delta"].get("tool_calls", []) if "id" not in call]
    assert len(fragments) > len(whole["calls"]) * 5  # piece by piece, not each call whole
    assert not any(choice["delta"].get("content") for choice in choices)


def test_constrained_answers_cut_by_max_tokens() -> None:
    named = ToolPlan(ToolChoice("named", "weather"), None)
    whole, streamed, _ = stream_and_whole(named, ['{"city": "Li'], finish_reason="length")
    assert whole == streamed == {"content": None, "calls": [("weather", '{"city": "Li')], "finish_reason": "length"}
    required = ToolPlan(ToolChoice("required"), None)
    before_any = '[{"name": "wea'  # cut before its first call: text, as it cannot parse
    whole, streamed, _ = stream_and_whole(required, one_by_one(before_any), finish_reason="length")
    assert whole == streamed == {"content": before_any, "calls": [], "finish_reason": "length"}
    deep = "[" * 5000
    assert stream_and_whole(required, [deep[:9], deep[9:]])[0]["content"] == deep
