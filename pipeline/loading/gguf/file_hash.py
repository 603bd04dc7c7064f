"""A file's content hash, remembered by (absolute path, size, mtime_ns).

Hashing a multi-GB GGUF takes seconds to minutes; a start that finds the file unchanged since the
last one reads the hash from a small record instead, so it costs what loading an HF directory does.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_CHUNK_BYTES = 8 * 2**20


def content_hash(path: Path, index_dir: Path) -> str:
    """sha256 hex digest of the file's bytes."""
    path = path.resolve()
    stat = path.stat()
    identity = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    record_path = index_dir / f"{hashlib.sha256(str(path).encode()).hexdigest()[:32]}.json"
    remembered = _read_record(record_path)
    if remembered is not None and all(remembered.get(key) == value for key, value in identity.items()):
        return remembered["sha256"]
    digest = _hash_bytes(path)
    _write_record(record_path, {**identity, "sha256": digest})
    return digest


def _hash_bytes(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _read_record(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning("unreadable file-hash record; hashing again", path=str(path), error=str(error))
        return None
    return record if isinstance(record, dict) and isinstance(record.get("sha256"), str) else None


def _write_record(path: Path, record: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, suffix=".tmp",
                                         delete=False) as staging:
            json.dump(record, staging)
        os.chmod(staging.name, 0o644)  # NamedTemporaryFile is owner-only; other workers read it too
        os.replace(staging.name, path)  # atomic: concurrent writers leave one whole record
    except OSError as error:  # a read-only cache only costs a re-hash next time
        log.warning("could not save the file-hash record", path=str(path), error=str(error))
