"""--generation-config: the model's generation_config.json sampling fields as request defaults (vLLM's
meaning), a request's own fields winning, max_new_tokens capping max_tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tqdm import tqdm

from actors.cli.batch import run_offline
from actors.worker.intake import build_request
from pipeline.config import CacheConfig, EngineConfig, ModelConfig
from pipeline.engine import LLMEngine
from pipeline.loading.generation_config import load_generation_defaults
from queue_adapters.codec import WireRequest

SAMPLING = {"temperature": 0.0, "top_p": 0.9, "top_k": 0, "min_p": 0.05, "repetition_penalty": 1.2}


def _write(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "generation_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def model_dir(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in model with a generation_config.json that sets sampling defaults and a cap."""
    directory = tmp_path_factory.mktemp("generation-config") / "model"
    shutil.copytree(default_model_path, directory)
    existing = json.loads((directory / "generation_config.json").read_text())
    return _write(directory, {**existing, **SAMPLING, "do_sample": True, "max_new_tokens": 5})


def _engine(model_dir: Path, setting: str = "auto") -> LLMEngine:
    return LLMEngine(EngineConfig(model=ModelConfig(quantization="none", dtype="float32", model=str(model_dir),
                                                    generation_config=setting),
                                  cache=CacheConfig(num_kv_blocks=64)))


def test_auto_reads_vllm_s_fields_and_vllm_reads_none(model_dir: Path, tmp_path: Path) -> None:
    defaults = load_generation_defaults(model_dir, "auto")
    assert dict(defaults.sampling) == {**SAMPLING, "top_k": -1}  # transformers' top_k 0 is "off": -1 here
    assert defaults.max_tokens == 5
    assert not load_generation_defaults(model_dir, "vllm")
    assert not load_generation_defaults(tmp_path, "auto")  # no file: no defaults
    other = _write(tmp_path / "elsewhere", {"temperature": 0.7, "eos_token_id": 3})
    assert dict(load_generation_defaults(model_dir, str(other)).sampling) == {"temperature": 0.7}


@pytest.mark.parametrize(("config", "message"), [
    ({"top_p": 1.5}, "top_p"), ({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": "hot"}, "temperature")])
def test_a_value_the_sampler_refuses_is_an_error_naming_the_file(tmp_path: Path, config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        load_generation_defaults(tmp_path, str(_write(tmp_path / "g", config)))
    assert "generation_config.json" in str(error.value)


def test_a_directory_without_the_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no generation_config\.json"):
        load_generation_defaults(tmp_path, str(tmp_path))


def test_requests_take_the_model_s_defaults_and_their_own_fields_win(model_dir: Path) -> None:
    engine = _engine(model_dir)
    plain = build_request(engine.builder, WireRequest(id="a", prompt="Once upon", params={"temperature": None}))
    assert (plain.params.temperature, plain.params.top_p, plain.params.top_k, plain.params.min_p,
            plain.params.repetition_penalty) == (0.0, 0.9, -1, 0.05, 1.2)
    own = build_request(engine.builder, WireRequest(id="b", prompt="Once upon", params={
        "temperature": 0.8, "top_p": 1.0, "max_tokens": 50}))
    assert (own.params.temperature, own.params.top_p, own.params.min_p) == (0.8, 1.0, 0.05)
    assert own.params.max_tokens == 5  # max_new_tokens caps what a request asks for
    fewer = build_request(engine.builder, WireRequest(id="c", prompt="x", params={"max_tokens": 3}))
    assert fewer.params.max_tokens == 3
    until_context = build_request(engine.builder, WireRequest(id="d", prompt="x", params={"max_tokens": None}))
    assert until_context.params.max_tokens == 5
    vllm = build_request(_engine(model_dir, "vllm").builder, WireRequest(id="e", prompt="x"))
    assert (vllm.params.temperature, vllm.params.top_p, vllm.params.max_tokens) == (1.0, 1.0, 16)


def test_generation_follows_the_defaults(model_dir: Path) -> None:
    """Greedy by the model's temperature 0: two seeds give the same tokens, capped at max_new_tokens."""
    engine = _engine(model_dir)
    requests = [WireRequest(id=f"seed-{seed}", prompt="The river", params={"seed": seed, "max_tokens": None,
                                                                           "ignore_eos": True}) for seed in (1, 2)]
    results = run_offline(engine, requests, tqdm(disable=True))
    tokens = [results[f"seed-{seed}"]["choices"][0]["token_ids"] for seed in (1, 2)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 5
    explicit = run_offline(engine, [WireRequest(id="greedy", prompt="The river", params={
        "temperature": 0, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.2, "max_tokens": 5,
        "ignore_eos": True})], tqdm(disable=True))
    assert explicit["greedy"]["choices"][0]["token_ids"] == tokens[0]
