"""`--tool-call-parser openai` (gpt-oss's harmony calls, as `--reasoning-parser gpt_oss` leaves them in
the content): a message to a function is a call, its body the arguments; anything else stays content;
while streaming, what is settled is a prefix of the whole answer's parse."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.http.tool_parsers import PARSERS, SENDABLE, SETTLED

CALL = '<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city": "Oslo"}'


def _calls(text: str) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in PARSERS["openai"](text).calls]


@pytest.mark.parametrize(("text", "content"), [
    (CALL, None),
    (f"{CALL}<|call|>", None),  # <|call|> is a stop token, usually cut: both read the same
    (f"Checking.<|start|>assistant{CALL}<|call|>", "Checking."),
    ('<|start|>assistant to=functions.weather<|channel|>commentary json<|message|>{"city": "Oslo"}', None),
])
def test_a_message_to_a_function_is_a_call(text: str, content: str | None) -> None:
    assert PARSERS["openai"](text).content == content
    assert _calls(text) == [("weather", {"city": "Oslo"})]


def test_several_calls_and_messages_that_only_look_like_one() -> None:
    two = f"{CALL}<|call|><|start|>assistant{CALL.replace('weather', 'time').replace('Oslo', 'Rome')}"
    assert _calls(two) == [("weather", {"city": "Oslo"}), ("time", {"city": "Rome"})]
    for text in ("plain text", '<|channel|>commentary<|message|>{"city": "Oslo"}',  # no recipient
                 "<|channel|>commentary to=functions.weather<|message|>{not json",
                 "<|channel|>commentary to=functions.weather<|message|>[1]",
                 '<|channel|>analysis to=python code<|message|>{"a": 1}'):  # not a function
        parsed = PARSERS["openai"](text)
        assert parsed.calls == [] and parsed.content == text


def test_settled_calls_are_those_whose_message_has_ended() -> None:
    assert SETTLED["openai"](f"Hi {CALL}").calls == []  # its JSON may still grow
    ended = SETTLED["openai"](f"Hi {CALL}<|call|> and <|chan")
    assert ended.content == "Hi  and " and [call.name for call in ended.calls] == ["weather"]
    assert SENDABLE["openai"]("Hi <|sta") == 3 and SENDABLE["openai"]("  ") == 0
    assert SENDABLE["openai"]("Checking.<|start|>assistant") == len("Checking.")


_PIECES = st.sampled_from([CALL, "<|call|>", "<|end|>", "<|start|>assistant", "Hi ", "<|chan", "{", "}", " ",
                           "<|channel|>commentary<|message|>", "x"])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_PIECES, max_size=8), data=st.data())
def test_what_streams_settled_is_a_prefix_of_the_whole_parse(parts: list[str], data: st.DataObject) -> None:
    text = "".join(parts)
    whole = PARSERS["openai"](text)
    cut = data.draw(st.integers(0, len(text)))
    settled = SETTLED["openai"](text[:cut])
    assert (whole.content or "").startswith(settled.content or "")
    assert [(c.name, c.arguments) for c in settled.calls] == [(c.name, c.arguments)
                                                              for c in whole.calls[:len(settled.calls)]]
    assert (whole.content or "").startswith(text[:SENDABLE["openai"](text[:cut])])
