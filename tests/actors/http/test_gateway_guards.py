"""The gateway's refusals, in OpenAI's error shape, before or instead of any generation."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from actors.http.app import create_app
from actors.http.options import GatewayOptions
from tests.support.gateway_helpers import API_KEY, SilentBackend, serving

BODY = {"model": "silent", "prompt": "Hello", "max_tokens": 4}


def _client(backend: SilentBackend, **options) -> httpx.AsyncClient:
    app = create_app(backend, GatewayOptions(api_key=API_KEY, **options))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway",
                             headers={"Authorization": f"Bearer {API_KEY}"})


def _assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    return error


async def test_a_missing_or_wrong_key_is_401() -> None:
    async with _client(SilentBackend()) as client:
        _assert_openai_error(await client.post("/v1/completions", json=BODY, headers={"Authorization": ""}), 401)
        _assert_openai_error(await client.get("/v1/models", headers={"Authorization": "Bearer nope"}), 401)
        assert (await client.get("/health", headers={"Authorization": ""})).status_code == 200
        _assert_openai_error(await client.get("/metrics", headers={"Authorization": ""}), 401)
        assert (await client.get("/metrics")).status_code == 200
    async with _client(SilentBackend(), metrics_open=True) as client:  # --metrics-open: for a scraper without the key
        assert (await client.get("/metrics", headers={"Authorization": ""})).status_code == 200


def test_serve_and_the_health_port_listen_on_this_host_only_by_default() -> None:
    from actors.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve"]).host == "127.0.0.1"
    assert parser.parse_args(["worker", "--redis-url", "redis://x"]).health_host == "127.0.0.1"


async def test_a_body_over_the_limit_is_413_before_parsing() -> None:
    async with _client(SilentBackend(), max_request_bytes=1024) as client:
        response = await client.post("/v1/completions", content=b"{" + b" " * 4096)  # not even JSON
        _assert_openai_error(response, 413, "request_too_large")


async def test_unknown_model_is_404_and_bad_fields_are_400_naming_the_field() -> None:
    async with _client(SilentBackend()) as client:
        _assert_openai_error(await client.post("/v1/completions", json={**BODY, "model": "gpt-9"}), 404,
                             "model_not_found")
        error = _assert_openai_error(await client.post("/v1/completions", json={**BODY, "temperature": "hot"}), 400)
        assert "temperature" in error["message"]
        error = _assert_openai_error(await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}), 400)
        assert "--enable-auto-tool-choice" in error["message"] and error["param"] == "tool_choice"  # vLLM's 400
        error = _assert_openai_error(await client.post("/v1/completions", json=BODY,
                                                       headers={"X-Request-Id": "bad id!"}), 400)
        assert error["param"] == "X-Request-Id"
    async with _client(SilentBackend(), strict_fields=True) as client:  # --strict-fields: unknown fields too
        error = _assert_openai_error(await client.post("/v1/completions", json={**BODY, "temperatur": 1}), 400)
        assert "temperatur" in error["message"]


async def test_no_worker_answering_is_503_and_the_request_is_cancelled() -> None:
    backend = SilentBackend()
    async with _client(backend, worker_timeout_s=0.2) as client:
        response = await client.post("/v1/completions", json=BODY, headers={"X-Request-Id": "lonely-1"})
        _assert_openai_error(response, 503, "no_worker")
        await asyncio.sleep(0.05)
    assert backend.cancelled == ["lonely-1"]


async def test_past_the_in_flight_limit_is_429_with_retry_after() -> None:
    async with _client(SilentBackend(), max_pending=1, worker_timeout_s=1.0) as client:
        waiting = asyncio.create_task(client.post("/v1/completions", json=BODY))
        await asyncio.sleep(0.2)
        response = await client.post("/v1/completions", json=BODY)
        _assert_openai_error(response, 429, "rate_limit_exceeded")
        assert response.headers["Retry-After"] == "1"
        assert (await waiting).status_code == 503


@pytest.mark.parametrize("path", ["/v1/nothing", "/nothing"])
async def test_unknown_routes_answer_in_the_same_error_shape(path: str) -> None:
    async with _client(SilentBackend()) as client:
        _assert_openai_error(await client.get(path), 404)


def test_request_timeout_becomes_the_wire_deadline_and_x_request_id_the_wire_id() -> None:
    from actors.http.openai.parse import parse_body

    before_ms = time.time() * 1000
    request = parse_body({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}, chat=False,
                         model_name="m", request_id="client-id.1", timeout_s=5.0)
    assert request.wire.id == "client-id.1" and request.stream and request.include_usage
    assert before_ms + 4_000 < request.wire.deadline_ms < time.time() * 1000 + 6_000
    assert "stream" not in request.wire.params and "stream_options" not in request.wire.params


async def test_the_playground_page_is_served_at_the_root_without_a_key() -> None:
    async with _client(SilentBackend()) as client:
        response = await client.get("/", headers={"Authorization": ""})
    assert response.status_code == 200 and "/v1/chat/completions" in response.text
    assert "http" not in response.text.split("<script>")[1].split("</script>")[0]  # no CDN, no other origin


def test_a_client_gone_before_the_first_reply_cancels_its_request() -> None:
    backend = SilentBackend()
    backend.workers_alive = _always_alive  # queued behind busy workers: no 503, the client waits
    with serving(backend, GatewayOptions(worker_timeout_s=0.1)) as base_url:
        for stream in (False, True):
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{base_url}/completions", json={**BODY, "stream": stream}, timeout=0.5,
                           headers={"X-Request-Id": f"gone-{stream}"})
        deadline = time.monotonic() + 5
        while len(backend.cancelled) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert sorted(backend.cancelled) == ["gone-False", "gone-True"]


async def _always_alive() -> bool:
    return True


class _BrokenBackend(SilentBackend):
    async def submit(self, request: object) -> None:
        raise RuntimeError("a bug")


class _RedisDownBackend(SilentBackend):
    async def submit(self, request: object) -> None:
        raise ConnectionRefusedError("redis:6379")


async def test_a_bug_is_500_and_an_unreachable_queue_503_in_the_same_shape() -> None:
    async with _client(_BrokenBackend()) as client:
        _assert_openai_error(await client.post("/v1/completions", json=BODY), 500, "internal_error")
    async with _client(_RedisDownBackend()) as client:
        _assert_openai_error(await client.post("/v1/completions", json=BODY), 503, "unavailable")


class _QueueDiesMidStream(SilentBackend):
    """Answers one token, then its Redis connection fails."""

    async def replies(self, request):
        from redis.exceptions import ConnectionError as RedisConnectionError

        from queue_adapters.codec import WireChoice, WireReply

        yield WireReply(id=request.id, seq=0, choices=[WireChoice(index=0, token_ids=[5], text="x")])
        raise RedisConnectionError("connection reset by peer")


async def test_a_queue_failure_mid_stream_is_an_error_event_then_done() -> None:
    backend = _QueueDiesMidStream()
    async with _client(backend) as client:
        response = await client.post("/v1/completions", json={**BODY, "stream": True})
    assert response.status_code == 200
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert '"text": "x"' in events[0]
    assert '"code": "unavailable"' in events[1] and "connection reset" in events[1]
    assert events[2:] == ["[DONE]"]
    await asyncio.sleep(0.05)
    assert backend.cancelled == []  # the worker finishes it, for a retry with the same id


async def test_nulls_and_the_fields_sdks_send_for_unset_options_are_absent(default_model_path) -> None:
    import httpx

    from actors.http.app import create_app
    from actors.http.backends import EmbeddedBackend
    from actors.http.options import GatewayOptions
    from tests.support.engine_helpers import make_engine

    backend = EmbeddedBackend(make_engine(default_model_path))
    await backend.start()
    try:
        transport = httpx.ASGITransport(app=create_app(backend, GatewayOptions()))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            plain = {"max_tokens": 4, "temperature": 0}
            nulls = {"top_p": None, "seed": None, "stop": None, "logit_bias": None, "response_format": None,
                     "user": None, "metadata": {"run": 1}, "store": False, "service_tier": "auto"}
            base = await client.post("/v1/completions", json={"prompt": "Hi", **plain})
            same = await client.post("/v1/completions", json={"prompt": "Hi", **plain, **nulls, "echo": False,
                                                              "suffix": None})
            assert base.status_code == same.status_code == 200, same.text
            assert same.json()["choices"][0]["text"] == base.json()["choices"][0]["text"]
            chat = {"messages": [{"role": "user", "content": "Hi", "name": "ann"}], **plain}
            answered = await client.post("/v1/chat/completions", json={
                **chat, **nulls, "tools": None, "tool_choice": None, "functions": None, "parallel_tool_calls": True,
                "logprobs": None})
            assert answered.status_code == 200, answered.text
            echoed = await client.post("/v1/completions", json={"prompt": "Hi", **plain, "echo": True})
            assert echoed.json()["choices"][0]["text"] == "Hi" + base.json()["choices"][0]["text"]
            refused = await client.post("/v1/completions", json={"prompt": "Hi", **plain, "suffix": "!"})
            assert refused.status_code == 400 and "suffix" in refused.json()["error"]["message"]
            tools = [{"type": "function", "function": {"name": "f"}}]
            refused = await client.post("/v1/chat/completions", json={**chat, "tools": tools})  # auto, no parser
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "tool_choice"
    finally:
        await backend.close()
