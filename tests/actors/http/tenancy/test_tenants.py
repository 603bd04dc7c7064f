"""Tenants at the gateway: --api-keys maps each key to its tenant and weight (an unknown key is a 401),
OpenAI's `user` splits a shared key's share, and every wire request carries the tenant."""

from __future__ import annotations

import argparse

import httpx
import pytest

from actors.http.app import create_app
from actors.http.options import GatewayOptions
from actors.http.serve_args import api_key_from_args
from actors.http.tenancy.api_keys import parse_api_keys
from tests.actors.http.openai.test_request_fields import CHAT, COMPLETION, ScriptedBackend
from tests.support.gateway_helpers import SilentBackend

KEY_FILE = """
# key,tenant[,weight]
sk-acme,acme,3
sk-globex , globex

"""


def _client(backend: SilentBackend, api_key) -> httpx.AsyncClient:
    app = create_app(backend, GatewayOptions(api_key=api_key))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://gateway")


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_the_key_file_maps_each_key_to_its_tenant_and_weight() -> None:
    backend = ScriptedBackend()
    async with _client(backend, parse_api_keys(KEY_FILE)) as client:
        assert (await client.post("/v1/completions", json=COMPLETION, headers=_bearer("sk-acme"))).status_code == 200
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=_bearer("sk-globex"))).status_code == 200
        for headers in (_bearer("sk-unknown"), _bearer("sk-acm"), {}):
            refused = await client.post("/v1/completions", json=COMPLETION, headers=headers)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert (await client.get("/v1/models", headers=_bearer("sk-globex"))).status_code == 200
    assert [(wire.tenant, wire.tenant_weight) for wire in backend.submitted] == [("acme", 3.0), ("globex", 1.0)]


async def test_a_file_of_several_keys_ignores_user_so_no_client_splits_its_own_share() -> None:
    backend = ScriptedBackend()
    async with _client(backend, parse_api_keys(KEY_FILE)) as client:
        await client.post("/v1/completions", json={**COMPLETION, "user": "alice"}, headers=_bearer("sk-acme"))
    assert backend.submitted[0].tenant == "acme"


@pytest.mark.parametrize(("api_key", "expected"), [
    ("sk-one", "default/alice"),  # --api-key: one shared key
    (None, "default/alice"),  # no key at all
    (parse_api_keys("sk-one,acme,2"), "acme/alice"),  # a file of one key keeps its weight
])
async def test_user_splits_a_shared_keys_fair_share(api_key, expected) -> None:
    backend = ScriptedBackend()
    async with _client(backend, api_key) as client:
        for body in ({**COMPLETION, "user": "alice"}, {**CHAT, "user": "alice"}, COMPLETION, {**COMPLETION, "user": 7}):
            response = await client.post("/v1/completions" if "prompt" in body else "/v1/chat/completions",
                                         json=body, headers=_bearer("sk-one"))
            assert response.status_code == 200, response.text  # a user that is not a string is still accepted
    weight = 2.0 if expected.startswith("acme") else 1.0
    base = "acme" if expected.startswith("acme") else None
    assert [(wire.tenant, wire.tenant_weight) for wire in backend.submitted] == [
        (expected, weight), (expected, weight), (base, weight if base else 1.0), (base, weight if base else 1.0)]


async def test_a_long_or_unusual_user_is_hashed_into_a_bounded_tenant() -> None:
    backend = ScriptedBackend()
    async with _client(backend, None) as client:
        for user in ("x" * 5000, "bob smith\n", "ünïcode"):
            assert (await client.post("/v1/completions", json={**COMPLETION, "user": user})).status_code == 200
        await client.post("/v1/completions", json={**COMPLETION, "user": "x" * 5000})
    tenants = [wire.tenant for wire in backend.submitted]
    assert all(tenant.startswith("default/#") and len(tenant) == len("default/#") + 32 for tenant in tenants)
    assert len(set(tenants)) == 3 and tenants[0] == tenants[3]  # the same user, the same tenant


async def test_x_request_ids_are_per_tenant_and_bound_within_it() -> None:
    # Two tenants may choose one X-Request-Id: each request gets its own wire id (its tenant's namespace
    # before the client's id) and answers with the client's id. Within a tenant the id names one request:
    # the owner's retry attaches, another body under the same id is refused.
    backend = ScriptedBackend()
    headers = {"X-Request-Id": "job-1"}
    other_body = {**COMPLETION, "max_tokens": 2}
    async with _client(backend, parse_api_keys(KEY_FILE)) as client:
        first = await client.post("/v1/completions", json=COMPLETION, headers={**headers, **_bearer("sk-acme")})
        other = await client.post("/v1/completions", json=COMPLETION, headers={**headers, **_bearer("sk-globex")})
        retry = await client.post("/v1/completions", json=COMPLETION, headers={**headers, **_bearer("sk-acme")})
        changed = await client.post("/v1/completions", json=other_body, headers={**headers, **_bearer("sk-acme")})
        longest = await client.post("/v1/completions", json=COMPLETION,
                                    headers={"X-Request-Id": "x" * 128, **_bearer("sk-globex")})
    assert [response.status_code for response in (first, other, retry, longest)] == [200] * 4
    assert first.json()["id"] == other.json()["id"] == "job-1"
    assert changed.status_code == 409 and changed.json()["error"]["code"] == "request_id_conflict"
    acme, globex, acme_retry, long_wire = backend.submitted
    assert [wire.tenant for wire in backend.submitted] == ["acme", "globex", "acme", "globex"]
    assert acme.id == acme_retry.id != globex.id
    assert acme.id.endswith(".job-1") and globex.id.endswith(".job-1") and long_wire.id.endswith("x" * 128)


async def test_without_a_tenant_the_client_id_is_the_wire_id() -> None:
    backend = ScriptedBackend()
    async with _client(backend, None) as client:
        response = await client.post("/v1/completions", json=COMPLETION, headers={"X-Request-Id": "job-2"})
    assert response.status_code == 200 and [wire.id for wire in backend.submitted] == ["job-2"]


async def test_anthropic_clients_use_a_file_key_in_x_api_key() -> None:
    backend = ScriptedBackend()
    body = {"model": "silent", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    async with _client(backend, parse_api_keys(KEY_FILE)) as client:
        assert (await client.post("/v1/messages", json=body, headers={"x-api-key": "sk-globex"})).status_code == 200
        assert (await client.post("/v1/messages", json=body, headers={"x-api-key": "sk-nope"})).status_code == 401
        both = {"x-api-key": "sk-globex", "Authorization": "Bearer sk-bogus"}  # no way out of its own share
        assert (await client.post("/v1/messages", json=body, headers=both)).status_code == 200
        assert (await client.post("/v1/completions", json=COMPLETION,
                                  headers={"x-api-key": "sk-bogus", **_bearer("sk-acme")})).status_code == 200
    assert [wire.tenant for wire in backend.submitted] == ["globex", "globex", "acme"]


def test_key_file_entries_are_checked_and_errors_name_the_line() -> None:
    keys = parse_api_keys(KEY_FILE)
    assert keys.num_keys == 2 and keys.tenant_of("sk-acme").weight == 3.0 and keys.tenant_of("nope") is None
    for text, message in [
        ("sk-a", "line 1: expected key,tenant"),
        ("sk-a,acme,1,extra", "line 1: expected key,tenant"),
        ("# only a comment\n", "holds no key"),
        ("sk-a,acme\nsk-a,globex", "line 2: the key appears twice"),
        ("sk-a,acme,0", "weight must be from 0.001 to 1000"),
        ("sk-a,acme,nan", "weight must be from 0.001 to 1000"),
        ("sk-a,acme,1e9", "weight must be from 0.001 to 1000"),
        ("sk-a,acme,heavy", "weight must be a number"),
        ("sk-a,acme/x", "tenant must be 1-64 characters"),
        ("sk a,acme", "a key must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_api_keys(text)


def test_api_key_and_api_keys_do_not_go_together(tmp_path) -> None:
    path = tmp_path / "keys.csv"
    path.write_text("sk-a,acme\n")
    assert api_key_from_args(argparse.Namespace(api_key=None, api_keys=str(path))).tenant_of("sk-a").name == "acme"
    assert api_key_from_args(argparse.Namespace(api_key="sk-one", api_keys=None)) == "sk-one"
    with pytest.raises(ValueError, match="--api-key and --api-keys do not go together"):
        api_key_from_args(argparse.Namespace(api_key="sk-one", api_keys=str(path)))
    with pytest.raises(ValueError, match="cannot read"):
        api_key_from_args(argparse.Namespace(api_key=None, api_keys=str(tmp_path / "missing.csv")))
