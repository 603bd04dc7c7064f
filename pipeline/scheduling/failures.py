"""Requests the scheduler ended with an error, kept aside until the actor around it reports them.

Two causes: an adapter that is gone or failed to load while its request waited (`lora_unavailable`),
and a grammar that failed to compile in this process although intake compiled it elsewhere
(`invalid_request`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class RequestFailure(NamedTuple):
    request_id: str
    code: str  # the wire error code
    message: str


@dataclass(slots=True)
class FailedRequests:
    pending: list[RequestFailure] = field(default_factory=list)

    def add(self, request_id: str, code: str, message: str) -> None:
        self.pending.append(RequestFailure(request_id, code, message))

    def take(self) -> list[RequestFailure]:
        """The failures since the last call (each reported once)."""
        taken, self.pending = self.pending, []
        return taken
