"""The waiting queue: sequences not running, in the order the scheduling policy admits them.

- `fcfs`: arrival order; a preempted sequence goes back to the front (it was admitted before the
  rest). Request priorities are ignored.
- `priority` (vLLM's meaning: lower is more urgent, default 0): the most urgent first; equal
  priorities in weighted fair share between tenants (fair_share.py: by virtual start, then arrival),
  which with one tenant (none named) is arrival order, as fcfs. Starvation is bounded by aging: a
  sequence's priority improves by one for every `aging_steps` scheduler steps it has waited, so
  priority 10 waits at most ~10 x aging_steps steps behind a stream of priority 0 arrivals.

The order is settled once per step (`settle`, O(n log n)) rather than searched per admission:
a step admits up to max_num_seqs sequences from a queue of hundreds.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

from pipeline.config import PREFILL_ORDERS, SCHEDULING_POLICIES
from pipeline.request.request import Sequence
from pipeline.scheduling.fair_share import FairShare


def aged_priority(seq: Sequence, step: int = 0, aging_steps: int = 0) -> int:
    """The request's priority less one per `aging_steps` steps waited (a running sequence: step 0)."""
    aged = (step - seq.waiting_since_step) // aging_steps if aging_steps and step > seq.waiting_since_step else 0
    return seq.request.priority - aged


def urgency(seq: Sequence, step: int = 0, aging_steps: int = 0,
            over_share: frozenset[str | None] = frozenset()) -> tuple[int, bool, float, int]:
    """Sort key, smallest first: (priority less aging, whether its tenant holds more seats than its
    share (tenant_shares.py), the tenant's virtual start, the request's arrival). The beams and choices
    of one request tie, so none of them ever takes another's place. Only the first part may make one
    sequence take another's seat in general (Scheduler._admit_more_urgent); the second only lets a
    tenant under its seat share take a seat of one over it (WaitingAdmission._take_fair_seats), so two
    tenants never evict each other in turn."""
    start = seq.request.virtual_start
    return (aged_priority(seq, step, aging_steps), (seq.request.tenant or None) in over_share,
            0.0 if start is None else start, seq.request.arrival_order)


class WaitingQueue:
    def __init__(self, policy: str = "fcfs", aging_steps: int = 0, prefill_order: str = "arrival") -> None:
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {policy!r}")
        if prefill_order not in PREFILL_ORDERS:
            raise ValueError(f"prefill_order must be one of {PREFILL_ORDERS}, got {prefill_order!r}")
        self.by_priority = policy == "priority"
        self.aging_steps = aging_steps
        # priority policy, prefill_order "shortest": within a priority (and seat share) the sequence with
        # the fewest tokens to compute first, then fair share; aging still lifts a long one that waits.
        self.shortest_first = prefill_order == "shortest"
        # priority policy, prefill_order "burst": the requests that arrived since the last step take their
        # fair-share places fewest prompt tokens first (settle), so within each tenant a burst's short
        # prompts go first, and no request ever goes ahead of one that arrived a step before it.
        self.burst_shortest = prefill_order == "burst"
        self._arrivals: list[Sequence] = []  # burst: added since the last settle, not yet tagged
        self.fair_share = FairShare()
        self.over_share: frozenset[str | None] = frozenset()  # tenants over their seat share this step
        self._items: deque[Sequence] = deque()
        self._step = 0

    def settle(self, step: int) -> None:
        """Put the queue in admission order for this step (priority: by urgency, aged to `step`)."""
        self._step = step
        if not self.by_priority:
            return
        self._tag_arrivals()
        self.fair_share.forget_idle(bool(self._items))
        if len(self._items) > 1:
            self._items = deque(sorted(self._items, key=self.key))

    def _tag_arrivals(self) -> None:
        """burst: this step's arrivals get their virtual starts (fair_share.py) in order of prompt length,
        arrival breaking ties. Each tenant's starts still follow each other by cost, so the tenants keep
        their shares; only which of a tenant's new requests takes which of its places changes."""
        for seq in sorted(self._arrivals, key=lambda seq: (seq.request.num_prompt_tokens, seq.request.arrival_order)):
            self.fair_share.tag(seq.request)
        self._arrivals.clear()

    def key(self, seq: Sequence) -> tuple[int | bool | float, ...]:
        order = urgency(seq, self._step, self.aging_steps, self.over_share)
        if self.shortest_first:
            return (*order[:2], seq.num_tokens - seq.num_computed_tokens, *order[2:])
        return order

    def running_key(self, seq: Sequence) -> tuple[int, bool, float, int]:
        """A running sequence's place (unaged): the least urgent, then over its tenant's seat share, last."""
        return urgency(seq, over_share=self.over_share)

    def aged_priority(self, seq: Sequence) -> int:
        return aged_priority(seq, self._step, self.aging_steps)

    def add(self, seq: Sequence, step: int) -> None:
        """A new arrival (in order at the next `settle`)."""
        seq.waiting_since_step = step
        if self.by_priority and self.burst_shortest:
            self._arrivals.append(seq)  # tagged at the next settle, with the rest of its step's arrivals
        elif self.by_priority:
            self.fair_share.tag(seq.request)
        self._items.append(seq)

    def put_back(self, seq: Sequence, step: int) -> None:
        """A preempted sequence or a new beam: first under fcfs, at its place by urgency otherwise."""
        seq.waiting_since_step = step
        if not self.by_priority:
            self._items.appendleft(seq)
            return
        keys = [self.key(item) for item in self._items]
        self._items.insert(bisect.bisect_left(keys, self.key(seq)), seq)

    def return_skipped(self, skipped: list[Sequence]) -> None:
        """Sequences taken from the head but not admitted this step: back to the head, in order."""
        self._items.extendleft(reversed(skipped))

    def head(self) -> Sequence:
        return self._items[0]

    def set_aside_head(self) -> Sequence:
        """The head, taken out to let the ones behind it go first this step (`return_skipped` puts it back)."""
        return self._items.popleft()

    def pop_head(self) -> Sequence:
        seq = self._items.popleft()
        if self.by_priority:
            self.fair_share.admitted(seq.request)
        return seq

    def remove(self, seq: Sequence) -> None:
        self._items.remove(seq)
        if seq in self._arrivals:
            self._arrivals.remove(seq)

    def __contains__(self, seq: object) -> bool:
        return seq in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._items)
