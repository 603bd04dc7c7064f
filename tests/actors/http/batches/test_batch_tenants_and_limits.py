"""The Batch API's bounds and tenants on an embedded server started with a key file of two tenants and small
limits: files and batches are their tenant's only (another tenant gets 404 and an empty list), a batch's lines
run as its tenant, and an over-size file, too many lines or a body that is not a form are clear 4xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from actors.http.backends import EmbeddedBackend
from actors.http.options import BatchOptions, GatewayOptions
from actors.http.tenancy.api_keys import parse_api_keys
from tests.support.batch_helpers import chat_line, submit, wait_until
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import serving

KEYS = parse_api_keys("sk-acme,acme,3\nsk-globex,globex\n")
LIMITS = BatchOptions(max_file_bytes=2000, max_lines=3)


@pytest.fixture(scope="module")
def base_url(default_model_path: Path) -> Iterator[str]:
    with serving(EmbeddedBackend(make_engine(default_model_path)), GatewayOptions(api_key=KEYS, batches=LIMITS)) as url:
        yield url


def _client(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)


def test_another_tenant_sees_neither_files_nor_batches(base_url: str) -> None:
    acme, globex = _client(base_url, "sk-acme"), _client(base_url, "sk-globex")
    batch = wait_until(acme, submit(acme, [chat_line("a", "Hi")]).id)
    assert batch.status == "completed"
    for call in (lambda: globex.batches.retrieve(batch.id), lambda: globex.batches.cancel(batch.id),
                 lambda: globex.files.retrieve(batch.input_file_id),
                 lambda: globex.files.content(batch.output_file_id),  # type: ignore[arg-type]
                 lambda: globex.files.delete(batch.input_file_id),
                 lambda: globex.batches.create(input_file_id=batch.input_file_id, endpoint="/v1/chat/completions",
                                               completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(globex.batches.list()) == [] and list(globex.files.list()) == []
    assert [b.id for b in acme.batches.list()] == [batch.id]
    with pytest.raises(openai.AuthenticationError):
        _client(base_url, "sk-nobody").files.list()


def test_an_over_size_file_is_a_413_and_too_many_lines_a_400(base_url: str) -> None:
    acme = _client(base_url, "sk-acme")
    with pytest.raises(openai.APIStatusError) as raised:
        acme.files.create(file=("big.jsonl", b"x" * 2001), purpose="batch")
    assert raised.value.status_code == 413 and "--batch-max-file-bytes" in raised.value.message
    with pytest.raises(openai.BadRequestError, match="more than 3 requests"):
        submit(acme, [chat_line(f"c{i}", "x") for i in range(4)])


@pytest.mark.parametrize("request_kwargs, message", [
    ({"json": {"purpose": "batch"}}, "multipart/form-data"),
    ({"files": {"file": ("a.jsonl", b"{}")}, "data": {"purpose": "fine-tune"}}, "purpose must be batch"),
    ({"files": {"file": ("a.jsonl", b"{}")}}, "purpose must be batch"),
    ({"data": {"purpose": "batch", "file": "not a file part"}, "files": {"other": ("a", b"")}}, "unknown form"),
    ({"files": {"upload": ("a.jsonl", b"{}")}, "data": {"purpose": "batch"}}, "unknown form"),
    ({"files": {"file": ("a.jsonl", b"{}")}, "data": {"purpose": "batch", "expires_after[seconds]": "5"}},
     "expires_after"),
])
def test_a_bad_upload_is_a_400_that_says_what(base_url: str, request_kwargs: dict, message: str) -> None:
    response = httpx.post(f"{base_url}/files", headers={"Authorization": "Bearer sk-acme"}, **request_kwargs)
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.text
