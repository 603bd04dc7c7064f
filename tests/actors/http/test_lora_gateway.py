"""Choosing a LoRA adapter by OpenAI `model` name: the gateway's /v1/models and completions, and
batch-file bodies (as vLLM: the base model's name or no `model` means no adapter)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from tqdm import tqdm

from actors.cli.batch import read_batch_file, run_offline
from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from pipeline.config import LoRAConfig
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.lora_adapters import ADAPTER_SPECS, make_peft_adapter, run_with_adapters

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def adapter_dir(default_model_path: Path, tmp_path_factory) -> Path:
    return make_peft_adapter(default_model_path, tmp_path_factory.mktemp("lora") / "story", seed=4,
                             strength=3.0, **ADAPTER_SPECS["all16rs"])


@pytest.fixture(scope="module")
def engine(default_model_path: Path, adapter_dir: Path):
    return make_engine(default_model_path, lora=LoRAConfig(modules=(("story", str(adapter_dir)),)))


@pytest.fixture(scope="module")
def expected(engine) -> dict[str | None, list[int]]:
    """Greedy tokens of PROMPT on the base model and on the adapter, from the engine (itself checked against PEFT)."""
    prompt = engine.tokenizer.encode(PROMPT)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    results = run_with_adapters(engine, {"base": (prompt, params, None), "story": (prompt, params, "story")})
    assert results["base"]["tokens"] != results["story"]["tokens"], "the adapter changes nothing"
    return {None: results["base"]["tokens"], "story": results["story"]["tokens"]}


@pytest.fixture(scope="module")
def gateway(engine, expected) -> Iterator[str]:
    # After `expected`: once serving, the gateway's actors drive the engine's step loop.
    with serving(EmbeddedBackend(engine), GatewayOptions(api_key=API_KEY)) as base_url:
        yield base_url


def test_models_lists_the_adapters_beside_the_base_model(gateway: str, engine) -> None:
    client = openai.OpenAI(base_url=gateway, api_key=API_KEY, max_retries=0)
    models = {model.id: model for model in client.models.list().data}
    assert set(models) == {engine.model_name, "story"}
    assert models["story"].model_extra["parent"] == engine.model_name


def test_model_field_selects_the_adapter(gateway: str, engine, expected) -> None:
    client = openai.OpenAI(base_url=gateway, api_key=API_KEY, max_retries=0)
    for model, lora in ((engine.model_name, None), ("story", "story")):
        completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                               extra_body={"ignore_eos": True})
        assert completion.choices[0].text == engine.tokenizer.decode(expected[lora])
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt=PROMPT, max_tokens=2)


def test_batch_body_model_names_the_adapter(tmp_path: Path, default_model_path: Path, adapter_dir: Path,
                                            expected) -> None:
    # Its own engine: the module's one is driven by the gateway's actors once serving.
    engine = make_engine(default_model_path, lora=LoRAConfig(modules=(("story", str(adapter_dir)),)))
    lines = [{"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
              "body": {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, **extra}}
             for custom_id, extra in (("none", {}), ("base", {"model": engine.model_name}),
                                      ("story", {"model": "story"}), ("unknown", {"model": "nope"}))]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    requests = [line.request for line in read_batch_file(path) if line.request is not None]
    results = run_offline(engine, requests, tqdm(disable=True))
    tokens = {request.id: [t for choice in results[request.id]["choices"] for t in choice["token_ids"]]
              for request in requests}
    assert tokens["batch-line-1"] == tokens["batch-line-2"] == expected[None]
    assert tokens["batch-line-3"] == expected["story"]
    assert "unknown adapter 'nope'" in results["batch-line-4"]["error"]["message"]
