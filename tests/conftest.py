"""Shared pytest fixtures."""

from __future__ import annotations

import pathlib

import pytest

from pipeline.default_model import default_model_dir


@pytest.fixture(scope="session")
def default_model_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The built-in default model, generated once per test session into a private cache dir."""
    return default_model_dir(tmp_path_factory.mktemp("aqueduct-cache"))
