"""Stored batches (/v1/batches): each batch's record, its lines' answers, and who runs it.

- A line's answer (its output or error line, as JSON) is recorded at most once: `record_line` keeps the first
  answer for an index and counts it, completed or failed, in the same step. So a line is answered exactly
  once however many runners (a gateway that lost its hold, one resuming after a restart) answer it.
- Only the runner holding a batch's lease (`claim`, renewed by claiming again, let go by `release`) writes
  its record; a cancel is asked for apart from the record (`request_cancel`), by any gateway.
- A batch is `active` from its creation until its record is saved finished; then its lines' answers are
  dropped (they are in its result files) and its record is kept for FINISHED_TTL_S.

The embedded server keeps them in this process (MemoryBatchStore: lost on restart, with the batches it was
running); gateways keep them in Redis (redis_batches.py).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Protocol

from actors.http.batches.records import BatchRecord

FINISHED_TTL_S = 30 * 24 * 3600


class BatchStore(Protocol):
    async def create(self, record: BatchRecord) -> None: ...

    async def load(self, batch_id: str) -> BatchRecord | None:
        """The record with its counts and cancel time; None when unknown or expired (any owner's)."""
        ...

    async def save(self, record: BatchRecord) -> None:
        """The runner's changes (status, times, result files); not the counts nor the cancel time."""
        ...

    async def list(self, owner: str) -> list[BatchRecord]:
        """The owner's batches, newest first."""
        ...

    async def request_cancel(self, batch_id: str, at: int) -> None: ...

    async def record_line(self, batch_id: str, index: int, line: str, ok: bool) -> bool:
        """Keep `line` as line `index`'s answer unless it has one; whether this one was kept."""
        ...

    async def answered(self, batch_id: str) -> set[int]:
        """The indices of the lines answered so far."""
        ...

    async def lines(self, batch_id: str, start: int, stop: int) -> list[str | None]:
        """The answers of lines start..stop-1 (None where a line has none)."""
        ...

    async def active(self) -> list[str]:
        """The batches not finished yet, oldest first."""
        ...

    async def claim(self, batch_id: str, holder: str, ttl_s: float) -> bool:
        """Take the batch's lease for `ttl_s`, or extend it when `holder` has it; False when another has it."""
        ...

    async def release(self, batch_id: str, holder: str) -> None: ...


class MemoryBatchStore:
    def __init__(self) -> None:
        self._records: dict[str, BatchRecord] = {}  # in the order they were created
        self._lines: dict[str, dict[int, str]] = {}
        self._counts: dict[str, list[int]] = {}  # batch -> [completed, failed]
        self._cancels: dict[str, int] = {}
        self._leases: dict[str, tuple[str, float]] = {}
        self._finished_at: dict[str, float] = {}

    async def create(self, record: BatchRecord) -> None:
        self._records[record.id] = replace(record)
        self._lines[record.id], self._counts[record.id] = {}, [0, 0]

    async def load(self, batch_id: str) -> BatchRecord | None:
        self._forget_expired()
        record = self._records.get(batch_id)
        if record is None:
            return None
        completed, failed = self._counts[batch_id]
        return replace(record, completed=completed, failed=failed, cancelling_at=self._cancels.get(batch_id))

    async def save(self, record: BatchRecord) -> None:
        if record.id in self._records:
            self._records[record.id] = replace(record)
            if record.finished:
                self._finished_at.setdefault(record.id, time.monotonic())
                self._lines[record.id] = {}

    async def list(self, owner: str) -> list[BatchRecord]:
        self._forget_expired()
        ids = [batch_id for batch_id, record in reversed(self._records.items()) if record.owner == owner]
        return [record for batch_id in ids if (record := await self.load(batch_id)) is not None]

    async def request_cancel(self, batch_id: str, at: int) -> None:
        if batch_id in self._records:
            self._cancels.setdefault(batch_id, at)

    async def record_line(self, batch_id: str, index: int, line: str, ok: bool) -> bool:
        lines, record = self._lines.get(batch_id), self._records.get(batch_id)
        if lines is None or record is None or record.finished or index in lines:
            return False
        lines[index] = line
        self._counts[batch_id][0 if ok else 1] += 1
        return True

    async def answered(self, batch_id: str) -> set[int]:
        return set(self._lines.get(batch_id, {}))

    async def lines(self, batch_id: str, start: int, stop: int) -> list[str | None]:
        lines = self._lines.get(batch_id, {})
        return [lines.get(index) for index in range(start, stop)]

    async def active(self) -> list[str]:
        return [batch_id for batch_id, record in self._records.items() if not record.finished]

    async def claim(self, batch_id: str, holder: str, ttl_s: float) -> bool:
        now = time.monotonic()
        current = self._leases.get(batch_id)
        if current is not None and current[0] != holder and current[1] > now:
            return False
        self._leases[batch_id] = (holder, now + ttl_s)
        return True

    async def release(self, batch_id: str, holder: str) -> None:
        if self._leases.get(batch_id, ("", 0.0))[0] == holder:
            del self._leases[batch_id]

    def _forget_expired(self) -> None:
        horizon = time.monotonic() - FINISHED_TTL_S
        for batch_id in [batch_id for batch_id, at in self._finished_at.items() if at <= horizon]:
            del self._records[batch_id], self._lines[batch_id], self._counts[batch_id], self._finished_at[batch_id]
            self._cancels.pop(batch_id, None)
            self._leases.pop(batch_id, None)
