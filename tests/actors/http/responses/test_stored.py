"""Stored responses through the openai SDK: previous_response_id renders the stored conversation (as chat
completions render the same messages), retrieve / delete / input_items, store: false, and the errors."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.actors.http.responses.conftest import forced
from tests.support.gateway_helpers import API_KEY

FIRST_TURN = "My name is Ada."
FIRST_ANSWER = "Nice to meet you, Ada."


def test_previous_response_id_continues_the_stored_conversation(client: openai.OpenAI, model: str) -> None:
    first = client.responses.create(model=model, input=FIRST_TURN, extra_body=forced(FIRST_ANSWER))
    second = client.responses.create(model=model, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=6, temperature=0)
    third = client.responses.create(model=model, input="And again?", previous_response_id=second.id,
                                    max_output_tokens=6, temperature=0)
    messages = [{"role": "user", "content": FIRST_TURN}, {"role": "assistant", "content": FIRST_ANSWER},
                {"role": "user", "content": "What is my name?"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens and second.previous_response_id == first.id
    messages += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "And again?"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
    assert third.output_text == chat.choices[0].message.content and third.usage.input_tokens == chat.usage.prompt_tokens


def test_the_instructions_of_a_previous_response_are_not_carried_over(client: openai.OpenAI, model: str) -> None:
    first = client.responses.create(model=model, input=FIRST_TURN, instructions="Be brief.",
                                    extra_body=forced(FIRST_ANSWER))
    second = client.responses.create(model=model, input="Hi", previous_response_id=first.id, max_output_tokens=2)
    explicit = client.responses.create(model=model, max_output_tokens=2, input=[
        {"role": "user", "content": FIRST_TURN}, {"role": "assistant", "content": FIRST_ANSWER},
        {"role": "user", "content": "Hi"}])
    assert second.usage.input_tokens == explicit.usage.input_tokens and second.instructions is None


def test_retrieve_gives_the_stored_response_and_input_items_its_input(client: openai.OpenAI, model: str) -> None:
    created = client.responses.create(model=model, instructions="Be brief.", max_output_tokens=4, input=[
        {"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"},
        {"role": "user", "content": [{"type": "input_text", "text": "Three"}]}])
    assert client.responses.retrieve(created.id) == created
    items = list(client.responses.input_items.list(created.id))  # newest first, as OpenAI lists them
    assert [(item.role, item.content[0].text) for item in items] == [("user", "Three"), ("assistant", "Two"),
                                                                     ("user", "One")]
    assert all(item.id.startswith("msg_") and item.status == "completed" for item in items)
    assert items[1].content[0].type == "output_text" and items[0].content[0].type == "input_text"
    page = client.responses.input_items.list(created.id, order="asc", limit=2)
    assert [item.content[0].text for item in page.data] == ["One", "Two"] and page.has_more
    rest = client.responses.input_items.list(created.id, order="asc", after=page.data[-1].id)
    assert [item.content[0].text for item in rest.data] == ["Three"] and not rest.has_more


def test_a_deleted_response_is_gone(client: openai.OpenAI, model: str) -> None:
    created = client.responses.create(model=model, input="Hello", max_output_tokens=2)
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError, match="previous response"):
        client.responses.create(model=model, input="Hi", previous_response_id=created.id)


def test_store_false_keeps_nothing(client: openai.OpenAI, model: str) -> None:
    created = client.responses.create(model=model, input="Hello", max_output_tokens=2, store=False)
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    streamed = list(client.responses.create(model=model, input="Hello", max_output_tokens=2, store=False, stream=True))
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(streamed[-1].response.id)


def test_a_streamed_response_is_stored_before_its_last_event(client: openai.OpenAI, model: str) -> None:
    events = list(client.responses.create(model=model, input="Hello", stream=True, extra_body=forced("Hi!")))
    stored = client.responses.retrieve(events[-1].response.id)
    assert stored.output_text == "Hi!" and stored.output == events[-1].response.output


def test_cancel_is_for_background_responses_only(client: openai.OpenAI, model: str) -> None:
    created = client.responses.create(model=model, input="Hello", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.cancel(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_unknown")
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.create(model=model, input="Hello", background=True)


def test_unknown_ids_are_404s(client: openai.OpenAI, model: str) -> None:
    for call in (lambda: client.responses.retrieve("resp_unknown"), lambda: client.responses.delete("resp_unknown"),
                 lambda: client.responses.input_items.list("resp_unknown"),
                 lambda: client.responses.create(model=model, input="Hi", previous_response_id="resp_unknown")):
        with pytest.raises(openai.NotFoundError):
            call()


@pytest.mark.parametrize("body, param", [
    ({}, None), ({"input": []}, None), ({"input": [{"role": "robot", "content": "Hi"}]}, None),
    ({"input": [{"role": "user", "content": "Hi", "colour": "red"}]}, None),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, None),
    ({"input": "Hi", "max_output_tokens": 0}, None), ({"input": "Hi", "max_tokens": 5}, "max_tokens"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, None),
    ({"input": "Hi", "text": {"format": {"type": "xml"}}}, None), ({"input": "Hi", "n": 2}, "n"),
    ({"input": "Hi", "previous_response_id": 7}, "previous_response_id"),
])
def test_bad_bodies_are_400s_naming_the_problem(server: tuple[str, str], model: str, body: dict,
                                                param: str | None) -> None:
    answer = httpx.post(f"{server[0]}/responses", json={"model": model, **body},
                        headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert param is None or error["param"] == param


def test_the_routes_need_the_api_key(server: tuple[str, str]) -> None:
    for method, path in (("POST", "/responses"), ("GET", "/responses/resp_x"), ("DELETE", "/responses/resp_x"),
                         ("GET", "/responses/resp_x/input_items"), ("POST", "/responses/resp_x/cancel")):
        assert httpx.request(method, f"{server[0]}{path}", json={}, timeout=30).status_code == 401


def test_x_request_id_attaches_a_retry_and_refuses_another_body(server: tuple[str, str], model: str) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}", "X-Request-Id": "responses-retry-1"}
    body = {"model": model, "input": "Hello", "max_output_tokens": 4, "temperature": 0.9}
    first = httpx.post(f"{server[0]}/responses", json=body, headers=headers, timeout=30).json()
    again = httpx.post(f"{server[0]}/responses", json=body, headers=headers, timeout=30).json()
    assert again["output"][0]["content"] == first["output"][0]["content"] and again["id"] != first["id"]
    other = httpx.post(f"{server[0]}/responses", json={**body, "input": "Bye"}, headers=headers, timeout=30)
    assert other.status_code == 409
