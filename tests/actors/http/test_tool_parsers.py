"""Tool-call scanners (actors/http/tool_parsers/): each family's format becomes tool calls whose arguments
are the model's own text; text that only looks like a call stays content; a call is one from its head on
and its arguments stream as they are generated, with only what may still be a marker held back; and the
same text cut anywhere, at every character boundary included, gives events that add up to the whole
answer exactly. `required` and a named function become JSON schemas whose answers are the calls."""

from __future__ import annotations

import json

import jsonschema_rs
import llguidance
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.http.tool_parsers import PARSERS
from actors.http.tool_parsers.arguments import StringArguments
from actors.http.tool_parsers.base import ParsedToolCalls
from actors.http.tool_parsers.events import CallArguments, CallClosed, CallOpened, ContentText, ToolEvent, collect
from actors.http.tool_parsers.json_head import Head, read_call_head
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import ToolChoice, check_tool_choice, check_tools, constraint_for
from tests.support.tool_texts import NAMED, REQUIRED, TEXTS, answer_texts, cut_at, drawn_cuts, one_by_one

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "time"}}


def auto(parser: str, parallel: bool = True) -> ToolPlan:
    return ToolPlan(ToolChoice("auto"), parser, parallel)


def streamed(plan: ToolPlan, pieces: list[str]) -> list[ToolEvent]:
    stream = plan.stream()
    return [*(event for piece in pieces for event in stream.feed(piece)), *stream.finish()]


def summary(parsed: ParsedToolCalls) -> tuple[str | None, list[tuple[str, str]]]:
    return parsed.content, [(call.name, call.arguments) for call in parsed.calls]


@pytest.mark.parametrize("parser, text, content", [
    ("hermes", 'Let me check.<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
     "Let me check."),
    ("llama3_json", '<|python_tag|>{"name": "weather", "parameters": {"city": "Oslo"}}', None),
    ("llama3_json", '{"name": "weather", "parameters": {"city": "Oslo"}}', None),
    ("mistral", 'Sure.[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]', "Sure."),
    ("openai", 'Hm.<|start|>assistant<|channel|>commentary to=functions.weather <|constrain|>json<|message|>'
               '{"city": "Oslo"}<|call|>', "Hm."),
])
def test_each_format_becomes_one_call_with_the_arguments_as_written(parser: str, text: str,
                                                                     content: str | None) -> None:
    parsed = auto(parser).calls(text)
    assert summary(parsed) == (content, [("weather", '{"city": "Oslo"}')])
    if parser == "mistral":  # Mistral's templates take back only 9-character alphanumeric ids
        assert len(parsed.calls[0].id) == 9 and parsed.calls[0].id.isalnum()
    else:
        assert parsed.calls[0].id.startswith("call_")
    compact = auto(parser).calls(text.replace('": ', '":'))  # the model's spacing is kept, not re-serialised
    assert [call.arguments for call in compact.calls] == ['{"city":"Oslo"}']


def test_several_calls_and_text_that_only_looks_like_one() -> None:
    two = auto("hermes").calls('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
                               '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>')
    assert summary(two) == (None, [("a", "{}"), ("b", '{"x": 1}')])  # whitespace between calls is no content
    both = auto("llama3_json").calls('{"name": "a", "parameters": {}}; {"name": "b"}')
    assert summary(both) == (None, [("a", "{}"), ("b", "{}")])  # a call without arguments has {}
    for parser, text in (("hermes", "<tool_call>{not json</tool_call>"), ("llama3_json", '{"answer": 42}'),
                         ("llama3_json", '[{"name": "a", "parameters": {}}]'), ("mistral", "[TOOL_CALLS] nothing"),
                         ("hermes", '<tool_call>{"arguments": {}, "name": "a"}</tool_call>'),  # the name comes first
                         ("hermes", "plain text"), ("openai", "<|channel|>commentary to=functions.f<|message|>[1]")):
        assert summary(auto(parser).calls(text)) == (text, [])


def test_a_call_is_one_from_its_head_on_whatever_follows() -> None:
    """Once its head is read a call has gone out: text after it is content again, and arguments whose JSON
    breaks are the call's arguments as generated (as OpenAI's may be)."""
    assert summary(auto("llama3_json").calls('{"name": "a", "parameters": {"x": 1}} and words')) == (
        "and words", [("a", '{"x": 1}')])
    assert summary(auto("hermes").calls('<tool_call>{"name": "a", "arguments": {"x": 1</tool_call> after')) == (
        " after", [("a", '{"x": 1')])
    assert summary(auto("hermes").calls('<tool_call>{"name": "a", "arguments": {"x": "</tool_call>"}}</tool_call>')) \
        == (None, [("a", '{"x": "</tool_call>"}')])  # a marker inside a string is the string's
    assert summary(auto("mistral").calls('[TOOL_CALLS][{"name": "a", "arguments": {}, "id": 3}] Done.')) == (
        " Done.", [("a", "{}")])  # a key the call does not use is dropped with it
    assert summary(auto("hermes").calls('<tool_call>{"name": "a", "arguments": {}, "id": "}"}\n</tool_call>')) == (
        None, [("a", "{}")])
    assert summary(auto("hermes").calls('<tool_call>{"name": "a", "arguments": {}}\nSure.')) == (
        "\nSure.", [("a", "{}")])  # no closer: what follows the call is not dropped


def test_arguments_written_as_a_json_string_are_decoded() -> None:
    text = '<tool_call>{"name": "clock", "arguments": "{\\"zone\\": \\"CET\\", \\"face\\": \\"\\ud83d\\ude00\\"}"}'
    assert summary(auto("hermes").calls(text)) == (None, [("clock", '{"zone": "CET", "face": "😀"}')])
    lone = StringArguments()
    assert lone.read('"\\ud83d', 0, final=False) == ("", 1, False)  # the low half may follow
    assert lone.read('"\\ud83d x"', 1, final=False) == ("\ufffd x", 10, True)  # it did not: not encodable


@pytest.mark.parametrize("text, head", [
    ('{"name": "weather", "arguments": {"ci', Head("weather", 33, 33)),
    ('{ "name" : "w" , "parameters" : "{', Head("w", 32, 32, is_string=True)),
    ('{"name": "f"}', Head("f", None, 13)),
    ('{"name": "wea', "more"),
    ('{"name": "weather", "arguments": {', "more"),  # {"} or {} makes it an object
    ('{"answer": 42}', "no"),
    ('{"name": "", "arguments": {}}', "no"),
    ('{"name": "weather", "arguments": [1]}', "no"),
    ('{"name": "weather", "arguments": {x', "no"),
])
def test_a_call_s_head_is_read_as_it_comes(text: str, head: Head | str) -> None:
    assert read_call_head(text, 0, final=False) == head
    assert read_call_head(text, 0, final=True) == ("no" if head == "more" else head)


def test_only_what_may_still_be_a_marker_is_held() -> None:
    stream = auto("hermes").stream()
    assert stream.feed("Let me check. <tool_") == [ContentText("Let me check. ")]
    assert stream.feed('call>{"name": "weather", "argum') == []  # the head is not whole yet
    opened, *arguments = stream.feed('ents": {"city": "Os')
    assert isinstance(opened, CallOpened) and opened.name == "weather" and opened.index == 0
    assert arguments == [CallArguments('{"city": "Os')]  # the call streams before it is complete
    assert stream.feed('lo"}<') == [CallArguments('lo"}'), CallClosed()]
    assert stream.feed("/tool_call> Done.") == [ContentText(" Done.")]
    assert stream.finish() == []


def _check_stream(plan: ToolPlan, text: str, pieces: list[str]) -> None:
    """The events of `pieces` add up to the whole text's answer exactly, in a well-formed order."""
    events = streamed(plan, pieces)
    assert summary(collect(events)) == summary(plan.calls(text))
    open_index = None
    for event in events:
        if isinstance(event, CallOpened):
            open_index = event.index
        elif isinstance(event, CallArguments | CallClosed):
            assert event.index == open_index
            open_index = None if isinstance(event, CallClosed) else open_index
        else:
            assert event.text


@pytest.mark.parametrize("parser, text", [(parser, text) for parser, texts in TEXTS.items() for text in texts])
def test_each_text_fed_one_character_at_a_time_gives_the_whole_answer(parser: str, text: str) -> None:
    _check_stream(auto(parser), text, one_by_one(text))


@pytest.mark.parametrize("parser", sorted(PARSERS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_text_cut_anywhere_gives_the_whole_answer(parser: str, data: st.DataObject) -> None:
    text = data.draw(answer_texts(parser))
    plan = auto(parser, parallel=data.draw(st.booleans()))
    _check_stream(plan, text, drawn_cuts(data, text))
    _check_stream(plan, text, one_by_one(text))


def test_parallel_false_keeps_the_first_call_and_drops_the_others_text() -> None:
    text = 'A <tool_call>{"name": "a", "arguments": {}}</tool_call> B <tool_call>{"name": "b", "arguments": {}}'
    assert summary(auto("hermes", parallel=False).calls(text)) == ("A  B ", [("a", "{}")])


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
    plan = ToolPlan(required, None)
    assert summary(plan.calls(answer)) == (None, [("weather", '{"city": "Oslo"}'), ("time", "{}")])
    single = jsonschema_rs.Draft202012Validator(constraint_for(required, tools, parallel_tool_calls=False))
    assert not single.is_valid(json.loads(answer))
    named = check_tool_choice({"type": "function", "function": {"name": "weather"}}, tools)
    assert constraint_for(named, tools, True) == WEATHER["function"]["parameters"]
    assert summary(ToolPlan(named, None).calls('{"city": "Rome"}')) == (None, [("weather", '{"city": "Rome"}')])
    cut = ToolPlan(named, None).calls('{"city": "Ro')  # cut by max_tokens: still the call, as vLLM answers
    assert summary(cut) == (None, [("weather", '{"city": "Ro')])
    assert constraint_for(check_tool_choice("auto", tools), tools, True) is None


def test_a_required_answer_cut_short_keeps_its_calls_and_one_cut_before_any_is_text() -> None:
    plan = ToolPlan(ToolChoice("required"), None)
    assert summary(plan.calls('[{"name": "time", "parameters": {}}, {"name": "weather", "para')) == (
        None, [("time", "{}")])  # cut inside the second call's head
    assert summary(plan.calls('[{"name": "time", "parameters": {}}, {"name": "weather", "parameters": {"ci')) == (
        None, [("time", "{}"), ("weather", '{"ci')])  # inside its arguments: the call, as generated
    assert summary(plan.calls('[{"name": "ti')) == ('[{"name": "ti', [])


@pytest.mark.parametrize("plan, text", [(ToolPlan(ToolChoice("required"), None), REQUIRED),
                                        (ToolPlan(ToolChoice("required"), None, parallel=False), REQUIRED),
                                        (ToolPlan(ToolChoice("named", "weather"), None), NAMED)])
def test_constrained_answers_stream_their_arguments_at_every_cut(plan: ToolPlan, text: str) -> None:
    for cut in range(len(text) + 1):
        _check_stream(plan, text, cut_at(text, [cut]))
        _check_stream(plan, text[:cut], one_by_one(text[:cut]))  # cut short by max_tokens there
    pieces = [event for event in streamed(plan, one_by_one(text)) if isinstance(event, CallArguments)]
    assert len(pieces) > 10  # piece by piece, not each call whole


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
