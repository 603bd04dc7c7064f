"""Output actor slicing: a step's events are cut by request, never inside one request."""

from __future__ import annotations

from dataclasses import dataclass

from actors.worker.output import request_slices


@dataclass
class _Event:
    request_id: str
    n: int


def test_slices_keep_each_requests_events_together_and_in_order():
    a1, b1, a2, c1, b2 = _Event("a", 1), _Event("b", 1), _Event("a", 2), _Event("c", 1), _Event("b", 2)
    assert request_slices([a1, b1, a2, c1, b2], 2) == [[a1, a2, b1, b2], [c1]]
    assert request_slices([a1, b1, a2], 10) == [[a1, a2, b1]]
    assert request_slices([], 4) == []
