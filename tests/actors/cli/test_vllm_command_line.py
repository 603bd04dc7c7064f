"""A vLLM user's command line works with `vllm` replaced by `aqueduct`: positional MODEL, vLLM's flag
names and values, --served-model-name, --chat-template, --tokenizer, --seed, CORS and --log-level."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from actors.cli.engine_args import engine_config_from_args
from actors.cli.main import build_parser
from actors.http.app import create_app
from actors.http.backends import EmbeddedBackend
from actors.http.serve_args import options_from_args
from pipeline.engine import LLMEngine
from pipeline.request.sampling_params import SamplingParams

VLLM_LINE = ["serve", "MODEL_DIR", "--served-model-name", "team-model", "alias", "--dtype", "float",
             "--kv-cache-dtype", "fp8", "-tp", "1", "--enable-prefix-caching", "--enable-chunked-prefill",
             "--seed", "7", "--allowed-origins", "https://app.example", "--root-path", "/llm", "--log-level", "DEBUG",
             "--max-model-len", "256", "--num-kv-blocks", "64", "--generation-config", "auto"]


def _args(model_dir: Path, *extra: str):
    return build_parser().parse_args([part.replace("MODEL_DIR", str(model_dir)) for part in [*VLLM_LINE, *extra]])


def test_vllm_flags_map_onto_the_engine_config(default_model_path: Path) -> None:
    args = _args(default_model_path)
    config = engine_config_from_args(args)
    assert config.model.model == str(default_model_path) and config.model.dtype == "float32"
    assert config.cache.kv_cache_dtype == "fp8_e4m3" and config.cache.enable_prefix_caching
    assert config.model.request_seed == 7 and args.log_level == "DEBUG" and args.root_path == "/llm"
    assert config.model.generation_config == "auto"
    assert engine_config_from_args(build_parser().parse_args(["serve", "--generation-config", "vllm"])
                                   ).model.generation_config == "vllm"
    assert not engine_config_from_args(build_parser().parse_args(
        ["worker", "--no-enable-prefix-caching"])).cache.enable_prefix_caching
    assert engine_config_from_args(build_parser().parse_args(
        ["serve", "--long-prefill-token-threshold", "64"])).scheduler.long_prefill_token_threshold == 64
    assert engine_config_from_args(build_parser().parse_args(["batch", "-i", "x", "-o", "y", "--dtype", "half"])
                                   ).model.dtype == "float16"
    with pytest.raises(ValueError, match="two models"):
        engine_config_from_args(build_parser().parse_args(["serve", "a", "--model", "b"]))


async def test_served_model_names_and_cors(default_model_path: Path) -> None:
    args = _args(default_model_path, "--kv-cache-dtype", "auto")
    backend = EmbeddedBackend(LLMEngine(engine_config_from_args(args)))
    app = create_app(backend, options_from_args(args))
    await backend.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            body = {"prompt": "hi", "max_tokens": 2}
            first = await client.post("/v1/completions", json={**body, "model": "alias"})
            assert first.status_code == 200 and first.json()["model"] == "team-model"
            assert (await client.post("/v1/completions", json={**body, "model": "smollm2"})).status_code == 404
            models = (await client.get("/v1/models")).json()["data"]
            assert [model["id"] for model in models] == ["team-model"]
            preflight = await client.options("/v1/completions", headers={
                "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
            assert preflight.headers["access-control-allow-origin"] == "https://app.example"
            other = await client.options("/v1/completions", headers={
                "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
            assert "access-control-allow-origin" not in other.headers
    finally:
        await backend.close()


def test_chat_template_tokenizer_and_seed_flags(default_model_path: Path, tmp_path: Path) -> None:
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}")
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path / name, tokenizer_dir / name)
    args = build_parser().parse_args(["worker", "--model", str(default_model_path), "--chat-template", str(template),
                                      "--tokenizer", str(tokenizer_dir), "--num-kv-blocks", "64"])
    engine = LLMEngine(engine_config_from_args(args))
    request = engine.builder.build("r", SamplingParams(max_tokens=2), messages=[{"role": "user", "content": "yo"}])
    assert engine.tokenizer.decode(request.prompt_token_ids) == "<<user>>yo"
    seeded = engine.builder.build("r", SamplingParams(max_tokens=2), prompt="yo").seed
    args.seed = 7
    other = LLMEngine(engine_config_from_args(args)).builder.build("r", SamplingParams(max_tokens=2), prompt="yo")
    assert other.seed != seeded  # --seed changes derived seeds ...
    assert other.seed == LLMEngine(engine_config_from_args(args)).builder.build(
        "r", SamplingParams(max_tokens=2), prompt="yo").seed  # ... the same way on every worker
    own = engine.builder.build("r", SamplingParams(max_tokens=2, seed=5), prompt="yo")
    assert own.seed == 5  # a request's own seed wins
