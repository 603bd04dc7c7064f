"""POST /v1/embeddings through the official openai SDK: an embedded pooling server (tiny random BERT, mean
pooled and normalised, as a sentence-transformers directory) answers as sentence-transformers encodes, in
float and base64, with Matryoshka dimensions and token-id inputs; a decoder (Qwen3, last token) under
chunked prefill; bad bodies are 400s; each runner refuses the other's endpoints by name; the same
request over Redis to a pooling worker (its own edges on Redis as well); and, as generation requests,
one whose client hangs up is cancelled and one past --request-timeout ends, neither embedded."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from actors.http.backends import EmbeddedBackend, RemoteBackend
from actors.http.options import GatewayOptions
from actors.worker.run import WorkerOptions, run_worker
from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.embedding_engine import EmbeddingEngine
from tests.conftest import REDIS_URL
from tests.support.embedding_models import make_tiny_decoder, make_tiny_encoder, save_sentence_transformer
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY, serving

TEXTS = ["the cat sat on a mat", "dogs ran", "rain fell softly over quiet towns as people walked home " * 4]


def _pooling_engine(model_dir: Path, budget: int = 512) -> EmbeddingEngine:
    return EmbeddingEngine(EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32", device="cpu", runner="pooling", cpu_linear="torch"),
        cache=CacheConfig(num_kv_blocks=64), scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8)))


def _reference(st_dir: Path, texts: list[str], **options: object) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(st_dir), device="cpu", **options).encode(  # type: ignore[arg-type]
        texts, convert_to_numpy=True, normalize_embeddings=True)


def _min_cosine(ours: list[list[float]], reference: np.ndarray) -> float:
    return min(float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(ours, reference,
                                                                                         strict=True))


@pytest.fixture(scope="module")
def bert_st(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bert")
    return save_sentence_transformer(make_tiny_encoder("bert", root / "raw"), root / "st", "mean", normalize=True)


@pytest.fixture(scope="module")
def qwen3_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_decoder(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def pooling_server(bert_st: Path) -> Iterator[tuple[str, openai.OpenAI]]:
    with serving(EmbeddedBackend(_pooling_engine(bert_st)), GatewayOptions(api_key=API_KEY)) as base_url:
        yield base_url, openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)


def test_embeddings_equal_sentence_transformers_in_base64_and_float(
        pooling_server: tuple[str, openai.OpenAI], bert_st: Path) -> None:
    _, client = pooling_server
    reference = _reference(bert_st, TEXTS)
    by_base64 = client.embeddings.create(model="st", input=TEXTS)  # the SDK asks for base64 and decodes it
    by_float = client.embeddings.create(model="st", input=TEXTS, encoding_format="float")
    assert by_base64.object == "list" and by_base64.model == "st"
    assert [item.index for item in by_base64.data] == [0, 1, 2]
    assert all(item.object == "embedding" for item in by_base64.data)
    assert _min_cosine([item.embedding for item in by_base64.data], reference) >= 0.9999
    assert [item.embedding for item in by_float.data] == [item.embedding for item in by_base64.data]
    tokens = sum(len(t) for t in _tokenized(bert_st, TEXTS))
    assert by_float.usage.prompt_tokens == by_float.usage.total_tokens == tokens


def _tokenized(model_dir: Path, texts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.encode(text) for text in texts]


def test_dimensions_truncate_and_renormalise(pooling_server: tuple[str, openai.OpenAI], bert_st: Path) -> None:
    _, client = pooling_server
    answer = client.embeddings.create(model="st", input=TEXTS, dimensions=16, encoding_format="float")
    vectors = [item.embedding for item in answer.data]
    assert [len(v) for v in vectors] == [16, 16, 16]
    assert np.allclose([np.linalg.norm(v) for v in vectors], 1.0, atol=1e-5)
    assert _min_cosine(vectors, _reference(bert_st, TEXTS, truncate_dim=16)) >= 0.9999


def test_token_id_inputs_embed_as_their_text(pooling_server: tuple[str, openai.OpenAI], bert_st: Path) -> None:
    _, client = pooling_server
    ids = _tokenized(bert_st, TEXTS)
    by_text = [item.embedding for item in client.embeddings.create(model="st", input=TEXTS).data]
    by_lists = [item.embedding for item in client.embeddings.create(model="st", input=ids).data]
    by_one = client.embeddings.create(model="st", input=ids[0]).data[0].embedding
    assert np.allclose(by_lists, by_text, atol=1e-6)
    assert np.allclose(by_one, by_text[0], atol=1e-6)


@pytest.mark.parametrize(("body", "param"), [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [""]}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": 5}, "input"),
    ({"input": ["a", 5]}, "input"),
    ({"input": [1, "a"]}, "input"),
    ({"input": [True]}, "input"),
    ({"input": "the cat", "dimensions": 0}, "dimensions"),
    ({"input": "the cat", "dimensions": "8"}, "dimensions"),
    ({"input": "the cat", "dimensions": True}, "dimensions"),
    ({"input": "the cat", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "the cat", "user": 5}, "user"),
    ({"input": "the cat", "temperature": 1}, "temperature"),
    ({"input": [0] * 200_000}, None),  # too long for the model: the worker's refusal
    ({"input": "the cat", "dimensions": 65}, None),  # wider than the model (64)
    ({"input": [[7, 128]]}, None),  # outside the vocabulary
    ({"input": [[-1]]}, None),
])
def test_bad_bodies_are_400s(pooling_server: tuple[str, openai.OpenAI], body: dict, param: str | None) -> None:
    base_url, _ = pooling_server
    answer = httpx.post(f"{base_url}/embeddings", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                        timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_another_model_is_a_404_and_generation_endpoints_are_400s(pooling_server: tuple[str, openai.OpenAI]) -> None:
    _, client = pooling_server
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="another", input="the cat")
    with pytest.raises(openai.BadRequestError, match="/v1/chat/completions is not served by a pooling model"):
        client.chat.completions.create(model="st", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="/v1/completions is not served by a pooling model"):
        client.completions.create(model="st", prompt="the cat")


def test_a_generation_server_refuses_embeddings_naming_the_flag(qwen3_raw: Path) -> None:
    with serving(EmbeddedBackend(make_engine(qwen3_raw, num_kv_blocks=32)), GatewayOptions()) as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="--runner pooling"):
            client.embeddings.create(model=qwen3_raw.name, input="the cat")


def test_a_decoder_embeds_its_last_token_under_chunked_prefill(qwen3_raw: Path, tmp_path: Path) -> None:
    st_dir = save_sentence_transformer(qwen3_raw, tmp_path / "st", "last", normalize=True)
    with serving(EmbeddedBackend(_pooling_engine(st_dir, budget=16)), GatewayOptions()) as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        answer = client.embeddings.create(model="st", input=TEXTS)
    assert answer.usage.prompt_tokens > 3 * 16  # the long prompt ran in several steps
    assert _min_cosine([item.embedding for item in answer.data], _reference(st_dir, TEXTS)) >= 0.9999


@pytest.mark.redis
async def test_embeddings_over_redis_to_a_pooling_worker(bert_st: Path, prefix: str) -> None:
    stop = asyncio.Event()
    options = WorkerOptions(REDIS_URL, prefix, name="e0",  # its plain-data edges over Redis too
                            redis_edges=frozenset({"scheduler", "output_events"}))
    worker = asyncio.create_task(run_worker(_pooling_engine(bert_st), options, stop))
    try:
        backend = RemoteBackend(REDIS_URL, prefix, "st", None, pooling=True)
        with serving(backend, GatewayOptions(worker_timeout_s=30)) as base_url:
            client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
            answer = await client.embeddings.create(model="st", input=TEXTS, dimensions=32)
            with pytest.raises(openai.BadRequestError, match="embedding width 64"):
                await client.embeddings.create(model="st", input="the cat", dimensions=65)
        assert _min_cosine([item.embedding for item in answer.data],
                           _reference(bert_st, TEXTS, truncate_dim=32)) >= 0.9999
    finally:
        stop.set()
        assert await asyncio.wait_for(worker, timeout=30) == 0


def _gated_engine(st_dir: Path) -> tuple[EmbeddingEngine, list[int], threading.Event]:
    """(a pooling engine whose every embedding call waits on the device thread for the gate, how many
    inputs each call took, the gate)."""
    engine, calls, gate = _pooling_engine(st_dir), list[int](), threading.Event()
    embed = engine.embed

    def gated_embed(jobs: list[Any]) -> list[Any]:
        calls.append(len(jobs))
        gate.wait(timeout=60)
        return embed(jobs)

    engine.embed = gated_embed  # type: ignore[method-assign]
    return engine, calls, gate


@contextmanager
def _busy_device_server(st_dir: Path, **options: Any) -> Iterator[tuple[str, list[int], threading.Event]]:
    """(the /v1 URL, how many inputs each embedding call took, the gate): an embedded pooling server whose
    first request is on the device, waiting for the gate, so the requests after it wait in the Embed
    actor's inbox."""
    engine, calls, gate = _gated_engine(st_dir)
    try:
        with serving(EmbeddedBackend(engine), GatewayOptions(api_key=API_KEY, **options)) as base_url:
            first = threading.Thread(target=_post_embeddings, args=(base_url, ["first"], 60), daemon=True)
            first.start()
            _until(lambda: bool(calls))
            yield base_url, calls, gate
            gate.set()
            first.join(timeout=60)
    finally:
        gate.set()


def _post_embeddings(base_url: str, texts: list[str], timeout_s: float) -> httpx.Response:
    return httpx.post(f"{base_url}/embeddings", json={"model": "st", "input": texts, "encoding_format": "float"},
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=timeout_s)


def _until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_client_that_hangs_up_cancels_its_embeddings_before_they_run(bert_st: Path) -> None:
    with _busy_device_server(bert_st) as (base_url, calls, gate):
        with pytest.raises(httpx.ReadTimeout):
            _post_embeddings(base_url, TEXTS, timeout_s=1)  # waits behind the first, then hangs up
        time.sleep(1)  # the gateway's cancel reaches the Embed actor
        gate.set()
        after = _post_embeddings(base_url, ["the cat sat"], timeout_s=60)
        assert after.status_code == 200 and len(after.json()["data"]) == 1
    assert calls == [1, 1]  # the first request and the one after: the cancelled three were never embedded


def test_an_embedding_past_its_request_timeout_ends_unembedded_with_a_504(bert_st: Path) -> None:
    with _busy_device_server(bert_st, request_timeout_s=0.5) as (base_url, calls, gate):
        late = threading.Thread(target=lambda: answers.append(_post_embeddings(base_url, TEXTS, 60)), daemon=True)
        answers: list[httpx.Response] = []
        late.start()
        time.sleep(1.5)  # its deadline passes while it waits for the device
        gate.set()
        late.join(timeout=60)
    [answer] = answers
    assert answer.status_code == 504 and answer.json()["error"]["code"] == "timeout"
    assert calls == [1]  # only the first request, already on the device, was embedded


@pytest.mark.redis
async def test_over_redis_a_client_that_hangs_up_cancels_its_embeddings(bert_st: Path, prefix: str) -> None:
    """The gateway's cancel goes over the control stream to the pooling worker that holds the request."""
    engine, calls, gate = _gated_engine(bert_st)
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(engine, WorkerOptions(REDIS_URL, prefix, name="e0"), stop))
    try:
        backend = RemoteBackend(REDIS_URL, prefix, "st", None, pooling=True)
        with serving(backend, GatewayOptions(worker_timeout_s=30)) as base_url:
            async with httpx.AsyncClient(base_url=base_url) as client:
                body = {"model": "st", "encoding_format": "float"}
                first = asyncio.create_task(client.post("/embeddings", json={**body, "input": ["first"]}, timeout=60))
                while not calls:
                    await asyncio.sleep(0.02)
                with pytest.raises(httpx.ReadTimeout):
                    await client.post("/embeddings", json={**body, "input": TEXTS}, timeout=1)
                await asyncio.sleep(1)
                gate.set()
                assert (await first).status_code == 200
                after = await client.post("/embeddings", json={**body, "input": ["the cat"]}, timeout=60)
                assert after.status_code == 200
        assert calls == [1, 1]
    finally:
        gate.set()
        stop.set()
        assert await asyncio.wait_for(worker, timeout=30) == 0


def test_pooling_flags_map_onto_the_engine_config_and_pick_the_engine(bert_st: Path, qwen3_raw: Path) -> None:
    from actors.cli.engine_args import engine_config_from_args
    from actors.cli.main import build_parser
    from actors.kit.device import build_engine
    from pipeline.engine import LLMEngine

    config = engine_config_from_args(build_parser().parse_args(
        ["serve", str(bert_st), "--runner", "pooling", "--pooling-type", "cls", "--no-normalize", "--dtype", "float"]))
    assert (config.model.runner, config.model.pooling_type, config.model.normalize) == ("pooling", "CLS", False)
    engine = build_engine(config)
    assert isinstance(engine, EmbeddingEngine) and engine.pooling_config.pooling_type == "CLS"
    auto = engine_config_from_args(build_parser().parse_args(["serve", str(bert_st), "--dtype", "float"]))
    assert auto.model.runner == "auto" and isinstance(build_engine(auto), EmbeddingEngine)  # an encoder: pooling
    decoder = engine_config_from_args(build_parser().parse_args(
        ["serve", str(qwen3_raw), "--dtype", "float", "--num-kv-blocks", "16"]))
    assert isinstance(build_engine(decoder), LLMEngine)
    generate = engine_config_from_args(build_parser().parse_args(["serve", str(bert_st), "--runner", "generate"]))
    with pytest.raises(ValueError, match="serves embeddings only"):
        build_engine(generate)
