"""compose.yaml's gateway service: its structure, and its command run locally (`aqueduct serve` as a
process) in front of a worker on the test Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.conftest import REDIS_URL
from tests.support.gateway_helpers import free_port
from tests.support.worker_helpers import running_workers
from tests.system.test_compose import AQUEDUCT, SERVICES, argv_of, duration_s, flag_value, with_flag

pytestmark = pytest.mark.redis

GATEWAY = SERVICES["gateway"]


def test_the_gateway_runs_the_worker_image_published_on_localhost_only() -> None:
    assert GATEWAY["image"] == SERVICES["worker"]["image"] and "build" not in GATEWAY
    argv = argv_of(GATEWAY["command"])
    assert argv[0] == "serve"
    assert flag_value(argv, "--redis-url") == "redis://redis:6379"
    assert GATEWAY["ports"] == ["127.0.0.1:${AQUEDUCT_HTTP_PORT:-8000}:8000"]
    assert f"http://127.0.0.1:{flag_value(argv, '--port')}/health" in GATEWAY["healthcheck"]["test"][3]
    assert GATEWAY["depends_on"]["redis"]["condition"] == "service_healthy"


def _get(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


async def test_the_gateway_command_serves_completions_from_a_worker_and_stops_on_sigterm(
        default_model_path: Path, prefix: str, tmp_path: Path) -> None:
    port = free_port()
    argv = with_flag(argv_of(GATEWAY["command"]), "--redis-url", REDIS_URL)
    argv = with_flag(with_flag(with_flag(argv, "--prefix", prefix), "--port", str(port)), "--host", "127.0.0.1")
    # The model the worker serves: the built-in one, generated into the session's cache directory.
    env = {**os.environ, "AQUEDUCT_CACHE_DIR": str(default_model_path.parent)}
    log_path = tmp_path / "gateway.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(AQUEDUCT), *argv, "--model", "builtin"], env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while _get(f"http://127.0.0.1:{port}/health") != 200:
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        async with running_workers(default_model_path, prefix, count=1):
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
            models = [model.id async for model in client.models.list()]
            assert models == ["builtin"]
            completion = await client.completions.create(model="builtin", prompt="Hi", max_tokens=4)
            assert completion.usage.completion_tokens == 4
            await client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=duration_s(GATEWAY["stop_grace_period"])) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        pytest.fail(log_path.read_text()[-3000:])
