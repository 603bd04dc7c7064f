"""The Batch API on an embedded server (the built-in model), through the official openai client: files uploaded,
listed, read and deleted; a batch's lines answered once each, with the body a direct call returns; hostile lines
answered as errors while the rest run; cancel and expiry keep what was answered and answer the rest."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from actors.http.backends import EmbeddedBackend
from tests.support.batch_helpers import (
    by_custom_id,
    chat_line,
    completion_line,
    jsonl,
    results,
    submit,
    wait_until,
)
from tests.support.gateway_helpers import API_KEY


def test_a_batch_answers_each_line_once_with_the_body_a_direct_call_returns(
        client: openai.OpenAI, embedded: tuple[str, EmbeddedBackend]) -> None:
    lines = [chat_line("chat-1", "Hello"), completion_line("completion-1", "Once upon", logprobs=1),
             completion_line("two-prompts", ["Red", "Blue"], n=2, temperature=0.8, seed=3),
             chat_line("urgent-looking", "Hi", priority=-5)]
    batch = submit(client, lines)
    assert (batch.status, batch.request_counts.total) == ("validating", 4)
    batch = wait_until(client, batch.id)
    assert batch.status == "completed" and batch.request_counts.model_dump() == {"total": 4, "completed": 4,
                                                                                   "failed": 0}
    assert batch.error_file_id is None and batch.in_progress_at and batch.completed_at
    output, errors = results(client, batch)
    assert [line["custom_id"] for line in output] == ["chat-1", "completion-1", "two-prompts", "urgent-looking"]
    assert errors == []
    with httpx.Client(base_url=embedded[0], headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        for line, asked in zip(output, lines, strict=True):
            response = line["response"]
            assert response["status_code"] == 200 and line["error"] is None
            direct = http.post(asked["url"].removeprefix("/v1"), json=asked["body"],
                               headers={"X-Request-Id": response["request_id"]})
            assert _without_time(direct.json()) == _without_time(response["body"])
    assert len(output[2]["response"]["body"]["choices"]) == 4  # two prompts x n=2


def test_hostile_lines_are_answered_as_errors_and_the_rest_still_runs(client: openai.OpenAI) -> None:
    lines = ['{"custom_id": "not-json", ', chat_line("fine", "Hi"),
             {**chat_line("bad-url", "Hi"), "url": "/v1/images/generations"},
             {"custom_id": "body-a-list", "method": "POST", "url": "/v1/completions", "body": [1]},
             completion_line("too-long", "x", max_tokens=100_000),
             completion_line("bad-field", "x", temperature=-1),
             chat_line("streams", "Hi", stream=True),
             {"custom_id": "embeds", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
             {**chat_line("get", "Hi"), "method": "GET"}, "[1, 2]", "\n"]
    batch = wait_until(client, submit(client, lines).id)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 10, "completed": 1, "failed": 9}
    output, errors = results(client, batch)
    assert [line["custom_id"] for line in output] == ["fine"]
    failed = by_custom_id(errors)
    assert set(failed) == {"bad-url", "body-a-list", "too-long", "bad-field", "streams", "embeds", "get"}
    unnamed = [line["error"]["message"] for line in errors if line["custom_id"] is None]
    assert len(unnamed) == 2 and "not valid JSON" in unnamed[0] and "must be a JSON object" in unnamed[1]
    assert "url must be one of" in failed["bad-url"]["error"]["message"]
    assert failed["bad-url"]["response"] is None
    for custom_id, field in [("too-long", "max_tokens"), ("bad-field", "temperature"), ("streams", "stream"),
                             ("embeds", "--runner pooling")]:
        response = failed[custom_id]["response"]
        assert response["status_code"] == 400 and failed[custom_id]["error"] is None
        assert field in response["body"]["error"]["message"], response


def test_files_are_listed_read_and_deleted(client: openai.OpenAI) -> None:
    data = jsonl([chat_line("a", "Hi")])
    uploaded = client.files.create(file=("mine.jsonl", data), purpose="batch")
    assert (uploaded.object, uploaded.purpose, uploaded.bytes, uploaded.filename) == ("file", "batch", len(data),
                                                                                      "mine.jsonl")
    assert client.files.retrieve(uploaded.id) == uploaded
    assert client.files.content(uploaded.id).content == data
    assert uploaded.id in [file.id for file in client.files.list(purpose="batch")]
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-" + "0" * 32)


@pytest.mark.parametrize("lines, message", [
    ([chat_line("same", "a"), chat_line("other", "b"), chat_line("same", "c")], "appears on lines 1 and 3"),
    (["", "  "], "holds no request"),
])
def test_a_file_that_cannot_be_a_batch_is_a_400(client: openai.OpenAI, lines: list, message: str) -> None:
    with pytest.raises(openai.BadRequestError, match=message):
        submit(client, lines)


@pytest.mark.parametrize("fields, param", [
    ({"endpoint": "/v1/moderations"}, "endpoint"), ({"endpoint": "/v1/embeddings"}, "endpoint"),
    ({"completion_window": "1 day"}, "completion_window"), ({"completion_window": "200h"}, "completion_window"),
    ({"metadata": {"k": 1}}, "metadata"), ({"extra": True}, "extra"),
])
def test_a_bad_batch_body_is_a_400_naming_the_field(client: openai.OpenAI, fields: dict, param: str) -> None:
    uploaded = client.files.create(file=("r.jsonl", jsonl([chat_line("a", "Hi")])), purpose="batch")
    body = {"input_file_id": uploaded.id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **fields}
    with pytest.raises(openai.BadRequestError) as raised:
        client.post("/batches", body=body, cast_to=httpx.Response)
    assert raised.value.body["param"] == param  # type: ignore[index]


def test_cancel_keeps_the_answered_lines_and_cancels_the_rest(client: openai.OpenAI,
                                                              embedded: tuple[str, EmbeddedBackend]) -> None:
    quick = [chat_line(f"quick-{i}", "Hi") for i in range(2)]
    slow = [completion_line(f"slow-{i}", "Go", max_tokens=2000, ignore_eos=True) for i in range(40)]
    batch = submit(client, [*quick, *slow])
    wait_until(client, batch.id, statuses=("in_progress",))
    while client.batches.retrieve(batch.id).request_counts.completed < 2:
        time.sleep(0.05)
    assert client.batches.cancel(batch.id).status == "cancelling"
    batch = wait_until(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None and batch.cancelling_at is not None
    output, errors = results(client, batch)
    answered = by_custom_id([*output, *errors])
    assert set(answered) == {line["custom_id"] for line in [*quick, *slow]}
    assert all(answered[f"quick-{i}"]["response"]["status_code"] == 200 for i in range(2))
    assert any(line["error"] == {"code": "batch_cancelled", "message": _CANCELLED} for line in errors)
    assert batch.request_counts.completed + batch.request_counts.failed == 42
    scheduler = embedded[1].engine.scheduler
    _wait_idle(scheduler)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_lines_not_answered_by_the_completion_window_are_batch_expired(client: openai.OpenAI) -> None:
    lines = [completion_line(f"long-{i}", "Go", max_tokens=2000, ignore_eos=True) for i in range(64)]
    batch = wait_until(client, submit(client, lines, window="1s").id)
    assert batch.status == "expired" and batch.expired_at is not None and batch.output_file_id is None
    _, errors = results(client, batch)
    assert sorted(line["custom_id"] for line in errors) == sorted(line["custom_id"] for line in lines)
    assert all(line["error"]["code"] == "batch_expired" for line in errors)


def test_batches_are_listed_newest_first(client: openai.OpenAI) -> None:
    first, second = submit(client, [chat_line("a", "Hi")]), submit(client, [chat_line("b", "Hi")])
    listed = [batch.id for batch in client.batches.list(limit=100)]
    assert listed.index(second.id) < listed.index(first.id)
    page = client.batches.list(limit=1)
    assert len(page.data) == 1 and page.has_more
    for batch in (first, second):
        wait_until(client, batch.id)


_CANCELLED = "This request was not executed because the batch was cancelled."


def _without_time(body: dict) -> dict:
    return {key: value for key, value in body.items() if key != "created"}


def _wait_idle(scheduler: object, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (scheduler.running or scheduler.waiting) and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.05)
    assert not scheduler.running and not scheduler.waiting, "cancelled lines still run"  # type: ignore[attr-defined]


def test_json_lines_of_the_output_are_openai_s_format(client: openai.OpenAI) -> None:
    batch = wait_until(client, submit(client, [chat_line("x", "Hi")]).id)
    raw = client.files.content(batch.output_file_id).text  # type: ignore[arg-type]
    [line] = [json.loads(text) for text in raw.splitlines()]
    assert set(line) == {"id", "custom_id", "response", "error"} and line["id"].startswith("batch_req_")
    assert set(line["response"]) == {"status_code", "request_id", "body"}
    assert line["response"]["request_id"] == f"{batch.id}-0"
    assert line["response"]["body"]["object"] == "chat.completion"
