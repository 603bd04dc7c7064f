"""Tool calling through the front door, with the official openai SDK against an embedded server whose
model renders a Hermes-style template: a whole conversation (call -> tool result -> answer), streamed
and not; `required` and a named function always parse (random weights under the constraint); `auto`
needs --enable-auto-tool-choice; hostile tools and tool calls are 400s naming the field.

A random model never writes a call by itself, so `auto`'s parse path is driven by a regex
constraint that makes it write one in the Hermes format, as a tool-calling model would."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.tool_templates import HERMES, engine_with_template

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima", "Pune"]}},
                   "required": ["city"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "clock", "parameters": {"type": "object", "properties": {"hours": {"type": "integer", "minimum": 0,
                                                                              "maximum": 23}},
                                    "required": ["hours"], "additionalProperties": False}}}
TOOLS = [WEATHER, CLOCK]
QUESTION = [{"role": "user", "content": "What is the weather in Oslo?"}]
HERMES_CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


@pytest.fixture(scope="module")
def hermes_client(default_model_path: Path) -> Iterator[openai.OpenAI]:
    backend = EmbeddedBackend(engine_with_template(default_model_path, HERMES))
    with serving(backend, GatewayOptions(api_key=API_KEY, tool_call_parser="hermes")) as base_url:
        yield openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)


def forced(text: str) -> dict[str, Any]:
    """A constraint that makes the model write exactly `text`."""
    return {"guided_regex": re.escape(text)}


def ask(client: openai.OpenAI, messages: list, **request: Any) -> dict[str, Any]:
    """The answer's message and finish_reason, non-streamed and streamed (accumulated from the deltas),
    checked equal; also how many content deltas came before the last chunk."""
    request = {"model": "default-model-v1", "messages": messages, "max_tokens": 64, "temperature": 0, **request}
    whole = client.chat.completions.create(**request).choices[0]
    message = {"content": whole.message.content, "calls": _calls(whole.message.tool_calls or [])}
    streamed = _accumulate(client.chat.completions.create(**request, stream=True))
    assert streamed["message"] == message
    assert streamed["finish_reason"] == whole.finish_reason
    return {**message, "finish_reason": whole.finish_reason, "ids": [c.id for c in whole.message.tool_calls or []],
            "early_content_deltas": streamed["early_content_deltas"]}


def _calls(calls: list) -> list[tuple[str, dict]]:
    return [(call.function.name, json.loads(call.function.arguments)) for call in calls]


def _accumulate(chunks: Any) -> dict[str, Any]:
    content, calls, finish_reason, early = None, {}, None, 0
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            content = (content or "") + delta.content
            early += chunk.choices[0].finish_reason is None
        for call in delta.tool_calls or []:  # a call's first delta names it, later ones add arguments
            if call.id is not None:
                assert call.type == "function" and call.id.startswith("call_") and call.index not in calls
                calls[call.index] = [call.function.name, ""]
            calls[call.index][1] += call.function.arguments
        finish_reason = chunk.choices[0].finish_reason or finish_reason
    return {"message": {"content": content, "calls": [(calls[i][0], json.loads(calls[i][1])) for i in sorted(calls)]},
            "finish_reason": finish_reason, "early_content_deltas": early}


def test_a_conversation_call_result_answer(hermes_client: openai.OpenAI) -> None:
    first = ask(hermes_client, QUESTION, tools=TOOLS, tool_choice="auto", extra_body=forced(HERMES_CALL))
    assert first["calls"] == [("weather", {"city": "Oslo"})] and first["content"] is None
    assert first["finish_reason"] == "tool_calls"
    history = [*QUESTION,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": first["ids"][0], "type": "function",
                    "function": {"name": "weather", "arguments": json.dumps({"city": "Oslo"})}}]},
               {"role": "tool", "tool_call_id": first["ids"][0], "content": "Sunny, 21 C"}]
    answer = "It is sunny in Oslo."
    final = ask(hermes_client, history, tools=TOOLS, extra_body=forced(answer))  # tool_choice unset: auto
    assert final == {"content": answer, "calls": [], "finish_reason": "stop", "ids": [],
                     "early_content_deltas": final["early_content_deltas"]}
    assert final["early_content_deltas"] > 0  # no call in sight: the content streamed as it came


def test_the_sdk_s_own_message_goes_back_into_the_conversation(hermes_client: openai.OpenAI) -> None:
    """As docs/http-api.md shows: the assistant message dumped by the SDK, then the tool's result."""
    messages: list[Any] = list(QUESTION)
    reply = hermes_client.chat.completions.create(model="default-model-v1", messages=messages, tools=TOOLS,
                                                  tool_choice="required", max_tokens=200, temperature=0)
    message = reply.choices[0].message
    messages += [message.model_dump(exclude_none=True),
                 *({"role": "tool", "tool_call_id": call.id, "content": "done"} for call in message.tool_calls)]
    answer = hermes_client.chat.completions.create(model="default-model-v1", messages=messages, tools=TOOLS,
                                                   tool_choice="none", max_tokens=8, temperature=0)
    assert answer.choices[0].message.tool_calls is None and answer.usage.prompt_tokens > reply.usage.prompt_tokens


def test_text_before_a_call_streams_and_the_calls_follow_as_they_are_written(hermes_client: openai.OpenAI) -> None:
    two_calls = HERMES_CALL + '\n<tool_call>\n{"name": "clock", "arguments": {"hours": 7}}\n</tool_call>'
    result = ask(hermes_client, QUESTION, tools=TOOLS, extra_body=forced("Let me look that up. " + two_calls),
                 max_tokens=128)
    assert result["content"] == "Let me look that up. \n"  # text outside the calls, the one between them too
    assert result["calls"] == [("weather", {"city": "Oslo"}), ("clock", {"hours": 7})]
    assert result["early_content_deltas"] > 0
    single = ask(hermes_client, QUESTION, tools=TOOLS, parallel_tool_calls=False, extra_body=forced(two_calls),
                 max_tokens=128)
    assert single["calls"] == [("weather", {"city": "Oslo"})]


def test_the_sdk_s_stream_helper_adds_the_argument_fragments_up(hermes_client: openai.OpenAI) -> None:
    """The openai SDK's own accumulator (chat.completions.stream) gets each call's arguments piece by piece
    and ends with the non-streamed message."""
    two_calls = HERMES_CALL + '\n<tool_call>\n{"name": "clock", "arguments": {"hours": 7}}\n</tool_call>'
    request: dict[str, Any] = {"model": "default-model-v1", "messages": QUESTION, "tools": TOOLS, "max_tokens": 128,
                               "temperature": 0, "extra_body": forced("Let me look. " + two_calls)}
    whole = hermes_client.chat.completions.create(**request).choices[0]
    with hermes_client.chat.completions.stream(**request) as stream:
        fragments = [event for event in stream if event.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion().choices[0]
    assert len(fragments) > 4 and {event.index for event in fragments} == {0, 1}
    assert final.message.content == whole.message.content == "Let me look. \n"
    assert [(call.id.startswith("call_"), call.function.name, call.function.arguments)
            for call in final.message.tool_calls or []] == [
        (True, call.function.name, call.function.arguments) for call in whole.message.tool_calls or []]
    assert [call.function.arguments for call in whole.message.tool_calls or []] == ['{"city": "Oslo"}', '{"hours": 7}']
    assert final.finish_reason == whole.finish_reason == "tool_calls"


def test_text_that_only_looks_like_a_call_stays_content(hermes_client: openai.OpenAI) -> None:
    text = "<tool_call>not json</tool_call>"
    result = ask(hermes_client, QUESTION, tools=TOOLS, extra_body=forced(text))
    assert result["content"] == text and result["calls"] == [] and result["finish_reason"] == "stop"


def test_none_leaves_a_call_as_text(hermes_client: openai.OpenAI) -> None:
    result = ask(hermes_client, QUESTION, tools=TOOLS, tool_choice="none", extra_body=forced(HERMES_CALL))
    assert result["content"] == HERMES_CALL and result["calls"] == []


@pytest.mark.parametrize("seed", range(4))
def test_required_always_gives_calls_that_parse(hermes_client: openai.OpenAI, seed: int) -> None:
    result = ask(hermes_client, QUESTION, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed,
                 max_tokens=200)
    assert result["finish_reason"] == "tool_calls" and result["content"] is None
    assert result["calls"]
    for name, arguments in result["calls"]:
        assert (name, sorted(arguments)) in (("weather", ["city"]), ("clock", ["hours"]))
        assert arguments.get("city", "Oslo") in ("Oslo", "Lima", "Pune") and 0 <= arguments.get("hours", 0) <= 23


def test_a_named_function_is_called(hermes_client: openai.OpenAI) -> None:
    for seed in range(3):
        result = ask(hermes_client, QUESTION, tools=TOOLS, temperature=1.0, seed=seed, max_tokens=100,
                     tool_choice={"type": "function", "function": {"name": "clock"}})
        [(name, arguments)] = result["calls"]
        assert name == "clock" and 0 <= arguments["hours"] <= 23
    with_one = ask(hermes_client, QUESTION, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                   max_tokens=200, temperature=1.0, seed=5)
    assert len(with_one["calls"]) == 1


def test_auto_needs_the_server_flag(client: openai.OpenAI, model: str) -> None:
    """The conftest server runs without --enable-auto-tool-choice: vLLM's 400 and message."""
    for tool_choice in ("auto", openai.NOT_GIVEN):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS, tool_choice=tool_choice)
        assert "requires --enable-auto-tool-choice and --tool-call-parser" in str(refused.value)
        assert refused.value.body["param"] == "tool_choice"
    answer = client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS, tool_choice="required",
                                            max_tokens=200, temperature=0)
    assert answer.choices[0].message.tool_calls  # required needs no parser


HOSTILE = [
    ({"tools": [{"type": "function"}]}, "tools[0] must be"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": "nope"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "x", "bogus": 1}}]}, "tools[0].function has unknown"),
    ({"tools": [WEATHER, WEATHER]}, "is given twice"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "at most 128"),
    ({"tools": [{"type": "function", "function": {"name": "x", "description": "d" * 300_000}}]},
     "at most 262144 characters"),
    ({"tools": "weather"}, "tools must be"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "object", "properties": {
        f"p{i}": {"type": "string", "description": "d" * 100} for i in range(800)}}}}], "tool_choice": "required"},
     "become a constraint of at most 65536 characters"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "no-such-type"}}}],
      "tool_choice": "required"}, "no-such-type"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice must be"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "weather", "x": 1}}},
     "tool_choice must be"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
    ({"tool_choice": "required"}, "needs tools"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls must be"),
    ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "cannot be combined with guided_regex"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "messages[0].tool_calls is only for assistant messages"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
     "messages[0].tool_calls[0].function.arguments must be the text of a JSON object"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]},
     "messages[0].tool_calls[0].function.arguments must be a string"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages[0].tool_calls[0].id"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "web", "function": {"name": "f", "arguments": "{}"}}]}]}, "tool_calls[0].type"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "[" * 100 + "]" * 100}}]}]}, "arguments must be"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": str(i), "function": {"name": "f", "arguments": "{}"}} for i in range(129)]}]}, "at most 128 calls"),
    ({"messages": [{"role": "tool", "content": "sunny"}]}, "messages[0].tool_call_id must be"),
    ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}, "tool_call_id is only for tool"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content"),
    ({"functions": [{"name": "f"}]}, "not supported yet: functions"),
]


@pytest.mark.parametrize("fields, complaint", HOSTILE)
def test_hostile_tools_and_calls_are_400s(hermes_client: openai.OpenAI, fields: dict, complaint: str) -> None:
    body = {"model": "default-model-v1", "messages": QUESTION, "max_tokens": 4, **fields}
    response = httpx.post(f"{hermes_client.base_url}chat/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 400, response.text
    assert complaint in response.json()["error"]["message"]
