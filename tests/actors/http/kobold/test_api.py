"""The KoboldAI routes of an embedded `aqueduct serve` (built-in model): generate, stream, abort, tokencount,
the info routes, the same text as the equivalent OpenAI request, and errors in Kobold's shape."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from actors.http.backends import EmbeddedBackend
from tests.actors.http.kobold.test_fields import KOBOLD_LITE, SILLYTAVERN_DEFAULTS
from tests.support.gateway_helpers import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def api(embedded: tuple[str, EmbeddedBackend]) -> httpx.Client:
    with httpx.Client(base_url=embedded[0].removesuffix("/v1"), headers=AUTH, timeout=120) as client:
        yield client


def kobold(**fields: Any) -> dict[str, Any]:
    return {"prompt": "Once upon a time", "max_length": 12, "max_context_length": 512, **fields}


def stream_events(api: httpx.Client, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    with api.stream("POST", "/api/extra/generate/stream", json=body) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        return parse_events(response.iter_lines())


def parse_events(lines: Any) -> list[tuple[str, dict[str, Any]]]:
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def test_sillytavern_s_default_body_generates(api: httpx.Client) -> None:
    response = api.post("/api/v1/generate", json={**SILLYTAVERN_DEFAULTS, "max_length": 10})
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    assert isinstance(result["text"], str) and result["finish_reason"] in ("length", "stop")


def test_kobold_lite_s_body_generates_under_api_latest_too(api: httpx.Client) -> None:
    response = api.post("/api/latest/generate", json={**KOBOLD_LITE, "max_length": 8})
    assert response.status_code == 200, response.text
    assert len(response.json()["results"]) == 1


def test_the_stream_gives_the_same_text_as_the_whole_answer(api: httpx.Client) -> None:
    body = kobold(temperature=0.9, top_k=40, sampler_seed=1234, rep_pen=1.1)
    whole = api.post("/api/v1/generate", json=body).json()["results"][0]
    events = stream_events(api, body)
    assert {name for name, _ in events} == {"message"}
    assert "".join(data["token"] for _, data in events) == whole["text"]
    assert events[-1][1] == {"token": "", "finish_reason": whole["finish_reason"]}


def test_a_kobold_request_and_its_openai_equivalent_give_the_same_text(model: str, api: httpx.Client,
                                                                       client: openai.OpenAI) -> None:
    body = kobold(temperature=0.8, top_k=20, top_p=0.9, top_a=0.1, min_p=0.02, rep_pen=1.15, tfs=0.95,
                  typical=0.97, sampler_seed=42, sampler_order=[6, 0, 1, 2, 3, 4, 5], max_length=16,
                  dynatemp_range=0.3, xtc_probability=0.5, xtc_threshold=0.05, dry_multiplier=0.5,
                  rep_pen_range=8, rep_pen_slope=0.7)
    text = api.post("/api/v1/generate", json=body).json()["results"][0]["text"]
    same = client.completions.create(
        model=model, prompt=body["prompt"], max_tokens=16, seed=42, top_p=0.9,
        extra_body={"top_k": 20, "min_p": 0.02, "top_a": 0.1, "repetition_penalty": 1.15, "tfs": 0.95,
                    "typical_p": 0.97, "dynatemp_min": 0.5, "dynatemp_max": 1.1, "xtc_probability": 0.5,
                    "xtc_threshold": 0.05, "dry_multiplier": 0.5, "truncate_prompt_tokens": 512 - 16,
                    "repetition_penalty_range": 8, "repetition_penalty_slope": 0.7})
    assert text == same.choices[0].text


def test_a_long_prompt_keeps_its_last_tokens(embedded: tuple[str, EmbeddedBackend], model: str,
                                             api: httpx.Client, client: openai.OpenAI) -> None:
    prompt = " ".join(f"word{i}" for i in range(200))
    ids = embedded[1].tokenizer.encode(prompt)
    assert len(ids) > 100
    text = api.post("/api/v1/generate", json=kobold(prompt=prompt, max_context_length=60, max_length=10,
                                                    temperature=0)).json()["results"][0]["text"]
    kept = client.completions.create(model=model, prompt=ids[-50:], max_tokens=10, temperature=0)
    assert text == kept.choices[0].text


def test_n_choices_and_a_grammar(api: httpx.Client) -> None:
    results = api.post("/api/v1/generate", json=kobold(n=3, temperature=1.0, sampler_seed=5)).json()["results"]
    assert len(results) == 3
    answers = api.post("/api/v1/generate", json=kobold(n=4, temperature=1.5, sampler_seed=9,
                                                       grammar='root ::= "yes" | "no"')).json()["results"]
    assert {result["text"] for result in answers} <= {"yes", "no"}


def test_stop_sequences_and_trim_stop(api: httpx.Client) -> None:
    whole = api.post("/api/v1/generate", json=kobold(temperature=0, max_length=16)).json()["results"][0]["text"]
    stop = whole[len(whole) // 2:][:3]
    assert stop.strip(), whole
    trimmed = api.post("/api/v1/generate", json=kobold(temperature=0, max_length=16, stop_sequence=[stop]))
    assert trimmed.json()["results"][0] == {"text": whole[:whole.index(stop)], "finish_reason": "stop"}
    kept = api.post("/api/v1/generate", json=kobold(temperature=0, max_length=16, stop_sequence=[stop],
                                                    trim_stop=False))
    assert kept.json()["results"][0]["text"] == whole[:whole.index(stop) + len(stop)]


def test_abort_by_genkey_ends_a_stream_early(api: httpx.Client) -> None:
    body = kobold(max_length=400, max_context_length=1024, temperature=1.0, genkey="KCPP1234",
                  use_default_badwordsids=True)
    with api.stream("POST", "/api/extra/generate/stream", json=body) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert "token" in json.loads(first.removeprefix("data: "))
        aborted = api.post("/api/extra/abort", json={"genkey": "KCPP1234"})
        assert aborted.status_code == 200 and aborted.json() == {"success": True}
        events = parse_events(lines)
    assert events[-1][1]["finish_reason"] == "abort"
    assert len(events) < 399
    assert api.post("/api/extra/abort", json={"genkey": "KCPP9999"}).json() == {"success": False}


def test_abort_without_a_genkey_is_refused_in_kobold_s_shape(api: httpx.Client) -> None:
    response = api.post("/api/extra/abort")  # SillyTavern's abort: no body
    assert response.status_code == 400 and response.json()["detail"]["param"] == "genkey"


def test_tokencount_is_the_tokenizer_s_count(embedded: tuple[str, EmbeddedBackend], api: httpx.Client) -> None:
    prompt = "The quick brown fox jumps over the lazy dog.\nAlice: hi"
    answer = api.post("/api/extra/tokencount", json={"prompt": prompt}).json()
    ids = embedded[1].tokenizer.encode(prompt, add_special_tokens=False)
    assert answer == {"value": len(ids), "ids": ids}
    assert api.post("/api/extra/tokencount", json={"prompt": 5}).status_code == 400


def test_info_routes(embedded: tuple[str, EmbeddedBackend], api: httpx.Client) -> None:
    backend = embedded[1]
    assert api.get("/api/v1/model").json() == {"result": f"aqueduct/{backend.model_name}"}
    assert api.get("/api/v1/info/version").json() == {"result": "1.2.4"}
    assert api.get("/api/extra/version").json()["result"] == "KoboldCpp"
    for path in ("/api/v1/config/max_context_length", "/api/v1/config/max_length",
                 "/api/latest/config/max_context_length", "/api/extra/true_max_context_length"):
        assert api.get(path).json() == {"value": backend.max_model_len}
    assert httpx.get(f"{api.base_url}/api/v1/model").status_code == 401  # no API key


@pytest.mark.parametrize(("fields", "param"), [
    ({"temprature": 0.7}, "temprature"),
    ({"rep_pen": 1.1, "rep_pen_range": -5}, "rep_pen_range"),
    ({"top_p": 0.9, "tfs": 0.9, "sampler_order": [6, 0, 1, 3, 4, 2, 5]}, "sampler_order"),
    ({"mirostat": 1}, "mirostat"),
    ({"typical": 1.5}, "typical"),
    ({"memory": "Alice is a cat."}, "memory"),
    ({"max_length": 600, "max_context_length": 512}, "max_length"),
    ({"grammar": "root ::= (("}, None),
])
def test_what_we_cannot_honour_is_a_400_naming_the_field(api: httpx.Client, fields: dict[str, Any],
                                                         param: str | None) -> None:
    response = api.post("/api/v1/generate", json=kobold(**fields))
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert detail["msg"] and detail["param"] == param
    if param is not None:
        assert param in detail["msg"]


def test_a_stream_of_several_choices_is_refused(api: httpx.Client) -> None:
    response = api.post("/api/extra/generate/stream", json=kobold(n=2))
    assert response.status_code == 400 and response.json()["detail"]["param"] == "n"


@pytest.mark.parametrize("raw", [
    b"", b"not json", b"[]", b'"prompt"', b"{\"prompt\": \"x\"", b'{"prompt": ["a"], "max_length": 5}',
    b'{"prompt": "x", "max_length": 1e400, "max_context_length": 64}',
    b'{"prompt": "x", "max_length": 99999999999999999999999, "max_context_length": 64}',
    b'{"prompt": "x", "max_length": true, "max_context_length": 64}',
    b'{"prompt": "x", "max_length": 4, "max_context_length": 64, "sampler_seed": 1e3}',
    b'{"prompt": "x", "max_length": 4, "max_context_length": 64, "stop_sequence": "' + b"a" * 600 + b'"}',
    b'{"prompt": "x", "max_length": 4, "max_context_length": 64, "logit_bias": {"-1": 5}}',
    b'{"prompt": "x", "max_length": 4, "max_context_length": 64, "genkey": {"a": 1}}',
    b'{"prompt": "\\ud800", "max_length": 4, "max_context_length": 64}',
    b'{"prompt": "x", "max_length": 4, "max_context_length": 64, "dynatemp_range": -1}',
    b'{"prompt": "x", "max_length": 4, "max_context_length": 64, "n": 100000}',
])
def test_hostile_bodies_get_a_kobold_shaped_4xx(api: httpx.Client, raw: bytes) -> None:
    for path in ("/api/v1/generate", "/api/extra/generate/stream"):
        response = api.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert 400 <= response.status_code < 500, (path, raw, response.text)
        assert response.json()["detail"]["msg"]
    assert api.post("/api/v1/generate", json=kobold(max_length=2)).status_code == 200  # still serving
