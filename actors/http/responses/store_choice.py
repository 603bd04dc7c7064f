"""Which store a gateway keeps responses in: Redis when its backend is a deployment's (any gateway reads
what another stored), process memory when the engine runs embedded."""

from __future__ import annotations

from actors.http.backends import Backend, RemoteBackend
from actors.http.responses.redis_store import RedisResponseStore
from actors.http.responses.store import MemoryResponseStore, ResponseStore


class LazyStore:
    """Made on first use: the backend's Redis client exists only once the app has started it."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._store: ResponseStore | None = None

    def get(self) -> ResponseStore:
        if self._store is None:
            self._store = _store_for(self.backend)
        return self._store


def _store_for(backend: Backend) -> ResponseStore:
    if isinstance(backend, RemoteBackend):
        if backend.client is None:
            raise RuntimeError("the backend is not started")
        return RedisResponseStore(backend.client.redis, backend.prefix)
    return MemoryResponseStore()
