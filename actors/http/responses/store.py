"""Stored responses: what `previous_response_id`, GET, DELETE and input_items read.

A record is one response's JSON (records.py), saved under its id for its tenant: the API key that
created it (a hash of the Authorization header, tenant_of). Another tenant's id reads as unknown, so
a response is found, continued or deleted only with the key that made it.

Bounds (StoreLimits): a record lives `ttl_s`; each tenant keeps at most `max_responses` records and
`max_bytes` of them, its oldest evicted first; the memory store (embedded) also keeps at most
`max_total_bytes` over all tenants, since without --api-key a client names its own tenant. A
conversation (the items every later turn renders again) is bounded before generating (records.py).
The Redis store (redis_store.py) keeps the same bounds across every gateway of the deployment.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from starlette.requests import Request


@dataclass(frozen=True, slots=True)
class StoreLimits:
    ttl_s: int = 30 * 24 * 3600  # as OpenAI keeps responses: 30 days
    max_responses: int = 1000  # per tenant
    max_bytes: int = 64 * 1024 * 1024  # per tenant
    max_total_bytes: int = 512 * 1024 * 1024  # the memory store, all tenants together


DEFAULT_LIMITS = StoreLimits()


class ResponseStore(Protocol):
    async def save(self, tenant: str, response_id: str, record: str) -> None: ...

    async def load(self, tenant: str, response_id: str) -> str | None:
        """The record, or None when it is unknown, expired, evicted or another tenant's."""
        ...

    async def delete(self, tenant: str, response_id: str) -> bool:
        """Whether there was such a record."""
        ...


def tenant_of(request: Request) -> str:
    """Who owns what a request stores: its API key, hashed (no key: the tenant of keyless clients)."""
    authorization = request.headers.get("authorization", "")
    return hashlib.sha256(authorization.encode()).hexdigest()[:32]


@dataclass(slots=True)
class _Entry:
    tenant: str
    record: str
    saved_at: float


class MemoryResponseStore:
    """The embedded server's store: in this process, lost on restart."""

    def __init__(self, limits: StoreLimits = DEFAULT_LIMITS, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self.clock = limits, clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # oldest first, all tenants
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}
        self._tenant_bytes: dict[str, int] = {}
        self._total_bytes = 0

    async def save(self, tenant: str, response_id: str, record: str) -> None:
        self._forget_expired()
        self._drop(response_id)
        self._entries[response_id] = _Entry(tenant, record, self.clock())
        self._by_tenant.setdefault(tenant, OrderedDict())[response_id] = None
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + len(record)
        self._total_bytes += len(record)
        self._evict(tenant, keep=response_id)

    async def load(self, tenant: str, response_id: str) -> str | None:
        self._forget_expired()
        entry = self._entries.get(response_id)
        return entry.record if entry is not None and entry.tenant == tenant else None

    async def delete(self, tenant: str, response_id: str) -> bool:
        entry = self._entries.get(response_id)
        if entry is None or entry.tenant != tenant:
            return False
        self._drop(response_id)
        return True

    def _evict(self, tenant: str, keep: str) -> None:
        """The tenant's oldest records past its bounds, then anyone's oldest past the total."""
        mine = self._by_tenant[tenant]
        while (len(mine) > self.limits.max_responses or self._tenant_bytes[tenant] > self.limits.max_bytes) \
                and next(iter(mine)) != keep:
            self._drop(next(iter(mine)))
        while self._total_bytes > self.limits.max_total_bytes and next(iter(self._entries)) != keep:
            self._drop(next(iter(self._entries)))

    def _forget_expired(self) -> None:
        horizon = self.clock() - self.limits.ttl_s
        while self._entries and next(iter(self._entries.values())).saved_at <= horizon:
            self._drop(next(iter(self._entries)))

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return
        mine = self._by_tenant[entry.tenant]
        del mine[response_id]
        self._tenant_bytes[entry.tenant] -= len(entry.record)
        self._total_bytes -= len(entry.record)
        if not mine:
            del self._by_tenant[entry.tenant], self._tenant_bytes[entry.tenant]
