"""The KoboldAI routes of a stateless gateway in front of a worker on the real Redis: generate, stream,
abort by genkey (the cancel travels the control stream), and a worker's refusal in Kobold's shape."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from actors.http.backends import RemoteBackend
from actors.http.options import GatewayOptions
from pipeline.loading.tokenizer import load_tokenizer
from tests.conftest import REDIS_URL
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.worker_helpers import running_workers

pytestmark = pytest.mark.redis
AUTH = {"Authorization": f"Bearer {API_KEY}"}


async def test_kobold_routes_through_redis_workers(default_model_path: Path, prefix: str) -> None:
    backend = RemoteBackend(REDIS_URL, prefix, default_model_path.name, load_tokenizer(default_model_path))
    body = {"prompt": "Once upon a time", "max_length": 10, "max_context_length": 256, "temperature": 0.9,
            "sampler_seed": 3, "rep_pen": 1.1}
    async with running_workers(default_model_path, prefix, count=1):
        with serving(backend, GatewayOptions(api_key=API_KEY, worker_timeout_s=30)) as base_url:
            async with httpx.AsyncClient(base_url=base_url.removesuffix("/v1"), headers=AUTH, timeout=60) as api:
                whole = (await api.post("/api/v1/generate", json=body)).json()["results"][0]
                async with api.stream("POST", "/api/extra/generate/stream", json=body) as response:
                    tokens = [json.loads(line[6:])["token"] async for line in response.aiter_lines()
                              if line.startswith("data: ")]
                assert "".join(tokens) == whole["text"] and whole["finish_reason"] == "length"

                long = {**body, "max_length": 2000, "max_context_length": 4096, "genkey": "KCPP77",
                        "use_default_badwordsids": True}
                async with api.stream("POST", "/api/extra/generate/stream", json=long) as response:
                    lines = response.aiter_lines()
                    assert (await anext(lines)).startswith("event: message")
                    aborted = await api.post("/api/extra/abort", json={"genkey": "KCPP77"})
                    assert aborted.json() == {"success": True}
                    events = [json.loads(line[6:]) async for line in lines if line.startswith("data: ")]
                assert events[-1]["finish_reason"] == "abort" and len(events) < 1999

                refused = await api.post("/api/v1/generate", json={**body, "max_length": 100_000,
                                                                   "max_context_length": 200_000})
                assert refused.status_code == 400 and refused.json()["detail"]["msg"]
