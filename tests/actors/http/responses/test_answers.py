"""POST /v1/responses with the official openai SDK: the Response object, its stream of events, and the same
answer as chat completions for the same conversation (one translation onto the chat path)."""

from __future__ import annotations

import json
from typing import Literal

import openai
from pydantic import BaseModel

from tests.actors.http.responses.conftest import forced, whole_and_streamed

HELLO = [{"role": "user", "content": "Hello"}]


def test_a_string_input_answers_as_chat_completions_does_at_temperature_0(client: openai.OpenAI, model: str) -> None:
    response = whole_and_streamed(client, model=model, input="Hello", max_output_tokens=8, temperature=0)
    chat = client.chat.completions.create(model=model, messages=HELLO, max_tokens=8, temperature=0)
    assert response.id.startswith("resp_") and response.object == "response" and response.model == model
    assert [item.type for item in response.output] == ["message"]
    assert response.output[0].id.startswith("msg_") and response.output[0].role == "assistant"
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


def test_instructions_are_the_system_message_and_are_repeated(client: openai.OpenAI, model: str) -> None:
    response = client.responses.create(model=model, input="Hello", instructions="Be brief.", max_output_tokens=6,
                                       temperature=0)
    chat = client.chat.completions.create(model=model, messages=[{"role": "system", "content": "Be brief."}, *HELLO],
                                          max_tokens=6, temperature=0)
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.instructions == "Be brief."
    developer = client.responses.create(model=model, max_output_tokens=6, temperature=0,
                                        input=[{"role": "developer", "content": "Be brief."}, *HELLO])
    assert developer.output_text == response.output_text  # a developer message is a system message


def test_an_answer_that_ends_by_itself_is_completed(client: openai.OpenAI, model: str) -> None:
    response = whole_and_streamed(client, model=model, input=HELLO, extra_body=forced("Hi there!"))
    assert response.status == "completed" and response.incomplete_details is None
    assert response.output_text == "Hi there!" and response.output[0].status == "completed"
    assert response.output[0].content[0].annotations == []
    with client.responses.stream(model=model, input=HELLO, extra_body=forced("Hi there!")) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Hi there!"


def test_max_output_tokens_makes_the_response_incomplete(client: openai.OpenAI, model: str) -> None:
    response = whole_and_streamed(client, model=model, input="Hello", max_output_tokens=3, temperature=0)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete" and response.usage.output_tokens == 3
    assert response.max_output_tokens == 3


def test_the_stream_sends_each_event_of_the_documented_sequence(client: openai.OpenAI, model: str) -> None:
    events = list(client.responses.create(model=model, input=HELLO, stream=True, extra_body=forced("Hi there!")))
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 2 and kinds == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * deltas, "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    item_id = events[2].item.id
    assert all(event.item_id == item_id for event in events[3:-2])
    assert events[-4].text == events[-3].part.text == events[-2].item.content[0].text == "Hi there!"
    assert events[-1].response.usage.output_tokens > 0


def test_text_format_json_schema_constrains_the_answer(client: openai.OpenAI, model: str) -> None:
    schema = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer",
              "minimum": 0, "maximum": 8}}, "required": ["kind", "legs"], "additionalProperties": False}
    text = {"format": {"type": "json_schema", "name": "pet", "schema": schema, "strict": True}}
    response = whole_and_streamed(client, model=model, input="Describe a pet.", text=text, temperature=0,
                                  max_output_tokens=60, extra_body={"guided_whitespace_pattern": ""})
    pet = json.loads(response.output_text)
    assert pet["kind"] in ("cat", "dog") and 0 <= pet["legs"] <= 8 and set(pet) == {"kind", "legs"}
    assert response.text.format.type == "json_schema" and response.text.format.name == "pet"


class Pet(BaseModel):
    kind: Literal["cat", "dog"]
    legs: int


def test_the_sdk_parse_helper_returns_the_parsed_object(client: openai.OpenAI, model: str) -> None:
    parsed = client.responses.parse(model=model, input="Describe a pet.", text_format=Pet, temperature=0,
                                    max_output_tokens=60, extra_body={"guided_whitespace_pattern": ""})
    assert isinstance(parsed.output_parsed, Pet)


def test_json_object_answers_a_json_object(client: openai.OpenAI, model: str) -> None:
    response = client.responses.create(model=model, input="Describe a pet.", text={"format": {"type": "json_object"}},
                                       extra_body={"guided_whitespace_pattern": ""}, max_output_tokens=40,
                                       temperature=0)
    assert response.output_text.startswith("{") and response.text.format.type == "json_object"
