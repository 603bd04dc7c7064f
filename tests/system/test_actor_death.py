"""A dead actor ends its process (issue 26): nothing lingers answering 503.

The actors are killed from inside by the test hook AQUEDUCT_TEST_CRASH_ACTOR=<actor>:<n> (actors/kit/base.py).
Embedded, the requests in flight and any new one get a `worker_died` 503 at once, /health turns 503, and
`aqueduct serve` exits 1. A worker exits 1 within seconds, leaving its requests to another worker, which
finishes each once, with the tokens of an uninterrupted run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgpack
import pytest
import redis

from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from actors.kit.base import TEST_CRASH_ENV
from queue_adapters.redis_streams import retry_transient
from tests.conftest import REDIS_URL
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY, free_port, serving
from tests.support.hf_models import make_tiny_hf_model
from tests.support.worker_processes import (
    AQUEDUCT,
    all_final,
    assert_answered_once,
    make_requests,
    reference_run,
    start_worker,
    wait_for,
)

PROMPTLY_S = 10.0  # well under the gateway's 60 s worker timeout, with room for a loaded CI box
WORKER_EXIT_S = 4.0  # under the runtime's 5 s wait for tasks that do not stop when cancelled (~0.1 s measured)
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def test_a_task_that_ignores_cancellation_cannot_keep_a_crashed_process_alive() -> None:
    """exit_after is the last resort: asyncio's teardown would wait for the stubborn task forever."""
    script = textwrap.dedent("""
        import asyncio
        from actors.kit.runtime import ActorRuntime, exit_after

        class Crashes:
            name = "crashes"
            async def run(self):
                raise RuntimeError("a bug")

        class Stubborn:
            name = "stubborn"
            async def run(self):
                while True:
                    try:
                        await asyncio.sleep(3600)
                    except asyncio.CancelledError:
                        pass

        async def idle():
            return None

        runtime = ActorRuntime([Stubborn(), Crashes()], None, idle, 1.0, on_crash=lambda _: exit_after(1.0, 1))
        asyncio.run(runtime.run())
    """)
    started = time.monotonic()
    process = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=30, cwd=Path(__file__).parents[2])
    assert process.returncode == 1, process.stdout
    assert time.monotonic() - started < PROMPTLY_S
    assert "did not exit in time" in process.stdout


async def test_retry_transient_does_not_lose_a_cancellation_its_operation_swallowed() -> None:
    """As Python 3.11's asyncio.wait_for does inside redis-py when the cancel lands as a send completes:
    the worker's output actor then ran on, holding a crashed worker up for the runtime's 5 s."""
    async def swallows_it() -> str:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        return "written"

    task = asyncio.create_task(retry_transient(swallows_it, "test write"))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.fixture
def dying_gateway(default_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, EmbeddedBackend]]:
    """An embedded gateway whose GPU actor dies on its 40th step."""
    monkeypatch.setenv(TEST_CRASH_ENV, "gpu:40")
    backend = EmbeddedBackend(make_engine(default_model_path))
    with serving(backend, GatewayOptions(api_key=API_KEY)) as base_url:
        yield base_url.removesuffix("/v1"), backend


async def _in_flight_pair(base: str, model: str) -> tuple[httpx.Response, list[dict], float]:
    """A streaming completion, and once its first tokens are out a plain one: both running when the GPU
    actor dies (on its 40th step; the stream's first tokens come from its first)."""
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=base, headers=HEADERS, timeout=90) as client:
        started = time.monotonic()
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            assert response.status_code == 200
            events = (json.loads(line[6:]) async for line in response.aiter_lines() if line.startswith("data: {"))
            first = await anext(events)
            plain = await client.post("/v1/completions", json=body)
            rest = [event async for event in events]
        return plain, [first, *rest], time.monotonic() - started


def test_embedded_requests_in_flight_get_503_at_once_and_health_turns_503(
        dying_gateway: tuple[str, EmbeddedBackend]) -> None:
    base, backend = dying_gateway
    plain, events, seconds = asyncio.run(_in_flight_pair(base, backend.model_name))
    assert seconds < PROMPTLY_S
    assert plain.status_code == 503 and plain.json()["error"]["code"] == "worker_died", plain.text
    assert events[0]["choices"] and events[-1]["error"]["code"] == "worker_died"
    assert backend.died is not None and "gpu" in backend.died
    assert httpx.get(f"{base}/health").status_code == 503
    started = time.monotonic()
    refused = httpx.post(f"{base}/v1/completions", headers=HEADERS, timeout=90,
                         json={"model": backend.model_name, "prompt": "Hi", "max_tokens": 4})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "worker_died"
    assert time.monotonic() - started < PROMPTLY_S


def test_aqueduct_serve_exits_non_zero_when_its_engine_dies(default_model_path: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "AQUEDUCT_CACHE_DIR": str(default_model_path.parent), TEST_CRASH_ENV: "gpu:3"}
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(AQUEDUCT), "serve", "--model", "builtin", "--host", "127.0.0.1",
                                    "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _status(f"{base}/health") == 200 or process.poll() is not None, 60, "the server to start")
        assert process.poll() is None, log_path.read_text()[-3000:]
        response = httpx.post(f"{base}/v1/completions", timeout=90,
                              json={"model": "builtin", "prompt": "Hi", "max_tokens": 50, "ignore_eos": True})
        answered = time.monotonic()
        assert response.status_code == 503 and response.json()["error"]["code"] == "worker_died", response.text
        assert process.wait(timeout=30) == 1, log_path.read_text()[-3000:]
        assert time.monotonic() - answered < PROMPTLY_S
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=17)


def test_a_worker_whose_actor_dies_exits_and_another_finishes_its_requests(
        model_dir: Path, prefix: str, tmp_path: Path) -> None:
    """As after kill -9, the dead worker's claimed requests stay pending; the survivor claims them at
    once (the dead worker deleted its heartbeat) and resumes each from its reply stream."""
    requests = make_requests(8, max_tokens=40)
    reference = reference_run(model_dir, requests)
    client = redis.Redis.from_url(REDIS_URL)
    victim = start_worker(model_dir, prefix, "victim", tmp_path, env={TEST_CRASH_ENV: "gpu:15"})
    survivor = start_worker(model_dir, prefix, "survivor", tmp_path, ("--max-in-flight", "2"))  # victim takes most
    victim_log = tmp_path / "victim.log"
    try:
        wait_for(lambda: all(client.exists(f"{prefix}:worker:{n}") for n in ("victim", "survivor")), 60,
                 "workers to start")
        for request in requests.values():
            client.xadd(f"{prefix}:requests", {"data": msgpack.packb(request)})
        wait_for(lambda: "actor stopped unexpectedly" in victim_log.read_text() or victim.poll() is not None, 60,
                 "the victim's actor to die")
        crashed = time.monotonic()
        assert victim.wait(timeout=30) == 1, victim_log.read_text()[-3000:]
        assert time.monotonic() - crashed < WORKER_EXIT_S
        wait_for(lambda: all_final(client, prefix, requests), 120, "every request to finish")
    finally:
        for process in (victim, survivor):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
    assert_answered_once(client, prefix, requests, reference)
    assert "claimed an orphaned request" in (tmp_path / "survivor.log").read_text()
    assert survivor.returncode == 0
