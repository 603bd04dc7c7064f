"""A batch of /v1/embeddings lines on an embedded pooling server (a tiny random BERT as a sentence-transformers
directory): each line's body is what /v1/embeddings answers, and the generation urls are that line's error."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.embedding_engine import EmbeddingEngine
from tests.support.batch_helpers import by_custom_id, chat_line, results, submit, wait_until
from tests.support.embedding_models import make_tiny_encoder, save_sentence_transformer
from tests.support.gateway_helpers import API_KEY, serving


@pytest.fixture(scope="module")
def pooling_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    root = tmp_path_factory.mktemp("bert")
    model_dir = save_sentence_transformer(make_tiny_encoder("bert", root / "raw"), root / "st", "mean", normalize=True)
    engine = EmbeddingEngine(EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32", device="cpu", runner="pooling", cpu_linear="torch"),
        cache=CacheConfig(num_kv_blocks=64), scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8)))
    with serving(EmbeddedBackend(engine), GatewayOptions(api_key=API_KEY)) as base_url:
        yield openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)


def test_embedding_lines_answer_as_the_route_does(pooling_client: openai.OpenAI) -> None:
    lines = [{"custom_id": "one", "method": "POST", "url": "/v1/embeddings", "body": {"input": "the cat sat"}},
             {"custom_id": "two", "method": "POST", "url": "/v1/embeddings",
              "body": {"input": ["dogs ran", "rain fell"], "dimensions": 8}},
             chat_line("chat", "Hi")]
    batch = wait_until(pooling_client, submit(pooling_client, lines, endpoint="/v1/embeddings").id)
    assert batch.status == "completed" and batch.request_counts.completed == 2
    output, errors = results(pooling_client, batch)
    answered = by_custom_id(output)
    direct = pooling_client.embeddings.create(model="st", input="the cat sat", encoding_format="float")
    vector = answered["one"]["response"]["body"]["data"][0]["embedding"]
    assert vector == pytest.approx(direct.data[0].embedding, abs=1e-6)  # batched apart: float32 rounding
    assert [len(item["embedding"]) for item in answered["two"]["response"]["body"]["data"]] == [8, 8]
    [refused] = errors
    assert refused["custom_id"] == "chat" and refused["response"]["status_code"] == 400
    assert "pooling model" in refused["response"]["body"]["error"]["message"]
