"""Shared pytest fixtures."""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Iterator

import pytest
import redis
import structlog
from hypothesis import settings

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the CLI does (before torch is imported), so tests run what deployments run

from pipeline.loading.default_model import default_model_dir  # noqa: E402

REDIS_URL = os.environ.get("AQUEDUCT_TEST_REDIS_URL", "redis://127.0.0.1:6379")

# The README's test command draws the same hypothesis examples every run, so it passes every time on
# a new machine; AQUEDUCT_HYPOTHESIS_EXPLORE=1 draws new ones (and keeps a database of failures) to
# find what the fixed examples miss.
settings.register_profile("fixed", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile("explore" if os.environ.get("AQUEDUCT_HYPOTHESIS_EXPLORE") == "1" else "fixed")


@pytest.fixture(scope="session")
def default_model_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The built-in default model, generated once per test session into a private cache dir."""
    return default_model_dir(tmp_path_factory.mktemp("aqueduct-cache"))


@pytest.fixture
def redis_url() -> str:
    """The test Redis; the test is skipped when none answers."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as error:
        pytest.skip(f"these tests need a Redis server at {REDIS_URL} (set AQUEDUCT_TEST_REDIS_URL): {error}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A unique key prefix on the test Redis; its keys are deleted after the test."""
    prefix = f"test-aqueduct:{uuid.uuid4().hex}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(autouse=True)
def _structlog_configuration_restored() -> Iterator[None]:
    """A test that runs the CLI in-process (`main([...])`) configures structlog to cache each logger on its
    first use, which would blind every later test's `capture_logs` to loggers first used after it (which
    test that is depends on the order). Each test gets back the configuration it started with."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


_REDIS_FIXTURES = {"redis_url", "prefix"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers that follow from where a test is and what it asks for (module-level ones add the rest):
    everything in tests/system/ is `slow`; a test using the Redis fixtures is `redis`."""
    for item in items:
        if "system" in item.path.parts:
            item.add_marker(pytest.mark.slow)
        if _REDIS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.redis)
