"""Structured outputs through the front door: the official openai SDK's parse helpers, every request
spelling on /v1/completions and /v1/chat/completions, streaming equal to non-streaming, and
constraints that do not compile answered with a 400 naming the compiler's complaint."""

from __future__ import annotations

import json
import re
from typing import Literal

import openai
import pydantic
import pytest


class Pet(pydantic.BaseModel):
    kind: Literal["cat", "dog", "fish"]
    legs: int = pydantic.Field(ge=0, le=8)


def test_the_sdk_parse_helper_returns_the_pydantic_object(client: openai.OpenAI, model: str) -> None:
    for temperature in (0.0, 1.0):
        completion = client.chat.completions.parse(
            model=model, messages=[{"role": "user", "content": "Describe a pet."}], response_format=Pet,
            temperature=temperature, seed=1, max_tokens=64)
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "stop"
        assert isinstance(message.parsed, Pet), message.content
        assert Pet.model_validate_json(message.content) == message.parsed


def test_json_object_and_choice_on_completions(client: openai.OpenAI, model: str) -> None:
    answer = client.completions.create(model=model, prompt="Pick:", max_tokens=16, temperature=0,
                                       extra_body={"guided_choice": ["left", "right"]})
    assert answer.choices[0].text in ("left", "right") and answer.choices[0].finish_reason == "stop"
    answer = client.completions.create(model=model, prompt="Code:", max_tokens=16, n=2, temperature=1, seed=3,
                                       extra_body={"structured_outputs": {"regex": "[A-Z]{2}[0-9]{3}"}})
    assert all(re.fullmatch("[A-Z]{2}[0-9]{3}", choice.text) for choice in answer.choices)


def test_streaming_sends_the_same_text(client: openai.OpenAI, model: str) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    request = {"model": model, "messages": [{"role": "user", "content": "Answer."}], "max_tokens": 32,
               "temperature": 1.0, "seed": 7,
               "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}
    whole = client.chat.completions.create(**request).choices[0].message.content
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        **request, stream=True) if chunk.choices)
    assert streamed == whole
    assert isinstance(json.loads(whole)["ok"], bool)


def test_a_json_schema_without_a_name_is_served(client: openai.OpenAI, model: str) -> None:
    """llama.cpp's clients send `json_schema: {"schema": ...}` alone; OpenAI's name is optional here."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "A number."}], max_tokens=32, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    assert isinstance(json.loads(answer.choices[0].message.content)["n"], int)


@pytest.mark.parametrize("extra, complaint", [
    ({"guided_regex": "a("}, "unclosed group"),
    ({"guided_json": {"type": "no-such-type"}}, "no-such-type"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice and guided_regex"),
])
def test_a_constraint_that_does_not_compile_is_a_400(client: openai.OpenAI, model: str, extra: dict,
                                                     complaint: str) -> None:
    with pytest.raises(openai.BadRequestError, match=re.escape(complaint)):
        client.completions.create(model=model, prompt="x", max_tokens=4, extra_body=extra)
