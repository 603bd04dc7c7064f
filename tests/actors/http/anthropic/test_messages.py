"""POST /v1/messages and /v1/messages/count_tokens through the official anthropic SDK: a message whole and
streamed (the same message, Anthropic's event order), stop sequences and max_tokens as stop reasons, the
system prompt as a string or blocks, count_tokens against the chat template's count, errors in Anthropic's
shape, and the same answer as chat completions gives for the same conversation."""

from __future__ import annotations

import json
import re
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.actors.http.anthropic.conftest import greedy
from tests.support.gateway_helpers import API_KEY

HELLO = [{"role": "user", "content": "Hello there"}]


def whole_and_streamed(client: anthropic.Anthropic, **request: Any) -> anthropic.types.Message:
    """The message non-streamed, checked equal (but for its ids) to the one the SDK accumulates from the stream."""
    whole = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        streamed = stream.get_final_message()
    assert _without_ids(streamed) == _without_ids(whole)
    return whole


def _without_ids(message: anthropic.types.Message) -> dict[str, Any]:
    dumped = message.model_dump(exclude={"id"})
    for block in dumped["content"]:
        if block["type"] == "tool_use":
            assert block.pop("id").startswith("toolu_")
    return dumped


def test_a_message_is_anthropic_s_message_object_streamed_or_not(client: anthropic.Anthropic, model: str) -> None:
    message = whole_and_streamed(client, model=model, max_tokens=8, messages=HELLO, extra_body=greedy())
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == model
    assert [block.type for block in message.content] == ["text"] and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 8


def test_the_stream_is_anthropic_s_event_sequence(server: tuple[str, str], model: str) -> None:
    body = {"model": model, "max_tokens": 6, "messages": HELLO, "stream": True,
            **greedy("Hi, how are you")}
    response = httpx.post(f"{server[0]}/v1/messages", json=body, headers={"x-api-key": API_KEY}, timeout=60)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = [_event(text) for text in response.text.strip().split("\n\n")]
    names = " ".join(name for name, _ in events)
    assert re.fullmatch(r"message_start ping content_block_start( content_block_delta)+ content_block_stop "
                        r"message_delta message_stop", names), names
    assert all(data["type"] == name for name, data in events)  # each event names itself on both lines
    start, delta = events[0][1], events[-2][1]
    assert start["message"]["content"] == [] and start["message"]["usage"]["input_tokens"] > 0
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert text == "Hi, how are you" and events[2][1]["content_block"] == {"type": "text", "text": ""}
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 6


def _event(text: str) -> tuple[str, dict[str, Any]]:
    event_line, data_line = text.split("\n")
    assert event_line.startswith("event: ") and data_line.startswith("data: ")
    return event_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))


def test_a_stop_sequence_ends_the_message_and_is_named(client: anthropic.Anthropic, model: str) -> None:
    message = whole_and_streamed(client, model=model, max_tokens=16, messages=HELLO,
                                 stop_sequences=["never", "world"], extra_body=greedy("Hello world, bye"))
    assert message.content[0].text == "Hello "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "world")


def test_max_tokens_ends_the_message_with_its_stop_reason(client: anthropic.Anthropic, model: str) -> None:
    message = whole_and_streamed(client, model=model, max_tokens=3, messages=HELLO,
                                 extra_body=greedy("one two three four five six seven"))
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    assert "one two three four five six seven".startswith(message.content[0].text)


def test_the_system_prompt_as_a_string_or_as_blocks_is_the_same_prompt(client: anthropic.Anthropic,
                                                                       model: str) -> None:
    request: dict[str, Any] = {"model": model, "max_tokens": 4, "messages": HELLO, "extra_body": greedy()}
    as_string = client.messages.create(**request, system="Answer in French.")
    as_blocks = client.messages.create(**request, system=[{"type": "text", "text": "Answer in French."}])
    without = client.messages.count_tokens(model=model, messages=HELLO).input_tokens
    assert as_string.content == as_blocks.content
    assert as_string.usage.input_tokens == as_blocks.usage.input_tokens > without  # the template's system turn


def test_count_tokens_is_the_chat_template_s_count_and_the_message_s_input_tokens(
        client: anthropic.Anthropic, server: tuple[str, str], model: str) -> None:
    system = "You are terse. <|im_end|> stays text."  # special-token text is counted as a worker tokenizes it
    counted = client.messages.count_tokens(model=model, system=system, messages=HELLO).input_tokens
    tokenized = httpx.post(f"{server[0]}/tokenize", headers={"Authorization": f"Bearer {API_KEY}"}, json={
        "messages": [{"role": "system", "content": system}, *HELLO]}).json()["count"]
    message = client.messages.create(model=model, max_tokens=1, system=system, messages=HELLO)
    assert counted == tokenized == message.usage.input_tokens


def test_the_same_conversation_answers_as_chat_completions_does(client: anthropic.Anthropic, server: tuple[str, str],
                                                               model: str) -> None:
    chat = openai.OpenAI(base_url=f"{server[0]}/v1", api_key=API_KEY, max_retries=0)
    completion = chat.chat.completions.create(model=model, max_tokens=10, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, *HELLO])
    message = client.messages.create(model=model, max_tokens=10, system="Be brief.", messages=HELLO,
                                     extra_body=greedy())
    assert message.content[0].text == completion.choices[0].message.content
    assert message.usage.input_tokens == completion.usage.prompt_tokens
    assert message.usage.output_tokens == completion.usage.completion_tokens


@pytest.mark.parametrize("bad, named", [({"max_tokens": 0}, "max_tokens"), ({"messages": []}, "messages"),
                                        ({"extra_body": {"stop": ["x"]}}, "stop_sequences"),
                                        ({"messages": [*HELLO, {"role": "assistant", "content": "Sure"}]}, "prefill"),
                                        ({"extra_body": {"thinking": {"type": "enabled", "budget_tokens": 9}}},
                                         "thinking")])
def test_a_bad_body_is_a_400_in_anthropic_s_shape(client: anthropic.Anthropic, model: str, bad: dict[str, Any],
                                                  named: str) -> None:
    request = {"model": model, "max_tokens": 4, "messages": HELLO, **bad}
    for stream in (False, True):  # refused before the stream starts: a status, not an event
        with pytest.raises(anthropic.BadRequestError) as raised:
            client.messages.create(**request, stream=stream)
        body = raised.value.body
        assert raised.value.status_code == 400 and set(body) == {"type", "error"} and body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error" and named in body["error"]["message"]


def test_the_api_key_comes_in_x_api_key_or_as_a_bearer_token(server: tuple[str, str], model: str) -> None:
    wrong = anthropic.Anthropic(base_url=server[0], api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as raised:
        wrong.messages.create(model=model, max_tokens=1, messages=HELLO)
    assert raised.value.status_code == 401 and raised.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.count_tokens(model=model, messages=HELLO)
    bearer = anthropic.Anthropic(base_url=server[0], auth_token=API_KEY, max_retries=0)
    assert bearer.messages.count_tokens(model=model, messages=HELLO).input_tokens > 0


def test_another_model_is_a_404_and_an_unknown_field_is_named(client: anthropic.Anthropic, model: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as raised:
        client.messages.create(model="claude-nonexistent", max_tokens=1, messages=HELLO)
    assert raised.value.body["error"]["type"] == "not_found_error"
    raw = client.messages.with_raw_response.create(model=model, max_tokens=1, messages=HELLO,
                                                   extra_body={"temperatur": 0.5})
    assert raw.headers["x-ignored-fields"] == "temperatur" and raw.parse().usage.output_tokens == 1
