"""`--tool-call-parser openai` (gpt-oss's harmony calls, as `--reasoning-parser gpt_oss` leaves them in
the content): a message to a function is a call, its body the arguments; anything else stays content;
while streaming, a header is held until its `<|message|>` and the body streams as it comes."""

from __future__ import annotations

import pytest

from actors.http.tool_parsers.events import CallArguments, CallClosed, CallOpened, ContentText
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import ToolChoice

CALL = '<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city": "Oslo"}'
PLAN = ToolPlan(ToolChoice("auto"), "openai")


def _calls(text: str) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in PLAN.calls(text).calls]


@pytest.mark.parametrize(("text", "content"), [
    (CALL, None),
    (f"{CALL}<|call|>", None),  # <|call|> is a stop token, usually cut: both read the same
    (f"Checking.<|start|>assistant{CALL}<|call|>", "Checking."),
    ('<|start|>assistant to=functions.weather<|channel|>commentary json<|message|>{"city": "Oslo"}', None),
    (f"{CALL}\n<|call|>", None),  # what follows the object up to the end marker is the call's
])
def test_a_message_to_a_function_is_a_call(text: str, content: str | None) -> None:
    assert PLAN.calls(text).content == content
    assert _calls(text) == [("weather", '{"city": "Oslo"}')]


def test_several_calls_and_messages_that_only_look_like_one() -> None:
    two = f"{CALL}<|call|><|start|>assistant{CALL.replace('weather', 'time').replace('Oslo', 'Rome')}"
    assert _calls(two) == [("weather", '{"city": "Oslo"}'), ("time", '{"city": "Rome"}')]
    for text in ("plain text", '<|channel|>commentary<|message|>{"city": "Oslo"}',  # no recipient
                 "<|channel|>commentary to=functions.weather<|message|>{not json",
                 "<|channel|>commentary to=functions.weather<|message|>[1]",
                 '<|channel|>analysis to=python code<|message|>{"a": 1}',  # not a function
                 '<|channel|>commentary to=functions.weather<|return|><|message|>{"a": 1}'):  # no header
        parsed = PLAN.calls(text)
        assert parsed.calls == [] and parsed.content == text


def test_a_header_waits_for_its_message_marker_and_the_body_streams() -> None:
    stream = PLAN.stream()
    assert stream.feed("Hi <|chan") == [ContentText("Hi ")]  # a marker may be starting
    assert stream.feed("nel|>commentary to=functions.weather <|constrain|>json<|mess") == []
    opened, arguments = stream.feed('age|>{"city": "Os')
    assert isinstance(opened, CallOpened) and opened.name == "weather"
    assert arguments == CallArguments('{"city": "Os')
    assert stream.feed('lo"}<|ca') == [CallArguments('lo"}'), CallClosed()]
    assert stream.feed("ll|> and more") == [ContentText(" and more")]


def test_unclosed_arguments_end_at_a_marker_outside_their_strings() -> None:
    assert _calls('<|channel|>commentary to=functions.f<|message|>{"a": "<|end|>", "b": 1<|call|>') == [
        ("f", '{"a": "<|end|>", "b": 1')]
