"""Chat bodies with tools, at the edge: what each tool_choice asks of the answer, and the OpenAPI
document agreeing with the parser (never stricter; what it refuses, the parser refuses too)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest

from actors.http.openai.chat_request import AUTO_NEEDS_PARSER, parse_chat_request
from actors.http.openai.openapi_paths import chat_body

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
USER = [{"role": "user", "content": "Weather?"}]
CALLED = {"role": "assistant", "content": None,
          "tool_calls": [{"id": "call_1", "type": "function", "index": 0,
                          "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]}
ANSWERED = {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}


def test_each_tool_choice_plans_its_answer() -> None:
    auto = parse_chat_request({"messages": USER, "tools": [WEATHER]}, tool_parser="mistral")
    assert auto.tool_plan is not None and auto.tool_plan.parser == "mistral" and "guided_json" not in auto.params
    assert auto.tools == [WEATHER]
    required = parse_chat_request({"messages": USER, "tools": [WEATHER], "tool_choice": "required",
                                   "parallel_tool_calls": False}, tool_parser=None)
    assert required.params["guided_json"]["maxItems"] == 1 and not required.tool_plan.parallel
    assert parse_chat_request({"messages": USER, "tools": [WEATHER], "tool_choice": "required",
                               "response_format": {"type": "text"}}, None).params["guided_json"]["minItems"] == 1
    named = parse_chat_request({"messages": USER, "tools": [WEATHER],
                                "tool_choice": {"type": "function", "function": {"name": "weather"}}}, None)
    assert named.params["guided_json"] == WEATHER["function"]["parameters"]
    none = parse_chat_request({"messages": USER, "tools": [WEATHER], "tool_choice": "none"}, None)
    assert none.tool_plan is None and none.tools == [WEATHER]  # still rendered, as vLLM does
    assert parse_chat_request({"messages": USER, "tools": [], "tool_choice": None}, None).tools is None
    with pytest.raises(ValueError, match=AUTO_NEEDS_PARSER):
        parse_chat_request({"messages": USER, "tools": [WEATHER]}, None)


def test_tool_messages_reach_the_wire_shape() -> None:
    chat = parse_chat_request({"messages": [*USER, CALLED, ANSWERED]}, None)
    assistant, tool = chat.messages[1].as_dict(), chat.messages[2].as_dict()
    assert assistant["content"] == "" and assistant["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]
    assert tool == {"role": "tool", "content": "Sunny", "tool_call_id": "call_1"}


EXAMPLES: list[dict[str, Any]] = [
    {"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "required"}, {"tools": None, "tool_choice": None},
    {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "weather"}}},
    {"messages": [*USER, CALLED, ANSWERED]}, {"tools": [WEATHER], "parallel_tool_calls": False},
    {"tools": [{"type": "function"}]}, {"tools": [{"type": "web", "function": {"name": "x"}}]},
    {"tools": [{"type": "function", "function": {"name": ""}}]}, {"tools": [WEATHER], "tool_choice": "often"},
    {"tools": [WEATHER], "parallel_tool_calls": 1}, {"tools": [{**WEATHER, "extra": 1}]},
    {"messages": [*USER, {**CALLED, "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]},
    {"messages": [*USER, {**CALLED, "tool_calls": [{"id": "", "function": {"name": "f", "arguments": "{}"}}]}]},
    {"messages": [*USER, {**CALLED, "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 5}}]}]},
    {"messages": [*USER, {**ANSWERED, "tool_call_id": ""}]}, {"messages": [*USER, {**ANSWERED, "extra": 1}]},
]


@pytest.mark.parametrize("fields", EXAMPLES, ids=lambda fields: json.dumps(fields)[:60])
def test_the_document_is_never_stricter_than_the_parser(fields: dict[str, Any]) -> None:
    body = {"messages": USER, **fields}
    try:
        parse_chat_request(body, tool_parser="hermes")
        accepted = True
    except ValueError:
        accepted = False
    documented = jsonschema_rs.Draft202012Validator(chat_body()).is_valid(body)
    assert documented or not accepted, "the parser takes a body the document refuses"
    assert accepted == (fields in EXAMPLES[:6])  # the first six are valid, the rest are not
