"""/v1/embeddings on a pooling server (tiny random BERT), fuzzed in-process by schemathesis from the OpenAPI
document as tests/system/test_fuzz_gateway.py fuzzes the generation routes (which also sends this route's
bodies to a generation server, where every one is a 400): every body, valid or not, gets an answer below 500
within 10 s, a 4xx in OpenAI's error shape, and the engine still serves afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.python import asgi

from actors.http.backends import EmbeddedBackend
from actors.http.openapi import openapi_document
from pipeline.config import EngineConfig, ModelConfig, SchedulerConfig
from pipeline.embedding_engine import EmbeddingEngine
from tests.support.embedding_models import make_tiny_encoder
from tests.support.gateway_fuzz import AUTH, CHECKS, HANG_S, OneLifespan, fuzz_app, tame
from tests.system.test_fuzz_gateway import UNSHRUNK

EXAMPLES = 60
schema = schemathesis.openapi.from_dict(openapi_document()).include(path_regex="^/v1/embeddings$")


@pytest.fixture(scope="module")
def pooling_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OneLifespan]:
    model_dir = make_tiny_encoder("bert", tmp_path_factory.mktemp("bert"))
    engine = EmbeddingEngine(EngineConfig(model=ModelConfig(model=str(model_dir), dtype="float32", device="cpu"),
                                          scheduler=SchedulerConfig(max_num_seqs=32)))
    backend = EmbeddedBackend(engine)
    app = OneLifespan(fuzz_app(backend), backend)
    yield app
    app.close()


@schema.parametrize()
@settings(max_examples=EXAMPLES, suppress_health_check=list(HealthCheck), phases=UNSHRUNK)
def test_every_embeddings_request_is_answered_below_500_in_time(case: schemathesis.Case,
                                                                 pooling_gateway: OneLifespan) -> None:
    tame(case)
    case.call_and_validate(headers=AUTH, timeout=HANG_S, checks=CHECKS, app=pooling_gateway)
    pooling_gateway.assert_up()


def test_the_pooling_server_still_embeds_after_the_fuzz(pooling_gateway: OneLifespan) -> None:
    with asgi.get_client(pooling_gateway) as client:
        answer = client.post("/v1/embeddings", headers=AUTH, timeout=HANG_S, json={"input": ["the cat", [5, 6]]})
        assert answer.status_code == 200, answer.text
        assert [len(item["embedding"]) for item in answer.json()["data"]] == [64, 64]
