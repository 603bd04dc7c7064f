"""The Batch API's state on one gateway, made when the app starts, after the backend (whose Redis client exists
only then), or on first use where something else started the backend: its stores, in Redis when the backend is
a deployment's (every gateway shares them, and a restart loses nothing) or in this process when the engine is
embedded, and the supervisor that runs batches."""

from __future__ import annotations

from actors.http.backends import Backend, RemoteBackend
from actors.http.batches.batch_store import BatchStore, MemoryBatchStore
from actors.http.batches.file_store import FileStore, MemoryFileStore
from actors.http.batches.line_request import LineParser
from actors.http.batches.redis_batches import RedisBatchStore
from actors.http.batches.redis_files import RedisFileStore
from actors.http.batches.runner import BatchContext
from actors.http.batches.supervisor import BatchSupervisor
from actors.http.options import GatewayOptions


class BatchService:
    def __init__(self, backend: Backend, options: GatewayOptions) -> None:
        self.backend, self.options = backend, options
        self._context: BatchContext | None = None
        self.supervisor: BatchSupervisor | None = None

    async def start(self) -> None:
        self._started()

    async def stop(self) -> None:
        if self.supervisor is not None:
            await self.supervisor.stop()
        self.supervisor, self._context = None, None

    @property
    def files(self) -> FileStore:
        return self._started().files

    @property
    def batches(self) -> BatchStore:
        return self._started().batches

    def wake(self) -> None:
        if self.supervisor is not None:
            self.supervisor.wake()

    def _started(self) -> BatchContext:
        """Called on the event loop (the supervisor's task is made here)."""
        if self._context is None:
            files, batches = _stores(self.backend)
            self._context = BatchContext(batches, files, self.backend, LineParser(self.backend, self.options),
                                         self.options.batches)
            self.supervisor = BatchSupervisor(self._context)
            self.supervisor.launch()
        return self._context


def _stores(backend: Backend) -> tuple[FileStore, BatchStore]:
    if isinstance(backend, RemoteBackend):
        if backend.client is None:
            raise RuntimeError("the backend is not started")
        redis = backend.client.redis
        return RedisFileStore(redis, backend.prefix), RedisBatchStore(redis, backend.prefix)
    return MemoryFileStore(), MemoryBatchStore()
