"""X-Request-Id belongs to the request that first used it: only the same client's retry of the
same body attaches to it (actors/http/request_ids.py); anything else is a 409 that never reaches,
reads or cancels the request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from actors.http.app import create_app
from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from actors.http.request_ids import MemoryRequestIds, RedisRequestIds, request_fingerprint
from tests.support.engine_helpers import make_engine

BODY = {"prompt": "The victim's secret prompt", "max_tokens": 48, "temperature": 0, "ignore_eos": True}


async def test_only_the_same_client_and_body_attach_to_an_id(default_model_path: Path) -> None:
    backend = EmbeddedBackend(make_engine(default_model_path))
    await backend.start()
    transport = httpx.ASGITransport(app=create_app(backend, GatewayOptions()), raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=60) as client:
            victim_headers = {"X-Request-Id": "victim-1", "Authorization": "Bearer alice"}
            victim = asyncio.create_task(client.post("/v1/completions", json=BODY, headers=victim_headers))
            await asyncio.sleep(0.05)
            other_body = await client.post("/v1/completions", json={**BODY, "max_tokens": 1},
                                           headers={**victim_headers})
            other_client = await client.post("/v1/completions", json=BODY,
                                             headers={**victim_headers, "Authorization": "Bearer mallory"})
            for response in (other_body, other_client):
                assert response.status_code == 409, response.text
                assert response.json()["error"]["param"] == "X-Request-Id"
            answered = await victim
            assert answered.status_code == 200
            assert answered.json()["choices"][0]["finish_reason"] == "length"  # not cancelled by the others
            retry = await client.post("/v1/completions", json=BODY, headers=victim_headers)
            assert retry.json()["choices"][0]["text"] == answered.json()["choices"][0]["text"]
    finally:
        await backend.close()


def test_fingerprints_ignore_key_order_and_tell_clients_apart() -> None:
    assert request_fingerprint("Bearer a", {"x": 1, "y": 2}) == request_fingerprint("Bearer a", {"y": 2, "x": 1})
    assert request_fingerprint("Bearer a", {"x": 1}) != request_fingerprint("Bearer b", {"x": 1})
    assert request_fingerprint(None, {"x": 1}) != request_fingerprint(None, {"x": 2})


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_bindings_hold_across_gateways(kind: str, redis_url: str, prefix: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.from_url(redis_url)
    first, second = ((MemoryRequestIds(), None) if kind == "memory"
                     else (RedisRequestIds(client, prefix), RedisRequestIds(client, prefix)))
    second = second or first  # two gateways share Redis; one process shares its memory
    try:
        assert await first.bind("id-1", "alice")
        assert await second.bind("id-1", "alice")
        assert not await second.bind("id-1", "mallory")
    finally:
        await client.aclose()


async def test_a_list_requests_derived_ids_belong_to_it(default_model_path: Path) -> None:
    """A list of prompts under X-Request-Id R runs as R:0, R:1: another client naming R:1 (or R) gets a
    409, so it can neither read that prompt's answer nor cancel it by hanging up."""
    backend = EmbeddedBackend(make_engine(default_model_path))
    await backend.start()
    transport = httpx.ASGITransport(app=create_app(backend, GatewayOptions()), raise_app_exceptions=False)
    body = {**BODY, "prompt": ["first secret", "second secret"], "stream": True}
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=60) as client:
            owner = {"X-Request-Id": "list-1", "Authorization": "Bearer alice"}
            async with client.stream("POST", "/v1/completions", json=body, headers=owner) as stream:
                assert stream.status_code == 200
                for stolen in ("list-1:1", "list-1:0", "list-1"):
                    other = await client.post("/v1/completions", json={**BODY, "max_tokens": 1},
                                              headers={"X-Request-Id": stolen, "Authorization": "Bearer mallory"})
                    assert other.status_code == 409, (stolen, other.text)
                text = "".join([line async for line in stream.aiter_lines()])
            assert text.count('"finish_reason": "length"') == 2  # neither prompt was cancelled
    finally:
        await backend.close()


async def test_memory_bindings_last_the_replay_window_however_many_ids_come_after() -> None:
    now = [0.0]
    owners = MemoryRequestIds(ttl_s=3600, clock=lambda: now[0])
    assert await owners.bind("kept", "alice")
    for index in range(70_000):  # more than any fixed count would keep
        await owners.bind(f"other-{index}", "bob")
    now[0] = 3599.0
    assert not await owners.bind("kept", "mallory")
    now[0] = 3600.5  # the replay window is over: the id may be used again
    assert await owners.bind("kept", "mallory")
