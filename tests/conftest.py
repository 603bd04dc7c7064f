"""Shared pytest fixtures."""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Iterator

import pytest
import redis

from pipeline.default_model import default_model_dir

REDIS_URL = os.environ.get("AQUEDUCT_TEST_REDIS_URL", "redis://127.0.0.1:6379")


@pytest.fixture(scope="session")
def default_model_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The built-in default model, generated once per test session into a private cache dir."""
    return default_model_dir(tmp_path_factory.mktemp("aqueduct-cache"))


@pytest.fixture
def prefix() -> Iterator[str]:
    """A unique key prefix on the test Redis (skips when none answers); its keys are deleted after."""
    sync = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        sync.ping()
    except redis.exceptions.ConnectionError as error:
        pytest.skip(f"these tests need a Redis server at {REDIS_URL} (set AQUEDUCT_TEST_REDIS_URL): {error}")
    prefix = f"test-aqueduct:{uuid.uuid4().hex}"
    yield prefix
    keys = list(sync.scan_iter(match=f"{prefix}:*"))
    if keys:
        sync.delete(*keys)
    sync.close()
