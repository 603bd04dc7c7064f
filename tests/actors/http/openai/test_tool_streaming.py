"""Streamed tool calls equal the non-streamed answer for every parser, however the text is cut into
reply entries: the content sent early is never taken back, a parser's calls come whole as soon as the
parser is sure of them (hermes: at `</tool_call>`; mistral: once text that cannot continue the list
follows it; llama3_json: at the end), a constrained answer's calls come as deltas (each `required` call
once complete, a named call's arguments piece by piece), and text that cannot start a call streams as it
comes. Driven through the gateway's own ChunkWriter and completion_body on scripted reply entries (no
model: the text is chosen, the cuts are drawn)."""

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
        "mistral": '[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]',
        "openai": '<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city": "Oslo"}'}
TEXTS = {parser: [call, "  " + call, "Sure thing. " + call, "No call here, only words.", "  \n",
                  call[: len(call) // 2], call[:5] + " and more", "<" + call]
         for parser, call in CALL.items()}
LLAMA_TWO = ' ; {"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}'
TEXTS["llama3_json"] += ['{"answer": 42}', LLAMA_TWO, CALL["llama3_json"] + " and words"]
HERMES_TWO = ('Checking. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call> then '
              '<tool_call>\n{"name": "clock", "arguments": "{\\"zone\\": \\"CET\\"}"}\n</tool_call>')
MISTRAL_TWO = ('[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}, '
               '{"name": "clock", "arguments": {"zone": "CET"}}] Done.')
TEXTS["hermes"] += [HERMES_TWO, HERMES_TWO + "<tool_call>{oops}</tool_call> <tool_call>" + "[" * 2000 + "</tool_call>",
                    CALL["hermes"] + " <tool_call>" + CALL["hermes"]]
TEXTS["openai"] += [CALL["openai"] + "<|call|>", "Hm.<|start|>assistant" + CALL["openai"] + "<|call|><|start|>assistant"
                    + CALL["openai"], CALL["openai"] + " ok"]
TEXTS["mistral"] += [MISTRAL_TWO, CALL["mistral"] + ' {"answer": 42}', CALL["mistral"] + " [",
                     "Hm. " + CALL["mistral"] + " ok"]
DEEP = "[" * 5000  # past the JSON decoder's recursion limit: a 500 if it escaped
TEXTS["llama3_json"].append(DEEP)
TEXTS["hermes"].append("<tool_call>" + DEEP)
TEXTS["mistral"].append("[TOOL_CALLS]" + DEEP)


def stream_and_whole(plan: ToolPlan, text: str, cuts: list[int]) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(the non-streamed message and finish, the same accumulated from the stream, content deltas
    sent before the last entry)."""
    replies = _replies(text, cuts)
    body = completion_body("r", assemble("r", replies), "m", None, chat=True, tool_plan=plan)
    choice = body["choices"][0]
    whole = {"content": choice["message"]["content"], "calls": _calls(choice["message"].get("tool_calls", [])),
             "finish_reason": choice["finish_reason"]}
    return whole, *_streamed(_chunk_choices(plan, replies))


def _replies(text: str, cuts: list[int]) -> list[WireReply]:
    """The text as reply entries cut at `cuts`, then an entry that ends the answer (no text)."""
    pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    replies = [WireReply(id="r", seq=seq, choices=[WireChoice(index=0, text=piece, token_ids=[seq])])
               for seq, piece in enumerate(pieces)]
    replies.append(WireReply(id="r", seq=len(pieces), choices=[WireChoice(index=0, finish_reason="stop")],
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


def _streamed(choices: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
    content, calls, finish, early = None, {}, None, 0
    for choice in choices:
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


def _first_call_chunks(parser: str, text: str, cuts: list[int]) -> list[tuple[list[dict[str, Any]], str | None]]:
    """(tool-call deltas, finish_reason) of each chunk that has calls, in order."""
    choices = _chunk_choices(ToolPlan(ToolChoice("auto"), parser), _replies(text, cuts))
    return [(choice["delta"]["tool_calls"], choice["finish_reason"]) for choice in choices
            if choice["delta"].get("tool_calls")]


@pytest.mark.parametrize("parser, text", [("hermes", HERMES_TWO), ("mistral", MISTRAL_TWO)])
def test_a_settled_call_goes_out_before_the_answer_ends_with_indices_in_order(parser: str, text: str) -> None:
    chunks = _first_call_chunks(parser, text, list(range(2, len(text), 3)))
    assert chunks[0][1] is None  # not held for the last chunk
    deltas = [delta for calls, _ in chunks for delta in calls]
    assert [delta["index"] for delta in deltas] == [0, 1]
    assert [(delta["type"], delta["function"]["name"]) for delta in deltas] == [("function", "weather"),
                                                                               ("function", "clock")]
    assert all(delta["id"] for delta in deltas)
    if parser == "mistral":
        assert all(len(delta["id"]) == 9 and delta["id"].isalnum() for delta in deltas)  # Mistral's ids
    whole, streamed, _ = stream_and_whole(ToolPlan(ToolChoice("auto"), parser), text, list(range(1, len(text))))
    assert whole == streamed and len(whole["calls"]) == 2 and whole["finish_reason"] == "tool_calls"


def test_a_hermes_call_goes_out_at_its_closing_tag_and_the_next_call_waits_for_its_own() -> None:
    first = HERMES_TWO.index("</tool_call>") + len("</tool_call>")
    choices = _chunk_choices(ToolPlan(ToolChoice("auto"), "hermes"),
                             _replies(HERMES_TWO, [first - 1, first, first + 8]))
    calls = [[delta["index"] for delta in choice["delta"].get("tool_calls", [])] for choice in choices]
    assert calls == [[], [], [0], [], [1], []]  # role, up to '>', the tag closes, ' then <t', the rest, end
    assert choices[2]["finish_reason"] is None and choices[-1]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("text", [CALL["llama3_json"], LLAMA_TWO])
def test_llama3_json_calls_wait_for_the_end_as_any_later_text_makes_them_content(text: str) -> None:
    chunks = _first_call_chunks("llama3_json", text, list(range(1, len(text))))
    assert [finish for _, finish in chunks] == ["tool_calls"]
    whole, streamed, _ = stream_and_whole(ToolPlan(ToolChoice("auto"), "llama3_json"), text + " and words",
                                          list(range(1, len(text))))
    assert whole == streamed and whole["calls"] == [] and whole["content"] == text + " and words"


def test_parallel_false_streams_the_first_settled_call_only() -> None:
    plan = ToolPlan(ToolChoice("auto"), "hermes", parallel=False)
    whole, streamed, _ = stream_and_whole(plan, HERMES_TWO, list(range(1, len(HERMES_TWO), 2)))
    assert whole == streamed and [name for name, _ in whole["calls"]] == ["weather"]


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
