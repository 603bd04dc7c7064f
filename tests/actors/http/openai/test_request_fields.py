"""Which request fields reach the engine: unknown ones (ignored, logged and named, or a 400 with
--strict-fields), known ones we do not implement (always a 400), and stream_options."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from structlog.testing import capture_logs

from actors.http.app import create_app
from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from queue_adapters.codec import WireChoice, WireReply, WireRequest, WireUsage
from tests.support.gateway_helpers import API_KEY, SilentBackend

COMPLETION = {"model": "silent", "prompt": "Hello", "max_tokens": 3}
CHAT = {"model": "silent", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}


class ScriptedBackend(SilentBackend):
    """Answers every request with three tokens, one reply entry each, then usage; keeps what it got."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted: list[WireRequest] = []

    async def submit(self, request: WireRequest) -> None:
        self.submitted.append(request)

    async def replies(self, request: WireRequest) -> AsyncIterator[WireReply]:
        for seq, (token, text) in enumerate([(5, "a"), (6, "b"), (7, "c")]):
            last = seq == 2
            yield WireReply(id=request.id, seq=seq, choices=[WireChoice(
                index=0, token_ids=[token], text=text, finish_reason="length" if last else None)],
                usage=WireUsage(prompt_tokens=4, completion_tokens=3) if last else None,
                prompt_tokens=4 if seq == 0 else None)


def _client(backend: SilentBackend, **options) -> httpx.AsyncClient:
    app = create_app(backend, GatewayOptions(**options))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://gateway")


def _events(response: httpx.Response) -> list[dict]:
    lines = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize(("path", "body"), [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
async def test_unknown_fields_are_ignored_logged_and_named_in_a_header(path: str, body: dict) -> None:
    backend = ScriptedBackend()
    async with _client(backend) as client:
        with capture_logs() as logs:
            response = await client.post(path, json={**body, "temperatur": 0.5, "x_vendor": {"a": 1}})
        assert response.status_code == 200, response.text
        assert response.headers["X-Ignored-Fields"] == "temperatur, x_vendor"
        streamed = await client.post(path, json={**body, "stream": True, "frobnicate": True})
        assert streamed.status_code == 200 and streamed.headers["X-Ignored-Fields"] == "frobnicate"
        plain = await client.post(path, json=body)
        assert "X-Ignored-Fields" not in plain.headers
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert warnings and warnings[0]["fields"] == ["temperatur", "x_vendor"]
    assert all(set(wire.params) <= {"max_tokens"} for wire in backend.submitted)  # nothing unknown went on


@pytest.mark.parametrize(("path", "body"), [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
async def test_strict_fields_keeps_the_400_naming_the_field(path: str, body: dict) -> None:
    async with _client(ScriptedBackend(), strict_fields=True) as client:
        response = await client.post(path, json={**body, "temperatur": 0.5})
    assert response.status_code == 400
    assert "temperatur" in response.json()["error"]["message"]


@pytest.mark.parametrize("field", ["chat_template", "verbosity", "bad_words"])
async def test_known_fields_we_do_not_implement_stay_errors_unless_null(field: str) -> None:
    value = {"chat_template": "{{ messages }}", "verbosity": "low", "bad_words": ["x"]}[field]
    async with _client(ScriptedBackend()) as client:
        refused = await client.post("/v1/chat/completions", json={**CHAT, field: value})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == field
        accepted = await client.post("/v1/chat/completions", json={**CHAT, field: None})
        assert accepted.status_code == 200 and "X-Ignored-Fields" not in accepted.headers


async def test_vllm_s_default_values_of_those_fields_ask_for_nothing() -> None:
    """Clients send vLLM's defaults for fields they leave unset; only another value needs the feature."""
    async with _client(ScriptedBackend()) as client:
        for body, path in ((CHAT, "/v1/chat/completions"), (COMPLETION, "/v1/completions")):
            defaults = {"add_generation_prompt": True, "continue_final_message": False, "priority": 0,
                        "chat_template_kwargs": {}, "add_special_tokens": path.endswith("/v1/completions")}
            response = await client.post(path, json={**body, **defaults})
            assert response.status_code == 200, response.text
            flipped = await client.post(path, json={**body, "add_special_tokens": not defaults["add_special_tokens"]})
            assert flipped.status_code == 400 and flipped.json()["error"]["param"] == "add_special_tokens"
        refused = await client.post("/v1/chat/completions", json={**CHAT, "add_generation_prompt": False})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "add_generation_prompt"


async def test_a_hostile_field_name_gives_a_bounded_ascii_header() -> None:
    names = {f"é\r\n{index}" + "x" * 200: 1 for index in range(40)}
    async with _client(ScriptedBackend()) as client:
        response = await client.post("/v1/completions", json={**COMPLETION, **names})
    header = response.headers["X-Ignored-Fields"]
    assert response.status_code == 200 and header.isascii() and "\n" not in header
    assert header.endswith(", ...") and header.count(",") == 32


def test_serve_takes_strict_fields() -> None:
    from actors.cli.main import build_parser
    from actors.http.serve_args import options_from_args

    parser = build_parser()
    assert options_from_args(parser.parse_args(["serve", "--strict-fields"])).strict_fields
    assert not options_from_args(parser.parse_args(["serve"])).strict_fields


@pytest.mark.parametrize(("path", "body"), [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
async def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(path: str, body: dict) -> None:
    both = {"include_usage": True, "continuous_usage_stats": True}
    async with _client(ScriptedBackend()) as client:
        events = _events(await client.post(path, json={**body, "stream": True, "stream_options": both}))
        without = _events(await client.post(path, json={**body, "stream": True, "stream_options": {
            "continuous_usage_stats": True}}))  # as vLLM: only with include_usage
        refused = await client.post(path, json={**body, "stream": True, "stream_options": {"include_usage": "yes"}})
    with_choices = [chunk for chunk in events if chunk["choices"]]
    completion_so_far = [chunk["usage"]["completion_tokens"] for chunk in with_choices]
    assert completion_so_far == ([0, 1, 2, 3] if path.endswith("chat/completions") else [1, 2, 3])
    assert all(chunk["usage"]["prompt_tokens"] == 4 and chunk["usage"]["total_tokens"] == 4 + done
               for chunk, done in zip(with_choices, completion_so_far, strict=True))
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
    assert not any("usage" in chunk for chunk in without)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream_options.include_usage"


def test_continuous_usage_counts_match_the_engine_s_final_usage(embedded: tuple[str, EmbeddedBackend],
                                                              model: str) -> None:
    client = openai.OpenAI(base_url=embedded[0], api_key=API_KEY, max_retries=0)
    chunks = list(client.completions.create(
        model=model, prompt="The river", max_tokens=6, n=2, temperature=1.0, seed=3, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    final = chunks[-1].usage
    per_choice: dict[int, int] = {}
    for chunk in chunks[:-1]:
        choice = chunk.choices[0]
        per_choice[choice.index] = per_choice.get(choice.index, 0) + len(choice.model_extra["token_ids"])
        assert chunk.usage.prompt_tokens == final.prompt_tokens
        assert chunk.usage.completion_tokens == per_choice[choice.index]
    assert sum(per_choice.values()) == final.completion_tokens == 12


async def test_priority_travels_on_the_wire_and_bad_values_are_400s() -> None:
    backend = ScriptedBackend()
    async with _client(backend) as client:
        for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
            for priority in (-3, 0, 10, None):
                response = await client.post(path, json={**body, "priority": priority})
                assert response.status_code == 200, response.text
                assert backend.submitted[-1].priority == (priority or 0)
            two_prompts = await client.post("/v1/completions", json={**COMPLETION, "prompt": ["a", "b"], "priority": 4})
            assert two_prompts.status_code == 200 and [r.priority for r in backend.submitted[-2:]] == [4, 4]
            for bad in (True, 1.5, "1", 2**31, -(2**31) - 1):
                refused = await client.post(path, json={**body, "priority": bad})
                assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority", bad
