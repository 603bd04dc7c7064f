"""Hub model ids (`org/name`) through huggingface_hub: downloaded into the HF cache where the network
allows, read from that cache offline (HF_HUB_OFFLINE) or when the Hub cannot be reached, and a clear
error when neither works. A local stand-in for the Hub (tests/support/fake_hub.py) lets the library
itself download and lay out the cache; each resolution runs in a fresh process, so the HF_* variables
are read as a real start reads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fake_hub import COMMIT, fake_hub
from tests.support.gateway_helpers import free_port

REPO = "aqueduct-tests/tiny-llama"
_RESOLVE = ("import json, sys\nfrom pipeline.loading.model_source import resolve_model\n"
            "try:\n    resolved = resolve_model(sys.argv[1], None)\n"
            "    print(json.dumps({'path': str(resolved.path), 'name': resolved.name}))\n"
            "except ValueError as error:\n    print(json.dumps({'error': str(error)}))\n")


def _resolve(model: str, cache: Path, endpoint: str, offline: bool = False) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HUB_CACHE=str(cache), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=os.getcwd(), **({"HF_HUB_OFFLINE": "1"} if offline else {}))
    done = subprocess.run([sys.executable, "-c", _RESOLVE, model], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def downloaded(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list]:
    cache = tmp_path_factory.mktemp("hf-cache")
    with fake_hub(REPO, default_model_path) as (endpoint, requests):
        online = _resolve(REPO, cache, endpoint)
        missing = _resolve("aqueduct-tests/no-such-model", cache, endpoint)
    return cache, {"online": online, "missing": missing}, requests


def test_a_hub_id_downloads_into_the_hf_cache_in_the_library_s_layout(downloaded, default_model_path: Path) -> None:
    cache, results, requests = downloaded
    snapshot = cache / "models--aqueduct-tests--tiny-llama" / "snapshots" / COMMIT
    assert results["online"] == {"path": str(snapshot), "name": REPO}
    assert (cache / "models--aqueduct-tests--tiny-llama" / "refs" / "main").read_text() == COMMIT
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (snapshot / name).read_bytes() == (default_model_path / name).read_bytes()
        assert (snapshot / name).is_symlink()  # into blobs/, as huggingface_hub lays out its cache
    assert any(request.startswith("GET /aqueduct-tests/tiny-llama/resolve/") for request in requests)


def test_offline_and_unreachable_hubs_read_the_cache(downloaded) -> None:
    cache, results, _ = downloaded
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: the Hub cannot be reached
    assert _resolve(REPO, cache, closed, offline=True) == results["online"]
    assert _resolve(REPO, cache, closed) == results["online"]


def test_no_model_in_reach_is_a_clear_error(downloaded) -> None:
    cache, results, _ = downloaded
    closed = f"http://127.0.0.1:{free_port()}"
    assert "the Hub has no such model" in results["missing"]["error"]
    offline = _resolve("aqueduct-tests/other", cache, closed, offline=True)["error"]
    assert "is not in the local Hugging Face cache" in offline and "HF_HUB_OFFLINE is set" in offline
    unreachable = _resolve("aqueduct-tests/other", cache, closed)["error"]
    assert "cannot be reached" in unreachable and closed in unreachable


def test_serving_a_hub_id_from_the_cache_gives_the_local_model_s_tokens(downloaded, default_model_path: Path,
                                                                        tmp_path: Path, monkeypatch) -> None:
    from huggingface_hub import constants

    from actors.cli.main import main

    cache, _, _ = downloaded
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {
        "prompt": "The river", "max_tokens": 6, "temperature": 0, "ignore_eos": True}}) + "\n")
    outputs = {}
    for model in (REPO, "builtin"):
        target = tmp_path / f"{model.replace('/', '_')}.jsonl"
        assert main(["batch", "-i", str(source), "-o", str(target), "--no-progress", "--num-kv-blocks", "64",
                     "--model", model]) == 0
        outputs[model] = json.loads(target.read_text())["response"]["body"]
    assert outputs[REPO]["model"] == REPO
    assert outputs[REPO]["choices"][0]["token_ids"] == outputs["builtin"]["choices"][0]["token_ids"]
    assert len(outputs[REPO]["choices"][0]["token_ids"]) == 6


def test_tokenizer_takes_a_hub_id_and_refuses_a_missing_directory(downloaded, default_model_path: Path,
                                                                  tmp_path: Path, monkeypatch) -> None:
    from huggingface_hub import constants

    from pipeline.loading.tokenizer import load_served_tokenizer, load_tokenizer

    cache, _, _ = downloaded
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(tmp_path / "aqueduct-cache"))
    served = load_served_tokenizer(tmp_path, REPO, None)  # the model directory has no tokenizer of its own
    text = "The river runs to the sea."
    assert served is not None and served.encode(text) == load_tokenizer(default_model_path).encode(text)
    with pytest.raises(ValueError, match="--tokenizer '/no/such/dir' is neither a directory nor a Hub id"):
        load_served_tokenizer(tmp_path, "/no/such/dir", None)
    with pytest.raises(ValueError, match="--tokenizer 'aqueduct-tests/other' is no local file or directory"):
        load_served_tokenizer(tmp_path, "aqueduct-tests/other", None)
