"""vLLM's runtime LoRA routes on an embedded server: /v1/load_lora_adapter and /v1/unload_lora_adapter
load into the engine as a worker's control entries do, behind the API key and --lora-root, and only
when runtime updating is switched on, which also puts them and their bodies in /openapi.json."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema_rs
import openai
import pytest

from actors.http.app import create_app
from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from actors.http.serve_args import add_serve_args, options_from_args
from pipeline.config import LoRAConfig
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY, SilentBackend, serving
from tests.support.lora_adapters import ADAPTER_SPECS, make_peft_adapter

PROMPT = "Once upon a time"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def adapters(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-root")
    story = make_peft_adapter(default_model_path, root / "story", seed=4, strength=3.0, **ADAPTER_SPECS["all16rs"])
    outside = shutil.copytree(story, tmp_path_factory.mktemp("elsewhere") / "story")
    broken = Path(shutil.copytree(story, root / "broken"))
    (broken / "adapter_config.json").write_text("{not json")
    return {"root": root, "story": story, "outside": Path(outside), "broken": broken}


@pytest.fixture(scope="module")
def gateway(default_model_path: Path, adapters: dict[str, Path]) -> Iterator[tuple[str, str]]:
    """An embedded server with `story` loaded at start and runtime updating on, under --lora-root."""
    engine = make_engine(default_model_path, lora=LoRAConfig(modules=(("story", str(adapters["story"])),)))
    options = GatewayOptions(api_key=API_KEY, runtime_lora_updating=True, lora_root=str(adapters["root"]))
    with serving(EmbeddedBackend(engine), options) as base_url:
        yield base_url, engine.model_name


def _post(base_url: str, route: str, body: object, headers: dict[str, str] = AUTH) -> httpx.Response:
    return httpx.post(f"{base_url}/{route}", json=body, headers=headers, timeout=60)


def _complete(client: openai.OpenAI, model: str) -> str:
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=0,
                                           extra_body={"ignore_eos": True})
    return completion.choices[0].text


def test_an_adapter_loaded_over_http_serves_as_one_loaded_at_start_until_unloaded(gateway, adapters) -> None:
    base_url, base_model = gateway
    client = openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
    loaded = _post(base_url, "load_lora_adapter", {"lora_name": "story2", "lora_path": str(adapters["story"])})
    assert (loaded.status_code, loaded.text) == (200, "Success: LoRA adapter 'story2' added successfully.")

    models = {model["id"]: model for model in httpx.get(f"{base_url}/models", headers=AUTH).json()["data"]}
    assert set(models) == {base_model, "story", "story2"}
    assert {key: models["story2"][key] for key in ("object", "root", "parent")} == \
        {"object": "model", "root": str(adapters["story"]), "parent": base_model}
    assert models[base_model]["parent"] is None
    assert _complete(client, "story2") == _complete(client, "story") != _complete(client, base_model)

    again = _post(base_url, "load_lora_adapter", {"lora_name": "story2", "lora_path": str(adapters["story"])})
    assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]
    in_place = {"lora_name": "story2", "lora_path": str(adapters["story"]), "load_inplace": True}
    assert _post(base_url, "load_lora_adapter", in_place).status_code == 200

    unloaded = _post(base_url, "unload_lora_adapter", {"lora_name": "story2"})
    assert (unloaded.status_code, unloaded.text) == (200, "Success: LoRA adapter 'story2' removed successfully.")
    assert "story2" not in [model.id for model in client.models.list().data]
    with pytest.raises(openai.NotFoundError):
        _complete(client, "story2")
    gone = _post(base_url, "unload_lora_adapter", {"lora_name": "story2"})
    assert gone.status_code == 404 and "cannot be found" in gone.json()["error"]["message"]


@pytest.mark.parametrize(("body", "message"), [
    ({"lora_name": "bad", "lora_path": "broken"}, "lora adapter 'bad': cannot read"),
    ({"lora_name": "bad", "lora_path": "missing"}, "missing cannot be resolved: [Errno 2] No such file"),
    ({"lora_name": "bad", "lora_path": "outside"}, "outside --lora-root"),
    ({"lora_name": "bad"}, "Both 'lora_name' and 'lora_path' must be provided"),
    ({"lora_name": ["bad"], "lora_path": "broken"}, "lora_name must be a string, got list"),
    ({"lora_name": "b" * 513, "lora_path": "broken"}, "lora_name must have length <= 512"),
])
def test_a_bad_load_is_400_and_the_server_keeps_serving(gateway, adapters, body: dict, message: str) -> None:
    base_url, _ = gateway
    paths = {"broken": adapters["broken"], "missing": adapters["root"] / "missing", "outside": adapters["outside"]}
    if "lora_path" in body:
        body = {**body, "lora_path": str(paths[body["lora_path"]])}
    refused = _post(base_url, "load_lora_adapter", body)
    assert refused.status_code == 400, refused.text
    assert message in refused.json()["error"]["message"]
    client = openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
    assert "bad" not in [model.id for model in client.models.list().data]
    assert _complete(client, "story")


def test_the_base_model_s_name_cannot_be_an_adapter_s(gateway, adapters) -> None:
    base_url, base_model = gateway
    refused = _post(base_url, "load_lora_adapter", {"lora_name": base_model, "lora_path": str(adapters["story"])})
    assert refused.status_code == 400 and "base model" in refused.json()["error"]["message"]


def test_the_routes_need_the_api_key(gateway, adapters) -> None:
    base_url, _ = gateway
    body = {"lora_name": "story3", "lora_path": str(adapters["story"])}
    assert _post(base_url, "load_lora_adapter", body, headers={}).status_code == 401
    assert _post(base_url, "unload_lora_adapter", {"lora_name": "story"}, headers={}).status_code == 401


async def test_without_the_switch_the_routes_are_not_there() -> None:
    app = create_app(SilentBackend(), GatewayOptions(api_key=API_KEY))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway",
                                 headers=AUTH) as client:
        for route, body in (("load", {"lora_name": "a", "lora_path": "/a"}), ("unload", {"lora_name": "a"})):
            response = await client.post(f"/v1/{route}_lora_adapter", json=body)
            assert response.status_code == 404 and response.json()["error"]["message"] == "Not Found"


@pytest.mark.parametrize(("flags", "env", "on"), [
    ([], None, False), (["--enable-runtime-lora-updating"], None, True), ([], "True", True), ([], "1", True),
    ([], "TRUE", True), ([], "false", False), ([], "0", False), ([], "yes", False),
])
def test_the_switch_is_the_flag_or_vllm_s_environment_variable(monkeypatch, flags, env, on) -> None:
    if env is None:
        monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    else:
        monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", env)
    parser = argparse.ArgumentParser()
    add_serve_args(parser, lambda name, default=None: default)
    options = options_from_args(parser.parse_args([*flags, "--lora-root", "/adapters"]))
    assert (options.runtime_lora_updating, options.lora_root) == (on, "/adapters")


async def _openapi_paths(options: GatewayOptions) -> dict:
    app = create_app(SilentBackend(), options)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        return (await client.get("/openapi.json")).json()["paths"]


async def test_the_openapi_document_has_the_routes_and_their_bodies_only_when_they_are_served() -> None:
    assert "/v1/load_lora_adapter" not in await _openapi_paths(GatewayOptions(api_key=API_KEY))
    paths = await _openapi_paths(GatewayOptions(api_key=API_KEY, runtime_lora_updating=True))
    bodies = {route: jsonschema_rs.Draft202012Validator(
        paths[f"/v1/{route}_lora_adapter"]["post"]["requestBody"]["content"]["application/json"]["schema"])
        for route in ("load", "unload")}
    for route in ("load", "unload"):
        operation = paths[f"/v1/{route}_lora_adapter"]["post"]
        assert set(operation["responses"]) >= {"200", "400", "401", "504"}
        assert "text/plain" in operation["responses"]["200"]["content"]
    assert bodies["load"].is_valid({"lora_name": "story2", "lora_path": "/adapters/story", "load_inplace": True})
    assert bodies["unload"].is_valid({"lora_name": "story2"})
    for body in ({"lora_name": "bad"}, {"lora_name": ["bad"], "lora_path": "/a"}, {"lora_name": "b" * 513,
                 "lora_path": "/a"}, {"lora_name": "", "lora_path": "/a"}, {"lora_name": "a", "lora_path": ""}):
        assert not bodies["load"].is_valid(body), body  # each the route's 400 (above)
    assert not bodies["unload"].is_valid({}) and not bodies["unload"].is_valid({"lora_name": 5})
