"""Tool-call parsers (not wired into the gateway yet): each family's format becomes OpenAI tool calls,
text that only looks like a call stays content, and `required` / a named function become a JSON
schema whose answers parse back into the calls."""

from __future__ import annotations

import json

import jsonschema_rs
import llguidance
import pytest

from actors.http.tool_parsers import PARSERS, SETTLED
from actors.http.tool_parsers.base import ParsedToolCalls
from actors.http.tool_parsers.call_stream import CallStream
from actors.http.tool_parsers.tool_choice import (
    calls_from_constrained,
    check_tool_choice,
    check_tools,
    complete_items,
    constraint_for,
)

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "time"}}


@pytest.mark.parametrize("parser, text, content", [
    ("hermes", 'Let me check.<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
     "Let me check."),
    ("llama3_json", '<|python_tag|>{"name": "weather", "parameters": {"city": "Oslo"}}', None),
    ("llama3_json", '{"name": "weather", "parameters": {"city": "Oslo"}}', None),
    ("mistral", 'Sure.[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]', "Sure."),
])
def test_each_format_becomes_one_call(parser: str, text: str, content: str | None) -> None:
    parsed = PARSERS[parser](text)
    assert parsed.content == content
    [call] = parsed.calls
    assert call.name == "weather" and json.loads(call.arguments) == {"city": "Oslo"}
    assert call.as_openai(0)["function"] == {"name": "weather", "arguments": call.arguments}
    if parser == "mistral":  # Mistral's templates take back only 9-character alphanumeric ids
        assert len(call.id) == 9 and call.id.isalnum()


def test_several_calls_and_text_that_only_looks_like_one() -> None:
    two = PARSERS["hermes"]('<tool_call>{"name": "a", "arguments": {}}</tool_call>'
                            '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>')
    assert [call.name for call in two.calls] == ["a", "b"] and two.content is None
    both = PARSERS["llama3_json"]('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}')
    assert [call.name for call in both.calls] == ["a", "b"]
    for parser, text in (("hermes", "<tool_call>{not json</tool_call>"), ("llama3_json", '{"answer": 42}'),
                         ("mistral", "[TOOL_CALLS] nothing"), ("hermes", "plain text")):
        parsed = PARSERS[parser](text)
        assert parsed.calls == [] and parsed.content == text


def test_settled_calls_are_those_no_continuation_can_change() -> None:
    call = '{"name": "weather", "arguments": {"city": "Oslo"}}'
    hermes = SETTLED["hermes"](f"Hi <tool_call>{call}</tool_call> and <tool_call>{call}")
    assert hermes.content == "Hi  and " and [c.name for c in hermes.calls] == ["weather"]
    assert SETTLED["hermes"](f"<tool_call>{call}").calls == []  # may still break before its tag
    deep = PARSERS["hermes"](f"<tool_call>{call}</tool_call><tool_call>{'[' * 5000}</tool_call>")
    assert len(deep.calls) == 1 and deep.content is not None  # too deep is not a call, the other stays one
    assert SETTLED["mistral"](f"Hi[TOOL_CALLS][{call}]").calls == []  # another JSON value would void it
    mistral = SETTLED["mistral"](f"Hi[TOOL_CALLS][{call}] ok")
    assert mistral.content == "Hi" and len(mistral.calls) == 1 and len(mistral.calls[0].id) == 9
    assert SETTLED["llama3_json"](call.replace("arguments", "parameters")).calls == []  # text may follow


def test_tools_and_tool_choice_are_checked() -> None:
    tools = check_tools([WEATHER, TIME])
    assert check_tool_choice(None, tools).mode == "auto" and check_tool_choice(None, None).mode == "none"
    assert check_tool_choice({"type": "function", "function": {"name": "time"}}, tools).function == "time"
    for tools_value in ([], [{"type": "function", "function": {}}], [WEATHER, WEATHER]):
        with pytest.raises(ValueError):
            check_tools(tools_value)
    with pytest.raises(ValueError, match="not among the tools"):
        check_tool_choice({"type": "function", "function": {"name": "nope"}}, tools)
    with pytest.raises(ValueError, match="needs tools"):
        check_tool_choice("required", None)


def test_required_and_named_choices_become_schemas_whose_answers_are_the_calls() -> None:
    tools = check_tools([WEATHER, TIME])
    required = check_tool_choice("required", tools)
    schema = constraint_for(required, tools, parallel_tool_calls=True)
    answer = '[{"name": "weather", "parameters": {"city": "Oslo"}}, {"name": "time", "parameters": {}}]'
    validator = jsonschema_rs.Draft202012Validator(schema)
    assert validator.is_valid(json.loads(answer))
    assert not validator.is_valid([{"name": "weather", "parameters": {}}])  # city is required
    assert not validator.is_valid([])
    assert [call.name for call in calls_from_constrained(required, answer).calls] == ["weather", "time"]
    single = jsonschema_rs.Draft202012Validator(constraint_for(required, tools, parallel_tool_calls=False))
    assert not single.is_valid(json.loads(answer))
    named = check_tool_choice({"type": "function", "function": {"name": "weather"}}, tools)
    assert constraint_for(named, tools, True) == WEATHER["function"]["parameters"]
    [call] = calls_from_constrained(named, '{"city": "Rome"}').calls
    assert call.name == "weather" and json.loads(call.arguments) == {"city": "Rome"}
    cut = calls_from_constrained(named, '{"city": "Ro')  # cut by max_tokens: still the call, as vLLM answers
    assert cut.content is None and [(call.name, call.arguments) for call in cut.calls] == [("weather", '{"city": "Ro')]
    assert constraint_for(check_tool_choice("auto", tools), tools, True) is None


def test_a_required_answer_cut_short_keeps_its_complete_calls_and_one_cut_before_any_is_text() -> None:
    tools = check_tools([WEATHER, TIME])
    required = check_tool_choice("required", tools)
    cut = calls_from_constrained(required, '[{"name": "time", "parameters": {}}, {"name": "weather", "para')
    assert cut.content is None and [call.name for call in cut.calls] == ["time"]
    assert calls_from_constrained(required, '[{"name": "ti') == ParsedToolCalls('[{"name": "ti', [])
    assert complete_items('[{"a": 1}, {"b": [2, 3]}, {"c"') == ([{"a": 1}, {"b": [2, 3]}], 26)


def test_tool_schemas_with_defs_keep_their_references_inside_required() -> None:
    """Pydantic's `$ref: "#/$defs/..."` would point at the outer list's root; rebased, it validates."""
    options = {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"]}
    nested = {"type": "function", "function": {"name": "forecast", "parameters": {
        "type": "object", "properties": {"options": {"$ref": "#/$defs/Options"}}, "required": ["options"],
        "$defs": {"Options": options}}}}
    tools = check_tools([WEATHER, nested])
    schema = constraint_for(check_tool_choice("required", tools), tools, parallel_tool_calls=True)
    validator = jsonschema_rs.Draft202012Validator(schema)
    assert validator.is_valid([{"name": "forecast", "parameters": {"options": {"unit": "c"}}}])
    assert not validator.is_valid([{"name": "forecast", "parameters": {"options": {"unit": "kelvin"}}}])
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    assert llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None) == (False, [])  # it compiles


def test_constrained_answers_stream_as_tool_call_deltas_that_add_up_to_the_whole_answers_calls() -> None:
    tools = check_tools([WEATHER, TIME])
    named = CallStream(check_tool_choice({"type": "function", "function": {"name": "weather"}}, tools))
    deltas = [delta for piece in ['{"ci', 'ty": ', '"Rome"}'] for delta in named.feed(piece)]
    assert deltas[0]["function"] == {"name": "weather", "arguments": '{"ci'} and deltas[0]["id"] == named.call_id
    assert "".join(delta["function"]["arguments"] for delta in deltas) == '{"city": "Rome"}'
    assert named.finish() == ([], None)
    required = CallStream(check_tool_choice("required", tools))
    answer = '[{"name": "weather", "parameters": {"city": "Oslo"}}, {"name": "time", "parameters": {}}]'
    sent = [[delta["function"]["name"] for delta in required.feed(answer[start:start + 7])]
            for start in range(0, len(answer), 7)]
    assert [names for names in sent if names] == [["weather"], ["time"]]  # each call once it is complete
    assert required.num_calls_sent == 2 and required.finish() == ([], None)
    cut = CallStream(check_tool_choice("required", tools))
    assert cut.feed('[{"name": "wea') == [] and cut.finish() == ([], '[{"name": "wea')
