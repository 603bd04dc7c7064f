"""Stored files (/v1/files): a record and its bytes under the file's id, for its owner only; another tenant's
id reads as unknown. A file lives until it is deleted or its `expires_at` passes.

The embedded server keeps them in this process (MemoryFileStore: lost on restart, at most
`max_total_bytes` of uploads in all); gateways keep them in Redis (redis_files.py), where every gateway of
the deployment reads them and a restart loses none.
"""

from __future__ import annotations

import time
from typing import Protocol

from actors.http.batches.records import FileRecord

MEMORY_MAX_BYTES = 1024 * 1024 * 1024  # uploads the embedded server holds in all


class StoreFull(Exception):
    """No room for an upload (the memory store's bound)."""


class FileStore(Protocol):
    async def save(self, record: FileRecord, data: bytes) -> None:
        """Store (or overwrite) the file; StoreFull when an upload does not fit."""
        ...

    async def load(self, owner: str, file_id: str) -> FileRecord | None:
        """The record, or None when it is unknown, expired, deleted or another tenant's."""
        ...

    async def content(self, owner: str, file_id: str) -> bytes | None: ...

    async def delete(self, owner: str, file_id: str) -> bool:
        """Whether there was such a file."""
        ...

    async def list(self, owner: str) -> list[FileRecord]:
        """The owner's files, newest first."""
        ...


class MemoryFileStore:
    def __init__(self, max_total_bytes: int = MEMORY_MAX_BYTES) -> None:
        self.max_total_bytes = max_total_bytes
        self._files: dict[str, tuple[FileRecord, bytes]] = {}  # in the order they were saved

    async def save(self, record: FileRecord, data: bytes) -> None:
        self._forget_expired()
        self._files.pop(record.id, None)
        held = sum(len(data) for _, data in self._files.values())
        if record.purpose == "batch" and held + len(data) > self.max_total_bytes:
            raise StoreFull(f"the server holds {held} bytes of files; {len(data)} more would pass its "
                            f"{self.max_total_bytes}: delete files first")
        self._files[record.id] = (record, data)

    async def load(self, owner: str, file_id: str) -> FileRecord | None:
        found = self._find(owner, file_id)
        return found[0] if found is not None else None

    async def content(self, owner: str, file_id: str) -> bytes | None:
        found = self._find(owner, file_id)
        return found[1] if found is not None else None

    async def delete(self, owner: str, file_id: str) -> bool:
        return self._find(owner, file_id) is not None and self._files.pop(file_id, None) is not None

    async def list(self, owner: str) -> list[FileRecord]:
        self._forget_expired()
        return [record for record, _ in reversed(self._files.values()) if record.owner == owner]

    def _find(self, owner: str, file_id: str) -> tuple[FileRecord, bytes] | None:
        self._forget_expired()
        found = self._files.get(file_id)
        return found if found is not None and found[0].owner == owner else None

    def _forget_expired(self) -> None:
        now = time.time()
        for file_id in [file_id for file_id, (record, _) in self._files.items() if record.expires_at <= now]:
            del self._files[file_id]
