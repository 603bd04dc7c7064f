"""Where Aqueduct keeps what it builds once and reuses: the default model, compiled kernels,
resolved tokenizers, converted GGUF models. $AQUEDUCT_CACHE_DIR, else ~/.cache/aqueduct."""

from __future__ import annotations

import os
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


def cache_dir() -> Path:
    env = os.environ.get("AQUEDUCT_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "aqueduct"


def publish_directory(staging: Path, target: Path) -> None:
    """Move a fully written staging directory to `target` in one rename.

    Readers see either no directory or a complete one. When another process published the same
    target first, its copy is equivalent, so ours is left for the caller to delete.
    """
    staging.chmod(0o755)  # mkdtemp makes it owner-only; a shared cache must stay readable
    try:
        os.rename(staging, target)
    except OSError:
        if not target.is_dir():
            raise
        log.info("published concurrently by another process; discarding ours", path=str(target))
