"""Where Aqueduct keeps what it builds once and reuses: the default model, compiled kernels,
resolved tokenizers. $AQUEDUCT_CACHE_DIR, else ~/.cache/aqueduct."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    env = os.environ.get("AQUEDUCT_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "aqueduct"
