"""Answer text -> output items and events (actors/http/responses/steps.py, output.py), without a server: fed
in pieces cut anywhere, an answer gives the items it gives whole, and its events rebuild them; under
a reasoning parser the reasoning is an item of its own before the message. A function_call item is added
as soon as its call's head is read, and its arguments follow as function_call_arguments deltas while they
are generated, for every parser."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.http.reasoning import FORMATS, ReasoningFormat
from actors.http.responses.answer import AnswerOutput
from actors.http.responses.output import Event
from actors.http.responses.request import ResponsesRequest
from actors.http.tool_parsers import PARSERS
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import ToolChoice
from tests.support.tool_texts import REQUIRED, answer_texts, drawn_cuts, one_by_one

HERMES_CALL = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
CASES: list[tuple[str, ToolPlan | None, ReasoningFormat | None, list[tuple[str, str]]]] = [
    ("Hello there", None, None, [("message", "Hello there")]),
    ("<think>Adding up.</think>4", None, FORMATS["think"], [("reasoning", "Adding up."), ("message", "4")]),
    ("Let me check. " + HERMES_CALL, ToolPlan(ToolChoice("auto"), "hermes"), None,
     [("message", "Let me check. "), ("function_call", '{"city": "Oslo"}')]),
    ('[{"name": "weather", "parameters": {"city": "Lima"}}, {"name": "clock", "parameters": {}}]',
     ToolPlan(ToolChoice("required"), None), None,
     [("function_call", '{"city": "Lima"}'), ("function_call", "{}")]),
    ('{"city": "Pune"}', ToolPlan(ToolChoice("named", "weather"), None), None, [("function_call", '{"city": "Pune"}')]),
]


def _request(plan: ToolPlan | None, reasoning: ReasoningFormat | None) -> ResponsesRequest:
    return ResponsesRequest([], chat=True, stream=False, tool_plan=plan, reasoning=reasoning)


def _run(request: ResponsesRequest, pieces: list[str], finish_reason: str) -> tuple[list[dict[str, Any]], list[Event]]:
    output = AnswerOutput(request)
    events = [event for piece in pieces for event in output.feed(piece)] + output.finish(finish_reason)
    return output.items, events


def _summary(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(item["type"], item["arguments"] if item["type"] == "function_call" else item["content"][0]["text"])
            for item in items]


@pytest.mark.parametrize("text, plan, reasoning, expected", CASES)
def test_any_cut_gives_the_whole_answer_s_items_and_events_that_rebuild_them(
        text: str, plan: ToolPlan | None, reasoning: ReasoningFormat | None, expected: list[tuple[str, str]]) -> None:
    whole, _ = _run(_request(plan, reasoning), [text], "stop")
    assert _summary(whole) == expected and all(item["status"] == "completed" for item in whole)
    for cut in range(len(text) + 1):
        items, events = _run(_request(plan, reasoning), [text[:cut], text[cut:]], "stop")
        assert _summary(items) == expected, cut
        assert [event["item"] for event in events if event["type"] == "response.output_item.done"] == items
        assert _rebuilt(events) == [text for _, text in expected]


def _rebuilt(events: list[Event]) -> list[str]:
    """Each item's text or arguments from its delta events alone."""
    pieces: dict[int, str] = {}
    for event in events:
        if event["type"].endswith(".delta"):
            pieces[event["output_index"]] = pieces.get(event["output_index"], "") + event["delta"]
    return [pieces[index] for index in sorted(pieces)]


def test_the_item_open_at_a_cut_answer_s_end_is_incomplete_and_the_ones_before_completed() -> None:
    items, events = _run(_request(None, FORMATS["think"]), ["<think>Hm.</think>Par"], "length")
    assert [(item["type"], item["status"]) for item in items] == [("reasoning", "completed"), ("message", "incomplete")]
    assert items[0] == {"id": items[0]["id"], "type": "reasoning", "summary": [], "status": "completed",
                        "content": [{"type": "reasoning_text", "text": "Hm."}]}
    kinds = [event["type"] for event in events]
    assert kinds[:3] == ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta"]
    assert "response.reasoning_text.done" in kinds and kinds[-1] == "response.output_item.done"


def test_a_named_call_opens_even_when_the_answer_is_empty() -> None:
    items, _ = _run(_request(ToolPlan(ToolChoice("named", "weather"), None), None), [""], "length")
    assert [(item["name"], item["arguments"], item["status"]) for item in items] == [("weather", "", "incomplete")]
    assert json.loads(json.dumps(items))  # plain JSON, ready for the store


def _without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in item.items() if key not in ("id", "call_id")} for item in items]


@pytest.mark.parametrize("parser", sorted(PARSERS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_cut_of_a_tool_answer_gives_the_whole_items_and_arguments_deltas(parser: str,
                                                                            data: st.DataObject) -> None:
    text = data.draw(answer_texts(parser))
    request = _request(ToolPlan(ToolChoice("auto"), parser), None)
    whole, _ = _run(request, [text], "stop")
    for pieces in (drawn_cuts(data, text), one_by_one(text)):
        items, events = _run(_request(ToolPlan(ToolChoice("auto"), parser), None), pieces, "stop")
        assert _without_ids(items) == _without_ids(whole)
        assert _rebuilt(events) == [item["arguments"] if item["type"] == "function_call" else item["content"][0]["text"]
                                    for item in items if item["type"] == "function_call" or item["content"][0]["text"]]


def test_a_function_call_item_is_added_before_its_arguments_stream() -> None:
    _, events = _run(_request(ToolPlan(ToolChoice("required"), None), None), one_by_one(REQUIRED), "stop")
    kinds = [event["type"] for event in events]
    added = [event for event in events if event["type"] == "response.output_item.added"]
    assert [(event["item"]["name"], event["item"]["arguments"]) for event in added] == [("weather", ""), ("clock", "")]
    first_delta = kinds.index("response.function_call_arguments.delta")
    assert kinds.index("response.output_item.added") < first_delta < kinds.index("response.output_item.added", 1)
    deltas = [event["delta"] for event in events if event["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 10 and "".join(deltas) == '{"city": "Oslo"}{"hours": 7}'
    done = [event["arguments"] for event in events if event["type"] == "response.function_call_arguments.done"]
    assert done == ['{"city": "Oslo"}', '{"hours": 7}']
