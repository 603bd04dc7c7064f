"""Function tools through /v1/responses with the openai SDK: required and a named function always parse (the
constraint chat completions use), auto reads a Hermes-style call with the server's parser; a call's
function_call_output continues the conversation, stored or sent back whole, as chat's tool messages do."""

from __future__ import annotations

import json
from typing import Any

import openai

from tests.actors.http.responses.conftest import forced, whole_and_streamed

WEATHER = {"type": "function", "name": "weather", "description": "The weather in a city now", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima", "Pune"]}},
    "required": ["city"], "additionalProperties": False}, "strict": True}
QUESTION = "What is the weather in Oslo?"
HERMES_CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def _call(client: openai.OpenAI, model: str, **request: Any) -> Any:
    request = {"input": QUESTION, "tools": [WEATHER], "temperature": 0, "max_output_tokens": 96, **request}
    return whole_and_streamed(client, model=model, **request)


def test_required_calls_a_function_and_its_output_continues_the_conversation(client: openai.OpenAI,
                                                                             model: str) -> None:
    called = _call(client, model, tool_choice="required", parallel_tool_calls=False)
    assert [item.type for item in called.output] == ["function_call"] and called.output_text == ""
    call = called.output[0]
    assert call.name == "weather" and call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["city"] in ("Oslo", "Lima", "Pune") and call.status == "completed"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    answer = client.responses.create(model=model, previous_response_id=called.id, input=[result], tools=[WEATHER],
                                     tool_choice="none", extra_body=forced("It is sunny."))
    assert answer.output_text == "It is sunny." and answer.usage.input_tokens > called.usage.input_tokens
    resent = client.responses.create(model=model, tools=[WEATHER], tool_choice="none",
                                     input=[{"role": "user", "content": QUESTION}, call.model_dump(), result],
                                     extra_body=forced("It is sunny."))
    assert resent.usage.input_tokens == answer.usage.input_tokens  # the stored conversation is the explicit one
    chat = client.chat.completions.create(model=model, max_tokens=1, tools=[_chat_tool()], tool_choice="none",
                                          messages=[{"role": "user", "content": QUESTION},
                                                    {"role": "assistant", "content": None, "tool_calls": [
                                                        {"id": call.call_id, "type": "function", "function": {
                                                            "name": "weather", "arguments": call.arguments}}]},
                                                    {"role": "tool", "tool_call_id": call.call_id,
                                                     "content": "Sunny, 21 C"}])
    assert chat.usage.prompt_tokens == answer.usage.input_tokens  # the same prompt as chat completions'


def test_a_named_function_streams_its_arguments_as_deltas(client: openai.OpenAI, model: str) -> None:
    called = _call(client, model, tool_choice={"type": "function", "name": "weather"})
    assert [(item.type, item.name) for item in called.output] == [("function_call", "weather")]
    events = list(client.responses.create(model=model, input=QUESTION, tools=[WEATHER], temperature=0, stream=True,
                                          max_output_tokens=96, tool_choice={"type": "function", "name": "weather"}))
    deltas = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    done = next(event for event in events if event.type == "response.function_call_arguments.done")
    assert len(deltas) > 1 and "".join(deltas) == done.arguments == called.output[0].arguments


def test_a_call_cut_by_max_output_tokens_is_incomplete(client: openai.OpenAI, model: str) -> None:
    cut = _call(client, model, tool_choice={"type": "function", "name": "weather"}, max_output_tokens=3)
    assert cut.status == "incomplete" and cut.output[0].status == "incomplete"


def test_auto_reads_the_model_s_own_call_format_and_keeps_the_text_before_it(client: openai.OpenAI,
                                                                            model: str) -> None:
    response = _call(client, model, extra_body=forced("Let me check. " + HERMES_CALL))  # auto: the default
    assert [item.type for item in response.output] == ["message", "function_call"]
    assert response.output_text == "Let me check. "
    assert json.loads(response.output[1].arguments) == {"city": "Oslo"}


def test_auto_streams_a_call_s_arguments_as_they_are_generated(client: openai.OpenAI, model: str) -> None:
    request = {"input": QUESTION, "tools": [WEATHER], "temperature": 0, "max_output_tokens": 96,
               "extra_body": forced("Let me check. " + HERMES_CALL)}
    whole = _call(client, model, **{key: value for key, value in request.items() if key != "input"})
    events = list(client.responses.create(model=model, stream=True, **request))
    added = [event.item for event in events if event.type == "response.output_item.added"]
    assert [(item.type, getattr(item, "arguments", None)) for item in added] == [("message", None),
                                                                                 ("function_call", "")]
    deltas = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    done = next(event for event in events if event.type == "response.function_call_arguments.done")
    assert len(deltas) > 1 and "".join(deltas) == done.arguments == whole.output[1].arguments == '{"city": "Oslo"}'


def test_none_leaves_a_call_looking_answer_as_text(client: openai.OpenAI, model: str) -> None:
    response = _call(client, model, tool_choice="none", extra_body=forced(HERMES_CALL))
    assert [item.type for item in response.output] == ["message"] and response.output_text == HERMES_CALL


def _chat_tool() -> dict[str, Any]:
    function = {key: value for key, value in WEATHER.items() if key != "type"}
    return {"type": "function", "function": function}
